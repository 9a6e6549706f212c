"""A backend whose every cycle is scripted by the test: return readings, fail, or hang."""

from __future__ import annotations

import threading

from exporter.backends.base import Backend, BackendUnavailable
from exporter.readings import Collection
from tests.exporter import readings_factory


class ScriptedBackend(Backend):
    name = "scripted"

    def __init__(self, script: list[str] | None = None) -> None:
        self.script = list(script or [])
        self.release = threading.Event()
        self.calls = 0
        self.starts = 0
        self.now = 1_700_000_000.0

    @classmethod
    def from_args(cls, args):
        return cls()

    def start(self) -> None:
        self.starts += 1

    def collect(self) -> Collection:
        self.calls += 1
        step = self.script.pop(0) if self.script else "ok"
        if step == "down":
            raise BackendUnavailable("NVML: NVML Shared Library Not Found")
        if step == "hang":
            self.release.wait(30)
        if step == "bug":
            raise RuntimeError("unexpected\nmulti-line")
        collection = readings_factory.collection(timestamp=self.now)
        collection.errors["nvmlDeviceGetPowerUsage"] += 1
        return collection
