"""One guarded way to make NVML calls, so a failing call costs one value, never a cycle.

Every call goes through `NvmlCalls`: an error leaves that value None and is counted by call
name (the exporter's self-metrics); "not supported" answers are remembered per GPU and call,
so a feature a card lacks is asked about once, not every cycle; a GPU that fell off the bus
raises `GpuLost` so the caller can stop asking that GPU anything else this cycle.
"""

from __future__ import annotations

from collections import Counter
from typing import Any


class GpuLost(Exception):
    """NVML answered NVML_ERROR_GPU_IS_LOST: the GPU fell off the bus or needs a reset."""

    def __init__(self, call: str) -> None:
        super().__init__(f"GPU is lost ({call})")
        self.call = call


class NvmlCalls:
    """Runs NVML calls with per-call error accounting and a not-supported memory."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.errors: Counter[str] = Counter()
        self._unsupported: set[tuple[str, str]] = set()
        # Answers that will not change by asking again: the function or feature is absent,
        # or the struct version is unknown to this driver.
        self._never = {
            nvml.NVML_ERROR_NOT_SUPPORTED,
            nvml.NVML_ERROR_FUNCTION_NOT_FOUND,
            nvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
        }
        self._lost = nvml.NVML_ERROR_GPU_IS_LOST
        # Answers about the library, not one GPU: NVML must be initialised afresh.
        self._library = {
            nvml.NVML_ERROR_UNINITIALIZED,
            nvml.NVML_ERROR_DRIVER_NOT_LOADED,
            nvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
        }
        self.library_error: Exception | None = None

    def __call__(
        self,
        scope: str,
        name: str,
        *args: Any,
        key: str | None = None,
        quiet: tuple[int, ...] = (),
        **kwargs: Any,
    ) -> Any:
        """`nvml.<name>(*args, **kwargs)`, or None when it failed or is known unsupported.

        `scope` names the device ("gpu3", "gpu3/mig", "system"); `key` distinguishes calls of
        one function with different arguments (the SM vs the memory clock); error codes in
        `quiet` are expected answers (e.g. NOT_FOUND: no samples yet) and are not counted.
        """
        memo = (scope, key or name)
        if memo in self._unsupported:
            return None
        try:
            return getattr(self.nvml, name)(*args, **kwargs)
        except self.nvml.NVMLError as error:
            code = getattr(error, "value", None)
            if code == self._lost:
                self.errors[name] += 1
                raise GpuLost(name) from error
            if code in self._library and self.library_error is None:
                self.library_error = error
            if code in self._never:
                self._unsupported.add(memo)
                return None
            if code not in quiet:
                self.errors[name] += 1
            return None

    def supported(self, scope: str, key: str) -> bool:
        """False once `key` answered not-supported for `scope`."""
        return (scope, key) not in self._unsupported

    def mark_unsupported(self, scope: str, key: str) -> None:
        self._unsupported.add((scope, key))

    def take_errors(self) -> Counter[str]:
        """The errors counted since the last call (one collection's worth)."""
        errors, self.errors = self.errors, Counter()
        return errors
