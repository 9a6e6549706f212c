"""One cluster model from a scheduler view plus a usage model, joined by node name.

The scheduler (Kubernetes, kube-state-metrics, Slurm) says who holds what, what waits, where the
racks and pools are and which quotas apply; the usage sources (exporter pages, dcgm-exporter,
Prometheus) say which GPUs exist, how busy and healthy each is, how much memory it has and how
they are linked (NVLink islands). `build_model(view, usage)` keeps each side's facts:

- a node both know: its GPUs, health, topology and usage from the usage side; pool, rack, CPU,
  memory and schedulability from the scheduler (a rack or pool the scheduler lacks falls back
  to the usage side's labels; a node either side takes out of service is not free capacity);
- a task the usage side attributes to GPUs (a pod the exporter saw through the kubelet) keeps
  those GPUs; one it does not gets GPUs of its node the exporter shows held by no known task
  (those with processes first), else free ones, in index order;
- a node, GPU count or task only one side knows is kept as that side says and named in one
  note line (`SchedulerFacts.notes`): a node without an exporter has unknown usage, health and
  topology; a node the scheduler does not know is no capacity it can place work on (kept, not
  schedulable); a task whose GPUs are all held by others is left out with its name. Nothing is
  dropped or invented without a line saying so.

Without a usage model, the scheduler view alone makes the model: each node's GPUs are numbered
0..n-1 with unknown usage, health taken from the scheduler (it hands out only healthy GPUs) and
unknown NVLink islands; tasks take GPUs in index order (which device a pod holds is not known,
and no measure depends on it without topology).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from advisor.model import MILLI, NO_LIMIT, UNKNOWN_ISLAND, ClusterModel, ModelBuilder, Usage
from advisor.scheduler_view import SchedNode, SchedTask, SchedulerFacts, SchedulerView

UNATTRIBUTED = (
    "unattributed@"  # ingest.readings.from_readings' id for a GPU busy with no known holder
)
_MIG_SLICES = re.compile(r"^(\d+)g\.")
SHOWN_NAMES = 5  # names one note line lists before "and N more"


def mig_slices(profile: str) -> int:
    """Compute slices of a MIG profile ("3g.40gb" -> 3); 1 when the name says none."""
    match = _MIG_SLICES.match(profile)
    return int(match.group(1)) if match else 1


def slices_per_gpu(gpu_model: str) -> int:
    """Compute slices of a whole MIG-capable GPU: 4 on A30, 7 on A100/H100/H200/B200."""
    return 4 if "A30" in gpu_model.upper() else 7


def names_line(names: Sequence[str]) -> str:
    """'a, b, c' or 'a, b, c, d, e and 7 more'."""
    shown = ", ".join(names[:SHOWN_NAMES])
    more = len(names) - SHOWN_NAMES
    return f"{shown} and {more} more" if more > 0 else shown


# --------------------------------------------------------------------------- GPU slots


@dataclass
class _Slot:
    """One GPU of a node while tasks are placed on it."""

    index: int
    room: int  # milli-GPU a scheduler can still hand out here
    mig: bool
    busy_unknown: bool = False  # the usage side shows it held by no known task
    instances: list[str] = field(default_factory=list)  # free MIG instances (scheduler only)


def _take(slots: list[_Slot], task: SchedTask, slice_count: int) -> list[tuple[int, int]] | None:
    """(GPU index, milli) for each GPU `task` needs on this node, or None when they are not
    there; the slots' room is taken only when the whole task fits."""
    if task.num_gpu <= 0:
        return []
    picks: list[tuple[_Slot, int]] = []
    if task.mig_profile:
        share = round(MILLI * mig_slices(task.mig_profile) / slice_count)
        free = [s for s in slots if s.mig and s.room >= share]
        if any(s.instances for s in slots):  # the scheduler's own instance layout
            free = [s for s in free if task.mig_profile in s.instances]
        picks = [(s, share) for s in free[: task.num_gpu]]
    elif task.gpu_milli < MILLI:  # a share of one GPU: the fullest GPU it fits (best fit)
        fits = [s for s in slots if not s.mig and s.room >= task.gpu_milli]
        fits.sort(key=lambda s: (s.room, not s.busy_unknown, s.index))
        picks = [(s, task.gpu_milli) for s in fits[: task.num_gpu]]
    else:  # whole GPUs: those busy with no known holder first (they run this task), then free
        free = [s for s in slots if not s.mig and s.room >= MILLI]
        free.sort(key=lambda s: (not s.busy_unknown, s.index))
        picks = [(s, MILLI) for s in free[: task.num_gpu]]
    if len(picks) < task.num_gpu:
        return None
    for slot, milli in picks:
        slot.room -= milli
        slot.busy_unknown = False
        if task.mig_profile and task.mig_profile in slot.instances:
            slot.instances.remove(task.mig_profile)
    return [(slot.index, milli) for slot, milli in picks]


