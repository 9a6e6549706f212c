"""Slurm on the shared scheduler machinery: its view, facts and quotas.

`advisor.ingest.slurm` reads a Slurm cluster into the model itself (`SlurmView`: the model plus
the reasons jobs wait, why nodes are not free, gang sizes, which tasks are pinned) and its QOS
and association GPU limits into a `Policy` (`load_quotas`). This module hands both over the way
every scheduler source does (`advisor.scheduler_view`):

- `load_model(spec, timeout)`: `slurm:` alone: Slurm's own model with its `SchedulerFacts`
  (quotas, gang sizes, waiting reasons, where racks came from, notes), so `analyze`, `plan`,
  the service's queue and the rack-unknown counts read it like any scheduler's;
- `read_view(spec, timeout)`: the same as a `SchedulerView`, for `slurm:+http://exporter…` and
  `slurm:+prometheus+…`, joined by node name with the usage side (`combine.build_model`); a
  task keeps the GPU indices Slurm names where the usage side attributes none, and an
  exporter's cgroup attribution ("JOBID@node") is the task of that job on that node.

A quota read that fails (no slurmdbd, sacctmgr refused) is one note, never a failed read.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from advisor.ingest import slurm
from advisor.model import ClusterModel
from advisor.scheduler_view import Quota, SchedNode, SchedTask, SchedulerFacts, SchedulerView

KIND = "slurm"


def _quotas(spec: str, timeout: float) -> tuple[tuple[Quota, ...], tuple[str, ...]]:
    try:
        found = slurm.load_quotas(spec, timeout)
    except (slurm.SlurmUnavailable, slurm.SlurmFormatError) as error:
        return (), (f"quotas not read: {error}",)
    quotas = tuple(
        Quota(tenant, gpus, gpu_model=model, origin=found.origin.get((tenant, model), "Slurm"))
        for (tenant, model), gpus in sorted(found.policy.quotas.items())
    )
    return quotas, tuple(found.notes)


def _rack_from(model: ClusterModel) -> str:
    return "Slurm's network topology (leaf switches)" if (model.nodes.rack != "").any() else ""


def _facts(view: slurm.SlurmView, quotas: tuple[Quota, ...], notes: tuple[str, ...]):  # type: ignore[name-defined]
    return SchedulerFacts(
        kind=KIND,
        quotas=quotas,
        gang_size=dict(view.gang_size),
        rack_from=_rack_from(view.model),
        pool_from="Slurm partitions",
        notes=tuple(view.notes) + notes,
        waiting_reason=dict(view.pending_reasons),
    )


def check(spec: str) -> None:
    """SlurmSpecError (a ValueError) for a bad option; nothing read."""
    slurm.parse_spec(spec)


def load_model(spec: str, timeout: float) -> ClusterModel:
    """`slurm:` alone: Slurm's own model, with its scheduler facts."""
    view = slurm.load(spec, timeout)
    quotas, notes = _quotas(spec, timeout)
    return dataclasses.replace(view.model, scheduler=_facts(view, quotas, notes), _cache={})


def read_view(spec: str, timeout: float) -> SchedulerView:
    """The scheduler view of a Slurm read, for the join with usage sources."""
    view = slurm.load(spec, timeout)
    quotas, notes = _quotas(spec, timeout)
    model = view.model
    nodes = tuple(
        SchedNode(
            name=str(model.nodes.name[i]),
            pool=str(model.nodes.pool[i]),
            rack=str(model.nodes.rack[i]),
            gpu_model=str(model.nodes.gpu_model[i]),
            gpus=int(model.nodes.gpu_count[i]),
            cpu_milli=float(model.nodes.cpu_milli[i]),
            memory_mib=float(model.nodes.memory_mib[i]),
            schedulable=bool(model.nodes.schedulable[i]),
            unschedulable_reason=view.unschedulable.get(str(model.nodes.name[i]), ""),
        )
        for i in range(len(model.nodes))
    )
    held: dict[int, list[int]] = defaultdict(list)
    for alloc, gpu in zip(
        model.placements.alloc.tolist(), model.placements.gpu.tolist(), strict=True
    ):
        held[alloc].append(int(model.gpus.index[gpu]))
    allocs = model.allocations
    tasks = []
    for row in range(len(allocs)):
        node = int(allocs.node[row])
        task_id = str(allocs.id[row])
        tasks.append(
            SchedTask(
                id=task_id,
                job=str(allocs.job[row]),
                node=str(model.nodes.name[node]) if node >= 0 else None,
                num_gpu=int(allocs.num_gpu[row]),
                gpu_milli=int(allocs.gpu_milli[row]),
                tenant=str(allocs.tenant[row]),
                priority=int(allocs.priority[row]),
                cpu_milli=float(allocs.cpu_milli[row]),
                memory_mib=float(allocs.memory_mib[row]),
                gpu_spec=str(allocs.gpu_spec[row]),
                start_time=float(allocs.start_time[row]),
                creation_time=float(allocs.creation_time[row]),
                migratable=bool(allocs.migratable[row]),
                migratable_why=view.pinned.get(task_id, ""),
                restart_cost_s=float(allocs.restart_cost_s[row]),
                qos=str(allocs.qos[row]),
                gpu_indices=tuple(held[row]) if node >= 0 else None,
            )
        )
    facts = _facts(view, quotas, notes)
    return SchedulerView(
        kind=KIND,
        source=spec,
        nodes=nodes,
        tasks=tuple(tasks),
        quotas=quotas,
        gang_size=facts.gang_size,
        rack_from=facts.rack_from,
        pool_from=facts.pool_from,
        notes=facts.notes,
        timestamp=model.timestamp,
        waiting_reason=facts.waiting_reason,
    )
