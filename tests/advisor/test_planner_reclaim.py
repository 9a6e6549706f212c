"""Reclaim: long-idle allocations, their wasted GPU-hours and energy, and the checked plan."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from advisor.planner.check import apply_plan
from advisor.planner.constraints import Policy
from advisor.planner.observed import observe
from advisor.planner.reclaim import ReclaimSettings, idle_watts, plan_reclaim
from tests.advisor._recommend_clusters import assert_checked, clusters, policies
from tests.conftest import GIB, add_nodes

T0 = 1_000_000.0
STEP = 1800.0


def model(history: bool = True, watts: float | None = None):
    """One A100 node: `idle2` (2 GPUs) idle for the last 3 h, `busy` busy, `idle-pinned`
    idle but not migratable, `short-idle` idle for only the last half hour."""
    b = add_nodes(
        ["n1"],
        rack="r1",
        gpu_model="NVIDIA A100-SXM4-80GB",
        memory_total_bytes=80 * GIB,
        utilization_ratio=lambda _node, i: 0.9 if i == 2 else 0.0,
        power_watts=np.nan if watts is None else watts,
    )
    b.add_allocation(
        "idle2", num_gpu=2, node="n1", gpus=[0, 1], tenant="rnd", start_time=T0 - 86400
    )
    b.add_allocation("busy", num_gpu=1, node="n1", gpus=[2], tenant="rnd", start_time=T0 - 86400)
    b.add_allocation(
        "idle-pinned",
        num_gpu=1,
        node="n1",
        gpus=[3],
        tenant="prod",
        migratable=False,
        start_time=T0 - 86400,
    )
    b.add_allocation(
        "short-idle", num_gpu=1, node="n1", gpus=[4], tenant="rnd", start_time=T0 - 86400
    )
    times = [T0 - STEP * (8 - t) for t in range(9)]  # 4 h of half-hour samples
    util = np.full((9, 8), 0.0, dtype=np.float32)
    util[:, 2] = 0.9
    util[:3, 0:2] = 0.7  # busy until 3 h ago, idle since T0 - 3 h (sample 3)
    util[:7, 4] = 0.5  # idle only since the last sample (0.5 h)
    util[:, 3] = 0.01
    memory = np.full((9, 8), 2**30, dtype=np.float32)
    return b.build(timestamp=T0, usage=(times, util, memory) if history else None)


def test_idle_allocation_is_reclaimed_with_waste() -> None:
    m = model()
    plan = plan_reclaim(m, Policy(), ReclaimSettings(min_idle_s=2 * 3600))
    assert plan.feasible
    assert [a.alloc for a in plan.actions] == ["idle2"]
    action = plan.actions[0]
    assert action.kind == "reclaim" and action.src.gpus == (0, 1)
    idle = {r["alloc"]: r for r in plan.extra["idle"]}
    assert idle["idle2"]["idle_hours"] == pytest.approx(2.5)  # idle since sample 3 = T0 - 2.5 h
    assert idle["idle2"]["gpu_hours"] == pytest.approx(5.0)
    assert idle["idle2"]["energy_kwh"] == pytest.approx(2 * 62.0 * 2.5 / 1000)
    assert "idle-draw table" in action.reason and "GPU-hours" in action.reason
    # not migratable: reported with its waste, never reclaimed
    assert [p["alloc"] for p in plan.extra["protected"]] == ["idle-pinned"]
    assert "short-idle" not in idle and "busy" not in idle
    assert plan.extra["waste"]["allocations"] == 2
    after = apply_plan(m, plan.actions)
    assert after.gpu_is_free[[0, 1]].all()
    assert plan.benefit.shapes_after["2 GPU"] > plan.benefit.shapes_before["2 GPU"]


def test_threshold_window_priority_and_power() -> None:
    m = model()
    assert [a.alloc for a in plan_reclaim(m, None, ReclaimSettings(min_idle_s=1800)).actions] == [
        "idle2",
        "short-idle",
    ]
    assert not plan_reclaim(m, None, ReclaimSettings(min_idle_s=3 * 3600)).actions
    # a higher threshold makes the 1 %-busy pinned GPU idle too, and still protected
    lax = plan_reclaim(m, None, ReclaimSettings(threshold=0.6, min_idle_s=2 * 3600))
    assert "busy" not in [a.alloc for a in lax.actions]
    # observed power overrides the table
    watts = np.full(8, 100.0)
    plan = plan_reclaim(m, None, ReclaimSettings(), power_watts=watts)
    row = next(r for r in plan.extra["idle"] if r["alloc"] == "idle2")
    assert row["power_source"] == "observed power"
    assert row["energy_kwh"] == pytest.approx(200.0 * 2.5 / 1000)
    # work above max_priority is protected
    capped = plan_reclaim(m, None, ReclaimSettings(max_priority=-1))
    assert not capped.actions and len(capped.extra["protected"]) == 2


def test_power_observed_by_the_model_is_used_without_being_passed() -> None:
    plan = plan_reclaim(model(watts=90.0), None, ReclaimSettings(min_idle_s=2 * 3600))
    row = next(r for r in plan.extra["idle"] if r["alloc"] == "idle2")
    assert row["power_source"] == "observed power"
    assert row["energy_kwh"] == pytest.approx(2 * 90.0 * 2.5 / 1000)


def test_without_history_nothing_is_long_idle() -> None:
    plan = plan_reclaim(model(history=False))
    assert plan.feasible and not plan.actions


def test_the_note_says_why_nothing_is_reclaimed() -> None:
    """Without history the reason is the missing history (and how to read one), not that no
    allocation idled long enough; likewise a history shorter than the idle minimum."""
    bare = plan_reclaim(model(history=False)).reason
    assert bare.startswith("the source has no usage history") and "history=24h" in bare
    short = plan_reclaim(model(), None, ReclaimSettings(min_idle_s=5 * 3600)).reason
    assert (
        short.startswith("the usage history covers 4 h, less than the 5 h") and "history=" in short
    )
    capped = plan_reclaim(model(), None, ReclaimSettings(max_priority=-1)).reason
    assert capped.startswith("2 allocation(s) idle at least 2 h under 5%, all protected")
    strict = ReclaimSettings(threshold=0.005, min_idle_s=3 * 3600)  # the pinned one is at 1 %
    assert plan_reclaim(model(), None, strict).reason == (
        "no allocation idle at least 3 h under 0.5% utilization: of 4 placed allocations, the "
        "longest idle is idle2, 2.5 h"
    )


def test_idle_watts_table() -> None:
    assert idle_watts("NVIDIA H100 80GB HBM3")[0] == 72.0
    assert idle_watts("Tesla V100-SXM2-32GB")[0] == 42.0
    assert "unknown" in idle_watts("Mystery GPU")[1]


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
@given(m=clusters(), policy=policies(), minimum=st.sampled_from([1800.0, 7200.0]))
def test_every_reclaim_plan_passes_the_check(m, policy, minimum) -> None:
    plan = plan_reclaim(m, policy, ReclaimSettings(min_idle_s=minimum))
    assert_checked(m, plan, policy)
    for action in plan.actions:
        row = int(np.flatnonzero(m.allocations.id == action.alloc)[0])
        assert m.allocations.migratable[row]


def test_observe_takes_the_most_used_gpu_of_each_allocation() -> None:
    m = model()
    obs = observe(m, window_s=4 * 3600)
    row = {a: i for i, a in enumerate(m.allocations.id.tolist())}
    # idle2 (GPUs 0, 1): 0.7 for 3 samples, then 0: p95 over 9 samples is 0.7, peak 0.7
    assert obs.util_peak[row["idle2"]] == pytest.approx(0.7)
    assert obs.util_p50[row["idle2"]] == pytest.approx(0.0)
    assert obs.samples[row["idle2"]] == 9
    assert obs.memory_total_bytes[row["busy"]] == 80 * 2**30
    assert obs.idle_s[row["busy"]] == 0.0
    # a shorter window sees only the idle tail
    assert observe(m, window_s=3600).util_peak[row["idle2"]] == pytest.approx(0.0)


def test_reclaiming_a_fraction_with_a_limit_says_what_its_gpu_promises_and_is_asked() -> None:
    """The L4 seed's two notebooks share GPU 4 Run:ai-style (0.25 guaranteed / 0.8 limit each)
    and idle: the waste counts the guarantees held; the reason gives the limit and, on the
    shared GPU, what it promises (0.5) and may be asked under contention (1.6) and what is
    left for the other notebook."""
    from pathlib import Path

    from advisor import snapshot

    model = snapshot.load(Path(__file__).resolve().parents[2] / "examples" / "seed-share-l4.json")
    assert model.gpu_limit_allocated[model.gpu_row(0, 4)] == 1600
    plan = plan_reclaim(model)
    assert [a.alloc for a in plan.actions] == ["notebook-1", "notebook-2"]
    first, second = plan.actions
    assert str(first.src) == "l4-node-01[4]@0.25 (limit 0.8)"
    assert "held 0.25 guaranteed (limit 0.8) NVIDIA L4 GPU(s)" in first.reason
    assert "0.5 GPU-hours" in first.reason  # 0.25 GPU x 2 h: the guarantee is what was held
    assert (
        "l4-node-01/gpu4 is shared: it promises 0.5 GPU (guarantees) and may be asked for 1.6 "
        "under contention (limits); without this task the others' guarantees sum to 0.25 GPU"
    ) in first.reason
    assert "all can burst to their limits at once" in first.reason
    assert "is shared" not in second.reason  # the GPU is empty once both are given back
    assert plan.extra["waste"]["gpus"] == 0.5
