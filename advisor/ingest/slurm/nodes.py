"""Slurm nodes (`sinfo --json` on 21.08/22.05, `scontrol --json show nodes` and slurmrestd's
`/nodes` from 23.02) as `SlurmNode` rows: GPUs by GRES, partitions, state, CPU and memory.

A node is free capacity only in a state the scheduler would start new work on. Not free:
the base states DOWN, ERROR, FUTURE and UNKNOWN (not registered), and the flags DRAIN
(draining and drained alike), FAIL, MAINTENANCE, RESERVED, NOT_RESPONDING, a requested or
issued reboot, POWER_DOWN/POWERING_DOWN, INVALID(_REG) and BLOCKED. A POWERED_DOWN node of a
power-saving cluster is free (Slurm powers it up for a job). Jobs on a node that is not free
keep their GPUs; only its free GPUs stop counting.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from advisor.ingest.slurm import gres
from advisor.ingest.slurm.values import SlurmFormatError, number, records, text, words

NOT_FREE_STATES = frozenset({"DOWN", "ERROR", "FUTURE", "UNKNOWN"})
NOT_FREE_FLAGS = frozenset(
    {
        "DRAIN",
        "DRAINING",
        "DRAINED",
        "FAIL",
        "FAILING",
        "MAINTENANCE",
        "MAINT",
        "RESERVED",
        "NOT_RESPONDING",
        "REBOOT_REQUESTED",
        "REBOOT_ISSUED",
        "POWER_DOWN",
        "POWERING_DOWN",
        "INVALID",
        "INVALID_REG",
        "BLOCKED",
    }
)


@dataclass(slots=True)
class SlurmNode:
    name: str
    partitions: tuple[str, ...]
    gpus: tuple[gres.GresEntry, ...]  # configured GPU GRES, per type
    used: tuple[gres.GresEntry, ...]  # GPU GRES in use, with IDX where Slurm gives them
    state: tuple[str, ...]  # base state first, then flags, upper case
    cpus: float  # NaN unknown
    memory_mib: float  # NaN unknown
    reason: str = ""

    @property
    def gpu_count(self) -> int:
        return sum(entry.count for entry in self.gpus)

    @property
    def gpu_type(self) -> str:
        return gres.gpu_type(list(self.gpus))

    @property
    def free_for_work(self) -> bool:
        """Whether the scheduler would start new work here (module docstring)."""
        return not (set(self.state) & (NOT_FREE_STATES | NOT_FREE_FLAGS))


def _nan(value: Any) -> float:
    parsed = number(value)
    return float("nan") if parsed is None else parsed


def parse_node(row: Mapping[str, Any]) -> SlurmNode:
    """One node object of any supported version; SlurmFormatError names the node."""
    name = text(row.get("name"))
    if not name:
        raise SlurmFormatError(f"a node without a name: {dict(row)!r:.120}")
    try:
        state = words(row.get("state")) + words(row.get("state_flags"))
        partitions = row.get("partitions") or []
        if isinstance(partitions, str):
            partitions = [p for p in partitions.split(",") if p]
        cpus = row.get("effective_cpus") if number(row.get("effective_cpus")) else row.get("cpus")
        memory = _nan(row.get("real_memory"))
        specialized = number(row.get("specialized_memory")) or 0.0
        return SlurmNode(
            name=name,
            partitions=tuple(str(p) for p in partitions),
            gpus=tuple(gres.entries(text(row.get("gres")))),
            used=tuple(gres.entries(text(row.get("gres_used")))),
            state=tuple(state),
            cpus=_nan(cpus),
            memory_mib=memory - specialized if memory == memory else memory,
            reason=text(row.get("reason")),
        )
    except SlurmFormatError as error:
        raise SlurmFormatError(f"node {name}: {error}") from None


def parse_nodes(doc: Any, where: str = "nodes") -> list[SlurmNode]:
    """The nodes of a `sinfo --json` / `scontrol --json show nodes` / `/nodes` answer."""
    return [parse_node(row) for row in records(doc, "nodes", where)]


def partition_sizes(nodes: Iterable[SlurmNode]) -> dict[str, int]:
    """Nodes per partition, over `nodes`."""
    sizes: dict[str, int] = {}
    for node in nodes:
        for partition in node.partitions:
            sizes[partition] = sizes.get(partition, 0) + 1
    return sizes


def pool_of(node: SlurmNode, sizes: Mapping[str, int]) -> str:
    """The node's pool: its most specific partition, the one with the fewest nodes (ties by
    name), so a node in "a100" (16 nodes) and "all" (64) is in pool "a100"; "" in none."""
    if not node.partitions:
        return ""
    return min(node.partitions, key=lambda p: (sizes.get(p, 0), p))
