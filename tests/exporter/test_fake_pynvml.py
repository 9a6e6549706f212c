"""The NVML fake answers as real NVML does where the exporter depends on the answer."""

from __future__ import annotations

import re

import pynvml
import pytest

from tests.fakes.fake_pynvml import MIB, FakeGpu, FakeMig, FakeNvml, hgx_h100, two_islands

REMAPPED_FIELDS = (
    pynvml.NVML_FI_DEV_REMAPPED_COR,
    pynvml.NVML_FI_DEV_REMAPPED_UNC,
    pynvml.NVML_FI_DEV_REMAPPED_PENDING,
    pynvml.NVML_FI_DEV_REMAPPED_FAILURE,
)


def started(fake: FakeNvml) -> tuple[FakeNvml, object]:
    fake.nvmlInit()
    return fake, fake.nvmlDeviceGetHandleByIndex(0)


def mig(gi: int, ci: int = 0, **kwargs: object) -> FakeMig:
    values: dict = {"profile": "3g.40gb", "slices": 3, "memory_total": 40192 * MIB}
    values.update(kwargs)
    return FakeMig(gpu_instance_id=gi, compute_instance_id=ci, **values)


def error_of(call, *args) -> int:
    with pytest.raises(pynvml.NVMLError) as raised:
        call(*args)
    return raised.value.value


def test_remapped_rows_are_not_supported_under_mig_with_instances():
    fake, handle = started(hgx_h100(1))
    gpu = fake.gpus[0]
    gpu.remap_failure = True
    assert fake.nvmlDeviceGetRemappedRows(handle)[3] == 1

    gpu.mig_enabled = True  # MIG on, no instance yet: still answered
    assert fake.nvmlDeviceGetRemappedRows(handle)[3] == 1
    gpu.migs = [mig(1)]
    assert error_of(fake.nvmlDeviceGetRemappedRows, handle) == pynvml.NVML_ERROR_NOT_SUPPORTED
    slots = fake.nvmlDeviceGetFieldValues(handle, list(REMAPPED_FIELDS))
    assert {slot.nvmlReturn for slot in slots} == {pynvml.NVML_ERROR_NOT_SUPPORTED}

    gpu.mig_enabled, gpu.migs = False, []
    slots = fake.nvmlDeviceGetFieldValues(handle, list(REMAPPED_FIELDS))
    assert {slot.nvmlReturn for slot in slots} == {pynvml.NVML_SUCCESS}


def test_gpm_is_hopper_and_later_only():
    a100, a100_handle = started(two_islands())
    h100, h100_handle = started(hgx_h100(1))
    assert a100.nvmlGpmQueryDeviceSupport(a100_handle).isSupportedDevice == 0
    assert h100.nvmlGpmQueryDeviceSupport(h100_handle).isSupportedDevice == 1
    sample = a100.nvmlGpmSampleAlloc()
    unsupported = pynvml.NVML_ERROR_NOT_SUPPORTED
    assert error_of(a100.nvmlGpmSampleGet, a100_handle, sample) == unsupported


def test_gpm_integrates_once_per_gpu_instance_with_two_compute_instances():
    fake, handle = started(hgx_h100(1))
    gpu = fake.gpus[0]
    gpu.mig_enabled = True
    gpu.migs = [mig(1, 0, profile="1c.3g.40gb", sm_util=40.0), mig(1, 1, sm_util=40.0)]
    first, second = fake.nvmlGpmSampleAlloc(), fake.nvmlGpmSampleAlloc()
    fake.nvmlGpmMigSampleGet(handle, 1, first)
    fake.advance(2.0)
    fake.nvmlGpmMigSampleGet(handle, 1, second)

    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = 1
    request.sample1, request.sample2 = first, second
    request.metrics[0].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
    fake.nvmlGpmMetricsGet(request)
    assert request.metrics[0].value == pytest.approx(40.0)  # not 80: one GPU instance


