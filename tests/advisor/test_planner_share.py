"""Sharing and right-sizing: MIG profiles, fractions, bin packing, the 16 GB seed case."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from advisor import snapshot
from advisor.fragmentation import measures
from advisor.model import MILLI, ModelBuilder
from advisor.planner.actions import Action, GpuSet
from advisor.planner.check import apply_plan, check_plan
from advisor.planner.constraints import Policy
from advisor.planner.mig_profiles import milli_of, profiles_for, smallest_profile
from advisor.planner.share import Item, ShareSettings, pack, plan_share, rightsize
from tests.advisor._recommend_clusters import assert_checked, clusters, policies
from tests.conftest import add_nodes

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
    # the fractional route names no MIG profile and switches nothing
    assert plan.extra["mig_switches"] == [] and not plan.reason
    assert all("mig_profile" not in a.to_dict()["to"] for a in plan.actions)
    assert all(a.dst.mig_profile is None and "MIG" not in a.reason for a in plan.actions)


def _a100(jobs, migratable=True, spare=0):
    """Node n1 (A100 80 GB): task j{i} alone on GPU i with usage (util, GiB) jobs[i], then
    `spare` GPUs holding nothing; four samples of history."""
    b = add_nodes(
        ["n1"], len(jobs) + spare, gpu_model="NVIDIA A100-SXM4-80GB", memory_total_bytes=80 * GIB
    )
    for i, _ in enumerate(jobs):
        b.add_allocation(f"j{i}", num_gpu=1, node="n1", gpus=[i], migratable=migratable or i > 0)
    times = [0.0, 600.0, 1200.0, 1800.0]
    util = np.array([[u for u, _ in jobs] + [0.0] * spare] * 4, dtype=np.float32)
    mem = np.array([[g * GIB for _, g in jobs] + [0.0] * spare] * 4, dtype=np.float32)
    return b.build(timestamp=1800.0, usage=(times, util, mem))


SMALL_THREE = [(0.1, 5.0), (0.1, 5.0), (0.25, 15.0)]  # 1g.10gb, 1g.10gb, 2g.20gb


def test_a_mig_share_switches_its_anchor_gpu_to_mig_mode() -> None:
    """Three small A100 tasks fit one GPU as 2g.20gb + 1g.10gb + 1g.10gb: the plan says the
    anchor's GPU switches to MIG mode (idle: its one task stops for the resize), the checker
    passes it, and the model after it has that GPU in MIG mode carving just those instances."""
    model = _a100(SMALL_THREE)
    plan = plan_share(model)
    assert [a.alloc for a in plan.actions] == ["j2", "j0", "j1"]
    anchor, *movers = plan.actions
    assert anchor.src == GpuSet("n1", (2,)) and anchor.dst == GpuSet("n1", (2,), 285, "2g.20gb")
    assert anchor.reason.startswith(
        "switch n1/gpu2 to MIG mode (the GPU must be idle: its one task, j2, stops for this "
        "resize) and carve 2g.20gb + 1g.10gb + 1g.10gb; j2 used p95 25%"
    )
    for mover in movers:
        assert mover.dst == GpuSet("n1", (2,), 142, "1g.10gb")
        assert "moves into a MIG 1g.10gb instance of n1/gpu2 (switched to MIG mode at step 1)" in (
            mover.reason
        )
        assert not mover.reason.startswith("switch")
    assert plan.extra["mig_switches"] == [
        {
            "node": "n1",
            "gpu": 2,
            "gpu_model": "NVIDIA A100-SXM4-80GB",
            "step": 1,
            "profiles": ["2g.20gb", "1g.10gb", "1g.10gb"],
            "allocs": ["j2", "j0", "j1"],
            "carved_milli": 569,
        }
    ]
    assert plan.reason.startswith("1 GPU(s) switch to MIG mode")
    assert check_plan(model, plan.actions, Policy()).ok
    after = apply_plan(model, plan.actions)
    gpu2 = after.gpu_row(0, 2)
    assert after.gpus.mig_enabled.tolist() == [False, False, True]
    assert int(after.gpus.carved_milli[gpu2]) == 569 == int(after.gpu_milli_allocated[gpu2])
    assert int(after.gpu_free_milli[gpu2]) == 0 and not after.gpu_is_free[gpu2]
    assert after.gpu_is_free.tolist() == [True, True, False]
    # the uncarved 3 slices are no room: two whole GPUs are given back, nothing more
    assert plan.extra["gpus_freed"] == 2 and plan.extra["gpu_share_freed"] == 2.0
    assert plan.after["free_gpus"] == 2
    # the JSON form names the profile on the target, and reads back
    doc = anchor.to_dict()
    assert doc["to"] == {"node": "n1", "gpus": [2], "milli": 285, "mig_profile": "2g.20gb"}
    assert Action.from_dict(doc) == anchor
    assert str(anchor.dst) == "n1[2]@MIG 2g.20gb"


def _share(alloc, src_gpu, dst_gpu, milli, profile=None, node="n1"):
    return Action(
        "share",
        alloc=alloc,
        src=GpuSet(node, (src_gpu,)),
        dst=GpuSet(node, (dst_gpu,), milli, profile),
    )


def test_a_mig_step_onto_a_gpu_that_holds_other_work_is_refused() -> None:
    model = _a100(SMALL_THREE)
    # j0 into a 1g.10gb instance of GPU 2 before j2, its one task, has been resized there
    early = _share("j0", 0, 2, 142, "1g.10gb")
    result = check_plan(model, [early], Policy())
    assert not result.ok and result.violation.step == 1
    assert result.violation.reason == (
        "n1/gpu2 holds other work at this step (1000 milli): switching it to MIG mode for a "
        "1g.10gb instance of 'j0' needs it idle"
    )
    # the plan's own order (anchor first) passes
    plan = plan_share(model)
    assert check_plan(model, plan.actions, Policy()).ok
    # a fractional share on GPU 1 still holds it: no switch under it either
    fraction = _share("j1", 1, 1, 300)
    switch = _share("j0", 0, 1, 142, "1g.10gb")
    reason = check_plan(model, [fraction, switch], Policy()).violation.reason
    assert reason.startswith("n1/gpu1 holds other work at this step (300 milli)")


def test_a_switched_gpu_takes_only_mig_instances_that_fit() -> None:
    model = _a100([*SMALL_THREE, (0.1, 5.0)], spare=1)  # j3 on GPU 3, GPU 4 holds nothing
    plan = list(_a100_switch_plan())
    assert check_plan(model, plan, Policy()).ok
    # plain work may not enter it: a time-sliced fraction, or a whole GPU
    fraction = _share("j3", 3, 2, 300)
    result = check_plan(model, [*plan, fraction], Policy())
    assert result.violation.step == 4
    assert result.violation.reason == (
        "n1/gpu2 is in MIG mode (switched at step 1); 'j3' takes a plain GPU share, no MIG profile"
    )
    whole = Action("migrate", alloc="j3", src=GpuSet("n1", (3,)), dst=GpuSet("n1", (2,)))
    reason = check_plan(model, [*plan, whole], Policy()).violation.reason
    assert reason == "n1/gpu2 is in MIG mode (switched at step 1); 'j3' takes whole GPUs"
    hold = Action("reserve", alloc="r", dst=GpuSet("n1", (2,)))
    assert "is in MIG mode" in check_plan(model, [*plan, hold], Policy()).violation.reason
    # a MIG instance that fits the slices left (2+1+1 of 7 compute, 2+1+1 of 8 memory) enters
    assert check_plan(model, [*plan, _share("j3", 3, 2, 428, "3g.40gb")], Policy()).ok
    too_big = _share("j3", 3, 2, 571, "4g.40gb")  # 4 + 4 > 7 compute slices
    reason = check_plan(model, [*plan, too_big], Policy()).violation.reason
    assert reason == (
        "n1/gpu2 in MIG mode has 2g.20gb + 1g.10gb + 1g.10gb carved; 4g.40gb beside them "
        "needs 8/7 compute and 8/8 memory slices"
    )
    # the capacity a MIG step needs is its profile's, on a profile the GPU model has
    wrong = _share("j3", 3, 4, 300, "1g.10gb")
    reason = check_plan(model, [*plan, wrong], Policy()).violation.reason
    assert reason == "MIG 1g.10gb is 142 milli of a GPU; the step says 300"
    unknown = _share("j3", 3, 4, 142, "1g.12gb")
    reason = check_plan(model, [*plan, unknown], Policy()).violation.reason
    assert reason == "n1/gpu4 (NVIDIA A100-SXM4-80GB) has no MIG profile 1g.12gb"
    # a task in a MIG instance may not go back to a plain GPU without a profile
    back = _share("j0", 2, 4, 142)
    reason = check_plan(model, [*plan, back], Policy()).violation.reason
    assert reason == "n1/gpu4 is not in MIG mode; 'j0' runs in MIG instances"
    # an instance leaves with its task: the slices it held are room again
    leave = _share("j0", 2, 4, 142, "1g.10gb")  # switches GPU 4, idle, for j0
    after_leave = [*plan, leave, _share("j3", 3, 2, 428, "3g.40gb")]
    assert check_plan(model, after_leave, Policy()).ok
    after = apply_plan(model, after_leave)
    assert after.gpus.carved_milli[[2, 4]].tolist() == [285 + 142 + 428, 142]
    assert after.gpus.mig_enabled.tolist() == [False, False, True, False, True]


def _a100_switch_plan():
    yield _share("j2", 2, 2, 285, "2g.20gb")
    yield _share("j0", 0, 2, 142, "1g.10gb")
    yield _share("j1", 1, 2, 142, "1g.10gb")


def test_a_mig_profile_only_on_share_steps() -> None:
    model = _a100(SMALL_THREE, spare=1)
    move = Action(
        "migrate", alloc="j0", src=GpuSet("n1", (0,)), dst=GpuSet("n1", (3,), MILLI, "7g.80gb")
    )
    reason = check_plan(model, [move], Policy()).violation.reason
    assert reason == "only a share step may name a MIG profile, not a migrate"


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
        assert (after.gpu_milli_allocated <= after.gpus.carved_milli).all()
        assert after.gpu_is_free.sum() >= m.gpu_is_free.sum()
        switched = after.gpus.mig_enabled & ~m.gpus.mig_enabled
        assert int(switched.sum()) == len(plan.extra["mig_switches"])
        for switch in plan.extra["mig_switches"]:
            row = after.gpu_row(after.node_index(switch["node"]), switch["gpu"])
            assert switched[row] and after.gpus.carved_milli[row] == switch["carved_milli"]
            assert after.gpu_free_milli[row] == 0
            anchor = plan.actions[switch["step"] - 1]
            assert anchor.alloc == switch["allocs"][0] and anchor.reason.startswith("switch")


L4_SEED = SEED.with_name("seed-share-l4.json")


def test_share_sizes_on_the_step_stay_on_it_from_a_float32_history() -> None:
    """The L4 seed's tasks run at a steady 40, 30, 30 and 20 %, held in the snapshot's float32
    history (0.4 is 0.4000000059604645 there): each is sized exactly on its step, guaranteed
    0.4 / limit 0.5 (1.25 x 0.4), 0.3 / 0.4 (1.25 x 0.3 = 0.375, up to 0.4), 0.2 / 0.25, not a
    step above (it was 0.45 / 0.55 and 0.35)."""
    model = snapshot.load(L4_SEED)
    assert model.usage.utilization_ratio.dtype == np.float32
    assert float(model.usage.utilization_ratio[0, 0]) != 0.4  # the float32 on its own
    sizes = {
        r["alloc"]: (r["util_p95"], r["guaranteed"], r["limit"], r["milli"])
        for r in rightsize(model)
    }
    assert sizes == {
        "infer-a": (0.4, 0.4, 0.5, 400),
        "infer-b": (0.3, 0.3, 0.4, 300),
        "infer-c": (0.3, 0.3, 0.4, 300),
        "infer-d": (0.2, 0.2, 0.25, 200),
    }
    plan = plan_share(model)
    # 0.4 + 0.3 + 0.3 fill one GPU exactly; a step too far each would have needed two
    assert plan.extra["shared_gpus"][0]["allocs"] == ["infer-a", "infer-b", "infer-c"]
    assert plan.extra["shared_gpus"][0]["milli"] == 1000
    assert plan.extra["gpus_freed"] == 2


def test_a_share_target_carries_its_limit_and_says_what_the_limits_mean() -> None:
    """Guarantees pack the GPU (they are what it can promise); the limits ride along on each
    target, the model after the plan holds them, and the shared GPU says what their sum
    means."""
    model = snapshot.load(L4_SEED)
    plan = plan_share(model)
    targets = {a.alloc: a.dst for a in plan.actions}
    assert {k: (d.milli, d.limit_milli) for k, d in targets.items()} == {
        "infer-a": (400, 500),
        "infer-b": (300, 400),
        "infer-c": (300, 400),
    }
    gpu = plan.extra["shared_gpus"][0]
    assert (gpu["milli"], gpu["limit_milli"]) == (1000, 1300)
    assert gpu["meaning"].startswith("guarantees sum to 1 GPU (each task always gets its own), ")
    assert "limits to 1.3 GPU: the guarantees fill the GPU" in gpu["meaning"]
    assert all(gpu["meaning"] in a.reason for a in plan.actions)
    after = apply_plan(model, plan.actions)
    rows = {a: i for i, a in enumerate(after.allocations.id.tolist())}
    assert after.allocations.gpu_limit_milli[rows["infer-a"]] == 500
    zero = after.gpu_row(0, 0)
    assert (after.gpu_milli_allocated[zero], after.gpu_limit_allocated[zero]) == (1000, 1300)
    doc = plan.to_dict()["actions"][0]["to"]
    assert doc == {"node": "l4-node-01", "gpus": [0], "milli": 400, "limit_milli": 500}
    assert GpuSet.from_dict(doc) == targets["infer-a"]
    assert str(targets["infer-a"]) == "l4-node-01[0]@0.4 (limit 0.5)"


def test_limits_above_one_gpu_are_overcommit_and_say_so() -> None:
    from advisor.planner.share import contention_text

    assert contention_text(500, 1600) == (
        "guarantees sum to 0.5 GPU (each task always gets its own), limits to 1.6 GPU, 0.6 GPU "
        "more than the GPU has: when all burst at once they share the 0.5 GPU above the "
        "guarantees"
    )
    assert contention_text(250, 800).endswith("all can burst to their limits at once")


def test_the_limit_of_a_mig_instance_is_its_slices() -> None:
    builder = ModelBuilder()
    builder.add_node("n", gpu_model="NVIDIA A100-SXM4-80GB")
    builder.add_gpu("n", 0, mig_enabled=True, memory_total_bytes=80 * GIB)
    builder.add_gpu("n", 1, memory_total_bytes=80 * GIB)
    builder.add_allocation("mig", num_gpu=1, gpu_milli=285, gpu_limit_milli=800, node="n", gpus=[0])
    builder.add_allocation(
        "frac", num_gpu=1, gpu_milli=250, gpu_limit_milli=800, node="n", gpus=[1]
    )
    builder.add_allocation("plain", num_gpu=1, gpu_milli=250, node="n", gpus=[1])
    model = builder.build()
    assert model.gpu_limit_allocated.tolist() == [285, 1050]
    assert model.gpu_milli_allocated.tolist() == [285, 500]
