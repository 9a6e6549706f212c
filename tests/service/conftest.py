"""Shared pieces of the advisor service tests: example models and a scripted source."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

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
