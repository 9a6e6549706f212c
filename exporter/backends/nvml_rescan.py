"""Finding GPUs added, reset or removed while the exporter runs, without a restart.

NVML fixes its device list at `nvmlInit` and counts `nvmlInit` calls, so this process cannot
look again without shutting its own session down, and every handle with it. A child process
can (nvidia_gpu_exporter gets the same from running nvidia-smi on every scrape): it
initialises, reads each index's UUID and exits. The backend re-initialises its own session
only when that list differs from the one it serves, so a driver that fails or hangs on init
costs a rescan, never the GPUs being served. `python -m exporter.backends.nvml_rescan` prints
the list. `Rescans` says when to look: every interval, sooner after a GPU went lost, and again
after a failed look, with one log line per failure (not per retry).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger(__name__)

Devices = list[str | None]  # UUID per NVML index; None where that GPU cannot be read (lost)
Probe = Callable[[], Devices]

RESCAN_S = 300.0  # default --nvml.rescan-interval
LOST_RESCAN_S = 60.0  # a GPU newly lost brings the next rescan forward, at most this often
RETRY_S = 60.0  # a rescan that failed is tried again after this long
PROBE_WAIT_S = 2.0  # a collection waits this long for the probe; a slower answer waits a cycle


class ProbeFailed(Exception):
    """The probe gave no list; the message is one line."""


def list_devices(nvml: Any) -> Devices:
    """Initialise NVML, read every index's UUID, shut down: one session's view of the node."""
    nvml.nvmlInit()
    try:
        devices: Devices = []
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                uuid = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(index))
            except nvml.NVMLError:
                devices.append(None)
            else:
                devices.append(uuid.decode() if isinstance(uuid, bytes) else str(uuid))
        return devices
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()


class SubprocessProbe:
    """`list_devices` in a child process, killed after `timeout` seconds.

    A child stuck in the driver may not die at once (uninterruptible sleep); until it has,
    no second one is started, so a hung driver costs one process, not one per retry.
    """

    def __init__(self, timeout: float, command: Sequence[str] | None = None) -> None:
        self.timeout = timeout
        self.command = list(command or (sys.executable, "-m", __name__))
        self._stuck: subprocess.Popen[str] | None = None

    def __call__(self) -> Devices:
        if self._stuck is not None:
            if self._stuck.poll() is None:
                raise ProbeFailed("the previous probe is still stuck in the driver")
            self._stuck = None
        try:
            child = subprocess.Popen(
                self.command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        except OSError as error:
            raise ProbeFailed(f"cannot start the probe: {error}") from None
        try:
            out, err = child.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            try:
                child.communicate(timeout=1.0)
            except subprocess.TimeoutExpired:
                self._stuck = child
            raise ProbeFailed(f"the probe did not finish within {self.timeout:g}s") from None
        return parse_answer(out, err, child.returncode)


def parse_answer(out: str, err: str, code: int | None) -> Devices:
    """The device list from the probe's last output line, or ProbeFailed with its error."""
    lines = out.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else None
    except ValueError:
        answer = None
    if isinstance(answer, dict) and isinstance(answer.get("error"), str):
        raise ProbeFailed(" ".join(answer["error"].split()) or "unknown error")
    devices = answer.get("devices") if isinstance(answer, dict) else None
    if isinstance(devices, list) and all(d is None or isinstance(d, str) for d in devices):
        return devices
    last = (err.strip().splitlines() or ["no output"])[-1]
    raise ProbeFailed(f"the probe exited with {code}: {' '.join(last.split())}")


