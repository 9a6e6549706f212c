"""DcgmBackend against a fake of DCGM's Python bindings injected through sys.modules."""

from __future__ import annotations

import argparse
import sys

import pytest

from exporter.backends import dcgm as dcgm_backend
from exporter.backends.base import BackendUnavailable
from exporter.backends.dcgm import NOT_FOUND, DcgmBackend
from exporter.backends.registry import backend_class
from exporter.readings import Allocation
from tests.fakes.fake_dcgm import FakeDcgm, FakeInstance

MIB = 2**20
BINDING_MODULES = ("pydcgm", "dcgm_fields", "dcgm_structs", "dcgm_agent", "DcgmReader")


def _a100(uuid: str, **overrides: object) -> dict[str, object]:
    values: dict[str, object] = {
        "DCGM_FI_DRIVER_VERSION": "550.90.07",
        "DCGM_FI_CUDA_DRIVER_VERSION": 12040,
        "DCGM_FI_DEV_NAME": "NVIDIA A100-SXM4-80GB",
        "DCGM_FI_DEV_SERIAL": "1564720004631",
        "DCGM_FI_DEV_UUID": uuid,
        "DCGM_FI_DEV_PCI_BUSID": "00000000:07:00.0",
        "DCGM_FI_DEV_VBIOS_VERSION": "92.00.36.00.01",
        "DCGM_FI_DEV_MIG_MODE": 0,
        "DCGM_FI_DEV_SM_CLOCK": 1410,
        "DCGM_FI_DEV_MEM_CLOCK": 1593,
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": 0x4 | 0x1,  # sw_power_cap + gpu_idle
        "DCGM_FI_DEV_MEMORY_TEMP": 48,
        "DCGM_FI_DEV_GPU_TEMP": 61,
        "DCGM_FI_DEV_POWER_USAGE": 351.25,
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 912345678901,
        "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": 400.0,
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 3,
        "DCGM_FI_DEV_GPU_UTIL": 97,
        "DCGM_FI_DEV_MEM_COPY_UTIL": 41,
        "DCGM_FI_DEV_ENC_UTIL": 0,
        "DCGM_FI_DEV_DEC_UTIL": 5,
        "DCGM_FI_DEV_XID_ERRORS": 0,
        "DCGM_FI_DEV_POWER_VIOLATION": 2_500_000_000,  # nanoseconds (dcgm_fields.h)
        "DCGM_FI_DEV_THERMAL_VIOLATION": 0,
        "DCGM_FI_DEV_FB_TOTAL": 81920,
        "DCGM_FI_DEV_FB_FREE": 9649,
        "DCGM_FI_DEV_FB_USED": 71680,
        "DCGM_FI_DEV_FB_RESERVED": 591,
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": 12,
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": 0,
        "DCGM_FI_DEV_RETIRED_SBE": 1,
        "DCGM_FI_DEV_RETIRED_DBE": 0,
        "DCGM_FI_DEV_RETIRED_PENDING": 0,
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 0,
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 2,
        "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0,
        "DCGM_FI_DEV_ROW_REMAP_PENDING": 1,
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.95,
        "DCGM_FI_PROF_SM_ACTIVE": 0.9,
        "DCGM_FI_PROF_SM_OCCUPANCY": 0.45,
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.5,
        "DCGM_FI_PROF_DRAM_ACTIVE": 0.4,
        "DCGM_FI_PROF_PCIE_TX_BYTES": 412345678,
        "DCGM_FI_PROF_PCIE_RX_BYTES": 523456789,
        "DCGM_FI_DEV_VIDEO_CLOCK": 1275,
        "DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX": 400.0,
        "DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF": 400.0,
        "DCGM_FI_DEV_FABRIC_MANAGER_STATUS": 3,  # success
        "DCGM_FI_DEV_PSTATE": 0,
        "DCGM_FI_DEV_FAN_SPEED": 0x7FFFFFF0,  # int32 blank: no fan on an SXM board
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": 190_000,  # MB/s
        "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION": 0,
    }
    values.update(overrides)
    return values


