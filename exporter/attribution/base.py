"""The interface between collection backends and owner lookup (pods, Slurm jobs).

Backends call these on every collection, so implementations answer from a cache that a
background refresher keeps current: a lookup never makes a kubelet or filesystem round trip
on the collection path, let alone on a scrape.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from exporter.readings import Allocation, NodeReading


@dataclass(frozen=True, slots=True)
class Owner:
    pod: str = ""
    namespace: str = ""
    container: str = ""
    slurm_job: str = ""


class Attribution(Protocol):
    def process_owner(self, pid: int) -> Owner | None:
        """The pod or Slurm job a host PID belongs to, or None if unknown."""

    def allocations(
        self,
        gpu_index_by_uuid: dict[str, int],
        mig_by_uuid: Mapping[str, tuple[int, int]] | None = None,
    ) -> list[Allocation]:
        """Current GPU / MIG-instance assignments, keyed to GPU indices via their UUIDs.

        `mig_by_uuid` (optional) maps MIG device UUIDs (`MIG-...`) to (GPU index, GPU-instance
        id), so that device plugins that hand out MIG UUIDs resolve to the instance.
        """


class NoAttribution:
    """Used when no pod-resources socket, cgroup information or job mapping exists."""

    def process_owner(self, pid: int) -> Owner | None:
        return None

    def allocations(
        self,
        gpu_index_by_uuid: dict[str, int],
        mig_by_uuid: Mapping[str, tuple[int, int]] | None = None,
    ) -> list[Allocation]:
        return []


def node_allocations(attribution: Attribution, node: NodeReading) -> list[Allocation]:
    """Ask `attribution` about one node's GPUs, keyed by GPU and MIG UUIDs as backends read them."""
    gpu_index_by_uuid = {gpu.uuid: gpu.index for gpu in node.gpus if gpu.uuid}
    mig_by_uuid = {
        uuid: (gpu.index, mig.gpu_instance_id)
        for gpu in node.gpus
        for mig in gpu.mig_instances
        for uuid in (mig.uuid, *mig.compute_instances.values())  # every compute instance's
        if uuid
    }
    return list(attribution.allocations(gpu_index_by_uuid, mig_by_uuid or None))