def _known_indices(slots: list[_Slot], task: SchedTask) -> list[tuple[int, int]] | None:
    """The GPUs the scheduler itself names for `task` (Slurm's GRES indices), when they have
    room; None to place it like any other."""
    if not task.gpu_indices or len(task.gpu_indices) != task.num_gpu or task.mig_profile:
        return None
    slot_of = {s.index: s for s in slots}
    chosen = [slot_of.get(i) for i in task.gpu_indices]
    if any(s is None or s.mig or s.room < task.gpu_milli for s in chosen):
        return None
    for slot in chosen:
        slot.room -= task.gpu_milli  # type: ignore[union-attr]
        slot.busy_unknown = False  # type: ignore[union-attr]
    return [(i, task.gpu_milli) for i in task.gpu_indices]


def _scheduler_gpus(node: SchedNode) -> list[dict]:
    """GPUs of a node known only to the scheduler: whole GPUs first, then the GPUs its MIG
    instances are carved from (largest profiles first, as many per GPU as its slices hold)."""
    gpus = [{"mig": False, "instances": []} for _ in range(node.gpus)]
    total = slices_per_gpu(node.gpu_model)
    instances = sorted(
        (profile for profile, count in node.mig.items() for _ in range(count)),
        key=lambda p: (-mig_slices(p), p),
    )
    carved: list[dict] = []
    for profile in instances:
        need = mig_slices(profile)
        home = next((g for g in carved if g["slices"] + need <= total), None)
        if home is None:
            home = {"mig": True, "instances": [], "slices": 0}
            carved.append(home)
        home["instances"].append(profile)
        home["slices"] += need
    if node.physical_gpus is not None and node.physical_gpus > len(gpus) + len(carved):
        # GPUs the node has (a label says) that the scheduler hands out in no form
        extra = node.physical_gpus - len(gpus) - len(carved)
        gpus += [{"mig": False, "instances": [], "withheld": True} for _ in range(extra)]
    return gpus + carved


# --------------------------------------------------------------------------- the join


@dataclass
class _Join:
    """The model being built and the notes of what did not match."""

    builder: ModelBuilder = field(default_factory=ModelBuilder)
    notes: list[str] = field(default_factory=list)
    without_usage: list[str] = field(default_factory=list)
    count_mismatch: list[str] = field(default_factory=list)
    usage_only: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)
    gpus_disagree: list[str] = field(default_factory=list)
    unknown_pods: list[str] = field(default_factory=list)
    taken: set[str] = field(default_factory=set)


def _pending_milli(task: SchedTask) -> int:
    """Milli-GPU per GPU a waiting task asks for (a MIG instance: its slices' share)."""
    if not task.mig_profile:
        return task.gpu_milli
    return round(MILLI * mig_slices(task.mig_profile) / slices_per_gpu(task.gpu_spec))


