"""Type rebalancing: light jobs on scarce GPU models move to an idle model.

In a mixed fleet demand queues on H100/A100 while V100s idle. A job whose observed use would fit
a slower model without a large slowdown can move there and free a scarce GPU for the queue.

Relative throughput (`THROUGHPUT`, V100 = 1) is a rough per-GPU figure for mixed-precision deep
learning training (FP16/BF16 tensor cores, with TF32 on Ampere and later), in the range NVIDIA's
and Lambda's published training benchmarks give: A100 ~2.5x V100, H100 SXM ~2x A100. A job
running at p95 utilization `u` on a model of throughput `s` needs `u * s / d` of a model of
throughput `d`; if that is at most 1 it keeps its speed (the target just runs busier), else it
runs `u * s / d` times slower. Memory must fit too: the job's peak memory plus a margin must be
under the target's memory. It is an estimate from one number per model, not a measurement of
the job: each action says the figures it used.

`plan_rebalance(model, policy, settings)`:
- scarce models are those with queued demand they cannot hold (pending tasks that allow the
  model, beyond its free GPUs); without any queue, models at least `scarce_ratio` allocated;
  the GPUs to free per scarce model are its shortfall (or what brings it back under the ratio),
  which bounds the candidate moves;
- idle models are those with free GPUs and no shortfall of their own;
- eligible: placed single-task jobs (whole GPUs), migratable, `gpu_spec` allowing the target,
  priority at most the goal's and at most the highest priority queued for its model (never
  move work for lower-priority demand), estimated slowdown at most `max_slowdown`, memory
  fitting;
- the cheapest eligible moves (smallest slowdown, then fewest GPUs) are taken while the scarce
  model still needs GPUs and the idle model has a node with room; each is a `rebalance` action
  onto free GPUs of one node (inside one NVLink island when it fits one), checked by
  `check_plan`; a move the replay refuses is dropped and the rest planned again;
- with a queue, only moves that let a waiting task start are kept: a GPU count freed is not a
  task served (one GPU here and two there start no 4-GPU task). The queue's shapes are its
  tasks' (GPUs, share, `gpu_spec`; one task each); what the queue gets is, per shape and
  priority, how many of its waiting tasks could start together on the model after the plan (a
  greedy best-fit packing of the whole queue, higher priority first, then largest first, on
  free GPUs as `measures.jobs_that_fit` counts them, so never more tasks than wait). Moves are
  dropped, costliest first and until none can be, while the plan without the move starts no
  fewer tasks of the moved job's priority or above, of any shape, and passes `check_plan`:
  removing any kept move leaves some queued task of at least its priority unable to start,
  and no move only makes room beyond the queue or for lower-priority demand. Each kept move
  names the queued tasks it lets start; the dropped ones are `extra.not_needed`, and
  `extra.queue` gives the waiting tasks per shape and how many could start before and after;
- without a queue the moves free the GPUs that bring a scarce model back under `scarce_ratio`.
"""

from __future__ import annotations

import functools
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from advisor.fragmentation.measures import Shape
from advisor.fragmentation.nvlink import crossing_note
from advisor.model import MILLI, ClusterModel, spec_allows
from advisor.planner.actions import Action, GpuSet, Plan, move_cost
from advisor.planner.check import check_plan
from advisor.planner.constraints import Policy, island_size_per_node, needs_one_island
from advisor.planner.observed import HISTORY_HINT, history_s, observe
from advisor.planner.outcome import outcome, shapes_with

# (substring of the NVML name, relative training throughput per GPU, V100 = 1); first match.
THROUGHPUT: tuple[tuple[str, float], ...] = (
    ("GH200", 5.5),
    ("H200", 5.5),
    ("H100 PCIe", 3.8),
    ("H100", 5.0),
    ("A100", 2.5),
    ("L40S", 2.6),
    ("L40", 1.9),
    ("A30", 1.4),
    ("A10", 1.0),
    ("V100", 1.0),
    ("L4", 0.6),
    ("T4", 0.35),
)


