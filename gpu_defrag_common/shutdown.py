"""SIGTERM and SIGINT as something a server's main thread can wait for, with certainty.

A signal sent to a process goes to any one of its threads that does not block it (POSIX, and
Linux does pick others). CPython's C-level handler, run in that thread, only marks the signal
pending; the Python handler runs when the *main* thread next executes bytecode. A main thread
asleep in `threading.Event.wait()` (a futex wait) is woken only by a signal delivered to itself,
so when the kernel chose one of the ~100 connection threads, or a thread OpenBLAS or jemalloc
start at import, the handler never ran and the process served on until a second signal
(measured: `Handlers[SIGTERM].tripped == 1` while the main thread slept in `sem_wait`).

`signal.set_wakeup_fd` makes the C handler, in whichever thread it runs, also write the signal's
number to a socket; the main thread sleeps in `select` on that socket instead of on a lock, and
wakes for every signal. The wait also looks at the flag once a second, should a byte be lost.
"""

from __future__ import annotations

import contextlib
import select
import signal
import socket
import threading
import time
from collections.abc import Iterable
from types import FrameType

SHUTDOWN_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_WAKE = b"\0"  # no signal has number 0: the byte `wake()` writes


class ShutdownSignals:
    """Install with `install()` in the main thread; `wait()` there; `is_set()` anywhere."""

    def __init__(self, signals: Iterable[signal.Signals] = SHUTDOWN_SIGNALS) -> None:
        self.signals = tuple(signals)
        self.received: signal.Signals | None = None
        self._reader, self._writer = socket.socketpair()
        self._reader.setblocking(False)
        self._writer.setblocking(False)
        self._previous: dict[signal.Signals, object] = {}
        self._previous_fd: int | None = None
        self._lock = threading.Lock()  # `wake()` from any thread; never taken by the handler

    def install(self) -> ShutdownSignals:
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("signal handlers can only be installed from the main thread")
        self._previous_fd = signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        # Runs in the main thread between two bytecodes: sets a plain attribute, takes no lock
        # (a lock the main thread held at that moment would never be released).
        self.received = signal.Signals(signum)

    def is_set(self) -> bool:
        return self.received is not None

    def wake(self) -> None:
        """Ends a `wait()` in progress (or the next one) without a signal: work that the main
        thread waits for beside the signals (the advisor's backfill) says it has finished."""
        with self._lock, contextlib.suppress(OSError):  # full of wake-ups already: enough
            self._writer.send(_WAKE)

    def wait(self, timeout: float | None = None, *, or_woken: bool = False) -> bool:
        """Sleep until a shutdown signal arrives or `timeout` passes (or, with `or_woken`, a
        `wake()` is called); True when a shutdown signal has arrived."""
        remaining = threading.TIMEOUT_MAX if timeout is None else timeout
        deadline = time.monotonic() + remaining
        while not self.is_set():
            readable, _, _ = select.select([self._reader], [], [], min(max(remaining, 0), 1.0))
            if readable and self._drain() and or_woken:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
        return self.is_set()

    def _drain(self) -> bool:
        """Read what the C handler and `wake()` wrote; True when a wake-up was among it."""
        try:
            data = self._reader.recv(4096)
        except BlockingIOError:
            return False
        for number in data:
            if number in self.signals:
                self.received = signal.Signals(number)
        return _WAKE[0] in data

    def close(self) -> None:
        """Restore the handlers and wakeup fd found at `install()`."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        if self._previous_fd is not None:
            signal.set_wakeup_fd(self._previous_fd)
        self._reader.close()
        self._writer.close()
