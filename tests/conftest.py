"""What every test module shares: the `slow` rule and the cluster factory.

`slow` marks the tests that start real servers (ours, Prometheus, Alertmanager, slurmctld) or a
browser, and the benchmark smoke runs: `pytest -m "not slow"` is the fast loop while changing
code, `pytest` (what `make test` runs) runs everything. Every test under tests/integration/ and
every `integration` test is slow without saying so again.

`add_nodes(...)` adds nodes of identical GPUs to a `ModelBuilder`, the part every model-building
test used to write out as two loops; the test then places its own allocations on them. Demand
(forecast panels, the advisor's run history) comes from `tests/factories.py`, kept apart so that
loading this file loads no pandas.

`tls_files` is a self-signed certificate for 127.0.0.1 and its key, made by openssl, for the
TLS tests of both HTTP servers.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from advisor.model import ModelBuilder

INTEGRATION = Path(__file__).resolve().parent / "integration"
GIB = 2**30


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("integration") or INTEGRATION in Path(item.path).parents:
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def tls_files(tmp_path: Path) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


def add_nodes(
    names: int | Iterable[str] = 1,
    gpus: int = 8,
    *,
    builder: ModelBuilder | None = None,
    island: int | None = None,
    pool: str = "",
    rack: str = "",
    gpu_model: str = "",
    cpu_milli: float = float("nan"),
    memory_mib: float = float("nan"),
    schedulable: bool = True,
    **gpu: Any | Callable[[str, int], Any],
) -> ModelBuilder:
    """`builder` (a new one by default) with nodes `names` (or n0..n{k-1} for a count) of
    `gpus` GPUs each. `island` GPUs per NVLink island (GPU i is in island i // island; None:
    islands unknown). Every other keyword goes to each `add_gpu`; a callable is asked per GPU,
    `value(node, index)` (`lost=lambda node, i: (node, i) == ("b", 1)`)."""
    builder = ModelBuilder() if builder is None else builder
    for name in [f"n{k}" for k in range(names)] if isinstance(names, int) else names:
        builder.add_node(
            name,
            pool=pool,
            rack=rack,
            gpu_model=gpu_model,
            cpu_milli=cpu_milli,
            memory_mib=memory_mib,
            schedulable=schedulable,
        )
        for index in range(gpus):
            values = {k: v(name, index) if callable(v) else v for k, v in gpu.items()}
            if island is not None:
                values.setdefault("nvlink_island", index // island)
            builder.add_gpu(name, index, **values)
    return builder