@functools.lru_cache(maxsize=256)
def throughput(gpu_model: str) -> float | None:
    """Relative throughput of `gpu_model` (V100 = 1); None when the table does not know it."""
    name = gpu_model.upper()
    for key, value in THROUGHPUT:
        if key.upper() in name:
            return value
    return None


def slowdown(utilization: float, source: str, target: str) -> float | None:
    """Estimated run-time factor (1 = same speed) moving from `source` to `target`."""
    s, d = throughput(source), throughput(target)
    if s is None or d is None or not math.isfinite(utilization):
        return None
    return max(1.0, utilization * s / d)


@dataclass(frozen=True)
class RebalanceSettings:
    window_s: float = 24 * 3600.0  # history the utilization comes from
    min_samples: int = 3
    max_slowdown: float = 1.2  # move only if the job runs at most this much slower
    memory_margin: float = 0.05  # of the target's memory, above the job's peak
    scarce_ratio: float = 0.9  # allocated share that makes a model scarce without queues
    goal_priority: int | None = None  # never move work above this priority (None: any)


def _model_table(model: ClusterModel, ratio: float) -> dict[str, dict[str, float]]:
    """Per GPU model: usable, free, pending demand it could hold, GPUs to free."""
    gpu_model = model.nodes.gpu_model[model.gpus.node]
    allocs = model.allocations
    pending = (allocs.node < 0) & (allocs.num_gpu > 0)
    table: dict[str, dict[str, float]] = {}
    for name in sorted(set(gpu_model.tolist())):
        on = gpu_model == name
        table[name] = {
            "usable": float((on & model.gpu_usable).sum()),
            "free": float((on & model.gpu_is_free).sum()),
            "allocated": float(model.gpu_milli_allocated[on].sum()) / MILLI,
            "demand": 0.0,
            "queue_priority": -math.inf,  # highest priority waiting for it (-inf: no queue)
        }
    for row in np.flatnonzero(pending).tolist():
        allowed = [m for m in table if spec_allows(str(allocs.gpu_spec[row]), m)]
        need = float(allocs.num_gpu[row]) * float(allocs.gpu_milli[row]) / MILLI
        for m in allowed:  # demand that could use any of several models counts on each
            table[m]["demand"] += need
            table[m]["queue_priority"] = max(table[m]["queue_priority"], int(allocs.priority[row]))
    any_queue = bool(pending.any())
    for row in table.values():
        if any_queue:
            row["to_free"] = max(0.0, row["demand"] - row["free"])
        else:
            target = math.ceil((1.0 - ratio) * row["usable"] - 1e-9)
            row["to_free"] = max(0.0, target - row["free"]) if row["usable"] else 0.0
    return table


def _free_slots(model: ClusterModel, free: np.ndarray, node: int, k: int, island: int):
    """GPU rows of `node` for a k-GPU task among `free` (one island when it fits one; `island`
    is the node's largest island, 0 when unknown or the rule is off)."""
    start, stop = model.nodes.gpu_offset[node], model.nodes.gpu_offset[node + 1]
    rows = [r for r in range(start, stop) if free[r]]
    if len(rows) < k:
        return None
    if needs_one_island(k, island):
        by_island: dict[int, list[int]] = defaultdict(list)
        for r in rows:
            by_island[int(model.gpus.nvlink_island[r])].append(r)
        fits = [g for g in by_island.values() if len(g) >= k]
        if not fits:
            return None
        return min(fits, key=len)[:k]  # the fullest island that holds it
    return rows[:k]


