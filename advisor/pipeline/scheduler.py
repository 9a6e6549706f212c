"""What the service serves from a scheduler source: the queue, why shapes cannot start, racks
that are unknown, and the plan for the biggest blocked job. Pure functions of the model, the
measures and the merged policy (`advisor.planner.policy_merge`); the pipeline calls them.

- `section(model, analysis, shapes, policy)` (the analyse stage): per pool the nodes of unknown
  rack and, per multi-node shape, the jobs that could start if those nodes shared a rack; per
  shape that cannot start although a pool has enough free GPUs, the cause: `rack_unknown`,
  `scattered` (`advisor.fragmentation.racks`) or `quota` (waiting jobs of that shape that
  would fit the free GPUs but not their tenant's quota, `borrow.blocked_by_quota`); the queue
  (`scheduler_report.pending_jobs`) with each job's own cause; the scheduler's notes, stale
  reason and quota lines.
- `with_blocked_plan(section, model, policy)` (the plan stage): the biggest waiting job that
  cannot start now, and a checked plan for it (a loan when only quota stops it, else the
  moves that make room for its shape, never moving work above its priority).

`/api/pending` and the `gpu_advisor_*` series of `advisor.service.metrics` read the result (`Results.scheduler`).
"""

from __future__ import annotations

from typing import Any

from advisor import scheduler_report
from advisor.fragmentation import measures, racks
from advisor.fragmentation.measures import Shape
from advisor.model import MILLI, ClusterModel
from advisor.planner.constraints import Policy
from advisor.planner.policy_merge import merge_lines
from advisor.results import pool_names, shape_label

PLAN_TIME_LIMIT_S = 5.0  # the exact solver's share of one run for the blocked job's plan
SOLVER_MAX_NODES = 400  # the exact solver only on clusters up to this size (as `plan`)


def _rack_rows(model: ClusterModel, shapes: tuple[Shape, ...]) -> tuple[dict, list[dict]]:
    pools = pool_names(model)
    unknown = racks.rack_unknown(model)
    per_pool = {str(p): int((unknown & (pools == p)).sum()) for p in sorted(set(pools.tolist()))}
    rows = []
    if unknown.any():
        for shape in shapes:
            if shape.tasks < 2:
                continue
            known = measures.jobs_that_fit_by_part(model, shape, pools)
            generous = racks.jobs_if_racks_allow(model, shape, pools)
            for pool, count in generous.items():
                if racks.depends_on_racks(shape, known[pool], count):
                    rows.append(
                        {
                            "pool": pool,
                            "shape": shape_label(shape),
                            "jobs_that_fit": known[pool],
                            "jobs_if_racks_allow": count,
                        }
                    )
    return per_pool, rows


def _free_per_pool(model: ClusterModel) -> dict[str, int]:
    pools = pool_names(model)
    free = measures.free_whole_per_node(model)
    return {str(p): int(free[pools == p].sum()) for p in sorted(set(pools.tolist()))}


def _quota_blocked(model: ClusterModel, policy: Policy) -> dict[str, str]:
    """job -> tenant of the waiting jobs only their tenant's quota stops."""
    from advisor.planner.borrow import blocked_by_quota

    return {r.job: r.tenant for r in blocked_by_quota(model, policy)}


def _job_cause(
    model: ClusterModel,
    row: dict[str, Any],
    quota_jobs: dict[str, str],
    best_free: int,
    seen: dict[Shape, tuple[int, int | None, str | None]],
) -> tuple[int, int | None, str | None]:
    """(jobs of its shape that fit now on known racks, if unknown racks allowed, why it
    cannot start: quota, rack_unknown, scattered, or None: it fits, or too few GPUs free).
    `seen` keeps each shape's answer: a queue of thousands has a few shapes."""
    shape = scheduler_report.job_shape(row)
    if row["job"] in quota_jobs:
        return 1, None, racks.QUOTA
    if shape not in seen:
        seen[shape] = _shape_cause(model, shape, best_free)
    return seen[shape]


def _shape_cause(
    model: ClusterModel, shape: Shape, best_free: int
) -> tuple[int, int | None, str | None]:
    if shape.gpu_spec:
        try:
            measures.check_models(model, shape)
        except ValueError:
            return 0, None, None  # no GPU of the model it asks for: not fragmentation
    known = measures.jobs_that_fit(model, shape)
    generous = racks.jobs_if_racks_allow(model, shape) if shape.tasks > 1 else known
    cause = racks.blocked_cause(shape, known, generous, best_free)
    return known, generous if racks.depends_on_racks(shape, known, generous) else None, cause


