"""The established defragmenters, as replay controllers (the advisor off): baselines for it.

- `HighNodeUtilization` — kubernetes-sigs/descheduler's strategy of that name, run every
  `every_s`: a node whose requested GPUs are below `threshold_pct` of its GPUs (the policy
  `thresholds: {nvidia.com/gpu: 20}`) is underutilized, and its pods are evicted, emptiest node
  first, each only if it fits another node (the descheduler's `nodeFit`); the scheduler places
  each again at once, so with MostAllocated scoring they land on fuller nodes and whole nodes
  open up. Pods of multi-node jobs are left alone (evicting one member would stop the gang).
- `ConsolidateWhenBlocked` — the NVIDIA KAI-scheduler's Consolidate action: for a waiting job
  that fits nowhere, find a node (nodes, for a gang) where moving some running pods away makes
  room, re-place every evicted pod through the scheduler first (a dry run), and commit the moves
  only if every one of them found a home; the job then starts there. A gang's nodes share one
  rack where racks are known, as the replay's scheduler places gangs (KAI's required topology
  constraint): the racks are tried in order of their cheapest node, and the first whose moves
  fit the day's budget is taken.

Both move only migratable single-task jobs, count each moved task against the same daily
migration budget as the advisor, and cost each moved job its restart time.
"""

from __future__ import annotations

import numpy as np

from advisor.placement.state import MILLI, PlacementError, PodSpec
from advisor.simulate.engine import RUNNING, Simulation

MAX_TARGETS = 16  # candidate nodes tried per blocked job, fewest GPUs to move first
MAX_BLOCKED = 8  # blocked jobs tried per tick, in queue order


class HighNodeUtilization:
    """The descheduler's HighNodeUtilization (module docstring)."""

    name = "descheduler"

    def __init__(self, every_s: float, threshold_pct: float = 20.0) -> None:
        self.every_s = every_s
        self.threshold = threshold_pct / 100.0
        self.evicted = 0

    def tick(self, sim: Simulation, now: float) -> None:
        s = sim.state
        capacity = s.n_gpu * MILLI
        used = capacity - s.gpu_free.sum(axis=1)
        ratio = np.where(capacity > 0, used / np.maximum(capacity, 1), 1.0)
        under = np.flatnonzero((used > 0) & (ratio < self.threshold))
        for node in under[np.lexsort((sim.rank[under], ratio[under]))].tolist():
            for job in sorted(sim.node_jobs[node]):
                if sim.allowance() <= 0:
                    return
                if _movable(sim, job) and sim.evict_and_replace(job, [node]):
                    self.evicted += 1


class ConsolidateWhenBlocked:
    """KAI-scheduler-style consolidation for jobs that cannot start (module docstring)."""

    name = "consolidate"

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self.started = 0

    def tick(self, sim: Simulation, now: float) -> None:
        for job in sim.queue.jobs_waiting()[:MAX_BLOCKED]:
            if sim.allowance() <= 0:
                return
            moves = self._dry_run(sim, job)
            if moves is None:
                continue
            plan, targets = moves
            if len(plan) <= sim.allowance() and sim.move(plan):
                sim.reserve(job, targets, now + self.every_s)  # all free: it starts at once
                self.started += 1

    def _dry_run(
        self, sim: Simulation, job: int
    ) -> tuple[list[tuple[int, int, int, list[int]]], dict[int, list[int]]] | None:
        """Moves that make room for every task of `job` and the GPUs it then takes, found on
        the live state and undone before returning (None: no room within the budget)."""
        spec, k = sim.specs[job], int(sim.jobs.num_nodes[job])
        undo: list[tuple[str, int, list[int], PodSpec]] = []
        try:
            for within in _rack_order(sim, spec, k):
                mark = len(undo)
                moves: list[tuple[int, int, int, list[int]]] = []
                targets: dict[int, list[int]] = {}
                for _ in range(k):
                    found = self._one_node(sim, spec, set(targets), undo, moves, within)
                    if found is None:
                        break
                    node, gpus = found
                    targets[node] = gpus
                if len(targets) == k and len(moves) <= sim.allowance():
                    return moves, targets
                # this rack cannot hold the gang, or not within the budget: try the next
                _undo(sim, undo[mark:])
                del undo[mark:]
            return None
        finally:
            _undo(sim, undo)

    def _one_node(
        self,
        sim: Simulation,
        spec: PodSpec,
        taken: set[int],
        undo: list[tuple[str, int, list[int], PodSpec]],
        moves: list[tuple[int, int, int, list[int]]],
        within: np.ndarray | None = None,
    ) -> tuple[int, list[int]] | None:
        nodes = _eligible(sim, spec, within)
        nodes = nodes[~np.isin(nodes, list(taken))]
        if nodes.size == 0:
            return None
        order = np.lexsort((sim.rank[nodes], _moving(sim, spec, nodes)))
        for node in nodes[order[:MAX_TARGETS]].tolist():
            found = self._clear(sim, spec, node, taken, undo, moves)
            if found is not None:
                return node, found
        return None

    def _clear(
        self,
        sim: Simulation,
        spec: PodSpec,
        node: int,
        taken: set[int],
        undo: list[tuple[str, int, list[int], PodSpec]],
        moves: list[tuple[int, int, int, list[int]]],
    ) -> list[int] | None:
        """Evict what blocks `spec` on `node`, re-place it elsewhere, take the room: the GPUs
        taken (all steps logged in `undo`), or None with nothing changed."""
        s = sim.state
        mark, mark_moves = len(undo), len(moves)
        free = s.gpu_free[node]
        gpus = np.argsort(-free[: int(s.n_gpu[node])], kind="stable")[: spec.num_gpu].tolist()
        on_gpus = {
            other: {g for n, gs in sim.placement[other] or [] if n == node for g in gs}
            for other in sorted(sim.node_jobs[node])
        }
        victims = [other for other, on in on_gpus.items() if on & set(gpus)]
        if not all(_movable(sim, other) for other in victims):
            return None
        cpu = int(s.cpu_free[node]) + sum(sim.specs[v].cpu_milli for v in victims)
        mem = int(s.mem_free[node]) + sum(sim.specs[v].memory_mib for v in victims)
        for other in sorted(on_gpus, key=lambda o: sim.specs[o].total_gpu_milli):
            if cpu >= spec.cpu_milli and mem >= spec.memory_mib:
                break
            if other not in victims and _movable(sim, other):
                victims.append(other)
                cpu += sim.specs[other].cpu_milli
                mem += sim.specs[other].memory_mib
        try:
            for other in victims:
                for n, gs in sim.placement[other] or []:
                    s.release(n, gs, sim.specs[other])
                    undo.append(("free", n, gs, sim.specs[other]))
            if spec.num_gpu and any(s.gpu_free[node, g] < spec.gpu_milli for g in gpus):
                raise PlacementError("room did not open")
            s.allocate(node, gpus, spec)
            undo.append(("alloc", node, gpus, spec))
            for other in victims:
                pick = sim.choose(sim.specs[other], [node, *taken])
                if pick is None:
                    raise PlacementError("an evicted pod found no home")
                s.allocate(pick[0], pick[1], sim.specs[other])
                undo.append(("alloc", pick[0], pick[1], sim.specs[other]))
                moves.append((other, 0, pick[0], pick[1]))
        except PlacementError:
            _undo(sim, undo[mark:])
            del undo[mark:]
            del moves[mark_moves:]
            return None
        return gpus