def candidates(
    model: ClusterModel, settings: RebalanceSettings = RebalanceSettings()
) -> list[dict[str, Any]]:
    """Every placed single-task whole-GPU job with its estimate per idle-capable model."""
    obs = observe(model, settings.window_s)
    allocs = model.allocations
    jobs = Counter(allocs.job.tolist())
    models = sorted(set(model.nodes.gpu_model.tolist()))
    places = model.placements
    memory = {m: float(np.nanmin(_memory_of(model, m), initial=np.inf)) for m in models}
    out = []
    for row in np.flatnonzero((allocs.node >= 0) & (allocs.num_gpu > 0)).tolist():
        node = int(allocs.node[row])
        source = str(model.nodes.gpu_model[node])
        on = places.alloc == row
        util, mem = float(obs.util_p95[row]), float(obs.memory_peak_bytes[row])
        entry: dict[str, Any] = {
            "row": row,
            "alloc": str(allocs.id[row]),
            "job": str(allocs.job[row]),
            "tenant": str(allocs.tenant[row]),
            "priority": int(allocs.priority[row]),
            "node": str(model.nodes.name[node]),
            "gpus": [int(model.gpus.index[g]) for g in places.gpu[on]],
            "num_gpu": int(allocs.num_gpu[row]),
            "gpu_model": source,
            "util_p95": round(util, 4) if math.isfinite(util) else None,
            "memory_peak_bytes": mem if math.isfinite(mem) else None,
            "targets": {},
        }
        why = ""
        if jobs[entry["job"]] > 1:
            why = "multi-task job (its tasks stay on one model)"
        elif allocs.gpu_milli[row] != MILLI:
            why = "holds a fraction of a GPU"
        elif not allocs.migratable[row]:
            why = "marked not migratable"
        elif settings.goal_priority is not None and entry["priority"] > settings.goal_priority:
            why = f"priority {entry['priority']} above {settings.goal_priority}"
        elif obs.samples[row] < settings.min_samples or not math.isfinite(util):
            why = "too few usage samples"
        for target in models:
            if target == source:
                continue
            factor = slowdown(util, source, target)
            total = memory[target]
            fits_mem = math.isfinite(mem) and mem + settings.memory_margin * total <= total
            reason = why
            if not reason and not spec_allows(str(allocs.gpu_spec[row]), target):
                reason = f"asks for {allocs.gpu_spec[row]}"
            if not reason and factor is None:
                reason = "throughput of a model unknown"
            if not reason and factor is not None and factor > settings.max_slowdown:
                reason = f"{factor:.2f}x slower"
            if not reason and not fits_mem:
                reason = f"peak memory {mem / 2**30:.0f} GiB does not fit {total / 2**30:.0f} GiB"
            entry["targets"][target] = {
                "slowdown": round(factor, 3) if factor is not None else None,
                "eligible": not reason,
                "why_not": reason,
            }
        out.append(entry)
    return out


def _memory_of(model: ClusterModel, gpu_model: str) -> np.ndarray:
    return model.gpus.memory_total_bytes[model.nodes.gpu_model[model.gpus.node] == gpu_model]


Queued = tuple[Shape, int]  # a waiting task's shape and its priority


def _queue(model: ClusterModel) -> Counter[Queued]:
    """The shape of each waiting task (its GPUs and share, its `gpu_spec`; one task) and its
    priority, and how many tasks of each wait."""
    allocs = model.allocations
    pending = (allocs.node < 0) & (allocs.num_gpu > 0)
    queued: Counter[Queued] = Counter()
    for k, milli, spec, priority in zip(
        allocs.num_gpu[pending].tolist(),
        allocs.gpu_milli[pending].tolist(),
        allocs.gpu_spec[pending].tolist(),
        allocs.priority[pending].tolist(),
        strict=True,
    ):
        if 0 < milli <= MILLI and (k == 1 or milli == MILLI):
            queued[(Shape(int(k), int(milli), 1, gpu_spec=str(spec)), int(priority))] += 1
    return queued


def _by_shape(counts: dict[Queued, int]) -> Counter[Shape]:
    out: Counter[Shape] = Counter()
    for (shape, _), n in counts.items():
        out[shape] += n
    return out


