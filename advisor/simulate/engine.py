"""The discrete-event replay: arrivals, departures, a queue, and a controller that may act.

Events sit in one heap, in time order; at one instant departures come first, then hold
releases, arrivals and the controller's ticks. The node state is the placement replay's
`ClusterState` (numpy per node, every change through `allocate` / `release`, so nothing can
oversubscribe), and the scheduling pass after an event only retries the waiting shapes that
could fit where room appeared (`queue.WaitQueue.candidates`).

Scheduling (`backfill`): jobs wait in priority order, then submission order. `kubernetes`
tries every waiting job in that order and starts each one that fits (kube-scheduler's queue:
a pod that does not fit does not block the others, and there is no reservation for it);
`slurm` is EASY backfill: the first job that cannot start gets a reservation at the earliest
time its GPUs are expected to be free (from the running jobs' known end times, as Slurm plans
on time limits), and a later job may start before it only if it ends by then or leaves the
reserved nodes alone. Multi-node jobs are gangs: all their tasks start at once, on distinct
nodes, or none does. There is no preemption.

A migrated task's job loses its restart time: it ends that much later, and the restart time
on the job's GPUs is booked as `restart_gpu_hours`. GPUs held for a job (reservations) are
fenced by a placeholder allocation on the same state, so the scheduler cannot hand them out,
and their time is booked as `held_gpu_hours`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from advisor.placement.base import Policy
from advisor.placement.state import MILLI, ClusterState, PlacementError, PodSpec, select_node
from advisor.simulate.jobs import JobTable
from advisor.simulate.queue import WaitQueue

DAY = 86400.0
BIG_GPUS = 8  # a "big" job asks for at least this many GPUs (tasks x GPUs per task)
DEPART, RELEASE, ARRIVE, TICK = 0, 1, 2, 3
NOT_ARRIVED, WAITING, RUNNING, DONE, NEVER = 0, 1, 2, 3, 4
BACKFILL_MODES = ("kubernetes",)
HOLD = PodSpec(cpu_milli=0, memory_mib=0, num_gpu=1, gpu_milli=MILLI, name="hold")

Placement = list[tuple[int, list[int]]]  # (node, GPU ids) per task


class Controller(Protocol):
    """What acts on the cluster every `every_s`: a defragmenter or the advisor's operator."""

    name: str
    every_s: float

    def tick(self, sim: Simulation, now: float) -> None: ...


@dataclass
class Reservation:
    """GPUs held (or to hold as they free) for one waiting job, one entry per task's node."""

    job: int
    targets: dict[int, list[int]]  # node -> GPU ids
    release_at: float
    held: set[tuple[int, int]] = field(default_factory=set)

    @property
    def wanted(self) -> int:
        return sum(len(g) for g in self.targets.values())


def _pairs(targets: dict[int, list[int]]) -> set[tuple[int, int]]:
    """(node, GPU) of each GPU a reservation's `targets` name."""
    return {(n, g) for n, gs in targets.items() for g in gs}