def _fleet(fake: FakeDcgm) -> FakeDcgm:
    """GPU 0 whole and busy; GPU 1 in MIG mode with a 3g.40gb and a 1g.10gb instance."""
    fake.gpus[0] = _a100("GPU-aaaa")
    fake.gpus[1] = _a100(
        "GPU-bbbb", DCGM_FI_DEV_MIG_MODE=1, DCGM_FI_DEV_PCI_BUSID="00000000:0F:00.0"
    )
    fake.instances = [
        FakeInstance(
            entity_id=0,
            gpu_id=1,
            gpu_instance_id=2,
            slices=3,
            ci_entity_id=0,
            compute_instance_id=0,
            values={
                "DCGM_FI_DEV_NAME": "3g.40gb",
                "DCGM_FI_DEV_UUID": "MIG-1111",
                "DCGM_FI_DEV_FB_USED": 30720,
                "DCGM_FI_DEV_FB_FREE": 9728,
                "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.85,
                "DCGM_FI_PROF_SM_ACTIVE": 0.81,
            },
        ),
        FakeInstance(
            entity_id=1,
            gpu_id=1,
            gpu_instance_id=9,
            slices=1,
            ci_entity_id=1,
            values={
                "DCGM_FI_DEV_NAME": "1g.10gb",
                "DCGM_FI_DEV_FB_USED": 0,
                "DCGM_FI_DEV_FB_FREE": 9856,
                "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.0,
            },
        ),
    ]
    return fake


@pytest.fixture
def no_system_bindings(monkeypatch):
    """Never pick up a real DCGM install on the test machine."""
    monkeypatch.setattr(dcgm_backend, "BINDING_DIRS", ())
    monkeypatch.delenv("DCGM_BINDINGS_PATH", raising=False)
    monkeypatch.delenv("NODE_NAME", raising=False)


@pytest.fixture
def fake(monkeypatch, no_system_bindings) -> FakeDcgm:
    fake = _fleet(FakeDcgm())
    fake.install(monkeypatch)
    return fake


def _backend(**kwargs) -> DcgmBackend:
    kwargs.setdefault("node_name", "node-a")
    return DcgmBackend(**kwargs)


def test_readings_in_base_units(fake):
    backend = _backend()
    collection = backend.collect()
    (node,) = collection.nodes
    assert node.node == "node-a"
    assert (node.driver_version, node.cuda_version) == ("550.90.07", "12.4")
    gpu = node.gpus[0]
    assert (gpu.uuid, gpu.model, gpu.pci_bus_id) == (
        "GPU-aaaa",
        "NVIDIA A100-SXM4-80GB",
        "00000000:07:00.0",
    )
    assert (gpu.serial, gpu.vbios_version) == ("1564720004631", "92.00.36.00.01")
    assert gpu.memory_total_bytes == 81920 * MIB
    assert gpu.memory_used_bytes == 71680 * MIB
    assert gpu.memory_reserved_bytes == 591 * MIB
    assert gpu.sm_clock_hertz == 1410e6
    assert gpu.utilization_ratio == pytest.approx(0.97)
    assert gpu.decoder_utilization_ratio == pytest.approx(0.05)
    assert gpu.power_watts == 351.25
    assert gpu.power_limit_watts == 400.0
    assert gpu.energy_joules == pytest.approx(912345678.901)
    assert gpu.sm_active_ratio == 0.9  # SM_ACTIVE, not GR_ENGINE_ACTIVE (0.95)
    assert gpu.sm_occupancy_ratio == 0.45
    assert gpu.pcie_rx_bytes_per_second == 523456789
    assert gpu.clock_event_seconds["sw_power_cap"] == pytest.approx(2.5)
    assert gpu.clock_event_active["sw_power_cap"] and gpu.clock_event_active["gpu_idle"]
    assert not gpu.clock_event_active["hw_slowdown"]
    assert gpu.ecc_errors == {"corrected": 12.0, "uncorrected": 0.0}
    assert gpu.retired_pages == {"single_bit": 1.0, "double_bit": 0.0}
    assert gpu.remapped_rows == {"correctable": 2.0, "uncorrectable": 0.0}
    assert gpu.remapped_rows_pending is True and gpu.remapped_rows_failure is False
    assert gpu.healthy and gpu.mig_enabled is False
    assert collection.errors == {}
    backend.close()


def test_mig_instances_from_the_entity_hierarchy(fake):
    backend = _backend()
    gpu = backend.collect().nodes[0].gpus[1]
    assert gpu.mig_enabled is True
    assert [(m.gpu_instance_id, m.profile) for m in gpu.mig_instances] == [
        (2, "3g.40gb"),
        (9, "1g.10gb"),
    ]
    big = gpu.mig_instances[0]
    assert big.memory_used_bytes == 30720 * MIB
    assert big.memory_total_bytes == (30720 + 9728) * MIB
    assert big.sm_active_ratio == 0.81
    assert gpu.mig_instances[1].sm_active_ratio is None  # GR_ENGINE_ACTIVE is not SM activity
    (watch,) = fake.watches
    assert watch["gpus"] == [0, 1]
    assert watch["entities"] == [(4, 0), (4, 1)]  # DCGM_FE_GPU_I entities are watched too
    assert watch["update_frequency"] == 5_000_000  # microseconds
    backend.close()


