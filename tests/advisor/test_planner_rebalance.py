"""Type rebalancing: the mixed-fleet seed case, the slowdown estimate, and random clusters."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from advisor import snapshot
from advisor.ingest.sources import load_source
from advisor.model import ModelBuilder
from advisor.planner.check import check_plan
from advisor.planner.constraints import Policy
from advisor.planner.rebalance import RebalanceSettings, plan_rebalance, slowdown, throughput
from tests.advisor._recommend_clusters import assert_checked, clusters, policies
from tests.conftest import GIB, add_nodes

SEED = Path(__file__).resolve().parents[2] / "examples" / "seed-mixed-fleet.json"
H100, A100, V100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-32GB"
ELIGIBLE = {"h100-light-1", "h100-light-2", "a100-light-1", "a100-light-2", "a100-light-4"}


def test_seed_mixed_fleet_moves_the_eligible_jobs_only() -> None:
    model = snapshot.load(SEED)
    gpu_model = model.nodes.gpu_model[model.gpus.node]
    assert [(gpu_model == m).sum() for m in (H100, A100, V100)] == [32, 64, 32]
    plan = plan_rebalance(model)
    assert plan.feasible
    # only the moves a queued task needs; the other eligible ones are named as not needed
    assert {a.alloc for a in plan.actions} == {"h100-light-2", "a100-light-4"}
    assert {a.alloc for a in plan.actions} | set(plan.extra["not_needed"]) == ELIGIBLE
    assert check_plan(model, plan.actions, Policy()).ok
    for action in plan.actions:
        assert action.kind == "rebalance" and action.dst.node.startswith("v100-")
        assert "estimated slowdown 1.00x" in action.reason
        assert action.cost.restarts == 1
    jobs = {j["alloc"]: j for j in plan.extra["jobs"]}
    why = {name: jobs[name]["targets"][V100]["why_not"] for name in jobs}
    assert "slower" in why["h100-busy"] and "slower" in why["a100-mid"]
    assert why["h100-pinned"].startswith("asks for")
    assert "does not fit" in why["h100-bigmem"]
    assert why["h100-serving"] == "marked not migratable"
    assert not any(jobs[n]["moved"] for n in jobs if n not in ELIGIBLE)
    assert plan.extra["scarce"] == [A100, H100] and plan.extra["idle"] == [V100]
    assert plan.extra["freed_gpus"] == {A100: 4, H100: 2}
    # the freed GPUs let the small queued jobs start
    assert set(plan.benefit.newly_schedulable()) == {f"2 GPU [{H100}]", f"4 GPU [{A100}]"}


def test_slowdown_estimate() -> None:
    assert throughput(A100) == 2.5 and throughput(V100) == 1.0 and throughput("Mystery") is None
    assert slowdown(0.3, A100, V100) == 1.0  # needs 75 % of a V100
    assert slowdown(0.6, A100, V100) == pytest.approx(1.5)
    assert slowdown(0.9, H100, A100) == pytest.approx(1.8)
    assert slowdown(0.5, "Mystery", V100) is None


def test_max_slowdown_and_priority_settings() -> None:
    model = snapshot.load(SEED)
    lax = plan_rebalance(model, None, RebalanceSettings(max_slowdown=1.7))
    assert "a100-mid" in {a.alloc for a in lax.actions}  # 1.6x allowed now
    none = plan_rebalance(model, None, RebalanceSettings(goal_priority=10))
    assert not none.actions  # every job has priority 50


def _full_a100_no_queue(util: float):
    b = ModelBuilder()
    for name, gpu_model, gib in (("a", A100, 80), ("v", V100, 32)):
        add_nodes([name], 4, builder=b, gpu_model=gpu_model, memory_total_bytes=gib * GIB)
    for i in range(4):
        b.add_allocation(f"j{i}", num_gpu=1, node="a", gpus=[i])
    times = [0.0, 600.0, 1200.0]
    levels = np.array([util] * 4 + [0.0] * 4, dtype=np.float32)
    u = np.tile(levels, (3, 1))
    return b.build(timestamp=1200.0, usage=(times, u, np.full_like(u, 2**30)))


def test_without_queue_a_full_model_is_scarce() -> None:
    plan = plan_rebalance(_full_a100_no_queue(0.2))
    assert len(plan.actions) == 1  # back under 90 % allocated: one GPU of four
    assert not plan_rebalance(_full_a100_no_queue(0.9)).actions


def test_sim_mixed_preset_plans_pass_the_check() -> None:
    model = load_source("sim:mixed-h100-a100-v100?t=86400&history=2h&step=10m")
    plan = plan_rebalance(model)
    assert_checked(model, plan, Policy())
    for action in plan.actions:  # from a model with a queue to one with idle GPUs
        src = model.nodes.gpu_model[model.node_index(action.src.node)]
        dst = model.nodes.gpu_model[model.node_index(action.dst.node)]
        assert src in plan.extra["scarce"] and dst in plan.extra["idle"]


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
@given(m=clusters(), policy=policies())
def test_every_rebalance_plan_passes_the_check(m, policy) -> None:
    plan = plan_rebalance(m, policy, RebalanceSettings(max_slowdown=3.0))
    assert_checked(m, plan, policy)


def test_never_moves_work_for_a_lower_priority_queue() -> None:
    model = snapshot.load(SEED)
    allocs = model.allocations
    priority = np.where(allocs.node < 0, 10, allocs.priority).astype(np.int32)
    low = replace(model, allocations=replace(allocs, priority=priority), _cache={})
    plan = plan_rebalance(low)
    assert plan.feasible and not plan.actions  # running jobs have priority 50, the queue 10
    assert plan.extra["models"][A100]["queue_priority"] == 10


def test_without_usage_history_the_note_names_it() -> None:
    """The seed without its usage history: the scarce models are there, but how light their
    jobs are is unknown, which is what the note says (not that no light job fits)."""
    from advisor.model import Usage

    model = snapshot.load(SEED)
    bare = replace(model, usage=Usage.empty(len(model.gpus)))
    plan = plan_rebalance(bare)
    assert not plan.actions
    assert plan.reason.startswith(
        f"the source has no usage history, so how light the jobs on {A100}"
    )
    assert "history=24h" in plan.reason
    assert plan_rebalance(model).reason == ""
