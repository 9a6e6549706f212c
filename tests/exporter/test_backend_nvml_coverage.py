"""What the NVML backend reads beyond utilization and memory, as the exporters users compare us
with export it: fan, P-state, compute mode, power limits, clocks, the NVSwitch fabric, the
driver's recommended recovery action, NVLink traffic, a vGPU guest's license, the last XID, and
a MIG instance's engine, tensor and DRAM activity."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pynvml
import pytest

from tests.exporter.nvml_backends import Factory, backends, gpus_of, has
from tests.fakes.fake_pynvml import MIB, FakeMig, hgx_h100, two_islands


@pytest.fixture
def make_backend() -> Iterator[Factory]:
    with backends() as make:
        yield make


def test_fan_pstate_mode_limits_and_clocks_in_base_units(make_backend):
    fake = two_islands()
    pcie = fake.gpus[1]
    pcie.fan_percent, pcie.pstate = 45, 2
    pcie.compute_mode = pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    pcie.power_limit_max_mw, pcie.power_limit_default_mw = 400_000, 300_000
    pcie.sm_clock_mhz, pcie.video_clock_mhz = 1410, 1275
    collection = make_backend(fake).collect()
    passive, fanned = gpus_of(collection)[0], gpus_of(collection)[1]

    assert passive.fan_speed_ratio is None  # an SXM board has no fan of its own
    assert fanned.fan_speed_ratio == pytest.approx(0.45)
    assert (passive.performance_state, fanned.performance_state) == (0, 2)
    assert (passive.compute_mode, fanned.compute_mode) == ("default", "exclusive_process")
    assert fanned.power_limit_max_watts == 400.0 and fanned.power_limit_default_watts == 300.0
    assert fanned.graphics_clock_hertz == 1410e6 and fanned.video_clock_hertz == 1275e6
    assert not collection.errors  # the missing fan is not supported, not a failure


def test_fabric_state_and_a_registration_that_failed(make_backend):
    fake = hgx_h100(3)
    fake.gpus[1].fabric_state = pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS
    fake.gpus[2].fabric_status = pynvml.NVML_ERROR_UNKNOWN  # completed, with an error
    gpus = gpus_of(make_backend(fake).collect())
    assert [(g.fabric_state, g.fabric_error) for g in gpus] == [(3, False), (2, False), (3, True)]

    off_fabric = gpus_of(make_backend(two_islands()).collect())[0]
    assert (off_fabric.fabric_state, off_fabric.fabric_error) == (None, None)


def test_fabric_falls_back_to_the_first_call_on_a_driver_without_the_versioned_one(make_backend):
    fake = hgx_h100(1)
    fake.inject("nvmlDeviceGetGpuFabricInfoV", pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    reading = gpus_of(make_backend(fake).collect())[0]
    assert reading.fabric_state == pynvml.NVML_GPU_FABRIC_STATE_COMPLETED


def test_the_drivers_recommended_recovery_action(make_backend):
    fake = hgx_h100(3)
    fake.gpus[1].recovery_action = 1  # NVML_GPU_RECOVERY_ACTION_GPU_RESET
    fake.gpus[2].recovery_action = None  # a driver that does not know the field yet
    gpus = gpus_of(make_backend(fake).collect())
    if not has("NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"):  # nvidia-ml-py before 12.570
        assert [g.recovery_action for g in gpus] == [None, None, None]
        return
    assert [g.recovery_action for g in gpus] == [0, 1, None]


def test_recovery_action_without_the_constant_is_left_out(make_backend):
    fake = hgx_h100(1)
    fake.gpus[0].recovery_action = 4
    fake.hidden = frozenset({"NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"})  # a release before 12.570
    collection = make_backend(fake).collect()
    assert gpus_of(collection)[0].recovery_action is None and not collection.errors


def test_nvlink_traffic_is_a_rate_over_the_drivers_time_between_collections(make_backend):
    fake = hgx_h100(2)
    fake.gpus[0].nvlink_kib_per_s = 10 * 1024 * 1024  # 10 GiB/s each way
    backend = make_backend(fake)
    first = gpus_of(backend.collect())[0]
    assert first.nvlink_bytes_per_second is None  # one reading is no rate yet
    fake.advance(2.0)
    second = gpus_of(backend.collect())
    assert second[0].nvlink_bytes_per_second == pytest.approx(2 * 10 * 2**30, rel=1e-6)
    assert second[1].nvlink_bytes_per_second == 0.0
    no_nvlink = two_islands()
    no_nvlink.gpus[0].nvlink_kib_per_s = None
    assert gpus_of(make_backend(no_nvlink).collect())[0].nvlink_bytes_per_second is None


def test_vgpu_license_is_read_in_a_vgpu_guest_only(make_backend):
    fake = hgx_h100(3)
    for gpu in fake.gpus[1:]:
        gpu.virtualization_mode = pynvml.NVML_GPU_VIRTUALIZATION_MODE_VGPU
    fake.gpus[2].vgpu_licensed = False
    gpus = gpus_of(make_backend(fake).collect())
    assert [g.vgpu_licensed for g in gpus] == [None, True, False]
    assert fake.calls[("nvmlDeviceGetGridLicensableFeatures", 0)] == 0  # bare metal: not asked


def test_last_xid_code_is_zero_until_one_arrives(make_backend):
    fake = hgx_h100(2)
    backend = make_backend(fake)
    assert [g.xid_last_code for g in gpus_of(backend.collect())] == [0, 0]
    fake.push_xid(1, 13)
    fake.push_xid(1, 31)
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        gpus = gpus_of(backend.collect())
        if gpus[1].xid_last_code == 31:
            break
        time.sleep(0.01)
    assert [g.xid_last_code for g in gpus] == [0, 31]


def test_a_mig_instance_reads_engine_tensor_and_dram_activity(make_backend):
    fake = hgx_h100(1)
    gpu = fake.gpus[0]
    gpu.mig_enabled = True
    gpu.migs = [
        FakeMig(1, 0, "3g.40gb", 3, 40192 * MIB, 30000 * MIB, None, 99.6, 60.0, 45.0),
        FakeMig(2, 0, "3g.40gb", 3, 40192 * MIB, 0, None, 0.0, 0.0, 0.0),
    ]
    backend = make_backend(fake)
    backend.collect()
    fake.advance(1.0)
    (busy, idle) = gpus_of(backend.collect())[0].mig_instances
    assert busy.graphics_engine_active_ratio == pytest.approx(0.996)
    assert busy.tensor_active_ratio == pytest.approx(0.6)
    assert busy.dram_active_ratio == pytest.approx(0.45)
    assert busy.sm_active_ratio is None  # SM activity where GPM gives it, not made up
    assert busy.activity_ratio == pytest.approx(0.996)
    assert idle.activity_ratio == 0.0
