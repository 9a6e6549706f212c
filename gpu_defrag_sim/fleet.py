"""The simulated fleet's state and how it moves through time.

State lives in numpy arrays indexed by global GPU (and by job slot on that GPU) so a step over
1,000 nodes stays cheap. Job arrivals and departures are discrete events processed in time
order; energy, idle and power-cap counters integrate on a fixed grid of TICK simulated seconds
(power held from the previous grid point), so any way of stepping to the same time yields the
same state: `fleet_at(preset, seed, t)` is a pure function.
"""

from __future__ import annotations

import hashlib
import heapq
import math
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from exporter.readings import NodeReading
from gpu_defrag_sim.presets import FleetSpec, build_preset
from gpu_defrag_sim.render import render
from gpu_defrag_sim.workload import (
    CALIBRATION_HORIZON,
    DAY,
    HOUR,
    KIND_BY_NAME,
    SIM_EPOCH,
    JobRequest,
    activity,
    arrivals_in_hour,
    draw_job,
    hash01,
    mean_gpu_seconds,
)

SLOTS = 4  # jobs sharing one GPU at most (smallest fraction is 0.25)
TICK = 300.0  # grid for counters and for retrying pending jobs, simulated seconds
MAX_WAIT = 6 * HOUR  # a pending job gives up after this long
XID_PER_GPU_DAY = 0.002  # rare: about one XID per 500 GPU-days
XID_CODES = (13, 31, 43)  # application-level XIDs: the GPU stays healthy
ARRIVAL_LOG_MAX = 200_000  # arrivals kept for demand history (a bounded deque)


@dataclass(slots=True)
class SimJob:
    """A job the simulator placed (or is holding pending), as the advisor may want to see it."""

    id: int
    name: str
    kind: str
    pool: str
    gpus: float  # < 1: fraction of one GPU
    tenant: str
    namespace: str
    priority: int
    migratable: bool
    arrival: float
    start: float | None = None
    end: float | None = None
    placement: list[tuple[int, int]] = field(default_factory=list)  # (global gpu, slot)
    pods: dict[int, str] = field(default_factory=dict)  # node index -> pod name
    has_process: bool = True
    seed: int = 0


@dataclass(slots=True)
class MigSlot:
    """One MIG instance of the MIG node; `owner` is the inference pod holding it, if any."""

    gpu: int
    gpu_instance_id: int
    profile: str
    slices: int
    memory_bytes: float
    uuid: str
    owner: str = ""
    seed: int = 0
    util: float = 0.0


# The MIG node's partitions, one line per GPU: (profile, owned?) per instance.
_MIG_LAYOUT: tuple[tuple[tuple[str, bool], ...], ...] = (
    (("1g.10gb", True),) * 5 + (("1g.10gb", False),) * 2,
    (("2g.20gb", True), ("2g.20gb", True), ("2g.20gb", False), ("1g.10gb", True)),
    (("3g.40gb", True), ("3g.40gb", True)),
    (("4g.40gb", True), ("3g.40gb", False)),
    (("7g.80gb", True),),
    (("3g.40gb", True), ("2g.20gb", True), ("1g.10gb", False), ("1g.10gb", True)),
    (("1g.10gb", True),) * 3 + (("1g.10gb", False),) * 4,
    (("3g.40gb", False), ("3g.40gb", False)),
)


def _stable_uuid(*parts: object) -> uuid.UUID:
    return uuid.UUID(bytes=hashlib.blake2b(repr(parts).encode(), digest_size=16).digest())


