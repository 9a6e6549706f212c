"""Why a goal cannot be met, in numbers: one function per question, whose text every surface
prints (the CLI's `why:`, the service's plan `reason`, the app's What-if and Actions pages).

- `why_not_now(model, shape)` — why no job of `shape` can start on the free GPUs now: too few
  free on the models it may use, not on one node (or in one NVLink island), not on enough nodes
  of one rack, or not with the CPU and memory left (`60 GPUs are free, but no rack and GPU
  model has 2 nodes with 8 free: the most is 1, rack r2 (A100)`).
- `why_not_cleared(inst, need, blocked)` — why the consolidation planner clears no room for one
  goal job (`job=`, `free-nodes=`, each job of `forecast=`), by the first bound that fails:
  too few nodes of the size and models asked, no rack holding enough of them, too many of them
  holding work that may not move (and which), more GPUs allocated than the rest can hold, or
  the work to move finding no free GPUs of its model elsewhere (`no rack holds 8 nodes of one
  GPU model with at least 8 GPUs: the most is 4, rack-01 (NVIDIA A100-SXM4-80GB)`).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from advisor.fragmentation import measures, nvlink
from advisor.fragmentation.measures import Shape
from advisor.model import MILLI, RESERVATION_QOS, ClusterModel
from advisor.planner.consolidate import (
    Instance,
    Need,
    best_window,
    cleared_room,
    replace_tasks,
)


def _gpus(value: float) -> str:
    return f"{value:g} GPU" + ("" if value == 1 else "s")


def _group_names(model: ClusterModel, groups: np.ndarray) -> dict[int, str]:
    """`rack (GPU model)` per rack group id; a node without a rack label is `node (no rack)`."""
    nodes = model.nodes
    out: dict[int, str] = {}
    for node in range(len(nodes)):
        group = int(groups[node])
        if group in out:
            continue
        rack = str(nodes.rack[node])
        where = f"rack {rack}" if rack else f"{nodes.name[node]} (no rack label)"
        out[group] = f"{where} ({nodes.gpu_model[node] or 'unknown model'})"
    return out


def _best_group(
    model: ClusterModel, counts: np.ndarray, groups: np.ndarray
) -> tuple[int, int, str]:
    """(the most per rack group of a per-node count, that group, its name), ties to the
    first group."""
    per_group = np.bincount(groups, weights=counts.astype(np.float64))
    best = int(np.argmax(per_group)) if len(per_group) else 0
    most = int(per_group[best]) if len(per_group) else 0
    return most, best, _group_names(model, groups).get(best, "no rack")


def why_not_now(model: ClusterModel, shape: Shape) -> str:
    """Why no job of `shape` can start on free capacity now, in numbers ("" when one can)."""
    if measures.jobs_that_fit(model, shape) > 0:
        return ""
    allowed = measures._spec_mask(model, shape.gpu_spec)
    on = f" on the models {shape.gpu_spec!r} allows" if shape.gpu_spec else ""
    need = shape.tasks * shape.num_gpu
    if shape.gpu_milli < MILLI:
        most = int(model.gpu_free_milli[allowed[model.gpus.node]].max(initial=0))
        return (
            f"no GPU{on} has {shape.gpu_milli / MILLI:g} GPU free: the most on one is "
            f"{most / MILLI:g}"
        )
    free_gpu = model.gpu_is_free & allowed[model.gpus.node]
    free = int(free_gpu.sum())
    if free < need:
        return f"only {_gpus(free)} free{on}, {need} needed"
    per_node = nvlink.whole_tasks_per_node(model, free_gpu, shape.num_gpu)
    gpu_room = (per_node > 0) & allowed
    host_room = measures.tasks_per_node(model, shape) > 0
    if not gpu_room.any():
        local = nvlink.needs_one_island(shape.num_gpu, nvlink.island_size_per_node(model))
        free_node = np.bincount(model.gpus.node[free_gpu], minlength=len(model.nodes))
        group = nvlink.largest_free_nvlink_group(model)
        parts = []
        if (allowed & ~local).any():
            node = int(np.argmax(np.where(allowed & ~local, free_node, -1)))
            parts.append(
                f"the most free on one node is {free_node[node]}, {model.nodes.name[node]}"
            )
        if (allowed & local).any():
            node = int(np.argmax(np.where(allowed & local, group, -1)))
            parts.append(
                f"a {shape.num_gpu}-GPU task must sit in one NVLink island where one holds it, "
                f"and the most free in one is {group[node]}, {model.nodes.name[node]}"
            )
        return (
            f"{_gpus(free)} free{on}, but no node has {shape.num_gpu} for one task: "
            + "; ".join(parts)
        )
    if not (gpu_room & host_room).any():
        return (
            f"{int(gpu_room.sum())} node(s) have {shape.num_gpu} free GPUs{on}, but not the CPU "
            f"or memory a task asks ({shape.cpu_milli:g} milli-CPU, {shape.memory_mib:g} MiB)"
        )
    groups = measures._rack_groups(model)
    most, _, where = _best_group(model, (gpu_room & host_room).astype(np.int64), groups)
    return (
        f"{_gpus(free)} free{on}, but no rack and GPU model has {shape.tasks} nodes with "
        f"{shape.num_gpu} free GPUs for one task each: the most is {most}, {where}"
    )


def _blockers(inst: Instance, nodes: np.ndarray, blocked: np.ndarray) -> str:
    """Why the work on `nodes` (bool (N)) keeps them from being cleared, with counts: tasks
    that may not move, by reason, and GPUs an earlier job of the same goal takes."""
    model = inst.model
    allocs = model.allocations
    why: Counter[str] = Counter()
    for t, row in enumerate(inst.task_rows.tolist()):
        if inst.task_movable[t] or not nodes[int(allocs.node[row])]:
            continue
        if not allocs.migratable[row]:
            why["not migratable"] += 1
        elif allocs.priority[row] > inst.goal_priority:
            why[f"of priority above the goal's {inst.goal_priority}"] += 1
        elif allocs.qos[row] == RESERVATION_QOS:
            why["that are reservations"] += 1
        elif not inst.task_whole[t] and len(inst.task_gpus[t]) > 1:
            why["fractional on several GPUs (MIG slices)"] += 1
        else:
            why["moved already for an earlier job of the goal"] += 1
    parts = []
    if why:
        tasks = ", ".join(
            f"{n} task{'s' if n > 1 else ''} {reason}" for reason, n in why.most_common()
        )
        parts.append(f"hold work that may not move ({tasks})")
    taken = int(
        np.bincount(model.gpus.node[blocked], minlength=len(nodes))[nodes].astype(bool).sum()
    )
    if taken:
        parts.append(f"{taken} hold GPUs an earlier job of the goal takes")
    return "; ".join(parts) or "have no GPUs a job could be given"


def why_not_cleared(inst: Instance, need: Need, blocked: np.ndarray | None = None) -> str:
    """Why no room for `need` can be cleared (module docstring), in numbers."""
    model = inst.model
    nodes = model.nodes
    blocked = np.zeros(len(model.gpus), dtype=bool) if blocked is None else blocked
    allowed = nodes.schedulable & measures._spec_mask(model, need.spec)
    on = f" of the models {need.spec!r} allows" if need.spec else ""
    size = "" if need.whole_node else f" with at least {need.gpus} GPUs"
    eligible = allowed & (nodes.gpu_count >= max(need.gpus, 1))
    if int(eligible.sum()) < need.tasks:
        return f"only {int(eligible.sum())} schedulable node(s){size}{on}, {need.tasks} needed"
    groups = measures._rack_groups(model) if need.same_rack else np.zeros(len(nodes), np.int64)
    if need.same_rack:
        racked = eligible & (nodes.rack != "")
        most, _, where = _best_group(model, racked.astype(np.int64), groups)
        if most < need.tasks:
            unlabelled = int((eligible & (nodes.rack == "")).sum())
            return (
                f"no rack holds {need.tasks} nodes of one GPU model{size}{on}: the most is "
                f"{most}, {where}"
                + (f" ({unlabelled} node(s) have no rack label)" if unlabelled else "")
            )
    counted = _by_counting(inst, need, eligible)
    if counted:
        return counted
    clearable = np.zeros(len(nodes), dtype=bool)
    for node in np.flatnonzero(eligible).tolist():
        clearable[node] = best_window(inst, node, need.gpus, need.whole_node, blocked) is not None
    most, group, where = _best_group(model, clearable.astype(np.int64), groups)
    if most < need.tasks:
        in_group = eligible & (groups == group) if need.same_rack else eligible
        held = in_group & ~clearable
        rack = f"in {where}, " if need.same_rack else ""
        return (
            f"{rack}{int(in_group.sum())} node(s){size}{on}, {int(held.sum())} of them "
            f"{_blockers(inst, held, blocked)}: {most} can be cleared, {need.tasks} needed"
        )
    return _no_home(inst, need, blocked, clearable, groups)


def _by_counting(inst: Instance, need: Need, eligible: np.ndarray) -> str:
    """More GPUs allocated on a GPU model than its GPUs outside the goal's room can hold, on
    every model the goal may use (work keeps its model unless the policy allows a change)."""
    model = inst.model
    gpu_model = model.nodes.gpu_model[model.gpus.node]
    lines = []
    scopes = (
        [""] if inst.policy.allow_model_change else sorted(set(model.nodes.gpu_model[eligible]))
    )
    for scope in scopes:
        on = model.gpu_usable & ((gpu_model == scope) if scope else True)
        usable = float(on.sum())
        allocated = float(model.gpu_milli_allocated[on].sum()) / MILLI
        if need.whole_node:
            here = eligible & ((model.nodes.gpu_model == scope) if scope else True)
            taken = float(np.sort(model.nodes.gpu_count[here])[: need.tasks].sum())
            room = usable - taken
            text = f"with {need.tasks} nodes empty the rest hold at most {room:g}"
        else:
            taken = float(need.tasks * need.gpus)
            room = usable - taken
            text = f"with the job's {taken:g} taken the rest hold at most {room:g}"
        if allocated <= room + 1e-9:
            return ""  # this model has room by counting: no bound proves it
        where = f" on {scope}" if scope and len(scopes) > 1 else ""
        lines.append(f"{allocated:g} GPUs are allocated{where}; {text}")
    return "; ".join(lines)


def _no_home(
    inst: Instance, need: Need, blocked: np.ndarray, clearable: np.ndarray, groups: np.ndarray
) -> str:
    """The best room's evicted work and how much of it finds no free GPUs elsewhere."""
    model = inst.model
    windows = []
    for node in np.flatnonzero(clearable).tolist():
        window = best_window(inst, node, need.gpus, need.whole_node, blocked)
        if window is not None:
            windows.append(window)
    if need.same_rack:
        by_group: dict[int, list] = {}
        for w in windows:
            by_group.setdefault(int(groups[w.node]), []).append(w)
        pools = [sorted(ws, key=lambda w: w.score)[: need.tasks] for ws in by_group.values()]
        pools = [p for p in pools if len(p) >= need.tasks]
    else:
        pools = [sorted(windows, key=lambda w: w.score)[: need.tasks]]
    picked = min(pools, key=lambda p: sum(w.score for w in p))
    mask, evict = cleared_room(inst, need, picked, blocked)
    _, failed, _ = replace_tasks(inst, evict, mask)
    moved = sum(len(inst.task_gpus[t]) * inst.task_milli[t] for t in evict) / MILLI
    lost = sum(len(inst.task_gpus[t]) * inst.task_milli[t] for t in failed) / MILLI
    free_out = float(np.where(mask | ~inst.usable, 0, inst.free).sum()) / MILLI
    where = (
        f" in {_group_names(model, groups)[int(groups[picked[0].node])]}" if need.same_rack else ""
    )
    return (
        f"clearing the {len(picked)} cheapest node(s){where} moves {len(evict)} task(s) "
        f"({moved:g} GPUs); {len(failed)} of them ({lost:g} GPUs) find no free GPUs of their "
        f"model, NVLink island, rack and CPU/memory elsewhere ({free_out:g} GPUs free outside "
        "the room)"
    )
