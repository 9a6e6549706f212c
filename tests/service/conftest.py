"""Shared pieces of the advisor service tests: example models and a scripted source."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests

from advisor.ingest.sources import SourceError, load_source
from advisor.model import ClusterModel

ROOT = Path(__file__).resolve().parents[2]
ISLANDS = ROOT / "examples" / "seed-nvlink-islands.json"  # an 8-GPU job cannot start: plans exist
SIM = ROOT / "examples" / "sim-a100-16x8.json"


class ScriptedSource:
    """Returns the queued models in order; a queued string is raised as a SourceError."""

    def __init__(self, *steps: ClusterModel | str) -> None:
        self.steps = list(steps)
        self.calls = 0

    def __call__(self) -> ClusterModel:
        self.calls += 1
        step = self.steps.pop(0) if len(self.steps) > 1 else self.steps[0]
        if isinstance(step, str):
            raise SourceError(step)
        return step


@pytest.fixture(scope="session")
def islands() -> ClusterModel:
    return load_source(str(ISLANDS))


@pytest.fixture(scope="session")
def sim_model() -> ClusterModel:
    return load_source(str(SIM))


@pytest.fixture
def scripted() -> Callable[..., ScriptedSource]:
    return ScriptedSource


# --------------------------------------------------------------------------- real process


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def advisor_process(*args: str, ready: str = "/-/healthy", timeout_s: float = 40.0):
    """`gpu-defrag advise` on 127.0.0.1:<free port>; waits until `ready` answers 200."""
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "advisor.cli",
            "advise",
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
                pytest.fail(f"advisor exited early: {process.stderr.read()}")
            try:
                if requests.get(base + ready, timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"advisor {ready} not 200 within {timeout_s:.0f} s")
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


SERVICE_ARGS = (
    "--source",
    "sim:a100-16x8",
    "--advise.interval",
    "2s",
    "--sim.backfill",
    "48h",
    "--forecast.horizons",
    "1h,6h",
    "--shapes",
    "0.5,1,2,4,8,2x8,4x8,8x8",
)


@pytest.fixture(scope="session")
def service():
    """One advisor on the 16 x 8 A100 sim for the API and fuzz tests; ready = first good run."""
    with advisor_process(*SERVICE_ARGS, ready="/health") as (base, _process):
        yield base
