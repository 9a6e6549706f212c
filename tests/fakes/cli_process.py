"""A `gpu-defrag` subcommand run as a real process on 127.0.0.1, as a user would start it."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import requests

from advisor.app.cli import free_port
from tests.fakes.waiting import CAP_S, wait_until


@contextmanager
def cli_process(
    command: str, *args: str, ready: str = "/-/healthy", timeout_s: float = CAP_S
) -> Iterator[tuple[str, subprocess.Popen]]:
    """Start `gpu-defrag COMMAND --web.listen-address 127.0.0.1:<free port> ARGS`, wait until
    `ready` answers 200 (or the process exits: the test fails with its stderr), yield (base URL,
    process); SIGTERM (then kill) when the block ends. `timeout_s` is only the net for a server
    that hangs (tests/fakes/waiting.py), not a budget for a slow one."""
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "advisor.cli",
            command,
            "--web.listen-address",
            f"127.0.0.1:{port}",
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
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
