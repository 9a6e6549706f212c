"""NVML backends on the fake, made for a test and closed after it: one factory for the backend's
test files (`make_backend` fixtures), with the short XID waits every test wants."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

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
