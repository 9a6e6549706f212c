"""The NVML backend against a faithful pynvml fake (real constants, structs and errors)."""

from __future__ import annotations

import argparse
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator

import pynvml
import pytest

from exporter.attribution.base import Owner
from exporter.backends.base import BackendUnavailable
from exporter.backends.nvml import NvmlBackend
from exporter.backends.nvml_device import cpu_list
from exporter.backends.nvml_pcie import PcieSampler
from exporter.backends.registry import backend_class
from exporter.readings import Allocation, Collection
from tests.exporter.nvml_backends import (
    NVLINK_WALK,
    Factory,
    backends,
    gpus_of,
    has,
    nvml_lines,
)
from tests.fakes.fake_pynvml import (
    MIB,
    FakeGpu,
    FakeLink,
    FakeMig,
    FakeNvml,
    FakeProcess,
    bus_id_of,
    hgx_h100,
    two_islands,
)


@pytest.fixture
def make_backend() -> Iterator[Factory]:
    with backends() as make:
        yield make


# ----- topology ------------------------------------------------------------------------------


def test_hgx_h100_is_one_nvlink_island_with_18_links_between_every_pair(make_backend):
    fake = hgx_h100()
    node = make_backend(fake).collect().nodes[0]

    assert node.node == "node-a"
    assert (node.driver_version, node.cuda_version) == ("550.54.15", "12.4")
    assert len(node.gpus) == 8
    pairs = {(link.gpu, link.peer): link for link in node.links}
    assert len(pairs) == 8 * 7  # every ordered pair, once
    assert {link.link_type for link in node.links} == {"nvlink"}
    assert {link.nvlink_count for link in node.links} == {18}
    assert {gpu.nvlink_island for gpu in node.gpus} == {0}

    first, last = node.gpus[0], node.gpus[7]
    assert first.model == "NVIDIA H100 80GB HBM3"
    assert first.uuid == fake.gpus[0].uuid and first.pci_bus_id == "00000000:18:00.0"
    assert first.serial == fake.gpus[0].serial and first.vbios_version == "96.00.99.00.01"
    numa = has("nvmlDeviceGetNumaNodeId")  # from nvidia-ml-py 12.550 on; else not supported
    assert (first.numa_node, first.cpu_affinity) == (0 if numa else None, "0-31,64-95")
    assert (last.numa_node, last.cpu_affinity) == (1 if numa else None, "32-63,96-127")


def test_two_islands_joined_by_pcie(make_backend):
    node = make_backend(two_islands(links_per_peer=4)).collect().nodes[0]

    pairs = {(link.gpu, link.peer): link for link in node.links}
    assert pairs[(0, 3)].link_type == "nvlink" and pairs[(0, 3)].nvlink_count == 4
    assert pairs[(5, 6)].link_type == "nvlink" and pairs[(6, 5)].nvlink_count == 4
    assert pairs[(0, 4)].link_type == "cross_socket" and pairs[(0, 4)].nvlink_count == 0
    assert pairs[(3, 7)].link_type == "cross_socket"
    assert {g.index: g.nvlink_island for g in node.gpus} == {
        0: 0, 1: 0, 2: 0, 3: 0, 4: 4, 5: 4, 6: 4, 7: 4
    }  # fmt: skip


