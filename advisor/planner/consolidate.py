"""Consolidation plans: which tasks to migrate, where to, and in what order, to reach a goal.

Goals (`parse_goal`): `job=KxG` (K tasks of G GPUs, one per node, all in one rack and one GPU
model when K > 1; `job=G` one task on one node, inside one NVLink island when it fits in one),
`free-nodes=K` (K whole nodes empty), `forecast=6h` (room for the forecast demand: a list of
job shapes, planned one after another, each kept by a reservation).

The heuristic (`plan_heuristic`) scores each candidate node by the cheapest set of tasks whose
eviction clears the GPUs the goal needs there, takes candidates (or, for multi-node jobs, racks)
in order of that cost, and re-places the evicted tasks best-fit onto capacity that is free now
and outside every cleared window. Where a task finds no home, a second search may make one by
a chain: relocate the cheapest small tasks off one node first, then move the task into the GPUs
they left (`make_room`); `order_moves` puts every move after the moves it waits for. The
cheaper of the two searches wins. Every plan ends with `reserve` actions holding the cleared
GPUs for the goal job and is replayed by `check_plan` before it is returned; a plan that fails
the replay is never returned.

`Instance` holds the per-task and per-GPU tables both the heuristic and the exact solver use.
"""

from __future__ import annotations

import heapq
import math
import re
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from advisor.fragmentation import measures
from advisor.fragmentation.measures import DEFAULT_SHAPES, Shape, parse_shape
from advisor.fragmentation.nvlink import crossing_note
from advisor.model import MILLI, RESERVATION_QOS, UNKNOWN_ISLAND, ClusterModel, spec_allows
from advisor.planner.actions import Action, Benefit, Cost, CostWeights, GpuSet, Plan, move_cost
from advisor.planner.check import apply_plan, check_plan
from advisor.planner.constraints import (
    ANY_MODEL,
    Policy,
    island_size_per_node,
    needs_one_island,
    usage_by_scope,
)
from advisor.planner.unknown_racks import rack_unknown_reason

GOAL_JOB = "goal"
CHAIN_ALWAYS_NODES = 2000  # up to this size the chained search always runs (it is cheap there)

# --------------------------------------------------------------------------- goals


GOAL_KINDS = ("job", "free-nodes", "forecast")  # what parse_goal reads


@dataclass(frozen=True)
class Goal:
    """What the plan must make possible. `priority` None = the highest priority in the model."""

    text: str
    kind: str  # job | free-nodes | forecast
    shape: Shape | None = None
    nodes: int = 0
    horizon_s: float = 0.0
    priority: int | None = None
    tenant: str = ""


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_goal(text: str, *, priority: int | None = None, tenant: str = "") -> Goal:
    """`job=8x8`, `job=4`, `job=4@A100`, `free-nodes=8`, `forecast=6h`; ValueError otherwise."""
    key, sep, value = text.strip().partition("=")
    key, value = key.strip(), value.strip()
    if not sep or not value:
        raise ValueError(f"bad goal {text!r}: expected job=8x8, job=4, free-nodes=8 or forecast=6h")
    if key == "job":
        shape = parse_shape(value)
        if shape.gpu_milli < MILLI:
            raise ValueError(f"bad goal {text!r}: a goal job takes whole GPUs")
        return Goal(text, "job", shape=shape, priority=priority, tenant=tenant)
    if key == "free-nodes":
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"bad goal {text!r}: free-nodes needs a whole number >= 1")
        return Goal(text, "free-nodes", nodes=int(value), priority=priority, tenant=tenant)
    if key == "forecast":
        match = _DURATION.match(value)
        if not match:
            raise ValueError(f"bad goal {text!r}: forecast needs a horizon like 6h or 90m")
        seconds = float(match.group(1)) * _UNIT[match.group(2)]
        return Goal(text, "forecast", horizon_s=seconds, priority=priority, tenant=tenant)
    raise ValueError(f"bad goal {text!r}: unknown goal {key!r} ({', '.join(GOAL_KINDS)})")


# --------------------------------------------------------------------------- instance

NO_UNIT = int(np.iinfo(np.int64).max)  # "no island unit fits" in the best-fit keys


@dataclass
class Instance:
    """Per-task and per-GPU tables of one planning problem (built once, read-only after)."""

    model: ClusterModel
    policy: Policy
    goal_priority: int
    weights: CostWeights
    task_rows: np.ndarray  # allocation rows of placed GPU tasks
    task_gpus: list[np.ndarray]  # GPU rows per task (aligned with task_rows)
    task_milli: np.ndarray  # per-GPU share (max over its GPUs)
    task_whole: np.ndarray  # bool: every share is 1000
    task_movable: np.ndarray  # bool
    task_cost: list[Cost]
    task_score: np.ndarray  # float: cost.score(weights)
    task_rack_lock: list[str]  # rack a task must stay in ("" = none)
    gpu_tasks: list[list[int]]  # task indices holding each GPU
    unit_of_gpu: np.ndarray  # int: island id on its node, 0 when the node's islands are unknown
    island_size: np.ndarray  # (N) largest island, 0 unknown
    free: np.ndarray  # (G) free milli now (0 on unusable)
    usable: np.ndarray  # (G) bool
    cpu_free: np.ndarray  # (N) CPU milli a moved task may use (NaN unknown)
    mem_free: np.ndarray  # (N) memory MiB likewise

    @property
    def nodes(self) -> int:
        return len(self.model.nodes)

    def node_gpus(self, node: int) -> np.ndarray:
        offset = self.model.nodes.gpu_offset
        return np.arange(offset[node], offset[node + 1])

    def node_units(self, node: int) -> list[np.ndarray]:
        """The node's GPU rows per island unit (cached: `make_room` asks for every node of
        every window it tries)."""
        cache = self.__dict__.setdefault("_units", {})
        if node not in cache:
            gpus = self.node_gpus(node)
            units = self.unit_of_gpu[gpus]
            cache[node] = [gpus[units == u] for u in np.unique(units)]
        return cache[node]

    def holders(self) -> tuple[np.ndarray, np.ndarray]:
        """Per GPU: the summed score of the tasks holding it, and whether all of them are
        movable (cached; the tables are read-only after the build)."""
        if "_holders" not in self.__dict__:
            score = np.array([sum(self.task_score[h] for h in hs) for hs in self.gpu_tasks])
            movable = np.array([all(self.task_movable[h] for h in hs) for hs in self.gpu_tasks])
            self.__dict__["_holders"] = (score.astype(np.float64), movable.astype(bool))
        return self.__dict__["_holders"]


