"""Rebalance keeps only the moves that let a queued task start (no restart that buys nothing).

Fit counts are computed here independently of the planner: `measures.jobs_that_fit` of each
queued shape on `check.apply_plan` of the plan (or of the plan less one move).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from advisor import snapshot
from advisor.fragmentation.measures import Shape, jobs_that_fit
from advisor.model import MILLI, ClusterModel
from advisor.planner import rebalance
from advisor.planner.actions import Action, Cost
from advisor.planner.check import apply_plan, check_plan
from advisor.planner.constraints import Policy
from advisor.planner.rebalance import RebalanceSettings, plan_rebalance
from tests.advisor._recommend_clusters import assert_checked, clusters, policies
from tests.conftest import GIB, add_nodes

SEED = Path(__file__).resolve().parents[2] / "examples" / "seed-mixed-fleet.json"
H100, A100, V100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-32GB"
OLD_FIVE = {"h100-light-1", "h100-light-2", "a100-light-1", "a100-light-2", "a100-light-4"}


def queued_shapes(model: ClusterModel) -> list[Shape]:
    allocs = model.allocations
    pending = np.flatnonzero((allocs.node < 0) & (allocs.num_gpu > 0)).tolist()
    shapes = {
        Shape(int(allocs.num_gpu[r]), int(allocs.gpu_milli[r]), gpu_spec=str(allocs.gpu_spec[r]))
        for r in pending
    }
    return sorted(shapes, key=lambda s: s.name)


def fit_counts(model: ClusterModel, actions, shapes: list[Shape]) -> dict[str, int]:
    after = apply_plan(model, list(actions)) if actions else model
    return {s.name: jobs_that_fit(after, s) for s in shapes}


def old_candidate_moves(model: ClusterModel) -> list[Action]:
    """The moves the planner builds before keeping only the needed ones (the old plan: GPUs
    freed up to the demand counted in GPUs)."""
    s = RebalanceSettings()
    table = rebalance._model_table(model, s.scarce_ratio)
    scarce = {m for m, r in table.items() if r["to_free"] > 0}
    idle = {m for m, r in table.items() if r["free"] > 0 and m not in scarce}
    found = rebalance.candidates(model, s)
    return rebalance._plan_moves(model, Policy(), s, table, scarce, idle, found, set())


def test_seed_plan_has_only_needed_moves_and_is_checked() -> None:
    model = snapshot.load(SEED)
    plan = plan_rebalance(model)
    shapes = queued_shapes(model)
    assert [s.name for s in shapes] == [
        f"2 GPU [{H100}]",
        f"4 GPU [{A100}]",
        f"8 GPU [{A100}]",
        f"8 GPU [{H100}]",
    ]
    assert plan.feasible and plan.actions
    assert check_plan(model, plan.actions, Policy()).ok
    full = fit_counts(model, plan.actions, shapes)
    for i, action in enumerate(plan.actions):
        rest = plan.actions[:i] + plan.actions[i + 1 :]
        assert check_plan(model, rest, Policy()).ok
        without = fit_counts(model, rest, shapes)
        lowered = [name for name in full if without[name] < full[name]]
        assert lowered, f"{action.alloc} is not needed: {without} vs {full}"
        for name in lowered:  # the reason names the queued shape the move serves
            assert f"queued {name} task could not start" in action.reason
        assert "frees" in action.reason and "for the queue" in action.reason
    assert {a.alloc for a in plan.actions} == {"h100-light-2", "a100-light-4"}
    assert plan.extra["not_needed"] == ["a100-light-1", "a100-light-2", "h100-light-1"]
    assert plan.extra["freed_gpus"] == {A100: 4, H100: 2}
    # the plan's cost is the sum of its moves
    assert plan.cost == Cost.total(a.cost for a in plan.actions)
    assert plan.cost.restarts == 2
    assert plan.cost.gpu_hours == pytest.approx(0.5)


def test_seed_plan_keeps_the_benefit_of_the_old_five_move_plan() -> None:
    model = snapshot.load(SEED)
    old = old_candidate_moves(model)
    assert {a.alloc for a in old} == OLD_FIVE
    assert check_plan(model, old, Policy()).ok
    assert sum(a.cost.restarts for a in old) == 5
    assert sum(a.cost.gpu_hours for a in old) == pytest.approx(0.8333, abs=1e-3)
    plan = plan_rebalance(model)
    shapes = queued_shapes(model)
    before = fit_counts(model, [], shapes)
    after_old = fit_counts(model, old, shapes)
    after_new = fit_counts(model, plan.actions, shapes)
    assert after_new == after_old
    assert after_new == {
        f"2 GPU [{H100}]": 1,
        f"4 GPU [{A100}]": 1,
        f"8 GPU [{A100}]": 0,
        f"8 GPU [{H100}]": 0,
    }
    assert all(n == 0 for n in before.values())
    assert set(plan.benefit.newly_schedulable()) == {f"2 GPU [{H100}]", f"4 GPU [{A100}]"}
    assert plan.extra["queue"][f"4 GPU [{A100}]"] == {
        "waiting": 1,
        "could_start_before": 0,
        "could_start_after": 1,
    }
    assert plan.extra["queue"][f"8 GPU [{A100}]"]["could_start_after"] == 0


def test_no_move_helps_the_queue_gives_no_plan_with_a_reason() -> None:
    """The seed with every waiting task asking for 8 GPUs: moving the light jobs frees at most
    7 GPUs of a node, which starts none of them."""
    model = snapshot.load(SEED)
    allocs = model.allocations
    num_gpu = np.where(allocs.node < 0, 8, allocs.num_gpu).astype(allocs.num_gpu.dtype)
    eights = replace(model, allocations=replace(allocs, num_gpu=num_gpu), _cache={})
    assert {a.alloc for a in old_candidate_moves(eights)} == OLD_FIVE  # candidates exist
    plan = plan_rebalance(eights)
    assert plan.feasible and not plan.actions
    assert plan.cost.restarts == 0
    assert plan.extra["not_needed"] == sorted(OLD_FIVE)
    assert plan.extra["freed_gpus"] == {}
    assert "would let no more queued tasks of their priority or above start" in plan.reason
    assert f"3 x 8 GPU [{A100}]" in plan.reason and f"2 x 8 GPU [{H100}]" in plan.reason
    assert not plan.benefit.newly_schedulable()


def _all_light(
    queue: list[float], queue_priority: list[int] | None = None, running_priority: int = 0
) -> ClusterModel:
    """Two A100 nodes full of light 1-GPU jobs, two idle V100 nodes, `queue` A100 tasks (of
    `queue_priority`, else 0; the running jobs of `running_priority`)."""
    priorities = queue_priority or [0] * len(queue)
    b = add_nodes(["a0", "a1"], gpu_model=A100, memory_total_bytes=80 * GIB)
    add_nodes(["v0", "v1"], builder=b, gpu_model=V100, memory_total_bytes=32 * GIB)
    for node in ("a0", "a1"):
        for i in range(8):
            b.add_allocation(
                f"{node}-j{i}", num_gpu=1, node=node, gpus=[i], priority=running_priority
            )
    for k, (size, priority) in enumerate(zip(queue, priorities, strict=True)):
        if size < 1:
            b.add_allocation(
                f"q{k}",
                num_gpu=1,
                gpu_milli=round(size * MILLI),
                gpu_spec=A100,
                priority=priority,
            )
        else:
            b.add_allocation(f"q{k}", num_gpu=int(size), gpu_spec=A100, priority=priority)
    times = [0.0, 600.0, 1200.0]
    levels = np.array([0.2] * 16 + [0.0] * 16, dtype=np.float32)
    u = np.tile(levels, (3, 1))
    return b.build(timestamp=1200.0, usage=(times, u, np.full_like(u, 2**30)))


def test_the_queue_is_served_together_not_shape_by_shape() -> None:
    """One 8-GPU and three 1-GPU tasks wait: a freed node alone would count for each shape on
    its own, but the queue needs 11 GPUs together, so 11 moves stay, each needed."""
    model = _all_light([8, 1, 1, 1])
    plan = plan_rebalance(model)
    assert len(plan.actions) == 11 and not plan.extra["not_needed"]
    assert_checked(model, plan, Policy())
    assert plan.extra["queue"] == {
        "1 GPU [NVIDIA A100-SXM4-80GB]": {
            "waiting": 3,
            "could_start_before": 0,
            "could_start_after": 3,
        },
        "8 GPU [NVIDIA A100-SXM4-80GB]": {
            "waiting": 1,
            "could_start_before": 0,
            "could_start_after": 1,
        },
    }
    shapes = queued_shapes(model)
    full = fit_counts(model, plan.actions, shapes)
    for i in range(len(plan.actions)):
        rest = plan.actions[:i] + plan.actions[i + 1 :]
        without = fit_counts(model, rest, shapes)
        assert any(without[name] < full[name] for name in full)


def test_no_move_is_kept_for_a_queued_task_of_lower_priority() -> None:
    """An 8-GPU task of priority 100 and a 1-GPU task of priority 0 wait; the light jobs run at
    priority 50. Eight moves start the 8-GPU task; a ninth would start only the priority-0 one,
    moving priority-50 work for lower-priority demand, so it is not made."""
    model = _all_light([8, 1], queue_priority=[100, 0], running_priority=50)
    plan = plan_rebalance(model)
    assert_checked(model, plan, Policy())
    assert len(plan.actions) == 8 and len(plan.extra["not_needed"]) == 1
    assert plan.extra["queue"] == {
        f"1 GPU [{A100}]": {"waiting": 1, "could_start_before": 0, "could_start_after": 0},
        f"8 GPU [{A100}]": {"waiting": 1, "could_start_before": 0, "could_start_after": 1},
    }
    assert all(f"1 queued 8 GPU [{A100}] task could not start" in a.reason for a in plan.actions)
    # with the small task at priority 50 too, the ninth move serves it and stays
    same = plan_rebalance(_all_light([8, 1], queue_priority=[100, 50], running_priority=50))
    assert len(same.actions) == 9 and not same.extra["not_needed"]


def test_higher_priority_queued_tasks_are_packed_first() -> None:
    """Room for one of two 1-GPU tasks: the priority-100 one gets it, as a scheduler would."""
    model = _all_light([1, 1], queue_priority=[0, 100])
    served = rebalance._served(model, rebalance._queue(model), _one_free_a100(model))
    assert served == {(_shape(1), 100): 1, (_shape(1), 0): 0}


def _shape(gpus: int) -> Shape:
    return Shape(gpus, MILLI, 1, gpu_spec=A100)


def _one_free_a100(model: ClusterModel) -> tuple[np.ndarray, np.ndarray]:
    allocated = model.gpu_milli_allocated.copy()
    allocated[0] = 0  # a0's first GPU given back
    return model.gpu_room(allocated)


def test_moves_beyond_what_waits_are_not_made() -> None:
    """Two 1-GPU tasks wait and 2 GPUs are short: two moves, none past the queue."""
    plan = plan_rebalance(_all_light([1, 1]))
    assert len(plan.actions) == 2
    assert plan.extra["queue"]["1 GPU [NVIDIA A100-SXM4-80GB]"]["could_start_after"] == 2


def test_room_matches_apply_plan() -> None:
    """The planner's fast free-GPU view after a plan is the one `apply_plan` gives."""
    for model in (snapshot.load(SEED), _all_light([8, 1, 1, 1])):
        moves = old_candidate_moves(model)
        assert moves
        after = apply_plan(model, moves)
        whole, milli = rebalance._room(model, [rebalance._rows(model, a) for a in moves])
        assert np.array_equal(whole, after.gpu_is_free)
        assert np.array_equal(milli, after.gpu_free_milli)


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
@given(m=clusters(), policy=policies())
def test_every_kept_move_lets_a_queued_task_start(m, policy) -> None:
    plan = plan_rebalance(m, policy, RebalanceSettings(max_slowdown=10.0, min_samples=1))
    assert_checked(m, plan, policy)
    queue = rebalance._queue(m)
    if not queue:
        return
    whole, milli = rebalance._room(m, [rebalance._rows(m, a) for a in plan.actions])
    after = apply_plan(m, list(plan.actions)) if plan.actions else m
    assert np.array_equal(whole, after.gpu_is_free)
    assert np.array_equal(milli, after.gpu_free_milli)
    full = rebalance._served(after, queue)
    assert all(full[q] <= n for q, n in queue.items())
    row_of = {a: r for r, a in enumerate(m.allocations.id.tolist())}
    for i, action in enumerate(plan.actions):
        rest = plan.actions[:i] + plan.actions[i + 1 :]
        without = rebalance._served(apply_plan(m, list(rest)) if rest else m, queue)
        own = int(m.allocations.priority[row_of[action.alloc]])
        # a queued task of the moved job's priority or above loses its start without it
        assert any(without[q] < full[q] and q[1] >= own for q in queue), action.alloc
        assert "could not start" in action.reason


def test_a_queued_share_of_a_gpu_is_served_too() -> None:
    """Half a GPU waits on a full model: one 1-GPU move makes room for it."""
    plan = plan_rebalance(_all_light([0.5]))
    assert len(plan.actions) == 1
    assert f"1 queued 0.5 GPU [{A100}] task could not start" in plan.actions[0].reason
    assert plan.extra["queue"] == {
        f"0.5 GPU [{A100}]": {"waiting": 1, "could_start_before": 0, "could_start_after": 1}
    }
