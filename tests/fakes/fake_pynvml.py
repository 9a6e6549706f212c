"""A faithful in-memory stand-in for the `pynvml` module (nvidia-ml-py).

Constants, ctypes structs and the `NVMLError_*` classes are the real module's (importing
`pynvml` works without a GPU; only `nvmlInit` needs the driver), so error values, class
names and struct attribute names are identical to production. The NVML functions are
replaced by methods over a configurable machine: GPUs, MIG devices, processes, NVLink
wiring, PCIe topology, queued XID events, injected per-call errors and init failures.
Device handles, event sets and GPM samples are real ctypes pointers, as from the driver.

Sessions are modelled as NVML has them: `nvmlInit` is reference counted, and only the call
that takes the count from 0 to 1 enumerates the GPUs (in `gpus` order, which is PCI bus order
on a real node, numbering them 0..n-1 again). A GPU plugged in later is not listed before the
next such init; one unplugged (`unplug`) answers GPU_IS_LOST until then and is gone after it.
A handle, event set or GPM sample from a session that was shut down answers
NVML_ERROR_UNINITIALIZED (and counts in `stale_uses`), so a test proves none is kept; a
shutdown while another thread waits in `nvmlEventSetWait` counts in `shutdown_races`.

An NVML function the fake does not model raises `NVMLError_FunctionNotFound`, which is
what an older driver does, so code under test must already cope with it. A function the fake
models but the installed nvidia-ml-py release lacks is absent (AttributeError), as it is from
that release's module: the fake's names are the real module's, whichever release that is (the
backend tests run against the oldest and the newest supported one, `test_nvml_releases`).
"""

from __future__ import annotations

import ctypes
import itertools
import re
import threading
import types
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml as real

MIB = 1024**2
GIB = 1024**3
NOT_MIG = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId the driver reports outside MIG

# Helpers of the real module that are plain Python, not NVML calls: pass them through.
_PASS_THROUGH = {"nvmlStructToFriendlyObject", "nvmlExceptionClass", "nvmlFriendlyObject"}
# GPM exists on Hopper and later only (nvmlGpmQueryDeviceSupport says no on A100, L40S, V100).
_GPM_MODELS = re.compile(r"\b(G?H\d{2,3}|G?B\d{3})\b")
_MIG_SERIAL = itertools.count(1)  # makes every FakeMig's default UUID unique


@dataclass
class FakeLink:
    """One NVLink: where it lands (a peer GPU or an NVSwitch) and whether it is up."""

    remote_bus_id: str
    remote_type: int = real.NVML_NVLINK_DEVICE_TYPE_GPU
    active: bool = True


@dataclass
class FakeMig:
    """A MIG device: one compute instance of a GPU instance. Several devices with the same
    `gpu_instance_id` are compute instances sharing that GPU instance (give them the same
    memory and GPM figures: NVML reports those per GPU instance)."""

    gpu_instance_id: int
    compute_instance_id: int
    profile: str  # "1g.10gb"; "1c.3g.40gb" for a compute instance smaller than its GPU instance
    slices: int  # slices of the GPU instance
    memory_total: int
    memory_used: int = 0
    sm_util: float | None = None  # GPM SM_UTIL percent for this GPU instance
    engine_util: float | None = None  # GPM GRAPHICS_UTIL percent (its engine activity)
    tensor_util: float | None = None  # GPM ANY_TENSOR_UTIL percent
    dram_util: float | None = None  # GPM DRAM_BW_UTIL percent
    uuid: str = ""  # default: a "MIG-<uuid>" like the driver's, unique per FakeMig

    def __post_init__(self) -> None:
        if not self.uuid:
            n = next(_MIG_SERIAL)
            gi, ci = self.gpu_instance_id, self.compute_instance_id
            self.uuid = f"MIG-{n:08x}-{gi:04x}-5{ci:03x}-8000-{n:012x}"


@dataclass
class FakeProcess:
    pid: int
    name: str
    used_memory: int | None
    kind: str = "compute"  # or "graphics"
    gpu_instance_id: int = NOT_MIG
    compute_instance_id: int = NOT_MIG
    sm_util: int | None = None  # percent; a sample is produced on every advance()


@dataclass
class FakeGpu:
    index: int
    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = ""
    bus: int = 0x18
    serial: str = ""
    vbios: str = "96.00.99.00.01"
    memory_total: int = 81559 * MIB
    memory_reserved: int = 544 * MIB
    memory_used: int = 0
    memory_v2: bool = True  # False: driver older than 515, only the v1 struct exists
    util_gpu: int = 0
    util_memory: int = 0
    encoder: int = 0
    decoder: int = 0
    temperature: int = 35
    memory_temperature: int | None = 40  # None: not reported (GDDR boards)
    power_mw: int = 70_000
    power_limit_mw: int = 700_000
    power_limit_min_mw: int = 200_000
    power_limit_max_mw: int = 700_000
    power_limit_default_mw: int = 700_000
    energy_mj: int = 1_000_000
    fan_percent: int | None = None  # None: no fan (SXM boards are cooled by the chassis)
    pstate: int = 0
    compute_mode: int = real.NVML_COMPUTEMODE_DEFAULT
    sm_clock_mhz: int = 1980
    mem_clock_mhz: int = 2619
    video_clock_mhz: int = 1755
    # NVSwitch fabric (nvmlGpuFabricState_t; None: on no fabric) and the registration's result
    fabric_state: int | None = None
    fabric_status: int = real.NVML_SUCCESS
    virtualization_mode: int = 0  # NVML_GPU_VIRTUALIZATION_MODE_*: 0 bare metal, 2 vGPU guest
    vgpu_licensed: bool = True  # in a vGPU guest: the licensable feature is enabled
    recovery_action: int | None = 0  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION; None: older driver
    nvlink_kib_per_s: float | None = None  # data over all NVLinks each way; None: no NVLink
    nvlink_tx_kib: float = 0.0  # the driver's counters (advance() adds to them)
    nvlink_rx_kib: float = 0.0
    clock_events: int = real.nvmlClocksEventReasonGpuIdle
    violation_ns: dict[int, int] = field(default_factory=dict)  # NVML_PERF_POLICY_* -> ns
    pcie_tx_kbs: int = 0
    pcie_rx_kbs: int = 0
    pcie_replay: int = 0
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    retired_sbe: int = 0
    retired_dbe: int = 0
    retired_pending: bool = False
    remap_correctable: int = 0
    remap_uncorrectable: int = 0
    remap_pending: bool = False
    remap_failure: bool = False
    numa_node: int = 0
    cpus: tuple[int, ...] = tuple(range(0, 32))
    socket: int = 0
    pcie_switch: int = 0  # GPUs with the same switch id share a PCIe switch
    gpm_supported: bool | None = None  # None: as the model says (Hopper and later only)
    gpm: dict[int, float] = field(default_factory=dict)  # NVML_GPM_METRIC_* -> percent
    mig_enabled: bool = False
    max_mig_devices: int = 7
    migs: list[FakeMig] = field(default_factory=list)
    processes: list[FakeProcess] = field(default_factory=list)
    process_api: int = 3  # 2: driver without the _v3 process queries
    links: list[FakeLink] = field(default_factory=list)
    nvlink_slots: int = 18  # link indices beyond this answer InvalidArgument
    unsupported_fields: set[int] = field(default_factory=set)
    xid_events_supported: bool = True
    lost: bool = False

    def __post_init__(self) -> None:
        self.uuid = self.uuid or f"GPU-{self.index:08x}-0000-4000-8000-{self.bus:012x}"
        self.serial = self.serial or f"165{self.index:010d}"
        if self.gpm_supported is None:
            self.gpm_supported = bool(_GPM_MODELS.search(self.name))

    @property
    def bus_id(self) -> str:
        return f"00000000:{self.bus:02X}:00.0"

    @property
    def mig_active(self) -> bool:
        """MIG on with instances: NVML then has no remapped-row answer for the whole GPU."""
        return self.mig_enabled and bool(self.migs)


