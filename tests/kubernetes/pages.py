"""Exporter pages for joins: what `gpu-defrag exporter` would serve for these readings."""

from __future__ import annotations

import time

from exporter.readings import Collection, NodeReading
from exporter.render import SelfState, collect_families


def exporter_page(readings: list[NodeReading]) -> str:
    state = SelfState("test", "nvml", True, 0.01, time.time(), 1, {})
    families = collect_families(Collection(nodes=readings, timestamp=time.time()), [], state)
    return families.text()
