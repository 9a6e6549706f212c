"""The NVML backend: reads every GPU of this node through nvidia-ml-py (module `pynvml`).

Shape of a cycle: one long-lived `nvmlInit` (time-bounded, because it can hang on some
drivers), static identity read once, then per GPU the cheap readings every cycle, PCIe
throughput (20 ms per call in the driver) and topology on their own slower cadences, GPM
rates against the previous cycle's sample, and XID events from a watcher thread. A failing
call costs its value, a count in `Collection.errors` and one log line when it starts failing;
a GPU that NVML reports lost is `lost`, one it cannot reach for another reason (no permission,
an unknown error) is unhealthy but not lost, and either costs that GPU only.

GPUs added, reset or removed are found without a restart (`nvml_rescan`): every
`rescan_interval`, and soon after a GPU went lost, a fresh session's list is compared with the
one served; when they differ, the session is ended (helper threads stopped first, GPM samples
freed) and begun again. A GPU keeps its state (XID counts, memories of unsupported calls,
samples, process names) by UUID, under its new index if NVML renumbered it. A GPU no longer
listed is served as lost for `gone_retention`, so GpuLost fires, and then its series end.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from exporter.attribution.base import Attribution, NoAttribution, node_allocations
from exporter.backends.base import Backend, BackendUnavailable
from exporter.backends.nvml_calls import GpuLost, NvmlCalls
from exporter.backends.nvml_device import (
    cpu_list,
    read_fabric,
    read_live,
    read_mig,
    read_vgpu_license,
)
from exporter.backends.nvml_events import FATAL_XIDS, XidWatcher
from exporter.backends.nvml_fields import FieldReader, Rate, read_counters
from exporter.backends.nvml_gpm import GPU_METRICS, MIG_METRICS, GpmSampler
from exporter.backends.nvml_pcie import PcieSampler
from exporter.backends.nvml_processes import ProcessReader
from exporter.backends.nvml_rescan import (
    RESCAN_S,
    Devices,
    Probe,
    Rescans,
    SubprocessProbe,
    match,
)
from exporter.backends.nvml_topology import PciKey, discover_links, pci_key
from exporter.readings import (
    Collection,
    GpuReading,
    NodeReading,
    TopologyLink,
    nvlink_islands,
)
from gpu_defrag_common.messages import one_line
from gpu_defrag_common.units import duration

log = logging.getLogger(__name__)

_CPU_SET_WORDS = 16  # 64-bit words of CPU affinity asked for: up to 1024 CPUs
# A GPU no longer listed stays `gpu_lost 1` this long: GpuLost (for: 1m) fires, then it goes.
GONE_RETENTION_S = 600.0
_PROBE_SLACK_S = 10.0  # the child process's start-up, on top of the nvmlInit timeout
_LIST_CALLS = frozenset({"nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID"})  # per index


@dataclass(eq=False)
class _Gpu:
    """What the backend keeps about one GPU between cycles (and NVML sessions)."""

    index: int
    handle: Any = None  # of the current NVML session only
    uuid: str = ""
    model: str = ""
    pci_bus_id: str = ""
    pci: PciKey | None = None
    serial: str = ""
    vbios_version: str = ""
    numa_node: int | None = None
    cpu_affinity: str = ""
    gpm: bool = False
    vgpu_guest: bool = False  # a vGPU in a virtual machine: it has a license to hold
    lost: bool = False  # the last reading (or attach) met GPU_IS_LOST (else: unreachable)
    mig_state: tuple[bool | None, bool] | None = None  # (MIG on, has instances) last cycle
    gone_since: float | None = None  # no longer listed by NVML since then (clock seconds)

    @property
    def scope(self) -> str:
        return f"gpu{self.index}"

    @property
    def name(self) -> str:
        return f"GPU {self.index} ({self.uuid or 'UUID unknown'})"


class _Listed(NamedTuple):
    """One index as a new session lists it: its handle and UUID, or why there are none."""

    handle: Any
    uuid: str
    lost: bool


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
        rescan_interval: float = RESCAN_S,
        rescan_probe: Probe | None = None,
        gone_retention: float = GONE_RETENTION_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`rescan_probe` lists the GPUs a fresh session sees (`nvml_rescan`); without one,
        every rescan re-initialises NVML in this process. `rescan_interval` 0: no rescans."""
        self.node_name = node_name
        self.attribution: Attribution = attribution or NoAttribution()
        self._module = nvml_module
        self.init_timeout = init_timeout
        self.pcie_interval = pcie_interval
        self.topology_interval = topology_interval
        self.xid_events = xid_events
        self.gpm_enabled = gpm
        self.processes_enabled = processes
        self.gone_retention = gone_retention
        self._xid_wait_ms = xid_wait_ms
        self._xid_backoff_s = xid_backoff_s
        self._clock = clock
        self._rescans = Rescans(rescan_interval, rescan_probe, clock=clock)
        self._nvml: Any = None
        self._calls: NvmlCalls | None = None
        self._fields: FieldReader | None = None
        self._gpm: GpmSampler | None = None
        self._watcher: XidWatcher | None = None
        self._pcie: PcieSampler | None = None
        self._processes = ProcessReader()
        self._nvlink = Rate()  # NVLink data counters -> bytes per second, per GPU UUID
        self._gpus: list[_Gpu] = []
        self._links: list[TopologyLink] = []
        self._driver_version = ""
        self._cuda_version = ""
        self._next_topology = 0.0
        self._init_attempt: tuple[threading.Thread, dict[str, Any]] | None = None
        self._live = False  # an NVML session of ours is up
        self._sessions = 0
        self._was_reachable: set[int] = set()  # id() of GPUs with a handle when it ended

    @property
    def rescan_interval(self) -> float:
        return self._rescans.interval

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
            "--nvml.rescan-interval",
            dest="nvml_rescan_interval",
            type=duration,
            default=RESCAN_S,
            help="look for GPUs added, reset or removed this often (a child process lists "
            "them; NVML is re-initialised only when the list changed); 0 disables",
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
            rescan_interval=getattr(args, "nvml_rescan_interval", RESCAN_S),
            rescan_probe=SubprocessProbe(timeout + _PROBE_SLACK_S),
        )

    # ----- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        if not self._live:
            self._begin_session()

    def close(self) -> None:
        self._stop_helpers()  # on the way out a thread still in the driver is not waited for
        self._end_session()

    def _begin_session(self) -> dict[int, int]:
        """nvmlInit, list the GPUs (matched to the known ones), start the helper threads.

        Returns old index -> new index of the GPUs kept from earlier sessions."""
        nvml = self._load()
        self._init(nvml)
        self._nvml = nvml
        if self._calls is None:  # state that outlives sessions: memories, counts, samples
            self._calls = NvmlCalls(nvml, clock=self._clock)
            self._fields = FieldReader(nvml)
            self._gpm = GpmSampler(nvml)
        self._calls.library_error = None
        try:
            moved = self._enumerate()
        except BackendUnavailable:
            self._shutdown()
            raise
        self._live = True
        self._sessions += 1
        self._start_helpers()
        self._rescans.begin()
        self._rescans.succeeded()  # after a failed re-initialisation: one line, it is over
        return moved

    def _end_session(self) -> None:
        """Free what belongs to the session and shut it down: every handle dies with it."""
        if not self._live:
            return
        self._gpm.close(self._calls)
        self._live = False
        self._shutdown()
        self._was_reachable = {id(g) for g in self._gpus if g.handle is not None and not g.lost}
        for gpu in self._gpus:
            gpu.handle = None

    def _start_helpers(self) -> None:
        """Start (or resume, on the new session's handles) the PCIe and XID threads."""
        live = {g.index: g.handle for g in self._gpus if g.handle is not None}
        if self.pcie_interval > 0:
            first = self._pcie is None
            if self._pcie is None:
                self._pcie = PcieSampler(self._nvml, self.pcie_interval)
            self._pcie.set_handles(live)
            self._pcie.start(first_sample=first)
        if self.xid_events:
            if self._watcher is None:
                self._watcher = XidWatcher(
                    self._nvml, live, wait_ms=self._xid_wait_ms, backoff_s=self._xid_backoff_s
                )
            else:
                self._watcher.set_handles(live)
            self._watcher.start()

    def _stop_helpers(self) -> bool:
        """Stop the threads that hold handles; False if one is still inside the driver."""
        stopped = [helper.stop() for helper in (self._watcher, self._pcie) if helper is not None]
        return all(stopped)

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

    # ----- enumeration -------------------------------------------------------------------

    def _enumerate(self) -> dict[int, int]:
        """List this session's GPUs and match them to the known ones by UUID (see `match`);
        their state follows them to their new index. Returns old index -> new index."""
        count = self._count()
        listed = [self._list(index) for index in range(count)]
        placed, moved, gone = self._match(listed)
        changed = self._say_changes(placed, listed, gone, count)
        still_gone = [g for g in gone if g.index >= count]  # else its index names another GPU
        moved.update({g.index: g.index for g in still_gone})
        self._renumber(moved)
        for index, (gpu, entry) in enumerate(zip(placed, listed, strict=True)):
            gpu.index, gpu.gone_since = index, None
            changed |= self._attach_listed(gpu, entry)
        now = self._clock()
        for gpu in still_gone:
            gpu.handle, gpu.lost = None, True
            gpu.gone_since = now if gpu.gone_since is None else gpu.gone_since
        self._gpus = placed + sorted(still_gone, key=lambda g: g.index)
        if self._sessions == 0:
            self._refresh_topology()
        elif changed:
            self._next_topology = 0.0  # new wiring: read it at the next collection
        return moved

    def _count(self) -> int:
        """How many GPUs this session lists (and the driver's versions, read alongside)."""
        nvml, calls = self._nvml, self._calls
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as error:
            raise BackendUnavailable(f"NVML: nvmlDeviceGetCount: {error}") from None
        self._driver_version = calls("system", "nvmlSystemGetDriverVersion") or ""
        cuda = calls("system", "nvmlSystemGetCudaDriverVersion")
        self._cuda_version = f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else ""
        return int(count)

    def _match(self, listed: list[_Listed]) -> tuple[list[_Gpu], dict[int, int], list[_Gpu]]:
        """(the GPU at each listed index, known or new; old -> new index of the known ones;
        the known GPUs not listed). A GPU already gone is found by its UUID only."""
        known = [(-1 if g.gone_since is not None else g.index, g.uuid) for g in self._gpus]
        found = match(known, [entry.uuid or None for entry in listed])
        placed = [
            _Gpu(index) if pos is None else self._gpus[pos] for index, pos in enumerate(found)
        ]
        moved = {self._gpus[pos].index: index for index, pos in enumerate(found) if pos is not None}
        kept = set(found)
        gone = [g for pos, g in enumerate(self._gpus) if pos not in kept]
        return placed, moved, gone

    def _list(self, index: int) -> _Listed:
        """The handle and UUID at one index of this session (None and "" when unreadable)."""
        calls, scope = self._calls, f"gpu{index}"
        try:
            handle = calls(scope, "nvmlDeviceGetHandleByIndex", index, essential=True)
            uuid = calls(scope, "nvmlDeviceGetUUID", handle) if handle is not None else None
        except GpuLost:
            return _Listed(None, "", True)
        return _Listed(handle, _text(uuid) if uuid else "", False)

    def _say_changes(
        self, placed: list[_Gpu], listed: list[_Listed], gone: list[_Gpu], count: int
    ) -> bool:
        """One log line per GPU that appeared, moved or left; True if any did."""
        if self._sessions == 0:
            return False
        changed = False
        for index, gpu in enumerate(placed):
            if gpu not in self._gpus:
                log.info("NVML: GPU %d (%s) appeared", index, listed[index].uuid or "UUID unknown")
            elif gpu.gone_since is not None:
                log.info("NVML: %s is listed again, as GPU %d", gpu.name, index)
            elif gpu.index != index:
                log.info("NVML: %s is GPU %d now", gpu.name, index)
            else:
                continue
            changed = True
        for gpu in gone:
            if gpu.index < count:
                log.warning(
                    "NVML: %s is no longer listed and its index names another GPU now: "
                    "its series end",
                    gpu.name,
                )
            elif gpu.gone_since is None:
                log.warning(
                    "NVML: %s is no longer listed: served as lost for %gs, then dropped",
                    gpu.name,
                    self.gone_retention,
                )
            else:
                continue
            changed = True
        return changed

    def _renumber(self, moved: dict[int, int]) -> None:
        """Move every per-GPU memory to the GPU's new index; forget GPUs not in `moved`.
        The helper threads are stopped here (a new session is starting)."""
        self._calls.renumber(moved, by_index=_LIST_CALLS)
        self._processes.renumber(moved)
        for helper in (self._watcher, self._pcie):
            if helper is not None:
                helper.renumber(moved)
        self._links = [
            dataclasses.replace(link, gpu=moved[link.gpu], peer=moved[link.peer])
            for link in self._links
            if link.gpu in moved and link.peer in moved
        ]

    def _attach_listed(self, gpu: _Gpu, entry: _Listed) -> bool:
        """Take the handle a new session listed for this GPU; True if it was not reachable in
        the session before (so its wiring and unsupported calls are asked again)."""
        if entry.handle is None:
            gpu.handle, gpu.lost = None, entry.lost
            return False
        back = id(gpu) not in self._was_reachable
        if back:
            self._calls.forget(gpu.scope)
        gpu.uuid = entry.uuid or gpu.uuid
        self._identify(gpu, entry.handle)
        return back and gpu.handle is not None

    def _attach(self, gpu: _Gpu) -> None:
        """Get the handle and the static identity of one GPU (again, after it was lost).

        Without a handle the GPU stays detached: `lost` only when NVML said GPU_IS_LOST; any
        other error (logged by `NvmlCalls`) leaves it unreachable, and it is retried next cycle.
        """
        self._calls.forget(gpu.scope)  # a GPU (re)attached may have changed since last asked
        entry = self._list(gpu.index)
        gpu.lost = entry.lost
        if entry.handle is not None:
            gpu.uuid = entry.uuid or gpu.uuid
            self._identify(gpu, entry.handle)

    def _identify(self, gpu: _Gpu, handle: Any) -> None:
        """Read the static identity; the GPU gets its handle unless it went lost meanwhile."""
        calls, scope = self._calls, gpu.scope
        try:
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
            mode = calls(scope, "nvmlDeviceGetVirtualizationMode", handle)
            gpu.vgpu_guest = mode == getattr(self._nvml, "NVML_GPU_VIRTUALIZATION_MODE_VGPU", -1)
        except GpuLost:
            gpu.handle, gpu.lost = None, True
            return
        gpu.handle, gpu.lost = handle, False

    def _refresh_topology(self) -> None:
        live = {g.index: g.handle for g in self._gpus if g.handle is not None}
        pci = {g.index: g.pci for g in self._gpus if g.handle is not None and g.pci}
        self._next_topology = self._clock() + self.topology_interval
        # A GPU lost mid-walk keeps the previous links (wiring does not change).
        with contextlib.suppress(GpuLost):
            self._links = discover_links(self._calls, live, pci)

    # ----- rescans -----------------------------------------------------------------------

    def _rescan(self) -> None:
        """At the end of a cycle, when due: re-initialise NVML if its list of GPUs changed."""
        if not self._live or not self._rescans.take_due():
            return
        if self._rescans.probe is not None:
            devices = self._rescans.look()
            if devices is None:  # still running, or failed (logged, retried later)
                return
            if devices == self._served():
                self._rescans.succeeded()
                return
        self._reinit()

    def _served(self) -> Devices:
        """This session's list as a probe would give it: the UUID per index, None if unread."""
        return [
            g.uuid if g.handle is not None and not g.lost and g.uuid else None
            for g in self._gpus
            if g.gone_since is None
        ]

    def _reinit(self) -> None:
        """End our session and begin a new one, which lists the GPUs the driver has now."""
        if not self._stop_helpers():
            self._start_helpers()
            self._rescans.failed(
                "an XID or PCIe thread is still inside the driver; the GPUs known are still served"
            )
            return
        samples = self._gpm.keys()
        self._end_session()
        try:
            moved = self._begin_session()
        except BackendUnavailable as error:  # the next collection's start() tries again
            reason = one_line(error).removeprefix("NVML: ")
            self._rescans.failed(f"re-initialising NVML: {reason}; the next collection retries")
            return
        self._resample_gpm(samples, moved)

    def _resample_gpm(self, keys: list[Any], moved: dict[int, int]) -> None:
        """Take the first GPM sample of the new session now, so the next cycle has rates."""
        by_index = {g.index: g for g in self._gpus if g.handle is not None and g.gpm}
        for index, gi in keys:
            gpu = by_index.get(moved.get(index, -1))
            if gpu is None:
                continue
            metrics = GPU_METRICS if gi is None else MIG_METRICS
            with contextlib.suppress(GpuLost):
                self._gpm.sample(self._calls, gpu.scope, gpu.handle, (gpu.index, gi), metrics, gi)

    def _drop_gone(self, now: float) -> None:
        """End the series of GPUs no longer listed once they were lost for `gone_retention`."""
        for gpu in self._gpus:
            if gpu.gone_since is not None and now - gpu.gone_since >= self.gone_retention:
                log.info("NVML: %s dropped: not listed for %gs", gpu.name, self.gone_retention)
        self._gpus = [
            g
            for g in self._gpus
            if g.gone_since is None or now - g.gone_since < self.gone_retention
        ]

    # ----- one cycle ---------------------------------------------------------------------

    def collect(self) -> Collection:
        self.start()
        calls = self._calls
        now = self._clock()
        self._drop_gone(now)
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
        self._rescan()
        errors = calls.take_errors()
        for helper in (self._watcher, self._pcie, self._rescans):
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
            reading.xid_last_code = self._watcher.last_code(gpu.index)
        return reading

    def _collect_gpu(self, gpu: _Gpu, gpm_keys: list[tuple[int, int | None]]) -> GpuReading:
        """One GPU's reading; a GPU that just went lost brings the next rescan forward."""
        if gpu.gone_since is not None:  # no longer listed: identity, XIDs and lost until dropped
            reading = self._identity(gpu)
            reading.lost, reading.healthy = True, False
            return reading
        was_lost = gpu.lost
        reading = self._read_gpu(gpu, gpm_keys)
        gpu.lost = reading.lost
        if gpu.lost and not was_lost:
            self._rescans.lost_seen()
        return reading

    def _read_gpu(self, gpu: _Gpu, gpm_keys: list[tuple[int, int | None]]) -> GpuReading:
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
            read_live(self._nvml, self._calls, gpu.scope, gpu.handle, reading)
            fields = read_counters(self._fields, self._calls, gpu.scope, gpu.handle, reading)
            self._read_nvlink(gpu, fields, reading)
            read_fabric(self._nvml, self._calls, gpu.scope, gpu.handle, reading)
            if gpu.vgpu_guest:
                read_vgpu_license(self._nvml, self._calls, gpu.scope, gpu.handle, reading)
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

    def _read_mig(self, gpu: _Gpu, r: GpuReading, gpm_keys: list[tuple[int, int | None]]) -> None:
        """`nvml_device.read_mig`, each GPU instance's SM activity sampled through GPM."""
        by_gi = read_mig(self._nvml, self._calls, gpu.scope, gpu.handle, r)
        for gi_id, instance in by_gi.items():
            if gpu.gpm:
                key = (gpu.index, gi_id)
                gpm_keys.append(key)
                values = self._gpm.sample(
                    self._calls, gpu.scope, gpu.handle, key, MIG_METRICS, gi_id
                )
                for attr, value in values.items():
                    setattr(instance, attr, value)
            r.mig_instances.append(instance)

    def _read_nvlink(self, gpu: _Gpu, fields: dict[str, float], r: GpuReading) -> None:
        """Bytes per second over every NVLink since the last collection (NVML counts KiB)."""
        tx, rx = fields.get("nvlink_tx_kib"), fields.get("nvlink_rx_kib")
        total = None if tx is None or rx is None else (tx + rx) * 1024.0
        when = self._fields.times.get("nvlink_tx_kib", 0.0)  # the driver's time of the value
        r.nvlink_bytes_per_second = self._nvlink.of(gpu.uuid or gpu.index, total, when)

    def _read_processes(self, gpu: _Gpu, r: GpuReading) -> None:
        r.processes = self._processes.read(
            self._calls, gpu.index, gpu.handle, self.attribution, utilization=not r.mig_enabled
        )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
