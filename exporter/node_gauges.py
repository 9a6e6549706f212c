"""Node-level fragmentation gauges computed from one collection (plus a little idle history).

These are the per-node numbers an SRE alerts on without running the advisor: how many GPUs are
free, whether they are NVLink-connected, which allocated GPUs sit idle, and how much free memory
is stuck on GPUs nobody else can use.

A GPU nobody is known to hold but that is busy or holds memory (`exporter.usage`) is "in use,
owner unknown": counted as such, never as free. What the readings cannot tell stays unknown:
without the node's topology (a dcgm-exporter page gives none) the largest free NVLink group is
left out rather than written as 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.readings import GpuReading, NodeReading, largest_connected_subset, nvlink_islands
from exporter.usage import gpu_in_use, unattributed_instances


@dataclass(frozen=True, slots=True)
class IdlePolicy:
    """An allocated GPU counts as idle when utilization stays under `threshold` for `window_s`."""

    threshold: float = 0.05
    window_s: float = 3600.0
    # On a shared GPU (several holders or MIG), free memory smaller than this fits no typical
    # request and is stranded; on an exclusively held GPU all free memory is stranded.
    min_request_bytes: float = 10 * 2**30


@dataclass(frozen=True, slots=True)
class NodeGauges:
    node: str
    gpus: int
    free_gpus: int
    largest_free_nvlink_group: int | None  # None: the node's topology is unknown
    allocated_idle_gpus: int
    stranded_memory_bytes: float
    owner_unknown_gpus: int = 0


class IdleTracker:
    """Remembers since when each allocated GPU has been under the idle threshold.

    Kept in the collector (not the backend) so every backend gets the same definition.
    """

    def __init__(self, policy: IdlePolicy) -> None:
        self.policy = policy
        self._idle_since: dict[tuple[str, str], float] = {}

    @staticmethod
    def key(node: str, gpu: GpuReading) -> tuple[str, str]:
        """A GPU by its UUID where known: NVML renumbers GPUs when one is added or removed, and
        an idle history must not pass to the GPU that takes the index."""
        return (node, gpu.uuid or f"index:{gpu.index}")

    def observe(self, node: str, gpu: GpuReading, in_use: bool, now: float) -> bool:
        """Record this reading; True if the GPU has been allocated and idle for the window."""
        key = self.key(node, gpu)
        utilization = gpu.utilization_ratio
        if gpu.sm_active_ratio is not None and utilization is None:
            utilization = gpu.sm_active_ratio
        if not in_use or utilization is None or utilization >= self.policy.threshold:
            self._idle_since.pop(key, None)
            return False
        since = self._idle_since.setdefault(key, now)
        return now - since >= self.policy.window_s

    def forget_except(self, live: set[tuple[str, str]]) -> None:
        """Drop history of GPUs that disappeared, so memory stays bounded."""
        for key in list(self._idle_since):
            if key not in live:
                del self._idle_since[key]


def usable(gpu: GpuReading) -> bool:
    return gpu.healthy and not gpu.lost


def holders_by_gpu(node: NodeReading) -> dict[int, int]:
    """Number of allocations or, where none are known, processes per GPU index."""
    holders: dict[int, int] = {}
    for allocation in node.allocations:
        holders[allocation.gpu] = holders.get(allocation.gpu, 0) + 1
    for gpu in node.gpus:
        if gpu.index not in holders and gpu.processes:
            holders[gpu.index] = len({process.pid for process in gpu.processes})
    return holders


def owner_unknown(node: NodeReading, gpu: GpuReading, holders: int) -> bool:
    """A usable GPU in use (`exporter.usage`) that no allocation or process accounts for: the
    whole GPU when nothing holds it, or one of its MIG instances nothing on it names."""
    if not usable(gpu):
        return False
    if gpu.mig_enabled and gpu.mig_instances:
        held: set[int | None] = {a.gpu_instance_id for a in node.allocations if a.gpu == gpu.index}
        held |= {p.gpu_instance_id for p in gpu.processes}
        return bool(unattributed_instances(gpu, held))
    return holders == 0 and gpu_in_use(gpu)


def topology_known(node: NodeReading) -> bool:
    """Whether the readings say how the node's GPUs connect: a link between them, an NVLink
    island, or a single GPU."""
    return (
        len(node.gpus) <= 1
        or bool(node.links)
        or any(gpu.nvlink_island is not None for gpu in node.gpus)
    )


def islands_of(node: NodeReading) -> dict[int, int]:
    """Each GPU's NVLink island: as the backend gave them, else from the node's links."""
    if any(gpu.nvlink_island is not None for gpu in node.gpus):
        return {
            gpu.index: -1 - gpu.index if gpu.nvlink_island is None else gpu.nvlink_island
            for gpu in node.gpus
        }
    return nvlink_islands((gpu.index for gpu in node.gpus), node.links)


def stranded_memory(gpu: GpuReading, holders: int, policy: IdlePolicy) -> float:
    """Free memory on an in-use GPU that no other request can use (see IdlePolicy)."""
    if holders == 0 or gpu.memory_free_bytes is None or not usable(gpu):
        return 0.0
    shared = holders > 1 or bool(gpu.mig_enabled)
    if not shared:
        return gpu.memory_free_bytes
    return gpu.memory_free_bytes if gpu.memory_free_bytes < policy.min_request_bytes else 0.0


def node_gauges(node: NodeReading, tracker: IdleTracker, now: float) -> NodeGauges:
    holders = holders_by_gpu(node)
    unknown = {g.index for g in node.gpus if owner_unknown(node, g, holders.get(g.index, 0))}
    # a holder nobody names still holds the GPU: not free, and its free memory is stranded
    held = {index: max(holders.get(index, 0), 1) for index in unknown}
    held = {**holders, **held}
    free = [gpu.index for gpu in node.gpus if usable(gpu) and held.get(gpu.index, 0) == 0]
    idle = sum(  # allocated-idle is about allocations: an unknown owner is not one
        tracker.observe(node.node, gpu, holders.get(gpu.index, 0) > 0 and usable(gpu), now)
        for gpu in node.gpus
    )
    stranded = sum(
        stranded_memory(gpu, held.get(gpu.index, 0), tracker.policy) for gpu in node.gpus
    )
    largest: int | None = None
    if topology_known(node):
        largest = largest_connected_subset(free, islands_of(node))
    return NodeGauges(
        node=node.node,
        gpus=len(node.gpus),
        free_gpus=len(free),
        largest_free_nvlink_group=largest,
        allocated_idle_gpus=idle,
        stranded_memory_bytes=stranded,
        owner_unknown_gpus=len(unknown),
    )
