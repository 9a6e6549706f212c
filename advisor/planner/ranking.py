"""Plans to a ranked action list: each action with its rank, cost and benefit.

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

Plans are ranked cheapest first (`Cost.score`); their actions, in plan order, are the ranked
list that `/api/recommendations` and the `gpu_advisor_action_*` series serve.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from advisor.model import MILLI, ClusterModel
from advisor.planner.actions import Action, GpuSet, Plan, mig_switch_steps

SUMMARY_MAX = 160  # characters of an action summary in the info series label


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