class Rescans:
    """When to look for GPUs again, and the probe's answer when one came.

    `interval` 0 turns rescans off. Without a probe every rescan re-initialises NVML.
    """

    def __init__(
        self,
        interval: float,
        probe: Probe | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval = interval
        self.probe = probe
        self._clock = clock
        self._last = -math.inf  # when the last rescan began
        self._at = math.inf  # when the next one is due (set once the first session is up)
        self._running: tuple[threading.Thread, dict[str, Any]] | None = None
        self._failing: str | None = None  # the failure logged last, until a rescan works
        self._errors: Counter[str] = Counter()

    def begin(self) -> None:
        """The first NVML session is up: the first rescan is one interval away."""
        if self.interval > 0 and self._at == math.inf:
            self._last = self._clock()
            self._at = self._last + self.interval

    def lost_seen(self) -> None:
        """A GPU just went lost: it may be gone, or come back under a new enumeration."""
        if self.interval > 0:
            self._at = min(self._at, self._last + LOST_RESCAN_S)

    def take_due(self) -> bool:
        """True when a rescan should run (or a probe is still answering); starts the clock."""
        if self._running is not None:
            return True
        now = self._clock()
        if self.interval <= 0 or now < self._at:
            return False
        self._last, self._at = now, now + self.interval
        return True

    def look(self) -> Devices | None:
        """The probe's list; None while it runs, or when it failed (logged, retried later)."""
        if self._running is None:
            assert self.probe is not None, "look() needs a probe"
            self._running = _spawn(self.probe)
            wait = PROBE_WAIT_S
        else:
            wait = 0.0  # started in an earlier cycle: pick the answer up if it is there
        thread, outcome = self._running
        thread.join(wait)
        if thread.is_alive():
            return None
        self._running = None
        if "error" in outcome:
            self.failed(f"{outcome['error']}; the GPUs known are still served")
            return None
        return outcome["devices"]

    def failed(self, text: str) -> None:
        """One line per new failure, then a retry after RETRY_S (or the interval if shorter)."""
        self._errors["rescan"] += 1
        retry = min(RETRY_S, self.interval)
        if text != self._failing:
            log.warning("NVML GPU rescan failed: %s (next try in %gs)", text, retry)
        self._failing = text
        self._at = min(self._at, self._last + retry)

    def succeeded(self) -> None:
        if self._failing is not None:
            log.info("NVML GPU rescan works again")
            self._failing = None

    def take_errors(self) -> Counter[str]:
        """Failed rescans since the last call, counted as the call "rescan"."""
        errors, self._errors = self._errors, Counter()
        return errors


def match(known: Sequence[tuple[int, str]], listed: Sequence[str | None]) -> list[int | None]:
    """For each listed index, the position in `known` ((index, UUID) pairs) of that GPU, or
    None for a GPU not known. The UUID is the identity; an index NVML cannot read (lost) is
    taken for the GPU known at that index when that one's UUID is listed nowhere else (give
    index -1 for a GPU to be found by UUID only)."""
    by_uuid = {uuid: pos for pos, (_, uuid) in enumerate(known) if uuid}
    by_index = {index: pos for pos, (index, _) in enumerate(known)}
    found = {uuid for uuid in listed if uuid}
    out: list[int | None] = []
    taken: set[int] = set()
    for index, uuid in enumerate(listed):
        pos = by_uuid.get(uuid) if uuid else by_index.get(index)
        if pos is not None and not uuid and known[pos][1] in found:
            pos = None  # that GPU is listed elsewhere now
        if pos in taken:
            pos = None
        if pos is not None:
            taken.add(pos)
        out.append(pos)
    return out


def _spawn(probe: Probe) -> tuple[threading.Thread, dict[str, Any]]:
    """Run the probe on its own thread: a slow one must not hold the collection up."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["devices"] = probe()
        except Exception as error:  # reported to the caller as one line, not raised here
            outcome["error"] = " ".join(str(error).split()) or type(error).__name__

    thread = threading.Thread(target=run, name="nvml-rescan", daemon=True)
    thread.start()
    return thread, outcome


def main() -> int:
    try:
        import pynvml
    except ImportError:
        print(json.dumps({"error": "python module pynvml is missing (pip install nvidia-ml-py)"}))
        return 1
    try:
        devices = list_devices(pynvml)
    except pynvml.NVMLError as error:
        print(json.dumps({"error": str(error) or type(error).__name__}))
        return 1
    print(json.dumps({"devices": devices}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
