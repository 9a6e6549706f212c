"""Quota borrowing: the R&D / Algorithms / Product seed case, each rule, the policy file and
the checker's lending of capacity no quota covers."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from advisor import snapshot
from advisor.cli import main
from advisor.fragmentation.measures import free_whole_per_node
from advisor.planner.actions import Action
from advisor.planner.borrow import blocked_by_quota, plan_borrow, request_for_job
from advisor.planner.check import check_plan
from advisor.planner.constraints import (
    UNASSIGNED,
    BorrowRules,
    Policy,
    PolicyError,
    load_policy,
    policy_from_dict,
    usage_by_scope,
)
from advisor.planner.recommend import plan_for_goal, recommend
from advisor.planner.reserve import Request, pending_requests
from tests.advisor._recommend_clusters import (
    TENANTS,
    assert_checked,
    clusters,
    lending_policies,
    policies,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SEED = EXAMPLES / "seed-quota-borrow.json"
RULES = EXAMPLES / "policy-borrow-per-tenant.yaml"
QUOTAS_ONLY = EXAMPLES / "policy-quotas.yaml"


@pytest.fixture(scope="module")
def model():
    return snapshot.load(SEED)


def test_seed_usage_matches_the_case(model) -> None:
    usage = usage_by_scope(model)
    assert [usage[(t, "")] for t in ("rnd", "algorithms", "product")] == [35, 20, 15]
    request = request_for_job(model, "rnd-pretrain")
    assert (request.tasks, request.num_gpu, request.tenant) == (4, 8, "rnd")


def test_a_loan_within_the_rules_makes_the_job_start(model) -> None:
    policy = load_policy(RULES)
    assert [r.job for r in blocked_by_quota(model, policy)] == ["rnd-pretrain"]
    plan = plan_borrow(model, policy, request_for_job(model, "rnd-pretrain"))
    assert plan.feasible, plan.reason
    loans = [a for a in plan.actions if a.kind == "borrow"]
    starts = [a for a in plan.actions if a.kind == "reserve"]
    # 35 + 32 - 40 = 27: the idle quota of algorithms (10) and product (5), then 12 of the
    # 14 usable GPUs beyond the 90 of quotas
    assert {a.quota[1][0]: -a.quota[1][2] for a in loans} == {
        "algorithms": 10,
        "product": 5,
        UNASSIGNED: 12,
    }
    assert sum(a.quota[0][2] for a in loans) == 27
    assert len(starts) == 4 and all(len(a.dst.gpus) == 8 for a in starts)
    assert check_plan(model, plan.actions, policy, 80).ok
    # without the loans the same start breaks rnd's quota
    refused = check_plan(model, starts, policy, 80)
    assert not refused.ok and "quota of 40" in refused.violation.reason
    back = plan.extra["return"]
    assert back["preemption"] and back["grace_s"] == 900
    assert back["due_at"] <= model.timestamp + 172800
    inverse = [Action.from_dict(doc) for doc in back["actions"]]
    assert [a.quota for a in inverse] == [tuple((t, s, -d) for t, s, d in a.quota) for a in loans]
    assert set(plan.cost.tenants) == {"rnd", "algorithms", "product"}


def test_no_quota_blocks_a_tenant_that_has_none(model, monkeypatch) -> None:
    import advisor.planner.borrow as borrow

    searched = []
    real = borrow.earliest_slot
    monkeypatch.setattr(
        borrow, "earliest_slot", lambda *a, **k: searched.append(a[2].job) or real(*a, **k)
    )
    assert blocked_by_quota(model, Policy()) == [] and searched == []  # no quotas: no search
    policy = load_policy(RULES)
    limited = {tenant for tenant, _ in policy.quotas}
    assert [r.job for r in blocked_by_quota(model, policy)] == ["rnd-pretrain"]
    assert searched and all(request_for_job(model, job).tenant in limited for job in searched)


def test_without_borrowing_rules_no_loan_is_proposed(model) -> None:
    policy = load_policy(QUOTAS_ONLY)
    plan = plan_borrow(model, policy, request_for_job(model, "rnd-pretrain"))
    assert not plan.feasible and not plan.actions
    assert "no borrowing rules" in plan.reason
    assert [p for p in recommend(model, policy) if p.actions] == []


@pytest.mark.parametrize(
    ("rules", "needle"),
    [
        (BorrowRules(max_borrow_ratio=0.5), "at most 0.5 x 40 = 20"),
        (BorrowRules(max_borrow_ratio=1.0, priority_threshold=90), "under the borrowing threshold"),
        (BorrowRules(max_borrow_ratio=1.0, preemption=False, auto_return_s=3600), "auto-return"),
    ],
)
def test_each_rule_can_refuse(model, rules, needle) -> None:
    policy = replace(load_policy(RULES), borrowing={"": rules})
    plan = plan_borrow(model, policy, request_for_job(model, "rnd-pretrain"))
    assert not plan.feasible and needle in plan.reason


def test_lenders_that_do_not_lend_and_short_jobs_without_preemption(model) -> None:
    base = load_policy(RULES)
    rules = base.borrowing[""]
    no_algo = replace(base, borrowing={"": rules, "algorithms": replace(rules, lend=False)})
    plan = plan_borrow(model, no_algo, request_for_job(model, "rnd-pretrain"))
    assert not plan.feasible and "only 19" in plan.reason  # product 5 + unassigned 14
    short = replace(request_for_job(model, "rnd-pretrain"), duration_s=3600.0)
    strict = replace(base, borrowing={"": replace(rules, preemption=False)})
    plan = plan_borrow(model, strict, short)
    assert plan.feasible and "not preempted" in plan.extra["return"]["then"]


def test_goal_forms_and_cli(model, capsys) -> None:
    policy = load_policy(RULES)
    assert plan_for_goal(model, policy, "borrow=rnd-pretrain")[0].feasible
    assert plan_for_goal(model, policy, "borrow=rnd:32:80")[0].feasible  # 4 x 8 by node size
    assert plan_for_goal(model, policy, "borrow=big:rnd:4x8")[0].reason.startswith("priority")
    with pytest.raises(ValueError, match=r"^no pending job 'nobody' in the model$"):
        plan_for_goal(model, policy, "borrow=nobody")
    code = main(
        ["plan", str(SEED), "--goal", "borrow=rnd-pretrain", "--policy", str(RULES), "--json"]
    )
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["feasible"] and doc["method"] == "borrow"
    assert (
        main(["plan", str(SEED), "--goal", "borrow=rnd-pretrain", "--policy", str(QUOTAS_ONLY)])
        == 1
    )
    assert "no borrowing rules" in capsys.readouterr().out
    assert main(["plan", str(SEED), "--goal", "borrow=a:b:c:d"]) == 2


def test_the_table_shows_each_loan_and_a_refusal_names_its_method(model, capsys) -> None:
    """A loan's row names the job, the lender's quota and the borrower's (the columns were
    empty), and a refused loan's header says `method: borrow` (it was `method:` and nothing)."""
    assert main(["plan", str(SEED), "--goal", "borrow=rnd-pretrain", "--policy", str(RULES)]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    loans = [row[2:] for row in rows if row[:1] != ["goal:"] and row[1:2] == ["borrow"]]
    assert loans == [
        ["rnd-pretrain", "algorithms", "quota", "-10", "rnd", "quota", "+10", "-", "-"],
        ["rnd-pretrain", "product", "quota", "-5", "rnd", "quota", "+5", "-", "-"],
        ["rnd-pretrain", UNASSIGNED, "quota", "-12", "rnd", "quota", "+12", "-", "-"],
    ]
    assert main(["plan", str(SEED), "--goal", "borrow=rnd-pretrain", "--policy", str(QUOTAS_ONLY)])
    header = capsys.readouterr().out.splitlines()[0]
    assert header.endswith("   method: borrow   feasible: False"), header
    for rules in (BorrowRules(max_borrow_ratio=0.5), BorrowRules(priority_threshold=90)):
        policy = replace(load_policy(RULES), borrowing={"": rules})
        plan = plan_borrow(model, policy, request_for_job(model, "rnd-pretrain"))
        assert not plan.feasible and plan.method == "borrow"


def test_policy_file_borrowing_section(tmp_path) -> None:
    policy = policy_from_dict(
        {"borrowing": {"max_borrow_ratio": 0.3, "tenants": {"prod": {"lend": False}}}}
    )
    assert policy.borrow_rules("x") == BorrowRules(max_borrow_ratio=0.3)
    assert policy.borrow_rules("prod") == BorrowRules(max_borrow_ratio=0.3, lend=False)
    assert policy_from_dict({"quotas": {"a": 1}}).borrow_rules("a") is None  # old files
    for doc, where in (
        ({"borrowing": {"lend": 3}}, "borrowing.lend"),
        ({"borrowing": {"grace_s": -1}}, "borrowing.grace_s"),
        ({"borrowing": {"priority_threshold": 1.5}}, "borrowing.priority_threshold"),
        ({"borrowing": {"tenants": {"a": {"nope": 1}}}}, "borrowing.tenants.a.nope"),
        ({"borrowing": [1]}, "borrowing"),
    ):
        with pytest.raises(PolicyError) as error:
            policy_from_dict(doc)
        assert error.value.field == where
    path = tmp_path / "p.yaml"
    path.write_text("borrowing:\n  preemption: maybe\n")
    with pytest.raises(PolicyError, match=r"borrowing\.preemption"):
        load_policy(path)


@pytest.mark.parametrize(
    ("name", "content", "problem"),
    [
        (
            "p.yaml",
            b"quotas:\n  a: [1\n b: 2\n",
            "not valid yaml: line 3, column 3: expected ',' or ']', but got ':' "
            "(while parsing a flow sequence)",
        ),
        ("p.yaml", b"a: b: c\n", "not valid yaml: line 1, column 5: mapping values are not"),
        ("p.yaml", b"quotas:\n  a: \xff\n", "not UTF-8 text"),
        ("p.json", b"\xff\xfe{}", "not UTF-8 text"),
        ("p.json", b'{"quotas":\n', "not valid json: Expecting value: line 2 column 1"),
    ],
)
def test_unparsable_policy_files_are_one_line_naming_the_file(tmp_path, name, content, problem):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(PolicyError) as error:
        load_policy(path)
    message = str(error.value)
    assert message.startswith(f"{path}: {problem}") and "\n" not in message


def test_checker_lends_only_spare_unassigned_capacity(model) -> None:
    policy = load_policy(RULES)  # 104 usable GPUs, quotas 90: 14 unassigned

    def loan(n):
        return Action("borrow", quota=(("rnd", "", n), (UNASSIGNED, "", -n)))

    assert check_plan(model, [loan(14)], policy).ok
    refused = check_plan(model, [loan(15)], policy)
    assert not refused.ok and "lender" in refused.violation.reason
    # a tenant without quota uses unassigned capacity: it is no longer spare
    shared = replace(policy, quotas={k: v for k, v in policy.quotas.items() if k[0] != "product"})
    assert check_plan(model, [loan(19)], shared).ok  # 104 - 70 = 34 spare, 15 used by product
    assert not check_plan(model, [loan(20)], shared).ok


def test_a_named_unassigned_quota_is_spare_only_beyond_what_unquoted_tenants_hold(model) -> None:
    """A policy may give the pseudo-tenant its own number; tenants without a quota still use
    it up, for the checker and for borrowing alike (they once disagreed: the checker lent the
    whole named number)."""
    quotas = {k: v for k, v in load_policy(RULES).quotas.items() if k[0] != "product"}
    named = replace(load_policy(RULES), quotas={**quotas, (UNASSIGNED, ""): 20.0})

    def loan(n):
        return Action("borrow", quota=(("rnd", "", n), (UNASSIGNED, "", -n)))

    assert check_plan(model, [loan(5)], named).ok  # 20 named, 15 held by product: 5 spare
    refused = check_plan(model, [loan(6)], named)
    assert not refused.ok and "lender" in refused.violation.reason
    plan = plan_borrow(model, named, request_for_job(model, "rnd-pretrain"))
    lent = {a.quota[1][0]: -a.quota[1][2] for a in plan.actions if a.kind == "borrow"}
    assert lent.get(UNASSIGNED, 0) <= 5, lent
    assert not plan.feasible or check_plan(model, plan.actions, named, 80).ok


@st.composite
def short_of_quota(draw, m, request: Request) -> Policy:
    """Quotas that leave `request`'s tenant 1 to `request.gpus` GPUs short of starting it, the
    other tenants some spare quota (each may refuse to lend it), and rules that allow the loan
    (unless the borrower's own quota is 0: no ratio of 0 covers a loan), now and then with a
    priority threshold above the new jobs' 10."""
    usage = usage_by_scope(m)
    short = draw(st.integers(1, request.gpus))
    quotas = {(request.tenant, ""): max(usage[(request.tenant, "")] + request.gpus - short, 0.0)}
    for tenant in TENANTS:
        if tenant != request.tenant:
            quotas[(tenant, "")] = usage[(tenant, "")] + draw(st.sampled_from([0, 1, 4, 8]))
    rules = BorrowRules(max_borrow_ratio=16.0, priority_threshold=draw(st.sampled_from([0, 0, 50])))
    lend = {t: replace(rules, lend=draw(st.booleans())) for t in TENANTS}
    return Policy(
        quotas=quotas,
        island_locality=draw(st.booleans()),
        rack_locality=draw(st.booleans()),
        borrowing={"": rules, **lend},
    )


def _check_borrow(m, policy: Policy, request: Request, seen: Counter) -> None:
    """The plan replays; a plan with loans keeps every borrowing rule, and needs its loans."""
    plan = plan_borrow(m, policy, request)
    assert_checked(m, plan, policy, request.priority)
    loans = [a for a in plan.actions if a.kind == "borrow"]
    if plan.feasible and loans:
        seen["feasible with loans"] += 1
        rules = policy.borrow_rules(request.tenant)
        assert rules is not None and (request.priority or 0) >= rules.priority_threshold
        for loan in loans:
            lender = loan.quota[1][0]
            seen["from a tenant" if lender != UNASSIGNED else "from unassigned"] += 1
            assert lender == UNASSIGNED or policy.borrow_rules(lender).lend
        # the loans are needed: without them the start breaks the borrower's quota
        starts = [a for a in plan.actions if a.kind == "reserve"]
        assert starts
        assert not check_plan(m, starts, policy, request.priority).ok


def test_every_borrow_plan_passes_the_check() -> None:
    """On each random cluster: a pending job of the model, or (pick -1) a small new one that
    often fits the free GPUs but not its tenant's quota, under a random or a tight lending
    policy; and a new job no larger than the most free GPUs on a node under quotas that leave
    its tenant just short of it. The loan-specific checks must run: counted, and the count
    asserted after the run (over half of the clusters give a loan)."""
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
        policy=st.one_of(policies(), lending_policies()),
        tenant=st.sampled_from(TENANTS),
        size=st.sampled_from([1, 2, 4]),
        pick=st.integers(-1, 3),
        data=st.data(),
    )
    def check(m, policy, tenant, size, pick, data) -> None:
        requests = pending_requests(m, min_gpus=1)
        if pick < 0 or not requests:
            request = Request("want", tenant, 10, 1, size)
        else:
            request = requests[pick % len(requests)]
        _check_borrow(m, policy, request, seen)
        fits = max(int(free_whole_per_node(m).max(initial=0)), 1)
        short = Request("want", tenant, 10, 1, min(size, fits))
        _check_borrow(m, data.draw(short_of_quota(m, short), label="short"), short, seen)

    check()
    assert seen["feasible with loans"] >= 5, seen
    assert seen["from a tenant"] and seen["from unassigned"], seen


def test_shipped_snapshots_match_their_generator() -> None:
    """examples/make_planner_examples.py rebuilds exactly the shipped seed snapshots."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "make_planner_examples", EXAMPLES / "make_planner_examples.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name, build in (
        ("seed-quota-borrow.json", module.seed_quota_borrow),
        ("seed-mixed-fleet.json", module.seed_mixed_fleet),
        ("seed-share-16gb.json", module.seed_share_16gb),
        ("seed-share-l4.json", module.seed_share_l4),
    ):
        shipped = json.loads((EXAMPLES / name).read_text())
        assert json.loads(json.dumps(snapshot.to_dict(build()))) == shipped, name
    assert (EXAMPLES / "policy-borrow.yaml").read_text() == module.BORROW_POLICY
    assert (EXAMPLES / "policy-borrow-per-tenant.yaml").read_text() == module.BORROW_TENANT_POLICY
    assert (EXAMPLES / "policy-quotas.yaml").read_text() == module.QUOTA_ONLY_POLICY
