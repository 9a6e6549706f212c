"""The NVML backend with an nvidia-ml-py that lacks calls: each missing one is a value left out.

An nvidia-ml-py older than the driver's API has no Python wrapper for the newer calls
(`nvmlDeviceGetNumaNodeId` and the `_v2` process lists came in 12.550): asking for one is an
AttributeError, not an NVMLError. The backend reads it as "not supported" for that value,
remembered per GPU and call like the driver's own answer, with one log line per function, and
keeps every other value. These tests hide names from the fake as such a release does; the same
backend tests also run against real old and new releases (`test_nvml_releases`).
"""

from __future__ import annotations

import logging
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from exporter.backends.nvml_calls import PYNVML_FLOOR
from tests.exporter.nvml_backends import Factory, backends, gpus_of, has
from tests.fakes.fake_pynvml import FakeProcess, hgx_h100

ROOT = Path(__file__).resolve().parents[2]
# What the 12.535.108 release (the floor pyproject.toml declared before) does not have.
OLD_RELEASE_LACKS = frozenset(
    {
        "nvmlDeviceGetNumaNodeId",
        "nvmlDeviceGetComputeRunningProcesses_v2",
        "nvmlDeviceGetGraphicsRunningProcesses_v2",
    }
)


@pytest.fixture
def make_backend() -> Iterator[Factory]:
    with backends() as make:
        yield make


def test_a_call_the_library_lacks_is_a_value_left_out_not_a_dead_backend(make_backend, caplog):
    fake = hgx_h100(2)
    fake.hidden = OLD_RELEASE_LACKS
    fake.gpus[0].process_api = 2  # a driver older than 510.39: the _v3 lists are not found
    fake.gpus[0].processes = [FakeProcess(7, "train", 1 << 30)]
    fake.gpus[1].power_mw = 250_000
    backend = make_backend(fake)

    with caplog.at_level(logging.WARNING, logger="exporter.backends.nvml_calls"):
        collections = [backend.collect() for _ in range(3)]
    for collection in collections:
        first, second = gpus_of(collection)
        assert first.numa_node is None and second.numa_node is None
        assert first.processes == []  # the old driver's list needs the missing _v2 call
        assert first.cpu_affinity == "0-31,64-95"  # the calls it has are read
        assert second.power_watts == 250.0 and first.memory_total_bytes
        assert not collection.errors  # not supported is no failure
    lines = [r.getMessage() for r in caplog.records]
    numa = [line for line in lines if "nvmlDeviceGetNumaNodeId" in line]
    assert len(numa) == 1  # one line for both GPUs and every cycle
    assert numa[0].startswith("nvidia-ml-py ") and f">= {PYNVML_FLOOR}" in numa[0]
    assert any("nvmlDeviceGetComputeRunningProcesses_v2" in line for line in lines)
    # remembered per GPU and call, as a driver's NOT_SUPPORTED is: not looked up every cycle
    assert not backend._calls.supported("gpu0", "nvmlDeviceGetNumaNodeId")


def test_a_constant_the_library_lacks_leaves_its_field_out(make_backend):
    fake = hgx_h100(1)
    fake.hidden = frozenset({"NVML_FI_DEV_MEMORY_TEMP"})
    fake.gpus[0].memory_temperature = 44
    reading = gpus_of(make_backend(fake).collect())[0]
    assert reading.memory_temperature_celsius is None
    assert reading.energy_joules is not None  # the other fields of the batch are read


def test_the_declared_floor_is_the_one_the_backend_names():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    floors = [d for d in project["dependencies"] if d.startswith("nvidia-ml-py")]
    assert floors == [f"nvidia-ml-py>={PYNVML_FLOOR}"]


def backend_names() -> set[str]:
    """Every NVML function, constant and struct the backend's modules name in their source."""
    names: set[str] = set()
    pattern = re.compile(r"(?<![.\w`])(nvml[A-Z]\w+|NVML_[A-Z0-9_]+[A-Z0-9]|c_nvml\w+)\b")
    for path in (ROOT / "exporter" / "backends").glob("nvml*.py"):
        names |= set(pattern.findall(path.read_text()))
    return names


def release() -> tuple[int, ...]:
    from importlib.metadata import version

    return tuple(int(part) for part in version("nvidia-ml-py").split(".")[:3])


def test_a_release_from_the_floor_on_has_every_name_the_backend_uses():
    """Run for every release `test_nvml_releases` installs: from the floor on nothing the
    backend names is missing (below it, the values of what is missing are left out)."""
    floor = tuple(int(part) for part in PYNVML_FLOOR.split("."))
    missing = sorted(name for name in backend_names() if not has(name))
    if release() < floor:
        assert missing, "a release below the floor lacks nothing: lower the floor"
        return
    assert missing == [], f"nvidia-ml-py {'.'.join(map(str, release()))} lacks {missing}"
    assert pynvml.NVML_SUCCESS == 0