class SimFleet:
    """A simulated cluster. `advance(seconds)` moves it on; `readings()` renders NodeReadings."""

    def __init__(self, preset: str = "a100-16x8", seed: int = 42, nodes: int | None = None):
        self.spec: FleetSpec = build_preset(preset, nodes)
        self.preset = preset
        self.seed = int(seed)
        self.now = 0.0
        specs = self.spec.nodes
        sizes = np.array([n.board.gpus for n in specs], dtype=np.int64)
        self.node_start = np.concatenate([[0], np.cumsum(sizes)])
        gpus = int(self.node_start[-1])
        self.gpu_count = gpus
        self.gpus_per_node = int(sizes.max())
        self.gpu_node = np.repeat(np.arange(len(specs)), sizes)
        self.gpu_local = np.arange(gpus) - self.node_start[self.gpu_node]
        self.pools: list[str] = sorted({n.pool for n in specs})
        pool_of_node = np.array([self.pools.index(n.pool) for n in specs])
        self.gpu_pool = pool_of_node[self.gpu_node]
        self.node_pool = pool_of_node
        self.node_size = sizes
        self.mig_gpu = np.repeat(np.array([n.mig for n in specs]), sizes)
        self.placeable = ~self.mig_gpu

        def per(attr: str) -> np.ndarray:
            return np.repeat(np.array([getattr(n.model, attr) for n in specs]), sizes)

        self.mem_total = per("memory_bytes")
        self.power_limit = per("power_limit_watts")
        self.idle_power = per("idle_power_watts")
        self.max_clock = per("max_sm_clock_hertz")
        self.idle_clock = per("idle_sm_clock_hertz")
        self.mem_clock = per("memory_clock_hertz")
        self.gpu_seed = np.array(
            [
                int.from_bytes(_stable_uuid(self.seed, "gpu", g).bytes[:8], "little")
                for g in range(gpus)
            ],
            dtype=np.uint64,
        )
        self.uuids = [
            f"GPU-{_stable_uuid(self.seed, n.name, i)}" for n in specs for i in range(n.board.gpus)
        ]

        self.used = np.zeros(gpus)
        self.slot_job = np.full((gpus, SLOTS), -1, dtype=np.int64)
        self.slot_frac = np.zeros((gpus, SLOTS))
        self.slot_util = np.zeros((gpus, SLOTS))
        self.slot_idle = np.zeros((gpus, SLOTS))
        self.slot_mem = np.zeros((gpus, SLOTS))
        self.slot_seed = np.zeros((gpus, SLOTS), dtype=np.uint64)
        self.slot_day = np.zeros((gpus, SLOTS), dtype=bool)
        self.slot_proc = np.zeros((gpus, SLOTS), dtype=bool)

        self.energy = np.zeros(gpus)
        self.idle_seconds = np.zeros(gpus)
        self.power_cap_seconds = np.zeros(gpus)
        self.xid_counts: dict[int, dict[int, int]] = {}
        self.xid_last: dict[int, float] = {}
        self.jobs: dict[int, SimJob] = {}
        self.pending: list[tuple[float, int, SimJob, JobRequest]] = []
        # (time, pool, gpus) of recent arrivals, for demand forecasts; bounded for long runs.
        self.arrival_log: deque[tuple[float, str, float]] = deque(maxlen=ARRIVAL_LOG_MAX)
        self.abandoned = 0
        self._next_id = 1
        self._departures: list[tuple[float, int]] = []
        self._arrivals: list[tuple[float, int, int, JobRequest]] = []
        self._hours_generated = 0
        self._xid_events: list[tuple[float, int, int]] = []
        self._grid = 0.0
        self._render_static: object | None = None  # gpu_defrag_sim.render caches static facts here

        self.mig: list[MigSlot] = []
        self._build_mig()
        self._rates = self._calibrate()
        if self.spec.initial is not None:
            self._place_initial()
        else:
            self._warm_start()
        self._seed_health()
        self._sample_grid()

    # ----- public API -------------------------------------------------------------------

    @property
    def unix_time(self) -> float:
        """Unix time the current simulated instant stands for (t=0 is Monday 09:00 UTC)."""
        return SIM_EPOCH + self.now

    def advance(self, seconds: float) -> None:
        """Move simulated time forward: arrivals, departures, counters, pending retries."""
        if seconds < 0:
            raise ValueError("simulated time only moves forward")
        target = self.now + seconds
        while True:
            next_grid = self._grid + TICK
            self._process_events(min(target, next_grid))
            if next_grid > target:
                break
            self._integrate()
            self._grid = next_grid
            self.now = next_grid
            self._retry_pending()
            self._sample_grid()
        self.now = target

    def running_jobs(self) -> list[SimJob]:
        """Jobs holding GPUs now, in start order."""
        return list(self.jobs.values())

    def arrivals(self, hours: int) -> list[tuple[str, JobRequest]]:
        """(pool, job) of every job that arrives in the first `hours` simulated hours, in time
        order, from the same draws `advance` makes (the fleet is not moved): the workload,
        e.g. for a replay elsewhere. Jobs running at t=0 (the warm start) are not arrivals."""
        out = [
            (self.pools[pool], req)
            for hour in range(max(0, hours))
            for pool, rate in self._rates.items()
            for req in arrivals_in_hour(
                self.seed, pool, hour, rate, self._max_gpus(pool), self.gpus_per_node
            )
        ]
        return sorted(out, key=lambda item: (item[1].arrival, item[1].seed))

    def pending_jobs(self) -> list[SimJob]:
        """Jobs that arrived but found no room yet, oldest first."""
        return [job for _, _, job, _ in self.pending]

    def readings(self, unix_time_of: Callable[[float], float] | None = None) -> list[NodeReading]:
        """One NodeReading per node at the current time. `unix_time_of` maps a simulated time to
        the unix time stamped on events (XIDs); default: t=0 is SIM_EPOCH."""
        return render(self, unix_time_of or (lambda s: SIM_EPOCH + s))

    # ----- calibration and initial state ------------------------------------------------

    def _pool_gpus(self, pool: int) -> int:
        return int(np.sum((self.gpu_pool == pool) & self.placeable))

    def _max_gpus(self, pool: int) -> int:
        """Largest job a pool accepts: multi-node only up to half the pool."""
        return max(self.gpus_per_node, self._pool_gpus(pool) // 2)

    def _calibrate(self) -> dict[int, float]:
        """Arrival rate per pool so that, on average, the pool holds its target load."""
        rates = {}
        for pool, name in enumerate(self.pools):
            target = self.spec.target_load.get(name)
            if not target:
                continue
            per_job = mean_gpu_seconds(self._max_gpus(pool), self.gpus_per_node)
            rates[pool] = target * self._pool_gpus(pool) / per_job
        return rates

    def _new_job(self, req: JobRequest, pool: int) -> SimJob:
        kind = KIND_BY_NAME[req.kind]
        job = SimJob(
            id=self._next_id,
            name=f"{req.kind}-{req.seed & 0xFFFFFF:06x}",
            kind=req.kind,
            pool=self.pools[pool],
            gpus=req.gpus,
            tenant=req.tenant,
            namespace=req.namespace,
            priority=kind.priority,
            migratable=kind.migratable,
            arrival=req.arrival,
            has_process=req.has_process,
            seed=req.seed,
        )
        self._next_id += 1
        return job

    def _place_initial(self) -> None:
        rng = np.random.default_rng([self.seed, 1])
        pool = 0
        for item in self.spec.initial or ():
            pool = int(self.node_pool[item.node])
            req = draw_job(rng, self._max_gpus(pool), self.gpus_per_node)
            kind = KIND_BY_NAME[item.kind]
            req.kind, req.tenant, req.namespace = item.kind, item.tenant, item.namespace
            req.gpus = float(len(item.gpus))
            req.util = 0.01 if item.idle else float(rng.uniform(*kind.util))
            req.idle_prob = 1.0 if item.idle else kind.idle_prob
            req.memory = float(rng.uniform(*kind.memory))
            req.has_process = item.has_process
            hours = kind.median_hours * math.exp(kind.sigma * rng.standard_normal())
            full = min(kind.max_hours, hours) * HOUR
            residual = max(0.5 * HOUR, full * rng.uniform(0.2, 1))  # left to run from t=0
            req.duration = max(full, residual)
            gpus = [int(self.node_start[item.node]) + g for g in item.gpus]
            self._start(self._new_job(req, pool), req, gpus, residual - req.duration)

    def _warm_start(self) -> None:
        """Fill each pool to its warm load with jobs from the mix, placed first-fit in a
        shuffled node order (a fleet that has seen churn), each started before t=0 and ending
        after it."""
        for pool, name in enumerate(self.pools):
            share = self.spec.warm_load.get(name)
            if not share:
                continue
            rng = np.random.default_rng([self.seed, 2, pool])
            total = self._pool_gpus(pool)
            order = rng.permutation(len(self.spec.nodes))
            failures = 0
            while failures < 50:
                in_use = float(np.sum(self.used[(self.gpu_pool == pool) & self.placeable]))
                if in_use >= share * total:
                    break
                req = draw_job(rng, self._max_gpus(pool), self.gpus_per_node)
                # Jobs seen at a random instant are length-biased: long ones are more likely.
                if rng.random() > min(req.duration, CALIBRATION_HORIZON) / CALIBRATION_HORIZON:
                    continue
                # ... and that instant falls uniformly inside them: what is left runs from t=0,
                # what has passed ran before it, so the job's start and its whole duration are
                # known to whoever reads the fleet (its ends teach true durations, not residues).
                residual = max(600.0, req.duration * rng.random())
                req.duration = max(req.duration, residual)
                gpus = self._find(pool, req.gpus, order)
                if gpus is None:
                    failures += 1
                    continue
                self._start(self._new_job(req, pool), req, gpus, residual - req.duration)

    def _build_mig(self) -> None:
        rng = np.random.default_rng([self.seed, 3])
        for node_index, node in enumerate(self.spec.nodes):
            if not node.mig:
                continue
            profiles = {p: (s, m) for p, s, m in node.model.mig_profiles}
            for local, layout in enumerate(_MIG_LAYOUT[: node.board.gpus]):
                gpu = int(self.node_start[node_index]) + local
                for gi, (profile, owned) in enumerate(layout, start=1):
                    slices, memory = profiles[profile]
                    owner = f"infer-{node.name}-{local}-{gi}" if owned else ""
                    self.mig.append(
                        MigSlot(
                            gpu,
                            gi,
                            profile,
                            slices,
                            memory,
                            f"MIG-{_stable_uuid(self.seed, node.name, local, gi)}",
                            owner,
                            int(rng.integers(1, 2**62)),
                            float(rng.uniform(0.1, 0.6)) if owned else 0.0,
                        )
                    )
                self.used[gpu] = 1.0
        self.mig_gpu_index = np.array([m.gpu for m in self.mig], dtype=np.int64)
        self.mig_seed = np.array([m.seed for m in self.mig], dtype=np.uint64)
        self.mig_base = np.array([m.util for m in self.mig])
        self.mig_share = np.array([m.slices / 7 for m in self.mig])
        self.mig_mem = np.array([m.memory_bytes for m in self.mig])

    def _seed_health(self) -> None:
        """One GPU with an XID from before t=0 and one with growing corrected ECC errors."""
        pick = np.random.default_rng([self.seed, 4]).choice(self.gpu_count, 2, replace=False)
        self.xid_gpu, self.ecc_gpu = int(pick[0]), int(pick[1])
        self.xid_counts[self.xid_gpu] = {31: 1}
        self.xid_last[self.xid_gpu] = -1.5 * HOUR

    # ----- placement ----------------------------------------------------------------------

    def _find(self, pool: int, gpus: float, order: np.ndarray | None = None) -> list[int] | None:
        """First fit on the pool's GPUs: lowest-index room for a fraction, first node with enough
        whole free GPUs, or the first whole free nodes for a multi-node job."""
        mask = (self.gpu_pool == pool) & self.placeable
        if gpus < 1:
            room = np.flatnonzero(mask & (self.used + gpus <= 1.0 + 1e-9))
            return [int(room[0])] if room.size else None
        free = mask & (self.used == 0)
        counts = np.add.reduceat(free.astype(np.int64), self.node_start[:-1])
        nodes = np.arange(len(counts)) if order is None else order
        need = math.ceil(gpus)
        if need <= self.gpus_per_node:
            fits = nodes[counts[nodes] >= need]
            if not fits.size:
                return None
            node = int(fits[0])
            local = np.flatnonzero(free[self.node_start[node] : self.node_start[node + 1]])
            return [int(self.node_start[node]) + int(i) for i in local[:need]]
        whole = nodes[(counts[nodes] == self.node_size[nodes]) & (self.node_pool[nodes] == pool)]
        needed_nodes = []
        got = 0
        for node in whole:
            needed_nodes.append(int(node))
            got += int(self.node_size[node])
            if got >= need:
                break
        if got < need:
            return None
        picked = [
            g for n in needed_nodes for g in range(self.node_start[n], self.node_start[n + 1])
        ]
        return picked[:need]

    def _start(self, job: SimJob, req: JobRequest, gpus: list[int], at: float) -> None:
        kind = KIND_BY_NAME[req.kind]
        frac = min(1.0, req.gpus)
        for gpu in gpus:
            slot = int(np.flatnonzero(self.slot_job[gpu] < 0)[0])
            self.slot_job[gpu, slot] = job.id
            self.slot_frac[gpu, slot] = frac
            self.slot_util[gpu, slot] = req.util
            self.slot_idle[gpu, slot] = req.idle_prob
            self.slot_mem[gpu, slot] = req.memory
            self.slot_seed[gpu, slot] = np.uint64(req.seed)
            self.slot_day[gpu, slot] = kind.follows_day
            self.slot_proc[gpu, slot] = req.has_process
            self.used[gpu] += frac
            job.placement.append((gpu, slot))
            node = int(self.gpu_node[gpu])
            if node not in job.pods:
                job.pods[node] = f"{job.name}-{len(job.pods)}"
        job.start = at
        job.end = at + req.duration
        self.jobs[job.id] = job
        heapq.heappush(self._departures, (job.end, job.id))

    def _finish(self, job_id: int) -> None:
        job = self.jobs.pop(job_id)
        for gpu, slot in job.placement:
            self.used[gpu] = max(0.0, self.used[gpu] - self.slot_frac[gpu, slot])
            self.slot_job[gpu, slot] = -1
            self.slot_frac[gpu, slot] = 0.0
            self.slot_proc[gpu, slot] = False

    # ----- time -----------------------------------------------------------------------------

    def _generate_arrivals(self, until: float) -> None:
        while self._hours_generated * HOUR <= until:
            hour = self._hours_generated
            for pool, rate in self._rates.items():
                for req in arrivals_in_hour(
                    self.seed, pool, hour, rate, self._max_gpus(pool), self.gpus_per_node
                ):
                    heapq.heappush(self._arrivals, (req.arrival, req.seed, pool, req))
            self._xids_in_hour(hour)
            self._hours_generated += 1

    def _process_events(self, until: float) -> None:
        """Departures and arrivals with time <= until, in time order (departures first on ties)."""
        self._generate_arrivals(until)
        self._apply_xids(until)
        while True:
            dep = self._departures[0][0] if self._departures else math.inf
            arr = self._arrivals[0][0] if self._arrivals else math.inf
            if min(dep, arr) > until:
                return
            if dep <= arr:
                _, job_id = heapq.heappop(self._departures)
                self._finish(job_id)
            else:
                at, _, pool, req = heapq.heappop(self._arrivals)
                self.arrival_log.append((at, self.pools[pool], req.gpus))
                job = self._new_job(req, pool)
                gpus = self._find(pool, req.gpus)
                if gpus is None:
                    self.pending.append((at, job.id, job, req))
                else:
                    self._start(job, req, gpus, at)

    def _retry_pending(self) -> None:
        """At each grid point, start pending jobs that now fit (backfill: no head-of-line block)."""
        if not self.pending:
            return
        still = []
        for item in self.pending:
            at, _, job, req = item
            if self.now - at > MAX_WAIT:
                self.abandoned += 1
                continue
            gpus = self._find(self.gpu_pool_index(job.pool), req.gpus)
            if gpus is None:
                still.append(item)
            else:
                self._start(job, req, gpus, self.now)
        self.pending = still

    def gpu_pool_index(self, pool: str) -> int:
        return self.pools.index(pool)

    def activity_at(self, t: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(slot utilization, GPU utilization, GPU power watts) at time t from current holders.

        Only occupied slots with a process are evaluated; empty slots read 0.
        """
        gpus, slots = np.nonzero(self.slot_proc)
        running = activity(
            self.slot_seed[gpus, slots],
            self.slot_util[gpus, slots],
            self.slot_idle[gpus, slots],
            self.slot_day[gpus, slots],
            t,
        )
        slot_util = np.zeros(self.slot_job.shape)
        slot_util[gpus, slots] = running
        util = np.bincount(
            gpus, weights=running * self.slot_frac[gpus, slots], minlength=self.gpu_count
        ).astype(np.float64, copy=False)  # with no process at all, numpy returns integers
        np.minimum(util, 1.0, out=util)
        busy = np.zeros(self.gpu_count, dtype=bool)
        busy[gpus] = True
        if self.mig:
            mig_util = self.activity_at_mig(t)
            np.add.at(util, self.mig_gpu_index, mig_util * self.mig_share)
            busy[self.mig_gpu_index[self.mig_base > 0]] = True
        jitter = hash01(self.gpu_seed, np.int64(t // 60), salt=3)
        load = np.minimum(1.0, 0.9 * util + 0.05 * busy + 0.02 * jitter)
        power = self.idle_power + (self.power_limit - self.idle_power) * load
        return slot_util, util, power

    def activity_at_mig(self, t: float) -> np.ndarray:
        """Utilization of each MIG instance at time t (inference: follows the day)."""
        count = len(self.mig)
        return activity(self.mig_seed, self.mig_base, np.zeros(count), np.ones(count, bool), t)

    def _sample_grid(self) -> None:
        _, self._grid_util, self._grid_power = self.activity_at(self._grid)

    def _integrate(self) -> None:
        self.energy += self._grid_power * TICK
        self.idle_seconds += TICK * (self._grid_util <= 0.0)
        self.power_cap_seconds += TICK * (self._grid_power >= 0.95 * self.power_limit)

    def _xids_in_hour(self, hour: int) -> None:
        """Rare application XIDs: a Poisson number per simulated hour over the whole fleet."""
        rng = np.random.default_rng([self.seed, 5, hour])
        count = int(rng.poisson(XID_PER_GPU_DAY * self.gpu_count * HOUR / DAY))
        for at, gpu in zip(
            rng.uniform(hour * HOUR, (hour + 1) * HOUR, count).tolist(),
            rng.integers(0, self.gpu_count, count).tolist(),
            strict=True,
        ):
            code = XID_CODES[int(rng.integers(len(XID_CODES)))]
            heapq.heappush(self._xid_events, (at, gpu, code))

    def _apply_xids(self, until: float) -> None:
        while self._xid_events and self._xid_events[0][0] <= until:
            at, gpu, code = heapq.heappop(self._xid_events)
            counts = self.xid_counts.setdefault(gpu, {})
            counts[code] = counts.get(code, 0) + 1
            self.xid_last[gpu] = at

    def energy_at_now(self) -> np.ndarray:
        """Energy counters at the current instant: grid value plus the partial step."""
        return self.energy + self._grid_power * (self.now - self._grid)


def fleet_at(
    preset: str = "a100-16x8", seed: int = 42, sim_seconds: float = 0.0, nodes: int | None = None
) -> list[NodeReading]:
    """The fleet's NodeReadings at `sim_seconds` after t=0: pure in (preset, seed, time, nodes)."""
    fleet = SimFleet(preset, seed, nodes)
    fleet.advance(sim_seconds)
    return fleet.readings()
