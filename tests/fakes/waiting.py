"""Waiting in tests that start servers: on the event itself (a route answers, a counter moves, a
line is logged), for as long as the process that should bring it is alive, never on a budget
of seconds tuned to an idle machine. On a machine loaded by other jobs (load average 7-8 on 2
cores) every server is several times slower, and a 40-s readiness budget failed tests whose
servers were only slow.

`CAP_S` is a safety net under pytest-timeout's 300 s per test, not a budget: a server that dies
ends the wait at once with its own last words, and one that hangs fails with what it was
waited for. Work that must be prompt is bounded in CPU seconds of the process (`cpu_seconds`),
which a busy machine does not inflate the way it inflates wall time.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

T = TypeVar("T")
CAP_S = 240.0
POLL_S = 0.1


def wait_until(
    check: Callable[[], T | None],
    what: str,
    process: subprocess.Popen | None = None,
    cap_s: float = CAP_S,
) -> T:
    """`check()`'s first truthy value, polled until it comes; fails at once if `process` exits
    first (naming its stderr tail where it was piped), or after `cap_s`."""
    deadline = time.monotonic() + cap_s
    while True:
        value = check()
        if value:
            return value
        if process is not None and process.poll() is not None:
            pytest.fail(f"{what}: the process exited ({process.returncode}) first{_tail(process)}")
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {cap_s:.0f} s (the process is still running)")
        time.sleep(POLL_S)


def _tail(process: subprocess.Popen) -> str:
    if process.stderr is None or process.stderr.closed:
        return ""
    return f":\n{process.stderr.read()[-3000:]}"


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds the live process `pid` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def reap(process: subprocess.Popen, cap_s: float = CAP_S) -> float:
    """Wait for `process` to exit; its total CPU seconds (user + system) from the kernel's
    accounting at exit. Fails (and kills it) if it runs past `cap_s`."""
    deadline = time.monotonic() + cap_s
    while True:
        pid, status, usage = os.wait4(process.pid, os.WNOHANG)
        if pid:
            process.returncode = os.waitstatus_to_exitcode(status)
            return usage.ru_utime + usage.ru_stime
        if time.monotonic() > deadline:
            process.kill()
            process.wait()
            pytest.fail(f"still running {cap_s:.0f} s after it was asked to stop")
        time.sleep(POLL_S)