def resolve_priority(model: ClusterModel, priority: int | None) -> int:
    allocs = model.allocations
    if priority is not None:
        return int(priority)
    return int(allocs.priority.max()) if len(allocs) else 0


def build_instance(
    model: ClusterModel,
    policy: Policy | None = None,
    goal_priority: int | None = None,
    weights: CostWeights | None = None,
) -> Instance:
    policy = policy or Policy()
    weights = weights or CostWeights()
    priority = resolve_priority(model, goal_priority)
    allocs, places = model.allocations, model.placements
    order = np.argsort(places.alloc, kind="stable")
    bounds = np.searchsorted(places.alloc[order], np.arange(len(allocs) + 1))
    counts = np.diff(bounds)
    task_rows = np.flatnonzero((allocs.node >= 0) & (counts > 0))
    task_gpus = [places.gpu[order[bounds[r] : bounds[r + 1]]].astype(np.int64) for r in task_rows]
    milli_of = [places.milli[order[bounds[r] : bounds[r + 1]]] for r in task_rows]
    task_milli = np.array([int(m.max()) for m in milli_of], dtype=np.int64)
    task_whole = np.array([bool(np.all(m == MILLI)) for m in milli_of], dtype=bool)
    # A fractional task on several GPUs (MIG slices of different sizes) is left where it is.
    simple = task_whole | (np.array([len(g) for g in task_gpus]) == 1)
    movable = (
        allocs.migratable[task_rows]
        & (allocs.priority[task_rows] <= priority)
        & simple
        & (allocs.qos[task_rows] != RESERVATION_QOS)
    )
    costs = [move_cost(model, int(r), policy.default_restart_s) for r in task_rows]
    scores = np.array([c.score(weights) for c in costs], dtype=np.float64)
    rack_lock = _rack_locks(model, task_rows) if policy.rack_locality else [""] * len(task_rows)
    gpu_tasks: list[list[int]] = [[] for _ in range(len(model.gpus))]
    for t, gpus in enumerate(task_gpus):
        for g in gpus.tolist():
            gpu_tasks[g].append(t)
    island = model.gpus.nvlink_island
    island_size = island_size_per_node(model)
    known = island_size[model.gpus.node] > 0
    unit = np.where(known & (island != UNKNOWN_ISLAND), island, 0).astype(np.int64)
    if len(unit):
        unit = unit - np.minimum(unit.min(), 0)
    return Instance(
        model=model,
        policy=policy,
        goal_priority=priority,
        weights=weights,
        task_rows=task_rows,
        task_gpus=task_gpus,
        task_milli=task_milli,
        task_whole=task_whole,
        task_movable=movable,
        task_cost=costs,
        task_score=scores,
        task_rack_lock=rack_lock,
        gpu_tasks=gpu_tasks,
        unit_of_gpu=unit,
        island_size=island_size,
        free=model.gpu_free_milli.astype(np.int64).copy(),
        usable=model.gpu_usable.copy(),
        cpu_free=model.node_cpu_free.copy(),
        mem_free=model.node_memory_free.copy(),
    )


def _rack_locks(model: ClusterModel, task_rows: np.ndarray) -> list[str]:
    """Tasks of multi-node jobs that sit in one known rack must stay in it."""
    allocs, rack = model.allocations, model.nodes.rack
    racks: dict[str, set[str]] = defaultdict(set)
    sizes: dict[str, int] = defaultdict(int)
    jobs = allocs.job[task_rows].tolist()
    nodes = allocs.node[task_rows].tolist()
    for job, node in zip(jobs, nodes, strict=True):
        racks[job].add(str(rack[node]))
        sizes[job] += 1
    out = []
    for job in jobs:
        one = racks[job]
        out.append(next(iter(one)) if sizes[job] > 1 and len(one) == 1 and "" not in one else "")
    return out


def target_nodes_mask(inst: Instance, t: int) -> np.ndarray:
    """bool (N): nodes task `t` may move to (GPU model, spec, rack lock, schedulable)."""
    model = inst.model
    row = int(inst.task_rows[t])
    nodes = model.nodes
    spec = str(model.allocations.gpu_spec[row])
    here = str(nodes.gpu_model[model.allocations.node[row]])
    models = nodes.gpu_model
    if inst.policy.allow_model_change:
        ok = np.array([spec_allows(spec, str(m)) for m in models.tolist()], dtype=bool)
    else:
        ok = (models == here) & spec_allows(spec, here)
    if inst.task_rack_lock[t]:
        ok &= nodes.rack == inst.task_rack_lock[t]
    return ok & nodes.schedulable


# --------------------------------------------------------------------------- windows


@dataclass(frozen=True)
class Window:
    """GPUs to clear on one node for one goal task, and the tasks whose eviction clears them."""

    node: int
    gpus: tuple[int, ...]  # GPU rows
    evict: frozenset[int]  # task indices
    score: float


def window_sets(
    inst: Instance, node: int, need: int, whole_node: bool, blocked: np.ndarray | None = None
) -> list[np.ndarray]:
    """GPU-row sets one goal task may use on `node`: the whole node, or per NVLink island
    when the task fits in one (island locality); `blocked` GPUs are taken already."""
    gpus = inst.node_gpus(node)
    taken = np.zeros(len(gpus), dtype=bool) if blocked is None else blocked[gpus]
    if whole_node:
        ok = bool(inst.usable[gpus].all()) and not taken.any()
        return [gpus] if ok and len(gpus) >= need else []
    gpus = gpus[inst.usable[gpus] & ~taken]
    size = int(inst.island_size[node])
    if inst.policy.island_locality and needs_one_island(need, size):
        units = inst.unit_of_gpu[gpus]
        return [gpus[units == u] for u in np.unique(units) if (units == u).sum() >= need]
    return [gpus] if len(gpus) >= need else []


