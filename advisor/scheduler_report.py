"""What a scheduler source adds to a report: the queue, where racks came from, quotas, notes.

`pending_jobs(model)` groups the waiting GPU tasks (allocations with `node == -1`) into jobs:
one row per gang with its tasks, GPUs, the gang size the scheduler declares (a PodGroup's
minMember; more than the tasks seen when not all pods exist yet), tenant, priority, age and
the scheduler's own reason for the wait where it gives one. `section(...)` is the block
`analyze` (table and JSON) and the service show; `print_section` writes it as text.

Pure functions of the model (and the merged policy); usage-only sources give an empty queue
and no scheduler block.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, TextIO

import numpy as np

from advisor.fragmentation.measures import Shape
from advisor.model import MILLI, ClusterModel
from advisor.planner.constraints import Policy
from advisor.planner.policy_merge import merge_lines


def job_shape_label(tasks: int, num_gpu: int, gpu_milli: int) -> str:
    """The advisor contract's shape label of a job: `0.5`, `8`, `4x8`."""
    size = f"{gpu_milli / MILLI:g}" if gpu_milli < MILLI else str(num_gpu)
    return f"{tasks}x{size}" if tasks > 1 else size


def pending_jobs(model: ClusterModel) -> list[dict[str, Any]]:
    """Waiting GPU jobs, most GPUs first (then oldest): the queue."""
    allocs = model.allocations
    rows = np.flatnonzero((allocs.node < 0) & (allocs.num_gpu > 0))
    facts = model.scheduler
    gang = facts.gang_size if facts is not None else {}
    why = facts.waiting_reason if facts is not None else {}
    by_job: dict[str, list[int]] = defaultdict(list)
    for row in rows.tolist():
        by_job[str(allocs.job[row])].append(row)
    out = []
    for job, members in by_job.items():
        num_gpu = max(int(allocs.num_gpu[r]) for r in members)
        milli = max(int(allocs.gpu_milli[r]) for r in members)
        seen = len(members)
        declared = gang.get(job)
        tasks = max(seen, declared or 0)
        created = [float(allocs.creation_time[r]) for r in members]
        created = [c for c in created if not math.isnan(c)]
        out.append(
            {
                "job": job,
                "tenant": str(allocs.tenant[members[0]]),
                "priority": max(int(allocs.priority[r]) for r in members),
                "tasks": tasks,
                "tasks_seen": seen,
                "gang_size": declared,
                "gpus_per_task": num_gpu if milli >= MILLI else milli / MILLI,
                "gpus": tasks * num_gpu * milli / MILLI,
                "shape": job_shape_label(tasks, num_gpu, milli),
                "gpu_spec": str(allocs.gpu_spec[members[0]]),
                "created": min(created) if created else None,
                "waiting_reason": why.get(job),
                "task_ids": [str(allocs.id[r]) for r in members],
            }
        )
    out.sort(key=lambda r: (-r["gpus"], r["created"] if r["created"] is not None else math.inf))
    return out


def job_shape(row: dict[str, Any]) -> Shape:
    """A pending job's shape (`pending_jobs` row), for the planner's `job=` goal."""
    per_task = row["gpus_per_task"]
    if per_task < 1:
        return Shape(1, round(per_task * MILLI), row["tasks"], gpu_spec=row["gpu_spec"])
    return Shape(int(per_task), MILLI, row["tasks"], gpu_spec=row["gpu_spec"])


def section(model: ClusterModel, policy: Policy | None, policy_file: str = "") -> dict[str, Any]:
    """The scheduler block of a report (None-valued parts where the source has no scheduler)."""
    facts = model.scheduler
    queue = pending_jobs(model)
    return {
        "kind": facts.kind if facts is not None else None,
        "stale": (facts.stale or None) if facts is not None else None,
        "racks_from": facts.rack_from or None if facts is not None else None,
        "pools_from": facts.pool_from or None if facts is not None else None,
        "notes": list(facts.notes) if facts is not None else [],
        "pending_jobs": [{k: v for k, v in r.items() if k != "task_ids"} for r in queue],
        "quotas": merge_lines(policy, model, policy_file),
    }


def print_section(doc: dict[str, Any], out: TextIO, top: int = 10) -> None:
    """The block as text: nothing for a source without a scheduler and without quotas."""
    if doc["kind"] is None and not doc["quotas"]:
        return
    if doc["kind"] is not None:
        out.write(f"\nScheduler ({doc['kind']})\n")
        if doc["stale"]:
            out.write(f"  STALE: {doc['stale']}\n")
        out.write(f"  racks: {doc['racks_from'] or 'unknown (no rack label found)'}\n")
        out.write(f"  pools: {doc['pools_from'] or 'unknown (no pool label found)'}\n")
        for note in doc["notes"]:
            out.write(f"  note: {note}\n")
        queue = doc["pending_jobs"]
        gpus = sum(r["gpus"] for r in queue)
        out.write(f"  queue: {len(queue)} job(s) waiting for {gpus:g} GPUs\n")
        for row in queue[:top]:
            gang = ""
            if row["gang_size"] and row["tasks_seen"] < row["gang_size"]:
                gang = f" ({row['tasks_seen']} of {row['gang_size']} tasks created)"
            why = f": {row['waiting_reason']}" if row["waiting_reason"] else ""
            out.write(
                f"    {row['job']} [{row['tenant'] or '-'}] {row['shape']} = {row['gpus']:g} "
                f"GPUs, priority {row['priority']}{gang}{why}\n"
            )
        if len(queue) > top:
            out.write(f"    ... and {len(queue) - top} more\n")
    if doc["quotas"]:
        out.write("\n" + "\n".join(doc["quotas"]) + "\n")