def bus_id_of(bus: int) -> str:
    return f"00000000:{bus:02X}:00.0"


class _Struct(ctypes.Structure):
    """Backing store for one opaque handle; only its address matters."""

    _fields_ = [("tag", ctypes.c_uint)]


class FakeNvml:
    """The fake module: attribute access falls through to the real pynvml for constants."""

    def __init__(
        self,
        gpus: list[FakeGpu],
        *,
        driver_version: str = "550.54.15",
        cuda_version: int = 12040,
        process_names: dict[int, str] | None = None,
    ) -> None:
        self.gpus = gpus
        self.driver_version = driver_version
        self.cuda_version = cuda_version
        self.process_names = dict(process_names or {})
        self.topology: dict[tuple[int, int], int] = {}
        self.p2p_nvlink: dict[tuple[int, int], int] = {}
        self.init_error: int | None = None
        self.init_release: threading.Event | None = None  # set: nvmlInit blocks until released
        self.initialized = 0  # nvmlInit's reference count
        self.shutdowns = 0
        self.sessions = 0  # inits that enumerated the GPUs (reference count 0 -> 1)
        self.stale_uses = 0  # calls given a handle, event set or sample of an ended session
        self.shutdown_races = 0  # nvmlShutdown while a thread waited in nvmlEventSetWait
        self.calls: Counter[tuple[str, int | None]] = Counter()
        self.now_us = 1_700_000_000_000_000
        self._injected: list[dict[str, Any]] = []
        self._lock = threading.Condition()
        self._events: deque[tuple[FakeGpu, int]] = deque()
        self._waiting = 0  # threads inside nvmlEventSetWait
        # Physical state follows the GPU's UUID; library state (handles, event sets, samples)
        # belongs to one session and carries its number.
        self._event_sets: dict[int, tuple[int, set[int]]] = {}  # -> (session, id(gpu)s)
        self._samples: dict[int, tuple[str, int | None, int, dict[int, float]]] = {}
        self._sample_session: dict[int, int] = {}
        self._gpm_integral: dict[tuple[str, int | None], dict[int, float]] = {}
        self._proc_samples: dict[str, dict[int, tuple[int, int]]] = {}  # uuid -> pid -> (ts, sm)
        self._keep: list[ctypes.Structure] = []
        self._by_address: dict[int, tuple[FakeGpu, int | None, int]] = {}
        self._enumerated: list[FakeGpu] = list(gpus)  # what the last session listed, by index
        self._gpu_handle: dict[int, Any] = {}  # id(gpu) -> this session's handle
        self._mig_handle: dict[tuple[int, int], Any] = {}
        self._fill_default_topology()

    # ----- machine configuration ---------------------------------------------------------

    def inject(
        self, call: str, error: int, *, gpu: int | None = None, times: int | None = None
    ) -> None:
        """Make `call` raise NVMLError(error) (for one GPU, or any), `times` times or forever."""
        self._injected.append({"call": call, "error": error, "gpu": gpu, "times": times})

    def clear_injected(self) -> None:
        self._injected.clear()

    def push_xid(self, gpu: int | FakeGpu, xid: int) -> None:
        """Queue an XID event as the driver would report it to registered event sets (`gpu`:
        an index of the current session, or the GPU itself)."""
        target = gpu if isinstance(gpu, FakeGpu) else self._enumerated[gpu]
        with self._lock:
            self._events.append((target, xid))
            self._lock.notify_all()

    def unplug(self, index: int) -> FakeGpu:
        """Take `gpus[index]` off the node: a live session sees it lost, the next one not."""
        return self.gpus.pop(index)

    def plug(self, gpu: FakeGpu) -> None:
        """Add a GPU in PCI bus order; NVML lists it from the next session on."""
        self.gpus.append(gpu)
        self.gpus.sort(key=lambda g: g.bus)

    def fresh_enumeration(self) -> list[str | None]:
        """What nvmlInit in another process would list now: each GPU's UUID in index order,
        None where it cannot be read (lost); raises the error such an init would get."""
        if self.init_error is not None:
            raise real.NVMLError(self.init_error)
        return [None if gpu.lost else gpu.uuid for gpu in self.gpus]

    def advance(self, seconds: float) -> None:
        """Let time pass on the GPUs: GPM counters integrate, processes produce samples."""
        self.now_us += int(seconds * 1_000_000)
        for gpu in self.gpus:
            instances = dict.fromkeys(m.gpu_instance_id for m in gpu.migs)  # once per GPU instance
            for key in [(gpu.uuid, None)] + [(gpu.uuid, gi) for gi in instances]:
                rates = self._gpm_rates(gpu, key[1])
                acc = self._gpm_integral.setdefault(key, {})
                for metric, rate in rates.items():
                    acc[metric] = acc.get(metric, 0.0) + rate * seconds
            if gpu.nvlink_kib_per_s is not None:
                gpu.nvlink_tx_kib += gpu.nvlink_kib_per_s * seconds
                gpu.nvlink_rx_kib += gpu.nvlink_kib_per_s * seconds
            samples = self._proc_samples.setdefault(gpu.uuid, {})
            for proc in gpu.processes:
                if proc.sm_util is not None:
                    samples[proc.pid] = (self.now_us, proc.sm_util)

    def _fill_default_topology(self) -> None:
        """A level for every pair of listed GPUs that has none (set ones are kept)."""
        for a in self._enumerated:
            for b in self._enumerated:
                if a.index == b.index:
                    continue
                if a.pcie_switch == b.pcie_switch and a.socket == b.socket:
                    level = real.NVML_TOPOLOGY_SINGLE
                elif a.socket == b.socket:
                    level = real.NVML_TOPOLOGY_NODE
                else:
                    level = real.NVML_TOPOLOGY_SYSTEM
                self.topology.setdefault((a.index, b.index), level)

    def _enumerate(self) -> None:
        """A new session lists the GPUs present now, numbered by position; the pairwise
        tables follow the GPUs that stay, and the handles of the old session die."""
        before = {id(gpu): gpu.index for gpu in self._enumerated}
        self._enumerated = list(self.gpus)
        moved = {
            before[id(gpu)]: index
            for index, gpu in enumerate(self._enumerated)
            if id(gpu) in before
        }
        for index, gpu in enumerate(self._enumerated):
            gpu.index = index
        self.topology = _renumbered(self.topology, moved)
        self.p2p_nvlink = _renumbered(self.p2p_nvlink, moved)
        self._fill_default_topology()
        self.sessions += 1
        self._gpu_handle = {id(gpu): self._new_handle(gpu, None) for gpu in self._enumerated}
        self._mig_handle = {}

    def _present(self, gpu: FakeGpu) -> bool:
        return any(g is gpu for g in self.gpus)

    def _stale(self) -> real.NVMLError:
        self.stale_uses += 1
        return real.NVMLError(real.NVML_ERROR_UNINITIALIZED)

    # ----- plumbing ----------------------------------------------------------------------

    hidden: frozenset[str] = frozenset()  # names to leave out as an older release does

    def __getattribute__(self, name: str) -> Any:
        # modelled here, but not in this nvidia-ml-py (or hidden: a test's older release)
        hidden = name in _ABSENT or (
            name[:1] in "nN" and name in object.__getattribute__(self, "hidden")
        )
        if hidden:
            raise AttributeError(f"module 'pynvml' has no attribute {name!r}")
        return object.__getattribute__(self, name)

    def __getattr__(self, name: str) -> Any:
        if name in self.hidden:
            raise AttributeError(f"module 'pynvml' has no attribute {name!r}")
        value = getattr(real, name)
        if (
            name.startswith("nvml")
            and isinstance(value, types.FunctionType)
            and name not in _PASS_THROUGH
        ):
            return self._missing(name)
        return value

    def _missing(self, name: str) -> Callable[..., Any]:
        def missing(*_args: Any, **_kwargs: Any) -> Any:
            self.calls[(name, None)] += 1
            raise real.NVMLError(real.NVML_ERROR_FUNCTION_NOT_FOUND)

        return missing

    def _new_handle(self, gpu: FakeGpu, pos: int | None) -> Any:
        backing = _Struct()
        self._keep.append(backing)
        self._by_address[ctypes.addressof(backing)] = (gpu, pos, self.sessions)
        return ctypes.cast(ctypes.pointer(backing), real.c_nvmlDevice_t)

    def _target(self, handle: Any) -> tuple[FakeGpu, FakeMig | None]:
        address = ctypes.cast(handle, ctypes.c_void_p).value
        if address not in self._by_address:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        gpu, pos, session = self._by_address[address]
        if session != self.sessions or not self.initialized:
            raise self._stale()
        return gpu, (gpu.migs[pos] if pos is not None else None)

    def _enter(
        self, name: str, handle: Any = None, *, index: int | None = None
    ) -> tuple[FakeGpu | None, FakeMig | None]:
        """Checks every real call makes: initialised, valid handle, GPU present, injections.

        `index` names the GPU of a call that takes an index rather than a handle."""
        gpu = mig = None
        if handle is not None:
            gpu, mig = self._target(handle)
        index = gpu.index if gpu else index
        self.calls[(name, index)] += 1
        if not self.initialized:
            raise real.NVMLError(real.NVML_ERROR_UNINITIALIZED)
        for rule in self._injected:
            if rule["call"] == name and rule["gpu"] in (None, index) and rule["times"] != 0:
                if rule["times"] is not None:
                    rule["times"] -= 1
                raise real.NVMLError(rule["error"])
        if gpu is not None and (gpu.lost or not self._present(gpu)):
            raise real.NVMLError(real.NVML_ERROR_GPU_IS_LOST)
        return gpu, mig

    @staticmethod
    def _not_supported() -> real.NVMLError:
        return real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)

    # ----- init and system ---------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls[("nvmlInit", None)] += 1
        if self.init_release is not None:
            self.init_release.wait()
        if self.init_error is not None:
            raise real.NVMLError(self.init_error)
        if not self.initialized:
            self._enumerate()
        self.initialized += 1

    def nvmlInitWithFlags(self, flags: int) -> None:
        self.nvmlInit()

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        with self._lock:
            self.initialized -= 1
            self.shutdowns += 1
            if not self.initialized and self._waiting:
                self.shutdown_races += 1
            self._lock.notify_all()  # a waiter in nvmlEventSetWait learns its session ended

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion")
        return self.cuda_version

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion_v2")
        return self.cuda_version

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        self._enter("nvmlSystemGetProcessName")
        if pid not in self.process_names:
            raise real.NVMLError(real.NVML_ERROR_NOT_FOUND)
        return self.process_names[pid]

    # ----- enumeration and identity ------------------------------------------------------

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self._enumerated)  # fixed when the session began

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._enter("nvmlDeviceGetHandleByIndex", index=index)
        if not 0 <= index < len(self._enumerated):
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self._enumerated[index]
        if gpu.lost or not self._present(gpu):
            raise real.NVMLError(real.NVML_ERROR_GPU_IS_LOST)
        return self._gpu_handle[id(gpu)]

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        gpu, _ = self._enter("nvmlDeviceGetIndex", handle)
        return gpu.index

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        gpu, mig = self._enter("nvmlDeviceGetUUID", handle)
        return mig.uuid if mig else gpu.uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        gpu, mig = self._enter("nvmlDeviceGetName", handle)
        return f"{gpu.name} MIG {mig.profile}" if mig else gpu.name

    def nvmlDeviceGetSerial(self, handle: Any) -> str:
        gpu, _ = self._enter("nvmlDeviceGetSerial", handle)
        return gpu.serial

    def nvmlDeviceGetVbiosVersion(self, handle: Any) -> str:
        gpu, _ = self._enter("nvmlDeviceGetVbiosVersion", handle)
        return gpu.vbios

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        gpu, _ = self._enter("nvmlDeviceGetPciInfo", handle)
        return _pci_info(gpu.bus)

    def nvmlDeviceGetPciInfo_v3(self, handle: Any) -> Any:
        return self.nvmlDeviceGetPciInfo(handle)

    def nvmlDeviceGetNumaNodeId(self, handle: Any) -> int:
        gpu, _ = self._enter("nvmlDeviceGetNumaNodeId", handle)
        return gpu.numa_node

    def nvmlDeviceGetCpuAffinity(self, handle: Any, cpuSetSize: int) -> Any:
        gpu, _ = self._enter("nvmlDeviceGetCpuAffinity", handle)
        words = (ctypes.c_ulonglong * cpuSetSize)()
        for cpu in gpu.cpus:
            if cpu // 64 < cpuSetSize:
                words[cpu // 64] |= 1 << (cpu % 64)
        return words

    # ----- live readings -----------------------------------------------------------------

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        gpu, mig = self._enter("nvmlDeviceGetUtilizationRates", handle)
        if mig or gpu.mig_enabled:
            raise self._not_supported()  # not available per MIG instance nor on a MIG parent
        util = real.c_nvmlUtilization_t()
        util.gpu, util.memory = gpu.util_gpu, gpu.util_memory
        return util

    def nvmlDeviceGetEncoderUtilization(self, handle: Any) -> list[int]:
        gpu, _ = self._enter("nvmlDeviceGetEncoderUtilization", handle)
        return [gpu.encoder, 167000]

    def nvmlDeviceGetDecoderUtilization(self, handle: Any) -> list[int]:
        gpu, _ = self._enter("nvmlDeviceGetDecoderUtilization", handle)
        return [gpu.decoder, 167000]

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        if not version:
            gpu, mig = self._enter("nvmlDeviceGetMemoryInfo", handle)
            memory = real.c_nvmlMemory_t()
        else:
            gpu, mig = self._enter("nvmlDeviceGetMemoryInfo_v2", handle)
            if not gpu.memory_v2:
                raise real.NVMLError(real.NVML_ERROR_FUNCTION_NOT_FOUND)
            memory = real.c_nvmlMemory_v2_t()
            memory.version = version
        if mig:
            memory.total, memory.used = mig.memory_total, mig.memory_used
            memory.free = mig.memory_total - mig.memory_used
            return memory
        memory.total = gpu.memory_total
        if version:
            memory.reserved = gpu.memory_reserved
            memory.used = gpu.memory_used
            memory.free = gpu.memory_total - gpu.memory_reserved - gpu.memory_used
        else:  # v1 "used" includes the reserved memory
            memory.used = gpu.memory_used + gpu.memory_reserved
            memory.free = gpu.memory_total - memory.used
        return memory

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        gpu, _ = self._enter("nvmlDeviceGetTemperature", handle)
        if sensor != real.NVML_TEMPERATURE_GPU:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.temperature

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        gpu, _ = self._enter("nvmlDeviceGetPowerUsage", handle)
        return gpu.power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        gpu, _ = self._enter("nvmlDeviceGetEnforcedPowerLimit", handle)
        return gpu.power_limit_mw

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: Any) -> list[int]:
        gpu, _ = self._enter("nvmlDeviceGetPowerManagementLimitConstraints", handle)
        return [gpu.power_limit_min_mw, gpu.power_limit_max_mw]

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: Any) -> int:
        gpu, _ = self._enter("nvmlDeviceGetPowerManagementDefaultLimit", handle)
        return gpu.power_limit_default_mw

    def nvmlDeviceGetFanSpeed(self, handle: Any) -> int:
        gpu, _ = self._enter("nvmlDeviceGetFanSpeed", handle)
        if gpu.fan_percent is None:
            raise self._not_supported()
        return gpu.fan_percent

    def nvmlDeviceGetPerformanceState(self, handle: Any) -> int:
        gpu, _ = self._enter("nvmlDeviceGetPerformanceState", handle)
        return gpu.pstate

    def nvmlDeviceGetComputeMode(self, handle: Any) -> int:
        gpu, _ = self._enter("nvmlDeviceGetComputeMode", handle)
        return gpu.compute_mode

    def nvmlDeviceGetVirtualizationMode(self, handle: Any) -> int:
        gpu, _ = self._enter("nvmlDeviceGetVirtualizationMode", handle)
        return gpu.virtualization_mode

    def nvmlDeviceGetGridLicensableFeatures(self, handle: Any) -> Any:
        gpu, _ = self._enter("nvmlDeviceGetGridLicensableFeatures", handle)
        features = real.c_nvmlGridLicensableFeatures_v4_t()
        guest = gpu.virtualization_mode == real.NVML_GPU_VIRTUALIZATION_MODE_VGPU
        features.isGridLicenseSupported = int(guest)
        features.licensableFeaturesCount = 1 if guest else 0
        feature = features.gridLicensableFeatures[0]
        feature.featureCode = real.NVML_GRID_LICENSE_FEATURE_CODE_COMPUTE
        feature.featureState = int(guest and gpu.vgpu_licensed)
        return features

    def _fabric(self, name: str, handle: Any, info: Any, versioned: bool) -> int:
        gpu, _ = self._enter(name, handle)
        target = info._obj  # the struct behind ctypes.byref, as the driver writes into it
        if versioned and target.version != real.nvmlGpuFabricInfo_v2:
            raise real.NVMLError(real.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        if gpu.fabric_state is None:
            target.state = real.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
        else:
            target.state, target.status = gpu.fabric_state, gpu.fabric_status
        return real.NVML_SUCCESS

    def nvmlDeviceGetGpuFabricInfoV(self, device: Any, gpuFabricInfo: Any) -> int:
        return self._fabric("nvmlDeviceGetGpuFabricInfoV", device, gpuFabricInfo, True)

    def nvmlDeviceGetGpuFabricInfo(self, device: Any, gpuFabricInfo: Any) -> int:
        return self._fabric("nvmlDeviceGetGpuFabricInfo", device, gpuFabricInfo, False)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        gpu, _ = self._enter("nvmlDeviceGetTotalEnergyConsumption", handle)
        return gpu.energy_mj

    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:
        gpu, _ = self._enter("nvmlDeviceGetClockInfo", handle)
        clocks = {real.NVML_CLOCK_SM: gpu.sm_clock_mhz, real.NVML_CLOCK_MEM: gpu.mem_clock_mhz}
        clocks[real.NVML_CLOCK_GRAPHICS] = gpu.sm_clock_mhz
        clocks[real.NVML_CLOCK_VIDEO] = gpu.video_clock_mhz
        if type not in clocks:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        return clocks[type]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        gpu, _ = self._enter("nvmlDeviceGetCurrentClocksEventReasons", handle)
        return gpu.clock_events

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        gpu, _ = self._enter("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
        return gpu.clock_events

    def nvmlDeviceGetViolationStatus(self, device: Any, perfPolicyType: int) -> Any:
        gpu, _ = self._enter("nvmlDeviceGetViolationStatus", device)
        if perfPolicyType not in gpu.violation_ns:
            raise self._not_supported()
        violation = real.c_nvmlViolationTime_t()
        violation.referenceTime = self.now_us  # CPU timestamp in µs; violationTime is ns
        violation.violationTime = gpu.violation_ns[perfPolicyType]
        return violation

    def nvmlDeviceGetPcieThroughput(self, device: Any, counter: int) -> int:
        gpu, _ = self._enter("nvmlDeviceGetPcieThroughput", device)
        if counter == real.NVML_PCIE_UTIL_TX_BYTES:
            return gpu.pcie_tx_kbs
        if counter == real.NVML_PCIE_UTIL_RX_BYTES:
            return gpu.pcie_rx_kbs
        raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        gpu, _ = self._enter("nvmlDeviceGetPcieReplayCounter", handle)
        return gpu.pcie_replay

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:
        gpu, _ = self._enter("nvmlDeviceGetTotalEccErrors", handle)
        kinds = (real.NVML_MEMORY_ERROR_TYPE_CORRECTED, real.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)
        if errorType not in kinds or counterType not in (
            real.NVML_VOLATILE_ECC,
            real.NVML_AGGREGATE_ECC,
        ):
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)  # as the driver answers
        # No reboot is modelled, so the volatile count (since boot) equals the aggregate one.
        if errorType == real.NVML_MEMORY_ERROR_TYPE_CORRECTED:
            return gpu.ecc_corrected
        return gpu.ecc_uncorrected

    def nvmlDeviceGetRetiredPages(self, device: Any, sourceFilter: int) -> list[int]:
        gpu, _ = self._enter("nvmlDeviceGetRetiredPages", device)
        count = gpu.retired_sbe
        if sourceFilter == real.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR:
            count = gpu.retired_dbe
        return [0x1000 * (n + 1) for n in range(count)]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, device: Any) -> int:
        gpu, _ = self._enter("nvmlDeviceGetRetiredPagesPendingStatus", device)
        return int(gpu.retired_pending)

    def nvmlDeviceGetRemappedRows(self, device: Any) -> tuple[int, int, int, int]:
        gpu, _ = self._enter("nvmlDeviceGetRemappedRows", device)
        if gpu.mig_active:
            raise self._not_supported()  # per-GPU row remapping is hidden under active MIG
        return (
            gpu.remap_correctable,
            gpu.remap_uncorrectable,
            int(gpu.remap_pending),
            int(gpu.remap_failure),
        )

    def nvmlDeviceGetFieldValues(self, handle: Any, fieldIds: list[Any]) -> Any:
        gpu, _ = self._enter("nvmlDeviceGetFieldValues", handle)
        values = (real.c_nvmlFieldValue_t * len(fieldIds))()
        for i, field_id in enumerate(fieldIds):
            fid, scope = field_id if isinstance(field_id, tuple) else (field_id, 0)
            slot = values[i]
            slot.fieldId, slot.scopeId = fid, scope
            slot.timestamp, slot.latencyUsec = self.now_us, 0
            reading = None if fid in gpu.unsupported_fields else _field(gpu, fid, scope)
            if reading is None:
                slot.nvmlReturn = real.NVML_ERROR_NOT_SUPPORTED
                continue
            value_type, value = reading
            slot.nvmlReturn, slot.valueType = real.NVML_SUCCESS, value_type
            member = {
                real.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
                real.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
                real.NVML_VALUE_TYPE_DOUBLE: "dVal",
            }[value_type]
            setattr(slot.value, member, value)
        return values

    # ----- MIG ---------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        gpu, _ = self._enter("nvmlDeviceGetMigMode", device)
        if gpu.max_mig_devices == 0:
            raise self._not_supported()
        mode = real.NVML_DEVICE_MIG_ENABLE if gpu.mig_enabled else real.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        gpu, _ = self._enter("nvmlDeviceGetMaxMigDeviceCount", device)
        return gpu.max_mig_devices

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:
        gpu, _ = self._enter("nvmlDeviceGetMigDeviceHandleByIndex", device)
        if not gpu.mig_enabled:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        if index >= gpu.max_mig_devices:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        if index >= len(gpu.migs):
            raise real.NVMLError(real.NVML_ERROR_NOT_FOUND)
        key = (id(gpu), index)
        if key not in self._mig_handle:  # one handle per MIG device and session, as NVML
            self._mig_handle[key] = self._new_handle(gpu, index)
        return self._mig_handle[key]

    def nvmlDeviceIsMigDeviceHandle(self, device: Any) -> Any:
        _, mig = self._enter("nvmlDeviceIsMigDeviceHandle", device)
        return ctypes.c_uint(1 if mig else 0)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: Any) -> Any:
        gpu, _ = self._enter("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", migDevice)
        return self._gpu_handle[id(gpu)]

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        _, mig = self._enter("nvmlDeviceGetGpuInstanceId", device)
        if mig is None:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        return mig.gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        _, mig = self._enter("nvmlDeviceGetComputeInstanceId", device)
        if mig is None:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        return mig.compute_instance_id

    def nvmlDeviceGetAttributes(self, device: Any) -> Any:
        gpu, mig = self._enter("nvmlDeviceGetAttributes", device)
        attrs = real.c_nvmlDeviceAttributes()
        attrs.gpuInstanceSliceCount = mig.slices if mig else 7
        attrs.computeInstanceSliceCount = mig.slices if mig else 7
        attrs.memorySizeMB = (mig.memory_total if mig else gpu.memory_total) // MIB
        return attrs

    def nvmlDeviceGetAttributes_v2(self, device: Any) -> Any:
        return self.nvmlDeviceGetAttributes(device)

    # ----- GPM ---------------------------------------------------------------------------

    def nvmlGpmQueryDeviceSupport(self, device: Any) -> Any:
        gpu, _ = self._enter("nvmlGpmQueryDeviceSupport", device)
        support = real.c_nvmlGpmSupport_t()
        support.version = real.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = int(gpu.gpm_supported)
        return support

    def nvmlGpmSampleAlloc(self) -> Any:
        self._enter("nvmlGpmSampleAlloc")
        backing = _Struct()
        self._keep.append(backing)
        sample = ctypes.cast(ctypes.pointer(backing), real.c_nvmlGpmSample_t)
        self._sample_session[_address(sample)] = self.sessions
        return sample

    def _check_samples(self, *samples: Any) -> None:
        """A GPM sample buffer belongs to the session that allocated it."""
        for sample in samples:
            if self._sample_session.get(_address(sample), self.sessions) != self.sessions:
                raise self._stale()

    def nvmlGpmSampleFree(self, gpmSample: Any) -> None:
        self._enter("nvmlGpmSampleFree")
        self._check_samples(gpmSample)
        self._samples.pop(_address(gpmSample), None)
        self._sample_session.pop(_address(gpmSample), None)

    def nvmlGpmSampleGet(self, device: Any, gpmSample: Any) -> Any:
        gpu, _ = self._enter("nvmlGpmSampleGet", device)
        self._check_samples(gpmSample)
        return self._take_sample(gpu, None, gpmSample)

    def nvmlGpmMigSampleGet(self, device: Any, gpuInstanceId: int, gpmSample: Any) -> Any:
        gpu, _ = self._enter("nvmlGpmMigSampleGet", device)
        self._check_samples(gpmSample)
        if gpuInstanceId not in {m.gpu_instance_id for m in gpu.migs}:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        return self._take_sample(gpu, gpuInstanceId, gpmSample)

    def _take_sample(self, gpu: FakeGpu, gi: int | None, sample: Any) -> Any:
        if not gpu.gpm_supported:
            raise self._not_supported()
        integral = dict(self._gpm_integral.get((gpu.uuid, gi), {}))
        self._samples[_address(sample)] = (gpu.uuid, gi, self.now_us, integral)
        return sample

    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:
        self._enter("nvmlGpmMetricsGet")
        if metricsGet.version != real.NVML_GPM_METRICS_GET_VERSION:
            raise real.NVMLError(real.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        self._check_samples(metricsGet.sample1, metricsGet.sample2)
        first = self._samples.get(_address(metricsGet.sample1))
        second = self._samples.get(_address(metricsGet.sample2))
        if first is None or second is None or first[:2] != second[:2]:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        elapsed_s = (second[2] - first[2]) / 1e6
        for i in range(metricsGet.numMetrics):
            metric = metricsGet.metrics[i]
            known = metric.metricId in second[3] or metric.metricId in first[3]
            if elapsed_s <= 0 or not known:
                metric.nvmlReturn = real.NVML_ERROR_NOT_SUPPORTED
                continue
            delta = second[3].get(metric.metricId, 0.0) - first[3].get(metric.metricId, 0.0)
            metric.nvmlReturn = real.NVML_SUCCESS
            metric.value = delta / elapsed_s
        return metricsGet

    def _gpm_rates(self, gpu: FakeGpu, gi: int | None) -> dict[int, float]:
        if gi is None:
            return dict(gpu.gpm)
        mig = next(m for m in gpu.migs if m.gpu_instance_id == gi)
        rates = {
            real.NVML_GPM_METRIC_SM_UTIL: mig.sm_util,
            real.NVML_GPM_METRIC_GRAPHICS_UTIL: mig.engine_util,
            real.NVML_GPM_METRIC_ANY_TENSOR_UTIL: mig.tensor_util,
            real.NVML_GPM_METRIC_DRAM_BW_UTIL: mig.dram_util,
        }
        return {metric: rate for metric, rate in rates.items() if rate is not None}

    # ----- processes ---------------------------------------------------------------------

    def _processes(self, name: str, handle: Any, kind: str, version: int) -> list[Any]:
        gpu, _ = self._enter(name, handle)
        if version > gpu.process_api:
            raise real.NVMLError(real.NVML_ERROR_FUNCTION_NOT_FOUND)
        out = []
        for proc in gpu.processes:
            if proc.kind != kind:
                continue
            info = real.c_nvmlProcessInfo_v2_t()
            info.pid, info.gpuInstanceId = proc.pid, proc.gpu_instance_id
            info.computeInstanceId = proc.compute_instance_id
            info.usedGpuMemory = (
                real.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
                if proc.used_memory is None
                else proc.used_memory
            )
            obj = real.nvmlStructToFriendlyObject(info)
            if obj.usedGpuMemory == real.NVML_VALUE_NOT_AVAILABLE_ulonglong.value:
                obj.usedGpuMemory = None
            out.append(obj)
        return out

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any) -> list[Any]:
        return self._processes("nvmlDeviceGetComputeRunningProcesses_v3", handle, "compute", 3)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: Any) -> list[Any]:
        return self._processes("nvmlDeviceGetComputeRunningProcesses_v2", handle, "compute", 2)

    def nvmlDeviceGetGraphicsRunningProcesses_v3(self, handle: Any) -> list[Any]:
        return self._processes("nvmlDeviceGetGraphicsRunningProcesses_v3", handle, "graphics", 3)

    def nvmlDeviceGetGraphicsRunningProcesses_v2(self, handle: Any) -> list[Any]:
        return self._processes("nvmlDeviceGetGraphicsRunningProcesses_v2", handle, "graphics", 2)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        try:
            return self.nvmlDeviceGetComputeRunningProcesses_v3(handle)
        except real.NVMLError_FunctionNotFound:
            raise real.NVMLLibraryMismatchError("Unversioned function called") from None

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> list[Any]:
        try:
            return self.nvmlDeviceGetGraphicsRunningProcesses_v3(handle)
        except real.NVMLError_FunctionNotFound:
            raise real.NVMLLibraryMismatchError("Unversioned function called") from None

    def nvmlDeviceGetProcessUtilization(self, handle: Any, timeStamp: int) -> list[Any]:
        gpu, _ = self._enter("nvmlDeviceGetProcessUtilization", handle)
        if gpu.mig_enabled:
            raise self._not_supported()
        fresh = [
            (pid, ts, sm)
            for pid, (ts, sm) in self._proc_samples.get(gpu.uuid, {}).items()
            if ts > timeStamp
        ]
        if not fresh:
            raise real.NVMLError(real.NVML_ERROR_NOT_FOUND)
        samples = (real.c_nvmlProcessUtilizationSample_t * len(fresh))()
        for slot, (pid, ts, sm) in zip(samples, fresh, strict=True):
            slot.pid, slot.timeStamp, slot.smUtil = pid, ts, sm
            slot.memUtil = slot.encUtil = slot.decUtil = 0
        return samples[0 : len(fresh)]

    # ----- topology and NVLink -----------------------------------------------------------

    def nvmlDeviceGetTopologyCommonAncestor(self, device1: Any, device2: Any) -> int:
        a, _ = self._enter("nvmlDeviceGetTopologyCommonAncestor", device1)
        b, _ = self._target(device2)
        if b.lost or not self._present(b):
            raise real.NVMLError(real.NVML_ERROR_GPU_IS_LOST)
        if a.index == b.index:
            return real.NVML_TOPOLOGY_INTERNAL
        return self.topology[(a.index, b.index)]

    def nvmlDeviceGetP2PStatus(self, device1: Any, device2: Any, p2pIndex: int) -> int:
        a, _ = self._enter("nvmlDeviceGetP2PStatus", device1)
        b, _ = self._target(device2)
        if p2pIndex != real.NVML_P2P_CAPS_INDEX_NVLINK:
            return real.NVML_P2P_STATUS_OK
        return self.p2p_nvlink.get((a.index, b.index), real.NVML_P2P_STATUS_NOT_SUPPORTED)

    def _link(self, name: str, device: Any, link: int) -> FakeLink:
        gpu, _ = self._enter(name, device)
        if not gpu.links:
            raise self._not_supported()
        if not 0 <= link < gpu.nvlink_slots:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        if link >= len(gpu.links):
            return FakeLink(remote_bus_id="", active=False)
        return gpu.links[link]

    def nvmlDeviceGetNvLinkState(self, device: Any, link: int) -> int:
        return int(self._link("nvmlDeviceGetNvLinkState", device, link).active)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: Any, link: int) -> Any:
        target = self._link("nvmlDeviceGetNvLinkRemotePciInfo", device, link)
        if not target.active:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        return _pci_info(int(target.remote_bus_id.split(":")[1], 16))

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int) -> int:
        target = self._link("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
        return target.remote_type

    # ----- events ------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> Any:
        self._enter("nvmlEventSetCreate")
        backing = _Struct()
        self._keep.append(backing)
        event_set = ctypes.cast(ctypes.pointer(backing), real.c_nvmlEventSet_t)
        self._event_sets[_address(event_set)] = (self.sessions, set())
        return event_set

    def _registered(self, event_set: Any) -> set[int]:
        """The GPUs (by id) an event set of the current session watches."""
        entry = self._event_sets.get(_address(event_set))
        if entry is None:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        if entry[0] != self.sessions or not self.initialized:
            raise self._stale()
        return entry[1]

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        gpu, _ = self._enter("nvmlDeviceRegisterEvents", handle)
        if eventTypes & real.nvmlEventTypeXidCriticalError and not gpu.xid_events_supported:
            raise self._not_supported()
        self._registered(eventSet).add(id(gpu))

    def nvmlEventSetWait(self, eventSet: Any, timeoutms: int) -> Any:
        self._enter("nvmlEventSetWait")
        registered = self._registered(eventSet)
        session = self.sessions
        with self._lock:
            self._waiting += 1
            try:
                self._lock.wait_for(
                    lambda: (
                        session != self.sessions
                        or not self.initialized
                        or any(id(gpu) in registered for gpu, _ in self._events)
                    ),
                    timeoutms / 1000,
                )
            finally:
                self._waiting -= 1
            if session != self.sessions or not self.initialized:
                raise self._stale()  # the session ended under the waiting thread
            for event in list(self._events):
                if id(event[0]) in registered:
                    self._events.remove(event)
                    break
            else:
                raise real.NVMLError(real.NVML_ERROR_TIMEOUT)
        gpu, xid = event
        data = real.c_nvmlEventData_t()
        data.device = self._gpu_handle[id(gpu)]
        data.eventType = real.nvmlEventTypeXidCriticalError
        data.eventData = xid
        data.gpuInstanceId = data.computeInstanceId = NOT_MIG
        return data

    def nvmlEventSetWait_v2(self, eventSet: Any, timeoutms: int) -> Any:
        return self.nvmlEventSetWait(eventSet, timeoutms)

    def nvmlEventSetFree(self, eventSet: Any) -> None:
        self._enter("nvmlEventSetFree")
        self._registered(eventSet)
        self._event_sets.pop(_address(eventSet), None)


# The NVML functions the fake models that the installed release does not have.
_ABSENT = frozenset(
    name for name in vars(FakeNvml) if name.startswith("nvml") and not hasattr(real, name)
)


def _address(pointer: Any) -> int | None:
    return ctypes.cast(pointer, ctypes.c_void_p).value


def _renumbered(table: dict[tuple[int, int], int], moved: dict[int, int]) -> dict:
    """A pairwise table keyed by the new indices; pairs with a GPU that left are dropped."""
    return {
        (moved[a], moved[b]): value for (a, b), value in table.items() if a in moved and b in moved
    }


def _pci_info(bus: int) -> Any:
    info = real.nvmlPciInfo_t()
    info.domain, info.bus, info.device = 0, bus, 0
    info.pciDeviceId = 0x233010DE
    info.busId = bus_id_of(bus).encode()
    info.busIdLegacy = f"0000:{bus:02X}:00.0".encode()
    return info


_ALL_LINKS = 0xFFFFFFFF  # the scopeId that sums an NVLink field over every link


def _field(gpu: FakeGpu, fid: int, scope: int = 0) -> tuple[int, float] | None:
    """The value NVML would put in a field slot, or None where the GPU lacks it."""
    uint, ull = real.NVML_VALUE_TYPE_UNSIGNED_INT, real.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    links = len([link for link in gpu.links if link.active]) or 1
    share = 1.0 if scope == _ALL_LINKS else 1.0 / links  # one link's part of the sum
    table: dict[int, tuple[int, float] | None] = {
        real.NVML_FI_DEV_MEMORY_TEMP: None
        if gpu.memory_temperature is None
        else (uint, gpu.memory_temperature),
        real.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: (ull, gpu.energy_mj),
        real.NVML_FI_DEV_ECC_SBE_AGG_TOTAL: (ull, gpu.ecc_corrected),
        real.NVML_FI_DEV_ECC_DBE_AGG_TOTAL: (ull, gpu.ecc_uncorrected),
        real.NVML_FI_DEV_RETIRED_SBE: (ull, gpu.retired_sbe),
        real.NVML_FI_DEV_RETIRED_DBE: (ull, gpu.retired_dbe),
        real.NVML_FI_DEV_RETIRED_PENDING: (uint, int(gpu.retired_pending)),
        real.NVML_FI_DEV_REMAPPED_COR: (uint, gpu.remap_correctable),
        real.NVML_FI_DEV_REMAPPED_UNC: (uint, gpu.remap_uncorrectable),
        real.NVML_FI_DEV_REMAPPED_PENDING: (uint, int(gpu.remap_pending)),
        real.NVML_FI_DEV_REMAPPED_FAILURE: (uint, int(gpu.remap_failure)),
        real.NVML_FI_DEV_PCIE_REPLAY_COUNTER: (ull, gpu.pcie_replay),
    }
    recovery = getattr(real, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)  # 12.570 on
    if recovery is not None:
        table[recovery] = None if gpu.recovery_action is None else (uint, gpu.recovery_action)
    for fid_nvlink, kib in (
        (real.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, gpu.nvlink_tx_kib),
        (real.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, gpu.nvlink_rx_kib),
    ):
        table[fid_nvlink] = None if gpu.nvlink_kib_per_s is None else (ull, int(kib * share))
    if gpu.mig_active:  # as nvmlDeviceGetRemappedRows: not supported while MIG instances exist
        for remapped in (
            real.NVML_FI_DEV_REMAPPED_COR,
            real.NVML_FI_DEV_REMAPPED_UNC,
            real.NVML_FI_DEV_REMAPPED_PENDING,
            real.NVML_FI_DEV_REMAPPED_FAILURE,
        ):
            table[remapped] = None
    policies = {
        real.NVML_FI_DEV_PERF_POLICY_POWER: real.NVML_PERF_POLICY_POWER,
        real.NVML_FI_DEV_PERF_POLICY_THERMAL: real.NVML_PERF_POLICY_THERMAL,
        real.NVML_FI_DEV_PERF_POLICY_SYNC_BOOST: real.NVML_PERF_POLICY_SYNC_BOOST,
        real.NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT: real.NVML_PERF_POLICY_BOARD_LIMIT,
        real.NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION: real.NVML_PERF_POLICY_LOW_UTILIZATION,
        real.NVML_FI_DEV_PERF_POLICY_RELIABILITY: real.NVML_PERF_POLICY_RELIABILITY,
    }
    for fid_policy, policy in policies.items():
        table[fid_policy] = (ull, gpu.violation_ns[policy]) if policy in gpu.violation_ns else None
    return table.get(fid)


# ----- ready-made machines -------------------------------------------------------------------

H100_SXM = "NVIDIA H100 80GB HBM3"
A100_SXM = "NVIDIA A100-SXM4-80GB"
_H100_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
_SWITCH_BUSES = (0x05, 0x06, 0x07, 0x08)


def hgx_h100(gpu_count: int = 8) -> FakeNvml:
    """An HGX H100 board: every GPU has 18 NVLinks into the NVSwitch fabric (all-to-all)."""
    gpus = []
    for i in range(gpu_count):
        socket = 0 if i < gpu_count // 2 else 1
        links = [
            FakeLink(
                bus_id_of(_SWITCH_BUSES[n % 4]), remote_type=real.NVML_NVLINK_DEVICE_TYPE_SWITCH
            )
            for n in range(18)
        ]
        gpus.append(
            FakeGpu(
                index=i,
                name=H100_SXM,
                bus=_H100_BUSES[i],
                socket=socket,
                numa_node=socket,
                pcie_switch=i // 2,
                cpus=tuple(range(0, 32)) + tuple(range(64, 96))
                if socket == 0
                else tuple(range(32, 64)) + tuple(range(96, 128)),
                links=links,
                fabric_state=real.NVML_GPU_FABRIC_STATE_COMPLETED,  # fabric manager is up
                nvlink_kib_per_s=0.0,
            )
        )
    fake = FakeNvml(gpus)
    for a in gpus:
        for b in gpus:
            if a.index != b.index:
                fake.p2p_nvlink[(a.index, b.index)] = real.NVML_P2P_STATUS_OK
    return fake


def two_islands(links_per_peer: int = 4) -> FakeNvml:
    """Two 4-GPU A100 boards with direct all-to-all NVLink inside (0-3, 4-7), joined by PCIe.

    A100 is Ampere: no GPM (the model name makes `gpm_supported` False)."""
    buses = (0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD)
    gpus = []
    for i in range(8):
        board = i // 4
        peers = [p for p in range(board * 4, board * 4 + 4) if p != i]
        links = [FakeLink(bus_id_of(buses[p])) for p in peers for _ in range(links_per_peer)]
        gpus.append(
            FakeGpu(
                index=i,
                name=A100_SXM,
                bus=buses[i],
                socket=board,
                numa_node=board,
                pcie_switch=i // 2,
                nvlink_slots=12,
                links=links,
                memory_total=81920 * MIB,
                memory_temperature=None,  # exercises a NotSupported field
                nvlink_kib_per_s=0.0,
            )
        )
    fake = FakeNvml(gpus)
    for a in gpus:
        for b in gpus:
            if a.index != b.index and a.socket == b.socket:
                fake.p2p_nvlink[(a.index, b.index)] = real.NVML_P2P_STATUS_OK
    return fake
