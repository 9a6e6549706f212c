"""The simulated fleet: preset layouts, time, determinism, and allocation invariants."""

from __future__ import annotations

import argparse
from collections import Counter

import pytest

from exporter.backends.registry import backend_class
from exporter.backends.sim import SimBackend
from exporter.readings import LINK_TYPES, NodeReading, nvlink_islands
from gpu_defrag_sim import PRESETS, SimFleet, fleet_at, is_working_hours
from gpu_defrag_sim.workload import HOUR, WEEK

GIB = 2**30


def _free(node: NodeReading) -> list[int]:
    held = {a.gpu for a in node.allocations}
    return [g.index for g in node.gpus if g.index not in held]


def test_a100_t0_has_60_free_gpus_but_only_4_whole_free_nodes():
    for seed in (1, 42):
        nodes = fleet_at("a100-16x8", seed, 0.0)
        assert [n.node for n in nodes] == [f"a100-node-{i:02d}" for i in range(1, 17)]
        assert {n.rack for n in nodes} == {"rack-01", "rack-02"}
        assert sum(len(n.gpus) for n in nodes) == 128
        assert sum(len(_free(n)) for n in nodes) == 60
        whole_free = [n.node for n in nodes if len(_free(n)) == 8]
        assert whole_free == [f"a100-node-{i:02d}" for i in range(9, 13)]
        jobs_per_node = [len({a.job for a in n.allocations}) for n in nodes]
        assert all(2 <= count <= 3 for count in jobs_per_node[:8])
        assert all(1 <= count <= 2 for count in jobs_per_node[12:])
        assert len({a.tenant for n in nodes for a in n.allocations}) >= 3


def test_a100_t0_has_allocated_but_idle_gpus_with_and_without_processes():
    nodes = fleet_at("a100-16x8", 42, 0.0)
    idle_with_process, idle_without = 0, 0
    for node in nodes:
        gpus = {g.index: g for g in node.gpus}
        for alloc in node.allocations:
            gpu = gpus[alloc.gpu]
            if gpu.utilization_ratio is not None and gpu.utilization_ratio < 0.05:
                if gpu.processes:
                    idle_with_process += 1
                else:
                    idle_without += 1
                    assert gpu.memory_used_bytes == 0
    assert idle_with_process >= 2
    assert idle_without >= 2


def test_mixed_preset_counts_per_model_and_type_fragmentation():
    fleet = SimFleet("mixed-h100-a100-v100", 42)
    nodes = fleet.readings()
    models = Counter(g.model for n in nodes for g in n.gpus)
    assert models == {
        "NVIDIA H100 80GB HBM3": 32,
        "NVIDIA A100-SXM4-80GB": 64,
        "Tesla V100-SXM2-32GB": 32,
    }
    for node in nodes:
        assert node.pool in {"h100", "a100", "v100", "a100-mig"}
        assert len({g.model for g in node.gpus}) == 1

    held: Counter[str] = Counter()
    size: Counter[str] = Counter()
    small_lazy = 0
    for _ in range(12):  # a simulated day, every 2 hours
        for node in fleet.readings():
            held[node.pool] += len(node.gpus) - len(_free(node))
            size[node.pool] += len(node.gpus)
            if node.pool in {"h100", "a100"}:
                # Barely busy work on a big GPU that would fit a 32 GB V100.
                small_lazy += sum(
                    1
                    for g in node.gpus
                    if g.processes
                    and (g.utilization_ratio or 0) < 0.3
                    and g.memory_used_bytes < 30 * GIB
                )
        fleet.advance(2 * HOUR)
    assert held["h100"] / size["h100"] > 0.6
    assert held["a100"] / size["a100"] > 0.6
    assert held["v100"] / size["v100"] < 0.4
    assert small_lazy > 0


def test_mixed_preset_has_one_mig_node_with_instance_allocations():
    nodes = fleet_at("mixed-h100-a100-v100", 42, 0.0)
    mig_nodes = [n for n in nodes if any(g.mig_enabled for g in n.gpus)]
    assert [n.pool for n in mig_nodes] == ["a100-mig"]
    node = mig_nodes[0]
    profiles = {i.profile for g in node.gpus for i in g.mig_instances}
    assert {"1g.10gb", "3g.40gb"} <= profiles
    for gpu in node.gpus:
        slices = sum(int(i.profile[0]) for i in gpu.mig_instances)
        assert slices <= 7
        assert gpu.utilization_ratio is None
    instance_allocs = [(a.gpu, a.gpu_instance_id) for a in node.allocations]
    assert instance_allocs and all(gi is not None for _, gi in instance_allocs)
    assert len(instance_allocs) == len(set(instance_allocs))
    v100 = next(g for n in nodes if n.pool == "v100" for g in n.gpus)
    assert v100.mig_enabled is None and v100.retired_pages and not v100.remapped_rows


