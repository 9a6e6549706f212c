"""Event-driven XID counting: a watcher thread, so no XID is missed between scrapes.

dcgm-exporter only shows the last XID code; repeated identical XIDs are invisible
(NVIDIA/dcgm-exporter#190). Here every `nvmlEventTypeXidCriticalError` event is counted by
(GPU, XID code) with the time of the last one, as utkuozdemir/nvidia_gpu_exporter does. The
thread waits in one-second slices, ignores timeouts, and survives NVML errors with backoff.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

# XIDs after which NVIDIA's XID catalog (docs.nvidia.com/deploy/xid-errors) asks for a GPU
# reset, a drain or hardware service rather than an application fix: 48 double-bit ECC, 62
# internal micro-controller halt, 64 row-remap / page-retirement failure, 74 NVLink error,
# 79 GPU fell off the bus, 95 uncontained ECC, 119/120 GSP timeout / error, 140 unrecovered
# ECC. The same list as the "hardware" class in alerts/config.yaml (critical alert); the
# contained memory errors (63, 92, 94) warn there but leave the GPU usable here.
FATAL_XIDS: frozenset[int] = frozenset({48, 62, 64, 74, 79, 95, 119, 120, 140})


class XidWatcher:
    """Counts XID events per (GPU index, code) from a background thread."""

    def __init__(
        self,
        nvml: Any,
        handles: dict[int, Any],
        *,
        wait_ms: int = 1000,
        backoff_s: float = 1.0,
        max_backoff_s: float = 60.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._nvml = nvml
        self._handles = dict(handles)
        self._by_address = {_address(h): index for index, h in self._handles.items()}
        self._wait_ms = wait_ms
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        self._clock = clock
        self._lock = threading.Lock()
        self._counts: Counter[tuple[int, int]] = Counter()
        self._last: dict[int, float] = {}
        self._last_code: dict[int, int] = {}
        self._errors: Counter[str] = Counter()
        self._stop = threading.Event()
        self._reopen = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start watching, or resume a thread whose stop did not complete."""
        self._stop.clear()
        if (self._thread is None or not self._thread.is_alive()) and self._handles:
            self._thread = threading.Thread(target=self._run, name="nvml-xid", daemon=True)
            self._thread.start()

    def stop(self) -> bool:
        """Stop the thread; False if it is still inside the driver (its event set is in use)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self._wait_ms / 1000 + 2.0)
            if self._thread.is_alive():
                return False
            self._thread = None
        return True

    def set_handles(self, handles: dict[int, Any]) -> None:
        """The handles of a new NVML session, replacing all others (while stopped)."""
        with self._lock:
            self._handles = dict(handles)
            self._by_address = {_address(h): index for index, h in self._handles.items()}

    def renumber(self, moved: dict[int, int]) -> None:
        """Follow GPUs to their new index (old -> new), so their counts keep counting up
        across a re-initialisation of NVML; the counts of GPUs left out are dropped."""
        with self._lock:
            counts: Counter[tuple[int, int]] = Counter()
            for (index, xid), n in self._counts.items():
                if index in moved:
                    counts[(moved[index], xid)] = n
            self._counts = counts
            self._last = {moved[i]: t for i, t in self._last.items() if i in moved}
            self._last_code = {moved[i]: c for i, c in self._last_code.items() if i in moved}

    def add_device(self, index: int, handle: Any) -> None:
        """Watch one more GPU (attached after start); the event set is rebuilt for it."""
        with self._lock:
            self._handles[index] = handle
            self._by_address[_address(handle)] = index
        self._reopen.set()
        self.start()

    def counts(self, index: int) -> dict[int, float]:
        """XID code -> events seen on GPU `index` since the exporter started."""
        with self._lock:
            return {xid: float(n) for (gpu, xid), n in self._counts.items() if gpu == index}

    def last_timestamp(self, index: int) -> float | None:
        with self._lock:
            return self._last.get(index)

    def last_code(self, index: int) -> int:
        """The code of the last XID seen on GPU `index`, 0 when none since the start (as
        DCGM's last-XID field reads 0 without one)."""
        with self._lock:
            return self._last_code.get(index, 0)

    def take_errors(self) -> Counter[str]:
        with self._lock:
            errors, self._errors = self._errors, Counter()
        return errors

    # ----- thread -------------------------------------------------------------------------

    def _run(self) -> None:
        backoff = self._backoff_s
        while not self._stop.is_set():
            event_set = self._open()
            if event_set is not None:
                try:
                    seen = self._wait_loop(event_set)
                finally:
                    self._call("nvmlEventSetFree", event_set)
                if self._reopen.is_set():
                    continue  # a GPU was added: rebuild the set at once
                if seen:
                    backoff = self._backoff_s  # events were flowing: start backoff afresh
            if self._stop.wait(backoff):
                return
            backoff = min(backoff * 2, self._max_backoff_s)

    def _open(self) -> Any:
        """An event set with XID events registered on every GPU that supports them."""
        event_set = self._call("nvmlEventSetCreate")
        if event_set is None:
            return None
        registered = 0
        self._reopen.clear()
        with self._lock:
            handles = list(self._handles.values())
        for handle in handles:
            if self._call(
                "nvmlDeviceRegisterEvents",
                handle,
                self._nvml.nvmlEventTypeXidCriticalError,
                event_set,
                quiet=(self._nvml.NVML_ERROR_NOT_SUPPORTED,),
                ok=True,
            ):
                registered += 1
        if registered == 0:
            self._call("nvmlEventSetFree", event_set)
            return None
        return event_set

    def _wait_loop(self, event_set: Any) -> bool:
        """Wait for events until stopped or NVML fails; True if any event arrived."""
        nvml, seen = self._nvml, False
        while not self._stop.is_set():
            if self._reopen.is_set():
                return seen
            try:
                data = nvml.nvmlEventSetWait(event_set, self._wait_ms)
            except nvml.NVMLError as error:
                if getattr(error, "value", None) == nvml.NVML_ERROR_TIMEOUT:
                    continue
                self._count_error("nvmlEventSetWait", error)
                return seen
            if data.eventType & nvml.nvmlEventTypeXidCriticalError:
                self._record(data)
                seen = True
        return seen

    def _record(self, data: Any) -> None:
        with self._lock:
            index = self._by_address.get(_address(data.device))
        if index is None:
            try:
                index = int(self._nvml.nvmlDeviceGetIndex(data.device))
            except self._nvml.NVMLError as error:
                self._count_error("nvmlDeviceGetIndex", error)
                return
        with self._lock:
            self._counts[(index, int(data.eventData))] += 1
            self._last[index] = self._clock()
            self._last_code[index] = int(data.eventData)

    def _call(self, name: str, *args: Any, quiet: tuple[int, ...] = (), ok: bool = False) -> Any:
        try:
            result = getattr(self._nvml, name)(*args)
        except self._nvml.NVMLError as error:
            if getattr(error, "value", None) not in quiet:
                self._count_error(name, error)
            return False if ok else None
        return True if ok else result

    def _count_error(self, name: str, error: Exception) -> None:
        log.debug("XID watcher: %s failed: %s", name, error)
        with self._lock:
            self._errors[name] += 1


def _address(handle: Any) -> int | None:
    """A device handle's pointer value: the driver hands out one per GPU."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return None
