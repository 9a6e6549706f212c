"""Property tests on random clusters: every returned plan passes the step-by-step check, and the
heuristic is never cheaper than a proved optimum (nor feasible where infeasibility is proved)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from advisor.model import ModelBuilder
from advisor.planner.check import apply_plan, check_plan
from advisor.planner.consolidate import parse_goal, plan_heuristic
from advisor.planner.constraints import Policy, island_size_per_node
from advisor.planner.exact import SCALE, plan_exact
from tests.advisor._recommend_clusters import place_tasks
from tests.conftest import add_nodes


@st.composite
def clusters(draw):
    """2-6 nodes of 4 or 8 GPUs (islands of half a node, or unknown), two racks, one or two
    GPU models, filled with whole and fractional tasks of mixed priority and migratability."""
    b = ModelBuilder()
    count = draw(st.integers(2, 6))
    two_models = draw(st.booleans())
    for n in range(count):
        size = draw(st.sampled_from([4, 8]))
        islands = draw(st.booleans())
        name = f"n{n}"
        gpu_model = "H100" if two_models and n % 3 == 2 else "A100"
        b.add_node(name, rack=f"r{n % 2}", gpu_model=gpu_model)
        for i in range(size):
            island = (0 if i < size // 2 else 1) if islands else -1
            b.add_gpu(name, i, nvlink_island=island, lost=draw(st.integers(0, 60)) == 0)
        place_tasks(
            draw,
            b,
            name,
            size,
            count=draw(st.integers(1, 8)),
            kinds=["1", "1", "2", "4", "frac"],
            common=lambda _t: {
                "tenant": draw(st.sampled_from(["a", "b"])),
                "priority": draw(st.sampled_from([0, 10, 100])),
                "migratable": draw(st.integers(0, 9)) > 0,
                "restart_cost_s": draw(st.sampled_from([60.0, 300.0, float("nan")])),
            },
        )
    return b.build()


goals = st.sampled_from(
    ["job=1", "job=2", "job=4", "job=8", "job=2x4", "job=2x2", "free-nodes=1", "free-nodes=2"]
)


def _assert_proved(exact, what) -> None:
    """These instances are small (CP-SAT proves each in well under 0.1 s): a status short of a
    proof (a time-out) is a failure, not a reason to skip the comparisons with the heuristic.
    "feasible" is a proof too where cycle cuts made it so (the plan found after forbidding a
    set of moves that wait on each other is no longer proved optimal)."""
    status, cuts = exact.extra.get("status"), exact.extra.get("cuts", 0)
    proved = status in ("optimal", "infeasible") or (status == "feasible" and cuts > 0)
    assert proved, (what, status, cuts, exact.reason)


def _reservations_hold(model, plan) -> None:
    """The reserved GPUs are free after the moves, and island-local where the job fits one."""
    after = apply_plan(model, [a for a in plan.actions if a.kind == "migrate"])
    sizes = island_size_per_node(model)
    for action in plan.actions:
        if action.kind != "reserve":
            continue
        node = model.node_index(action.dst.node)
        rows = [model.gpu_row(node, i) for i in action.dst.gpus]
        assert after.gpu_is_free[rows].all()
        islands = model.gpus.nvlink_island[rows]
        if 1 < len(rows) <= sizes[node]:
            assert len(set(islands.tolist())) == 1


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
@given(model=clusters(), goal=goals, priority=st.sampled_from([10, 100]))
def test_every_plan_passes_the_check(model, goal, priority) -> None:
    g = parse_goal(goal, priority=priority)
    heuristic = plan_heuristic(model, g)
    exact = plan_exact(model, g, time_limit_s=5, hint=heuristic)
    for plan in (heuristic, exact):
        # plans are valid by construction: the final replay inside the planner never rejects one
        assert "failed its check" not in plan.reason, plan.reason
        if plan.feasible:
            result = check_plan(model, plan.actions, Policy(), priority)
            assert result.ok, (plan.method, str(result))
            _reservations_hold(model, plan)
            value = goal.split("=")[1]
            expected = int(value.split("x")[0]) if "x" in value or "free" in goal else 1
            assert sum(a.kind == "reserve" for a in plan.actions) == expected
    _assert_proved(exact, goal)
    status = exact.extra.get("status")
    if status == "infeasible":
        assert not heuristic.feasible
    if status == "optimal" and heuristic.feasible:
        assert exact.extra["objective"] <= heuristic.cost.score() + 1e-3
        if exact.feasible:  # the solver's objective rounds each task's cost to 1 / SCALE
            slack = (exact.migrations + heuristic.migrations) / SCALE
            assert exact.cost.score() <= heuristic.cost.score() + slack


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_plans_on_larger_clusters_pass_the_check(seed) -> None:
    """40 nodes of 8 GPUs at ~60 % load, two racks: heuristic plans check out."""
    rng = np.random.default_rng(seed)
    b = ModelBuilder()
    for n in range(40):
        add_nodes([f"n{n}"], builder=b, rack=f"r{n // 20}", gpu_model="A100", island=4)
        free = list(range(8))
        rng.shuffle(free)
        t = 0
        while len(free) > 3:
            k = int(rng.choice([1, 1, 2, 4]))
            island = free[0] // 4
            same = [g for g in free if g // 4 == island][:k]
            if len(same) < k:
                break
            for g in same:
                free.remove(g)
            b.add_allocation(
                f"n{n}-t{t}", num_gpu=k, node=f"n{n}", gpus=same, priority=int(rng.integers(3))
            )
            t += 1
    model = b.build()
    for goal in ("job=8", "job=4x8", "free-nodes=5", "job=4"):
        plan = plan_heuristic(model, parse_goal(goal, priority=int(rng.integers(3))))
        if plan.feasible:
            assert check_plan(model, plan.actions, Policy(), plan.extra["goal_priority"]).ok


def cpu_cluster(seed: int):
    """4-13 nodes with known (sometimes over-committed) CPU and memory, mixed GPU models,
    islands on some nodes, two-task jobs within a rack, GPU specs, priorities, migratability."""
    rng = np.random.default_rng(seed)
    b = ModelBuilder()
    n = int(rng.integers(4, 14))
    for i in range(n):
        gpu_model = "A100" if rng.random() < 0.7 else "H100"
        cpu = float(rng.choice([16000, 32000, np.nan]))
        memory = float(rng.choice([256000, np.nan]))
        islands = rng.random() < 0.6
        add_nodes(
            [f"n{i}"],
            builder=b,
            rack=f"r{i % 3}",
            gpu_model=gpu_model,
            cpu_milli=cpu,
            memory_mib=memory,
            island=4 if islands else None,
            lost=lambda _node, _gpu: rng.random() < 0.02,  # drawn per GPU, in index order
        )
    free = {i: list(range(8)) for i in range(n)}
    for t in range(int(rng.integers(n, 4 * n))):
        i = int(rng.integers(n))
        k = int(rng.choice([1, 1, 2, 4]))
        if len(free[i]) < k:
            continue
        gpus, free[i] = free[i][:k], free[i][k:]
        two = rng.random() < 0.15
        common = {
            "tenant": str(rng.choice(["a", "b"])),
            "priority": int(rng.choice([0, 50, 100])),
            "migratable": bool(rng.random() > 0.1),
            "cpu_milli": float(rng.choice([2000, 8000, np.nan])),
            "memory_mib": float(rng.choice([16000, np.nan])),
            "gpu_spec": str(rng.choice(["", "", "A100|H100"])),
        }
        b.add_allocation(f"t{t}", num_gpu=k, node=f"n{i}", gpus=gpus, job=f"j{t}", **common)
        if two:
            same = [j for j in range(n) if j % 3 == i % 3 and j != i and len(free[j]) >= k]
            if same:
                j = same[0]
                gpus, free[j] = free[j][:k], free[j][k:]
                b.add_allocation(
                    f"t{t}b", num_gpu=k, node=f"n{j}", gpus=gpus, job=f"j{t}", **common
                )
    return b.build()


# seeds that once produced plans needing CPU-aware ordering or a cycle cut, and a few more
@pytest.mark.parametrize("seed", [60, 127, 148, 151, 177, 203, 210, 236, 277, 1, 2, 3])
def test_cpu_constrained_plans_are_valid_by_construction(seed) -> None:
    model = cpu_cluster(seed)
    policy = Policy(island_locality=bool(seed % 2), rack_locality=bool(seed % 3))
    for text in ("job=8", "job=4", "job=2x8", "free-nodes=2", "job=3x4"):
        goal = parse_goal(text, priority=[50, 100][seed % 2])
        heuristic = plan_heuristic(model, goal, policy)
        exact = plan_exact(model, goal, policy, time_limit_s=5, hint=heuristic)
        for plan in (heuristic, exact):
            assert "failed its check" not in plan.reason, (text, plan.method, plan.reason)
            if plan.feasible:
                assert check_plan(model, plan.actions, policy, goal.priority).ok
        _assert_proved(exact, text)
        if exact.extra.get("status") == "infeasible":
            assert not heuristic.feasible, text