def test_violation_counters_are_nanoseconds(monkeypatch, no_system_bindings):
    """DCGM_FI_DEV_*_VIOLATION are ns (dcgm_fields.h, NVIDIA/dcgm-exporter#589), as in NVML."""
    fake = _fleet(FakeDcgm())
    fake.gpus[0]["DCGM_FI_DEV_THERMAL_VIOLATION"] = 1_500_000_000
    fake.install(monkeypatch)
    backend = _backend()
    gpu = backend.collect().nodes[0].gpus[0]
    assert gpu.clock_event_seconds["sw_thermal_slowdown"] == pytest.approx(1.5)
    backend.close()


def test_graphics_engine_activity_never_stands_in_for_sm_activity(monkeypatch, no_system_bindings):
    fake = _fleet(FakeDcgm())
    del fake.gpus[0]["DCGM_FI_PROF_SM_ACTIVE"]  # GR_ENGINE_ACTIVE 0.95 stays
    fake.install(monkeypatch)
    backend = _backend()
    gpu = backend.collect().nodes[0].gpus[0]
    assert gpu.sm_active_ratio is None  # absent, not the graphics engine's busy time
    assert gpu.tensor_active_ratio == 0.5  # the other profiling fields are still read
    backend.close()


def test_fabric_recovery_nvlink_limits_and_engine_activity(monkeypatch, no_system_bindings):
    fake = _fleet(FakeDcgm())
    fake.gpus[0]["DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION"] = 4  # drain and reset
    fake.gpus[0]["DCGM_FI_DEV_FABRIC_MANAGER_STATUS"] = 4  # the fabric manager failed
    fake.install(monkeypatch)
    backend = _backend()
    gpus = backend.collect().nodes[0].gpus
    first, second = gpus[0], gpus[1]
    assert (first.recovery_action, second.recovery_action) == (4, 0)
    assert (first.fabric_state, first.fabric_error) == (3, True)
    assert (second.fabric_state, second.fabric_error) == (3, False)
    assert second.nvlink_bytes_per_second == 190_000 * 2**20
    assert second.power_limit_max_watts == 400.0 and second.video_clock_hertz == 1275e6
    assert second.fan_speed_ratio is None and second.performance_state == 0
    assert second.graphics_engine_active_ratio == 0.95  # GR_ENGINE_ACTIVE, a reading of its own
    backend.close()


@pytest.mark.parametrize("aliases", [True, False])
def test_dcgm4_renamed_fields_resolve(monkeypatch, no_system_bindings, aliases):
    fake = _fleet(FakeDcgm(renamed=True, deprecated_aliases=aliases))
    fake.install(monkeypatch)
    backend = _backend()
    gpu = backend.collect().nodes[0].gpus[0]  # classic names do not resolve without aliases
    assert gpu.temperature_celsius == 61
    assert gpu.uuid == "GPU-aaaa"
    assert gpu.tensor_active_ratio == 0.5
    assert gpu.recovery_action == 0 and gpu.power_limit_max_watts == 400.0  # renamed in 4.x
    backend.close()


def test_profiling_refused_falls_back_to_device_fields(fake):
    fake.profiling_supported = False
    backend = _backend()
    first = backend.collect()
    gpu = first.nodes[0].gpus[0]
    assert gpu.sm_active_ratio is None and gpu.tensor_active_ratio is None
    assert gpu.temperature_celsius == 61
    assert first.errors == {"dcgm_watch_fields": 1}
    assert not any(1000 <= field_id < 1100 for field_id in fake.watches[-1]["fields"])  # no DCP
    assert backend.collect().errors == {}  # counted once, not every cycle
    backend.close()


def test_blank_values_are_skipped_even_when_the_reader_passes_them(fake):
    fake.reader_filters_blanks = False  # an old DcgmReader without ignoreBlank
    fake.gpus[0].update(
        DCGM_FI_DEV_MEMORY_TEMP=0x7FFFFFFFFFFFFFF2,
        DCGM_FI_PROF_DRAM_ACTIVE=140737488355330.0,
        DCGM_FI_DEV_SERIAL="<<<NOT_SUPPORTED>>>",
        DCGM_FI_DEV_ENC_UTIL=0x7FFFFFF0,
    )
    gpu = _backend().collect().nodes[0].gpus[0]
    assert gpu.memory_temperature_celsius is None
    assert gpu.dram_active_ratio is None
    assert gpu.encoder_utilization_ratio is None
    assert gpu.serial == ""
    assert gpu.temperature_celsius == 61


