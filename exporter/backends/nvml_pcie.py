"""PCIe throughput on its own thread and cadence, off the collection path.

`nvmlDeviceGetPcieThroughput` holds a 20 ms counter window in the driver per call: two
directions on eight GPUs is ~320 ms, more than the rest of a cycle together. So a sampler
thread reads them every `interval` seconds and a collection copies the latest values.
Only the sampler touches its own `NvmlCalls`; errors are handed over under a lock. A value
older than `STALE_INTERVALS` intervals and `STALE_MIN_S` (a sampler stuck in the driver) is no
value: the series disappear instead of freezing at the last reading.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from exporter.backends.nvml_calls import GpuLost, NvmlCalls

KIB = 1024.0  # NVML's PCIe throughput "KB/s" are KiB/s (nvitop, nvidia-smi agree)
STALE_INTERVALS = 3.0  # a sample older than this many sampler intervals ...
STALE_MIN_S = 60.0  # ... and than this (a busy host may lag a short interval) is not served


class PcieSampler:
    """Latest (tx, rx) bytes/s per GPU index, refreshed every `interval` seconds."""

    def __init__(
        self, nvml: Any, interval: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._nvml = nvml
        self._interval = interval
        self._clock = clock
        self._calls = NvmlCalls(nvml)
        self._errors: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._handles: dict[int, Any] = {}
        self._latest: dict[int, tuple[float | None, float | None, float]] = {}  # tx, rx, when
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def set_device(self, index: int, handle: Any) -> None:
        with self._lock:
            self._handles[index] = handle

    def set_handles(self, handles: dict[int, Any]) -> None:
        """The handles of a new NVML session, replacing all others (while stopped)."""
        with self._lock:
            self._handles = dict(handles)

    def renumber(self, moved: dict[int, int]) -> None:
        """Follow GPUs to their new index (old -> new) after NVML enumerated them again, so
        their last values and call memory stay theirs; others are dropped. While stopped."""
        with self._lock:
            self._latest = {moved[i]: v for i, v in self._latest.items() if i in moved}
        self._calls.renumber(moved)

    def start(self, *, first_sample: bool = True) -> None:
        """Take the first sample now (so the first collection has it), then keep sampling;
        `first_sample=False` resumes with the values kept (after a re-initialisation)."""
        self._stop.clear()
        if first_sample:
            self.sample_once()
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="nvml-pcie", daemon=True)
            self._thread.start()

    def stop(self) -> bool:
        """Stop the thread; False if it is still inside the driver (its handles are in use)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
            if self._thread.is_alive():
                return False
            self._thread = None
        return True

    def latest(self, index: int) -> tuple[float | None, float | None]:
        """The last (tx, rx) bytes/s, or (None, None) when none is fresh enough."""
        with self._lock:
            sample = self._latest.get(index)
        max_age = max(STALE_INTERVALS * self._interval, STALE_MIN_S)
        if sample is None or self._clock() - sample[2] > max_age:
            return None, None
        return sample[0], sample[1]

    def take_errors(self) -> Counter[str]:
        with self._lock:
            errors, self._errors = self._errors, Counter()
        return errors

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.sample_once()

    def sample_once(self) -> None:
        nvml = self._nvml
        with self._lock:
            handles = dict(self._handles)
        for index, handle in handles.items():
            scope = f"gpu{index}"
            try:
                tx = self._read(scope, handle, nvml.NVML_PCIE_UTIL_TX_BYTES, "pcie_tx")
                rx = self._read(scope, handle, nvml.NVML_PCIE_UTIL_RX_BYTES, "pcie_rx")
            except GpuLost:
                tx = rx = None
            with self._lock:
                self._latest[index] = (tx, rx, self._clock())
        errors = self._calls.take_errors()
        with self._lock:
            self._errors.update(errors)

    def _read(self, scope: str, handle: Any, counter: int, key: str) -> float | None:
        value = self._calls(scope, "nvmlDeviceGetPcieThroughput", handle, counter, key=key)
        return float(value) * KIB if value is not None else None
