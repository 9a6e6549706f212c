"""Plans for a waiting job that asks for CPU and memory besides GPUs: reservations wait for
both, a node too small is never reserved, and a consolidation clears a node with room for all
of it (a GPU-only plan would free GPUs where the job still cannot start)."""

from __future__ import annotations

import pytest

from advisor.fragmentation.measures import Shape
from advisor.model import ModelBuilder
from advisor.planner.consolidate import Goal, plan_heuristic
from advisor.planner.constraints import Policy
from advisor.planner.reserve import plan_reservations

T = 1_000_000.0
H = 3600.0


def cpu_cluster():
    """Two 8-GPU nodes of 96 cores: n0 with its GPUs free until... free now but 80 cores held
    by a CPU-only task until +3 h; n1 with every GPU busy until +1 h and its cores free. Job
    `wide` (8 GPUs, 64 cores, 256 GiB) waits."""
    b = ModelBuilder()
    for n in range(2):
        b.add_node(f"n{n}", gpu_model="A100", cpu_milli=96_000, memory_mib=384 * 1024)
        for i in range(8):
            b.add_gpu(f"n{n}", i)
    b.add_allocation(
        "cpu-hog",
        num_gpu=0,
        gpu_milli=0,
        node="n0",
        cpu_milli=80_000,
        memory_mib=1024,
        start_time=T - 60,
        deletion_time=T + 3 * H,
    )
    b.add_allocation(
        "gpus",
        num_gpu=8,
        node="n1",
        gpus=list(range(8)),
        cpu_milli=8_000,
        memory_mib=1024,
        start_time=T - 60,
        deletion_time=T + 1 * H,
    )
    b.add_allocation("wide", num_gpu=8, cpu_milli=64_000, memory_mib=256 * 1024)
    return b.build(timestamp=T)


def test_a_reservation_waits_for_the_cpu_a_job_needs_too() -> None:
    [plan] = plan_reservations(cpu_cluster(), Policy())
    # n0's GPUs are free now, but its CPU only at +3 h; n1 has both at +1 h
    assert plan.feasible and plan.extra["nodes"] == ["n1"]
    assert plan.extra["start_at"] == pytest.approx(T + H)


def test_a_node_too_small_for_the_job_is_never_reserved() -> None:
    b = ModelBuilder()
    b.add_node("small", gpu_model="A100", cpu_milli=32_000, memory_mib=1024 * 1024)
    for i in range(8):
        b.add_gpu("small", i)
    b.add_allocation("wide", num_gpu=8, cpu_milli=64_000)
    [plan] = plan_reservations(b.build(timestamp=T), Policy())
    assert not plan.feasible and "no group of nodes" in plan.reason


def test_consolidation_for_a_job_that_needs_cpu_clears_a_node_with_room_for_it() -> None:
    """n0: a CPU-only task holds 80 of 96 cores and a 1-GPU task one GPU; n1: a 2-GPU task.
    Counting GPUs only, moving the 1-GPU task is cheapest, but n0 would still lack the 64 cores
    the waiting job asks for: with its CPU in the goal, the 2-GPU task on n1 moves instead."""
    b = ModelBuilder()
    for n in range(3):
        b.add_node(f"n{n}", gpu_model="A100", cpu_milli=96_000, memory_mib=384 * 1024)
        for i in range(8):
            b.add_gpu(f"n{n}", i)
    b.add_allocation("hog", num_gpu=0, gpu_milli=0, node="n0", cpu_milli=80_000, start_time=T)
    b.add_allocation("one", num_gpu=1, node="n0", gpus=[0], cpu_milli=4_000, start_time=T)
    b.add_allocation("two", num_gpu=2, node="n1", gpus=[0, 1], cpu_milli=4_000, start_time=T)
    b.add_allocation("fill", num_gpu=6, node="n2", gpus=list(range(6)), start_time=T)
    model = b.build(timestamp=T)
    gpus_only = plan_heuristic(model, Goal("job=8", "job", Shape(8)), Policy())
    assert [a.alloc for a in gpus_only.actions if a.kind == "migrate"] == ["one"]
    goal = Goal("job=8 for wide", "job", Shape(8, cpu_milli=64_000))
    plan = plan_heuristic(model, goal, Policy())
    assert plan.feasible
    assert [a.alloc for a in plan.actions if a.kind == "migrate"] == ["two"]
    moved = next(a for a in plan.actions if a.kind == "migrate")
    assert moved.dst is not None and moved.dst.node == "n2"  # never back onto the cleared n1
    assert {a.dst.node for a in plan.actions if a.kind == "reserve" and a.dst} == {"n1"}
