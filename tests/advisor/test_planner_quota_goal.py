"""A goal job its tenant's quota cannot hold is refused with that reason, not with the step of
a plan that happened to cross the quota, and without a solver's search."""

from __future__ import annotations

from pathlib import Path

from advisor.cli import main
from advisor.planner.consolidate import Goal, over_quota, parse_goal, plan_heuristic
from advisor.planner.constraints import Policy, load_policy
from advisor.snapshot import load

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_a_job_above_its_tenants_quota_names_the_numbers(capsys) -> None:
    model = load(EXAMPLES / "seed-16x8-a100.json")
    policy = load_policy(EXAMPLES / "policy-quotas.yaml")
    goal = parse_goal("job=8x8", tenant="rnd")
    why = (
        "tenant 'rnd' holds 17 GPUs; the job's 64 would make 81, above its quota of 40 "
        "(no move lowers it; a loan may: borrow=rnd:64)"
    )
    assert over_quota(model, goal, policy) == why
    plan = plan_heuristic(model, goal, policy)
    assert not plan.feasible and plan.reason == why and not plan.actions
    args = ["plan", str(EXAMPLES / "seed-16x8-a100.json"), "--goal", "job=8x8", "--tenant", "rnd"]
    assert main([*args, "--policy", str(EXAMPLES / "policy-quotas.yaml")]) == 1
    out = capsys.readouterr().out
    assert f"why: {why}" in out and "exact" not in out.split("why:")[1].splitlines()[0]


def test_within_quota_no_tenant_or_no_quota_is_no_refusal() -> None:
    model = load(EXAMPLES / "seed-16x8-a100.json")
    policy = load_policy(EXAMPLES / "policy-quotas.yaml")
    assert over_quota(model, parse_goal("job=8", tenant="rnd"), policy) == ""  # 17 + 8 <= 40
    assert over_quota(model, parse_goal("job=8x8"), policy) == ""  # no tenant
    assert over_quota(model, parse_goal("job=8x8", tenant="nobody"), policy) == ""
    assert over_quota(model, parse_goal("job=8x8", tenant="rnd"), Policy()) == ""
    assert (
        over_quota(model, Goal("free-nodes=2", "free-nodes", nodes=2, tenant="rnd"), policy) == ""
    )