def _add_task(
    join: _Join, task: SchedTask, node: str | None, places: list[tuple[int, int]]
) -> None:
    if node is None:
        num_gpu, gpu_milli = task.num_gpu, _pending_milli(task)
    else:
        num_gpu, gpu_milli = len(places), max((m for _, m in places), default=task.gpu_milli)
    fields = dict(
        num_gpu=num_gpu,
        gpu_milli=gpu_milli if num_gpu else 0,
        job=task.job,
        tenant=task.tenant,
        priority=task.priority,
        cpu_milli=task.cpu_milli,
        memory_mib=task.memory_mib,
        gpu_spec=task.gpu_spec,
        start_time=task.start_time,
        creation_time=task.creation_time,
        migratable=task.migratable,
        restart_cost_s=task.restart_cost_s,
        qos=task.qos,
        gpu_limit_milli=_limit(task, gpu_milli) if num_gpu else None,
    )
    if node is None:
        join.builder.add_allocation(task.id, **fields)
        return
    join.builder.add_allocation(
        task.id,
        node=node,
        gpus=[i for i, _ in places],
        gpu_milli_each=[m for _, m in places],
        **fields,
    )


def _limit(task: SchedTask, gpu_milli: int) -> int | None:
    """The share a fractional task may burst to, where its source gives one the model can hold
    (between its guarantee and a whole GPU); a MIG instance bursts nowhere."""
    limit = task.gpu_limit_milli
    if task.mig_profile or limit is None or not gpu_milli <= limit <= MILLI:
        return None
    return limit


def _copy_allocation(join: _Join, usage: ClusterModel, row: int, node: str) -> None:
    """An allocation of the usage model, as it is there."""
    allocs, places = usage.allocations, usage.placements
    on = places.alloc == row
    limit = int(allocs.gpu_limit_milli[row])
    join.builder.add_allocation(
        str(allocs.id[row]),
        num_gpu=int(allocs.num_gpu[row]),
        gpu_milli=int(allocs.gpu_milli[row]),
        node=node,
        gpus=usage.gpus.index[places.gpu[on]].tolist(),
        gpu_milli_each=places.milli[on].tolist(),
        job=str(allocs.job[row]),
        tenant=str(allocs.tenant[row]),
        priority=int(allocs.priority[row]),
        cpu_milli=float(allocs.cpu_milli[row]),
        memory_mib=float(allocs.memory_mib[row]),
        gpu_spec=str(allocs.gpu_spec[row]),
        start_time=float(allocs.start_time[row]),
        creation_time=float(allocs.creation_time[row]),
        deletion_time=float(allocs.deletion_time[row]),
        scheduled_time=float(allocs.scheduled_time[row]),
        migratable=bool(allocs.migratable[row]),
        restart_cost_s=float(allocs.restart_cost_s[row]),
        qos=str(allocs.qos[row]),
        gpu_limit_milli=None if limit == NO_LIMIT else limit,
    )


class _UsageIndex:
    """The usage model by node name: GPU rows and allocations per node."""

    def __init__(self, usage: ClusterModel | None) -> None:
        self.model = usage
        self.node_row: dict[str, int] = {}
        self.allocs_on: dict[int, list[int]] = defaultdict(list)
        if usage is None:
            return
        self.node_row = {str(name): i for i, name in enumerate(usage.nodes.name.tolist())}
        for row, node in enumerate(usage.allocations.node.tolist()):
            if node >= 0:
                self.allocs_on[node].append(row)

    def gpu_rows(self, node: int) -> range:
        offset = self.model.nodes.gpu_offset  # type: ignore[union-attr]
        return range(int(offset[node]), int(offset[node + 1]))


def _add_usage_gpus(join: _Join, usage: ClusterModel, name: str, node: int) -> list[_Slot]:
    gpus = usage.gpus
    slots = []
    start, stop = int(usage.nodes.gpu_offset[node]), int(usage.nodes.gpu_offset[node + 1])
    for g in range(start, stop):
        index = int(gpus.index[g])
        join.builder.add_gpu(
            name,
            index,
            uuid=str(gpus.uuid[g]),
            memory_total_bytes=float(gpus.memory_total_bytes[g]),
            healthy=bool(gpus.healthy[g]),
            lost=bool(gpus.lost[g]),
            nvlink_island=int(gpus.nvlink_island[g]),
            mig_enabled=bool(gpus.mig_enabled[g]),
            carved_milli=int(gpus.carved_milli[g]),
            utilization_ratio=float(gpus.utilization_ratio[g]),
            memory_used_bytes=float(gpus.memory_used_bytes[g]),
            power_watts=float(gpus.power_watts[g]),
        )
        slots.append(_Slot(index, int(gpus.carved_milli[g]), bool(gpus.mig_enabled[g])))
    return slots


