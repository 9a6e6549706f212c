"""Recommendations for the service: consolidation for the shapes that cannot start, plus every
other kind `advisor.planner.recommend` makes.

For every whole-GPU job shape of the analysis settings that no free capacity can host now (and
that the fleet could host at all), the consolidation heuristic plans the migrations and
reservations that would let one such job start; every plan is replayed by the planner's checker
before it is returned (`plan_heuristic` never returns a plan that fails its check). Plans are
ranked cheapest first; their actions, in plan order, are the ranked action list.

Each action's benefit is the number of GPUs it makes usable, and a plan's actions sum to the
plan's benefit: in a plan that reserves GPUs for a job, a migration counts the GPU share it frees
that the plan then reserves, a reservation the share of its GPUs that was free already (so a
consolidation plan's actions sum to the job's GPUs, a reservation or loan plan's to the GPUs it
holds now); a reclaim or rebalance counts the GPU share it gives back (a rebalance: the scarce
model's GPUs it leaves), a share its old share minus its new one (a resize in place included; a
share plan's actions sum to its `gpu_share_freed`; a share into a MIG instance on a GPU the plan
switches to MIG mode: the switching step takes the whole GPU, its uncarved room being no
capacity, and the instances after it take nothing more); a quota loan counts none, and so does
a share held on a GPU nobody can use.

Reservations plan on the running jobs' ends that `advisor.forecast.job_ends` learns from the
jobs the service saw finish; `job_ends` in the document says which source the plans used.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pandas as pd

from advisor.forecast.job_ends import JobEndSettings, outlook, predict
from advisor.fragmentation import measures
from advisor.fragmentation.measures import Shape
from advisor.history import RunningJob
from advisor.model import MILLI, ClusterModel
from advisor.planner.actions import KINDS, Action, GpuSet, Plan, mig_switch_steps
from advisor.planner.consolidate import Goal, parse_goal, plan_heuristic
from advisor.planner.constraints import Policy
from advisor.planner.recommend import recommend_with_notes
from advisor.planner.reserve import pending_requests
from advisor.service.results import shape_label

SUMMARY_MAX = 160  # characters of an action summary in the info series label


def blocked_shapes(
    model: ClusterModel, shapes: Sequence[Shape], shape_rows: Sequence[dict[str, Any]]
) -> list[Shape]:
    """Whole-GPU shapes with no job that fits now, smallest first, that the fleet's usable GPUs
    could hold at all (a 4x8 job on a 16-GPU fleet is not a fragmentation problem; nor is a
    multi-node job where no rack of one GPU model has that many nodes, e.g. racks unknown)."""
    usable = int(model.gpu_usable.sum())
    out = [
        shape
        for shape, row in zip(shapes, shape_rows, strict=True)
        if shape.gpu_milli == MILLI
        and row["schedulable_jobs"] == 0
        and shape.gpus <= usable
        and measures.rack_could_hold(model, shape)
    ]
    return sorted(out, key=lambda s: s.gpus)


MAX_WAITING_GOALS = 2  # waiting big jobs per run whose own shape gets a consolidation plan


def waiting_goals(model: ClusterModel, limit: int = MAX_WAITING_GOALS) -> list[tuple[str, Goal]]:
    """Consolidation goals for the first waiting jobs of at least 8 whole GPUs (queue order:
    priority, then creation) that cannot start now, in their own shape: GPUs per task, tasks,
    GPU models, and the CPU and memory a task asks for (a configured shape counts GPUs only,
    so freeing its GPUs may leave such a job without the CPU it needs)."""
    allocs = model.allocations
    created: dict[str, float] = {}
    for job, at in zip(
        allocs.job[allocs.node < 0].tolist(),
        allocs.creation_time[allocs.node < 0].tolist(),
        strict=True,
    ):
        created[job] = min(created.get(job, math.inf), at if math.isfinite(at) else math.inf)
    requests = sorted(
        pending_requests(model), key=lambda r: (-(r.priority or 0), created.get(r.job, 0.0), r.job)
    )
    out = []
    for request in requests:
        if len(out) >= limit:
            break
        shape = Shape(
            request.num_gpu,
            MILLI,
            request.tasks,
            request.cpu_milli,
            request.memory_mib,
            request.gpu_spec,
        )
        if measures.jobs_that_fit(model, shape) or not measures.rack_could_hold(model, shape):
            continue
        text = f"job={shape_label(shape)} for {request.job}"
        out.append((request.job, Goal(text, "job", shape, priority=request.priority)))
    return out


def _benefits(actions: Sequence[Action], model: ClusterModel | None = None) -> list[float]:
    """GPUs each action makes usable (module docstring); they add up to the plan's benefit.

    With `model`, a share held on a GPU nobody can use (lost, unhealthy, on an unschedulable
    node) frees nothing: giving it back makes no capacity usable."""

    def usable(node: str, gpu: int) -> bool:
        if model is None:
            return True
        try:
            return bool(model.gpu_usable[model.gpu_row(model.node_index(node), gpu)])
        except KeyError:  # not in the model: nothing says it is unusable
            return True

    def share(gpus: GpuSet | None) -> float:
        if gpus is None:
            return 0.0
        return sum(gpus.milli for g in gpus.gpus if usable(gpus.node, g)) / MILLI

    def mig_on(node: str, gpu: int) -> bool:
        if model is None:
            return False
        try:
            return bool(model.gpus.mig_enabled[model.gpu_row(model.node_index(node), gpu)])
        except KeyError:
            return False

    switches = mig_switch_steps(actions)

    def taken(gpus: GpuSet, step: int) -> float:
        """The share a step takes on its target; on a GPU it switches to MIG mode, all of it
        (an instance carved there later takes nothing more: its room was taken already)."""
        if gpus.mig_profile is None:
            return share(gpus)
        out = 0.0
        for g in gpus.gpus:
            key = (gpus.node, g)
            if not usable(*key):
                continue
            if mig_on(*key):
                out += gpus.milli / MILLI
            elif switches[key] == step:
                out += 1.0
        return out

    reserved = {
        (a.dst.node, g): a.dst.milli / MILLI
        for a in actions
        if a.kind == "reserve" and a.dst
        for g in a.dst.gpus
    }
    vacated: dict[tuple[str, int], float] = defaultdict(float)  # share moved off reserved GPUs
    for a in actions:
        if a.kind != "reserve" and a.src:
            for g in a.src.gpus:
                if (a.src.node, g) in reserved:
                    vacated[(a.src.node, g)] += a.src.milli / MILLI
    out = []
    for step, action in enumerate(actions, start=1):
        if action.kind == "reserve" and action.dst:  # the share of its GPUs free already
            gpus = [(action.dst.node, g) for g in action.dst.gpus]
            out.append(sum(max(0.0, reserved[k] - vacated[k]) for k in gpus))
        elif action.src is None:  # borrow moves quota, no GPUs
            out.append(0.0)
        elif reserved:  # clears room for the plan's job: the share it frees there
            gpus = [
                (action.src.node, g) for g in action.src.gpus if (action.src.node, g) in reserved
            ]
            part = action.src.milli / MILLI
            out.append(sum(part * min(1.0, reserved[k] / vacated[k]) for k in gpus))
        elif action.kind in ("reclaim", "rebalance"):  # gives back its GPUs (the scarce ones)
            out.append(share(action.src))
        else:  # share, migrate: the share it gives back, old - new (a resize in place too)
            out.append(
                max(0.0, share(action.src) - (taken(action.dst, step) if action.dst else 0.0))
            )
    return out


def _summary(action: Action, plan: Plan) -> str:
    """The action in one line, the `summary` label of gpu_advisor_action_info: nothing in it
    may change from run to run while the action stays (a new label value is a new series),
    so a reservation's start, which its reason gives relative to now, is left out."""
    text = action.reason or action.kind
    ends_from = plan.extra.get("ends_from")
    if action.kind == "reserve" and action.dst and plan.method == "reserve" and ends_from:
        text = f"reserve {action.dst} for {action.job} (start planned on {ends_from})"
    elif action.kind == "reserve" and action.dst:
        text = f"reserve {action.dst} ({action.reason})" if action.reason else str(action.dst)
    elif action.src and action.dst:
        text = f"{action.kind} {action.alloc} {action.src} -> {action.dst}"
    elif action.src:
        text = f"{action.kind} {action.alloc} from {action.src}"
    return text[:SUMMARY_MAX]


