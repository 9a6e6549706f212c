"""One read of a Slurm controller (`SlurmState`) as the advisor's `ClusterModel`.

Mapping (docs/slurm.md has the user's version):
- nodes with GPU GRES are the model's nodes (CPU-only nodes are left out); GPUs are indexed
  0..count-1, the node's GPU model is its GRES type ("a100"; the most GPUs' type on a node with
  several); Slurm gives no GPU memory size or NVLink island (both unknown).
- pool: the node's most specific partition (`nodes.pool_of`), or the partition asked for with
  `partition=`; rack: its leaf switch (`topology`), "" (unknown) without a topology.
- a node is schedulable when its state lets new work start (`nodes.SlurmNode.free_for_work`)
  and no active reservation holds it (`reservations`).
- a running job is one allocation per node it runs on (`job` = the Slurm job id, so the tasks
  of a multi-node job are one gang); id = the job id for a one-node job, `JOBID/NODE` for each
  task of a multi-node job. Its GPUs are the devices `gres_detail` names; where Slurm names
  none, the lowest free indices of the node in job order (the count is Slurm's, the index is
  not).
- a pending job is one unplaced allocation per node it asks for (`JOBID#K`), its GPU model
  limited to the GRES type it asked for, else to the GPU models of its partitions.
- tenant: the job's account (`tenant=user` or `tenant=qos` pick the others; a job without one
  has tenant "" - unknown); priority: Slurm's, clipped to int32.
- migratable: a running job Slurm can requeue (`requeue`), not completing, whose comment does not
  say `gpu-defrag.io/migratable=false`, and whose priority is at most `max-priority` when that
  option is given (by default priority alone does not pin a job). restart cost: the
  `gpu-defrag.io/restart-cost=DURATION` word of its admin comment or comment, else unknown.
"""

from __future__ import annotations

import argparse
import logging
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from advisor.ingest.slurm.jobs import MIGRATABLE_KEY, RESTART_COST_KEY, SlurmJob
from advisor.ingest.slurm.nodes import SlurmNode, partition_sizes, pool_of
from advisor.ingest.slurm.reservations import Reservation, reserved_nodes
from advisor.ingest.slurm.spec import SlurmOptions
from advisor.model import MILLI, ClusterModel, ModelBuilder
from gpu_defrag_common import units

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SlurmState:
    """What one read of the controller gave, parsed."""

    nodes: Sequence[SlurmNode]
    jobs: Sequence[SlurmJob]
    racks: dict[str, str]
    reservations: Sequence[Reservation]
    read_at: float
    version: tuple[int, int] | None = None


@dataclass(frozen=True)
class SlurmView:
    """The model, and what Slurm says that the model has no column for."""

    model: ClusterModel
    pending_reasons: dict[str, str]  # job -> Slurm's reason it waits (Resources, Priority...)
    unschedulable: dict[str, str]  # node -> why it is not free ("drain: bad GPU", "reservation x")
    notes: tuple[str, ...] = field(default=())  # one line each: racks unknown, tasks left out
    gang_size: dict[str, int] = field(default_factory=dict)  # job -> nodes it runs on / asks
    pinned: dict[str, str] = field(default_factory=dict)  # running task -> why it may not move


def tenant_of(job: SlurmJob, kind: str) -> str:
    return {"account": job.account, "user": job.user, "qos": job.qos}[kind]


def restart_cost(job: SlurmJob) -> float:
    """Seconds from the job's `gpu-defrag.io/restart-cost` comment word; NaN without one (or
    with a value that is not a duration, with a warning)."""
    value = job.comment_fields.get(RESTART_COST_KEY)
    if value is None:
        return math.nan
    try:
        return units.duration(value)
    except argparse.ArgumentTypeError:
        log.warning(
            "job %s: %s=%r is not a duration such as 300, 15m or 1h; its restart cost is unknown",
            job.id,
            RESTART_COST_KEY,
            value,
        )
        return math.nan


def pinned_why(job: SlurmJob, options: SlurmOptions) -> str:
    """Why a running job may not be moved (requeued), "" when it may."""
    if job.state in ("COMPLETING", "CONFIGURING"):
        return job.state.lower()
    if not job.requeue:
        return "not requeueable (--no-requeue or JobRequeue=0)"
    if job.comment_fields.get(MIGRATABLE_KEY, "").lower() == "false":
        return f"comment {MIGRATABLE_KEY}=false"
    if options.max_priority is not None and job.priority > options.max_priority:
        return f"priority {job.priority} > max-priority {options.max_priority}"
    return ""


def _why_not_free(node: SlurmNode, reservation: str | None) -> str:
    if reservation is not None and node.free_for_work:
        return f"reservation {reservation}"
    state = "+".join(node.state).lower()
    return f"{state}: {node.reason}" if node.reason else state


def _in_partitions(partitions: Sequence[str], wanted: Sequence[str]) -> bool:
    return not wanted or any(p in wanted for p in partitions)


def _indices(
    count: int, known: tuple[int, ...] | None, size: int, taken: set[int]
) -> tuple[int, ...] | None:
    """Indices Slurm named, when they exist on the node and are free; None otherwise."""
    if known is None or len(known) != count:
        return None
    if any(i < 0 or i >= size or i in taken for i in known):
        return None
    return known


