"""The step-by-step checker: every rule refuses the step that breaks it, with its number."""

from __future__ import annotations

import json

import pytest

from advisor.planner.actions import Action, Cost, GpuSet, Plan
from advisor.planner.check import apply_plan, check_plan
from advisor.planner.constraints import Policy, PolicyError, load_policy, policy_from_dict
from tests.conftest import add_nodes


def cluster(**overrides):
    """n1 (rack r1, A100, islands 0-3 / 4-7): a (2 GPU on 0,1), b (1 GPU on 4);
    n2 (rack r1, A100): c (4 GPU on 0-3), d (half GPU on 7); n3 (rack r2, H100): empty;
    job j = tasks j0 on n1 gpu 2, j1 on n2 gpu 4 (both rack r1)."""
    cpu = overrides.get("cpu", 64000)
    b = add_nodes(["n1", "n2"], rack="r1", gpu_model="A100", cpu_milli=cpu, island=4)
    add_nodes(["n3"], builder=b, rack="r2", gpu_model="H100", cpu_milli=cpu, island=4)
    b.add_allocation("a", num_gpu=2, node="n1", gpus=[0, 1], tenant="t1", priority=10)
    b.add_allocation("b", num_gpu=1, node="n1", gpus=[4], tenant="t2", priority=50)
    b.add_allocation("c", num_gpu=4, node="n2", gpus=[0, 1, 2, 3], tenant="t1", migratable=False)
    b.add_allocation("d", num_gpu=1, gpu_milli=500, node="n2", gpus=[7], tenant="t2")
    b.add_allocation("j0", num_gpu=1, node="n1", gpus=[2], job="j", tenant="t1")
    b.add_allocation("j1", num_gpu=1, node="n2", gpus=[4], job="j", tenant="t1")
    b.add_allocation(
        "big", num_gpu=1, node="n1", gpus=[7], tenant="t1", cpu_milli=overrides.get("big_cpu", 0)
    )
    return b.build()


def mv(alloc, src_node, src, dst_node, dst, milli=1000, kind="migrate"):
    return Action(
        kind,
        alloc=alloc,
        src=GpuSet(src_node, tuple(src), milli),
        dst=GpuSet(dst_node, tuple(dst), milli),
    )


def test_valid_plan_and_apply() -> None:
    model = cluster()
    plan = [mv("a", "n1", [0, 1], "n2", [5, 6]), mv("b", "n1", [4], "n1", [0])]
    result = check_plan(model, plan, goal_priority=100)
    assert result.ok, result
    after = apply_plan(model, plan)
    assert after.gpu_is_free[after.gpu_row(0, 4)]
    assert not after.gpu_is_free[after.gpu_row(1, 5)]
    assert int(after.gpu_milli_allocated.sum()) == int(model.gpu_milli_allocated.sum())


@pytest.mark.parametrize(
    ("plan", "step", "needle"),
    [
        # target taken at that step (d holds half of n2/gpu7; c holds n2/gpu0)
        ([mv("a", "n1", [0, 1], "n2", [0, 5])], 1, "has 0 milli free"),
        ([mv("c", "n2", [0, 1, 2, 3], "n1", [0, 1, 2, 3])], 1, "not migratable"),
        ([mv("b", "n1", [4], "n2", [5])], 1, "priority 50"),
        ([mv("a", "n1", [0, 1], "n3", [0, 1])], 1, "only a rebalance"),
        ([mv("a", "n1", [0, 1], "n2", [4, 5])], 1, "has 0 milli free"),
        ([mv("a", "n1", [3, 5], "n2", [5, 6])], 1, "does not hold exactly"),
        ([mv("a", "n1", [0, 1], "n2", [6, 5]), mv("a", "n2", [5, 6], "n1", [3, 5])], 2, "splits"),
        ([mv("j0", "n1", [2], "n3", [0], kind="rebalance")], 1, "out of rack r1"),
        ([mv("zz", "n1", [2], "n3", [0])], 1, "no allocation"),
        ([mv("a", "n1", [0, 1], "n2", [5])], 1, "needs 2"),
        ([mv("a", "n1", [0, 1], "n2", [5, 9])], 1, "has no GPU 9"),
        # valid plans: every rule passes
        ([mv("a", "n1", [0, 1], "n2", [5, 6])], None, None),
        ([mv("j0", "n1", [2], "n2", [5], kind="rebalance")], None, None),  # stays in rack r1
        ([mv("a", "n1", [0, 1], "n2", [5, 6]), mv("j0", "n1", [2], "n1", [0])], None, None),
    ],
)
def test_each_rule_names_the_failing_step(plan, step, needle) -> None:
    result = check_plan(cluster(), plan, goal_priority=20)
    if step is None:
        assert result.ok, result
        return
    assert not result.ok
    assert result.violation.step == step
    assert needle in result.violation.reason, result.violation.reason