def best_window(
    inst: Instance, node: int, need: int, whole_node: bool, blocked: np.ndarray | None = None
) -> Window | None:
    """Cheapest eviction set clearing `need` GPUs of one allowed set on `node` (greedy per set:
    clear the GPU with the lowest marginal cost per GPU cleared, then drop evictions that
    turned out unnecessary)."""
    best: Window | None = None
    for gpus in window_sets(inst, node, need, whole_node, blocked):
        window = _clear(inst, node, gpus, need if not whole_node else len(gpus))
        if window is not None and (best is None or window.score < best.score):
            best = window
    return best


def _clear(inst: Instance, node: int, gpus: np.ndarray, need: int) -> Window | None:
    blockers = {int(g): set(inst.gpu_tasks[g]) for g in gpus.tolist()}
    if any(not inst.task_movable[t] for b in blockers.values() for t in b):
        blockers = {
            g: b for g, b in blockers.items() if all(inst.task_movable[t] for t in b)
        }  # GPUs held by immovable work cannot be cleared
    if len(blockers) < need:
        return None
    chosen: set[int] = set()

    def cleared(evicted: set[int]) -> list[int]:
        return [g for g, b in blockers.items() if b <= evicted]

    done = cleared(chosen)
    while len(done) < need:
        best_key, best_add = None, None
        for g, b in blockers.items():
            add = b - chosen
            if not add:
                continue
            gain = len(cleared(chosen | add)) - len(done)
            key = (sum(inst.task_score[t] for t in add) / max(gain, 1), -gain, g)
            if best_key is None or key < best_key:
                best_key, best_add = key, add
        if best_add is None:
            return None
        chosen |= best_add
        done = cleared(chosen)
    for t in sorted(chosen, key=lambda t: -inst.task_score[t]):
        if len(cleared(chosen - {t})) >= need:
            chosen.discard(t)
    done = cleared(chosen)
    # keep GPUs that are free now first, so fewer tasks' GPUs are held back
    done.sort(key=lambda g: (bool(blockers[g]), g))
    score = float(sum(inst.task_score[t] for t in chosen))
    return Window(node, tuple(done[:need]), frozenset(chosen), score)


# --------------------------------------------------------------------------- re-placing


class Receivers:
    """Capacity free now outside the cleared windows, consumed as evicted tasks land."""

    def __init__(self, inst: Instance, blocked: np.ndarray) -> None:
        self.inst = inst
        self.blocked = blocked
        self.free = np.where(blocked | ~inst.usable, 0, inst.free)
        model = inst.model
        self.cpu = inst.cpu_free.copy()
        self.mem = inst.mem_free.copy()
        self.node_of = model.gpus.node.astype(np.int64)
        self.units = int(inst.unit_of_gpu.max(initial=0)) + 1
        self.whole = np.zeros((inst.nodes, self.units), dtype=np.int64)
        is_whole = self.free == MILLI
        np.add.at(self.whole, (self.node_of[is_whole], inst.unit_of_gpu[is_whole]), 1)
        self._masks: dict[tuple, np.ndarray] = {}

    def _mask(self, t: int) -> np.ndarray:
        inst = self.inst
        row = int(inst.task_rows[t])
        allocs = inst.model.allocations
        key = (
            str(allocs.gpu_spec[row]),
            str(inst.model.nodes.gpu_model[allocs.node[row]]),
            inst.task_rack_lock[t],
        )
        if key not in self._masks:
            self._masks[key] = target_nodes_mask(inst, t)
        return self._masks[key]

    def room(self, cpu: float, mem: float) -> np.ndarray:
        """bool (N): nodes with this much CPU and memory free (unknown = no limit; a request
        of 0 fits anywhere, as the checker sees it)."""
        return ((cpu <= 0) | ~(self.cpu < cpu)) & ((mem <= 0) | ~(self.mem < mem))

    def recount(self, node: int) -> None:
        """Recompute the whole-free-GPU counts of `node` after its free milli changed."""
        gpus = self.inst.node_gpus(node)
        self.whole[node] = 0
        is_whole = self.free[gpus] == MILLI
        np.add.at(self.whole[node], self.inst.unit_of_gpu[gpus][is_whole], 1)

    def place(self, t: int) -> np.ndarray | None:
        """GPU rows for task `t` (best fit), consumed; None if nothing fits."""
        inst = self.inst
        row = int(inst.task_rows[t])
        allocs = inst.model.allocations
        cpu = _known(allocs.cpu_milli[row])
        mem = _known(allocs.memory_mib[row])
        ok = self._mask(t) & self.room(cpu, mem)
        k = len(inst.task_gpus[t])
        if inst.task_whole[t]:
            local = inst.policy.island_locality & needs_one_island(k, inst.island_size)
            best_unit = np.where(self.whole >= k, self.whole, NO_UNIT).min(axis=1)
            total = self.whole.sum(axis=1)
            fits = ok & np.where(local, best_unit < NO_UNIT, total >= k)
            if not fits.any():
                return None
            key = np.where(local, best_unit, total).astype(np.float64)
            key[~fits] = np.inf
            node = int(np.argmin(key))
            gpus = inst.node_gpus(node)
            gpus = gpus[self.free[gpus] == MILLI]
            if local[node]:
                counts = self.whole[node]
                unit = int(np.argmin(np.where(counts >= k, counts, NO_UNIT)))
                gpus = gpus[inst.unit_of_gpu[gpus] == unit]
            chosen = gpus[:k]
        else:
            need = int(inst.task_milli[t])
            cand = (self.free >= need) & ok[self.node_of]
            if not cand.any():
                return None
            key = np.where(cand, self.free, MILLI + 1)
            chosen = np.array([int(np.argmin(key))])
            node = int(self.node_of[chosen[0]])
        share = int(inst.task_milli[t])
        for g in chosen.tolist():
            if self.free[g] == MILLI:
                self.whole[node, inst.unit_of_gpu[g]] -= 1
            self.free[g] -= share
        self.cpu[node] -= cpu
        self.mem[node] -= mem
        return chosen