def test_pcie_only_node_gets_common_ancestor_levels(make_backend):
    gpus = [
        FakeGpu(index=i, name="NVIDIA L40S", bus=0x10 + i, socket=i // 2, pcie_switch=i)
        for i in range(4)
    ]
    gpus[1].pcie_switch = 0  # GPUs 0 and 1 behind one PCIe switch
    fake = FakeNvml(gpus)
    node = make_backend(fake).collect().nodes[0]

    kinds = {(link.gpu, link.peer): link.link_type for link in node.links}
    assert kinds[(0, 1)] == "pcie_switch"
    assert kinds[(2, 3)] == "numa_node"
    assert kinds[(0, 2)] == kinds[(3, 1)] == "cross_socket"
    assert [g.nvlink_island for g in node.gpus] == [0, 1, 2, 3]
    # No NVLink at all: one probe per GPU, not 36.
    assert fake.calls[("nvmlDeviceGetNvLinkState", 0)] == 1


@pytest.mark.parametrize(
    "remote_type",
    [
        pynvml.NVML_NVLINK_DEVICE_TYPE_IBMNPU,  # NVLink to a POWER9 CPU
        pynvml.NVML_NVLINK_DEVICE_TYPE_GPU,  # a GPU this process cannot see
        pynvml.NVML_NVLINK_DEVICE_TYPE_UNKNOWN,
    ],
)
def test_only_nvswitch_ports_count_as_switch_fabric(make_backend, remote_type):
    gpus = [
        FakeGpu(index=i, name="Tesla V100-SXM2-16GB", bus=0x04 + i, pcie_switch=i) for i in range(2)
    ]
    for gpu in gpus:  # no link between the two; three each to something that is no switch
        gpu.links = [FakeLink(bus_id_of(0x80), remote_type=remote_type) for _ in range(3)]
    fake = FakeNvml(gpus)
    fake.p2p_nvlink[(0, 1)] = fake.p2p_nvlink[(1, 0)] = pynvml.NVML_P2P_STATUS_OK
    node = make_backend(fake).collect().nodes[0]

    pairs = {(link.gpu, link.peer): link for link in node.links}
    assert pairs[(0, 1)].link_type == "numa_node" and pairs[(0, 1)].nvlink_count == 0
    assert [g.nvlink_island for g in node.gpus] == [0, 1]  # not one NVLink island


def test_topology_is_read_at_start_and_then_only_every_interval(make_backend):
    now = [1000.0]
    fake = hgx_h100(2)
    backend = make_backend(fake, topology_interval=600.0, clock=lambda: now[0])
    backend.collect()
    probes = fake.calls[("nvmlDeviceGetTopologyCommonAncestor", 0)]
    backend.collect()
    now[0] += 601
    backend.collect()

    state_calls = fake.calls[("nvmlDeviceGetNvLinkState", 0)]
    assert state_calls == 2 * NVLINK_WALK  # at start and later
    assert fake.calls[("nvmlDeviceGetTopologyCommonAncestor", 0)] == probes


# ----- errors and lost GPUs ------------------------------------------------------------------


def test_gpu_falling_off_the_bus_costs_that_gpu_only(make_backend):
    fake = hgx_h100()
    fake.gpus[3].power_mw = 300_000
    backend = make_backend(fake)

    first = backend.collect()
    assert not gpus_of(first)[3].lost and gpus_of(first)[3].power_watts == 300.0
    assert not first.errors

    fake.gpus[3].lost = True
    second = backend.collect()
    lost = gpus_of(second)[3]
    assert lost.lost and not lost.healthy
    assert lost.power_watts is None and lost.memory_used_bytes is None
    assert lost.uuid == fake.gpus[3].uuid  # identity stays, so the series can say "lost"
    before = gpus_of(first)[3]
    assert before.cpu_affinity
    assert (lost.numa_node, lost.cpu_affinity) == (before.numa_node, before.cpu_affinity)
    others = [g for g in gpus_of(second) if g.index != 3]
    assert all(not g.lost and g.healthy and g.power_watts == 70.0 for g in others)
    assert sum(second.errors.values()) >= 1

    third = backend.collect()
    assert gpus_of(third)[3].lost and sum(third.errors.values()) >= 1  # still failing, counted

    fake.gpus[3].lost = False
    recovered = backend.collect()
    assert not gpus_of(recovered)[3].lost and gpus_of(recovered)[3].power_watts == 300.0


@pytest.mark.parametrize(
    "error",
    [
        pynvml.NVML_ERROR_NO_PERMISSION,
        pynvml.NVML_ERROR_UNKNOWN,
        pynvml.NVML_ERROR_NOT_SUPPORTED,
    ],
)
def test_gpu_unreachable_for_another_reason_is_unhealthy_not_lost(make_backend, caplog, error):
    fake = hgx_h100(4)
    fake.inject("nvmlDeviceGetHandleByIndex", error, gpu=2)
    backend = make_backend(fake)

    with caplog.at_level(logging.INFO, logger="exporter.backends.nvml_calls"):
        first, second = backend.collect(), backend.collect()
    for collection in (first, second):
        unreachable = gpus_of(collection)[2]
        assert not unreachable.lost and not unreachable.healthy
        assert unreachable.nvlink_island is None  # no place in the wiring it was never read
        others = [g for g in gpus_of(collection) if g.index != 2]
        assert all(g.healthy and not g.lost and g.nvlink_island == 0 for g in others)
    assert second.errors["nvmlDeviceGetHandleByIndex"] == 1  # retried, and counted, each cycle
    name = pynvml_error_name(error)
    assert nvml_lines(caplog.records) == [
        (logging.WARNING, f"NVML GPU 2: nvmlDeviceGetHandleByIndex failed: {name}")
    ]

    fake.clear_injected()
    back = gpus_of(backend.collect())[2]
    assert back.healthy and not back.lost and back.uuid == fake.gpus[2].uuid


def pynvml_error_name(code: int) -> str:
    return next(
        n for n in dir(pynvml) if n.startswith("NVML_ERROR_") and getattr(pynvml, n) == code
    )


def test_failing_call_is_one_log_line_per_change_naming_gpu_and_error(make_backend, caplog):
    fake = hgx_h100(2)
    fake.inject("nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_UNKNOWN, gpu=1, times=3)
    fake.inject("nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_NO_PERMISSION, gpu=1, times=1)
    backend = make_backend(fake)

    with caplog.at_level(logging.INFO, logger="exporter.backends.nvml_calls"):
        collections = [backend.collect() for _ in range(6)]
    assert [c.errors["nvmlDeviceGetPowerUsage"] for c in collections] == [1, 1, 1, 1, 0, 0]
    assert nvml_lines(caplog.records) == [
        (logging.WARNING, "NVML GPU 1: nvmlDeviceGetPowerUsage failed: NVML_ERROR_UNKNOWN"),
        (logging.WARNING, "NVML GPU 1: nvmlDeviceGetPowerUsage failed: NVML_ERROR_NO_PERMISSION"),
        (logging.INFO, "NVML GPU 1: nvmlDeviceGetPowerUsage answers again"),
    ]


def test_pcie_sampler_failures_name_the_gpu_once(make_backend, caplog):
    fake = hgx_h100(2)
    fake.inject("nvmlDeviceGetPcieThroughput", pynvml.NVML_ERROR_UNKNOWN, gpu=0)
    backend = make_backend(fake, pcie_interval=3600.0)
    with caplog.at_level(logging.WARNING, logger="exporter.backends.nvml_calls"):
        backend.start()
        backend._pcie.sample_once()  # a second round: same errors, no new lines
    assert [message for _, message in nvml_lines(caplog.records)] == [
        "NVML GPU 0: nvmlDeviceGetPcieThroughput [pcie_tx] failed: NVML_ERROR_UNKNOWN",
        "NVML GPU 0: nvmlDeviceGetPcieThroughput [pcie_rx] failed: NVML_ERROR_UNKNOWN",
    ]


def test_gpu_lost_before_start_is_reported_and_attached_when_back(make_backend):
    fake = hgx_h100(4)
    fake.gpus[1].lost = True
    backend = make_backend(fake)

    first = backend.collect()
    assert gpus_of(first)[1].lost and not gpus_of(first)[1].healthy
    assert [g.lost for g in gpus_of(first)] == [False, True, False, False]

    fake.gpus[1].lost = False
    second = backend.collect()
    assert not gpus_of(second)[1].lost
    assert gpus_of(second)[1].uuid == fake.gpus[1].uuid


def test_not_supported_leaves_none_and_is_not_asked_again(make_backend):
    fake = hgx_h100(4)
    fake.gpus[2].encoder = 30
    fake.gpus[1].encoder = 30
    fake.inject("nvmlDeviceGetEncoderUtilization", pynvml.NVML_ERROR_NOT_SUPPORTED, gpu=2)
    backend = make_backend(fake)

    collections = [backend.collect() for _ in range(3)]
    assert all(gpus_of(c)[2].encoder_utilization_ratio is None for c in collections)
    assert all(gpus_of(c)[1].encoder_utilization_ratio == 0.3 for c in collections)
    assert fake.calls[("nvmlDeviceGetEncoderUtilization", 2)] == 1
    assert fake.calls[("nvmlDeviceGetEncoderUtilization", 1)] == 3
    assert all("nvmlDeviceGetEncoderUtilization" not in c.errors for c in collections)


def test_not_supported_is_asked_again_after_ten_minutes(make_backend):
    now = [0.0]
    fake = hgx_h100(1)
    fake.gpus[0].encoder = 30
    fake.inject("nvmlDeviceGetEncoderUtilization", pynvml.NVML_ERROR_NOT_SUPPORTED, times=1)
    backend = make_backend(fake, clock=lambda: now[0])

    assert gpus_of(backend.collect())[0].encoder_utilization_ratio is None
    now[0] = 599.0
    assert gpus_of(backend.collect())[0].encoder_utilization_ratio is None
    assert fake.calls[("nvmlDeviceGetEncoderUtilization", 0)] == 1
    now[0] = 601.0
    assert gpus_of(backend.collect())[0].encoder_utilization_ratio == 0.3


def test_mig_turned_off_brings_back_remapped_rows_and_utilization(make_backend):
    """NVML says NOT_SUPPORTED for both under MIG; the answer must not outlive MIG."""
    fake = h100_with_seven_mig_instances()
    backend = make_backend(fake)
    under_mig = gpus_of(backend.collect())[0]
    assert under_mig.remapped_rows_failure is None and under_mig.utilization_ratio is None

    gpu = fake.gpus[0]
    gpu.mig_enabled, gpu.migs = False, []
    gpu.remap_failure, gpu.util_gpu = True, 55
    after = gpus_of(backend.collect())[0]
    assert after.remapped_rows_failure is True and not after.healthy
    assert after.utilization_ratio == 0.55


def test_mig_instances_destroyed_bring_back_remapped_rows(make_backend):
    fake = h100_with_seven_mig_instances()
    backend = make_backend(fake)
    assert gpus_of(backend.collect())[0].remapped_rows_failure is None
    fake.gpus[0].migs = []  # MIG mode stays on, no instances left
    fake.gpus[0].remap_failure = True
    reading = gpus_of(backend.collect())[0]
    assert reading.remapped_rows_failure is True and not reading.healthy


def test_transient_error_is_counted_and_retried(make_backend):
    fake = hgx_h100(2)
    fake.inject("nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_UNKNOWN, gpu=0, times=2)
    backend = make_backend(fake)

    first, second, third = (backend.collect() for _ in range(3))
    assert first.errors["nvmlDeviceGetPowerUsage"] == 1
    assert second.errors["nvmlDeviceGetPowerUsage"] == 1
    assert gpus_of(second)[0].power_watts is None and gpus_of(second)[1].power_watts == 70.0
    assert "nvmlDeviceGetPowerUsage" not in third.errors
    assert gpus_of(third)[0].power_watts == 70.0


def test_missing_field_falls_back_to_the_individual_call(make_backend):
    fake = hgx_h100(1)
    gpu = fake.gpus[0]
    gpu.ecc_corrected, gpu.ecc_uncorrected = 12, 1
    gpu.unsupported_fields = {
        pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL,
        pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL,
    }
    gpu.violation_ns = {pynvml.NVML_PERF_POLICY_POWER: 2_500_000_000}
    gpu.unsupported_fields.add(pynvml.NVML_FI_DEV_PERF_POLICY_POWER)
    backend = make_backend(fake)

    for _ in range(2):
        reading = gpus_of(backend.collect())[0]
        assert reading.ecc_errors == {"corrected": 12.0, "uncorrected": 1.0}
        assert reading.clock_event_seconds == {"sw_power_cap": 2.5}
    assert fake.calls[("nvmlDeviceGetTotalEccErrors", 0)] == 4  # 2 kinds x 2 cycles
    # Energy came from the batch, so its individual call was never made.
    assert fake.calls[("nvmlDeviceGetTotalEnergyConsumption", 0)] == 0
    # The thermal counter exists neither as a field nor as a call: asked once, then dropped.
    assert fake.calls[("nvmlDeviceGetViolationStatus", 0)] == 2 + 5


def test_whole_field_call_missing_uses_individual_calls(make_backend):
    fake = hgx_h100(1)
    gpu = fake.gpus[0]
    gpu.energy_mj, gpu.pcie_replay, gpu.retired_sbe, gpu.retired_pending = 5_000, 3, 2, True
    gpu.remap_correctable, gpu.remap_failure = 4, True
    fake.inject("nvmlDeviceGetFieldValues", pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    reading = gpus_of(make_backend(fake).collect())[0]

    assert reading.energy_joules == 5.0 and reading.pcie_replay_errors == 3.0
    assert reading.retired_pages == {"single_bit": 2.0, "double_bit": 0.0}
    assert reading.retired_pages_pending is True
    assert reading.remapped_rows == {"correctable": 4.0, "uncorrectable": 0.0}
    assert reading.remapped_rows_failure is True and not reading.healthy
    assert reading.memory_temperature_celsius is None  # no individual call exists


# ----- init ----------------------------------------------------------------------------------


def test_init_failure_is_one_actionable_line_and_retried(make_backend):
    fake = hgx_h100(1)
    fake.init_error = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    backend = make_backend(fake)

    with pytest.raises(BackendUnavailable) as raised:
        backend.start()
    assert str(raised.value) == "NVML: NVML Shared Library Not Found"
    with pytest.raises(BackendUnavailable):
        backend.collect()

    fake.init_error = None
    assert len(gpus_of(backend.collect())) == 1


def test_real_pynvml_without_a_driver_is_backend_unavailable():
    backend = NvmlBackend("node-a", nvml_module=pynvml, xid_wait_ms=10, init_timeout=5.0)
    try:
        backend.start()
    except BackendUnavailable as error:  # the usual case here: no libnvidia-ml
        assert str(error).startswith("NVML: ") and "\n" not in str(error)
    else:  # a machine with a GPU: the real library must serve a collection
        assert gpus_of(backend.collect())
    finally:
        backend.close()


def test_init_hang_times_out_and_a_later_start_picks_up_the_result(make_backend):
    fake = hgx_h100(1)
    fake.init_release = threading.Event()
    backend = make_backend(fake, init_timeout=0.05)

    started = time.monotonic()
    with pytest.raises(BackendUnavailable, match=r"did not return within 0\.05s"):
        backend.start()
    with pytest.raises(BackendUnavailable, match="did not return"):
        backend.start()  # still hung: no second nvmlInit piles up
    assert time.monotonic() - started < 2.0
    assert fake.calls[("nvmlInit", None)] == 1

    fake.init_release.set()
    assert len(gpus_of(backend.collect())) == 1
    assert fake.calls[("nvmlInit", None)] == 1 and fake.initialized == 1


def test_close_shuts_nvml_down_once(make_backend):
    fake = hgx_h100(1)
    backend = make_backend(fake)
    backend.collect()
    backend.close()
    backend.close()
    assert fake.shutdowns == 1 and fake.initialized == 0


# ----- MIG and GPM ---------------------------------------------------------------------------


def h100_with_seven_mig_instances() -> FakeNvml:
    fake = hgx_h100(1)
    gpu = fake.gpus[0]
    gpu.mig_enabled = True
    gpu.migs = [
        FakeMig(
            gpu_instance_id=7 + n,
            compute_instance_id=0,
            profile="1g.10gb",
            slices=1,
            memory_total=9856 * MIB,
            memory_used=(n + 1) * 100 * MIB,
            sm_util=10.0 * (n + 1),
            uuid=f"MIG-0000000{n}-aaaa-5bbb-8ccc-00000000000{n}",
        )
        for n in range(7)
    ]
    return fake


def test_mig_seven_instances_with_profiles_and_memory(make_backend):
    fake = h100_with_seven_mig_instances()
    reading = gpus_of(make_backend(fake).collect())[0]

    assert reading.mig_enabled is True
    assert [m.gpu_instance_id for m in reading.mig_instances] == list(range(7, 14))
    assert {m.profile for m in reading.mig_instances} == {"1g.10gb"}
    assert {m.compute_instance_id for m in reading.mig_instances} == {0}
    assert {m.memory_total_bytes for m in reading.mig_instances} == {9856 * MIB}
    assert reading.mig_instances[2].memory_used_bytes == 300 * MIB
    assert reading.mig_instances[0].uuid.startswith("MIG-")
    assert reading.utilization_ratio is None  # NVML has no whole-GPU util under MIG


def h100_with_two_compute_instances_in_one_gpu_instance() -> FakeNvml:
    fake = hgx_h100(1)
    gpu = fake.gpus[0]
    gpu.mig_enabled = True
    shared = {"slices": 3, "memory_total": 40192 * MIB, "memory_used": 1000 * MIB}
    gpu.migs = [
        FakeMig(gpu_instance_id=1, compute_instance_id=0, profile="1c.3g.40gb", sm_util=40.0,
                **shared),
        FakeMig(gpu_instance_id=1, compute_instance_id=1, profile="2c.3g.40gb", sm_util=40.0,
                **shared),
        FakeMig(gpu_instance_id=2, compute_instance_id=0, profile="3g.40gb", sm_util=10.0,
                slices=3, memory_total=40192 * MIB, memory_used=500 * MIB),
    ]  # fmt: skip
    return fake


def test_gpu_instance_with_two_compute_instances_is_read_once(make_backend):
    fake = h100_with_two_compute_instances_in_one_gpu_instance()
    attribution = FakeAttribution()
    backend = make_backend(fake, attribution=attribution)
    backend.collect()
    fake.advance(1.0)
    reading = gpus_of(backend.collect())[0]

    migs = fake.gpus[0].migs
    assert [(m.gpu_instance_id, m.profile) for m in reading.mig_instances] == [
        (1, "3g.40gb"),
        (2, "3g.40gb"),
    ]
    first = reading.mig_instances[0]
    assert first.compute_instances == {0: migs[0].uuid, 1: migs[1].uuid}
    assert (first.compute_instance_id, first.uuid) == (0, migs[0].uuid)
    assert first.memory_used_bytes == 1000 * MIB
    assert [m.sm_active_ratio for m in reading.mig_instances] == pytest.approx([0.4, 0.1])
    assert fake.calls[("nvmlGpmMigSampleGet", 0)] == 2 * 2  # per GPU instance, two cycles
    assert attribution.mig_maps[-1] == {m.uuid: (0, m.gpu_instance_id) for m in migs}


def test_gpu_instance_with_two_compute_instances_renders_no_duplicate_series(make_backend):
    from prometheus_client.parser import text_string_to_metric_families

    from exporter.contract import BY_NAME
    from exporter.render import add_node
    from gpu_defrag_common.exposition import Families

    fake = h100_with_two_compute_instances_in_one_gpu_instance()
    backend = make_backend(fake)
    backend.collect()
    fake.advance(1.0)
    families = Families(BY_NAME)
    add_node(families, backend.collect().nodes[0])
    samples = [
        (s.name, tuple(sorted(s.labels.items())))
        for family in text_string_to_metric_families(families.text())
        for s in family.samples
    ]
    assert len(samples) == len(set(samples))  # Prometheus rejects duplicate series
    names = Counter(name for name, _ in samples)
    assert names["gpu_mig_memory_used_bytes"] == names["gpu_mig_sm_active_ratio"] == 2
    assert names["gpu_mig_instance_info"] == 3  # one per compute instance


def test_mig_uuids_reach_the_attribution(make_backend):
    """Device plugins may hand out MIG-<uuid> ids: attribution needs them to find the instance."""
    attribution = FakeAttribution()
    reading = gpus_of(
        make_backend(h100_with_seven_mig_instances(), attribution=attribution).collect()
    )[0]
    expected = {m.uuid: (reading.index, m.gpu_instance_id) for m in reading.mig_instances}
    assert attribution.mig_maps[-1] == expected and len(expected) == 7


def test_mig_profile_from_slices_and_memory_when_the_name_lacks_it(make_backend):
    fake = h100_with_seven_mig_instances()
    backend = make_backend(fake)
    backend.start()
    fake.inject("nvmlDeviceGetName", pynvml.NVML_ERROR_NOT_SUPPORTED)
    reading = gpus_of(backend.collect())[0]
    assert {m.profile for m in reading.mig_instances} == {"1g.10gb"}


def test_gpm_per_mig_instance_sm_activity(make_backend):
    fake = h100_with_seven_mig_instances()
    backend = make_backend(fake)

    first = gpus_of(backend.collect())[0]
    assert all(m.sm_active_ratio is None for m in first.mig_instances)  # needs two samples
    fake.advance(2.0)
    second = gpus_of(backend.collect())[0]
    assert [m.sm_active_ratio for m in second.mig_instances] == pytest.approx(
        [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]
    )


def test_gpm_whole_gpu_rates_over_the_interval_without_new_buffers(make_backend):
    fake = hgx_h100(2)
    for gpu in fake.gpus:
        gpu.gpm = {
            pynvml.NVML_GPM_METRIC_SM_UTIL: 80.0,
            pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: 40.0,
            pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 60.0,
            pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 30.0,
        }
    fake.gpus[1].gpm_supported = False
    backend = make_backend(fake)

    assert gpus_of(backend.collect())[0].sm_active_ratio is None
    fake.advance(1.0)
    second = gpus_of(backend.collect())
    assert second[0].sm_active_ratio == pytest.approx(0.8)
    assert second[0].sm_occupancy_ratio == pytest.approx(0.4)
    assert second[0].tensor_active_ratio == pytest.approx(0.6)
    assert second[0].dram_active_ratio == pytest.approx(0.3)
    assert second[1].sm_active_ratio is None  # GPM not supported on that GPU

    fake.gpus[0].gpm[pynvml.NVML_GPM_METRIC_SM_UTIL] = 20.0
    fake.advance(3.0)
    third = gpus_of(backend.collect())
    assert third[0].sm_active_ratio == pytest.approx(0.2)  # rate over the last interval only
    assert fake.calls[("nvmlGpmSampleAlloc", None)] == 2  # two buffers, alternated
    assert fake.calls[("nvmlGpmSampleGet", 1)] == 0


# ----- XID -----------------------------------------------------------------------------------


def collect_until(backend: NvmlBackend, done: Callable[[Collection], bool]) -> Collection:
    deadline = time.monotonic() + 3.0
    while True:
        collection = backend.collect()
        if done(collection) or time.monotonic() > deadline:
            return collection
        time.sleep(0.01)


def test_xid_events_are_counted_by_gpu_and_code(make_backend):
    fake = hgx_h100()
    backend = make_backend(fake)
    backend.start()
    before = time.time()
    fake.push_xid(2, 79)
    fake.push_xid(2, 79)
    fake.push_xid(5, 13)

    collection = collect_until(
        backend, lambda c: gpus_of(c)[2].xid_errors.get(79) == 2 and gpus_of(c)[5].xid_errors
    )
    gpus = gpus_of(collection)
    assert gpus[2].xid_errors == {79: 2.0}
    assert gpus[5].xid_errors == {13: 1.0}
    assert gpus[0].xid_errors == {} and gpus[0].xid_last_timestamp_seconds is None
    assert gpus[2].xid_last_timestamp_seconds >= before
    assert not gpus[2].healthy and not gpus[2].lost  # 79: fell off the bus, fatal
    assert gpus[5].healthy  # 13: an application fault


def test_xid_watcher_survives_an_nvml_error(make_backend):
    fake = hgx_h100(2)
    fake.inject("nvmlEventSetWait", pynvml.NVML_ERROR_UNKNOWN, times=1)
    backend = make_backend(fake)
    backend.start()
    fake.push_xid(1, 48)

    errors: Counter[str] = Counter()
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        collection = backend.collect()
        errors.update(collection.errors)
        if gpus_of(collection)[1].xid_errors:
            break
        time.sleep(0.01)
    assert gpus_of(collection)[1].xid_errors == {48: 1.0}
    assert not gpus_of(collection)[1].healthy  # 48: double-bit ECC error
    assert fake.calls[("nvmlEventSetCreate", None)] >= 2  # set rebuilt after the failure
    assert errors["nvmlEventSetWait"] == 1


# ----- processes -----------------------------------------------------------------------------


class FakeAttribution:
    def process_owner(self, pid: int) -> Owner | None:
        return {101: Owner(pod="train-0", namespace="ml", container="main")}.get(pid)

    def __init__(self) -> None:
        self.mig_maps: list[dict[str, tuple[int, int]] | None] = []

    def allocations(
        self,
        gpu_index_by_uuid: dict[str, int],
        mig_by_uuid: dict[str, tuple[int, int]] | None = None,
    ) -> list[Allocation]:
        self.mig_maps.append(mig_by_uuid)
        return [Allocation(gpu=index, pod="train-0") for index in gpu_index_by_uuid.values()]


def test_processes_with_per_process_sm_on_a_time_sliced_gpu(make_backend):
    fake = hgx_h100(1)
    fake.gpus[0].processes = [
        FakeProcess(101, "python", 20 * 1024 * MIB, sm_util=60),
        FakeProcess(102, "python", 10 * 1024 * MIB, sm_util=30),
        FakeProcess(103, "Xorg", 50 * MIB, kind="graphics"),
    ]
    fake.process_names = {101: "python train.py", 102: "python serve.py", 103: "Xorg"}
    backend = make_backend(fake, attribution=FakeAttribution())
    fake.advance(1.0)

    first = backend.collect()
    procs = {p.pid: p for p in gpus_of(first)[0].processes}
    assert set(procs) == {101, 102, 103}
    assert procs[101].sm_utilization_ratio == pytest.approx(0.6)
    assert procs[102].sm_utilization_ratio == pytest.approx(0.3)
    assert procs[103].sm_utilization_ratio is None
    assert procs[101].memory_used_bytes == 20 * 1024 * MIB
    assert procs[101].name == "python train.py" and procs[103].name == "Xorg"
    assert (procs[101].pod, procs[101].namespace, procs[101].container) == ("train-0", "ml", "main")
    assert procs[102].pod == "" and procs[101].gpu_instance_id is None
    assert first.nodes[0].allocations == [Allocation(gpu=0, pod="train-0")]

    # No new samples since the last cycle: NVML says NOT_FOUND, which is not an error.
    second = backend.collect()
    assert all(p.sm_utilization_ratio is None for p in gpus_of(second)[0].processes)
    assert not second.errors

    fake.gpus[0].processes[0].sm_util = 90
    fake.advance(1.0)
    third = {p.pid: p for p in gpus_of(backend.collect())[0].processes}
    assert third[101].sm_utilization_ratio == pytest.approx(0.9)
    assert fake.calls[("nvmlSystemGetProcessName", None)] == 3  # names cached per pid


def test_processes_on_old_driver_and_in_mig_instances(make_backend):
    fake = h100_with_seven_mig_instances()
    gpu = fake.gpus[0]
    gpu.process_api = 2
    gpu.processes = [FakeProcess(7, "a", None, gpu_instance_id=9, compute_instance_id=0)]
    collection = make_backend(fake).collect()
    reading = gpus_of(collection)[0]

    if not has("nvmlDeviceGetComputeRunningProcesses_v2"):  # nvidia-ml-py before 12.550
        assert reading.processes == [] and not collection.errors  # not supported: no error
        return
    (process,) = reading.processes
    assert process.gpu_instance_id == 9 and process.memory_used_bytes is None
    assert process.name == ""  # no name known: empty, not an error
    assert fake.calls[("nvmlDeviceGetComputeRunningProcesses_v2", 0)] == 1


# ----- units ---------------------------------------------------------------------------------


def test_units_are_converted_to_base_units(make_backend):
    fake = hgx_h100(1)
    gpu = fake.gpus[0]
    gpu.power_mw, gpu.power_limit_mw, gpu.energy_mj = 312_500, 700_000, 123_456_789
    gpu.sm_clock_mhz, gpu.mem_clock_mhz = 1755, 2619
    gpu.pcie_tx_kbs, gpu.pcie_rx_kbs = 1000, 250
    gpu.util_gpu, gpu.util_memory, gpu.temperature = 87, 41, 66
    gpu.memory_used = 40 * 1024 * MIB
    gpu.clock_events = (
        pynvml.nvmlClocksEventReasonSwPowerCap | pynvml.nvmlClocksEventReasonHwSlowdown
    )
    gpu.violation_ns = {pynvml.NVML_PERF_POLICY_THERMAL: 1_500_000_000}
    r = gpus_of(make_backend(fake).collect())[0]

    assert r.power_watts == 312.5 and r.power_limit_watts == 700.0
    assert r.energy_joules == pytest.approx(123_456.789)
    assert r.sm_clock_hertz == 1.755e9 and r.memory_clock_hertz == 2.619e9
    assert r.pcie_tx_bytes_per_second == 1000 * 1024 and r.pcie_rx_bytes_per_second == 250 * 1024
    assert (r.utilization_ratio, r.memory_utilization_ratio) == (0.87, 0.41)
    assert r.temperature_celsius == 66.0 and r.memory_temperature_celsius == 40.0
    assert r.memory_used_bytes == 40 * 1024 * MIB
    assert r.memory_reserved_bytes == 544 * MIB
    assert r.memory_total_bytes == r.memory_used_bytes + r.memory_free_bytes + 544 * MIB
    active = {reason for reason, on in r.clock_event_active.items() if on}
    assert active == {"sw_power_cap", "hw_slowdown"}
    assert r.clock_event_seconds == {"sw_thermal_slowdown": 1.5}


def test_memory_falls_back_to_v1_without_reserved(make_backend):
    fake = hgx_h100(1)
    fake.gpus[0].memory_v2 = False
    fake.gpus[0].memory_used = 1024 * MIB
    backend = make_backend(fake)
    for _ in range(2):
        r = gpus_of(backend.collect())[0]
        assert r.memory_reserved_bytes is None
        assert r.memory_used_bytes == (1024 + 544) * MIB  # v1 "used" includes reserved
    assert fake.calls[("nvmlDeviceGetMemoryInfo_v2", 0)] == 1


def test_pcie_throughput_is_sampled_off_the_collection_path(make_backend):
    fake = hgx_h100(2)
    fake.gpus[0].pcie_tx_kbs = 100
    backend = make_backend(fake, pcie_interval=3600.0)

    assert gpus_of(backend.collect())[0].pcie_tx_bytes_per_second == 100 * 1024
    fake.gpus[0].pcie_tx_kbs = 200
    for _ in range(3):  # reused: the 20 ms driver windows are not paid by collections
        assert gpus_of(backend.collect())[0].pcie_tx_bytes_per_second == 100 * 1024
    assert fake.calls[("nvmlDeviceGetPcieThroughput", 0)] == 2  # tx + rx, once at start


def test_pcie_values_of_a_stuck_sampler_disappear_instead_of_freezing():
    fake = hgx_h100(1)
    fake.gpus[0].pcie_tx_kbs = 100
    now = [1000.0]
    fake.nvmlInit()
    sampler = PcieSampler(fake, interval=30.0, clock=lambda: now[0])
    sampler.set_device(0, fake.nvmlDeviceGetHandleByIndex(0))
    sampler.sample_once()
    now[0] += 90.0  # three intervals: still served
    assert sampler.latest(0) == (100 * 1024, 0.0)
    now[0] += 1.0  # no sample for longer than that: the thread is stuck in the driver
    assert sampler.latest(0) == (None, None)
    sampler.sample_once()
    assert sampler.latest(0)[0] == 100 * 1024


def test_pcie_sampler_refreshes_on_its_own_cadence(make_backend):
    fake = hgx_h100(2)
    fake.gpus[1].pcie_rx_kbs = 10
    backend = make_backend(fake, pcie_interval=0.01)
    assert gpus_of(backend.collect())[1].pcie_rx_bytes_per_second == 10 * 1024
    fake.gpus[1].pcie_rx_kbs = 20

    collection = collect_until(
        backend, lambda c: gpus_of(c)[1].pcie_rx_bytes_per_second == 20 * 1024
    )
    assert gpus_of(collection)[1].pcie_rx_bytes_per_second == 20 * 1024


def test_pcie_throughput_can_be_disabled(make_backend):
    fake = hgx_h100(1)
    r = gpus_of(make_backend(fake, pcie_interval=0).collect())[0]
    assert r.pcie_tx_bytes_per_second is None
    assert fake.calls[("nvmlDeviceGetPcieThroughput", 0)] == 0


# ----- wiring --------------------------------------------------------------------------------


def test_flags_and_registry():
    parser = argparse.ArgumentParser()
    parser.add_argument("--node-name", dest="node_name", default="n")
    NvmlBackend.add_arguments(parser)
    args = parser.parse_args(
        ["--node-name", "gpu-07", "--nvml.pcie-interval", "30s", "--nvml.init-timeout", "500ms",
         "--nvml.no-xid-events"]
    )  # fmt: skip
    backend = NvmlBackend.from_args(args)
    assert backend.node_name == "gpu-07"
    assert (backend.pcie_interval, backend.init_timeout) == (30.0, 0.5)
    assert backend.xid_events is False and backend.gpm_enabled is True
    assert backend_class("nvml") is NvmlBackend
    with pytest.raises(SystemExit):
        parser.parse_args(["--nvml.pcie-interval", "soon"])


def test_cpu_list_rendering():
    assert cpu_list([0xFFFFFFFF, 0xFFFFFFFF]) == "0-31,64-95"
    assert cpu_list([0b1010_0111]) == "0-2,5,7"
    assert cpu_list([0, 0]) == ""
    assert cpu_list([1 << 63, 1]) == "63-64"


def test_clock_events_fall_back_to_the_old_throttle_name(make_backend):
    fake = hgx_h100(1)
    fake.gpus[0].clock_events = pynvml.nvmlClocksEventReasonSwThermalSlowdown
    fake.inject(
        "nvmlDeviceGetCurrentClocksEventReasons", pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    )  # a driver older than the rename
    backend = make_backend(fake)
    for _ in range(2):
        r = gpus_of(backend.collect())[0]
        assert [k for k, on in r.clock_event_active.items() if on] == ["sw_thermal_slowdown"]
    assert fake.calls[("nvmlDeviceGetCurrentClocksEventReasons", 0)] == 1
    assert fake.calls[("nvmlDeviceGetCurrentClocksThrottleReasons", 0)] == 2


def test_library_level_failure_makes_the_backend_unavailable_until_reinit(make_backend):
    fake = hgx_h100(2)
    backend = make_backend(fake)
    backend.collect()
    fake.inject("nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_DRIVER_NOT_LOADED, times=1)

    with pytest.raises(BackendUnavailable, match=r"^NVML: Driver Not Loaded$"):
        backend.collect()
    assert fake.shutdowns == 1
    assert len(gpus_of(backend.collect())) == 2  # the loop's retry initialises afresh
    assert fake.calls[("nvmlInit", None)] == 2


def test_gpu_that_comes_back_gets_its_xid_events_watched(make_backend):
    fake = hgx_h100(2)
    fake.gpus[1].lost = True
    backend = make_backend(fake)
    backend.collect()
    fake.gpus[1].lost = False
    backend.collect()  # attached now
    fake.push_xid(1, 31)

    collection = collect_until(backend, lambda c: bool(gpus_of(c)[1].xid_errors))
    assert gpus_of(collection)[1].xid_errors == {31: 1.0}
    assert gpus_of(collection)[1].healthy  # 31: an application's MMU fault


def test_fatal_xids_match_the_critical_hardware_alert_class():
    from pathlib import Path

    import yaml

    from exporter.backends.nvml_events import FATAL_XIDS

    config = yaml.safe_load((Path(__file__).parents[2] / "alerts" / "config.yaml").read_text())
    (hardware,) = [c for c in config["xid_classes"] if c["name"] == "hardware"]
    assert set(hardware["codes"]) == FATAL_XIDS


def test_readings_render_into_contract_metrics(make_backend):
    from prometheus_client.parser import text_string_to_metric_families

    from exporter.contract import BY_NAME
    from exporter.render import add_node
    from gpu_defrag_common.exposition import Families

    fake = h100_with_seven_mig_instances()
    fake.gpus[0].processes = [FakeProcess(7, "a", 5 * MIB, gpu_instance_id=9)]
    backend = make_backend(fake)
    backend.collect()
    fake.advance(1.0)
    families = Families(BY_NAME)
    add_node(families, backend.collect().nodes[0])

    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(families.text())
        for s in family.samples
    }
    names = {name for name, _ in samples}
    assert {"gpu_power_watts", "gpu_energy_joules_total", "gpu_mig_instance_info"} <= names
    assert samples[("gpu_power_watts", (("gpu", "0"), ("node", "node-a")))] == 70.0
    mig = (("gpu", "0"), ("gpu_instance_id", "9"), ("node", "node-a"))
    assert samples[("gpu_mig_sm_active_ratio", mig)] == pytest.approx(0.3)
    assert "gpu_utilization_ratio" not in names  # unsupported under MIG: absent, not zero


def test_mig_reconfiguration_is_followed_and_stale_gpm_samples_freed(make_backend):
    fake = h100_with_seven_mig_instances()
    backend = make_backend(fake)
    backend.collect()  # one GPM sample held per 1g.10gb instance

    fake.gpus[0].migs = [
        FakeMig(gpu_instance_id=gi, compute_instance_id=0, profile="3g.40gb", slices=3,
                memory_total=40192 * MIB, sm_util=50.0, uuid=f"MIG-{gi}")
        for gi in (1, 2)
    ]  # fmt: skip
    reading = gpus_of(backend.collect())[0]
    assert [(m.gpu_instance_id, m.profile) for m in reading.mig_instances] == [
        (1, "3g.40gb"),
        (2, "3g.40gb"),
    ]
    assert fake.calls[("nvmlGpmSampleFree", None)] == 7
    fake.advance(1.0)
    assert [m.sm_active_ratio for m in gpus_of(backend.collect())[0].mig_instances] == [0.5, 0.5]


def test_lost_gpu_keeps_the_last_topology_and_is_not_rewalked_every_cycle(make_backend):
    now = [0.0]
    fake = hgx_h100(4)
    backend = make_backend(fake, clock=lambda: now[0])
    links_before = backend.collect().nodes[0].links
    fake.gpus[2].lost = True
    now[0] = 700.0  # topology refresh due while GPU 2 is off the bus
    walks = fake.calls[("nvmlDeviceGetNvLinkState", 0)]
    for _ in range(3):
        node = backend.collect().nodes[0]
        assert node.links == links_before
        assert {g.nvlink_island for g in node.gpus} == {0}
    assert fake.calls[("nvmlDeviceGetNvLinkState", 0)] == walks + NVLINK_WALK  # one walk
