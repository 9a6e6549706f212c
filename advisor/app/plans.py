"""The app's access to the planner: recommendations, what-if answers, a selection's before/after,
and the selection exported as JSON/YAML and as the kubectl or Slurm commands an operator would
run. The app only ever shows these; it never runs a command or changes the cluster.

Plain functions over the model and `advisor.planner`; the pages only lay them out.
"""

from __future__ import annotations

import json
import math
import shlex
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import yaml

from advisor.fragmentation import measures
from advisor.fragmentation.measures import Shape
from advisor.model import ClusterModel
from advisor.planner.actions import Action, Plan, mig_switch_steps
from advisor.planner.check import CheckResult, apply_plan, check_plan
from advisor.planner.consolidate import Goal, parse_goal
from advisor.planner.constraints import Policy, load_policy

EXACT_MAX_NODES = 400  # above this, the heuristic alone (CP-SAT would take too long per page)
EXACT_TIME_LIMIT_S = 5.0
WHATIF_JOB = "what-if"


def policy_from(path: str) -> Policy:
    """The policy file named in the page, or the default policy. PolicyError/OSError escape."""
    return load_policy(path) if path.strip() else Policy()


# --------------------------------------------------------------------------- goals and plans


def next_big_job(model: ClusterModel) -> Shape | None:
    """The smallest multi-node job of full nodes (K x G, G = GPUs per node) that cannot start
    now: the natural "which migrations let the next big job start" question. None if even the
    largest rack's worth fits."""
    width = int(model.nodes.gpu_count.max(initial=0))
    if width == 0:
        return None
    racks = pd.Series(model.nodes.rack).value_counts()
    most = int(racks.max()) if len(racks) else 1
    for tasks in range(1, max(most, 1) + 1):
        shape = Shape(width, tasks=tasks)
        if measures.jobs_that_fit(model, shape) == 0:
            return shape
    return None


def goal_text(shape: Shape) -> str:
    size = f"{shape.tasks}x{shape.num_gpu}" if shape.tasks > 1 else str(shape.num_gpu)
    return f"job={size}"


def consolidation_plan(
    model: ClusterModel, goal: Goal, policy: Policy, exact: bool = False
) -> Plan:
    """The heuristic's checked plan; with `exact` (and at most EXACT_MAX_NODES nodes) the
    cheaper of it and the CP-SAT solver's, which is time-limited and so may differ run to
    run on a busy machine, hence opt-in."""
    from advisor.planner.solve import solve  # ortools is imported only when a plan is asked for

    solver = "best" if exact and len(model.nodes) <= EXACT_MAX_NODES else "heuristic"
    return solve(model, goal, policy, solver=solver, time_limit_s=EXACT_TIME_LIMIT_S)


OTHER_KINDS_MAX_NODES = 300  # recommend() can take tens of seconds on trace-sized clusters


def recommendations(
    model: ClusterModel,
    policy: Policy,
    goal: str,
    exact: bool = False,
    others: bool = True,
    job_end: Mapping[str, float] | None = None,
) -> list[Plan]:
    """What the Actions page lists: a consolidation plan for `goal` (migrations), then (with
    `others`) every other kind `recommend()` finds (reservations, loans, reclaim, sharing,
    rebalancing)."""
    from advisor.planner.recommend import recommend

    plans = []
    if goal:
        plans.append(consolidation_plan(model, parse_goal(goal), policy, exact))
    if others:  # reservations and loans on the learned job ends, as the service's
        from advisor.forecast.job_ends import outlook

        plans += recommend(model, policy, outlook(job_end or {}))
    return plans


def plan_label(index: int, plan: Plan) -> str:
    kinds = sorted({a.kind for a in plan.actions})
    status = "" if plan.feasible else " (not feasible)"
    return f"{index + 1}. {plan.goal}{status} — {len(plan.actions)} step(s) {'/'.join(kinds)}"


def _where(gpus: Any) -> str:
    return str(gpus) if gpus is not None else "-"