def replace_tasks(
    inst: Instance, evict: Sequence[int], blocked: np.ndarray, repair: bool = True
) -> tuple[dict[int, np.ndarray], list[int], list[int]]:
    """Targets for evicted tasks (largest first) on capacity free now and not blocked, the
    tasks that found no home (the plan is only valid when that list is empty), and the tasks
    that found one only through a chain of relocations (`make_room`)."""
    receivers = Receivers(inst, blocked)
    order = sorted(
        evict, key=lambda t: (-len(inst.task_gpus[t]) * inst.task_milli[t], int(inst.task_rows[t]))
    )
    out: dict[int, np.ndarray] = {}
    failed: list[int] = []
    chained: list[int] = []
    fixed = set(evict)  # tasks that already move (or are being moved) are not relocated again
    for t in order:
        gpus = receivers.place(t)
        if gpus is None and repair and inst.task_whole[t]:
            repaired = make_room(receivers, t, fixed)
            if repaired is not None:
                gpus, relocated = repaired
                out.update(relocated)
                fixed |= set(relocated)
                chained.append(t)
        if gpus is None:
            failed.append(t)
        else:
            out[t] = gpus
    return out, failed, chained


def make_room(
    receivers: Receivers, t: int, fixed: set[int], tries: int = 24
) -> tuple[np.ndarray, dict[int, np.ndarray]] | None:
    """A home for whole task `t` made by relocating a few small tasks first (a chain: they
    move out, then `t` moves into the GPUs they left; `order_moves` puts them in that order).
    Nodes are tried by how few GPUs are missing and how cheap the tasks holding them are."""
    inst = receivers.inst
    k = len(inst.task_gpus[t])
    row = int(inst.task_rows[t])
    allocs = inst.model.allocations
    ok = receivers._mask(t) & receivers.room(
        _known(allocs.cpu_milli[row]), _known(allocs.memory_mib[row])
    )
    local_nodes = inst.policy.island_locality & needs_one_island(k, inst.island_size)
    have = np.where(local_nodes, receivers.whole.max(axis=1), receivers.whole.sum(axis=1))
    sizes = inst.model.nodes.gpu_count
    near = np.flatnonzero(ok & (have < k) & (sizes >= k))
    near = near[np.argsort(k - have[near], kind="stable")][:256]  # fewest GPUs missing first
    candidates = []
    held_score, held_movable = inst.holders()
    for node in near.tolist():
        local = bool(local_nodes[node])
        for group in inst.node_units(node) if local else [inst.node_gpus(node)]:
            free = group[receivers.free[group] == MILLI]
            missing = k - len(free)
            if missing <= 0 or len(group) < k:
                continue
            # GPUs that can be cleared: unchanged since the start, held only by movable tasks
            # that nobody moves yet
            clearable = []
            for g in group.tolist():
                holders = inst.gpu_tasks[g]
                changed = receivers.free[g] != inst.free[g]
                if receivers.blocked[g] or receivers.free[g] == MILLI or changed or not holders:
                    continue
                if held_movable[g] and fixed.isdisjoint(holders):
                    clearable.append((held_score[g], g))
            if len(clearable) < missing:
                continue
            clearable.sort()
            take = [g for _, g in clearable[:missing]]
            movers = sorted({h for g in take for h in inst.gpu_tasks[g]})
            cost = sum(inst.task_score[h] for h in movers)
            candidates.append((missing, cost, node, take, movers))
    candidates.sort(key=lambda c: (c[1], c[0], c[2]))
    for _, _, node, _take, movers in candidates[:tries]:
        saved = (
            receivers.free.copy(),
            receivers.whole.copy(),
            receivers.cpu.copy(),
            receivers.mem.copy(),
        )
        here = inst.node_gpus(node)
        receivers.free[here] = 0  # relocated tasks go elsewhere, not back onto this node
        receivers.recount(node)
        relocated: dict[int, np.ndarray] = {}
        for h in movers:
            gpus = receivers.place(h)
            if gpus is None:
                break
            relocated[h] = gpus
        if len(relocated) == len(movers):
            receivers.free[here] = saved[0][here]
            for h in movers:
                hrow = int(inst.task_rows[h])
                left = inst.task_gpus[h]
                left = left[inst.usable[left] & ~receivers.blocked[left]]
                receivers.free[left] += int(inst.task_milli[h])
                receivers.cpu[node] += _known(allocs.cpu_milli[hrow])
                receivers.mem[node] += _known(allocs.memory_mib[hrow])
            receivers.recount(node)
            gpus = receivers.place(t)
            if gpus is not None:
                return gpus, relocated
        receivers.free, receivers.whole, receivers.cpu, receivers.mem = saved
    return None


def _known(value: float) -> float:
    """A request as a number, unknown (NaN) as 0: `float(np.nan_to_num(x))` for one value,
    without its array machinery (it ran tens of thousands of times per plan)."""
    v = float(value)
    if math.isnan(v):
        return 0.0
    if math.isinf(v):
        return math.copysign(np.finfo(np.float64).max, v)
    return v


# --------------------------------------------------------------------------- plans


