"""NVML backends on the fake, made for a test and closed after it: one factory for the backend's
test files (`make_backend` fixtures), with the short XID waits every test wants."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pynvml

from exporter.backends.nvml import NvmlBackend
from exporter.readings import Collection, GpuReading
from tests.fakes.fake_pynvml import FakeNvml

Factory = Callable[..., NvmlBackend]


@contextmanager
def backends(**defaults: object) -> Iterator[Factory]:
    """`make(fake, **kwargs)` builds a backend on `fake` (`defaults`, then `kwargs`, over the
    short XID waits); every backend made is closed on exit."""
    made: list[NvmlBackend] = []

    def make(fake: FakeNvml, **kwargs: object) -> NvmlBackend:
        options = {"xid_wait_ms": 10, "xid_backoff_s": 0.01, **defaults, **kwargs}
        backend = NvmlBackend("node-a", nvml_module=fake, **options)
        made.append(backend)
        return backend

    try:
        yield make
    finally:
        for backend in made:
            backend.close()


def gpus_of(collection: Collection) -> list[GpuReading]:
    return collection.nodes[0].gpus


# ----- what the installed nvidia-ml-py release has (the tests run against several) -----------

# NVLink state calls of one walk over the fake's 18 links: one more, the probe that ends the
# walk, where the release lets a GPU have more than 18 (NVML_NVLINK_MAX_LINKS 36 from 13.x)
NVLINK_WALK = 18 + (pynvml.NVML_NVLINK_MAX_LINKS > 18)


def has(name: str) -> bool:
    """Whether the installed nvidia-ml-py has the function or constant `name`."""
    return hasattr(pynvml, name)


def nvml_lines(records: list[logging.LogRecord]) -> list[tuple[int, str]]:
    """(level, message) of the log lines about GPUs and calls, without the one line per function
    an older nvidia-ml-py lacks (`NvmlCalls._lacks`), which `test_nvml_releases` checks."""
    return [
        (r.levelno, r.getMessage())
        for r in records
        if not r.getMessage().startswith("nvidia-ml-py ")
    ]