def _rows(model: ClusterModel, action: Action) -> tuple[list[int], list[int], int]:
    """GPU rows a move gives back and takes, and its milli per GPU."""
    assert action.src is not None and action.dst is not None
    src, dst = action.src, action.dst
    give, take = model.node_index(src.node), model.node_index(dst.node)
    return (
        [model.gpu_row(give, i) for i in src.gpus],
        [model.gpu_row(take, i) for i in dst.gpus],
        dst.milli,
    )


def _room(
    model: ClusterModel, moves: list[tuple[list[int], list[int], int]]
) -> tuple[np.ndarray, np.ndarray]:
    """(whole GPU free, free milli) per GPU after checked `moves` (`_rows` of each), as
    `ClusterModel.gpu_room` reads them on `apply_plan`'s model, without building that model:
    each move gives its source GPUs back and takes its target ones."""
    allocated = model.gpu_milli_allocated.copy()
    for give, take, milli in moves:
        allocated[give] -= milli
        allocated[take] += milli
    return model.gpu_room(allocated)


def _served(
    model: ClusterModel, queued: Counter[Queued], room: tuple[np.ndarray, np.ndarray] | None = None
) -> dict[Queued, int]:
    """Per queued shape and priority, how many of its waiting tasks could start together with
    the rest of the queue on `model` (or on the free GPUs `room` gives, see `_room`): a greedy
    packing, higher priority first (as a priority scheduler starts them), then largest shapes
    first, each onto the allowed nodes (whole GPUs) or GPUs (a share) with the
    least room that holds it (best fit). Never more than fit together, nor more than wait;
    GPUs only, as `measures.jobs_that_fit` counts them."""
    is_free, free_milli = room or (model.gpu_is_free, model.gpu_free_milli)
    node_model, gpu_node = model.nodes.gpu_model, model.gpus.node
    names = sorted(set(node_model.tolist()))
    whole = np.bincount(gpu_node[is_free], minlength=len(model.nodes))
    milli: np.ndarray | None = None  # free milli per GPU, once the whole-GPU shapes are packed
    served: dict[Queued, int] = {}
    # shares (< 1 GPU) last: they take the room whole-GPU tasks leave
    for key in sorted(queued, key=lambda q: (q[0].gpu_milli < MILLI, -q[1], -q[0].gpus, q[0].name)):
        shape = key[0]
        ok = [name for name in names if spec_allows(shape.gpu_spec, name)]
        allowed = np.isin(node_model, np.array(ok, dtype=object))
        if shape.gpu_milli == MILLI:
            space, size, on = whole, shape.num_gpu, allowed
        else:
            if milli is None:  # whole-GPU tasks took all but `whole` free GPUs of each node
                milli = free_milli.astype(np.int64, copy=True)
                free = np.flatnonzero(is_free)  # GPU rows are grouped by node, in node order
                node = gpu_node[free]
                rank = np.arange(len(free)) - np.searchsorted(node, node)
                milli[free[rank >= whole[node]]] = 0
            space, size, on = milli, shape.gpu_milli, allowed[gpu_node]
        fits = np.where(on, space // size, 0)
        order = np.argsort(space, kind="stable")  # least room first
        order = order[fits[order] > 0]
        before = np.cumsum(fits[order]) - fits[order]
        take = np.clip(queued[key] - before, 0, fits[order])
        space[order] -= take * size
        served[key] = int(take.sum())
    return served


def _keep_needed(
    model: ClusterModel,
    actions: list[Action],
    policy: Policy,
    goal_priority: int | None,
    queued: Counter[Queued],
    check_each: bool = False,
) -> tuple[list[Action], list[str], dict[str, list[tuple[Queued, int]]], dict[Queued, int]]:
    """Drop, costliest first and until none can be, every move whose removal starts no fewer
    queued tasks of its own priority or above, of any shape, and keeps the plan checked (work
    is never moved for lower-priority demand). Returns the kept moves, the dropped
    allocations, per kept move the queued tasks it lets start (shape and priority, how many
    fewer could start without it), and per shape and priority how many queued tasks could
    start after the kept moves. Dropping a move of a checked plan only leaves GPUs, CPU,
    memory and quota unused, so the kept plan is checked once at the end; should it fail, the
    moves are dropped again with a check before each drop (`check_each`)."""
    keep = list(actions)
    rows = {a.alloc: _rows(model, a) for a in keep}
    allocs = model.allocations
    row_of = {str(a): r for r, a in enumerate(allocs.id.tolist())}
    own = {a.alloc: int(allocs.priority[row_of[a.alloc]]) for a in keep}
    served = _served(model, queued, _room(model, [rows[a.alloc] for a in keep]))
    dropped: list[str] = []
    serves: dict[str, list[tuple[Queued, int]]] = {}
    changed = True
    while changed:  # a pass that drops nothing ends it; its findings are the kept moves'
        changed = False
        serves = {}
        for action in sorted(keep, key=lambda a: (-a.cost.score(), -a.cost.gpu_hours, a.alloc)):
            rest = [a for a in keep if a is not action]
            without = _served(model, queued, _room(model, [rows[a.alloc] for a in rest]))
            lost = [
                (q, served[q] - without[q])
                for q in queued
                if without[q] < served[q] and q[1] >= own[action.alloc]
            ]
            if lost or (check_each and not check_plan(model, rest, policy, goal_priority).ok):
                serves[action.alloc] = lost
                continue
            keep, served = rest, without
            dropped.append(action.alloc)
            changed = True
    if not check_each and not check_plan(model, keep, policy, goal_priority).ok:
        return _keep_needed(model, actions, policy, goal_priority, queued, True)  # pragma: no cover
    return keep, dropped, serves, served


def _serves_text(model_name: str, k: int, node: str, lost: list[tuple[Queued, int]]) -> str:
    """What a kept move frees and the queued tasks that could not start without it."""
    if not lost:  # pragma: no cover - dropping a move never breaks the replay of the others
        return f"frees {k} {model_name} on {node}; kept as the plan without it fails the check"
    by_shape = _by_shape(dict(lost))
    shapes = " and ".join(
        f"{n} queued {s.name} task{'s' if n > 1 else ''}"
        for s, n in sorted(by_shape.items(), key=lambda kv: (-kv[0].gpus, kv[0].name))
    )
    return (
        f"frees {k} {model_name} on {node} for the queue: without this move {shapes} "
        "could not start"
    )


def plan_rebalance(
    model: ClusterModel,
    policy: Policy | None = None,
    settings: RebalanceSettings = RebalanceSettings(),
) -> Plan:
    """A checked plan moving light jobs off scarce models (module docstring)."""
    policy = policy or Policy()
    table = _model_table(model, settings.scarce_ratio)
    scarce = {m for m, r in table.items() if r["to_free"] > 0}
    idle = {m for m, r in table.items() if r["free"] > 0 and m not in scarce}
    found = candidates(model, settings)
    queued = [table[m]["queue_priority"] for m in scarce if table[m]["queue_priority"] > -math.inf]
    goal_priority = settings.goal_priority
    if goal_priority is None and queued:
        goal_priority = int(max(queued))  # the checker enforces the priority rule too
    dropped: set[str] = set()
    goal = "rebalance light jobs from scarce GPU models to idle ones"
    actions: list[Action] = []
    for _ in range(len(found) + 1):
        actions = _plan_moves(model, policy, settings, table, scarce, idle, found, dropped)
        result = check_plan(model, actions, policy, goal_priority)
        if result.ok:
            break
        assert result.violation is not None
        dropped.add(result.violation.action.alloc)
    else:  # pragma: no cover - each round drops one job
        actions = []
    waiting = _queue(model)
    waiting_shapes = _by_shape(waiting)
    has_queue = bool(((model.allocations.node < 0) & (model.allocations.num_gpu > 0)).any())
    not_needed: list[str] = []
    serves: dict[str, list[tuple[Queued, int]]] = {}
    queue: dict[str, dict[str, int]] = {}
    if has_queue:  # keep only the moves that let a queued task start
        actions, not_needed, serves, end = _keep_needed(
            model, actions, policy, goal_priority, waiting
        )
        start, end_shapes = _by_shape(_served(model, waiting)), _by_shape(end)
        queue = {
            s.name: {
                "waiting": n,
                "could_start_before": start[s],
                "could_start_after": end_shapes[s],
            }
            for s, n in sorted(waiting_shapes.items(), key=lambda kv: kv[0].name)
        }
    node_model = model.nodes.gpu_model
    for i, a in enumerate(actions):
        assert a.src is not None
        source = str(node_model[model.node_index(a.src.node)])
        k = len(a.src.gpus)
        if has_queue:
            tail = _serves_text(source, k, a.src.node, serves[a.alloc])
        else:
            tail = (
                f"frees {k} {source} on {a.src.node}, a model at least "
                f"{settings.scarce_ratio:.0%} allocated with no queue"
            )
        actions[i] = replace(a, reason=f"{a.reason}; {tail}")
    before, after, benefit = outcome(model, actions, shapes_with(sorted(waiting_shapes, key=str)))
    moved = {a.alloc for a in actions}
    freed: Counter[str] = Counter()
    for a in actions:
        assert a.src is not None
        freed[str(node_model[model.node_index(a.src.node)])] += len(a.src.gpus)
    extra = {
        "freed_gpus": dict(freed),
        "models": {
            m: {k: (round(v, 3) if math.isfinite(v) else None) for k, v in r.items()}
            for m, r in table.items()
        },
        "scarce": sorted(scarce),
        "idle": sorted(idle),
        "throughput": dict(THROUGHPUT),
        "jobs": [
            {**{k: v for k, v in c.items() if k != "row"}, "moved": c["alloc"] in moved}
            for c in found
            if c["gpu_model"] in scarce
        ],
        "dropped_by_replay": sorted(dropped),
        "not_needed": sorted(not_needed),
        "queue": queue,
    }
    note = ""
    no_history = history_s(model, settings.window_s) <= 0 and settings.min_samples > 1
    if not actions and scarce and idle and no_history:
        note = (
            f"the source has no usage history, so how light the jobs on {', '.join(sorted(scarce))}"
            f" are is unknown; {HISTORY_HINT}"
        )
    elif not actions and not scarce:
        rule = (
            "queued demand beyond its free GPUs"
            if has_queue
            else f"at least {settings.scarce_ratio:.0%} allocated, with no queue"
        )
        note = f"no GPU model is scarce ({rule}): {_models_text(table, has_queue)}"
    elif not actions and not idle:
        note = (
            f"{', '.join(sorted(scarce))} scarce, but no GPU model idles to take its light jobs "
            f"(free GPUs and no shortfall): {_models_text(table, has_queue)}"
        )
    elif not actions and not_needed:
        shapes = ", ".join(f"{n} x {s.name}" for s, n in sorted(waiting_shapes.items(), key=str))
        names = sorted(not_needed)
        listed = ", ".join(names[:5]) + (f", ... ({len(names)} in all)" if len(names) > 5 else "")
        note = (
            f"moving the light jobs that fit an idle model ({listed}) would let no more queued "
            "tasks of their priority or above start: the GPUs they would free make no room "
            f"the queue can use ({shapes} waiting)"
        )
    elif not actions:
        note = _no_fit_text(found, scarce, idle, settings)
    return Plan(goal, True, tuple(actions), before, after, note, "rebalance", benefit, extra)


def _models_text(table: dict[str, dict[str, float]], has_queue: bool) -> str:
    """Per GPU model, the numbers that make it scarce or idle."""
    parts = []
    for name, row in table.items():
        text = f"{name or '(unknown model)'} {row['allocated']:g} of {row['usable']:g} allocated"
        text += f", {row['free']:g} free"
        if has_queue:
            text += f", {row['demand']:g} GPUs queued for it"
        parts.append(text)
    return "; ".join(parts)


def _no_fit_text(
    found: list[dict[str, Any]], scarce: set[str], idle: set[str], settings: RebalanceSettings
) -> str:
    """Why no job of a scarce model moves to an idle one: how many jobs there are, and why the
    closest to moving does not."""
    jobs = [c for c in found if c["gpu_model"] in scarce]
    targets = [(c, t, e) for c in jobs for t, e in c["targets"].items() if t in idle]
    reasons = Counter(e["why_not"] for _, _, e in targets if e["why_not"])
    slow = [(e["slowdown"], c["alloc"], t) for c, t, e in targets if e["slowdown"] is not None]
    closest = ""
    if slow:
        factor, alloc, target = min(slow)
        closest = (
            f"; the lightest, {alloc}, would run {factor:.2f}x slower on {target} (at most "
            f"{settings.max_slowdown:g}x allowed)"
        )
    counted = ", ".join(f"{n} {why}" for why, n in reasons.most_common(4))
    return (
        f"no light job on a scarce model ({', '.join(sorted(scarce))}) fits an idle model "
        f"({', '.join(sorted(idle))}): of {len(jobs)} job(s) there, per target: {counted or '-'}"
        f"{closest}"
    )


def _plan_moves(model, policy, settings, table, scarce, idle, found, dropped) -> list[Action]:
    free = model.gpu_is_free.copy()
    need = {m: table[m]["to_free"] for m in scarce}
    options = []
    for c in found:
        if c["gpu_model"] not in scarce or c["alloc"] in dropped:
            continue
        for target, est in c["targets"].items():
            if target in idle and est["eligible"]:
                options.append((est["slowdown"], c["num_gpu"], c["alloc"], target, c))
    options.sort(key=lambda o: (o[0], o[1], o[2], -throughput(o[3]) if throughput(o[3]) else 0))
    done: set[str] = set()
    actions = []
    node_model = model.nodes.gpu_model
    islands = island_size_per_node(model) if policy.island_locality else np.zeros(len(node_model))
    for factor, k, alloc, target, c in options:
        queue = table[c["gpu_model"]]["queue_priority"]
        if queue > -math.inf and c["priority"] > queue:
            continue  # never move work for a queue of lower priority
        if alloc in done or need[c["gpu_model"]] <= 0:
            continue
        slot = None
        for node in np.flatnonzero(node_model == target).tolist():
            slot = _free_slots(model, free, node, k, int(islands[node]))
            if slot is not None:
                break
        if slot is None:
            continue
        free[slot] = False
        done.add(alloc)
        need[c["gpu_model"]] -= k
        dst_node = str(model.nodes.name[model.gpus.node[slot[0]]])
        reason = (
            f"{alloc} used p95 {c['util_p95']:.0%} of {k} {c['gpu_model']}; at relative "
            f"throughput {throughput(c['gpu_model']):g} vs {throughput(target):g} it needs "
            f"{c['util_p95'] * throughput(c['gpu_model']) / throughput(target):.0%} of a {target}: "
            f"estimated slowdown {factor:.2f}x" + crossing_note(model, slot)
        )
        actions.append(
            Action(
                "rebalance",
                alloc=alloc,
                job=c["job"],
                tenant=c["tenant"],
                src=GpuSet(c["node"], tuple(c["gpus"])),
                dst=GpuSet(dst_node, tuple(int(model.gpus.index[r]) for r in slot)),
                reason=reason,
                cost=move_cost(model, c["row"], policy.default_restart_s),
            )
        )
    return actions
