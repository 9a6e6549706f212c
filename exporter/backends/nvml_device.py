"""What one GPU says through NVML in a cycle: its live readings, its MIG instances, and its
CPU affinity as a list. Stateless: the backend (`nvml`) owns the session, the handles and the
samplers; these functions only ask `NvmlCalls` (which counts and memoises failures) and fill a
`GpuReading`, so that one GPU's calls read the same whichever session or rescan holds it.
"""

from __future__ import annotations

import ctypes
import re
from typing import Any

from exporter.backends.nvml_calls import NvmlCalls
from exporter.backends.nvml_fields import number, scaled
from exporter.readings import CLOCK_EVENT_REASONS, COMPUTE_MODES, GpuReading, MigInstance

# Clock-event reason bits, in the order of CLOCK_EVENT_REASONS.
_REASON_BITS = (
    "nvmlClocksEventReasonGpuIdle",
    "nvmlClocksEventReasonApplicationsClocksSetting",
    "nvmlClocksEventReasonSwPowerCap",
    "nvmlClocksEventReasonHwSlowdown",
    "nvmlClocksEventReasonSyncBoost",
    "nvmlClocksEventReasonSwThermalSlowdown",
    "nvmlClocksEventReasonHwThermalSlowdown",
    "nvmlClocksEventReasonHwPowerBrakeSlowdown",
    "nvmlClocksEventReasonDisplayClockSetting",
)
# "... MIG 3g.40gb", or "... MIG 1c.3g.40gb" for a compute instance smaller than its GPU
# instance: the GPU instance's profile is the part after the "Nc." prefix.
_MIG_PROFILE = re.compile(r"MIG\s+(?:\d+c\.)?(\S+)")


def read_live(nvml: Any, calls: NvmlCalls, s: str, h: Any, r: GpuReading) -> None:
    """Utilization, memory, temperature, power, clocks and clock-event reasons of the GPU with
    handle `h` (scope `s`) into `r`; what fails stays None."""
    util = calls(s, "nvmlDeviceGetUtilizationRates", h)
    if util is not None:
        r.utilization_ratio = util.gpu / 100.0
        r.memory_utilization_ratio = util.memory / 100.0
    enc = calls(s, "nvmlDeviceGetEncoderUtilization", h)
    r.encoder_utilization_ratio = enc[0] / 100.0 if enc is not None else None
    dec = calls(s, "nvmlDeviceGetDecoderUtilization", h)
    r.decoder_utilization_ratio = dec[0] / 100.0 if dec is not None else None
    read_memory(nvml, calls, s, h, r)
    r.temperature_celsius = number(
        calls(s, "nvmlDeviceGetTemperature", h, nvml.NVML_TEMPERATURE_GPU)
    )
    r.power_watts = scaled(calls(s, "nvmlDeviceGetPowerUsage", h), 1e-3)
    r.power_limit_watts = scaled(calls(s, "nvmlDeviceGetEnforcedPowerLimit", h), 1e-3)
    limits = calls(s, "nvmlDeviceGetPowerManagementLimitConstraints", h)  # [min, max] mW
    r.power_limit_max_watts = scaled(limits[1], 1e-3) if limits is not None else None
    r.power_limit_default_watts = scaled(
        calls(s, "nvmlDeviceGetPowerManagementDefaultLimit", h), 1e-3
    )
    fan = calls(s, "nvmlDeviceGetFanSpeed", h)  # NOT_SUPPORTED on passively cooled boards
    r.fan_speed_ratio = scaled(fan, 1e-2)
    pstate = calls(s, "nvmlDeviceGetPerformanceState", h)
    r.performance_state = int(pstate) if pstate is not None and 0 <= pstate <= 15 else None
    mode = calls(s, "nvmlDeviceGetComputeMode", h)
    r.compute_mode = COMPUTE_MODES.get(int(mode), "") if mode is not None else ""
    for attr, clock in (
        ("sm_clock_hertz", "NVML_CLOCK_SM"),
        ("memory_clock_hertz", "NVML_CLOCK_MEM"),
        ("graphics_clock_hertz", "NVML_CLOCK_GRAPHICS"),
        ("video_clock_hertz", "NVML_CLOCK_VIDEO"),
    ):
        key = f"clock_{clock.removeprefix('NVML_CLOCK_').lower()}"
        value = calls(s, "nvmlDeviceGetClockInfo", h, getattr(nvml, clock), key=key)
        setattr(r, attr, scaled(value, 1e6))
    reasons = calls(s, "nvmlDeviceGetCurrentClocksEventReasons", h)
    if reasons is None and not calls.supported(s, "nvmlDeviceGetCurrentClocksEventReasons"):
        reasons = calls(s, "nvmlDeviceGetCurrentClocksThrottleReasons", h)
    if reasons is not None:
        r.clock_event_active = {
            name: bool(int(reasons) & getattr(nvml, bit, 0))
            for name, bit in zip(CLOCK_EVENT_REASONS, _REASON_BITS, strict=True)
        }


def read_fabric(nvml: Any, calls: NvmlCalls, s: str, h: Any, r: GpuReading) -> None:
    """The GPU's NVSwitch fabric registration (HGX/DGX boards, GB200 racks): the versioned
    call (drivers from 550), else the first one; nothing on a GPU that is on no fabric."""
    info = None
    if calls.supported(s, "nvmlDeviceGetGpuFabricInfoV") and hasattr(
        nvml, "c_nvmlGpuFabricInfoV_t"
    ):
        info = nvml.c_nvmlGpuFabricInfoV_t()  # its constructor sets the struct version
        if calls(s, "nvmlDeviceGetGpuFabricInfoV", h, ctypes.byref(info)) is None:
            info = None
    if info is None and hasattr(nvml, "c_nvmlGpuFabricInfo_t"):
        info = nvml.c_nvmlGpuFabricInfo_t()
        if calls(s, "nvmlDeviceGetGpuFabricInfo", h, ctypes.byref(info)) is None:
            info = None
    if info is None or int(info.state) == nvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED:
        return
    r.fabric_state = int(info.state)
    completed = r.fabric_state == nvml.NVML_GPU_FABRIC_STATE_COMPLETED
    r.fabric_error = completed and int(info.status) != nvml.NVML_SUCCESS


