"""Tenant-level borrow goals (`borrow=TENANT:GPUS[:PRIORITY]`): a count of GPUs is split as
work takes them (whole nodes and one remainder task on one node), checked against the GPUs
free now, and refused in one line naming the real reason."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from advisor import snapshot
from advisor.cli import main
from advisor.planner.borrow import plan_borrow, split_gpus
from advisor.planner.check import check_plan
from advisor.planner.constraints import UNASSIGNED, BorrowRules, load_policy
from advisor.planner.recommend import plan_for_goal
from advisor.planner.reserve import Request

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SEED = EXAMPLES / "seed-quota-borrow.json"  # 13 x 8 A100, 34 GPUs free: 4 nodes + 2 on node-09
RULES = EXAMPLES / "policy-borrow-per-tenant.yaml"  # rnd 40 (35 used), ratio 0.75, threshold 50


@pytest.fixture(scope="module")
def model():
    return snapshot.load(SEED)


@pytest.fixture(scope="module")
def policy():
    return load_policy(RULES)


def _starts(plan) -> list[tuple[str, int]]:
    return [(a.dst.node, len(a.dst.gpus)) for a in plan.actions if a.kind == "reserve"]


def test_a_count_is_split_into_whole_nodes_and_one_remainder_task(model) -> None:
    sizes = {
        g: [(p.tasks, p.num_gpu) for p in split_gpus(model, "rnd", g)] for g in (5, 8, 9, 30, 32)
    }
    assert sizes == {
        5: [(1, 5)],
        8: [(1, 8)],
        9: [(1, 8), (1, 1)],
        30: [(3, 8), (1, 6)],
        32: [(4, 8)],
    }
    parts = split_gpus(model, "rnd", 30, 60, "big")
    assert {(p.job, p.tenant, p.priority) for p in parts} == {("big", "rnd", 60)}
    with pytest.raises(ValueError, match="at least 1 GPU"):
        split_gpus(model, "rnd", 0)


def test_the_auditors_repro_is_no_longer_refused_for_free_gpus(model, policy) -> None:
    """`borrow=rnd:30` used to be one 30-GPU task no 8-GPU node holds: "not enough free GPUs
    now" with 34 free. 30 is within the ratio (35 + 30 - 40 = 25 <= 0.75 x 40 = 30); without a
    priority the request is refused by the threshold, and says so; with one it is a loan."""
    (plan,) = plan_for_goal(model, policy, "borrow=rnd:30")
    assert not plan.feasible and not plan.actions
    assert plan.reason == (
        "priority 0 (the request gives none: 0 assumed) is under the borrowing threshold 50"
    )
    (plan,) = plan_for_goal(model, policy, "borrow=rnd:30:50")
    assert plan.feasible, plan.reason
    assert plan.goal == "borrow quota for rnd-request (30 GPUs of 'rnd')"
    starts = _starts(plan)
    assert sorted(n for _, n in starts) == [6, 8, 8, 8] and sum(n for _, n in starts) == 30
    assert len({node for node, _ in starts}) == 4  # each task on its own node
    loans = {a.quota[1][0]: -a.quota[1][2] for a in plan.actions if a.kind == "borrow"}
    assert loans == {"algorithms": 10, "product": 5, UNASSIGNED: 10}  # 25 = 35 + 30 - 40
    assert check_plan(model, plan.actions, policy, 50).ok
    reserves = [a for a in plan.actions if a.kind == "reserve"]
    assert all(a.rack_local for a in reserves)
    refused = check_plan(model, reserves, policy, 50)  # the loans are needed
    assert not refused.ok and "quota of 40" in refused.violation.reason


def test_the_remainder_takes_a_partly_free_node_when_it_fits(model, policy) -> None:
    (plan,) = plan_for_goal(model, policy, "borrow=rnd:34:80")  # every free GPU
    assert plan.feasible, plan.reason
    assert sorted(_starts(plan)) == [
        ("a100-node-09", 2),
        ("a100-node-10", 8),
        ("a100-node-11", 8),
        ("a100-node-12", 8),
        ("a100-node-13", 8),
    ]
    assert check_plan(model, plan.actions, policy, 80).ok


@pytest.mark.parametrize("gpus", [35, 36, 60])
def test_a_request_above_the_free_gpus_names_the_free_count(model, policy, gpus) -> None:
    (plan,) = plan_for_goal(model, policy, f"borrow=rnd:{gpus}:80")
    assert not plan.feasible and not plan.actions
    assert plan.reason == (
        f"not enough free GPUs now: only 34 free, {gpus} needed; a loan would not start it"
    )


def test_a_multiple_of_the_node_size_is_planned_as_before(model, policy) -> None:
    (by_count,) = plan_for_goal(model, policy, "borrow=rnd:32:80")
    (by_shape,) = plan_for_goal(model, policy, "borrow=rnd:4x8:80")
    direct = plan_borrow(model, policy, Request("rnd-request", "rnd", 80, 4, 8))
    assert by_count.feasible and by_count.to_dict() == by_shape.to_dict() == direct.to_dict()
    assert _starts(by_count) == [(f"a100-node-{n}", 8) for n in (10, 11, 12, 13)]
    assert check_plan(model, by_count.actions, load_policy(RULES), 80).ok
    # one node's worth or less stays one task
    (small,) = plan_for_goal(model, policy, "borrow=rnd:8:80")
    assert small.feasible and len(_starts(small)) == 1


def test_the_ratio_refuses_with_its_numbers(model, policy) -> None:
    tight = replace(
        policy, borrowing={"": BorrowRules(max_borrow_ratio=0.5, priority_threshold=50)}
    )
    (plan,) = plan_for_goal(model, tight, "borrow=rnd:30:80")
    assert not plan.feasible and not plan.actions
    assert plan.reason == (
        "'rnd' needs 25 GPUs more than its quota of 40; it may borrow at most 0.5 x 40 = 20 "
        "(max_borrow_ratio x quota)"
    )


def test_free_gpus_in_the_wrong_shape_say_so(model, tmp_path) -> None:
    """node-13 in another rack: 34 GPUs free, but rack-01 holds only 3 free nodes + 2 GPUs, so
    3 x 8 + 6 has no rack under rack locality; without it the job spans both racks."""
    doc = json.loads(SEED.read_text())
    for node in doc["nodes"]:
        if node["name"] == "a100-node-13":
            node["rack"] = "rack-02"
    path = tmp_path / "two-racks.json"
    path.write_text(json.dumps(doc))
    split = snapshot.load(path)
    policy = load_policy(RULES)
    (plan,) = plan_for_goal(split, policy, "borrow=rnd:30:80")
    assert not plan.feasible and not plan.actions
    assert plan.reason == (
        "not enough free GPUs now in the job's shape: 34 free, but not as 3 x 8 + 1 x 6 GPUs, "
        "each task on one node in one rack and GPU model; a loan would not start it"
    )
    (plan,) = plan_for_goal(split, policy, "borrow=rnd:26:80")  # 3 x 8 + 2 on node-09
    assert plan.feasible and ("a100-node-09", 2) in _starts(plan)
    assert check_plan(split, plan.actions, policy, 80).ok
    loose = replace(policy, rack_locality=False)
    (plan,) = plan_for_goal(split, loose, "borrow=rnd:30:80")
    assert plan.feasible, plan.reason
    assert not any(a.rack_local for a in plan.actions if a.kind == "reserve")
    assert check_plan(split, plan.actions, loose, 80).ok


def test_a_pending_job_keeps_its_own_shape(model, policy) -> None:
    (plan,) = plan_for_goal(model, policy, "borrow=rnd-pretrain")
    assert plan.feasible and _starts(plan) == [(f"a100-node-{n}", 8) for n in (10, 11, 12, 13)]
    assert plan.goal == "borrow quota for rnd-pretrain (32 GPUs of 'rnd')"


def test_cli_repro_before_and_after(capsys) -> None:
    args = ["plan", str(SEED), "--policy", str(RULES), "--goal"]
    assert main([*args, "borrow=rnd:30"]) == 1
    out = capsys.readouterr().out
    assert "not enough free GPUs" not in out and "borrowing threshold 50" in out
    assert main([*args, "borrow=rnd:30:50", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["feasible"] and doc["method"] == "borrow"
    assert sum(len(a["to"]["gpus"]) for a in doc["actions"] if a["kind"] == "reserve") == 30