def test_move_needs_its_target_free_at_that_step() -> None:
    model = cluster()
    # d (half GPU) onto n1/gpu0 which a still holds: wrong order ...
    wrong = [mv("d", "n2", [7], "n1", [0], 500), mv("a", "n1", [0, 1], "n2", [5, 6])]
    result = check_plan(model, wrong, goal_priority=100)
    assert not result.ok and result.violation.step == 1
    # ... and right once a has left
    assert check_plan(model, wrong[::-1], goal_priority=100).ok


def test_sharing_and_fractions() -> None:
    model = cluster()
    # a second half GPU next to d is fine, a whole one is not
    ok = [mv("b", "n1", [4], "n2", [7], 500, kind="share")]
    assert check_plan(model, ok, goal_priority=100).ok
    bad = [mv("b", "n1", [4], "n2", [7], 1000)]
    assert "has 500 milli free" in check_plan(model, bad, goal_priority=100).violation.reason


def test_rebalance_respects_gpu_spec_and_cpu() -> None:
    model = cluster(big_cpu=70000)  # more CPU than n3 offers
    step = [mv("big", "n1", [7], "n3", [0], kind="rebalance")]
    assert "CPU" in check_plan(model, step, goal_priority=100).violation.reason
    model = cluster(big_cpu=1000)
    assert check_plan(model, step, goal_priority=100).ok


def test_reserve_reclaim_and_quota() -> None:
    model = cluster()
    policy = Policy(quotas={("t9", ""): 3})
    reserve = [
        Action(
            "reserve", alloc="r0", job="new", tenant="t9", dst=GpuSet("n3", (0, 1)), rack_local=True
        ),
        Action(
            "reserve", alloc="r1", job="new", tenant="t9", dst=GpuSet("n2", (5, 6)), rack_local=True
        ),
    ]
    result = check_plan(model, reserve, policy, goal_priority=100)
    assert result.violation.step == 2 and "one rack" in result.violation.reason
    over = [Action("reserve", alloc="r0", tenant="t9", dst=GpuSet("n3", (0, 1, 2, 3)))]
    assert "quota of 3" in check_plan(model, over, policy).violation.reason
    reclaim = [
        Action("reclaim", alloc="d", src=GpuSet("n2", (7,), 500)),
        Action("reserve", alloc="r0", tenant="t9", dst=GpuSet("n2", (7,))),
        Action("reclaim", alloc="d", src=GpuSet("n2", (7,), 500)),
    ]
    result = check_plan(model, reclaim, policy, goal_priority=100)
    assert result.violation.step == 3 and "already reclaimed" in result.violation.reason
    after = apply_plan(model, reclaim[:2])
    assert after.allocations.node[list(after.allocations.id).index("d")] == -1
    assert "r0" in list(after.allocations.id)


def test_a_tenant_over_quota_may_move_what_it_holds_but_not_take_more() -> None:
    """t1 holds 9 GPUs against a quota of 4 (the source says so): moving its task `a` keeps 9
    and is allowed; a reservation for t1 then raises it to 11 and is refused."""
    model = cluster()
    policy = Policy(quotas={("t1", ""): 4})
    move = [mv("a", "n1", (0, 1), "n2", (5, 6))]
    assert check_plan(model, move, policy).ok
    more = [*move, Action("reserve", alloc="r0", tenant="t1", dst=GpuSet("n3", (2, 3)))]
    result = check_plan(model, more, policy, goal_priority=100)
    assert result.violation.step == 2
    assert result.violation.reason == "tenant 't1' would hold 11 GPUs, above its quota of 4"


