"""A `gpu-defrag` subcommand run as a real process on 127.0.0.1, as a user would start it."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import requests

from advisor.app.cli import free_port


@contextmanager
def cli_process(
    command: str, *args: str, ready: str = "/-/healthy", timeout_s: float = 40.0
) -> Iterator[tuple[str, subprocess.Popen]]:
    """Start `gpu-defrag COMMAND --web.listen-address 127.0.0.1:<free port> ARGS`, wait until
    `ready` answers 200, yield (base URL, process); SIGTERM (then kill) when the block ends."""
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
        deadline = time.monotonic() + timeout_s
        while True:
            if process.poll() is not None:
                pytest.fail(f"{command} exited early: {process.stderr.read()}")
            try:
                if requests.get(base + ready, timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"{command} {ready} not 200 within {timeout_s:.0f} s")
            time.sleep(0.1)
        yield base, process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
