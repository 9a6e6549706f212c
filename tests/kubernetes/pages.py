"""Exporter pages for joins: what `gpu-defrag exporter` would serve for these readings."""

from __future__ import annotations

import time

from exporter.readings import Collection, NodeReading
from exporter.render import SelfState, collect_families


def exporter_page(readings: list[NodeReading]) -> str:
    state = SelfState("test", "nvml", True, 0.01, time.time(), 1, {})
    families = collect_families(Collection(nodes=readings, timestamp=time.time()), [], state)
    return families.text()


def readings_from_model(model) -> list[NodeReading]:  # type: ignore[no-untyped-def]
    """What each node's exporter (with kubelet pod attribution) would read for a model: its
    GPUs, NVLink islands, health, usage, and which pod holds which GPU, named as
    `advisor.ingest.kubernetes.manifests` names the pods."""
    import math

    from advisor.ingest.kubernetes.manifests import _namespace, _pod_name
    from exporter.readings import Allocation, GpuReading

    def value(x: float) -> float | None:
        return None if math.isnan(x) else float(x)

    gpus, allocs, places = model.gpus, model.allocations, model.placements
    out = []
    for i, name in enumerate(model.nodes.name.tolist()):
        start, stop = int(model.nodes.gpu_offset[i]), int(model.nodes.gpu_offset[i + 1])
        reading = NodeReading(str(name))
        for g in range(start, stop):
            island = int(gpus.nvlink_island[g])
            reading.gpus.append(
                GpuReading(
                    int(gpus.index[g]),
                    uuid=str(gpus.uuid[g]) or f"GPU-{name}-{int(gpus.index[g])}",
                    model=str(model.nodes.gpu_model[i]),
                    healthy=bool(gpus.healthy[g]),
                    lost=bool(gpus.lost[g]),
                    nvlink_island=None if island < 0 else island,
                    memory_total_bytes=value(gpus.memory_total_bytes[g]),
                    utilization_ratio=value(gpus.utilization_ratio[g]),
                    memory_used_bytes=value(gpus.memory_used_bytes[g]),
                )
            )
        for p in range(len(places)):
            g = int(places.gpu[p])
            if not start <= g < stop:
                continue
            row = int(places.alloc[p])
            reading.allocations.append(
                Allocation(
                    gpu=int(gpus.index[g]),
                    pod=_pod_name(str(allocs.id[row])),
                    namespace=_namespace(str(allocs.tenant[row])),
                )
            )
        out.append(reading)
    return out