def test_nvlink_islands_preset_has_two_islands_per_node():
    nodes = fleet_at("nvlink-islands", 42, 0.0)
    assert len(nodes) == 4
    for node in nodes:
        islands = nvlink_islands([g.index for g in node.gpus], node.links)
        assert islands == {i: (0 if i < 4 else 4) for i in range(8)}
        assert [g.nvlink_island for g in node.gpus] == [islands[i] for i in range(8)]
        assert [g.numa_node for g in node.gpus] == [0] * 4 + [1] * 4
        cross = {(lk.gpu, lk.peer) for lk in node.links if lk.link_type != "nvlink"}
        assert cross == {(a, b) for a in range(8) for b in range(8) if a // 4 != b // 4}


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_has_full_topology_and_identity(preset: str):
    nodes = fleet_at(preset, 7, 0.0)
    uuids = [g.uuid for n in nodes for g in n.gpus]
    assert len(set(uuids)) == len(uuids) and all(u.startswith("GPU-") for u in uuids)
    for node in nodes:
        assert node.driver_version and node.cuda_version and node.pool and node.rack
        pairs = {(lk.gpu, lk.peer) for lk in node.links}
        count = len(node.gpus)
        assert pairs == {(a, b) for a in range(count) for b in range(count) if a != b}
        assert all(lk.link_type in LINK_TYPES for lk in node.links)
        assert all((lk.nvlink_count > 0) == (lk.link_type == "nvlink") for lk in node.links)
        for gpu in node.gpus:
            assert gpu.numa_node in (0, 1) and gpu.cpu_affinity
            assert 0 < gpu.power_watts <= gpu.power_limit_watts
            assert 20 < gpu.temperature_celsius < 95
            assert 0 <= gpu.memory_used_bytes <= gpu.memory_total_bytes
            assert gpu.energy_joules > 0


def test_health_paths_have_data():
    fleet = SimFleet("a100-16x8", 42)
    nodes = fleet.readings()
    gpus = [g for n in nodes for g in n.gpus]
    assert sum(1 for g in gpus if g.xid_errors) >= 1
    assert all(g.xid_last_timestamp_seconds is not None for g in gpus if g.xid_errors)
    ecc = [g for g in gpus if g.ecc_errors.get("corrected", 0) > 0]
    assert len(ecc) == 1
    before = ecc[0].ecc_errors["corrected"]
    fleet.advance(24 * HOUR)
    after = next(g for n in fleet.readings() for g in n.gpus if g.uuid == ecc[0].uuid)
    assert after.ecc_errors["corrected"] > before


def test_time_changes_allocations_utilization_and_energy():
    fleet = SimFleet("a100-16x8", 42)
    first = fleet.readings()
    fleet.advance(6 * HOUR)
    later = fleet.readings()
    jobs_then = {a.job for n in first for a in n.allocations}
    jobs_now = {a.job for n in later for a in n.allocations}
    assert jobs_then != jobs_now
    util_then = [g.utilization_ratio for n in first for g in n.gpus]
    util_now = [g.utilization_ratio for n in later for g in n.gpus]
    assert util_then != util_now
    for a, b in zip(first, later, strict=True):
        for g0, g1 in zip(a.gpus, b.gpus, strict=True):
            assert g1.energy_joules - g0.energy_joules >= g0.power_limit_watts * 0.1 * 6 * HOUR


def test_arrivals_follow_a_daily_rhythm_over_a_week():
    fleet = SimFleet("a100-16x8", 3)
    fleet.advance(WEEK)
    day = sum(1 for at, _, _ in fleet.arrival_log if is_working_hours(at))
    night = sum(1 for at, _, _ in fleet.arrival_log if not is_working_hours(at))
    # Working hours are 45 of the week's 168 hours.
    day_rate, night_rate = day / 45, night / (168 - 45)
    assert day_rate > 2 * night_rate
    sizes = Counter(gpus for _, _, gpus in fleet.arrival_log)
    assert sizes[0.5] and sizes[1] and sizes[8] and sum(sizes.values()) > 100


def test_same_seed_same_fleet_and_stepping_does_not_matter():
    assert fleet_at("mixed-h100-a100-v100", 5, 2 * HOUR) == fleet_at(
        "mixed-h100-a100-v100", 5, 2 * HOUR
    )
    stepped = SimFleet("a100-16x8", 9)
    for step in (1.0, 299.0, 17.5, 1234.0, 3600.0, 2000.5, 45.0):
        stepped.advance(step)
    assert stepped.readings() == fleet_at("a100-16x8", 9, stepped.now)
    other = fleet_at("a100-16x8", 10, 0.0)
    assert other[0].gpus[0].uuid != fleet_at("a100-16x8", 9, 0.0)[0].gpus[0].uuid


@pytest.mark.parametrize("preset", ["a100-16x8", "mixed-h100-a100-v100"])
def test_jobs_running_at_t0_started_before_it_so_their_ends_teach_whole_durations(preset: str):
    """A fleet observed from t = 0 (a `sim:` history) learns a job's duration as end - start;
    with every start at 0 it learned the remaining time of the jobs already running."""
    jobs = SimFleet(preset, 42).running_jobs()
    assert jobs and all(job.start <= 0.0 < job.end for job in jobs)
    assert sum(job.start < 0.0 for job in jobs) >= 0.75 * len(jobs)  # short ones: start at 0
    whole = sorted(job.end - job.start for job in jobs)
    remaining = sorted(job.end for job in jobs)
    assert whole[len(jobs) // 2] > remaining[len(jobs) // 2]


@pytest.mark.parametrize("preset", PRESETS)
def test_allocations_reference_gpus_and_never_oversubscribe(preset: str):
    fleet = SimFleet(preset, 11)
    for _ in range(4):
        fleet.advance(5 * HOUR)
        nodes = fleet.readings()
        share = Counter()
        for job in fleet.running_jobs():
            for gpu, _slot in job.placement:
                share[gpu] += min(1.0, job.gpus)
        assert all(total <= 1.0 + 1e-9 for total in share.values())
        for node in nodes:
            indices = {g.index for g in node.gpus}
            held = Counter(a.gpu for a in node.allocations if a.gpu_instance_id is None)
            assert set(held) <= indices
            for gpu in node.gpus:
                pods = {a.pod for a in node.allocations if a.gpu == gpu.index}
                assert all(p.pod in pods for p in gpu.processes)
                assert held[gpu.index] <= 4


def test_backend_flags_and_collect_advance_with_speed():
    parser = argparse.ArgumentParser()
    cls = backend_class("sim")
    assert cls is SimBackend
    cls.add_arguments(parser)
    args = parser.parse_args(
        ["--sim.preset", "nvlink-islands", "--sim.speed", "60", "--sim.nodes", "2"]
    )
    backend = SimBackend.from_args(args)
    now = [1000.0]
    backend._clock = lambda: now[0]
    backend.start()
    first = backend.collect()
    assert len(first.nodes) == 2 and backend.fleet.now == 0.0
    now[0] += 10.0
    second = backend.collect()
    assert backend.fleet.now == pytest.approx(600.0)
    assert second.timestamp == 1010.0
    for node in second.nodes:
        for gpu in node.gpus:
            if gpu.xid_last_timestamp_seconds is not None:
                assert gpu.xid_last_timestamp_seconds <= 1010.0
    with pytest.raises(SystemExit):
        parser.parse_args(["--sim.preset", "nope"])


def test_a_fleet_started_later_has_a_past_and_says_where_its_clock_stands():
    parser = argparse.ArgumentParser()
    SimBackend.add_arguments(parser)
    args = parser.parse_args(["--sim.speed", "60", "--sim.nodes", "2", "--sim.start", "7d"])
    backend = SimBackend.from_args(args)
    now = [1000.0]
    backend._clock = lambda: now[0]
    backend.start()
    first = backend.collect()
    assert backend.fleet.now == 7 * 86400.0
    assert first.sim.time_s == 7 * 86400.0 and first.sim.epoch == 1000.0 - 7 * 86400.0
    assert (first.sim.preset, first.sim.seed, first.sim.nodes) == ("a100-16x8", 42, 2)
    now[0] += 10.0
    second = backend.collect()
    assert second.sim.time_s == pytest.approx(7 * 86400.0 + 600.0)  # 60x the 10 s
    assert second.sim.epoch == first.sim.epoch and second.timestamp == 1010.0
    # the same fleet re-simulated to that time is what the page showed: the past is readable
    again = SimFleet("a100-16x8", 42, 2)
    again.advance(second.sim.time_s)
    shown = [(n.node, n.allocations) for n in second.nodes]
    assert shown == [(n.node, n.allocations) for n in again.readings()]
    assert any(n.allocations for n in second.nodes)
    with pytest.raises(ValueError, match=r"--sim\.start must not be negative"):
        SimBackend(start_s=-1.0)


def test_thousand_node_fleet_collects_every_gpu():
    """Scale only; its collect time is measured in bench/exporter.py (sim-1000)."""
    backend = SimBackend(nodes=1000)
    backend.collect()
    backend.fleet.advance(900.0)
    nodes = backend.collect().nodes
    assert len(nodes) == 1000 and sum(len(n.gpus) for n in nodes) == 8000


def test_a_moment_without_any_process_reads_as_idle_gpus():
    """A small fleet can have no process running at all (16 days of 2 nodes found one); numpy's
    bincount then returns integers, which must not break the utilization sum."""
    fleet = SimFleet("a100-16x8", 42, 2)
    fleet.slot_proc[:] = False
    slot_util, util, power = fleet.activity_at(3600.0)
    assert util.dtype == float and (util == 0).all() and (slot_util == 0).all()
    assert (power >= fleet.idle_power).all()
    assert len(fleet.readings()) == 2
