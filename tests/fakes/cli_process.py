"""A `gpu-defrag` subcommand run as a real process on 127.0.0.1, as a user would start it.

It listens on port 0 and the test learns the port the kernel gave it from /proc: a port picked
free beforehand can be taken by another test's server in between (the suite runs in parallel
workers), and the readiness check then talks to that server while this one never started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import requests

from tests.fakes.waiting import CAP_S, wait_until

LISTEN = "0A"  # a TCP socket's state in /proc/net/tcp: listening


@contextmanager
def cli_process(
    command: str, *args: str, ready: str = "/-/healthy", timeout_s: float = CAP_S
) -> Iterator[tuple[str, subprocess.Popen]]:
    """Start `gpu-defrag COMMAND --web.listen-address 127.0.0.1:0 ARGS`, wait until it listens
    and `ready` answers 200 there (or the process exits: the test fails with its stderr), yield
    (base URL, process); SIGTERM (then kill) when the block ends. `timeout_s` is only the net
    for a server that hangs (tests/fakes/waiting.py), not a budget for a slow one."""
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "advisor.cli",
            command,
            "--web.listen-address",
            "127.0.0.1:0",
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        port = wait_until(
            lambda: listening_port(process.pid), f"{command} listening", process, timeout_s
        )
        base = f"http://127.0.0.1:{port}"
        wait_until(
            lambda: answers(base + ready), f"{command} {ready} answering 200", process, timeout_s
        )
        yield base, process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=CAP_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def answers(url: str) -> bool:
    """Whether `url` answers 200 now (no answer yet is no error: the server may be starting)."""
    try:
        return requests.get(url, timeout=10).status_code == 200
    except (requests.ConnectionError, requests.Timeout):
        return False


def listening_port(pid: int) -> int | None:
    """The TCP port process `pid` listens on (its first), None while it listens on none."""
    sockets = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                sockets.add(target[8:-1])
        tables = [Path(f"/proc/{pid}/net/{name}").read_text() for name in ("tcp", "tcp6")]
    except OSError:  # the process has exited (wait_until says so) or closes an fd right now
        return None
    for table in tables:
        for line in table.splitlines()[1:]:
            fields = line.split()
            if fields[3] == LISTEN and fields[9] in sockets:
                return int(fields[1].rsplit(":", 1)[1], 16)
    return None