def ranked_actions(
    plans: Sequence[Plan], model: ClusterModel | None = None
) -> list[dict[str, Any]]:
    """Actions of the feasible plans, cheapest plan first, each with rank, cost and benefit
    (on `model`, the one the plans were made for, shares on unusable GPUs count none)."""
    rows: list[dict[str, Any]] = []
    for plan in sorted((p for p in plans if p.feasible), key=lambda p: p.cost.score()):
        for action, benefit in zip(plan.actions, _benefits(plan.actions, model), strict=True):
            rows.append(
                {
                    "rank": len(rows) + 1,
                    "goal": plan.goal,
                    "kind": action.kind,
                    "alloc": action.alloc,
                    "job": action.job,
                    "tenant": action.tenant,
                    "source": str(action.src) if action.src else "",
                    "target": str(action.dst) if action.dst else "",
                    "summary": _summary(action, plan),
                    "cost_gpu_hours": float(action.cost.gpu_hours),
                    "cost_idle_gpu_hours": float(action.cost.idle_gpu_hours),
                    "restarts": int(action.cost.restarts),
                    "benefit_gpus": float(benefit),
                }
            )
    return rows


def recommend_service(
    model: ClusterModel,
    shapes: Sequence[Shape],
    shape_rows: Sequence[dict[str, Any]],
    policy: Policy,
    finished: pd.DataFrame | None = None,
    job_end_settings: JobEndSettings | None = None,
    running: Sequence[RunningJob] | None = None,
) -> dict[str, Any]:
    """The recommendations document: goals tried, their plans, ranked actions, count by kind,
        and `job_ends`, where the plans' job ends came from.

        Consolidation plans for the blocked shapes and for the first waiting big jobs in their
        own shape (`waiting_goals`; such a plan names the job, `job`), then `advisor.planner.recommend.recommend`'s
        plans (reservations and loans for waiting jobs, reclaim of idle allocations, sharing,
        type rebalancing). Its forecast carries the running jobs' ends learned from `finished`
        (the history's finished jobs, `advisor.forecast.job_ends.predict`; `running` the jobs with the
    starts the history used) and no expected demand:
        the per-pool GPU forecast says how many GPUs, not which job shapes will arrive, which is
        what its expected-job reservations need.
    """
    ends, ends_doc = predict(model, finished, job_end_settings or JobEndSettings(), running=running)
    plans = [
        plan_heuristic(model, parse_goal(f"job={shape_label(shape)}"), policy)
        for shape in blocked_shapes(model, shapes, shape_rows)
    ]
    for job, goal in waiting_goals(model):
        plan = plan_heuristic(model, goal, policy)
        plans.append(replace(plan, extra={**plan.extra, "job": job}))
    others, notes = recommend_with_notes(model, policy, outlook(ends))
    plans += others
    actions = ranked_actions(plans, model)
    counts = Counter(row["kind"] for row in actions)
    return {
        "method": "consolidation+recommend",
        "goals": [plan.goal for plan in plans],
        # per kind that recommends nothing, why, in numbers (what `plan --goal recommend` says)
        "notes": notes,
        "plans": [plan.to_dict() for plan in plans],
        "actions": actions,
        "by_kind": {kind: counts.get(kind, 0) for kind in KINDS},
        "job_ends": ends_doc,
    }