def _eligible(sim: Simulation, spec: PodSpec, within: np.ndarray | None = None) -> np.ndarray:
    """Nodes that could ever hold one task of `spec` (capacity and GPU model; `within`: only
    these nodes)."""
    s = sim.state
    ok = (s.cpu_cap >= spec.cpu_milli) & (s.mem_cap >= spec.memory_mib)
    if spec.num_gpu:
        ok &= s.access(spec.gpu_spec) & (s.n_gpu >= spec.num_gpu)
    nodes = np.flatnonzero(ok)
    return nodes if within is None else nodes[np.isin(nodes, within)]


def _moving(sim: Simulation, spec: PodSpec, nodes: np.ndarray) -> np.ndarray:
    """GPU share to move per node for one task of `spec`: its GPUs filled from the emptiest."""
    s = sim.state
    need = max(spec.num_gpu, 0)
    if not need or nodes.size == 0:
        return np.zeros(len(nodes))
    busy = np.sort(MILLI - s.gpu_free[nodes], axis=1)
    busy = np.where(np.arange(busy.shape[1])[None, :] < s.n_gpu[nodes][:, None], busy, MILLI)
    busy = np.sort(busy, axis=1)
    return busy[:, :need].sum(axis=1) if spec.gpu_milli == MILLI else busy[:, 0]


def _rack_order(sim: Simulation, spec: PodSpec, k: int) -> list[np.ndarray | None]:
    """Where a job of `k` tasks may go: anywhere (one task, or racks unknown), else each rack
    with `k` eligible nodes, the rack of the cheapest node to clear first."""
    if k == 1 or sim.rack is None:
        return [None]
    nodes = _eligible(sim, spec)
    racks = sim.rack[nodes]
    cost = _moving(sim, spec, nodes)
    counts = np.bincount(racks, minlength=int(sim.rack.max()) + 1)
    best: dict[int, float] = {}
    for rack, c in zip(racks.tolist(), cost.tolist(), strict=True):
        if counts[rack] >= k:
            best[rack] = min(best.get(rack, np.inf), c)
    return [np.flatnonzero(sim.rack == r) for r in sorted(best, key=lambda r: (best[r], r))]


def _undo(sim: Simulation, steps: list[tuple[str, int, list[int], PodSpec]]) -> None:
    """Roll back dry-run steps, last first."""
    for kind, node, gpus, pod in reversed(steps):
        if kind == "alloc":
            sim.state.release(node, gpus, pod)
        else:
            sim.state.allocate(node, gpus, pod)


def _movable(sim: Simulation, job: int) -> bool:
    return (
        sim.status[job] == RUNNING
        and bool(sim.jobs.migratable[job])
        and int(sim.jobs.num_nodes[job]) == 1
    )
