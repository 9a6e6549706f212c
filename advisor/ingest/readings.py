"""Exporter readings into the cluster model (`from_readings`): what the exporters (ours or
dcgm-exporter's, read directly or through Prometheus) saw, as nodes, GPUs and the allocations
holding them. The ingest side of the model: `advisor.model` itself knows nothing of the
exporter, its readings or its rule for "in use" (`exporter.usage`).
"""

from __future__ import annotations

import logging
import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from advisor.model import MILLI, UNATTRIBUTED, UNKNOWN_ISLAND, ClusterModel, ModelBuilder
from exporter.readings import Allocation, GpuReading, NodeReading, nvlink_islands
from exporter.usage import gpu_in_use, unattributed_instances

log = logging.getLogger(__name__)

_MIG_SLICES = re.compile(r"^(\d+)g\.")


def _mig_slices_total(model: str) -> int:
    """Compute slices of a full MIG-capable GPU: 4 on A30, 7 on A100/H100/H200/B200."""
    return 4 if "A30" in model.upper() else 7


def _mig_shares(gpu: GpuReading, instance_ids: list[int | None]) -> list[int]:
    """Milli-GPU of each listed MIG instance, by compute slices, summing exactly to the slices
    held (so a fully carved and allocated GPU is exactly 1000, never 994 or 1001)."""
    slices = {}
    for mig in gpu.mig_instances:
        match = _MIG_SLICES.match(mig.profile)
        slices[mig.gpu_instance_id] = int(match.group(1)) if match else 1
    total = _mig_slices_total(gpu.model)
    shares, held = [], 0
    for instance in instance_ids:
        before = held
        held += slices.get(instance, 1) if instance is not None else total
        shares.append(
            round(MILLI * min(held, total) / total) - round(MILLI * min(before, total) / total)
        )
    return shares


def _mig_carved_milli(gpu: GpuReading) -> int:
    """Milli-GPU the GPU's MIG instances carve (`_mig_shares`' slices and rounding); MILLI when
    MIG is off or no instance is known (nothing says which layout it will get)."""
    if not gpu.mig_enabled or not gpu.mig_instances:
        return MILLI
    return sum(_mig_shares(gpu, [m.gpu_instance_id for m in gpu.mig_instances]))


def _holder_key(node: str, allocation_pod: str, namespace: str, job: str, gpu: int) -> str:
    if allocation_pod:
        return f"{namespace}/{allocation_pod}" if namespace else allocation_pod
    if job:
        return f"{job}@{node}"
    return f"{UNATTRIBUTED}{node}/gpu{gpu}"


def _unattributed(
    node: str, gpu: GpuReading, named: list[Allocation]
) -> list[tuple[str, None, int | None]]:
    """Holders of `gpu` no allocation names, as (key, None, MIG instance or None) entries: the
    whole GPU when nothing names any of it and it runs processes or is in use; on a MIG GPU,
    each instance in use or running processes that no allocation names."""
    key = _holder_key(node, "", "", "", gpu.index)
    if gpu.mig_enabled and gpu.mig_instances:
        held: set[int | None] = {a.gpu_instance_id for a in named}
        with_processes = {p.gpu_instance_id for p in gpu.processes}
        busy = set(unattributed_instances(gpu, held))
        known = {m.gpu_instance_id for m in gpu.mig_instances}
        if None in held:  # an allocation of the whole GPU names all of it
            return []
        instances = sorted((busy | (with_processes & known)) - held)
        if not instances and not held and with_processes - known:
            return [(key, None, None)]  # processes whose instance NVML did not say
        return [(key, None, gi) for gi in instances]
    if named or not (gpu.processes or gpu_in_use(gpu)):
        return []
    return [(key, None, None)]