def benefit_text(plan: Plan) -> str:
    """One line: which shapes become schedulable or fit more often; else the plan's reason."""
    if plan.benefit is not None:
        new = plan.benefit.newly_schedulable()
        more = [s for s in plan.benefit.more_jobs_fit() if s not in new]
        parts = []
        if new:
            parts.append("can now start: " + ", ".join(new))
        if more:
            parts.append("more fit: " + ", ".join(more))
        before = plan.benefit.fragmentation_before.get("fgd_fragment_rate")
        after = plan.benefit.fragmentation_after.get("fgd_fragment_rate")
        if before is not None and after is not None and abs(after - before) > 1e-9:
            parts.append(f"fragmentation {before:.1%} → {after:.1%}")
        if parts:
            return "; ".join(parts)
    extra = plan.extra
    if "start_at" in extra:
        return f"job starts in {extra['starts_in_s'] / 3600:.1f} h ({extra['ends_from']})"
    if "waste" in extra:
        w = extra["waste"]
        return f"returns {w['gpu_hours']:.1f} idle GPU-hours, {w['energy_kwh']:.2f} kWh"
    if "gpus_freed" in extra:
        return f"frees {extra['gpus_freed']} GPU(s)"
    if "freed_gpus" in extra:
        return f"GPUs freed per model: {extra['freed_gpus']}"
    return plan.reason


def actions_frame(plan: Plan) -> pd.DataFrame:
    """One row per step: what moves where, and what it costs."""
    rows = []
    for step, action in enumerate(plan.actions, start=1):
        rows.append(
            {
                "step": step,
                "kind": action.kind,
                "job": action.job,
                "tenant": action.tenant,
                "from": _where(action.src),
                "to": _where(action.dst),
                "restarts": action.cost.restarts,
                "restart min": round(action.cost.restart_s / 60.0, 1),
                "GPU-hours lost": round(action.cost.gpu_hours, 3),
                "GPU-hours held idle": round(action.cost.idle_gpu_hours, 3),
                "why": action.reason,
            }
        )
    columns = ["step", "kind", "job", "tenant", "from", "to", "restarts", "restart min"]
    costs = ["GPU-hours lost", "GPU-hours held idle"]
    return pd.DataFrame(rows, columns=[*columns, *costs, "why"])


def plans_frame(plans: Sequence[Plan]) -> pd.DataFrame:
    """One row per plan: kind, cost and benefit, for the overview table."""
    rows = []
    for i, plan in enumerate(plans):
        cost = plan.cost
        rows.append(
            {
                "#": i + 1,
                "goal": plan.goal,
                "feasible": plan.feasible,
                "kinds": "/".join(sorted({a.kind for a in plan.actions})) or "-",
                "steps": len(plan.actions),
                "restarts": cost.restarts,
                "GPU-hours lost": round(cost.gpu_hours, 2),
                "GPU-hours held idle": round(cost.idle_gpu_hours, 2),
                "jobs touched": len(cost.jobs),
                "benefit": benefit_text(plan),
            }
        )
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- selection


@dataclass(frozen=True)
class Outcome:
    """A selection of steps replayed: the check, the model after, and measures before/after."""

    check: CheckResult
    after: ClusterModel | None
    table: pd.DataFrame  # measure, before, after


def _goal_priority(plan: Plan) -> int | None:
    value = plan.extra.get("goal_priority")
    return int(value) if value is not None else None


def replay(
    model: ClusterModel,
    plan: Plan,
    steps: Sequence[int],
    policy: Policy,
    shapes: Sequence[Shape] = (),
) -> Outcome:
    """Check the chosen steps (1-based, in plan order) and, if they pass, apply them.

    `after` holds every chosen step (reserved GPUs are held by the goal job); the measures
    compare the cluster before with the cluster after the chosen moves but before the holds,
    since what a reservation holds is exactly the room the moves made for the goal job.
    """
    chosen = [plan.actions[i - 1] for i in sorted(steps)]
    result = check_plan(model, chosen, policy, _goal_priority(plan))
    if not result.ok:
        return Outcome(result, None, pd.DataFrame())
    after = apply_plan(model, chosen)
    moved = apply_plan(model, [a for a in chosen if a.kind != "reserve"])
    return Outcome(result, after, compare(model, moved, shapes))