def move_actions(inst: Instance, targets: Mapping[int, np.ndarray], why: str) -> list[Action]:
    """Migrate actions for task -> GPU rows, in a valid order: each target must be free at its
    step (moves onto capacity another move vacates wait for it; see `order_moves`)."""
    model = inst.model
    nodes, gpus, allocs = model.nodes, model.gpus, model.allocations
    actions = []
    for t, dst in targets.items():
        row = int(inst.task_rows[t])
        src = inst.task_gpus[t]
        share = int(inst.task_milli[t])
        src_node = str(nodes.name[gpus.node[src[0]]])
        dst_node = str(nodes.name[gpus.node[dst[0]]])
        actions.append(
            Action(
                "migrate",
                alloc=str(allocs.id[row]),
                job=str(allocs.job[row]),
                tenant=str(allocs.tenant[row]),
                src=GpuSet(src_node, tuple(int(i) for i in gpus.index[src]), share),
                dst=GpuSet(dst_node, tuple(sorted(int(i) for i in gpus.index[dst])), share),
                reason=f"frees {src_node} GPUs {','.join(str(i) for i in gpus.index[src])} {why}"
                + crossing_note(model, dst),
                cost=inst.task_cost[t],
            )
        )
    return annotate_steps(model, order_moves(model, actions))


def annotate_steps(model: ClusterModel, actions: list[Action]) -> list[Action]:
    """Add to each move's reason what it does to free whole GPUs on the two nodes it touches,
    replayed in order (the per-step "fragmentation before -> after")."""
    free = model.gpu_free_milli.astype(np.int64).copy()
    node_of = model.gpus.node
    out = []
    for a in actions:
        if a.src is None or a.dst is None:
            out.append(a)
            continue
        src_node, dst_node = model.node_index(a.src.node), model.node_index(a.dst.node)
        src = [model.gpu_row(src_node, i) for i in a.src.gpus]
        dst = [model.gpu_row(dst_node, i) for i in a.dst.gpus]

        def state(node: int) -> str:
            rows = np.flatnonzero(node_of == node)
            is_free = free[rows] == MILLI
            islands = model.gpus.nvlink_island[rows]
            text = str(int(is_free.sum()))
            if (islands >= 0).all() and len(set(islands.tolist())) > 1:
                best = max(int((is_free & (islands == i)).sum()) for i in set(islands.tolist()))
                text += f" (island {best})"
            return text

        before = (state(src_node), state(dst_node))
        free[src] += a.src.milli
        free[dst] -= a.dst.milli
        after = (state(src_node), state(dst_node))
        note = f"free GPUs {a.src.node}: {before[0]} -> {after[0]}"
        if dst_node != src_node:
            note += f", {a.dst.node}: {before[1]} -> {after[1]}"
        out.append(replace(a, reason=f"{a.reason}; {note}"))
    return out


def order_moves(model: ClusterModel, actions: list[Action]) -> list[Action]:
    """Order moves so each one's target has room when it runs (GPU share, and the CPU and
    memory it requests on another node): repeatedly run the first move that fits at that
    point. Moves in a cycle (each waiting for another) are left at the end in their given
    order, where the checker reports them."""
    free = model.gpu_free_milli.astype(np.int64).copy()
    cpu_free = model.node_cpu_free.copy()
    mem_free = model.node_memory_free.copy()
    allocs = model.allocations
    row_of = {str(a): i for i, a in enumerate(allocs.id.tolist())}
    pending = list(actions)
    done: list[Action] = []
    info = {}
    for a in pending:
        src_node, dst_node = model.node_index(a.src.node), model.node_index(a.dst.node)
        row = row_of.get(a.alloc)
        need = (
            (0.0, 0.0)
            if row is None
            else (
                _known(allocs.cpu_milli[row]),
                _known(allocs.memory_mib[row]),
            )
        )
        info[id(a)] = (
            src_node,
            dst_node,
            [model.gpu_row(src_node, i) for i in a.src.gpus],
            [model.gpu_row(dst_node, i) for i in a.dst.gpus],
            need,
        )

    def fits(left: float, need: float) -> bool:
        return need <= 0 or not left < need - 1e-9  # NaN capacity: no limit

    progress = True
    while pending and progress:
        progress = False
        for i, a in enumerate(pending):
            src_node, dst_node, src, dst, (cpu, mem) = info[id(a)]
            after = free.copy()
            after[src] += a.src.milli
            if not np.all(after[dst] >= a.dst.milli):
                continue
            if dst_node != src_node and not (
                fits(cpu_free[dst_node], cpu) and fits(mem_free[dst_node], mem)
            ):
                continue
            after[dst] -= a.dst.milli
            free = after
            if dst_node != src_node:
                cpu_free[src_node] += cpu
                mem_free[src_node] += mem
                cpu_free[dst_node] -= cpu
                mem_free[dst_node] -= mem
            done.append(pending.pop(i))
            progress = True
            break
    return done + pending


def reserve_actions(
    inst: Instance, windows: Sequence[Window], goal: Goal, job: str
) -> list[Action]:
    model = inst.model
    actions = []
    for i, window in enumerate(windows, start=1):
        node = str(model.nodes.name[window.node])
        indices = tuple(sorted(int(x) for x in model.gpus.index[list(window.gpus)]))
        actions.append(
            Action(
                "reserve",
                alloc=f"{job}-{i}",
                job=job,
                tenant=goal.tenant,
                dst=GpuSet(node, indices),
                priority=inst.goal_priority,
                rack_local=len(windows) > 1 and goal.kind == "job",
                reason=f"holds {node} GPUs {','.join(map(str, indices))} for {goal.text}"
                + crossing_note(model, list(window.gpus)),
            )
        )
    return actions


@dataclass(frozen=True)
class Need:
    """One goal job as the planner sees it: `tasks` windows of `gpus` GPUs (whole nodes when
    `whole_node`), within one rack group when `same_rack`, on nodes allowed by `spec`."""

    tasks: int
    gpus: int
    whole_node: bool
    same_rack: bool
    spec: str = ""
    cpu_milli: float = 0.0  # per goal task: its node must have this much CPU free after the moves
    memory_mib: float = 0.0

    @property
    def keeps_node(self) -> bool:
        """Whether no evicted task may land back on a cleared node: the goal takes the whole
        node, or the CPU and memory its eviction freed for the goal task."""
        return self.whole_node or self.cpu_milli > 0 or self.memory_mib > 0


