"""One consolidation goal solved: the heuristic, the exact solver, or the cheaper of both.

`solve` is what `gpu-defrag plan --goal job=...` and the pipeline's consolidation
(`advisor.planner.recommend`, `advisor.pipeline`) call; the exact solver (OR-Tools CP-SAT) is
imported only when it runs.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from advisor.fragmentation.measures import Shape
from advisor.planner.actions import Plan
from advisor.planner.consolidate import Goal, plan_heuristic
from advisor.planner.constraints import Policy

EXACT_MAX_NODES = 400  # above this, `best` keeps the heuristic's plan (CP-SAT would take long)


def solve(
    model,
    goal: Goal,
    policy: Policy,
    solver: str = "best",
    time_limit_s: float = 10.0,
    exact_max_nodes: int = EXACT_MAX_NODES,
    demand: list[Shape] | None = None,
    workers: int = 1,
) -> Plan:
    """Run the chosen solver(s); with `best`, the cheaper checked plan plus the comparison."""
    heuristic = None
    if solver in ("best", "heuristic"):
        heuristic = plan_heuristic(model, goal, policy, demand=demand)
        if solver == "heuristic" or heuristic.extra.get("over_quota"):
            return heuristic  # over quota: no placement can change that, the reason says so
        if heuristic.extra.get("rack_unknown"):
            return heuristic  # no solver can prove anything about racks nobody knows
    if solver == "best" and len(model.nodes) > exact_max_nodes:
        note = f"exact solver skipped: {len(model.nodes)} nodes > {exact_max_nodes}"
        return replace(heuristic, extra={**heuristic.extra, "exact": note})
    from advisor.planner.exact import PROVED, plan_exact  # ortools loads only when asked

    exact = plan_exact(
        model,
        goal,
        policy,
        time_limit_s=time_limit_s,
        workers=workers,
        demand=demand,
        hint=heuristic,
    )
    if heuristic is None:
        return exact
    comparison: dict[str, Any] = {
        "heuristic_cost": heuristic.cost.score() if heuristic.feasible else None,
        "exact_cost": exact.cost.score() if exact.feasible else None,
        "exact_status": exact.extra.get("status"),
        "exact_bound": exact.extra.get("bound"),
    }
    if heuristic.feasible and exact.feasible and exact.extra.get("status") == "optimal":
        best = exact.cost.score()
        comparison["heuristic_gap"] = heuristic.cost.score() / best if best > 0 else 1.0
    chosen = heuristic
    if exact.feasible and (
        not heuristic.feasible or exact.cost.score() < heuristic.cost.score() - 1e-9
    ):
        chosen = exact
    if not chosen.feasible and exact.extra.get("status") == "infeasible":
        chosen = replace(chosen, reason=f"{chosen.reason}; {PROVED}")
    return replace(chosen, extra={**chosen.extra, "comparison": comparison})