def compare(
    before: ClusterModel, after: ClusterModel, shapes: Sequence[Shape] = ()
) -> pd.DataFrame:
    """Headline fragmentation measures and jobs per shape (defaults plus `shapes`)."""
    wanted = list(measures.DEFAULT_SHAPES) + [s for s in shapes if s not in measures.DEFAULT_SHAPES]
    settings = measures.Settings(shapes=tuple(wanted))
    a, b = measures.analyze(before, settings), measures.analyze(after, settings)

    def rows(result: dict[str, Any]) -> dict[str, float]:
        out: dict[str, float] = {
            "free GPUs": result["spatial"]["free_gpus"],
            "free whole nodes": int(
                (result["nodes"]["free_gpus"] == result["nodes"]["gpus"]).sum()
            ),
            "fragmentation rate (%)": round(100 * result["fgd"]["fragment_rate"], 1),
            "fragmented GPUs": round(result["fgd"]["fragment_gpus"], 2),
            "largest job on one node": result["spatial"]["largest_job"]["single_node_gpus"],
        }
        for shape in result["spatial"]["shapes"]:
            out[f"jobs of {shape['shape']} that fit"] = shape["jobs_that_fit"]
        return out

    before_rows, after_rows = rows(a), rows(b)
    return pd.DataFrame(
        {
            "measure": list(before_rows),
            "before": [float(v) for v in before_rows.values()],
            "after": [float(after_rows[k]) for k in before_rows],
        }
    )


def planned_idle(model: ClusterModel) -> np.ndarray:
    """For a planned state nothing is observed: no GPU is called idle (all allocated = busy)."""
    return np.zeros(len(model.gpus), dtype=bool)


def planned_frame(model: ClusterModel) -> pd.DataFrame:
    """`data.gpu_frame` of a planned state: allocated = busy, and GPUs held by a reservation
    (the room made for the goal job) as their own state, so the after-heatmap shows them."""
    from advisor.app.data import gpu_frame
    from advisor.planner.check import RESERVATION_QOS

    frame = gpu_frame(model, planned_idle(model))
    places = model.placements
    held = np.zeros(len(model.gpus), dtype=bool)
    reserved = model.allocations.qos[places.alloc] == RESERVATION_QOS
    held[places.gpu[reserved]] = True
    frame.loc[held, "state"] = "reserved"
    return frame


# --------------------------------------------------------------------------- export


def selection_doc(plan: Plan, steps: Sequence[int], source: str) -> dict[str, Any]:
    chosen = [plan.actions[i - 1] for i in sorted(steps)]
    return {
        "generated_by": "gpu-defrag app (not executed)",
        "source": source,
        "goal": plan.goal,
        "method": plan.method,
        "steps": sorted(int(s) for s in steps),
        "actions": [a.to_dict() for a in chosen],
    }


def to_json(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, default=str) + "\n"


def to_yaml(doc: dict[str, Any]) -> str:
    return yaml.safe_dump(json.loads(json.dumps(doc, default=str)), sort_keys=False)


def _pod(alloc: str) -> tuple[str, str]:
    """(namespace, pod) of a Kubernetes allocation id `ns/pod`; ("", id) otherwise."""
    namespace, sep, pod = alloc.partition("/")
    return (namespace, pod) if sep else ("", alloc)


def _ns(namespace: str) -> str:
    return f"-n {shlex.quote(namespace)} " if namespace else ""


def _gpus_text(gpus: Any) -> str:
    return f"GPUs {','.join(str(g) for g in gpus.gpus)} of {gpus.node}"


def _mig_switches(actions: Sequence[Action]) -> dict[int, tuple[str, int, dict[int, Counter]]]:
    """Per step that switches a GPU to MIG mode (the first MIG-profile share onto it): (node,
    GPU, the node's MIG layout once every switch so far is made: GPU -> profile counts, the
    instances of the whole plan carved at once, as a layout is applied in one go)."""
    first = mig_switch_steps(actions)
    layout: dict[str, dict[int, Counter]] = {}
    for a in actions:
        if a.kind == "share" and a.dst is not None and a.dst.mig_profile:
            for gpu in a.dst.gpus:
                layout.setdefault(a.dst.node, {}).setdefault(gpu, Counter())[a.dst.mig_profile] += 1
    out = {}
    for (node, gpu), step in first.items():
        so_far = {g: c for g, c in layout[node].items() if first[(node, g)] <= step}
        out[step] = (node, gpu, so_far)
    return out