def _join_node(join: _Join, sn: SchedNode, tasks: list[SchedTask], index: _UsageIndex) -> None:
    """One node the scheduler knows, with the usage side's GPUs where it has them."""
    usage = index.model
    u = index.node_row.get(sn.name) if usage is not None else None
    if u is None or usage is None:
        join.builder.add_node(
            sn.name,
            pool=sn.pool,
            rack=sn.rack,
            gpu_model=sn.gpu_model,
            cpu_milli=sn.cpu_milli,
            memory_mib=sn.memory_mib,
            schedulable=sn.schedulable,
        )
        slots = []
        for i, gpu in enumerate(_scheduler_gpus(sn)):
            withheld = gpu.get("withheld", False)
            carved = MILLI
            if gpu["mig"]:
                total = slices_per_gpu(sn.gpu_model)
                carved = round(MILLI * min(gpu["slices"], total) / total)
            join.builder.add_gpu(
                sn.name,
                i,
                memory_total_bytes=sn.gpu_memory_bytes,
                healthy=not withheld,  # a GPU the scheduler does not hand out is no capacity
                mig_enabled=gpu["mig"],
                carved_milli=carved,
                nvlink_island=UNKNOWN_ISLAND,
            )
            slots.append(
                _Slot(i, 0 if withheld else carved, gpu["mig"], False, list(gpu["instances"]))
            )
        if usage is not None:
            join.without_usage.append(sn.name)
        _place_tasks(join, sn.name, tasks, slots, {}, sn.gpu_model)
        return
    join.builder.add_node(
        sn.name,
        pool=sn.pool or str(usage.nodes.pool[u]),
        rack=sn.rack or str(usage.nodes.rack[u]),
        gpu_model=str(usage.nodes.gpu_model[u]) or sn.gpu_model,
        cpu_milli=sn.cpu_milli,
        memory_mib=sn.memory_mib,
        schedulable=sn.schedulable and bool(usage.nodes.schedulable[u]),
    )
    slots = _add_usage_gpus(join, usage, sn.name, u)
    handed_out = sn.gpus + sum(sn.mig.values())
    seen = len(slots)
    if sn.mig:
        handed_out = sn.gpus + len([g for g in _scheduler_gpus(sn) if g["mig"]])
    if handed_out != seen:
        join.count_mismatch.append(f"{sn.name} ({handed_out} vs {seen})")
    # which usage allocations are scheduler tasks, which are busy GPUs without a known holder
    by_id: dict[str, int] = {}
    slot_of = {s.index: s for s in slots}
    for row in index.allocs_on.get(u, []):
        alloc_id = str(usage.allocations.id[row])
        by_id[alloc_id] = row
    known = {t.id for t in tasks}
    # a holder the exporter names by job, not by task (a Slurm job through its cgroup:
    # "12345@node"), is the task of that job on this node
    by_job = {t.job: t.id for t in tasks if t.id not in by_id}
    attributed: dict[str, list[tuple[int, int]]] = {}
    places = usage.placements
    for alloc_id, row in by_id.items():
        on = np.flatnonzero(places.alloc == row)
        held = [(int(usage.gpus.index[places.gpu[p]]), int(places.milli[p])) for p in on]
        task_id = alloc_id if alloc_id in known else by_job.pop(str(usage.allocations.job[row]), "")
        if task_id and not alloc_id.startswith(UNATTRIBUTED):
            attributed[task_id] = held
            for gpu, milli in held:
                slot_of[gpu].room -= milli
        elif alloc_id.startswith(UNATTRIBUTED):
            for gpu, _ in held:
                slot_of[gpu].busy_unknown = True
        else:  # a holder the exporter saw that the scheduler does not list: kept as seen
            join.unknown_pods.append(f"{alloc_id} on {sn.name}")
            _copy_allocation(join, usage, row, sn.name)
            for gpu, milli in held:
                slot_of[gpu].room -= milli
    _place_tasks(join, sn.name, tasks, slots, attributed, str(usage.nodes.gpu_model[u]))
    # busy GPUs no scheduler task took: still held by someone unknown
    for alloc_id, row in by_id.items():
        if alloc_id.startswith(UNATTRIBUTED):
            held_gpus = usage.gpus.index[places.gpu[places.alloc == row]].tolist()
            if all(slot_of[g].busy_unknown for g in held_gpus):
                _copy_allocation(join, usage, row, sn.name)