def needs_of(goal: Goal) -> list[Need]:
    if goal.kind == "free-nodes":
        return [Need(goal.nodes, 1, True, False)]
    if goal.kind == "job" and goal.shape is not None:
        shape = goal.shape
        return [
            Need(
                shape.tasks,
                shape.num_gpu,
                False,
                shape.tasks > 1,
                shape.gpu_spec,
                shape.cpu_milli,
                shape.memory_mib,
            )
        ]
    raise ValueError(f"goal {goal.text!r} has no fixed shape")


def candidate_windows(inst: Instance, need: Need, blocked: np.ndarray) -> list[Window]:
    """Best window per allowed node, cheapest first (`blocked` GPUs are never used); a goal
    task that asks for CPU or memory also needs that much free on the node once the window's
    tasks (and, if that is not enough, more of the node's movable GPU tasks) are gone."""
    model = inst.model
    ok = model.nodes.schedulable & measures._spec_mask(model, need.spec)
    ok &= model.nodes.gpu_count >= need.gpus
    ok &= ~(model.nodes.cpu_milli < need.cpu_milli) & ~(model.nodes.memory_mib < need.memory_mib)
    out = []
    for node in np.flatnonzero(ok).tolist():
        window = best_window(inst, node, need.gpus, need.whole_node, blocked)
        if window is not None and (need.cpu_milli > 0 or need.memory_mib > 0):
            window = _with_room(inst, window, need, blocked)
        if window is not None:
            out.append(window)
    out.sort(key=lambda w: (w.score, w.node))
    return out


def _with_room(
    inst: Instance, window: Window, need: Need, blocked: np.ndarray | None
) -> Window | None:
    """`window` with the further evictions (cheapest movable GPU tasks of its node first) that
    leave the goal task's CPU and memory free there; None when no such set exists. A capacity
    the source does not know is no constraint."""
    allocs = inst.model.allocations
    rows = inst.task_rows
    cpu = float(inst.cpu_free[window.node])
    mem = float(inst.mem_free[window.node])
    for t in window.evict:
        cpu += _known(allocs.cpu_milli[rows[t]])
        mem += _known(allocs.memory_mib[rows[t]])

    def short() -> bool:
        return bool(cpu < need.cpu_milli - 1e-9 or mem < need.memory_mib - 1e-9)

    if not short():  # NaN (unknown) compares false: enough
        return window
    evict = set(window.evict)
    others = {
        t
        for g in inst.node_gpus(window.node).tolist()
        for t in inst.gpu_tasks[g]
        if t not in evict and inst.task_movable[t]
    }
    if blocked is not None:
        others = {t for t in others if not blocked[inst.task_gpus[t]].any()}
    for t in sorted(others, key=lambda t: (inst.task_score[t], t)):
        evict.add(t)
        cpu += _known(allocs.cpu_milli[rows[t]])
        mem += _known(allocs.memory_mib[rows[t]])
        if not short():
            score = float(sum(inst.task_score[x] for x in evict))
            return Window(window.node, window.gpus, frozenset(evict), score)
    return None


def _rack_group(model: ClusterModel) -> np.ndarray:
    return measures._rack_groups(model)


def heuristic_windows(
    inst: Instance, need: Need, blocked: np.ndarray, max_tries: int = 64, pools_tried: int = 8
) -> tuple[list[Window], dict[int, np.ndarray]] | None:
    """The cheaper of the searches without and with chained relocations (`_search`); on large
    clusters the chained search only runs when the plain one finds nothing."""
    windows = candidate_windows(inst, need, blocked)
    found = [_search(inst, need, blocked, windows, max_tries, pools_tried, False)]
    if found[0] is None or inst.nodes <= CHAIN_ALWAYS_NODES:
        found.append(_search(inst, need, blocked, windows, max_tries, pools_tried, True))
    done = [f for f in found if f is not None]
    return min(done, key=lambda f: f[0])[1:] if done else None