def test_borrow_moves_quota_and_conserves_it() -> None:
    model = cluster()
    policy = Policy(quotas={("t1", ""): 9, ("t9", ""): 0})  # t1 uses 9 GPUs
    lend = Action("borrow", alloc="", quota=(("t1", "", -2.0), ("t9", "", 2.0)))
    result = check_plan(model, [lend], policy)
    assert "lender 't1' uses 9" in result.violation.reason
    policy = Policy(quotas={("t1", ""): 12, ("t9", ""): 0})
    use = Action("reserve", alloc="r", tenant="t9", dst=GpuSet("n3", (0, 1)))
    assert not check_plan(model, [use], policy).ok
    assert check_plan(model, [lend, use], policy).ok
    mint = Action("borrow", quota=(("t9", "", 2.0),))
    assert "changes total quota" in check_plan(model, [mint], policy).violation.reason


def test_action_json_round_trip_and_validation() -> None:
    action = Action(
        "migrate",
        alloc="a",
        job="a",
        src=GpuSet("n1", (0, 1)),
        dst=GpuSet("n2", (5, 6)),
        cost=Cost(1, 300.0, 600.0 / 3600, ("a",), ("t1",)),
    )
    doc = json.loads(json.dumps(action.to_dict()))
    assert Action.from_dict(doc) == action
    plan = Plan("job=4", True, (action,))
    assert json.loads(json.dumps(plan.to_dict()))["actions"][0]["from"]["node"] == "n1"
    with pytest.raises(ValueError, match="unknown action kind"):
        Action("teleport", alloc="a")
    with pytest.raises(ValueError, match="both a source and a target"):
        Action("migrate", alloc="a", src=GpuSet("n1", (0,)))


def test_policy_file_errors_name_the_field(tmp_path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("quotas:\n  rnd: 64\n  product: {A100: 32, H100: -1}\n")
    with pytest.raises(PolicyError, match=r"quotas\.product\.H100: expected a finite number >= 0"):
        load_policy(path)
    # YAML's .inf and JSON's Infinity: no sum or print of a plan could use them
    path.write_text("default_restart_s: .inf\n")
    with pytest.raises(
        PolicyError, match=r"default_restart_s: expected seconds \(a finite number >= 0\) or a"
    ):
        load_policy(path)
    path.write_text("default_restart_s: 5m\n")  # a time may be written as a duration
    assert load_policy(path).default_restart_s == 300.0
    (tmp_path / "inf.json").write_text('{"quotas": {"rnd": Infinity}}')
    with pytest.raises(PolicyError, match=r"quotas\.rnd: expected a finite number >= 0"):
        load_policy(tmp_path / "inf.json")
    path.write_text("quotas:\n  rnd: 64\n  product: {A100: 32}\ndefault_restart_s: 120\n")
    policy = load_policy(path)
    assert policy.quotas == {("rnd", ""): 64.0, ("product", "A100"): 32.0}
    assert policy.default_restart_s == 120.0
    with pytest.raises(PolicyError, match="unknown key"):
        policy_from_dict({"quota": {}})
    with pytest.raises(PolicyError, match="island_locality: expected true or false"):
        policy_from_dict({"island_locality": "yes"})
    bad = tmp_path / "p.json"
    bad.write_text("{not json")
    with pytest.raises(PolicyError, match="not valid json"):
        load_policy(bad)


def test_over_committed_node_only_refuses_what_asks_for_more() -> None:
    b = add_nodes(["full", "other"], 2, gpu_model="A100", cpu_milli=8000)
    b.add_allocation("hog", num_gpu=1, node="full", gpus=[0], cpu_milli=12000)  # over already
    b.add_allocation("light", num_gpu=1, node="other", gpus=[0])  # requests no CPU
    b.add_allocation("heavy", num_gpu=1, node="other", gpus=[1], cpu_milli=1000)
    model = b.build()
    light = mv("light", "other", [0], "full", [1])
    assert check_plan(model, [light]).ok
    heavy = mv("heavy", "other", [1], "full", [1])
    assert "lacks the CPU" in check_plan(model, [heavy]).violation.reason