def section(
    model: ClusterModel, analysis: dict[str, Any], shapes: tuple[Shape, ...], policy: Policy
) -> dict[str, Any]:
    """The scheduler part of a run's results (module docstring)."""
    facts = model.scheduler
    per_pool, if_racks = _rack_rows(model, shapes)
    free = _free_per_pool(model)
    best_free = max(free.values(), default=0)
    blocked: dict[tuple[str, str], dict[str, Any]] = {}
    for shape, row in zip(shapes, analysis["spatial"]["shapes"], strict=True):
        if row.get("blocked_by"):
            label = shape_label(shape)
            blocked[(label, row["blocked_by"])] = {
                "shape": label,
                "cause": row["blocked_by"],
                "free_gpus": best_free,
                "jobs": [],
            }
    queue = scheduler_report.pending_jobs(model)
    quota_jobs = _quota_blocked(model, policy) if queue and policy.quotas else {}
    seen: dict[Shape, tuple[int, int | None, str | None]] = {}
    for row in queue:
        known, generous, cause = _job_cause(model, row, quota_jobs, best_free, seen)
        row["jobs_of_shape_that_fit"] = known
        row["jobs_if_racks_allow"] = generous
        row["blocked_by"] = cause
        if cause is not None:
            label = shape_label(scheduler_report.job_shape(row))
            entry = blocked.setdefault(
                (label, cause),
                {"shape": label, "cause": cause, "free_gpus": best_free, "jobs": []},
            )
            entry["jobs"].append(row["job"])
    return {
        "shapes": [shape_label(shape) for shape in shapes],
        "kind": facts.kind if facts is not None else None,
        "stale": (facts.stale or None) if facts is not None else None,
        "racks_from": (facts.rack_from or None) if facts is not None else None,
        "notes": list(facts.notes) if facts is not None else [],
        "nodes_rack_unknown": per_pool,
        "if_racks_allow": if_racks,
        "unschedulable": sorted(blocked.values(), key=lambda r: (r["shape"], r["cause"])),
        "pending_jobs": [{k: v for k, v in r.items() if k != "task_ids"} for r in queue],
        "quotas": merge_lines(policy if policy.quotas else None, model),
        "blocked_plan": None,
    }


def _biggest_blocked(doc: dict[str, Any]) -> dict[str, Any] | None:
    blocked = [r for r in doc.get("pending_jobs", []) if r.get("blocked_by")]
    return max(blocked, key=lambda r: (r["gpus"], r["priority"]), default=None)


def with_blocked_plan(doc: dict[str, Any], model: ClusterModel, policy: Policy) -> dict[str, Any]:
    """`doc` with `blocked_plan`: the biggest blocked job and a checked plan for it."""
    row = _biggest_blocked(doc)
    if row is None:
        return {**doc, "blocked_plan": None}
    if row["blocked_by"] == racks.QUOTA:
        from advisor.planner.borrow import plan_borrow, request_for_job

        plan = plan_borrow(model, policy, request_for_job(model, row["job"]))
    else:
        from advisor.planner.consolidate import Goal
        from advisor.planner.solve import solve

        shape = scheduler_report.job_shape(row)
        goal = Goal(
            f"job={_goal_text(shape)}",
            "job",
            shape=shape,
            priority=int(row["priority"]),
            tenant=row["tenant"],
        )
        plan = solve(
            model,
            goal,
            policy,
            "best",
            PLAN_TIME_LIMIT_S,
            SOLVER_MAX_NODES,
        )
    return {
        **doc,
        "blocked_plan": {
            "job": row["job"],
            "tenant": row["tenant"],
            "shape": row["shape"],
            "gpus": row["gpus"],
            "blocked_by": row["blocked_by"],
            "plan": plan.to_dict(),
        },
    }


def _goal_text(shape: Shape) -> str:
    size = f"{shape.gpu_milli / MILLI:g}" if shape.gpu_milli < MILLI else str(shape.num_gpu)
    base = f"{shape.tasks}x{size}" if shape.tasks > 1 else size
    return base + (f"@{shape.gpu_spec}" if shape.gpu_spec else "")


def unschedulable_series(doc: dict[str, Any]) -> list[tuple[str, str, float]]:
    """(shape, cause, free GPUs) for `gpu_advisor_shape_unschedulable`: every measured shape
    with every cause (0 where that cause does not block it, so the alert's signal always has
    data), and the waiting jobs' own shapes where a cause blocks them."""
    blocked = {
        (r["shape"], r["cause"]): float(r["free_gpus"]) for r in doc.get("unschedulable", [])
    }
    out = {(shape, cause): 0.0 for shape in doc.get("shapes", []) for cause in racks.CAUSES}
    out.update(blocked)
    return [(shape, cause, value) for (shape, cause), value in out.items()]


def pending_by_tenant(doc: dict[str, Any]) -> dict[str, tuple[int, float]]:
    """tenant -> (waiting jobs, their GPUs) for `gpu_advisor_pending_jobs`/`_gpus`."""
    out: dict[str, list[float]] = {}
    for row in doc.get("pending_jobs", []):
        entry = out.setdefault(row["tenant"] or "(none)", [0, 0.0])
        entry[0] += 1
        entry[1] += float(row["gpus"])
    return {tenant: (int(jobs), gpus) for tenant, (jobs, gpus) in out.items()}
