"""The defragmentation planner: actions, the step-by-step checker, and consolidation plans.

`actions` (Action, GpuSet, Cost, Benefit, Plan), `constraints` (Policy, load_policy and the rule
helpers), `check` (check_plan, apply_plan) are the stable base every recommendation kind uses;
`consolidate` (heuristic) and `exact` (CP-SAT) make migration plans for a goal. The other
kinds: `reserve`, `borrow`, `reclaim`, `share` (with `mig_profiles`) and `rebalance`, all run by
`recommend.recommend(model, policy, forecast)` (see docs/recommendations.md).
"""

from advisor.planner.actions import KINDS, Action, Benefit, Cost, CostWeights, GpuSet, Plan
from advisor.planner.check import CheckResult, Violation, apply_plan, check_plan
from advisor.planner.constraints import Policy, PolicyError, load_policy

__all__ = [
    "KINDS",
    "Action",
    "Benefit",
    "CheckResult",
    "Cost",
    "CostWeights",
    "GpuSet",
    "Plan",
    "Policy",
    "PolicyError",
    "Violation",
    "apply_plan",
    "check_plan",
    "load_policy",
]