def read_vgpu_license(nvml: Any, calls: NvmlCalls, s: str, h: Any, r: GpuReading) -> None:
    """A vGPU guest's license (any licensable feature enabled: licensed); the caller asks only
    inside a vGPU virtual machine, where it applies."""
    features = calls(s, "nvmlDeviceGetGridLicensableFeatures", h)
    if features is None or not features.isGridLicenseSupported:
        return
    count = min(int(features.licensableFeaturesCount), len(features.gridLicensableFeatures))
    states = [int(features.gridLicensableFeatures[i].featureState) for i in range(count)]
    r.vgpu_licensed = any(state == 1 for state in states)


def read_memory(nvml: Any, calls: NvmlCalls, s: str, h: Any, r: GpuReading) -> None:
    """v2 (driver >= 515: `used` excludes reserved memory), else the v1 struct."""
    version = getattr(nvml, "nvmlMemory_v2", None)
    memory = None
    if version is not None and calls.supported(s, "memory_v2"):
        memory = calls(s, "nvmlDeviceGetMemoryInfo", h, version=version, key="memory_v2")
        if memory is not None:
            r.memory_reserved_bytes = float(memory.reserved)
    if memory is None and (version is None or not calls.supported(s, "memory_v2")):
        memory = calls(s, "nvmlDeviceGetMemoryInfo", h)
    if memory is not None:
        r.memory_total_bytes = float(memory.total)
        r.memory_used_bytes = float(memory.used)
        r.memory_free_bytes = float(memory.free)


def read_mig(nvml: Any, calls: NvmlCalls, s: str, h: Any, r: GpuReading) -> dict[int, MigInstance]:
    """The GPU's MIG mode into `r.mig_enabled` (None where NVML cannot say) and, with MIG on,
    its instances by GPU-instance id, for the caller to sample and append.

    A MIG device is one compute instance; memory belongs to its GPU instance, so it is read once
    per GPU instance however many compute instances it holds."""
    mode = calls(s, "nvmlDeviceGetMigMode", h)
    if mode is None:
        return {}
    r.mig_enabled = mode[0] == nvml.NVML_DEVICE_MIG_ENABLE
    if not r.mig_enabled:
        return {}
    slots = calls(s, "nvmlDeviceGetMaxMigDeviceCount", h) or 0
    mig_scope = f"{s}/mig"
    absent = (nvml.NVML_ERROR_NOT_FOUND, nvml.NVML_ERROR_INVALID_ARGUMENT)
    by_gi: dict[int, MigInstance] = {}
    for slot in range(slots):
        mh = calls(
            s, "nvmlDeviceGetMigDeviceHandleByIndex", h, slot, key="mig_handle", quiet=absent
        )
        if mh is None:
            continue
        gi = calls(mig_scope, "nvmlDeviceGetGpuInstanceId", mh)
        if gi is None:
            continue
        ci = calls(mig_scope, "nvmlDeviceGetComputeInstanceId", mh)
        ci_id = int(ci) if ci is not None else 0
        uuid = calls(mig_scope, "nvmlDeviceGetUUID", mh) or ""
        instance = by_gi.get(int(gi))
        if instance is None:
            memory = calls(mig_scope, "nvmlDeviceGetMemoryInfo", mh)
            instance = by_gi[int(gi)] = MigInstance(
                gpu_instance_id=int(gi),
                compute_instance_id=ci_id,
                profile=mig_profile(calls, mig_scope, mh),
                uuid=uuid,
                memory_total_bytes=float(memory.total) if memory is not None else None,
                memory_used_bytes=float(memory.used) if memory is not None else None,
            )
        elif ci_id < instance.compute_instance_id:  # the lowest one names the instance
            instance.compute_instance_id, instance.uuid = ci_id, uuid
        instance.compute_instances[ci_id] = uuid
    return by_gi


def mig_profile(calls: NvmlCalls, scope: str, mig_handle: Any) -> str:
    """ "1g.10gb" from the MIG device name, else from its slice count and memory size."""
    name = calls(scope, "nvmlDeviceGetName", mig_handle) or ""
    match = _MIG_PROFILE.search(name)
    if match:
        return match.group(1)
    attrs = calls(scope, "nvmlDeviceGetAttributes", mig_handle)
    if attrs is None:
        return ""
    gib = -(-int(attrs.memorySizeMB) // 1024)  # NVIDIA rounds the size up in names
    return f"{int(attrs.gpuInstanceSliceCount)}g.{gib}gb"


def cpu_list(words: Any) -> str:
    """Render NVML's CPU-affinity bitmask (64-bit words, lowest first) as "0-31,64-95"."""
    cpus = [
        word_index * 64 + bit
        for word_index, word in enumerate(words)
        for bit in range(64)
        if int(word) >> bit & 1
    ]
    ranges: list[str] = []
    start = prev = None
    for cpu in [*cpus, None]:
        if start is not None and cpu == prev + 1:
            prev = cpu
            continue
        if start is not None:
            ranges.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = cpu
    return ",".join(ranges)
