"""Slurm jobs (`squeue --json`, slurmrestd's `/jobs`) as `SlurmJob` rows: running jobs with
the GPUs they hold on each node, pending jobs with the nodes x GPUs they ask for.

Which jobs count:
- held GPUs: RUNNING, SUSPENDED (a suspended job keeps its GRES), CONFIGURING and COMPLETING
  (still holding the GPUs for a moment: never proposed for a move);
- the queue: PENDING jobs, except those waiting for something no plan can change
  (`NEVER_STARTS`: a hold, a dependency, a begin time, an invalid account or QOS, constraints
  no node meets, a partition that is down or too small). Their reason is kept on the row.
- finished jobs (`--json` lists them until MinJobAge) and jobs without GPUs that wait are left
  out; running jobs without GPUs are kept (they hold CPU and memory on GPU nodes).

GPUs per node: a running job's `gres_detail` (one entry per node, in the job's node order, with
the device indices); where a Slurm prints none, the GPUs of `tres_alloc_str` spread evenly over
the job's nodes, indices unknown. A pending job asks `tres_per_node` on each of its nodes, or
`tres_per_job` / `tres_per_task` x tasks / `gres/gpu` of `tres_req_str` spread evenly over
max(its node count, the fewest of the largest nodes that hold them).

A pending job array is one row per task it still has (`array_task_string`), at most
`MAX_ARRAY_TASKS`; a heterogeneous job's components share one job (`het_job_id`).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from advisor.ingest.slurm import gres
from advisor.ingest.slurm.hostlist import HostlistError, expand
from advisor.ingest.slurm.values import (
    SlurmFormatError,
    number,
    records,
    text,
    time_or_nan,
    whole,
    words,
)

log = logging.getLogger(__name__)

HOLDING = frozenset({"RUNNING", "SUSPENDED", "CONFIGURING", "COMPLETING"})
PENDING = "PENDING"
FINISHED = frozenset(
    {
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
        "REVOKED",
    }
)
NEVER_STARTS = frozenset(
    {
        "JobHeldUser",
        "JobHeldAdmin",
        "JobHoldMaxRequeue",
        "launch failed requeued held",
        "BeginTime",
        "Dependency",
        "DependencyNeverSatisfied",
        "InvalidAccount",
        "InvalidQOS",
        "BadConstraints",
        "PartitionDown",
        "PartitionInactive",
        "PartitionNodeLimit",
        "PartitionTimeLimit",
        "AccountNotAllowed",
        "QOSNotAllowed",
    }
)
MAX_ARRAY_TASKS = 1000
INT32_MAX = 2**31 - 1
# `--comment` / admin comment words the advisor reads (the Kubernetes annotations' names)
RESTART_COST_KEY = "gpu-defrag.io/restart-cost"
MIGRATABLE_KEY = "gpu-defrag.io/migratable"
_KEY_VALUE = re.compile(r"(gpu-defrag\.io/[a-z-]+)\s*[=:]\s*([^\s,;]+)")


@dataclass(slots=True)  # not frozen: a frozen class builds 100,000 jobs ~2x slower
class SlurmJob:
    """One job (or one task of a pending array, one component of a heterogeneous job)."""

    id: str  # Slurm's own spelling: 123, 123_4 (array task), 123+1 (het component)
    job: str  # the gang: 123, 123_4, or the het leader's id for every component
    running: bool  # holds GPUs now (else: waits in the queue)
    state: str
    nodes: tuple[str, ...]  # running: where; pending: ()
    gpus: tuple[tuple[int, tuple[int, ...] | None], ...]  # per task: (GPUs, indices or None)
    gpu_type: str  # GRES type the job asked for ("" any)
    account: str
    user: str
    qos: str
    partitions: tuple[str, ...]
    priority: int  # Slurm's, clipped to int32 (priority/basic prints up to 2^32-1)
    requeue: bool
    submit_time: float
    start_time: float
    reason: str
    reservation: str
    cpus_per_task: float  # NaN unknown
    memory_mib_per_task: float  # NaN unknown
    comment_fields: dict[str, str] = field(default_factory=dict)


def comment_fields(*comments: str) -> dict[str, str]:
    """`gpu-defrag.io/KEY=VALUE` words of a job's comments; a later comment (the admin's,
    which users cannot edit) wins."""
    out: dict[str, str] = {}
    for comment in comments:
        if comment and "gpu-defrag.io/" in comment:
            out.update(_KEY_VALUE.findall(comment))
    return out


def array_tasks(spec: str) -> list[int]:
    """Task ids of an `array_task_string` ("0-99%4", "1,3,5-7:2"); [] when it names none."""
    spec = spec.partition("%")[0].strip()
    if not spec:
        return []
    out: list[int] = []
    for part in spec.split(","):
        body, _, step_text = part.partition(":")
        low, _, high = body.partition("-")
        if not low.strip().isdigit() or (high and not high.strip().isdigit()):
            raise SlurmFormatError(f"array tasks {spec!r}: {part!r} is not a number or a range")
        step = int(step_text) if step_text.strip().isdigit() else 1
        out.extend(range(int(low), int(high or low) + 1, max(step, 1)))
        if len(out) > MAX_ARRAY_TASKS:
            break
    return out


def _spread(total: int, tasks: int) -> list[int]:
    base, extra = divmod(total, tasks)
    return [base + (1 if i < extra else 0) for i in range(tasks)]


def _per_task_resources(row: Mapping[str, Any], nodes: int) -> tuple[float, float]:
    """(CPUs, memory MiB) per node of a job: its `job_resources` where it gives them per node
    (the first node's), else its allocated (running) or requested TRES over its nodes."""
    alloc = row.get("job_resources")
    if isinstance(alloc, Mapping):
        per_node = alloc.get("allocated_nodes")  # v0.0.37 - v0.0.40
        if not per_node and isinstance(alloc.get("nodes"), Mapping):
            per_node = alloc["nodes"].get("allocation")  # v0.0.41+
        if isinstance(per_node, list) and per_node and isinstance(per_node[0], Mapping):
            first = per_node[0]
            cpus = first.get("cpus")
            cpus = number(cpus.get("count")) if isinstance(cpus, Mapping) else None
            memory = first.get("memory")
            memory = (
                number(memory.get("allocated"))
                if isinstance(memory, Mapping)
                else number(first.get("memory_allocated"))
            )
            if cpus or memory:
                return cpus or math.nan, memory or math.nan
    values = gres.tres(text(row.get("tres_alloc_str"))) or gres.tres(text(row.get("tres_req_str")))
    count = max(nodes, 1)
    cpus = values.get("cpu", math.nan) / count
    memory = values.get("mem", math.nan) / count
    return cpus, memory


def _held_gpus(
    row: Mapping[str, Any], nodes: list[str]
) -> list[tuple[int, tuple[int, ...] | None]]:
    """GPUs (count, indices) on each of a running job's nodes."""
    detail = row.get("gres_detail") or []
    if isinstance(detail, list) and len(detail) == len(nodes) and nodes:
        per_node = []
        for item in detail:
            found = gres.entries(text(item))
            count = sum(e.count for e in found)
            known = [e.indices for e in found]
            indices = (
                tuple(i for idx in known for i in idx or ())
                if found and all(idx is not None for idx in known)
                else None
            )
            if indices is not None and len(indices) != count:
                indices = None  # a detail whose indices disagree with its count: trust the count
            per_node.append((count, indices))
        return per_node
    total, _ = gres.tres_gpus(text(row.get("tres_alloc_str")))
    if not total:
        return [(_request_per_node(row)[0], None)] * len(nodes)
    return [(count, None) for count in _spread(total, max(len(nodes), 1))]


def _request_per_node(row: Mapping[str, Any]) -> tuple[int, str]:
    found = gres.entries(text(row.get("tres_per_node")))
    return sum(e.count for e in found), gres.gpu_type(found)


def _asked_type(row: Mapping[str, Any]) -> str:
    """The GRES type a job asked for in any of its request fields ("" any)."""
    for key in ("tres_per_node", "tres_per_job", "tres_per_task", "tres_per_socket"):
        kind = gres.gpu_type(gres.entries(text(row.get(key))))
        if kind:
            return kind
    return gres.tres_gpus(text(row.get("tres_req_str")))[1]


def _asked_gpus(
    row: Mapping[str, Any], largest_node_gpus: int
) -> tuple[list[tuple[int, tuple[int, ...] | None]], str]:
    """GPUs each task of a pending job asks for, and their type (module docstring)."""
    node_count = max(whole(row.get("node_count"), 1), 1)
    per_node, kind = _request_per_node(row)
    if per_node:
        return [(per_node, None)] * node_count, kind
    found = gres.entries(text(row.get("tres_per_job")))
    total, kind = sum(e.count for e in found), gres.gpu_type(found)
    if not total:
        found = gres.entries(text(row.get("tres_per_task")))
        tasks = max(whole(row.get("tasks"), 1), 1)
        total, kind = sum(e.count for e in found) * tasks, gres.gpu_type(found)
    if not total:
        total, kind = gres.tres_gpus(text(row.get("tres_req_str")))
    if not total:
        return [], ""
    tasks = node_count
    if largest_node_gpus > 0:
        tasks = max(node_count, math.ceil(total / largest_node_gpus))
    return [(count, None) for count in _spread(total, tasks)], kind


def _ids(row: Mapping[str, Any]) -> tuple[str, str]:
    """(id, job) in Slurm's own spelling."""
    job_id = whole(row.get("job_id"))
    array_job = whole(row.get("array_job_id"))
    array_task = number(row.get("array_task_id"))
    het_job = whole(row.get("het_job_id"))
    if het_job > 0:
        return f"{het_job}+{whole(row.get('het_job_offset'))}", str(het_job)
    if array_job > 0 and array_task is not None:
        key = f"{array_job}_{int(array_task)}"
        return key, key
    return str(job_id), str(job_id)


def parse_job(row: Mapping[str, Any], largest_node_gpus: int = 0) -> list[SlurmJob]:
    """The rows of one job object: [] for a job that neither holds nor waits for GPUs (module
    docstring), several for a pending array. SlurmFormatError names the job."""
    key, job = _ids(row)
    try:
        state_words = words(row.get("job_state"))
        state = state_words[0] if state_words else ""
        flags = set(state_words[1:])
        if "COMPLETING" in flags or "CONFIGURING" in flags:
            state = "COMPLETING" if "COMPLETING" in flags else "CONFIGURING"
        if state in FINISHED or not state:
            return []
        reason = text(row.get("state_reason"))
        if reason == "None":
            reason = ""
        running = state in HOLDING
        if not running and (state != PENDING or reason in NEVER_STARTS):
            return []
        try:
            nodes = expand(text(row.get("nodes"))) if running else []
        except HostlistError as error:
            raise SlurmFormatError(str(error)) from None
        if running:
            if not nodes:
                return []
            gpus, kind = _held_gpus(row, nodes), _asked_type(row)
        else:
            gpus, kind = _asked_gpus(row, largest_node_gpus)
            if not gpus or not any(count for count, _ in gpus):
                return []
        cpus, memory = _per_task_resources(row, len(gpus))
        priority = number(row.get("priority"))
        partitions = tuple(p for p in text(row.get("partition")).split(",") if p)
        base = SlurmJob(
            id=key,
            job=job,
            running=running,
            state=state,
            nodes=tuple(nodes),
            gpus=tuple(gpus),
            gpu_type=kind,
            account=text(row.get("account")),
            user=text(row.get("user_name")),
            qos=text(row.get("qos")),
            partitions=partitions,
            priority=min(int(priority), INT32_MAX) if priority is not None else 0,
            requeue=bool(row.get("requeue", False)),
            submit_time=time_or_nan(row.get("submit_time")),
            start_time=time_or_nan(row.get("start_time")) if running else math.nan,
            reason=reason,
            reservation=text(row.get("resv_name")),
            cpus_per_task=cpus,
            memory_mib_per_task=memory,
            comment_fields=comment_fields(text(row.get("comment")), text(row.get("admin_comment"))),
        )
    except SlurmFormatError as error:
        raise SlurmFormatError(f"job {key}: {error}") from None
    if running or number(row.get("array_task_id")) is not None:
        return [base]
    tasks = array_tasks(text(row.get("array_task_string")))
    if not tasks:
        return [base]
    if len(tasks) > MAX_ARRAY_TASKS:
        log.warning(
            "job array %s: only its first %d pending tasks are read as demand",
            key,
            MAX_ARRAY_TASKS,
        )
        tasks = tasks[:MAX_ARRAY_TASKS]
    array_job = whole(row.get("array_job_id")) or key
    return [_task(base, f"{array_job}_{task}") for task in tasks]


def _task(base: SlurmJob, key: str) -> SlurmJob:
    return replace(base, id=key, job=key)


def parse_jobs(doc: Any, largest_node_gpus: int = 0, where: str = "jobs") -> list[SlurmJob]:
    """The GPU jobs of a `squeue --json` / `/jobs` answer (module docstring)."""
    out: list[SlurmJob] = []
    for row in records(doc, "jobs", where):
        out.extend(parse_job(row, largest_node_gpus))
    return out
