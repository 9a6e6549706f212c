"""Shared pieces of the advisor service tests: example models and a scripted source."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import pytest

from advisor.ingest.sources import SourceError, load_source
from advisor.model import ClusterModel
from tests.fakes.cli_process import cli_process

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


@contextmanager
def advisor_process(*args: str, ready: str = "/-/healthy", timeout_s: float = 40.0):
    """`gpu-defrag advise` on 127.0.0.1:<free port>; waits until `ready` answers 200."""
    with cli_process("advise", *args, ready=ready, timeout_s=timeout_s) as running:
        yield running


SERVICE_ARGS = (
    "--source",
    "sim:a100-16x8",
    "--forecast.idle-max-nodes",
    "4",
    "--advise.interval",
    "2s",
    "--history.backfill",
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