def _place_tasks(
    join: _Join,
    node: str,
    tasks: list[SchedTask],
    slots: list[_Slot],
    attributed: dict[str, list[tuple[int, int]]],
    gpu_model: str,
) -> None:
    slice_count = slices_per_gpu(gpu_model)
    # the attributed first (their GPUs are known), then the rest by size, largest first
    ordered = sorted(tasks, key=lambda t: (t.id not in attributed, -t.num_gpu * t.gpu_milli, t.id))
    for task in ordered:
        if task.id in attributed:
            held = attributed[task.id]
            if len(held) != task.num_gpu:
                join.gpus_disagree.append(f"{task.id} ({task.num_gpu} vs {len(held)})")
            _add_task(join, task, node, held)
            continue
        places = _known_indices(slots, task) or _take(slots, task, slice_count)
        if places is None:
            join.left_out.append(f"{task.id} ({task.num_gpu} GPUs on {node})")
            continue
        _add_task(join, task, node, places)


def _usage_only_node(join: _Join, index: _UsageIndex, name: str, u: int) -> None:
    usage = index.model
    assert usage is not None
    join.builder.add_node(
        name,
        pool=str(usage.nodes.pool[u]),
        rack=str(usage.nodes.rack[u]),
        gpu_model=str(usage.nodes.gpu_model[u]),
        schedulable=False,  # the scheduler cannot place work on a node it does not know
    )
    _add_usage_gpus(join, usage, name, u)
    for row in index.allocs_on.get(u, []):
        _copy_allocation(join, usage, row, name)
    join.usage_only.append(name)


def _join_notes(join: _Join, view: SchedulerView, usage: ClusterModel | None) -> list[str]:
    who = view.kind
    lines = []
    if join.without_usage:
        lines.append(
            f"{len(join.without_usage)} node(s) {who} knows have no usage reading (usage, "
            f"health and NVLink topology unknown there): {names_line(join.without_usage)}"
        )
    if join.usage_only:
        lines.append(
            f"{len(join.usage_only)} node(s) with usage readings are unknown to {who}: kept, "
            f"not counted as capacity it can place work on (do the node names match?): "
            f"{names_line(join.usage_only)}"
        )
    if join.count_mismatch:
        lines.append(
            f"{len(join.count_mismatch)} node(s) where {who} hands out another number of GPUs "
            f"than the usage side sees ({who} vs seen; the GPUs seen are kept): "
            f"{names_line(join.count_mismatch)}"
        )
    if join.gpus_disagree:
        lines.append(
            f"{len(join.gpus_disagree)} task(s) whose GPU count differs between {who} and the "
            f"usage side ({who} vs seen; the GPUs seen are kept): {names_line(join.gpus_disagree)}"
        )
    if join.unknown_pods:
        lines.append(
            f"{len(join.unknown_pods)} GPU holder(s) the usage side sees that {who} does not "
            f"list (kept as seen): {names_line(join.unknown_pods)}"
        )
    if join.left_out:
        lines.append(
            f"{len(join.left_out)} task(s) {who} places on a node whose GPUs are all held "
            f"by others there: left out of the model: {names_line(join.left_out)}"
        )
    return lines


