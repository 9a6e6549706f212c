"""Shared pieces of the advisor service tests: example models, a scripted source, the HTTP server
in this process (the contract both servers keep, tests/test_http_contract.py, starts it here
too) and the service as a process."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from advisor.ingest.sources import SourceError, load_source
from advisor.model import ClusterModel
from advisor.service.api import Api
from advisor.service.http import AdvisorServer, build_app
from advisor.service.loop import AdvisorLoop, Config
from gpu_defrag_common.connections import Limits
from gpu_defrag_common.webconfig import WebConfig
from tests.fakes.cli_process import cli_process
from tests.fakes.waiting import CAP_S

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


def advisor_loop(model: ClusterModel) -> AdvisorLoop:
    """An advisor over `model` (a snapshot source), run once."""
    advisor = AdvisorLoop("snap", ScriptedSource(model), Config())
    advisor.run_once()
    return advisor


def serve_advisor(loop: AdvisorLoop, web: WebConfig, limits: Limits | None = None) -> AdvisorServer:
    """The advisor's app (its API beside /metrics) on uvicorn on 127.0.0.1:<free port>, as
    `gpu-defrag advise` serves it; started."""
    app = build_app(loop, Api(loop.state).routes(), web, "gpu-defrag advisor")
    return AdvisorServer("127.0.0.1:0", app, web, limits).start()


def closed(node: Any) -> Any:
    """A JSON Schema with every object closed (`additionalProperties: false` where it says
    nothing else), so a served property the schema does not declare, or an object declared
    bare, fails validation."""
    if isinstance(node, list):
        return [closed(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: closed(value) for key, value in node.items()}
    if node.get("type") == "object" or "properties" in node:
        out.setdefault("additionalProperties", False)
    return out


def follow(schemas: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """`node`, or the component its `$ref` names (the generated document refers to every
    object type by name)."""
    while "$ref" in node:
        node = schemas[node["$ref"].rsplit("/", 1)[1]]
    return node


def strict_schema(name: str) -> dict[str, Any]:
    """The API's component `name` closed throughout (the snapshot file's own schema, which
    the snapshot tests cover, as it is), its $refs resolving inside `components`."""
    from advisor.service.api import openapi_document

    schemas = openapi_document()["components"]["schemas"]
    schemas = {k: v if k.startswith("Snapshot_") else closed(v) for k, v in schemas.items()}
    return {**schemas[name], "components": {"schemas": schemas}}


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
def advisor_process(*args: str, ready: str = "/-/healthy", timeout_s: float = CAP_S):
    """`gpu-defrag advise` on 127.0.0.1:<free port>; waits until `ready` answers 200 (as long
    as it runs; `timeout_s` is only the net, tests/fakes/waiting.py)."""
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