def test_mig_devices_have_real_looking_distinct_uuids():
    shape = re.compile(r"^MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
    devices = [mig(1, 0), mig(1, 1), mig(2, 0)]
    assert all(shape.match(device.uuid) for device in devices)
    assert len({device.uuid for device in devices}) == 3
    assert mig(3, uuid="MIG-given").uuid == "MIG-given"


def test_violation_reference_time_is_microseconds():
    fake, handle = started(hgx_h100(1))
    fake.gpus[0].violation_ns = {pynvml.NVML_PERF_POLICY_POWER: 2_500_000_000}
    status = fake.nvmlDeviceGetViolationStatus(handle, pynvml.NVML_PERF_POLICY_POWER)
    assert status.referenceTime == fake.now_us
    assert status.violationTime == 2_500_000_000  # ns


def test_ecc_counts_reject_an_invalid_error_or_counter_type():
    fake, handle = started(hgx_h100(1))
    fake.gpus[0].ecc_corrected = 7
    corrected = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
    for counter in (pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC):
        assert fake.nvmlDeviceGetTotalEccErrors(handle, corrected, counter) == 7
    invalid = pynvml.NVML_ERROR_INVALID_ARGUMENT
    assert error_of(fake.nvmlDeviceGetTotalEccErrors, handle, corrected, 7) == invalid
    aggregate = pynvml.NVML_AGGREGATE_ECC
    assert error_of(fake.nvmlDeviceGetTotalEccErrors, handle, 5, aggregate) == invalid


def test_handle_by_index_errors_can_be_injected_for_one_gpu():
    fake = hgx_h100(2)
    fake.nvmlInit()
    fake.inject("nvmlDeviceGetHandleByIndex", pynvml.NVML_ERROR_NO_PERMISSION, gpu=1)
    assert fake.nvmlDeviceGetHandleByIndex(0) is not None
    assert error_of(fake.nvmlDeviceGetHandleByIndex, 1) == pynvml.NVML_ERROR_NO_PERMISSION


# ----- sessions: enumeration fixed at init, handles of an ended session refused ------------------


def test_gpus_are_listed_when_a_session_begins_and_renumbered():
    fake = hgx_h100(3)
    fake.nvmlInit()
    third = fake.gpus[2]
    gone = fake.unplug(1)
    fake.plug(FakeGpu(index=9, bus=0x01))  # in PCI bus order: first
    assert fake.nvmlDeviceGetCount() == 3  # the list of this session
    assert error_of(fake.nvmlDeviceGetHandleByIndex, 1) == pynvml.NVML_ERROR_GPU_IS_LOST

    fake.nvmlInit()  # reference counted: no new list
    fake.nvmlShutdown()
    assert fake.nvmlDeviceGetCount() == 3 and fake.sessions == 1

    fake.nvmlShutdown()
    fake.nvmlInit()
    assert fake.sessions == 2 and fake.nvmlDeviceGetCount() == 3
    uuids = [fake.nvmlDeviceGetUUID(fake.nvmlDeviceGetHandleByIndex(i)) for i in range(3)]
    assert gone.uuid not in uuids and uuids[0] == fake.gpus[0].uuid  # bus 0x01 comes first
    assert uuids[2] == third.uuid and third.index == 2
    handle = fake.nvmlDeviceGetHandleByIndex(2)
    assert fake.nvmlDeviceGetIndex(handle) == 2
    assert fake.fresh_enumeration() == uuids


def test_handles_event_sets_and_samples_of_an_ended_session_are_refused():
    fake, handle = started(hgx_h100(2))
    event_set = fake.nvmlEventSetCreate()
    sample = fake.nvmlGpmSampleAlloc()
    fake.nvmlShutdown()
    uninitialized = pynvml.NVML_ERROR_UNINITIALIZED
    assert error_of(fake.nvmlDeviceGetPowerUsage, handle) == uninitialized

    fake.nvmlInit()  # a new session: the old pointers are not its own
    assert error_of(fake.nvmlDeviceGetPowerUsage, handle) == uninitialized
    assert error_of(fake.nvmlEventSetWait, event_set, 1) == uninitialized
    fresh = fake.nvmlDeviceGetHandleByIndex(0)
    assert error_of(fake.nvmlGpmSampleGet, fresh, sample) == uninitialized
    assert fake.stale_uses == 4
    assert fake.nvmlDeviceGetPowerUsage(fresh) == 70_000


def test_shutdown_under_a_waiting_event_thread_is_counted_and_ends_the_wait():
    import threading

    fake, handle = started(hgx_h100(1))
    event_set = fake.nvmlEventSetCreate()
    fake.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
    answers: list[int] = []
    waiter = threading.Thread(
        target=lambda: answers.append(error_of(fake.nvmlEventSetWait, event_set, 5000))
    )
    waiter.start()
    while not fake._waiting:
        threading.Event().wait(0.001)
    fake.nvmlShutdown()
    waiter.join(2.0)
    assert answers == [pynvml.NVML_ERROR_UNINITIALIZED] and fake.shutdown_races == 1


def test_fabric_info_is_written_into_the_struct_the_caller_passes_by_reference():
    import ctypes

    fake, handle = started(hgx_h100(1))
    plain = pynvml.c_nvmlGpuFabricInfo_t()
    assert fake.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(plain)) == pynvml.NVML_SUCCESS
    assert plain.state == pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
    if hasattr(pynvml, "nvmlDeviceGetGpuFabricInfoV"):  # nvidia-ml-py from 12.550 on
        info = pynvml.c_nvmlGpuFabricInfoV_t()  # its constructor sets the struct version
        assert fake.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info)) == 0
        assert (info.state, info.status) == (pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, 0)
        unversioned = pynvml.c_nvmlGpuFabricInfoV_t()
        unversioned.version = 0
        code = error_of(fake.nvmlDeviceGetGpuFabricInfoV, handle, ctypes.byref(unversioned))
        assert code == pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    off, off_handle = started(two_islands())
    plain = pynvml.c_nvmlGpuFabricInfo_t()
    off.nvmlDeviceGetGpuFabricInfo(off_handle, ctypes.byref(plain))
    assert plain.state == pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED


def test_a_board_without_a_fan_answers_not_supported():
    fake, handle = started(hgx_h100(1))
    assert error_of(fake.nvmlDeviceGetFanSpeed, handle) == pynvml.NVML_ERROR_NOT_SUPPORTED
    fake.gpus[0].fan_percent = 30
    assert fake.nvmlDeviceGetFanSpeed(handle) == 30


def test_nvlink_counters_sum_over_links_only_with_the_all_links_scope():
    fake, handle = started(hgx_h100(1))
    fake.gpus[0].nvlink_kib_per_s = 1800.0
    fake.advance(1.0)
    fields = [pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX]
    one_link = fake.nvmlDeviceGetFieldValues(handle, [(fields[0], 0)])[0].value.ullVal
    every_link = fake.nvmlDeviceGetFieldValues(handle, [(fields[0], 0xFFFFFFFF)])[0].value.ullVal
    assert (one_link, every_link) == (100, 1800)  # 18 active links share the traffic


def test_a_release_without_a_function_has_no_attribute_for_it():
    fake = hgx_h100(1)
    fake.hidden = frozenset({"nvmlDeviceGetNumaNodeId"})
    assert not hasattr(fake, "nvmlDeviceGetNumaNodeId")
    assert hasattr(fake, "nvmlDeviceGetCpuAffinity")
