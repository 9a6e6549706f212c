"""One guarded way to make NVML calls, so a failing call costs one value, never a cycle.

Every call goes through `NvmlCalls`: an error leaves that value None, is counted by call name
(the exporter's self-metrics) and is said in one log line naming the GPU, the call and the
NVML error when that (GPU, call) starts failing or fails differently, not every cycle.
"Not supported" answers are remembered per GPU and call, so a feature a card lacks is not
asked about every cycle; but some answers depend on the GPU's state (MIG mode makes
utilization and remapped rows unsupported), so the memory is dropped when the backend says
the GPU changed (`forget`) and expires after `reprobe_s` anyway. A GPU that fell off the bus
raises `GpuLost` so the caller can stop asking that GPU anything else this cycle.

A function the installed nvidia-ml-py does not have (an older release than the driver's API)
is one more "not supported" for the value it reads, remembered like the driver's answer, with
one log line per function naming the release: never an AttributeError that stops the cycle.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

# The oldest nvidia-ml-py release that has every function and constant the backend reads (the
# floor pyproject.toml declares): with an older one, what it lacks is read as not supported.
PYNVML_FLOOR = "12.570.86"
REPROBE_S = 600.0  # how long a not-supported answer is trusted before asking again
_GPU_SCOPE = re.compile(r"gpu(\d+)(/mig)?$")


class GpuLost(Exception):
    """NVML answered NVML_ERROR_GPU_IS_LOST: the GPU fell off the bus or needs a reset."""

    def __init__(self, call: str) -> None:
        super().__init__(f"GPU is lost ({call})")
        self.call = call


class NvmlCalls:
    """Runs NVML calls with per-call error accounting, change logging and a not-supported memo."""

    def __init__(
        self,
        nvml: Any,
        *,
        clock: Callable[[], float] = time.monotonic,
        reprobe_s: float = REPROBE_S,
    ) -> None:
        self.nvml = nvml
        self.errors: Counter[str] = Counter()
        self._clock = clock
        self._reprobe_s = reprobe_s
        self._unsupported: dict[tuple[str, str], float] = {}  # memo -> when it said so
        self._failing: dict[tuple[str, str], int | None] = {}  # memo -> its error code now
        self._error_names = error_names(nvml)
        # Answers that will not change by asking again soon: the function or feature is
        # absent, or the struct version is unknown to this driver.
        self._never = {
            nvml.NVML_ERROR_NOT_SUPPORTED,
            nvml.NVML_ERROR_FUNCTION_NOT_FOUND,
            getattr(nvml, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH", nvml.NVML_ERROR_NOT_SUPPORTED),
        }
        self._absent: set[str] = set()  # functions this nvidia-ml-py lacks, said once each
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
        essential: bool = False,
        **kwargs: Any,
    ) -> Any:
        """`nvml.<name>(*args, **kwargs)`, or None when it failed or is known unsupported.

        `scope` names the device ("gpu3", "gpu3/mig", "system"); `key` distinguishes calls of
        one function with different arguments (the SM vs the memory clock); error codes in
        `quiet` are expected answers (e.g. NOT_FOUND: no samples yet) and are not counted.
        An `essential` call (the device handle) has no "not supported": every error is one.
        """
        memo_key = key or name
        if not self.supported(scope, memo_key):
            return None
        function = getattr(self.nvml, name, None)
        if function is None:
            self._lacks(name)
            self.mark_unsupported(scope, memo_key, name=name)
            return None
        try:
            result = function(*args, **kwargs)
        except self.nvml.NVMLError as error:
            code = getattr(error, "value", None)
            if code == self._lost:
                self.failed(scope, name, code, key=key)
                raise GpuLost(name) from error
            if code in self._library and self.library_error is None:
                self.library_error = error
            if code in self._never and not essential:
                self.mark_unsupported(scope, memo_key, name=name, code=code)
            elif code in quiet:
                self.succeeded(scope, memo_key, name=name)
            else:
                self.failed(scope, name, code, key=key)
            return None
        self.succeeded(scope, memo_key, name=name)
        return result

    def _lacks(self, name: str) -> None:
        """One line per function the installed nvidia-ml-py does not have."""
        if name in self._absent:
            return
        self._absent.add(name)
        log.warning(
            "nvidia-ml-py %s has no %s: a value only it reads is left out "
            "(nvidia-ml-py >= %s has every call this exporter makes)",
            library_version(self.nvml),
            name,
            PYNVML_FLOOR,
        )

    # ----- failures ----------------------------------------------------------------------

    def failed(self, scope: str, name: str, code: int | None, *, key: str | None = None) -> None:
        """Count one failed call; log it when this (scope, call) was not failing this way."""
        self.errors[name] += 1
        memo = (scope, key or name)
        if memo not in self._failing or self._failing[memo] != code:
            self._failing[memo] = code
            call = name if key is None or key == name else f"{name} [{key}]"
            log.warning("NVML %s: %s failed: %s", where(scope), call, self.error_name(code))

    def succeeded(self, scope: str, key: str, *, name: str | None = None) -> None:
        """Note a good answer; one line if this (scope, call) was failing until now."""
        if self._failing and (scope, key) in self._failing:
            del self._failing[(scope, key)]
            call = key if name is None or name == key else f"{name} [{key}]"
            log.info("NVML %s: %s answers again", where(scope), call)

    def failing(self, scope: str, key: str) -> int | None:
        """The NVML error code `key` fails with on `scope` now, None if it is not failing."""
        return self._failing.get((scope, key))

    def error_name(self, code: int | None) -> str:
        return self._error_names.get(code, f"NVML error {code}") if code is not None else "?"

    def take_errors(self) -> Counter[str]:
        """The errors counted since the last call (one collection's worth)."""
        errors, self.errors = self.errors, Counter()
        return errors

    # ----- not-supported memo ------------------------------------------------------------

    def supported(self, scope: str, key: str) -> bool:
        """False while `key` is remembered as not supported on `scope` (at most `reprobe_s`)."""
        since = self._unsupported.get((scope, key))
        if since is None:
            return True
        if self._clock() - since >= self._reprobe_s:
            del self._unsupported[(scope, key)]
            return True
        return False

    def mark_unsupported(
        self, scope: str, key: str, *, name: str | None = None, code: int | None = None
    ) -> None:
        memo = (scope, key)
        self._unsupported[memo] = self._clock()
        if code is not None and (memo not in self._failing or self._failing[memo] != code):
            self._failing[memo] = code
            call = key if name is None or name == key else f"{name} [{key}]"
            log.debug("NVML %s: %s: %s", where(scope), call, self.error_name(code))

    def forget(self, scope: str) -> None:
        """Drop the not-supported memory of one GPU (and its MIG devices): its state changed."""
        nested = scope + "/"
        for memo in [m for m in self._unsupported if m[0] == scope or m[0].startswith(nested)]:
            del self._unsupported[memo]

    def renumber(self, moved: dict[int, int], *, by_index: frozenset[str] = frozenset()) -> None:
        """Follow GPUs to their new index after NVML enumerated them again (old -> new); the
        memory of GPUs left out of `moved` is dropped. Other scopes ("system") stay, and so do
        the `by_index` calls: answers about an index of the new session, asked to list it."""
        self._unsupported = _renumbered(self._unsupported, moved, by_index)
        self._failing = _renumbered(self._failing, moved, by_index)


def _renumbered(
    memory: dict[tuple[str, str], Any], moved: dict[int, int], by_index: frozenset[str]
) -> dict:
    out = {memo: value for memo, value in memory.items() if memo[1] in by_index}
    for (scope, key), value in memory.items():
        match = _GPU_SCOPE.match(scope)
        if match is None:
            out[(scope, key)] = value
        elif key not in by_index and int(match.group(1)) in moved:
            out.setdefault((f"gpu{moved[int(match.group(1))]}{match.group(2) or ''}", key), value)
    return out


def where(scope: str) -> str:
    """ "gpu3" -> "GPU 3", "gpu3/mig" -> "GPU 3 MIG device", anything else as it is."""
    match = _GPU_SCOPE.match(scope)
    if match is None:
        return scope
    return f"GPU {match.group(1)}" + (" MIG device" if match.group(2) else "")


def library_version(nvml: Any) -> str:
    """The installed nvidia-ml-py release (the distribution's version), "?" where unknown."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nvidia-ml-py")
    except PackageNotFoundError:
        return getattr(nvml, "__version__", "?")


def error_names(nvml: Any) -> dict[int, str]:
    """NVML error code -> constant name, from the real pynvml module behind `nvml`."""
    module = sys.modules.get(getattr(nvml.NVMLError, "__module__", ""), nvml)
    names: dict[int, str] = {}
    for name, value in vars(module).items():
        if name.startswith("NVML_ERROR_") and isinstance(value, int):
            names.setdefault(value, name)
    return names
