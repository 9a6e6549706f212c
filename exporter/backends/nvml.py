"""The NVML backend: reads every GPU of this node through nvidia-ml-py (module `pynvml`).

Shape of a cycle: one long-lived `nvmlInit` (time-bounded, because it can hang on some
drivers), static identity read once, then per GPU the cheap readings every cycle, PCIe
throughput (20 ms per call in the driver) and topology on their own slower cadences, GPM
rates against the previous cycle's sample, and XID events from a watcher thread. A failing
call costs its value, a count in `Collection.errors` and one log line when it starts failing;
a GPU that NVML reports lost is `lost`, one it cannot reach for another reason (no permission,
an unknown error) is unhealthy but not lost, and either costs that GPU only.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from exporter.attribution.base import Attribution, NoAttribution, node_allocations
from exporter.backends.base import Backend, BackendUnavailable
from exporter.backends.nvml_calls import GpuLost, NvmlCalls
from exporter.backends.nvml_events import FATAL_XIDS, XidWatcher
from exporter.backends.nvml_fields import FieldReader, number, read_counters, scaled
from exporter.backends.nvml_gpm import GPU_METRICS, MIG_METRICS, GpmSampler
from exporter.backends.nvml_pcie import PcieSampler
from exporter.backends.nvml_processes import ProcessReader
from exporter.backends.nvml_topology import PciKey, discover_links, pci_key
from exporter.readings import (
    CLOCK_EVENT_REASONS,
    Collection,
    GpuReading,
    MigInstance,
    NodeReading,
    TopologyLink,
)
from exporter.topology import nvlink_islands
from exporter.units import duration

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
_CPU_SET_WORDS = 16  # 64-bit words of CPU affinity asked for: up to 1024 CPUs
# "... MIG 3g.40gb", or "... MIG 1c.3g.40gb" for a compute instance smaller than its GPU
# instance: the GPU instance's profile is the part after the "Nc." prefix.
_MIG_PROFILE = re.compile(r"MIG\s+(?:\d+c\.)?(\S+)")


@dataclass
class _Gpu:
    """What the backend keeps about one GPU between cycles."""

    index: int
    handle: Any = None
    uuid: str = ""
    model: str = ""
    pci_bus_id: str = ""
    pci: PciKey | None = None
    serial: str = ""
    vbios_version: str = ""
    numa_node: int | None = None
    cpu_affinity: str = ""
    gpm: bool = False
    lost: bool = False  # the last attach failed with GPU_IS_LOST (else: unreachable)
    mig_state: tuple[bool | None, bool] | None = None  # (MIG on, has instances) last cycle

    @property
    def scope(self) -> str:
        return f"gpu{self.index}"


class NvmlBackend(Backend):
    """Collects this node's GPUs through NVML (see the module docstring for the cadence)."""

    name = "nvml"

    def __init__(
        self,
        node_name: str,
        *,
        attribution: Attribution | None = None,
        nvml_module: Any = None,
        init_timeout: float = 10.0,
        pcie_interval: float = 10.0,
        topology_interval: float = 600.0,
        xid_events: bool = True,
        gpm: bool = True,
        processes: bool = True,
        xid_wait_ms: int = 1000,
        xid_backoff_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node_name = node_name
        self.attribution: Attribution = attribution or NoAttribution()
        self._module = nvml_module
        self.init_timeout = init_timeout
        self.pcie_interval = pcie_interval
        self.topology_interval = topology_interval
        self.xid_events = xid_events
        self.gpm_enabled = gpm
        self.processes_enabled = processes
        self._xid_wait_ms = xid_wait_ms
        self._xid_backoff_s = xid_backoff_s
        self._clock = clock
        self._nvml: Any = None
        self._calls: NvmlCalls | None = None
        self._fields: FieldReader | None = None
        self._gpm: GpmSampler | None = None
        self._watcher: XidWatcher | None = None
        self._pcie: PcieSampler | None = None
        self._processes = ProcessReader()
        self._gpus: list[_Gpu] = []
        self._links: list[TopologyLink] = []
        self._driver_version = ""
        self._cuda_version = ""
        self._next_topology = 0.0
        self._init_attempt: tuple[threading.Thread, dict[str, Any]] | None = None
        self._started = False

    # ----- flags -------------------------------------------------------------------------

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("nvml backend")
        group.add_argument(
            "--nvml.init-timeout",
            dest="nvml_init_timeout",
            type=duration,
            default=10.0,
            help="give up on nvmlInit after this long and retry later (it can hang)",
        )
        group.add_argument(
            "--nvml.pcie-interval",
            dest="nvml_pcie_interval",
            type=duration,
            default=10.0,
            help="read PCIe throughput this often (20 ms per GPU and direction); 0 disables",
        )
        group.add_argument(
            "--nvml.topology-interval",
            dest="nvml_topology_interval",
            type=duration,
            default=600.0,
            help="re-read NVLink and PCIe topology this often",
        )
        group.add_argument(
            "--nvml.no-xid-events",
            dest="nvml_xid_events",
            action="store_false",
            help="do not run the XID event watcher thread",
        )
        group.add_argument(
            "--nvml.no-gpm",
            dest="nvml_gpm",
            action="store_false",
            help="do not read GPM (SM/tensor/DRAM activity on Hopper and later)",
        )
        group.add_argument(
            "--nvml.no-processes",
            dest="nvml_processes",
            action="store_false",
            help="do not list processes and their per-process utilization",
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> NvmlBackend:
        node = getattr(args, "node_name", None) or socket.gethostname()
        timeout = getattr(args, "nvml_init_timeout", 10.0)
        if timeout <= 0:
            raise ValueError("--nvml.init-timeout must be positive")
        return cls(
            node,
            init_timeout=timeout,
            pcie_interval=getattr(args, "nvml_pcie_interval", 10.0),
            topology_interval=getattr(args, "nvml_topology_interval", 600.0),
            xid_events=getattr(args, "nvml_xid_events", True),
            gpm=getattr(args, "nvml_gpm", True),
            processes=getattr(args, "nvml_processes", True),
        )

    # ----- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        if self._started:
            return
        nvml = self._load()
        self._init(nvml)
        self._nvml = nvml
        self._calls = NvmlCalls(nvml, clock=self._clock)
        self._fields = FieldReader(nvml)
        self._gpm = GpmSampler(nvml)
        self._processes = ProcessReader()
        try:
            self._discover()
        except BackendUnavailable:
            self._shutdown()
            raise
        self._started = True
        live = {g.index: g.handle for g in self._gpus if g.handle is not None}
        if self.pcie_interval > 0:
            self._pcie = PcieSampler(nvml, self.pcie_interval)
            for index, handle in live.items():
                self._pcie.set_device(index, handle)
            self._pcie.start()
        if self.xid_events:
            self._watcher = XidWatcher(
                nvml, live, wait_ms=self._xid_wait_ms, backoff_s=self._xid_backoff_s
            )
            self._watcher.start()

    def close(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None
        if self._pcie is not None:
            self._pcie.stop()
            self._pcie = None
        if self._gpm is not None and self._calls is not None:
            self._gpm.close(self._calls)
        if self._started:
            self._started = False
            self._shutdown()

    def _load(self) -> Any:
        if self._module is None:
            try:
                import pynvml
            except ImportError:
                raise BackendUnavailable(
                    "NVML: python module pynvml is missing (pip install nvidia-ml-py)"
                ) from None
            self._module = pynvml
        return self._module

    def _init(self, nvml: Any) -> None:
        """nvmlInit in a helper thread, so a hanging driver costs `init_timeout`, not forever."""
        if self._init_attempt is None:
            outcome: dict[str, Any] = {}

            def run() -> None:
                try:
                    nvml.nvmlInit()
                    outcome["ok"] = True
                except BaseException as error:  # reported to the caller, not swallowed
                    outcome["error"] = error

            thread = threading.Thread(target=run, name="nvml-init", daemon=True)
            thread.start()
            self._init_attempt = (thread, outcome)
        thread, outcome = self._init_attempt
        thread.join(self.init_timeout)
        if thread.is_alive():  # keep the attempt: a later start() picks up its result
            raise BackendUnavailable(f"NVML: nvmlInit did not return within {self.init_timeout:g}s")
        self._init_attempt = None
        error = outcome.get("error")
        if error is not None:
            text = " ".join(str(error).split()) or type(error).__name__
            raise BackendUnavailable(f"NVML: {text}")

    def _shutdown(self) -> None:
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()

    def _discover(self) -> None:
        nvml = self._nvml
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as error:
            raise BackendUnavailable(f"NVML: nvmlDeviceGetCount: {error}") from None
        calls = self._calls
        self._driver_version = calls("system", "nvmlSystemGetDriverVersion") or ""
        cuda = calls("system", "nvmlSystemGetCudaDriverVersion")
        self._cuda_version = f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else ""
        self._gpus = [_Gpu(index) for index in range(count)]
        for gpu in self._gpus:
            self._attach(gpu)
        self._refresh_topology()

    def _attach(self, gpu: _Gpu) -> None:
        """Get the handle and the static identity of one GPU (again, after it was lost).

        Without a handle the GPU stays detached: `lost` only when NVML said GPU_IS_LOST; any
        other error (logged by `NvmlCalls`) leaves it unreachable, and it is retried next cycle.
        """
        calls, scope = self._calls, gpu.scope
        calls.forget(scope)  # a GPU (re)attached may have changed since it was last asked
        try:
            handle = calls(scope, "nvmlDeviceGetHandleByIndex", gpu.index, essential=True)
        except GpuLost:
            gpu.lost = True
            return
        gpu.lost = False
        if handle is None:
            return
        try:
            gpu.uuid = calls(scope, "nvmlDeviceGetUUID", handle) or gpu.uuid
            gpu.model = calls(scope, "nvmlDeviceGetName", handle) or gpu.model
            pci = calls(scope, "nvmlDeviceGetPciInfo", handle)
            if pci is not None:
                gpu.pci, gpu.pci_bus_id = pci_key(pci), _text(pci.busId)
            gpu.serial = calls(scope, "nvmlDeviceGetSerial", handle) or gpu.serial
            gpu.vbios_version = calls(scope, "nvmlDeviceGetVbiosVersion", handle) or ""
            gpu.numa_node = calls(scope, "nvmlDeviceGetNumaNodeId", handle)
            words = calls(scope, "nvmlDeviceGetCpuAffinity", handle, _CPU_SET_WORDS)
            gpu.cpu_affinity = cpu_list(words) if words is not None else ""
            gpu.gpm = self.gpm_enabled and self._gpm.supported(calls, scope, handle)
        except GpuLost:
            gpu.lost = True
            return
        gpu.handle = handle

    def _refresh_topology(self) -> None:
        live = {g.index: g.handle for g in self._gpus if g.handle is not None}
        pci = {g.index: g.pci for g in self._gpus if g.handle is not None and g.pci}
        self._next_topology = self._clock() + self.topology_interval
        # A GPU lost mid-walk keeps the previous links (wiring does not change).
        with contextlib.suppress(GpuLost):
            self._links = discover_links(self._calls, live, pci)

    # ----- one cycle ---------------------------------------------------------------------

    def collect(self) -> Collection:
        self.start()
        calls = self._calls
        now = self._clock()
        if now >= self._next_topology:
            self._refresh_topology()

        node = NodeReading(
            node=self.node_name,
            driver_version=self._driver_version,
            cuda_version=self._cuda_version,
            links=list(self._links),
        )
        gpm_keys: list[tuple[int, int | None]] = []
        for gpu in self._gpus:
            node.gpus.append(self._collect_gpu(gpu, gpm_keys))
        self._gpm.retain(calls, gpm_keys)

        # A GPU NVML cannot reach (and never could) has no known place in the NVLink wiring.
        unreachable = {g.index for g in self._gpus if g.handle is None and not g.lost}
        placed = [g.index for g in node.gpus if g.index not in unreachable]
        islands = nvlink_islands(placed, node.links)
        for reading in node.gpus:
            reading.nvlink_island = islands.get(reading.index)
        try:
            node.allocations = node_allocations(self.attribution, node)
        except Exception:  # an attribution bug must not cost the GPU readings
            calls.errors["attribution.allocations"] += 1

        if calls.library_error is not None:  # e.g. the driver was reloaded under us
            text = " ".join(str(calls.library_error).split())
            self.close()
            raise BackendUnavailable(f"NVML: {text}")
        errors = calls.take_errors()
        for helper in (self._watcher, self._pcie):
            if helper is not None:
                errors.update(helper.take_errors())
        return Collection(nodes=[node], timestamp=time.time(), errors=errors)

    def _identity(self, gpu: _Gpu) -> GpuReading:
        """A reading with only the GPU's static identity and its XID counters."""
        reading = GpuReading(
            index=gpu.index,
            uuid=gpu.uuid,
            model=gpu.model,
            pci_bus_id=gpu.pci_bus_id,
            serial=gpu.serial,
            vbios_version=gpu.vbios_version,
            numa_node=gpu.numa_node,
            cpu_affinity=gpu.cpu_affinity,
        )
        if self._watcher is not None:
            reading.xid_errors = self._watcher.counts(gpu.index)
            reading.xid_last_timestamp_seconds = self._watcher.last_timestamp(gpu.index)
        return reading

    def _collect_gpu(self, gpu: _Gpu, gpm_keys: list[tuple[int, int | None]]) -> GpuReading:
        if gpu.handle is None:
            self._attach(gpu)
            if gpu.handle is not None:  # back (or first seen) after start: wire it in
                self._next_topology = 0.0
                if self._watcher is not None:
                    self._watcher.add_device(gpu.index, gpu.handle)
                if self._pcie is not None:
                    self._pcie.set_device(gpu.index, gpu.handle)
        reading = self._identity(gpu)
        if gpu.handle is None:  # lost, or unreachable: unhealthy either way, lost only if so
            reading.lost, reading.healthy = gpu.lost, False
            return reading
        try:
            # MIG first: its state decides what else the GPU supports (see `_follow_mig`).
            self._read_mig(gpu, reading, gpm_keys)
            self._follow_mig(gpu, reading)
            self._read_live(gpu, reading)
            self._read_fields(gpu, reading)
            if self._pcie is not None:
                tx, rx = self._pcie.latest(gpu.index)
                reading.pcie_tx_bytes_per_second = tx
                reading.pcie_rx_bytes_per_second = rx
            if gpu.gpm and not reading.mig_enabled:
                gpm_keys.append((gpu.index, None))
                values = self._gpm.sample(
                    self._calls, gpu.scope, gpu.handle, (gpu.index, None), GPU_METRICS
                )
                for attr, value in values.items():
                    setattr(reading, attr, value)
            if self.processes_enabled:
                self._read_processes(gpu, reading)
        except GpuLost:  # what was read before the loss is dropped: identity and XIDs only
            reading = self._identity(gpu)
            reading.lost, reading.healthy = True, False
            return reading
        fatal = any(reading.xid_errors.get(code) for code in FATAL_XIDS)
        reading.healthy = not (reading.remapped_rows_failure or fatal)
        return reading

    def _follow_mig(self, gpu: _Gpu, r: GpuReading) -> None:
        """Re-ask what the GPU said it does not support once its MIG state changed.

        NVML answers NOT_SUPPORTED for utilization while MIG is on and for remapped rows while
        MIG instances exist, and answers them again afterwards; a memory of the old answer
        would hide a row-remap failure (health) and utilization until the memo expired.
        """
        state = (r.mig_enabled, bool(r.mig_instances))
        if gpu.mig_state is not None and state != gpu.mig_state:
            self._calls.forget(gpu.scope)
        gpu.mig_state = state

    def _read_live(self, gpu: _Gpu, r: GpuReading) -> None:
        nvml, calls, h, s = self._nvml, self._calls, gpu.handle, gpu.scope
        util = calls(s, "nvmlDeviceGetUtilizationRates", h)
        if util is not None:
            r.utilization_ratio = util.gpu / 100.0
            r.memory_utilization_ratio = util.memory / 100.0
        enc = calls(s, "nvmlDeviceGetEncoderUtilization", h)
        r.encoder_utilization_ratio = enc[0] / 100.0 if enc is not None else None
        dec = calls(s, "nvmlDeviceGetDecoderUtilization", h)
        r.decoder_utilization_ratio = dec[0] / 100.0 if dec is not None else None
        self._read_memory(gpu, r)
        r.temperature_celsius = number(
            calls(s, "nvmlDeviceGetTemperature", h, nvml.NVML_TEMPERATURE_GPU)
        )
        r.power_watts = scaled(calls(s, "nvmlDeviceGetPowerUsage", h), 1e-3)
        r.power_limit_watts = scaled(calls(s, "nvmlDeviceGetEnforcedPowerLimit", h), 1e-3)
        r.sm_clock_hertz = scaled(
            calls(s, "nvmlDeviceGetClockInfo", h, nvml.NVML_CLOCK_SM, key="clock_sm"), 1e6
        )
        r.memory_clock_hertz = scaled(
            calls(s, "nvmlDeviceGetClockInfo", h, nvml.NVML_CLOCK_MEM, key="clock_mem"), 1e6
        )
        reasons = calls(s, "nvmlDeviceGetCurrentClocksEventReasons", h)
        if reasons is None and not calls.supported(s, "nvmlDeviceGetCurrentClocksEventReasons"):
            reasons = calls(s, "nvmlDeviceGetCurrentClocksThrottleReasons", h)
        if reasons is not None:
            r.clock_event_active = {
                name: bool(int(reasons) & getattr(nvml, bit, 0))
                for name, bit in zip(CLOCK_EVENT_REASONS, _REASON_BITS, strict=True)
            }

    def _read_memory(self, gpu: _Gpu, r: GpuReading) -> None:
        """v2 (driver >= 515: `used` excludes reserved memory), else the v1 struct."""
        calls, s = self._calls, gpu.scope
        version = getattr(self._nvml, "nvmlMemory_v2", None)
        memory = None
        if version is not None and calls.supported(s, "memory_v2"):
            memory = calls(
                s, "nvmlDeviceGetMemoryInfo", gpu.handle, version=version, key="memory_v2"
            )
            if memory is not None:
                r.memory_reserved_bytes = float(memory.reserved)
        if memory is None and (version is None or not calls.supported(s, "memory_v2")):
            memory = calls(s, "nvmlDeviceGetMemoryInfo", gpu.handle)
        if memory is not None:
            r.memory_total_bytes = float(memory.total)
            r.memory_used_bytes = float(memory.used)
            r.memory_free_bytes = float(memory.free)

    def _read_fields(self, gpu: _Gpu, r: GpuReading) -> None:
        read_counters(self._fields, self._calls, gpu.scope, gpu.handle, r)

    def _read_mig(self, gpu: _Gpu, r: GpuReading, gpm_keys: list[tuple[int, int | None]]) -> None:
        nvml, calls, h, s = self._nvml, self._calls, gpu.handle, gpu.scope
        mode = calls(s, "nvmlDeviceGetMigMode", h)
        if mode is None:
            return
        r.mig_enabled = mode[0] == nvml.NVML_DEVICE_MIG_ENABLE
        if not r.mig_enabled:
            return
        slots = calls(s, "nvmlDeviceGetMaxMigDeviceCount", h) or 0
        mig_scope = f"{s}/mig"
        absent = (nvml.NVML_ERROR_NOT_FOUND, nvml.NVML_ERROR_INVALID_ARGUMENT)
        # A MIG device is one compute instance; memory and GPM belong to its GPU instance, so
        # they are read once per GPU instance however many compute instances it holds.
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
                    profile=self._mig_profile(mig_scope, mh),
                    uuid=uuid,
                    memory_total_bytes=float(memory.total) if memory is not None else None,
                    memory_used_bytes=float(memory.used) if memory is not None else None,
                )
            elif ci_id < instance.compute_instance_id:  # the lowest one names the instance
                instance.compute_instance_id, instance.uuid = ci_id, uuid
            instance.compute_instances[ci_id] = uuid
        for gi_id, instance in by_gi.items():
            if gpu.gpm:
                key = (gpu.index, gi_id)
                gpm_keys.append(key)
                values = self._gpm.sample(calls, s, h, key, MIG_METRICS, gi_id)
                instance.sm_active_ratio = values.get("sm_active_ratio")
            r.mig_instances.append(instance)

    def _mig_profile(self, scope: str, mig_handle: Any) -> str:
        """ "1g.10gb" from the MIG device name, else from its slice count and memory size."""
        name = self._calls(scope, "nvmlDeviceGetName", mig_handle) or ""
        match = _MIG_PROFILE.search(name)
        if match:
            return match.group(1)
        attrs = self._calls(scope, "nvmlDeviceGetAttributes", mig_handle)
        if attrs is None:
            return ""
        gib = -(-int(attrs.memorySizeMB) // 1024)  # NVIDIA rounds the size up in names
        return f"{int(attrs.gpuInstanceSliceCount)}g.{gib}gb"

    def _read_processes(self, gpu: _Gpu, r: GpuReading) -> None:
        r.processes = self._processes.read(
            self._calls, gpu.index, gpu.handle, self.attribution, utilization=not r.mig_enabled
        )


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


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