def _usage_matrix(model: ClusterModel, usage: ClusterModel | None) -> Usage | None:
    """The usage side's history in the joined model's GPU order (NaN where it has none)."""
    if usage is None or not len(usage.usage.times):
        return None
    old = {
        key: g
        for g, key in enumerate(
            zip(usage.nodes.name[usage.gpus.node].tolist(), usage.gpus.index.tolist(), strict=True)
        )
    }
    keys = zip(model.nodes.name[model.gpus.node].tolist(), model.gpus.index.tolist(), strict=True)
    columns = np.array([old.get(key, -1) for key in keys], dtype=np.int64)
    have = columns >= 0
    t = len(usage.usage.times)
    util = np.full((t, len(columns)), np.nan, dtype=np.float32)
    memory = np.full_like(util, np.nan)
    util[:, have] = usage.usage.utilization_ratio[:, columns[have]]
    memory[:, have] = usage.usage.memory_used_bytes[:, columns[have]]
    return Usage(usage.usage.times.copy(), util, memory)


def build_model(
    view: SchedulerView, usage: ClusterModel | None = None, *, source: str = ""
) -> ClusterModel:
    """The cluster model of `view` joined with `usage` by node name (module docstring)."""
    join = _Join()
    index = _UsageIndex(usage)
    placed: dict[str, list[SchedTask]] = defaultdict(list)
    known_nodes = {n.name for n in view.nodes}
    pending: list[SchedTask] = []
    for task in view.tasks:
        if task.node is None:
            pending.append(task)
        elif task.node in known_nodes:
            placed[task.node].append(task)
        else:
            join.left_out.append(f"{task.id} (on {task.node}, a node {view.kind} does not list)")
    for sn in view.nodes:
        _join_node(join, sn, placed.get(sn.name, []), index)
    if usage is not None:
        for name, u in index.node_row.items():
            if name not in known_nodes:
                _usage_only_node(join, index, name, u)
    for task in pending:
        _add_task(join, task, None, [])
    timestamp = view.timestamp
    if usage is not None and not math.isnan(usage.timestamp):
        timestamp = usage.timestamp
    model = join.builder.build(timestamp=timestamp, source=source or view.source)
    history = _usage_matrix(model, usage)
    rack_from = view.rack_from
    if not rack_from and (model.nodes.rack != "").any():
        rack_from = "the usage side's node labels"
    pool_from = view.pool_from
    if not pool_from and (model.nodes.pool != "").any():
        pool_from = "the usage side's node labels"
    facts = SchedulerFacts(
        kind=view.kind,
        quotas=view.quotas,
        gang_size=dict(view.gang_size),
        rack_from=rack_from,
        pool_from=pool_from,
        notes=tuple(view.notes) + tuple(_join_notes(join, view, usage)),
        stale=view.stale,
        waiting_reason=dict(view.waiting_reason),
    )
    return dataclasses.replace(
        model,
        usage=history if history is not None else model.usage,
        left_out=usage.left_out if usage is not None else (),
        scheduler=facts,
        _cache={},
    )


def with_scheduler_labels(model: ClusterModel, view: SchedulerView) -> ClusterModel:
    """`model` (a usage source's past) with the pools and racks the scheduler names for its
    nodes now: a backfilled hour is grouped as the live runs group it (the labels are the
    cluster's layout, stable across hours); nodes the view does not name keep their own."""
    known = {n.name: n for n in view.nodes}
    names = model.nodes.name.tolist()
    pools = np.array(
        [
            known[n].pool or p if n in known else p
            for n, p in zip(names, model.nodes.pool.tolist(), strict=True)
        ],
        dtype=object,
    )
    racks = np.array(
        [
            known[n].rack or r if n in known else r
            for n, r in zip(names, model.nodes.rack.tolist(), strict=True)
        ],
        dtype=object,
    )
    nodes = dataclasses.replace(model.nodes, pool=pools, rack=racks)
    return dataclasses.replace(model, nodes=nodes, _cache={})