class MoveBudget:
    """At most `fraction` x tasks placed during the current simulated day may be moved that day
    (a task placed that day: running at the day's start or started since)."""

    def __init__(self, fraction: float, origin: float) -> None:
        self.fraction = fraction
        self.origin = origin
        self.day = -1
        self.placed = 0
        self.moved = 0

    def roll(self, now: float, running_tasks: int) -> None:
        day = int((now - self.origin) // DAY)
        if day != self.day:
            self.day, self.placed, self.moved = day, running_tasks, 0

    def started(self, now: float, tasks: int, running_tasks: int) -> None:
        self.roll(now, running_tasks - tasks)
        self.placed += tasks

    def allowance(self, now: float, running_tasks: int) -> int:
        self.roll(now, running_tasks)
        return max(0, int(self.fraction * self.placed) - self.moved)


class Simulation:
    """One replay of `jobs` on `state` with `policy`, a queue and an optional controller."""

    def __init__(
        self,
        jobs: JobTable,
        state: ClusterState,
        policy: Policy,
        rank: np.ndarray,
        rng: np.random.Generator,
        *,
        backfill: str = "kubernetes",
        controller: Controller | None = None,
        migration_budget: float = 0.01,
        default_restart_s: float = 300.0,
        racks: np.ndarray | None = None,
        pools: np.ndarray | None = None,
    ) -> None:
        if backfill not in BACKFILL_MODES:
            raise ValueError(f"backfill must be one of {', '.join(BACKFILL_MODES)}")
        self.jobs = jobs
        self.state = state
        # a gang's tasks share one rack where racks are known ("" or None: anywhere)
        known = racks is not None and all(str(r) for r in racks)
        self.rack = (
            np.unique(np.asarray(racks, dtype=str), return_inverse=True)[1] if known else None
        )
        self.rack_names = [str(r) for r in racks] if known and racks is not None else None
        self.pool_names = None if pools is None else [str(p) for p in pools]
        self.policy = policy
        self.rank = rank
        self.backfill = backfill
        self.controller = controller
        n = len(jobs)
        self.status = np.full(n, NOT_ARRIVED, dtype=np.int8)
        self.start = np.full(n, np.nan)
        self.end = np.full(n, np.nan)
        self.version = np.zeros(n, dtype=np.int64)
        self.placement: list[Placement | None] = [None] * n
        self.restart_s = np.where(np.isnan(jobs.restart_s), default_restart_s, jobs.restart_s)
        self.specs = [
            PodSpec(
                cpu_milli=int(jobs.cpu_milli[j]),
                memory_mib=int(jobs.memory_mib[j]),
                num_gpu=int(jobs.num_gpu[j]),
                gpu_milli=int(jobs.gpu_milli[j]),
                gpu_spec=str(jobs.gpu_spec[j]),
                name=str(jobs.name[j]),
            )
            for j in range(n)
        ]
        self.node_jobs: list[set[int]] = [set() for _ in range(len(state))]
        self.node_index = {str(name): i for i, name in enumerate(state.names.tolist())}
        self.queue = WaitQueue(jobs, state)
        self.reservations: dict[int, Reservation] = {}
        # nodes a reservation holds are cordoned: no other job starts or moves there
        self.fence = np.full(len(state), -1, dtype=np.int64)
        self.awaiting_hold: dict[tuple[int, int], int] = {}  # (node, GPU) -> job to hold it for
        self.events: list[tuple[float, int, int, int, int]] = []
        self._seq = 0
        self.now = float(jobs.submit_s.min()) if n else 0.0
        self.origin = self.now
        self.budget = MoveBudget(migration_budget, self.origin)
        # accounting
        self.running_tasks = 0
        self.alloc_milli = 0
        self.held_gpus = 0
        self._last = self.now
        self.alloc_area = 0.0  # milli-GPU x seconds
        self.held_area = 0.0  # GPU x seconds
        self.moves: list[float] = []  # time of each moved task
        self.restart_gpu_s = 0.0
        self.reclaimed = 0
        # bumped by every change a controller could see (arrivals, starts, ends, moves, holds):
        # a controller may skip a tick on which it is unchanged since its last one
        self.changes = 0
        self.timeline: list[tuple[float, float, float, float]] = []  # t, alloc, held, waiting
        # seconds big jobs waited, by why they could not start (`_why_big_jobs_wait`)
        self.big_wait_s = {"capacity": 0.0, "fragmentation": 0.0}
        self.big = jobs.size_gpus >= BIG_GPUS  # per job: asks for `BIG_GPUS` or more
        self._big_queue: set[int] = set()  # big jobs waiting now
        self._big_waiting = (0, 0)  # why they wait (capacity, fragmentation), taken at `_why_at`
        self._why_at = -math.inf
        self.last_start = self.now
        self._freed: set[int] = set()
        self.capacity_milli = state.gpu_capacity_milli
        for j in np.argsort(jobs.submit_s, kind="stable").tolist():
            self._push(float(jobs.submit_s[j]), ARRIVE, j)
        self.never_fits = self._never_fits()
        self.unstarted = int((~self.never_fits).sum())

    # ------------------------------------------------------------------ events and time
    def _push(self, at: float, kind: int, job: int, version: int = 0) -> None:
        heapq.heappush(self.events, (at, kind, self._seq, job, version))
        self._seq += 1

    def _advance(self, to: float) -> None:
        dt = to - self._last
        if dt > 0:
            self.alloc_area += self.alloc_milli * dt
            self.held_area += self.held_gpus * dt
            self.big_wait_s["capacity"] += self._big_waiting[0] * dt
            self.big_wait_s["fragmentation"] += self._big_waiting[1] * dt
            self._last = to
        self.now = to

    def run(self) -> None:
        """Process every event; stops once every job has started (or can never start) and the
        controller has nothing left to wait for."""
        if self.controller is not None and len(self.jobs):
            self._push(self.origin + self.controller.every_s, TICK, -1)
        while self.events and (self.unstarted or self.reservations):
            at, kind, _, job, version = heapq.heappop(self.events)
            self._advance(at)
            if kind == DEPART:
                if version != self.version[job] or self.status[job] != RUNNING:
                    continue
                self._finish(job)
            elif kind == ARRIVE:
                if self.status[job] == NEVER:
                    continue
                self.status[job] = WAITING
                if self.big[job]:
                    self._big_queue.add(job)
                self.changes += 1
                self._observe(job)
                if self.queue.has_peers(job) or not self._try_start(job):
                    self.queue.push(job)
            elif kind == RELEASE:
                res = self.reservations.get(job)
                if res is not None and res.release_at <= at and self.status[job] == WAITING:
                    self.release_reservation(job)
            elif kind == TICK and self.controller is not None:
                self.controller.tick(self, at)
                self._push(at + self.controller.every_s, TICK, -1)
            self.schedule()
            if len(self._big_queue) != sum(self._big_waiting) or at - self._why_at >= 60.0:
                self._big_waiting = self._why_big_jobs_wait()
                self._why_at = at
            if not self.timeline or at - self.timeline[-1][0] >= 60.0:
                self._record(at)
        self._record(self.now)

    def _record(self, at: float) -> None:
        self.timeline.append(
            (at, self.alloc_milli / MILLI, float(self.held_gpus), self.queue.waiting_gpus)
        )

    def _why_big_jobs_wait(self) -> tuple[int, int]:
        """(capacity, fragmentation): waiting big jobs for which the whole free GPUs of the
        models they allow are too few in all (no move could start them: only ends can), and
        those for which they are enough but not in the job's shape (nodes, CPU or memory):
        what moves could address. Taken when a big job arrives or starts, else at most once a
        simulated minute, and counted until it is taken again."""
        if not self._big_queue:
            return (0, 0)
        whole_free = (self.state.gpu_free == MILLI).sum(axis=1)
        free_of: dict[str, int] = {}
        capacity = 0
        for job in self._big_queue:
            spec = self.specs[job].gpu_spec
            if spec not in free_of:
                free_of[spec] = int(whole_free[self.state.access(spec)].sum())
            capacity += free_of[spec] < int(self.jobs.size_gpus[job])
        return (capacity, len(self._big_queue) - capacity)

    def _never_fits(self) -> np.ndarray:
        """Jobs no node of the empty cluster could ever host: marked and left out of waits."""
        s = self.state
        out = np.zeros(len(self.jobs), dtype=bool)
        seen: dict[tuple, bool] = {}
        for j, spec in enumerate(self.specs):
            key = (spec, int(self.jobs.num_nodes[j]))
            if key not in seen:
                ok = (s.cpu_cap >= spec.cpu_milli) & (s.mem_cap >= spec.memory_mib)
                if spec.num_gpu:
                    ok &= s.access(spec.gpu_spec) & (s.n_gpu >= spec.num_gpu)
                seen[key] = int(ok.sum()) < key[1]
            out[j] = seen[key]
        self.status[out] = NEVER
        return out

    def _observe(self, job: int) -> None:
        for _ in range(int(self.jobs.num_nodes[job])):
            self.policy.observe(self.specs[job])

    # ------------------------------------------------------------------ placing
    def choose(
        self, spec: PodSpec, exclude: Sequence[int] = (), within: np.ndarray | None = None
    ) -> tuple[int, list[int]] | None:
        """The node and GPUs the scheduler's policy picks for one task (nothing allocated);
        `within`: only among these nodes."""
        cand = self.state.feasible(spec, within)
        cand = cand[self.fence[cand] < 0]
        if len(exclude):
            cand = cand[~np.isin(cand, exclude)]
        if cand.size == 0:
            return None
        node = select_node(cand, self.policy.score(spec, cand), self.rank)
        return node, self.policy.gpus(spec, node)

    def _place_gang(
        self, job: int, avoid: set[int] | None = None, among: np.ndarray | None = None
    ) -> Placement | None:
        """Place every task of `job` on distinct nodes, all or nothing (allocated on success).
        `among`: the only nodes where a single-task job can fit now (where room appeared)."""
        spec, k = self.specs[job], int(self.jobs.num_nodes[job])
        cand = self.state.feasible(spec, among if k == 1 else None)
        cand = cand[(self.fence[cand] < 0) | (self.fence[cand] == job)]
        if avoid:
            cand = cand[~np.isin(cand, list(avoid))]
        if cand.size < k:
            return None
        if k == 1:
            node = select_node(cand, self.policy.score(spec, cand), self.rank)
            gpus = self.policy.gpus(spec, node)
            self.state.allocate(node, gpus, spec)
            return [(node, gpus)]
        if self.rack is not None:
            counts = np.bincount(self.rack[cand], minlength=int(self.rack.max()) + 1)
            cand = cand[counts[self.rack[cand]] >= k]
            if cand.size == 0:
                return None
        done: Placement = []
        for _ in range(k):
            pick = self.choose(spec, [n for n, _ in done] + list(avoid or ()), within=cand)
            if pick is None:  # cannot happen with k distinct feasible nodes; kept safe
                for node, gpus in done:
                    self.state.release(node, gpus, spec)
                return None
            self.state.allocate(pick[0], pick[1], spec)
            done.append(pick)
            if self.rack is not None:
                cand = cand[self.rack[cand] == self.rack[pick[0]]]
        return done

    def _try_start(self, job: int, among: np.ndarray | None = None) -> bool:
        placement = self._place_gang(job, among=among)
        if placement is None:
            return False
        self._begin(job, placement)
        return True

    def _begin(self, job: int, placement: Placement) -> None:
        """Book a job whose tasks were just allocated on `placement`."""
        if job in self.reservations:
            self.release_reservation(job)
        self.changes += 1
        self.status[job] = RUNNING
        self._big_queue.discard(job)
        self.placement[job] = placement
        for node, _ in placement:
            self.node_jobs[node].add(job)
        if np.isnan(self.start[job]):
            self.unstarted -= 1
        self.start[job] = self.now
        self.end[job] = self.now + float(self.jobs.duration_s[job])
        self.version[job] += 1
        self._push(float(self.end[job]), DEPART, job, int(self.version[job]))
        tasks = len(placement)
        self.running_tasks += tasks
        self.budget.started(self.now, tasks, self.running_tasks)
        self.alloc_milli += tasks * self.specs[job].total_gpu_milli
        self.last_start = self.now

    def _finish(self, job: int) -> None:
        self.changes += 1
        placement = self.placement[job] or []
        spec = self.specs[job]
        for node, gpus in placement:
            self.state.release(node, gpus, spec)
            self.node_jobs[node].discard(job)
            self._freed.add(node)
            self._claim_holds(node, gpus)
        self.status[job] = DONE
        self.end[job] = self.now
        self.running_tasks -= len(placement)
        self.alloc_milli -= len(placement) * spec.total_gpu_milli
        self.placement[job] = None

    def schedule(self) -> None:
        """Start waiting jobs that fit where room appeared since the last pass (after every
        event; a controller may also call it between its own steps, at the same instant, to
        act on the cluster the scheduler leaves)."""
        self._start_ready_reservations()
        freed, self._freed = self._freed, set()
        if not freed or not len(self.queue):
            return
        among = np.fromiter(sorted(freed), dtype=np.int64)
        among = among[self.fence[among] < 0]
        groups = self.queue.candidates(among)
        heap = [(self.queue.heaps[g][0], g) for g in groups]
        heapq.heapify(heap)
        while heap:
            _, group = heapq.heappop(heap)
            job = self.queue.head(group)
            if job is None:
                continue
            if self._try_start(job, among):
                self.queue.pop(group)
                nxt = self.queue.head(group)
                if nxt is not None:
                    heapq.heappush(heap, (self.queue.heaps[group][0], group))
        self._start_ready_reservations()

    # ------------------------------------------------------------------ controller actions
    def running_jobs(self) -> list[int]:
        return np.flatnonzero(self.status == RUNNING).tolist()

    def allowance(self) -> int:
        """Moves the budget still allows today."""
        return self.budget.allowance(self.now, self.running_tasks)

    def move(self, moves: Sequence[tuple[int, int, int, list[int]]]) -> bool:
        """Move tasks, all or nothing: (job, task index, to node, to GPUs) each. Each moved
        job restarts once (its end moves by its restart time, booked on its GPUs)."""
        if len(moves) > self.allowance():
            return False
        done: list[tuple[int, int, int, list[int]]] = []
        try:
            for job, task, node, gpus in moves:
                placement = self.placement[job]
                if placement is None or self.status[job] != RUNNING:
                    raise PlacementError(f"job {job} is not running")
                old_node, old_gpus = placement[task]
                spec = self.specs[job]
                if self.fence[node] >= 0:
                    raise PlacementError(f"node {node} is held for a reservation")
                self.state.release(old_node, old_gpus, spec)
                try:
                    self.state.allocate(node, list(gpus), spec)
                except PlacementError:
                    self.state.allocate(old_node, old_gpus, spec)
                    raise
                placement[task] = (node, list(gpus))
                done.append((job, task, old_node, old_gpus))
        except PlacementError:
            for job, task, old_node, old_gpus in reversed(done):
                placement = self.placement[job]
                assert placement is not None
                node, gpus = placement[task]
                spec = self.specs[job]
                self.state.release(node, gpus, spec)
                self.state.allocate(old_node, old_gpus, spec)
                placement[task] = (old_node, old_gpus)
            return False
        for job in {m[0] for m in moves}:
            placement = self.placement[job] or []
            self._reindex(job, [d[2] for d in done if d[0] == job])
            delay = float(self.restart_s[job])
            self.end[job] += delay
            self.version[job] += 1
            self._push(float(self.end[job]), DEPART, job, int(self.version[job]))
            self.restart_gpu_s += delay * len(placement) * self.specs[job].total_gpu_milli / MILLI
        for _, _, old_node, old_gpus in done:
            self._freed.add(old_node)
            self._claim_holds(old_node, old_gpus)
            self.moves.append(self.now)
        self.budget.moved += len(moves)
        self.changes += 1
        return True

    def _reindex(self, job: int, old_nodes: Sequence[int]) -> None:
        for node in old_nodes:
            self.node_jobs[node].discard(job)
        for node, _ in self.placement[job] or []:
            self.node_jobs[node].add(job)

    def evict_and_replace(self, job: int, exclude: Sequence[int]) -> bool:
        """Move every task of a running job elsewhere through the scheduler's policy (the
        defragmenters' eviction: the job is re-placed at once), all or nothing."""
        placement = self.placement[job]
        if placement is None or len(placement) > self.allowance():
            return False
        spec = self.specs[job]
        for node, gpus in placement:
            self.state.release(node, gpus, spec)
        targets: Placement = []
        avoid = set(exclude) | {n for n, _ in placement}
        for _ in placement:
            pick = self.choose(spec, list(avoid | {n for n, _ in targets}))
            if pick is None:
                break
            self.state.allocate(pick[0], pick[1], spec)
            targets.append(pick)
        for node, gpus in targets:
            self.state.release(node, gpus, spec)
        for node, gpus in placement:
            self.state.allocate(node, gpus, spec)
        if len(targets) < len(placement):
            return False
        return self.move([(job, t, n, g) for t, (n, g) in enumerate(targets)])

    def reclaim(self, job: int) -> None:
        """End a running job now (an idle allocation taken back)."""
        if self.status[job] == RUNNING:
            self._finish(job)
            self.reclaimed += 1

    # ------------------------------------------------------------------ reservations
    def held_for_another(self, job: int, nodes: Iterable[int]) -> bool:
        """Whether another job's reservation holds one of `nodes` (none can be held for `job`)."""
        return any(self.fence[n] >= 0 and self.fence[n] != job for n in nodes)

    def reserve(self, job: int, targets: dict[int, list[int]], release_at: float) -> None:
        """Hold `targets` for waiting `job` (replacing its previous reservation): GPUs free now
        are fenced now, the others as soon as their tasks end; released at `release_at` if the
        job has not started by then."""
        if self.status[job] != WAITING or self.held_for_another(job, targets):
            return
        old = self.reservations.get(job)
        keep = _pairs(targets)
        if old is not None:
            self._drop_holds(old, keep)
        if old is None or old.targets != targets:  # a renewal that only moves the release
            self.changes += 1  # time changes nothing a controller sees
        res = Reservation(job, targets, release_at, held=set() if old is None else old.held)
        self.reservations[job] = res
        self.fence[list(targets)] = job
        for node, gpus in targets.items():
            for gpu in gpus:
                if (node, gpu) in res.held:
                    continue
                if self.state.gpu_free[node, gpu] == MILLI:
                    self._hold(res, node, gpu)
                else:
                    self.awaiting_hold[(node, gpu)] = job
        self._push(release_at, RELEASE, job)

    def _hold(self, res: Reservation, node: int, gpu: int) -> None:
        self.changes += 1
        self.state.allocate(node, [gpu], HOLD)
        res.held.add((node, gpu))
        self.held_gpus += 1
        self.awaiting_hold.pop((node, gpu), None)

    def _drop_holds(self, res: Reservation, keep: set[tuple[int, int]]) -> None:
        if not (res.held | _pairs(res.targets)) - keep:
            return  # nothing held or promised outside `keep`
        self.changes += 1
        kept_nodes = {n for n, _ in keep}
        for node in np.flatnonzero(self.fence == res.job).tolist():
            if node not in kept_nodes:
                self.fence[node] = -1
                self._freed.add(node)
        for node, gpu in list(res.held):
            if (node, gpu) not in keep:
                self.state.release(node, [gpu], HOLD)
                res.held.discard((node, gpu))
                self.held_gpus -= 1
                self._freed.add(node)
        for key, owner in list(self.awaiting_hold.items()):
            if owner == res.job and key not in keep:
                del self.awaiting_hold[key]

    def release_reservation(self, job: int) -> None:
        res = self.reservations.pop(job, None)
        if res is not None:
            self._drop_holds(res, set())

    def _claim_holds(self, node: int, gpus: Sequence[int]) -> None:
        """GPUs that just freed and are promised to a reservation are fenced at once."""
        for gpu in gpus:
            owner = self.awaiting_hold.get((node, gpu))
            if owner is not None and self.state.gpu_free[node, gpu] == MILLI:
                res = self.reservations.get(owner)
                if res is None:
                    del self.awaiting_hold[(node, gpu)]
                else:
                    self._hold(res, node, gpu)

    def _start_ready_reservations(self) -> None:
        """A job whose reserved GPUs are all held starts there (if CPU and memory allow)."""
        for job, res in list(self.reservations.items()):
            if len(res.held) < res.wanted or self.status[job] != WAITING:
                continue
            spec = self.specs[job]
            nodes = sorted(res.targets)
            if len(nodes) != int(self.jobs.num_nodes[job]):
                continue
            if any(
                self.state.cpu_free[n] < spec.cpu_milli or self.state.mem_free[n] < spec.memory_mib
                for n in nodes
            ):
                continue
            del self.reservations[job]
            self.fence[self.fence == job] = -1
            for node, gpu in res.held:
                self.state.release(node, [gpu], HOLD)
                self.held_gpus -= 1
            placement: Placement = []
            for node in nodes:
                gpus = res.targets[node][: spec.num_gpu]
                self.state.allocate(node, gpus, spec)
                placement.append((node, list(gpus)))
            self.queue.remove(job)
            self._begin(job, placement)

    # ------------------------------------------------------------------ results
    def waits(self) -> np.ndarray:
        """Seconds each job waited (NaN: it never started)."""
        return self.start - self.jobs.submit_s

    @property
    def span_s(self) -> float:
        return max(self.last_start, float(self.jobs.submit_s.max())) - self.origin

    def task_days(self) -> float:
        """Tasks placed per simulated day, summed over days (a task counts on each day it ran
        on), up to the last start."""
        stop = self.origin + self.span_s
        started = ~np.isnan(self.start)
        a = (self.start[started] - self.origin) // DAY
        end = np.where(np.isnan(self.end[started]), stop, np.minimum(self.end[started], stop))
        b = np.maximum((end - self.origin) // DAY, a)
        return float(((b - a + 1) * self.jobs.num_nodes[started]).sum())

    def alloc_ratio(self) -> float:
        span = self.span_s
        if span <= 0:
            return math.nan
        return self.alloc_area / (self.capacity_milli * span)