def build_model(state: SlurmState, options: SlurmOptions, source: str = "") -> SlurmView:
    """The model of `state` (module docstring); pure."""
    wanted = options.partitions
    gpu_nodes = [node for node in state.nodes if node.gpu_count > 0]
    sizes = partition_sizes(gpu_nodes)
    kept = [node for node in gpu_nodes if _in_partitions(node.partitions, wanted)]
    reserved = reserved_nodes(state.reservations, state.read_at)
    builder = ModelBuilder()
    size: dict[str, int] = {}
    models_of_partition: dict[str, set[str]] = defaultdict(set)
    unschedulable: dict[str, str] = {}
    for node in kept:
        pool = next(p for p in node.partitions if p in wanted) if wanted else pool_of(node, sizes)
        free = node.free_for_work and node.name not in reserved
        if not free:
            unschedulable[node.name] = _why_not_free(node, reserved.get(node.name))
        builder.add_node(
            node.name,
            pool=pool,
            rack=state.racks.get(node.name, ""),
            gpu_model=node.gpu_type,
            cpu_milli=node.cpus * MILLI,
            memory_mib=node.memory_mib,
            schedulable=free,
        )
        for index in range(node.gpu_count):
            builder.add_gpu(node.name, index)
        size[node.name] = node.gpu_count
        for partition in node.partitions:
            if node.gpu_type:
                models_of_partition[partition].add(node.gpu_type)

    specs: dict[tuple[str, tuple[str, ...]], str] = {}

    def spec(job: SlurmJob) -> str:
        """The GRES type asked, else every GPU model of the job's partitions."""
        key = (job.gpu_type, job.partitions)
        if key not in specs:
            models = set().union(*(models_of_partition.get(p, set()) for p in job.partitions))
            specs[key] = job.gpu_type or "|".join(sorted(models))
        return specs[key]

    def job_fields(job: SlurmJob) -> dict[str, Any]:
        """What every task of a job carries, placed or waiting."""
        return {
            "job": job.job,
            "tenant": tenant_of(job, options.tenant),
            "priority": job.priority,
            "cpu_milli": job.cpus_per_task * MILLI,
            "memory_mib": job.memory_mib_per_task,
            "gpu_spec": spec(job),
            "creation_time": job.submit_time,
            "restart_cost_s": restart_cost(job),
            "qos": job.qos,
        }

    taken: dict[str, set[int]] = defaultdict(set)
    placed: list[tuple[SlurmJob, int, str, int, tuple[int, ...] | None]] = []
    outside = 0
    for job in state.jobs:
        if not job.running:
            continue
        for k, (node, (count, known)) in enumerate(zip(job.nodes, job.gpus, strict=False)):
            if node not in size:
                outside += 1
                continue
            indices = _indices(count, known, size[node], taken[node])
            if indices is not None:
                taken[node].update(indices)
            placed.append((job, k, node, count, indices))
    short: list[str] = []
    pending_reasons: dict[str, str] = {}
    gang_size: dict[str, int] = {}
    pinned: dict[str, str] = {}
    for job, _k, node, count, indices in placed:  # jobs whose indices Slurm did not name
        if indices is None:
            free = [i for i in range(size[node]) if i not in taken[node]]
            if len(free) < count:
                short.append(f"{job.id} on {node}")
                count = len(free)
            indices = tuple(free[:count])
            taken[node].update(indices)
        task = job.id if len(job.nodes) == 1 else f"{job.id}/{node}"
        gang_size[job.job] = len(job.nodes)
        why = pinned_why(job, options)
        if why:
            pinned[task] = why
        builder.add_allocation(
            task,
            num_gpu=len(indices),
            node=node,
            gpus=list(indices),
            start_time=job.start_time,
            scheduled_time=job.start_time,
            migratable=not why,
            **job_fields(job),
        )
    for job in state.jobs:
        if job.running or not _in_partitions(job.partitions, wanted):
            continue
        pending_reasons[job.job] = job.reason
        gang_size[job.job] = len(job.gpus)
        fields = job_fields(job)
        for k, (count, _) in enumerate(job.gpus):
            task = job.id if len(job.gpus) == 1 else f"{job.id}#{k}"
            builder.add_allocation(task, num_gpu=count, migratable=False, **fields)
    notes = _notes(kept, state.racks, outside, short)
    for line in notes:
        log.warning("%s: %s", (source or "slurm").rstrip(":"), line)
    model = builder.build(timestamp=state.read_at, source=source)
    return SlurmView(model, pending_reasons, unschedulable, tuple(notes), gang_size, pinned)


def _notes(
    nodes: Sequence[SlurmNode], racks: dict[str, str], outside: int, short: list[str]
) -> list[str]:
    notes = []
    if nodes and not racks:
        notes.append(
            "Slurm has no network topology (TopologyPlugin=topology/tree or a topology.conf "
            "via topology=FILE): every node's rack is unknown"
        )
    elif racks:
        missing = [node.name for node in nodes if node.name not in racks]
        if missing:
            notes.append(
                f"{len(missing)} node(s) under no leaf switch of the topology, rack unknown: "
                + ", ".join(missing[:5])
                + (" ..." if len(missing) > 5 else "")
            )
    if outside:
        notes.append(f"{outside} task(s) of running jobs on nodes outside the model were left out")
    if short:
        notes.append(
            "Slurm lists more GPUs in use than the node has for "
            + ", ".join(short[:5])
            + ": only the node's free GPUs are counted"
        )
    return notes
