"""Borrowing rules as capacity teams write them (per lender -> borrower pair, named priority
levels, durations as text, return policies), the return modelled per trigger, and a loan
costed when its job is expected to outlive the auto-return."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from advisor import snapshot
from advisor.fragmentation.measures import free_whole_per_node
from advisor.planner.borrow import plan_borrow, request_for_job
from advisor.planner.check import check_plan
from advisor.planner.constraints import (
    UNASSIGNED,
    LoanRule,
    Policy,
    PolicyError,
    ReturnPolicy,
    load_policy,
    policy_from_dict,
    unassigned_quota,
    usage_by_scope,
)
from advisor.planner.reserve import Request
from tests.advisor._recommend_clusters import TENANTS, assert_checked, clusters

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SEED = EXAMPLES / "seed-quota-borrow.json"
PAIRS = EXAMPLES / "policy-borrow.yaml"
PER_TENANT = EXAMPLES / "policy-borrow-per-tenant.yaml"
QUOTAS = {"rnd": 40, "algorithms": 30, "product": 20}


@pytest.fixture(scope="module")
def model():
    return snapshot.load(SEED)


@pytest.fixture(scope="module")
def pretrain(model):
    return request_for_job(model, "rnd-pretrain")  # 4 x 8, priority 80, not started


def test_the_example_reads_as_pairs_levels_and_return_policies() -> None:
    policy = load_policy(PAIRS)
    assert policy.priority_levels == {"high": 80, "medium": 50, "low": 0}
    assert policy.loan_rules[0] == LoanRule("algorithms", "rnd", 0.5, 80, "high", 7200.0)
    assert [(r.lender, r.borrower) for r in policy.loan_rules] == [
        ("algorithms", "rnd"),
        ("product", "rnd"),
        (UNASSIGNED, "rnd"),
        ("rnd", "algorithms"),
    ]
    assert policy.loan_rules[1].auto_return_s == 2 * 86400  # "2d"
    assert policy.returns == ReturnPolicy(900.0, True, True, 900.0)
    assert not policy.borrowing  # the per-tenant form is not given


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {
                "borrowing_rules": [
                    {"lender": "algorithms", "borrower": "rnd", "max_borrow_ratio": 1}
                ]
            },
            "borrowing_rules[0].max_borrow_ratio: unknown key (did you mean "
            "'max_borrowable_ratio'?); a borrowing rule has lender, borrower, max_borrowable_ratio,",
        ),
        (
            {"borrowing_rules": [{"lender": "algoritms", "borrower": "rnd"}]},
            "borrowing_rules[0].lender: 'algoritms' has no quota in quotas (tenants: (unassigned), "
            "algorithms, product, rnd)",
        ),
        (
            {
                "borrowing_rules": [
                    {"lender": "algorithms", "borrower": "rnd", "priority_threshold": "urgent"}
                ]
            },
            "borrowing_rules[0].priority_threshold: level 'urgent' is not one of priority_levels "
            "(levels: high (80), medium (50), low (0))",
        ),
        (
            {
                "borrowing_rules": [
                    {"lender": "algorithms", "borrower": "rnd", "auto_return_timeout": "2 hours"}
                ]
            },
            "borrowing_rules[0].auto_return_timeout: expected seconds (a finite number >= 0) or a "
            "duration like 10m, 2h or 1d, got '2 hours'",
        ),
        (
            {
                "borrowing_rules": [
                    {"lender": "algorithms", "borrower": "rnd", "max_borrowable_ratio": 1.5}
                ]
            },
            "borrowing_rules[0].max_borrowable_ratio: expected a finite number >= 0 and <= 1, got 1.5",
        ),
        (
            {"borrowing_rules": [{"lender": "rnd", "borrower": "rnd"}]},
            "borrowing_rules[0]: 'rnd' lends to itself",
        ),
        (
            {
                "borrowing_rules": [
                    {"lender": "product", "borrower": "rnd"},
                    {"lender": "product", "borrower": "rnd"},
                ]
            },
            "borrowing_rules[1]: the pair product -> rnd is given twice (first at [0])",
        ),
        (
            {"return_policies": [{"trigger": "timeout", "force": True}]},
            "return_policies[0].force: unknown key (did you mean 'force_return'?); a timeout "
            "return policy has trigger, force_return, grace_period",
        ),
        (
            {"return_policies": [{"trigger": "lender_demand"}]},
            "return_policies[0].trigger: expected one of original_tenant_demand, timeout, got "
            "'lender_demand'",
        ),
        (
            {"return_policies": [{"trigger": "original_tenant_demand", "grace_period": "soon"}]},
            "return_policies[0].grace_period: expected seconds",
        ),
        (
            {"borrowing": {"max_borrow_ratio": 0.5}},
            "borrowing_rules: give borrowing (per tenant) or borrowing_rules (per lender -> "
            "borrower), not both",
        ),
        ({"priority_level": {}}, "priority_level: unknown key (did you mean 'priority_levels'?)"),
    ],
)
def test_each_mistake_is_refused_by_its_path(change, message) -> None:
    doc = {
        "quotas": QUOTAS,
        "priority_levels": {"high": 80, "medium": 50, "low": 0},
        "borrowing_rules": [{"lender": "algorithms", "borrower": "rnd"}],
        **change,
    }
    with pytest.raises(PolicyError) as error:
        policy_from_dict(doc)
    assert str(error.value).startswith(message), str(error.value)


def test_the_file_names_itself_in_the_error(tmp_path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(PAIRS.read_text().replace("auto_return_timeout: 2h", "auto_return_timout: 2h"))
    with pytest.raises(PolicyError) as error:
        load_policy(path)
    assert str(error.value).startswith(
        f"{path}: borrowing_rules[0].auto_return_timout: unknown key (did you mean "
        "'auto_return_timeout'?)"
    )


def test_a_job_that_outlives_its_loan_is_costed(model, pretrain) -> None:
    """rnd-pretrain (32 GPUs, not started: the duration prior's 5.7 h) on a loan whose
    algorithms part returns after 2 h: with force_return it is preempted at 2 h + 15 min, and
    that is its cost (32 GPUs x its 300 s checkpoint and restart), not 0 GPU-hours."""
    policy = load_policy(PAIRS)
    plan = plan_borrow(model, policy, pretrain)
    assert plan.feasible, plan.reason
    loans = {a.quota[1][0]: -a.quota[1][2] for a in plan.actions if a.kind == "borrow"}
    assert loans == {"algorithms": 10, "product": 5, UNASSIGNED: 12}
    assert "at most max_borrowable_ratio 0.5 x its quota 30 = 15" in plan.actions[0].reason
    back = plan.extra["return"]
    timeout = back["on_timeout"]
    assert timeout["outlives_loan"] and timeout["force_return"]
    assert back["expected_run_s"] == pytest.approx(2**0.5 * 4 * 3600)
    assert timeout["at"] == model.timestamp + 7200
    assert timeout["preempted"][0]["tasks"] == [
        f"start:rnd-pretrain:a100-node-{n}" for n in (10, 11, 12, 13)
    ]
    assert plan.cost.gpu_hours == pytest.approx(32 * 300 / 3600)
    assert plan.cost.restarts == 4
    assert timeout["text"].startswith(
        "rnd-pretrain is expected to run 5.7 h (a duration prior (Pareto, median 4 h), not a "
        "forecast), past the loan's 2 h auto-return: with force_return it is preempted at 2 h + "
        "15 min grace, 2.67 GPU-hours lost (32 GPUs x its 300 s checkpoint and restart, within "
        "the 15 min grace), with 3.4 h of its run left"
    )
    assert timeout["check"] == "ok"  # the loan, the start, the preemption and the return replay
    assert check_plan(model, plan.actions, policy, 80).ok


def test_a_grace_too_short_to_checkpoint_loses_the_run(model, pretrain) -> None:
    policy = replace(load_policy(PAIRS), returns=ReturnPolicy(900.0, True, True, 60.0))
    plan = plan_borrow(model, policy, pretrain)
    assert plan.cost.gpu_hours == pytest.approx(32 * (7200 + 60) / 3600)  # all of its run
    assert (
        "the 1 min grace is shorter than its 300 s checkpoint and restart"
        in (plan.extra["return"]["on_timeout"]["text"])
    )


def test_without_force_return_the_lenders_wait(model, pretrain) -> None:
    policy = replace(load_policy(PAIRS), returns=ReturnPolicy(900.0, True, False, 900.0))
    plan = plan_borrow(model, policy, pretrain)
    timeout = plan.extra["return"]["on_timeout"]
    assert plan.feasible and plan.cost.gpu_hours == 0 and timeout["preempted"] == []
    assert timeout["lenders_wait_s"] == pytest.approx(2**0.5 * 4 * 3600 - 7200)
    assert "force_return is false: it is not preempted" in timeout["text"]
    assert timeout["check"] == "ok"


def test_a_job_that_ends_before_its_loan_returns_costs_nothing_more(model, pretrain) -> None:
    plan = plan_borrow(model, load_policy(PAIRS), replace(pretrain, duration_s=3600.0))
    timeout = plan.extra["return"]["on_timeout"]
    assert not timeout["outlives_loan"] and plan.cost.gpu_hours == 0
    assert timeout["text"].startswith("rnd-pretrain is expected to end in 1.0 h (the request's")


def test_when_a_lender_wants_its_quota_back(model, pretrain) -> None:
    """algorithms' own demand: rnd must fall back within its quota by 10 GPUs; its
    lowest-priority, latest-started jobs go (rnd-job1, 8 GPUs, then rnd-job5, 2: exactly 10),
    not the priority-80 job the loan started; the steps replay."""
    plan = plan_borrow(model, load_policy(PAIRS), pretrain)
    demand = {d["lender"]: d for d in plan.extra["return"]["on_lender_demand"]}
    algorithms = demand["algorithms"]
    assert [p["job"] for p in algorithms["preempted"]] == ["rnd-job1", "rnd-job5"]
    assert sum(p["gpus"] for p in algorithms["preempted"]) == 10
    assert algorithms["cost"]["gpu_hours"] == pytest.approx(10 * 600 / 3600)  # 600 s restarts
    assert algorithms["check"] == "ok"
    assert algorithms["text"].startswith(
        "if 'algorithms' wants its 10 GPUs back: after 15 min grace the lowest-priority, "
        "latest-started jobs of rnd are preempted until it is within its quota: rnd-job1 "
        "(8 GPUs, priority 50), rnd-job5 (2 GPUs, priority 50)"
    )
    assert demand[UNASSIGNED]["text"].startswith("if capacity no quota covers wants its 12")
    waiting = plan_borrow(
        model, replace(load_policy(PAIRS), returns=ReturnPolicy(900.0, False)), pretrain
    )
    algorithms = waiting.extra["return"]["on_lender_demand"][0]
    assert algorithms["preempted"] == [] and algorithms["lender_waits_s"] > 0
    assert "preemption is not allowed: it waits about" in algorithms["text"]


def test_the_pair_rules_refuse_with_the_numbers(model, pretrain) -> None:
    policy = load_policy(PAIRS)
    medium = replace(pretrain, priority=60)  # under algorithms' high (80)
    plan = plan_borrow(model, policy, medium)
    assert not plan.feasible
    assert plan.reason == (
        "'rnd' needs 27 GPUs more than its quota; its lenders may lend 19: product 5 (5 unused, "
        "at most max_borrowable_ratio 0.25 x its quota 20 = 5); (unassigned) 14 (14 unused, at "
        "most max_borrowable_ratio 1 x its quota 14 = 14); under the priority threshold of "
        "algorithms (high (80))"
    )
    low = plan_borrow(model, policy, replace(pretrain, priority=10))
    assert low.reason.startswith(
        "priority 10 is under the threshold of every rule: algorithms -> rnd high (80), "
        "product -> rnd medium (50)"
    )
    nobody = plan_borrow(model, policy, replace(pretrain, tenant="product", priority=90))
    assert nobody.reason.startswith("no borrowing rule lends to 'product' (rules: algorithms")


def test_the_per_tenant_form_still_works_and_is_costed_too(model, pretrain, tmp_path) -> None:
    policy = load_policy(PER_TENANT)
    assert policy.borrowing[""].auto_return_s == 2 * 86400  # "2d" as text
    assert policy.borrowing[""].grace_s == 900  # "15m"
    plan = plan_borrow(model, policy, pretrain)
    assert plan.feasible and plan.cost.gpu_hours == 0  # 5.7 h, well within 2 days
    short = tmp_path / "short.yaml"
    short.write_text(PER_TENANT.read_text().replace("auto_return_s: 2d", "auto_return_s: 2h"))
    plan = plan_borrow(model, load_policy(short), pretrain)
    assert plan.feasible and plan.cost.gpu_hours == pytest.approx(32 * 300 / 3600)
    assert plan.extra["return"]["on_timeout"]["outlives_loan"]


def test_the_cli_prints_the_return(model) -> None:
    goal = ["--goal", "borrow=rnd-pretrain", "--policy", str(PAIRS)]
    run = subprocess.run(
        [sys.executable, "-m", "advisor.cli", "plan", str(SEED), *goal],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert "at the auto-return: rnd-pretrain is expected to run 5.7 h" in run.stdout
    assert "lender demand: if 'algorithms' wants its 10 GPUs back" in run.stdout
    assert "2.667 GPU-hours lost" in run.stdout


@st.composite
def pair_rules_short_of_quota(draw, m, request: Request) -> Policy:
    """Quotas leaving `request`'s tenant 1 to `request.gpus` GPUs short, the others some
    spare, and per-pair rules (random ratios, thresholds, auto-returns) from every other
    tenant and from `UNASSIGNED`, with random return policies."""
    usage = usage_by_scope(m)
    short = draw(st.integers(1, request.gpus))
    quotas = {(request.tenant, ""): max(usage[(request.tenant, "")] + request.gpus - short, 0.0)}
    for tenant in TENANTS:
        if tenant != request.tenant:
            quotas[(tenant, "")] = usage[(tenant, "")] + draw(st.sampled_from([0, 1, 4, 8]))
    rules = tuple(
        LoanRule(
            lender,
            request.tenant,
            draw(st.sampled_from([0.25, 0.5, 1.0])),
            draw(st.sampled_from([0, 0, 50])),
            "",
            draw(st.sampled_from([1800.0, 7200.0, 86400.0])),
        )
        for lender in (*[t for t in TENANTS if t != request.tenant], UNASSIGNED)
        if draw(st.booleans())
    )
    returns = ReturnPolicy(
        draw(st.sampled_from([0.0, 600.0])),
        draw(st.booleans()),
        draw(st.booleans()),
        draw(st.sampled_from([0.0, 600.0])),
    )
    return Policy(quotas=quotas, loan_rules=rules, returns=returns)


def test_every_pair_rule_plan_keeps_its_rules_and_its_return_replays() -> None:
    """Random clusters, a small new job its tenant's quota just stops, random pair rules: a
    plan replays; each lender lends at most its unused quota and its ratio of its quota, to a
    job at or above its threshold; every return scenario's steps replay too."""
    seen: Counter = Counter()

    @settings(
        max_examples=60,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
        derandomize=True,
        database=None,
    )
    @given(
        m=clusters(),
        tenant=st.sampled_from(TENANTS),
        size=st.sampled_from([1, 2, 4]),
        data=st.data(),
    )
    def check(m, tenant, size, data) -> None:
        fits = max(int(free_whole_per_node(m).max(initial=0)), 1)
        request = Request("want", tenant, 10, 1, min(size, fits))
        policy = data.draw(pair_rules_short_of_quota(m, request), label="policy")
        plan = plan_borrow(m, policy, request)
        assert_checked(m, plan, policy, request.priority)
        loans = [a for a in plan.actions if a.kind == "borrow"]
        if not (plan.feasible and loans):
            return
        seen["loans"] += 1
        usage = usage_by_scope(m)
        rules = {r.lender: r for r in policy.loan_rules}
        for loan in loans:
            lender, scope, amount = loan.quota[1][0], loan.quota[1][1], -loan.quota[1][2]
            rule = rules[lender]
            assert request.priority >= rule.priority_threshold
            if lender == UNASSIGNED:
                quota, used = unassigned_quota(m, policy.quotas, scope, usage)
            else:
                quota, used = policy.quotas[(lender, scope)], usage[(lender, scope)]
            assert (
                amount <= quota - used + 1e-9 and amount <= rule.max_borrowable_ratio * quota + 1e-9
            )
        back = plan.extra["return"]
        scenarios = [back["on_timeout"], *back["on_lender_demand"]]
        for doc in scenarios:
            if "check" in doc:
                seen["replayed"] += 1
                assert doc["check"] == "ok", (doc["text"], doc["check"])
        if back["on_timeout"]["expected_cost"]:
            seen["costed"] += 1

    check()
    assert seen["loans"] >= 5 and seen["replayed"] >= 10, seen