def _mig_parted_config(name: str, gpus: dict[int, Counter]) -> list[str]:
    """The mig-parted config (YAML, as comments) for the GPUs switched on one node; the node's
    other GPUs are for the operator to list as they are (a plain GPU: `mig-enabled: false`)."""
    lines = [f"#   {name}:"]
    for gpu, counts in sorted(gpus.items()):
        devices = ", ".join(f'"{p}": {n}' for p, n in sorted(counts.items()))
        lines.append(f"#     - devices: [{gpu}]")
        lines.append("#       mig-enabled: true")
        lines.append(f"#       mig-devices: {{{devices}}}")
    return lines


def kubectl_commands(actions: Sequence[Action]) -> str:
    """The kubectl an operator would run for each step. Kubernetes places pods on nodes, not
    on GPU indices (the device plugin picks those), so the target GPUs are annotations."""
    lines = ["# gpu-defrag: generated, not executed. Review, then run step by step.", ""]
    switches = _mig_switches(actions)
    for step, a in enumerate(actions, start=1):
        lines.append(f"# step {step}: {a.kind} {a.alloc or ''} — {a.reason}".rstrip())
        ns, pod = _pod(a.alloc)
        q = shlex.quote
        if step in switches:
            node, gpu, layout = switches[step]
            config = f"gpu-defrag-{node}"
            lines += [
                f"# switch {node} GPU {gpu} to MIG mode with NVIDIA's MIG manager: add this "
                "config to its mig-parted ConfigMap,",
                *_mig_parted_config(config, layout),
                "#     (and the node's other GPUs as they are now)",
                f"# then label the node (the MIG manager evicts {node}'s GPU pods while it "
                "applies the layout):",
                f"kubectl label node {q(node)} --overwrite nvidia.com/mig.config={q(config)}",
            ]
        if a.kind == "share" and a.dst is not None and a.dst.mig_profile:
            lines.append(
                f"# its pod template requests nvidia.com/mig-{a.dst.mig_profile}: 1 instead of "
                "nvidia.com/gpu (the device plugin's mixed strategy)"
            )
        if a.kind in ("migrate", "share", "rebalance") and a.dst is not None:
            lines += [
                f"kubectl {_ns(ns)}annotate pod {q(pod)} --overwrite "
                f"gpu-defrag.io/target-node={q(a.dst.node)} "
                f"gpu-defrag.io/target-gpus={','.join(map(str, a.dst.gpus))}"
                + (
                    f" gpu-defrag.io/mig-profile={q(a.dst.mig_profile)}"
                    if a.dst.mig_profile
                    else f" gpu-defrag.io/gpu-milli={a.dst.milli}"
                    if a.dst.milli < 1000
                    else ""
                ),
                f"# pin its controller's pod template to the target: nodeSelector "
                f"kubernetes.io/hostname={a.dst.node}; checkpoint, then:",
                f"kubectl {_ns(ns)}delete pod {q(pod)} --wait=false",
            ]
        elif a.kind == "reserve" and a.dst is not None:
            lines += [
                f"kubectl label node {q(a.dst.node)} --overwrite "
                f"gpu-defrag.io/reserved-for={q(a.job)}",
                f"kubectl taint node {q(a.dst.node)} "
                f"gpu-defrag.io/reserved={q(a.job)}:NoSchedule --overwrite"
                f"  # holds {_gpus_text(a.dst)}",
            ]
        elif a.kind == "reclaim":
            lines.append(f"kubectl {_ns(ns)}delete pod {q(pod)}  # tell {a.tenant or 'its owner'}")
        elif a.kind == "borrow":
            for tenant, gpu_model, delta in a.quota:
                lines.append(
                    f"# quota of {tenant} {'on ' + gpu_model if gpu_model else ''}: {delta:+g} GPUs"
                )
                lines.append(
                    f"kubectl -n {q(tenant)} edit resourcequota  "
                    f"# requests.nvidia.com/gpu {delta:+g}"
                )
        lines.append("")
    return "\n".join(lines)