def test_last_xid_code_changes_become_counters(fake):
    backend = _backend()
    assert backend.collect().nodes[0].gpus[0].xid_errors == {}
    fake.gpus[0]["DCGM_FI_DEV_XID_ERRORS"] = 13
    assert backend.collect().nodes[0].gpus[0].xid_errors == {13: 1.0}
    assert backend.collect().nodes[0].gpus[0].xid_errors == {13: 1.0}
    fake.gpus[0]["DCGM_FI_DEV_XID_ERRORS"] = 31
    gpu = backend.collect().nodes[0].gpus[0]
    assert gpu.xid_errors == {13: 1.0, 31: 1.0}
    assert gpu.xid_last_timestamp_seconds is not None
    backend.close()


def test_xid_standing_at_the_first_collection_is_a_baseline(fake):
    """DCGM keeps the last code until the driver reloads: at our start it may be days old."""
    fake.gpus[0]["DCGM_FI_DEV_XID_ERRORS"] = 48  # fatal (double-bit ECC), from before our start
    fake.gpus[1]["DCGM_FI_DEV_XID_ERRORS"] = 13
    backend = _backend()
    for _ in range(2):  # the baseline, then the same code again: nothing happened
        fatal, benign = backend.collect().nodes[0].gpus
        assert fatal.xid_errors == {} and benign.xid_errors == {}
        assert fatal.healthy and not fatal.lost and benign.healthy
        assert fatal.xid_last_timestamp_seconds is None
    fake.gpus[0]["DCGM_FI_DEV_XID_ERRORS"] = 64  # a new fatal code while we watch
    fake.gpus[1]["DCGM_FI_DEV_XID_ERRORS"] = 31
    fatal, benign = backend.collect().nodes[0].gpus
    assert fatal.xid_errors == {64: 1.0}  # the standing 48 is never counted
    assert not fatal.healthy and not fatal.lost
    assert fatal.xid_last_timestamp_seconds is not None
    assert benign.xid_errors == {31: 1.0} and benign.healthy
    backend.close()


def test_xid_79_standing_at_start_is_not_counted_but_the_gpu_is_lost(fake):
    """Fallen off the bus is a state that lasts until a reset, which also clears the code."""
    fake.gpus[0]["DCGM_FI_DEV_XID_ERRORS"] = 79
    backend = _backend()
    gpu = backend.collect().nodes[0].gpus[0]
    assert gpu.xid_errors == {} and gpu.xid_last_timestamp_seconds is None
    assert gpu.lost and not gpu.healthy
    backend.close()


def test_a_gpu_first_seen_later_gets_its_own_xid_baseline(fake):
    fake.gpus[1]["DCGM_FI_DEV_XID_ERRORS"] = 13  # standing at start: GPU 1's baseline
    backend = _backend()
    assert [g.xid_errors for g in backend.collect().nodes[0].gpus] == [{}, {}]
    # Hot-plug: GPU 2 appears with an old fatal code; the re-partition of GPU 1 restarts the
    # watch, which picks GPU 2 up. GPU 1 keeps its UUID, so its baseline stays.
    fake.gpus[2] = _a100("GPU-cccc", DCGM_FI_DEV_XID_ERRORS=48)
    fake.instances = fake.instances[:1]
    fake.gpus[1]["DCGM_FI_DEV_XID_ERRORS"] = 62
    gpus = backend.collect().nodes[0].gpus
    assert [g.uuid for g in gpus] == ["GPU-aaaa", "GPU-bbbb", "GPU-cccc"]
    assert gpus[2].xid_errors == {} and gpus[2].healthy
    assert gpus[1].xid_errors == {62: 1.0} and not gpus[1].healthy
    fake.gpus[2]["DCGM_FI_DEV_XID_ERRORS"] = 74
    gpus = backend.collect().nodes[0].gpus
    assert gpus[2].xid_errors == {74: 1.0} and not gpus[2].healthy
    backend.close()


def test_mig_repartition_rebuilds_the_watch(fake):
    backend = _backend()
    backend.collect()
    fake.instances = fake.instances[:1]
    gpu = backend.collect().nodes[0].gpus[1]
    assert [m.profile for m in gpu.mig_instances] == ["3g.40gb"]
    assert len(fake.watches) == 2
    assert fake.watches[-1]["entities"] == [(4, 0)]
    assert fake.handles_open == 1
    backend.close()
    assert fake.handles_open == 0


