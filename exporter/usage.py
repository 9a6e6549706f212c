"""Whether a GPU or a MIG instance is in use, from what it reports itself, whoever holds it.

An allocation (the kubelet, Slurm, a dcgm-exporter page's pod labels) or a process list says
who holds a GPU. Where neither says anything, its own readings still do: work runs on it or
memory is held on it. Such a GPU is "in use, owner unknown" (a process outside the scheduler,
a dcgm-exporter run without `-k`, a pod the page does not attribute): used capacity, never
free. The one rule for the exporter's node gauges and the advisor's model.

The thresholds sit above what an idle GPU reports, not at what a job uses: an idle GPU reads
0 % utilization and engine activity, and holds only what the driver reserves for itself,
below 1 % of its memory on every board (544 MiB of an H100's 80 GB, where the reading even
counts it: NVML's v1 memory struct and older dcgm-exporter pages without FB_RESERVED do).
"""

from __future__ import annotations

from exporter.readings import GpuReading, MigInstance

BUSY_RATIO = 0.01  # utilization or engine activity from which work is running
HELD_MEMORY_RATIO = 0.02  # share of the memory from which it is held by someone
HELD_MEMORY_BYTES = 2**30  # the same where the total is unknown


def memory_held(used: float | None, total: float | None) -> bool:
    """Memory in use above what the driver reserves for itself (`HELD_MEMORY_RATIO`)."""
    if used is None:
        return False
    limit = HELD_MEMORY_BYTES if not total else HELD_MEMORY_RATIO * total
    return used >= limit


def busy(*ratios: float | None) -> bool:
    """Any of the activity readings at or above `BUSY_RATIO`."""
    return any(ratio is not None and ratio >= BUSY_RATIO for ratio in ratios)


def mig_in_use(mig: MigInstance) -> bool:
    """A MIG instance at work (engine or SM activity) or holding memory."""
    return busy(mig.graphics_engine_active_ratio, mig.sm_active_ratio) or memory_held(
        mig.memory_used_bytes, mig.memory_total_bytes
    )


def gpu_in_use(gpu: GpuReading) -> bool:
    """A GPU at work or holding memory; a MIG GPU when one of its instances is."""
    if gpu.lost:
        return False
    if gpu.mig_enabled and gpu.mig_instances:
        return any(mig_in_use(mig) for mig in gpu.mig_instances)
    activity = (gpu.utilization_ratio, gpu.graphics_engine_active_ratio, gpu.sm_active_ratio)
    return busy(*activity) or memory_held(gpu.memory_used_bytes, gpu.memory_total_bytes)


def unattributed_instances(gpu: GpuReading, held: set[int | None]) -> list[int]:
    """Ids of the MIG instances of `gpu` in use that no holder in `held` (the GPU instance ids
    allocations name; None: the whole GPU) accounts for."""
    if None in held or not (gpu.mig_enabled and gpu.mig_instances):
        return []
    return [
        mig.gpu_instance_id
        for mig in gpu.mig_instances
        if mig.gpu_instance_id not in held and mig_in_use(mig)
    ]