def slurm_commands(actions: Sequence[Action]) -> str:
    """The scontrol/scancel/sacctmgr an operator would run for each step (JOB = job id)."""
    lines = ["# gpu-defrag: generated, not executed. Review, then run step by step.", ""]
    switches = _mig_switches(actions)
    for step, a in enumerate(actions, start=1):
        lines.append(f"# step {step}: {a.kind} {a.alloc or ''} — {a.reason}".rstrip())
        job = shlex.quote(a.job or a.alloc)
        if a.kind in ("migrate", "share", "rebalance") and a.dst is not None:
            lines += [
                f"scontrol hold {job}",
                f"scontrol requeue {job}  # after its checkpoint",
            ]
            if step in switches:  # the GPU is idle once its one job is requeued
                node, gpu, layout = switches[step]
                profiles = ",".join(p for p, n in sorted(layout[gpu].items()) for _ in range(n))
                lines += [
                    f"# on {node}, GPU {gpu} now idle:",
                    f"nvidia-smi -i {gpu} -mig 1",
                    f"nvidia-smi mig -i {gpu} -cgi {profiles} -C",
                    "# gres.conf: AutoDetect=nvml makes the instances gres; restart slurmd",
                ]
            lines += [
                f"scontrol update JobId={job} ReqNodeList={shlex.quote(a.dst.node)}",
                f"scontrol release {job}",
            ]
        elif a.kind == "reserve" and a.dst is not None:
            lines.append(
                f"scontrol create reservation "
                f"ReservationName={shlex.quote('gpu-defrag-' + (a.alloc or a.job))} "
                f"StartTime=now Duration=UNLIMITED Nodes={shlex.quote(a.dst.node)} "
                f"TRES=gres/gpu={len(a.dst.gpus)} Flags=IGNORE_JOBS"
            )
        elif a.kind == "reclaim":
            lines.append(f"scancel {job}")
        elif a.kind == "borrow":
            for tenant, gpu_model, delta in a.quota:
                lines.append(
                    f"sacctmgr modify account {shlex.quote(tenant)} set GrpTRES=gres/gpu=<limit{delta:+g}>"
                    + (f"  # {gpu_model}" if gpu_model else "")
                )
        lines.append("")
    return "\n".join(lines)


# --------------------------------------------------------------------------- what-if


@dataclass(frozen=True)
class WhatIf:
    shape: Shape
    fits_now: int  # jobs of the shape that could start now
    plan: Plan | None  # cheapest checked plan to make room now (None when it fits)
    wait: Plan | None  # reservation: when it fits without moving anything (None when it fits)


def whatif(
    model: ClusterModel,
    num_gpu: int,
    nodes: int,
    gpu_model: str = "",
    policy: Policy | None = None,
    tenant: str = "",
    exact: bool = False,
    job_end: Mapping[str, float] | Callable[[], Mapping[str, float]] | None = None,
) -> WhatIf:
    """Can a job of `nodes` x `num_gpu` GPUs on `gpu_model` start now; if not, the cheapest
    plan to make room, and when it would start without moving anything: on the running jobs'
    ends in `job_end` ({allocation id: end}, `forecasts.learned_job_ends`, as the service's
    reservations use them), the planner's fallback for every allocation it leaves out. A
    callable `job_end` is called only then (learning the ends may simulate a fleet's past)."""
    policy = policy or Policy()
    shape = Shape(num_gpu, tasks=nodes, gpu_spec=gpu_model)
    fits = measures.jobs_that_fit(model, shape)
    if fits > 0:
        return WhatIf(shape, fits, None, None)
    size = f"{nodes}x{num_gpu}" if nodes > 1 else str(num_gpu)
    goal = Goal(
        f"job={size}" + (f"@{gpu_model}" if gpu_model else ""), "job", shape=shape, tenant=tenant
    )
    plan = consolidation_plan(model, goal, policy, exact)
    from advisor.planner.reserve import Outlook, Request, plan_reservations

    request = Request(WHATIF_JOB, tenant, None, nodes, num_gpu, gpu_model)
    ends = job_end() if callable(job_end) else job_end
    waits = plan_reservations(model, policy, [request], Outlook(job_end=dict(ends or {})))
    return WhatIf(shape, fits, plan, waits[0] if waits else None)


def hours(seconds: float) -> str:
    if math.isinf(seconds):
        return "never"
    return f"{seconds / 3600:.1f} h"
