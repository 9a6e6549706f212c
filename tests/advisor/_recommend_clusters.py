"""Random clusters for the recommendation property tests (hypothesis strategies).

Mixed GPU models (A100/H100 with MIG profiles, V100 32/16 GB without), racks (some unknown),
NVLink islands (or unknown), lost GPUs, whole and fractional tasks of several tenants with
priorities, migratability, start times and usage history, waiting jobs, and policies with
quotas and borrowing rules (or none).
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st

from advisor.model import ModelBuilder
from advisor.planner.check import check_plan
from advisor.planner.constraints import BorrowRules, Policy

GIB = 2**30
T0 = 1_000_000.0
MODELS = (
    ("NVIDIA A100-SXM4-80GB", 80),
    ("NVIDIA H100 80GB HBM3", 80),
    ("Tesla V100-SXM2-32GB", 32),
    ("Tesla V100-SXM2-16GB", 16),
)
TENANTS = ("a", "b", "c")


def place_tasks(draw, b: ModelBuilder, name: str, size: int, count: int, kinds, common) -> None:
    """Fill node `name` (GPUs 0..size-1) with `count` tasks drawn from `kinds` ("1", "2", "4"
    whole GPUs, or "frac": 250 or 500 milli on a partly used GPU); `common(t)` gives each
    task's other fields. Tasks that no longer fit are skipped, so nothing is oversubscribed."""
    free = list(range(size))
    partial: dict[int, int] = {}
    for t in range(count):
        kind = draw(st.sampled_from(kinds))
        fields = common(t)
        if kind == "frac":
            milli = draw(st.sampled_from([250, 500]))
            spots = [g for g, used in partial.items() if used + milli <= 1000] or free[:1]
            if not spots:
                continue
            g = spots[0]
            if g in free:
                free.remove(g)
            partial[g] = partial.get(g, 0) + milli
            b.add_allocation(
                f"{name}-t{t}", num_gpu=1, gpu_milli=milli, node=name, gpus=[g], **fields
            )
            continue
        k = int(kind)
        if len(free) < k:
            continue
        start = draw(st.integers(0, len(free) - k))
        gpus = free[start : start + k]
        for g in gpus:
            free.remove(g)
        b.add_allocation(f"{name}-t{t}", num_gpu=k, node=name, gpus=gpus, **fields)


@st.composite
def clusters(draw):
    b = ModelBuilder()
    nodes = draw(st.integers(2, 5))
    samples = 6
    util_levels, mem_levels = [], []
    for n in range(nodes):
        gpu_model, gib = draw(st.sampled_from(MODELS))
        size = draw(st.sampled_from([4, 8]))
        islands = draw(st.booleans())
        rack = draw(st.sampled_from(["r0", "r1", "r1", ""]))
        name = f"n{n}"
        b.add_node(name, rack=rack, gpu_model=gpu_model)
        for i in range(size):
            island = (0 if i < size // 2 else 1) if islands else -1
            lost = draw(st.integers(0, 40)) == 0
            b.add_gpu(name, i, memory_total_bytes=gib * GIB, nvlink_island=island, lost=lost)
            util_levels.append(draw(st.sampled_from([0.0, 0.02, 0.1, 0.3, 0.6, 0.95])))
            mem_levels.append(draw(st.sampled_from([0.05, 0.2, 0.5, 0.9])) * gib * GIB)
        place_tasks(
            draw,
            b,
            name,
            size,
            count=draw(st.integers(0, 7)),
            kinds=["1", "1", "1", "2", "4", "frac"],
            common=lambda t, name=name: {
                "tenant": draw(st.sampled_from(TENANTS)),
                "priority": draw(st.sampled_from([0, 10, 100])),
                "migratable": draw(st.integers(0, 6)) > 0,
                "restart_cost_s": draw(st.sampled_from([60.0, 300.0, math.nan])),
                "start_time": T0 - draw(st.sampled_from([600.0, 7200.0, 86400.0])),
                "job": draw(st.sampled_from(["", "", "", "shared-job"])) or f"{name}-t{t}",
            },
        )
    for p in range(draw(st.integers(0, 3))):
        tasks = draw(st.sampled_from([1, 1, 2]))
        k = draw(st.sampled_from([1, 2, 4, 8]))
        spec = draw(st.sampled_from(["", "", MODELS[0][0], MODELS[2][0]]))
        tenant = draw(st.sampled_from(TENANTS))
        priority = draw(st.sampled_from([0, 50, 100]))
        for task in range(tasks):
            b.add_allocation(
                f"wait{p}-{task}",
                num_gpu=k,
                job=f"wait{p}",
                tenant=tenant,
                priority=priority,
                gpu_spec=spec,
            )
    times = [T0 - 1800.0 * (samples - 1 - t) for t in range(samples)]
    wobble = 1.0 + 0.05 * np.sin(np.arange(samples))[:, None]
    util = np.clip(np.array(util_levels)[None, :] * wobble, 0, 1)
    memory = np.broadcast_to(np.array(mem_levels)[None, :], util.shape)
    return b.build(timestamp=T0, usage=(times, util, memory))


@st.composite
def policies(draw):
    quotas = {}
    for tenant in TENANTS:
        if draw(st.booleans()):
            quotas[(tenant, "")] = float(draw(st.integers(0, 24)))
    borrowing = {}
    if draw(st.booleans()):
        borrowing[""] = BorrowRules(
            max_borrow_ratio=draw(st.sampled_from([0.0, 0.5, 2.0])),
            priority_threshold=draw(st.sampled_from([0, 50])),
            preemption=draw(st.booleans()),
        )
        if draw(st.booleans()):
            borrowing["b"] = BorrowRules(lend=False)
    return Policy(
        quotas=quotas,
        island_locality=draw(st.booleans()),
        rack_locality=draw(st.booleans()),
        borrowing=borrowing,
    )


@st.composite
def lending_policies(draw):
    """Tight quotas for every tenant and generous borrowing rules: loans are often needed
    and possible."""
    quotas = {(t, ""): float(draw(st.integers(0, 16))) for t in TENANTS}
    lend = {t: BorrowRules(max_borrow_ratio=8.0, lend=draw(st.booleans())) for t in TENANTS}
    return Policy(quotas=quotas, borrowing={"": BorrowRules(max_borrow_ratio=8.0), **lend})


def assert_checked(model, plan, policy, goal_priority=None) -> None:
    """A feasible plan replays OK; an infeasible one carries no actions."""
    if not plan.feasible:
        assert not plan.actions, plan.reason
        return
    result = check_plan(model, plan.actions, policy, goal_priority)
    assert result.ok, (plan.method, plan.goal, str(result))