def _search(
    inst: Instance,
    need: Need,
    blocked: np.ndarray,
    windows: list[Window],
    max_tries: int,
    pools_tried: int,
    repair: bool,
) -> tuple[float, list[Window], dict[int, np.ndarray]] | None:
    """Windows for `need` and homes for every evicted task, or None.

    Racks (pools) are tried in order of their cheapest windows. In a pool, a small best-first
    search over which windows to leave out: the K cheapest remaining windows are tried; when
    an evicted task finds no home (or only through a chain), the next candidates leave out
    either the window it came from or a chosen window that could have been its home. Candidates
    are taken by their window cost (a lower bound) once a first plan is found (until then the
    first option is followed), and none that cannot beat the best plan is tried; `max_tries`
    bounds the work (fewer tries after a first plan on large clusters), `pools_tried` the
    pools that succeed."""
    if need.same_rack:
        group = _rack_group(inst.model)
        by_group: dict[int, list[Window]] = defaultdict(list)
        for w in windows:
            by_group[int(group[w.node])].append(w)
        pools = [ws for ws in by_group.values() if len(ws) >= need.tasks]
        pools.sort(key=lambda ws: sum(w.score for w in ws[: need.tasks]))
    else:
        pools = [windows] if len(windows) >= need.tasks else []
    tries = 0
    best: tuple[float, list[Window], dict[int, np.ndarray]] | None = None
    successes = 0
    # improving on a first plan: plenty of tries on small clusters, a few on huge ones
    improve_tries = max(4, min(max_tries, 20_000 // max(inst.nodes, 1)))

    def pick(pool: list[Window], excluded: frozenset[int]) -> list[Window]:
        return [w for w in pool if w.node not in excluded][: need.tasks]

    for pool in pools:
        if successes >= pools_tried or tries >= max_tries:
            break
        if best is not None and sum(w.score for w in pool[: need.tasks]) >= best[0]:
            break  # pools are sorted: no later pool can beat the best found
        start: frozenset[int] = frozenset()
        heap = [(sum(w.score for w in pick(pool, start)), 0, start)]
        seen = {start}
        succeeded = False
        improve = 0  # tries spent after the first success, bounded by `improve_tries`
        while heap and tries < max_tries and improve < improve_tries:
            _, _, excluded = heapq.heappop(heap)
            bound = sum(w.score for w in pick(pool, excluded))
            if best is not None and bound >= best[0] - 1e-12:
                continue
            improve += best is not None
            picked = pick(pool, excluded)
            if len(picked) < need.tasks:
                continue
            tries += 1
            mask, evict = cleared_room(inst, need, picked, blocked)
            targets, failed, chained = replace_tasks(inst, evict, mask, repair)
            if not failed:
                succeeded = True
                actual = float(sum(inst.task_score[t] for t in targets))
                if best is None or actual < best[0]:
                    best = (actual, picked, targets)
                if not chained:
                    continue
                failed = chained  # chains cost extra moves: try windows that need none
            for i, option in enumerate(_exclusions(inst, picked, failed)):
                nxt = excluded | option
                if nxt not in seen:
                    seen.add(nxt)
                    chosen = pick(pool, nxt)
                    if len(chosen) == need.tasks:
                        # until a plan is found, follow the first option (leave out every
                        # window a homeless task came from) before anything else
                        first = best is None and i == 0
                        key = -math.inf if first else sum(w.score for w in chosen)
                        heapq.heappush(heap, (key, len(seen), nxt))
        successes += succeeded
    return best


def cleared_room(
    inst: Instance, need: Need, picked: Sequence[Window], blocked: np.ndarray
) -> tuple[np.ndarray, list[int]]:
    """(GPUs the goal's room takes, `blocked` ones included: no evicted task may land there;
    the tasks its windows evict, sorted)."""
    mask = blocked.copy()
    for w in picked:
        mask[list(w.gpus)] = True
        if need.keeps_node:
            mask[inst.node_gpus(w.node)] = True
    return mask, sorted(set().union(*(w.evict for w in picked)))


def _exclusions(inst: Instance, picked: list[Window], failed: list[int]) -> list[frozenset[int]]:
    """Windows to leave out next: the ones the homeless tasks came from (all, or one of them),
    or one chosen window that has room for a homeless task now (so it can be its home)."""
    owners = frozenset(w.node for w in picked for t in failed if t in w.evict)
    options = [owners] if owners else []
    if len(owners) > 1:
        options += [frozenset({node}) for node in sorted(owners)]
    for t in failed[:2]:
        k = len(inst.task_gpus[t])
        for w in picked:
            if t in w.evict:
                continue
            gpus = inst.node_gpus(w.node)
            room = gpus[inst.usable[gpus] & (inst.free[gpus] >= inst.task_milli[t])]
            if inst.task_whole[t]:
                room = room[inst.free[room] == MILLI]
                if inst.policy.island_locality and needs_one_island(
                    k, int(inst.island_size[w.node])
                ):
                    units = inst.unit_of_gpu[room]
                    fits = any((units == u).sum() >= k for u in np.unique(units))
                else:
                    fits = len(room) >= k
            else:
                fits = len(room) > 0
            if fits:
                options.append(frozenset({w.node}))
    return options


def plan_heuristic(
    model: ClusterModel,
    goal: Goal,
    policy: Policy | None = None,
    weights: CostWeights | None = None,
    demand: Sequence[Shape] | None = None,
) -> Plan:
    """The fast plan for `goal` (checked step by step before it is returned)."""
    started = time.perf_counter()
    inst = build_instance(model, policy, goal.priority, weights)
    try:
        needs = needs_for(goal, demand, policy)
    except ValueError as error:
        return _infeasible(model, goal, inst, str(error), "heuristic")
    over = over_quota(model, goal, policy)
    if over:
        plan = _infeasible(model, goal, inst, over, "heuristic")
        return replace(plan, extra={**plan.extra, "over_quota": True})
    blocked = np.zeros(len(model.gpus), dtype=bool)
    windows_all: list[list[Window]] = []
    targets_all: dict[int, np.ndarray] = {}
    for need in needs:
        found = heuristic_windows(inst, need, blocked)
        if found is None:
            from advisor.planner.why import why_not_cleared  # it reads this module's search

            why = f"no {need_text(need)} can be cleared: {why_not_cleared(inst, need, blocked)}"
            racks = rack_unknown_reason(model, [(n.tasks, n.spec) for n in needs], policy)
            if need.same_rack and racks:
                plan = _infeasible(model, goal, inst, f"{why} on known racks; {racks}", "heuristic")
                return replace(plan, extra={**plan.extra, "rack_unknown": True})
            return _infeasible(model, goal, inst, why, "heuristic")
        windows, targets = found
        windows_all.append(windows)
        for t, gpus in targets.items():
            targets_all[t] = gpus
            blocked[gpus] = True  # later jobs neither take nor evict what just moved in
        for w in windows:
            blocked[list(w.gpus)] = True
            if need.keeps_node:
                blocked[inst.node_gpus(w.node)] = True
        inst = _without(inst, targets)
    return finish(model, goal, inst, windows_all, targets_all, "heuristic", started, demand)


def _without(inst: Instance, moved: Mapping[int, np.ndarray]) -> Instance:
    """Tasks already moved for an earlier job are not moved again, and the CPU and memory
    they take on their new nodes is no longer free (what they leave is not counted back)."""
    if not moved:
        return inst
    movable = inst.task_movable.copy()
    movable[list(moved)] = False
    cpu, mem = inst.cpu_free.copy(), inst.mem_free.copy()
    allocs = inst.model.allocations
    node_of = inst.model.gpus.node
    for t, gpus in moved.items():
        row = int(inst.task_rows[t])
        node = int(node_of[gpus[0]])
        cpu[node] -= _known(allocs.cpu_milli[row])
        mem[node] -= _known(allocs.memory_mib[row])
    tables = {k: v for k, v in inst.__dict__.items() if not k.startswith("_")}  # no caches
    return Instance(**{**tables, "task_movable": movable, "cpu_free": cpu, "mem_free": mem})


def needs_for(
    goal: Goal, demand: Sequence[Shape] | None, policy: Policy | None = None
) -> list[Need]:
    """The goal's jobs; without rack locality (`rack_locality: false`) a multi-node job may
    take nodes of any racks."""
    needs = _needs_for(goal, demand)
    if policy is not None and not policy.rack_locality:
        needs = [replace(need, same_rack=False) for need in needs]
    return needs


def _needs_for(goal: Goal, demand: Sequence[Shape] | None) -> list[Need]:
    if goal.kind != "forecast":
        return needs_of(goal)
    if demand is None:
        raise ValueError(
            f"{goal.text} needs a forecast source: pass the forecast demand as job shapes "
            "(gpu-defrag plan --demand FILE)"
        )
    # an empty demand (no job forecast in the window) needs nothing: a plan without moves
    shapes = sorted(demand, key=lambda s: -s.gpus)
    return [Need(s.tasks, s.num_gpu, False, s.tasks > 1, s.gpu_spec) for s in shapes]


def need_text(need: Need) -> str:
    if need.whole_node:
        return f"set of {need.tasks} whole free nodes"
    where = " in one rack" if need.same_rack else ""
    return f"{need.tasks} x {need.gpus}-GPU job{where}"


# --------------------------------------------------------------------------- finishing


def summary(model: ClusterModel, shapes: Sequence[Shape]) -> dict:
    """Before/after measures: free GPUs, whole free nodes, jobs of each shape that fit, FGD."""
    free_whole = measures.free_whole_per_node(model)
    whole_nodes = int(((free_whole == model.nodes.gpu_count) & (model.nodes.gpu_count > 0)).sum())
    workload = measures.workload_of(model) or measures.default_workload()
    fragment = measures.fgd_node_fragment(model, workload)
    idle = float(model.gpu_free_milli.sum())
    groups = measures._rack_groups(model)
    return {
        "free_gpus": int(model.gpu_is_free.sum()),
        "free_nodes": whole_nodes,
        # None where no node's islands are known: unknown, not a group of one
        "largest_free_nvlink_group": measures.largest_fitting(model, groups).nvlink_group_gpus,
        "fgd_fragment_gpus": round(float(fragment.sum()) / MILLI, 3),
        "fgd_fragment_rate": round(float(fragment.sum()) / idle, 4) if idle else 0.0,
        "jobs_that_fit": {s.name: measures.jobs_that_fit(model, s, groups) for s in shapes},
    }


def _shapes_for(goal: Goal, demand: Sequence[Shape] | None) -> list[Shape]:
    shapes = list(DEFAULT_SHAPES)
    extra = [goal.shape] if goal.shape else list(demand or [])
    for shape in extra:
        if shape is not None and shape not in shapes:
            shapes.append(shape)
    return shapes


def over_quota(model: ClusterModel, goal: Goal, policy: Policy | None) -> str:
    """Why the goal's job cannot be within its tenant's quota whatever moves ("" if it can):
    moving work never lowers what the tenant holds, so what it holds plus the job must fit
    the quota over all models (the scope a job of any model counts against)."""
    if not goal.tenant or goal.shape is None or policy is None:
        return ""
    limit = policy.quotas.get((goal.tenant, ANY_MODEL))
    if limit is None:
        return ""
    held = usage_by_scope(model).get((goal.tenant, ANY_MODEL), 0.0)
    job = goal.shape.gpus
    if held + job <= limit + 1e-9:
        return ""
    return (
        f"tenant {goal.tenant!r} holds {held:g} GPUs; the job's {job:g} would make "
        f"{held + job:g}, above its quota of {limit:g} (no move lowers it; a loan may: "
        f"borrow={goal.tenant}:{job:g})"
    )


def _infeasible(model: ClusterModel, goal: Goal, inst: Instance, why: str, method: str) -> Plan:
    before = summary(model, _shapes_for(goal, None))
    return Plan(
        goal.text,
        False,
        (),
        before,
        before,
        why,
        method,
        extra={"goal_priority": inst.goal_priority},
    )


def finish(
    model: ClusterModel,
    goal: Goal,
    inst: Instance,
    windows: Sequence[Sequence[Window]],
    targets: Mapping[int, np.ndarray],
    method: str,
    started: float,
    demand: Sequence[Shape] | None = None,
    extra: dict | None = None,
) -> Plan:
    """Actions (moves in a valid order, then reservations), the step-by-step check, and the
    before/after measures; an infeasible Plan naming the broken step if the check fails."""
    moves = move_actions(inst, targets, f"for {goal.text}")
    reserves: list[Action] = []
    for i, group in enumerate(windows, start=1):
        job = GOAL_JOB if len(windows) == 1 else f"{GOAL_JOB}{i}"
        reserves += reserve_actions(inst, group, goal, job)
    actions = moves + reserves
    result = check_plan(model, actions, inst.policy, inst.goal_priority)
    info = {"goal_priority": inst.goal_priority, "elapsed_s": time.perf_counter() - started}
    info.update(extra or {})
    if not result.ok:
        plan = _infeasible(model, goal, inst, f"plan failed its check: {result.violation}", method)
        return Plan(**{**plan.__dict__, "extra": {**plan.extra, **info}})
    shapes = _shapes_for(goal, demand)
    before = summary(model, shapes)
    after = summary(apply_plan(model, moves), shapes)
    benefit = Benefit(
        before["jobs_that_fit"],
        after["jobs_that_fit"],
        {k: before[k] for k in ("free_nodes", "fgd_fragment_gpus", "fgd_fragment_rate")},
        {k: after[k] for k in ("free_nodes", "fgd_fragment_gpus", "fgd_fragment_rate")},
    )
    return Plan(
        goal.text,
        True,
        tuple(actions),
        before,
        after,
        "",
        method,
        benefit,
        {**info, "checked": True},
    )


def plan_cost_score(plan: Plan, weights: CostWeights | None = None) -> float:
    return plan.cost.score(weights) if plan.feasible else math.inf
