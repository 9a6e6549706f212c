"""Sharing and right-sizing: MIG profiles, fractions, bin packing, the 16 GB seed case."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from advisor import snapshot
from advisor.fragmentation import measures
from advisor.model import ModelBuilder
from advisor.planner.check import apply_plan, check_plan
from advisor.planner.constraints import Policy
from advisor.planner.mig_profiles import milli_of, profiles_for, smallest_profile
from advisor.planner.share import Item, ShareSettings, pack, plan_share, rightsize
from tests.advisor._recommend_clusters import assert_checked, clusters, policies

SEED = Path(__file__).resolve().parents[2] / "examples" / "seed-share-16gb.json"
GIB = 2**30


def test_three_tasks_fit_two_gpus_not_three() -> None:
    bins = pack([Item("a", (300,)), Item("b", (500,)), Item("c", (400,))], (1000,))
    assert len(bins) == 2
    assert sorted(sorted(b) for b in bins) == [[0], [1, 2]]  # 0.5 + 0.4 share, 0.3 alone


def test_pack_two_dimensions_and_home() -> None:
    # compute fits (3+3 <= 7) but memory does not (4+6 > 8): two bins
    assert len(pack([Item("a", (3, 4)), Item("b", (3, 6))], (7, 8))) == 2
    # an item prefers the bin of its own node when both fit
    bins = pack([Item("a", (6,), "n1"), Item("b", (6,), "n2"), Item("c", (4,), "n2")], (10,))
    assert [1, 2] in [sorted(b) for b in bins]


def test_mig_profiles_per_model() -> None:
    a100 = [p.name for p in profiles_for("NVIDIA A100-SXM4-80GB")]
    assert a100 == ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]
    assert profiles_for("NVIDIA A100-SXM4-40GB")[0].name == "1g.5gb"
    assert profiles_for("NVIDIA A100 PCIe", 80 * GIB)[0].name == "1g.10gb"
    assert profiles_for("NVIDIA H100 80GB HBM3")[-1].name == "7g.80gb"
    assert profiles_for("NVIDIA H100 NVL")[0].name == "1g.12gb"
    assert profiles_for("NVIDIA H200")[0].name == "1g.18gb"
    assert [p.name for p in profiles_for("NVIDIA A30")] == ["1g.6gb", "2g.12gb", "4g.24gb"]
    assert profiles_for("Tesla V100-SXM2-32GB") == ()
    h100 = "NVIDIA H100 80GB HBM3"
    assert smallest_profile(h100, 80 * GIB, 0.1, 8 * GIB).name == "1g.10gb"
    assert smallest_profile(h100, 80 * GIB, 0.1, 15 * GIB).name == "1g.20gb"
    assert smallest_profile(h100, 80 * GIB, 0.3, 15 * GIB).name == "3g.40gb"  # 2/7 < 0.3
    assert smallest_profile(h100, 80 * GIB, 0.9, 90 * GIB) is None
    seven = [milli_of(p) for p in profiles_for(h100) if p.compute_slices == 1][:1] * 7
    assert sum(seven) <= 1000


def test_seed_16gb_packs_more_jobs_and_reports_stranded_memory() -> None:
    model = snapshot.load(SEED)
    plan = plan_share(model)
    assert plan.feasible and len(plan.actions) == 8
    assert check_plan(model, plan.actions, Policy()).ok
    # each shared GPU holds one ~12 GB job and one small job, within 16 GB and 1000 milli
    for gpu in plan.extra["shared_gpus"]:
        assert len(gpu["allocs"]) == 2 and gpu["milli"] <= 1000
        assert sum(a.startswith("train") for a in gpu["allocs"]) == 1
    assert plan.extra["gpus_freed"] == 4
    memory = plan.extra["stranded_memory"]
    assert memory["before_bytes"] == pytest.approx(71.5 * GIB, rel=1e-3)
    assert memory["after_bytes"] == pytest.approx(7.5 * GIB, rel=1e-3)
    one = measures.parse_shape("1")
    after = apply_plan(model, plan.actions)
    assert measures.jobs_that_fit(model, one) == 0
    assert measures.jobs_that_fit(after, one) == 4  # the four waiting jobs can start
    sizing = {r["alloc"]: r for r in plan.extra["rightsizing"]}
    assert sizing["train-a"]["guaranteed"] == 0.75 and sizing["notebook-d"]["guaranteed"] == 0.15
    assert sizing["notebook-a"]["limit"] >= sizing["notebook-a"]["guaranteed"]
    assert sizing["train-a"]["mig_profile"] is None  # V100: fractions, not MIG


def _a100(jobs, migratable=True):
    b = ModelBuilder()
    b.add_node("n1", gpu_model="NVIDIA A100-SXM4-80GB")
    for i in range(len(jobs)):
        b.add_gpu("n1", i, memory_total_bytes=80 * GIB)
    for i, _ in enumerate(jobs):
        b.add_allocation(f"j{i}", num_gpu=1, node="n1", gpus=[i], migratable=migratable or i > 0)
    times = [0.0, 600.0, 1200.0, 1800.0]
    util = np.array([[u for u, _ in jobs]] * 4, dtype=np.float32)
    mem = np.array([[g * GIB for _, g in jobs]] * 4, dtype=np.float32)
    return b.build(timestamp=1800.0, usage=(times, util, mem))


def test_mig_sizing_and_packing_on_a100() -> None:
    # 0.1 + 0.25 + 0.3 of compute with small memory: 1g + 2g + 3g fit one GPU (6 of 7 slices)
    model = _a100([(0.1, 5.0), (0.25, 15.0), (0.3, 30.0), (0.95, 70.0)])
    plan = plan_share(model)
    sizing = {r["alloc"]: r for r in plan.extra["rightsizing"]}
    assert sizing["j0"]["mig_profile"] == "1g.10gb"
    assert sizing["j1"]["mig_profile"] == "2g.20gb"
    assert sizing["j2"]["mig_profile"] == "3g.40gb"
    assert sizing["j3"]["mig_profile"] == "7g.80gb" and not sizing["j3"]["fits_fraction"]
    assert plan.extra["gpus_freed"] == 2
    assert "j3" not in {a.alloc for a in plan.actions}
    assert check_plan(model, plan.actions, Policy()).ok
    # without MIG the same tasks get fractions
    fractions = rightsize(model, ShareSettings(use_mig=False))
    assert all(r["mig_profile"] is None for r in fractions)


def test_not_migratable_and_too_few_samples_are_left_alone() -> None:
    model = _a100([(0.1, 5.0), (0.1, 5.0)], migratable=False)
    plan = plan_share(model)
    assert not plan.actions  # j0 may not move, so j1 has no one to share with
    assert plan.extra["rightsizing"]  # but its sizing is still reported
    assert not rightsize(model, ShareSettings(min_samples=10))


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
@given(m=clusters(), policy=policies())
def test_every_share_plan_passes_the_check(m, policy) -> None:
    plan = plan_share(m, policy)
    assert_checked(m, plan, policy)
    if plan.actions:
        after = apply_plan(m, plan.actions)
        assert (after.gpu_milli_allocated <= 1000).all()
        assert after.gpu_is_free.sum() >= m.gpu_is_free.sum()