def test_no_hierarchy_means_gpus_only_and_a_counted_error(fake):
    fake.hierarchy_supported = False
    collection = _backend().collect()
    assert all(gpu.mig_instances == [] for gpu in collection.nodes[0].gpus)
    assert collection.errors["dcgmGetGpuInstanceHierarchy"] >= 1


def test_lost_connection_is_unavailable_then_recovers(fake):
    backend = _backend(host="gpu-7:5555")
    backend.collect()
    fake.connected = False
    with pytest.raises(BackendUnavailable, match=r"nv-hostengine at gpu-7:5555 .*connection lost"):
        backend.collect()
    assert fake.handles_open == 0  # the broken handle was released
    fake.connected = True
    assert len(backend.collect().nodes[0].gpus) == 2
    backend.close()
    backend.close()  # safe twice


def test_unreachable_hostengine(fake):
    fake.reachable = False
    with pytest.raises(BackendUnavailable) as caught:
        _backend(host="10.0.0.7").start()
    message = str(caught.value)
    assert "nv-hostengine at 10.0.0.7" in message and "\n" not in message


def test_bindings_not_installed(monkeypatch, no_system_bindings, tmp_path):
    for name in BINDING_MODULES:
        monkeypatch.setitem(sys.modules, name, None)  # makes `import name` raise ImportError
    monkeypatch.setenv("DCGM_BINDINGS_PATH", str(tmp_path))
    monkeypatch.setattr(sys, "path", list(sys.path))
    with pytest.raises(BackendUnavailable) as caught:
        DcgmBackend(node_name="n").start()
    assert str(caught.value) == NOT_FOUND
    assert str(tmp_path) in sys.path  # $DCGM_BINDINGS_PATH was searched


def test_flags_and_node_name(monkeypatch, no_system_bindings):
    parser = argparse.ArgumentParser()
    DcgmBackend.add_arguments(parser)
    args = parser.parse_args(["--dcgm.host", "gpu-7:5555", "--dcgm.update-interval", "2"])
    backend = DcgmBackend.from_args(args)
    assert (backend.host, backend.update_interval) == ("gpu-7:5555", 2.0)
    assert backend.node_name == "gpu-7"  # a remote hostengine names its node
    monkeypatch.setenv("NODE_NAME", "k8s-node-3")
    assert DcgmBackend.from_args(args).node_name == "k8s-node-3"
    with pytest.raises(ValueError, match=r"^--dcgm\.update-interval must be positive$"):
        DcgmBackend.from_args(parser.parse_args(["--dcgm.update-interval", "0"]))
    assert backend_class("dcgm") is DcgmBackend


class _Pods:
    """Attribution stand-in: records what the backend asked and answers one pod per GPU."""

    def __init__(self) -> None:
        self.asked: list[tuple[dict, dict | None]] = []

    def process_owner(self, pid: int) -> None:
        return None

    def allocations(self, gpu_index_by_uuid, mig_by_uuid=None) -> list[Allocation]:
        self.asked.append((dict(gpu_index_by_uuid), mig_by_uuid and dict(mig_by_uuid)))
        allocations = [
            Allocation(gpu=i, pod=f"p{i}", namespace="ns", tenant="ns")
            for i in gpu_index_by_uuid.values()
        ]
        for gpu, gi in (mig_by_uuid or {}).values():
            allocations.append(Allocation(gpu=gpu, pod="mig-pod", gpu_instance_id=gi))
        return allocations


def test_attribution_gets_gpu_and_mig_uuids(fake):
    pods = _Pods()
    backend = _backend(attribution=pods)
    node = backend.collect().nodes[0]
    assert pods.asked == [({"GPU-aaaa": 0, "GPU-bbbb": 1}, {"MIG-1111": (1, 2)})]
    assert sorted((a.gpu, a.pod, a.gpu_instance_id or 0) for a in node.allocations) == [
        (0, "p0", 0),
        (1, "mig-pod", 2),
        (1, "p1", 0),
    ]
    assert node.gpus[1].mig_instances[0].uuid == "MIG-1111"
    assert node.gpus[1].mig_instances[1].uuid == ""
    backend.close()


def test_attribution_failure_is_counted_not_fatal(fake):
    class Broken(_Pods):
        def allocations(self, gpu_index_by_uuid, mig_by_uuid=None):
            raise RuntimeError("kubelet went away")

    collection = _backend(attribution=Broken()).collect()
    assert collection.errors["attribution.allocations"] == 1
    assert len(collection.nodes[0].gpus) == 2