def _add_reading(
    builder: ModelBuilder,
    node: NodeReading,
    default_migratable: bool,
    allocation_info: Mapping[str, Mapping[str, Any]],
    taken: set[str],
    overbooked: list[str],
) -> None:
    models = Counter(gpu.model for gpu in node.gpus if gpu.model)
    builder.add_node(
        node.node,
        pool=node.pool,
        rack=node.rack,
        gpu_model=models.most_common(1)[0][0] if models else "",
    )
    derived = nvlink_islands([g.index for g in node.gpus], node.links) if node.links else {}
    by_index = {gpu.index: gpu for gpu in node.gpus}
    for gpu in node.gpus:
        island = gpu.nvlink_island if gpu.nvlink_island is not None else derived.get(gpu.index)
        builder.add_gpu(
            node.node,
            gpu.index,
            uuid=gpu.uuid,
            memory_total_bytes=_num(gpu.memory_total_bytes),
            healthy=gpu.healthy,
            lost=gpu.lost,
            nvlink_island=UNKNOWN_ISLAND if island is None else island,
            mig_enabled=bool(gpu.mig_enabled),
            carved_milli=_mig_carved_milli(gpu),
            utilization_ratio=_num(gpu.utilization_ratio),
            memory_used_bytes=_num(gpu.memory_used_bytes),
            power_watts=_num(gpu.power_watts),
        )
    # Holders per GPU: (key, allocation, MIG instance) in reading order. A GPU (or MIG
    # instance) in use that no allocation names - processes on it, or busy, or holding memory
    # (`exporter.usage`) - is held by an unattributed, non-migratable holder: in use, owner
    # unknown, never free capacity.
    per_gpu: dict[int, list[tuple[str, Allocation | None, int | None]]] = defaultdict(list)
    for alloc in node.allocations:
        if alloc.gpu not in by_index:
            continue
        key = _holder_key(node.node, alloc.pod, alloc.namespace, alloc.job, alloc.gpu)
        per_gpu[alloc.gpu].append((key, alloc, alloc.gpu_instance_id))
    for gpu in node.gpus:
        named = [alloc for _, alloc, _ in per_gpu.get(gpu.index, []) if alloc is not None]
        per_gpu[gpu.index].extend(_unattributed(node.node, gpu, named))
    holders: dict[str, dict] = {}
    for index, entries in sorted(per_gpu.items()):
        if not entries:
            continue
        gpu = by_index[index]
        mig = bool(gpu.mig_enabled) and any(gi is not None for _, _, gi in entries)
        if mig:
            shares = _mig_shares(gpu, [gi for _, _, gi in entries])
        elif entries and all(a is not None and a.gpu_milli is not None for _, a, _ in entries):
            # The source knows each holder's guaranteed share (fractional GPU requests).
            shares = [int(a.gpu_milli) for _, a, _ in entries]  # type: ignore[union-attr]
        else:
            shares = _even_shares(len(entries))
        if sum(shares) > MILLI:  # holders that cannot all be there: the source overlaps itself
            overbooked.append(f"{node.node}/gpu{index} ({sum(shares)} milli-GPU)")
            shares = _even_shares(len(entries))
        for (key, alloc, _), share in zip(entries, shares, strict=True):
            holder = holders.setdefault(key, {"gpus": [], "milli": [], "alloc": alloc})
            if share <= 0:
                continue
            if index in holder["gpus"]:  # a second MIG instance of the same GPU: add its share
                holder["milli"][holder["gpus"].index(index)] += share
                continue
            holder["gpus"].append(index)
            holder["milli"].append(share)
    for key, holder in holders.items():
        alloc = holder["alloc"]
        if not holder["gpus"]:
            continue
        fields: dict[str, Any] = {
            "job": alloc.job if alloc is not None and alloc.job else key,
            "tenant": (alloc.tenant or alloc.namespace) if alloc is not None else "",
            "priority": (alloc.priority or 0) if alloc is not None else 0,
            "migratable": default_migratable and alloc is not None,
        }
        fields.update(allocation_info.get(key, {}))
        if key in taken:  # the same pod name reported by two nodes: keep both, say where
            key = f"{key}@{node.node}"
        taken.add(key)
        builder.add_allocation(
            key,
            num_gpu=len(holder["gpus"]),
            gpu_milli=max(holder["milli"]),
            node=node.node,
            gpus=holder["gpus"],
            gpu_milli_each=holder["milli"],
            **fields,
        )


def _even_shares(count: int) -> list[int]:
    """Time-sliced sharing without known shares: the holders together take the whole GPU."""
    return [MILLI // count + (1 if i < MILLI % count else 0) for i in range(count)]


def _num(value: float | None) -> float:
    return math.nan if value is None else float(value)


def from_readings(
    readings: Iterable[NodeReading],
    *,
    timestamp: float = math.nan,
    source: str = "",
    default_migratable: bool = True,
    allocation_info: Mapping[str, Mapping[str, Any]] | None = None,
    pending: Iterable[Mapping[str, Any]] = (),
) -> ClusterModel:
    """The model of what exporters saw. Readings carry no CPU/memory capacity, priorities only
    where known, and no start times: those stay unknown (NaN/0) rather than invented.

    Sharing: a MIG instance holds its compute slices (e.g. 3g.40gb on A100 = 3/7 of the GPU);
    several holders of one non-MIG GPU (time-slicing) together hold the whole GPU. Holders
    whose known shares add up to more than the GPU (a live source that overlaps itself, e.g.
    an ended pod's series beside its successor's) share it evenly instead, with one warning:
    a reading is never refused as "oversubscribed" for what its source said twice.
    `allocation_info` adds what a richer source knows per allocation id (`namespace/pod`):
    start time, priority, migratable, CPU...; `pending` rows (ModelBuilder.add_allocation
    keywords plus `id`) add demand that is not placed.
    """
    builder = ModelBuilder()
    taken: set[str] = set()
    overbooked: list[str] = []
    for node in readings:
        _add_reading(builder, node, default_migratable, allocation_info or {}, taken, overbooked)
    if overbooked:
        log.warning(
            "%s: %d GPU(s) whose holders' shares add up to more than the GPU (series that "
            "overlap in the source), each shared evenly by its holders: %s",
            source or "readings",
            len(overbooked),
            "; ".join(overbooked[:3]) + ("; ..." if len(overbooked) > 3 else ""),
        )
    for row in pending:
        fields = dict(row)
        builder.add_allocation(fields.pop("id"), **fields)
    return builder.build(timestamp=timestamp, source=source)
