"""The advisor's own bounded history: what it measured at each look at the cluster.

When the advisor reads exporters directly (no Prometheus), nobody else keeps a past, yet the
fragmentation trend, the allocated-but-idle window and demand forecasts all need one. `History`
keeps, per observation, the headline measures and per-pool demand (small, `max_points` of them),
and per-GPU utilization and memory for the last `usage_window_s` only (large, so kept short).
`with_usage(model)` hands that window back as the model's `Usage`, so "idle for the whole hour"
is judged over real samples instead of one reading. Thread-safe: a poller appends while pages
read.

It also learns how long jobs run (`JobLifetimes`, `History.finished_jobs()`): a job seen in one
observation and gone from the next has finished, and its duration goes into a bounded record
that `advisor.forecast.job_ends` turns into predicted ends for the running jobs.

Per node it keeps hours, not runs (`NodeHours`, `History.node_hours()`): for each of the last
`NODE_HOURS` hours the node's peak held GPUs (usable GPUs with anything allocated on them), its
largest usable capacity, and in how many of the hour's runs it was seen, beside the times of the
hour's runs; the per-node idle windows (`advisor.forecast.runs.node_panel`) are built from
that. Idle windows count held GPUs rather than the allocated share: a GPU with a tenth of it
handed out cannot be reserved, powered off or given to a whole-GPU job, so the share left on it
is no free GPU.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from advisor.fragmentation import measures
from advisor.model import MILLI, UNATTRIBUTED, ClusterModel, Usage, spec_models, spec_parts
from advisor.settings import NO_POOL, NO_TENANT

TREND_COLUMNS: tuple[str, ...] = (
    "fragment_rate",
    "fragment_gpus",
    "free_gpus",
    "free_capacity_gpus",
    "allocated_gpus",
    "allocated_idle_gpus",
    "unhealthy_gpus",
    "pending_tasks",
    "largest_single_node_gpus",
)


def gpu_keys(model: ClusterModel) -> np.ndarray:
    """object (G): a key per GPU that survives re-ordering between observations (UUID when the
    source knows it, else node/index)."""
    names = model.nodes.name[model.gpus.node]
    return np.array(
        [
            uuid or f"{node}/{index}"
            for uuid, node, index in zip(
                model.gpus.uuid.tolist(), names.tolist(), model.gpus.index.tolist(), strict=True
            )
        ],
        dtype=object,
    )


def headline(result: dict[str, Any]) -> dict[str, float]:
    """The scalars of one `measures.analyze` result that the trend plots."""
    spatial, cluster = result["spatial"], result["cluster"]
    row: dict[str, float] = {
        "fragment_rate": result["fgd"]["fragment_rate"],
        "fragment_gpus": result["fgd"]["fragment_gpus"],
        "free_gpus": spatial["free_gpus"],
        "free_capacity_gpus": spatial["free_capacity_gpus"],
        "allocated_gpus": cluster["allocated_gpus"],
        "allocated_idle_gpus": result["temporal"]["allocated_idle_gpus"],
        "unhealthy_gpus": cluster["unhealthy_gpus"],
        "pending_tasks": cluster["pending_tasks"],
        "largest_single_node_gpus": spatial["largest_job"]["single_node_gpus"],
    }
    for shape in spatial["shapes"]:
        row[f"fit {shape['shape']}"] = shape["jobs_that_fit"]
    return row


POOL_COLUMNS = ("allocated_gpus", "held_gpus", "capacity_gpus", "pending_gpus")


def pool_rows(model: ClusterModel) -> list[dict[str, Any]]:
    """Per pool: GPUs allocated (demand being served), GPUs held (not wholly free: what idle
    windows count), usable capacity and pending GPUs.

    Pending work is counted against the pool whose GPU model it asks for (split evenly when a
    spec allows several pools), so queued demand shows up in the demand forecast too.
    """
    names = sorted(set(model.nodes.pool[model.gpus.node].tolist()))  # pools with GPUs
    nodes = node_rows(model)  # one way to count a node's GPUs
    rows = []
    models_of_pool = {
        pool: set(model.nodes.gpu_model[model.nodes.pool == pool].tolist()) for pool in names
    }
    allocs = model.allocations
    pending_by_pool = dict.fromkeys(names, 0.0)
    waiting = np.flatnonzero(allocs.node < 0)
    for row in waiting.tolist():
        need = float(allocs.num_gpu[row]) * float(allocs.gpu_milli[row]) / MILLI
        spec = str(allocs.gpu_spec[row])
        targets = [p for p in names if not spec_parts(spec) or spec_models(spec, models_of_pool[p])]
        for pool in targets:
            pending_by_pool[pool] += need / len(targets)
    for pool in names:
        on = model.nodes.pool == pool
        rows.append(
            {
                "pool": pool or NO_POOL,
                "allocated_gpus": float(nodes.allocated[on].sum()),
                "held_gpus": float(nodes.held[on].sum()),
                "capacity_gpus": float(nodes.capacity[on].sum()),
                "pending_gpus": pending_by_pool[pool],
            }
        )
    return rows


class NodeRows(NamedTuple):
    """`node_rows`: per node of a model, in its node order."""

    names: np.ndarray
    pools: np.ndarray  # NO_POOL for a node without a pool
    allocated: np.ndarray  # GPU share: milli-GPU handed out ÷ MILLI, every GPU
    capacity: np.ndarray  # usable GPUs
    held: np.ndarray  # usable GPUs with anything allocated on them (capacity − wholly free)


def node_rows(model: ClusterModel) -> NodeRows:
    """Per node: GPUs allocated, usable and held (`NodeRows`). Usable: healthy, not lost, node
    schedulable; a MIG GPU counts the share its instances carve, since no allocation can reach
    the rest (a pool of 3g+3g A100s is full at 6/7 of its GPUs, and a capacity of whole GPUs
    would leave demand forever below it), and a held MIG GPU counts that share too, so held ≤
    capacity. `pool_rows` sums these per pool."""
    n = len(model.nodes.name)
    node = model.gpus.node
    allocated = np.bincount(node, weights=model.gpu_milli_allocated / MILLI, minlength=n)
    usable = np.where(model.gpu_usable, model.gpus.carved_milli / MILLI, 0.0)
    capacity = np.bincount(node, weights=usable, minlength=n)
    held = np.bincount(node, weights=np.where(model.gpu_is_free, 0.0, usable), minlength=n)
    pools = np.array([p or NO_POOL for p in model.nodes.pool.tolist()], dtype=object)
    return NodeRows(model.nodes.name, pools, allocated, capacity, held)


NODE_HOURS = 16 * 24  # hours kept per node: advisor.forecast.live_idle.IDLE_MAX_H (a test checks)


@dataclass(frozen=True)
class NodeHours:
    """`NodeRecord.snapshot()`: H hours (oldest first; the last one may still be running) × N
    nodes. `peak_held` and `capacity` are NaN where the node was not seen in the hour."""

    hours: np.ndarray  # int64 (H): hour start, in hours since the epoch
    run_times: np.ndarray  # float64: every run of those hours, epoch seconds, ascending
    runs: np.ndarray  # int64 (H): runs in each hour
    names: tuple[str, ...]
    pools: tuple[str, ...]  # each node's pool at its latest sighting
    peak_held: np.ndarray  # float (H, N): the hour's most held GPUs on the node (`NodeRows`)
    capacity: np.ndarray  # float (H, N): the hour's largest usable GPU count of the node
    seen: np.ndarray  # int (H, N): runs of the hour that saw the node


@dataclass
class _NodeHour:
    hour: int
    times: list[float]
    peak_held: np.ndarray  # float32, NaN unseen
    capacity: np.ndarray
    seen: np.ndarray  # int32


class NodeRecord:
    """Per node and hour, for the last `max_hours` hours (plus the running one): peak held
    GPUs, largest capacity and runs that saw it; the hour's run times. Nothing per run is kept
    but the times, so 1,000 nodes × 16 days hold about 5 MB (12 bytes per node and hour).

    A node keeps its hours after it disappears (unseen hours are NaN); once none of the kept
    hours saw it, it leaves the record. Not thread-safe on its own: `History` holds its lock
    around every call."""

    def __init__(self, max_hours: int = NODE_HOURS) -> None:
        if max_hours < 1:
            raise ValueError("max_hours must be >= 1")
        self.max_hours = max_hours
        self._names: list[str] = []
        self._pools: list[str] = []
        self._column: dict[str, int] = {}
        self._hours: deque[_NodeHour] = deque()
        self._last_names: np.ndarray | None = None  # the last observation's names, and columns
        self._last_columns: np.ndarray = np.zeros(0, dtype=np.int64)

    def __len__(self) -> int:
        return len(self._hours)

    def observe(
        self,
        timestamp: float,
        names: np.ndarray,
        pools: np.ndarray,
        held: np.ndarray,
        capacity: np.ndarray,
    ) -> None:
        """One run at `timestamp` (runs in time order); per node of it (names unique) its pool,
        held and usable GPUs (`NodeRows`)."""
        hour = math.floor(timestamp / 3600.0)
        if not self._hours or self._hours[-1].hour != hour:
            self._open(hour)
        columns = self._columns(names, pools)
        current = self._hours[-1]
        width = len(self._names)
        if len(current.peak_held) < width:  # nodes new in this hour
            grow = width - len(current.peak_held)
            current.peak_held = np.concatenate(
                [current.peak_held, np.full(grow, np.nan, np.float32)]
            )
            current.capacity = np.concatenate([current.capacity, np.full(grow, np.nan, np.float32)])
            current.seen = np.concatenate([current.seen, np.zeros(grow, np.int32)])
        current.peak_held[columns] = np.fmax(current.peak_held[columns], held)
        current.capacity[columns] = np.fmax(current.capacity[columns], capacity)
        current.seen[columns] += 1
        current.times.append(float(timestamp))

    def _columns(self, names: np.ndarray, pools: np.ndarray) -> np.ndarray:
        last = self._last_names
        if last is None or not (last is names or np.array_equal(last, names)):
            columns = np.empty(len(names), dtype=np.int64)
            for i, name in enumerate(names.tolist()):
                column = self._column.get(name)
                if column is None:
                    column = self._column[name] = len(self._names)
                    self._names.append(name)
                    self._pools.append("")
                columns[i] = column
            self._last_names, self._last_columns = names, columns
        for column, pool in zip(self._last_columns.tolist(), pools.tolist(), strict=True):
            self._pools[column] = pool
        return self._last_columns

    def _open(self, hour: int) -> None:
        """Start `hour`; drop the hours before the last `max_hours` complete ones, and the
        nodes none of the kept hours saw."""
        width = len(self._names)
        self._hours.append(
            _NodeHour(
                hour,
                [],
                np.full(width, np.nan, np.float32),
                np.full(width, np.nan, np.float32),
                np.zeros(width, np.int32),
            )
        )
        dropped = False
        while self._hours[0].hour < hour - self.max_hours:
            self._hours.popleft()
            dropped = True
        if dropped:
            self._forget_unseen()

    def _forget_unseen(self) -> None:
        seen = np.zeros(len(self._names), dtype=bool)
        for h in self._hours:
            seen[: len(h.seen)] |= h.seen > 0
        if seen.all():
            return
        keep = np.flatnonzero(seen)
        self._names = [self._names[i] for i in keep.tolist()]
        self._pools = [self._pools[i] for i in keep.tolist()]
        self._column = {name: i for i, name in enumerate(self._names)}
        for h in self._hours:
            mine = keep[keep < len(h.seen)]
            h.peak_held, h.capacity, h.seen = h.peak_held[mine], h.capacity[mine], h.seen[mine]
        self._last_names = None

    def snapshot(self) -> NodeHours | None:
        """The record as dense arrays (a copy); None before the first run."""
        if not self._hours:
            return None
        width = len(self._names)

        def dense(attr: str, fill: float, dtype) -> np.ndarray:
            out = np.full((len(self._hours), width), fill, dtype=dtype)
            for i, h in enumerate(self._hours):
                row = getattr(h, attr)
                out[i, : len(row)] = row
            return out

        return NodeHours(
            hours=np.array([h.hour for h in self._hours], dtype=np.int64),
            run_times=np.array([t for h in self._hours for t in h.times], dtype=np.float64),
            runs=np.array([len(h.times) for h in self._hours], dtype=np.int64),
            names=tuple(self._names),
            pools=tuple(self._pools),
            peak_held=dense("peak_held", np.nan, np.float32),
            capacity=dense("capacity", np.nan, np.float32),
            seen=dense("seen", 0, np.int32),
        )


@dataclass(frozen=True)
class RunningJob:
    """The placed tasks of one job: GPU share summed, earliest known start (NaN: unknown)."""

    tenant: str
    job: str
    gpus: float
    start: float
    nodes: frozenset[str]
    allocations: tuple[str, ...]


def running_jobs(model: ClusterModel) -> list[RunningJob]:
    """Placed allocations grouped by (tenant, job), with the earliest start time the source
    gives (NaN when it gives none)."""
    allocs = model.allocations
    rows = np.flatnonzero(allocs.node >= 0)
    names = model.nodes.name
    grouped: dict[tuple[str, str], list[int]] = {}
    for row, tenant, job in zip(
        rows.tolist(), allocs.tenant[rows].tolist(), allocs.job[rows].tolist(), strict=True
    ):
        grouped.setdefault((str(tenant), str(job) or str(allocs.id[row])), []).append(row)
    out = []
    for (tenant, job), members in grouped.items():
        share = allocs.num_gpu[members].astype(float) * allocs.gpu_milli[members] / MILLI
        starts = allocs.start_time[members]
        starts = starts[np.isfinite(starts)]
        out.append(
            RunningJob(
                tenant,
                job,
                round(float(share.sum()), 3),
                float(starts.min()) if len(starts) else math.nan,
                frozenset(str(n) for n in names[allocs.node[members]].tolist()),
                tuple(str(a) for a in allocs.id[members].tolist()),
            )
        )
    return out


@dataclass(frozen=True)
class FinishedJob:
    """A job seen running and then seen gone. Its end lies between `last_seen` (the last
    observation with it) and `gone_at` (the first one without it while its nodes were observed,
    or the start of the next run of the same job); the duration takes the midpoint, which is off
    by at most half that gap and, for ends spread evenly over the gap, not biased either way
    (either bound alone is off by half the gap on average: 30 s at a 1-minute interval, 30 min
    on an hourly backfill)."""

    tenant: str
    job: str
    gpus: float
    start: float
    last_seen: float
    gone_at: float
    start_gap: float = 0.0  # > 0: the start was observed, not given: midpoint of this gap

    @property
    def end(self) -> float:
        return 0.5 * (self.last_seen + self.gone_at)

    @property
    def duration_s(self) -> float:
        return self.end - self.start

    @property
    def censor_s(self) -> float:
        return self.gone_at - self.last_seen


FINISHED_COLUMNS = (
    "tenant",
    "job",
    "gpus",
    "start",
    "end",
    "duration_h",
    "censor_s",
    "start_gap_s",
)


@dataclass
class _Seen:
    tenant: str
    job: str
    gpus: float
    start: float
    last_seen: float
    nodes: frozenset[str]
    allocations: tuple[str, ...] = ()
    start_gap: float = 0.0


class JobLifetimes:
    """Which jobs finished between consecutive observations, and how long they ran.

    Jobs are keyed by (tenant, job) with their start time (`running_jobs`). At each
    observation, a tracked job that is absent has finished, with one guard: if a node it ran
    on is absent from the observation too (an exporter missed a scrape), nothing is concluded
    until the node is back (after `max_gap_s` unseen the job is forgotten, unrecorded). A job
    that comes back with a start no later than its last sighting was not finished (a blip in
    the source): its record is withdrawn and it is tracked on. A job whose start moved past its
    last sighting is a new run under a reused name (a restart): the old run is recorded as
    ended by the new start. Durations that are not positive, and gaps over `max_gap_s`, are not
    recorded. The record keeps the latest `max_finished` finished jobs.

    Start times come from the source (traces, the simulator); exporter scrapes and Prometheus
    carry none. Then a job first seen after the first observation, on nodes the previous
    observation saw, started between the two: its start is their midpoint (`start_gap` says
    how wide), the same rule as for ends. A job without a given start that was already running
    at the first observation (or whose node was not seen just before) has an unknown start: it
    is tracked, never recorded, and keeps the planner's fallback. Without start times a job is
    taken to have come back from a blip only if it was missing from one observation alone.
    Busy GPUs no allocation claims (`unattributed@…` holders) get no observed start.
    """

    def __init__(self, max_finished: int = 5000, max_gap_s: float = 2 * 3600.0) -> None:
        if max_finished < 1:
            raise ValueError("max_finished must be >= 1")
        self.max_finished = max_finished
        self.max_gap_s = max_gap_s
        self._running: dict[tuple[str, str], _Seen] = {}
        self._finished: OrderedDict[tuple[str, str, float], FinishedJob] = OrderedDict()
        self._latest: dict[tuple[str, str], tuple[str, str, float]] = {}  # last finished run
        self._withdrawn = 0
        self._dropped = 0
        self._unknown_start = 0
        self._previous: tuple[float, frozenset[str]] | None = None  # time, nodes of last look
        self._changes = 0  # edits of `_finished`, so `frame()` is rebuilt only after one
        self._frame: tuple[int, pd.DataFrame] | None = None
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._finished)

    def observe(self, model: ClusterModel, jobs: list[RunningJob] | None = None) -> None:
        """Update from one observation at `model.timestamp` (observations in time order)."""
        now = model.timestamp
        jobs = running_jobs(model) if jobs is None else jobs
        present_nodes = frozenset(model.nodes.name.tolist())
        with self._lock:
            previous = self._previous
            seen_now = set()
            for job in jobs:
                key = (job.tenant, job.job)
                seen_now.add(key)
                old = self._running.get(key)
                if old is not None and job.start > old.last_seen:  # a new run, same name
                    self._record(old, gone_at=job.start)
                    old = None
                if old is None:
                    old = self._withdraw(key, job.start, previous)
                    if old is not None:
                        self._running[key] = old
                if old is None:
                    start, gap = job.start, 0.0
                    if (
                        math.isnan(start)
                        and previous is not None
                        and job.nodes <= previous[1]
                        and not job.job.startswith(UNATTRIBUTED)
                        and 0 < now - previous[0] <= self.max_gap_s
                    ):
                        start, gap = 0.5 * (previous[0] + now), now - previous[0]
                    old = self._running[key] = _Seen(
                        job.tenant, job.job, job.gpus, start, now, job.nodes, (), gap
                    )
                elif math.isfinite(job.start) and not job.start >= old.start:
                    old.start, old.start_gap = job.start, 0.0  # given, or earlier than seen
                old.gpus, old.last_seen, old.nodes = job.gpus, now, job.nodes
                old.allocations = job.allocations
            for key in [k for k in self._running if k not in seen_now]:
                seen = self._running[key]
                if seen.nodes <= present_nodes:
                    del self._running[key]
                    self._record(seen, gone_at=now)
                elif now - seen.last_seen > self.max_gap_s:
                    del self._running[key]
                    self._dropped += 1
            self._previous = (now, present_nodes)

    def _withdraw(
        self, key: tuple[str, str], start: float, previous: tuple[float, Any] | None
    ) -> _Seen | None:
        """A finished record of this job that it turns out was not finished, as running again:
        its start is no later than its last sighting, or, with no start given, it was missing
        from the previous observation only."""
        full = self._latest.get(key)
        record = self._finished.get(full) if full else None
        if record is None:
            return None
        if math.isnan(start):
            if previous is None or record.gone_at != previous[0]:
                return None
        elif start > record.last_seen:
            return None
        del self._finished[full]
        del self._latest[key]
        self._withdrawn += 1
        self._changes += 1
        return _Seen(
            record.tenant,
            record.job,
            record.gpus,
            record.start,
            record.last_seen,
            frozenset(),
            (),
            record.start_gap,
        )

    def running(self, at: float) -> list[RunningJob] | None:
        """The jobs of the observation at `at` with the starts used for them (given or
        observed; NaN unknown), or None when the last observation was not at `at`."""
        with self._lock:
            if self._previous is None or self._previous[0] != at:
                return None
            return [
                RunningJob(s.tenant, s.job, s.gpus, s.start, s.nodes, s.allocations)
                for s in self._running.values()
                if s.last_seen == at
            ]

    def _record(self, seen: _Seen, gone_at: float) -> None:
        record = FinishedJob(
            seen.tenant, seen.job, seen.gpus, seen.start, seen.last_seen, gone_at, seen.start_gap
        )
        if math.isnan(record.start):
            self._unknown_start += 1
            return
        if not (record.duration_s > 0 and 0 < record.censor_s <= self.max_gap_s):
            self._dropped += 1
            return
        key = (seen.tenant, seen.job)
        full = (seen.tenant, seen.job, seen.start)
        self._changes += 1
        self._finished.pop(full, None)
        self._finished[full] = record
        self._latest[key] = full
        while len(self._finished) > self.max_finished:
            old, _ = self._finished.popitem(last=False)
            if self._latest.get(old[:2]) == old:
                del self._latest[old[:2]]

    def finished(self) -> list[FinishedJob]:
        """The finished jobs kept, oldest end first."""
        with self._lock:
            return list(self._finished.values())

    def counts(self) -> dict[str, int]:
        """Finished jobs kept, jobs tracked now, records withdrawn, jobs dropped (not
        positive, gap too wide, unseen too long), ended jobs whose start was unknown."""
        with self._lock:
            return {
                "finished": len(self._finished),
                "tracked": len(self._running),
                "withdrawn": self._withdrawn,
                "dropped": self._dropped,
                "unknown_start": self._unknown_start,
            }

    def frame(self) -> pd.DataFrame:
        """One row per finished job: `FINISHED_COLUMNS` (times in epoch seconds, duration in
        hours, `censor_s` the gap its end lies in, `start_gap_s` the one its start lies in when
        it was observed rather than given). Built again only after the record changed (every
        run asks for it); each caller gets its own copy."""
        with self._lock:
            cached, changes = self._frame, self._changes
            fresh = cached is not None and cached[0] == changes
            finished = [] if fresh else list(self._finished.values())
        if cached is None or not fresh:
            rows = [
                (
                    r.tenant,
                    r.job,
                    r.gpus,
                    r.start,
                    r.end,
                    r.duration_s / 3600.0,
                    r.censor_s,
                    r.start_gap,
                )
                for r in finished
            ]
            cached = self._frame = (changes, pd.DataFrame(rows, columns=list(FINISHED_COLUMNS)))
        return cached[1].copy()


def tenant_rows(model: ClusterModel) -> dict[str, tuple[float, float]]:
    """Per tenant: (GPUs its running allocations hold, GPUs its waiting ones ask for), as GPU
    shares (num_gpu × milli-GPU ÷ MILLI); tenants without any allocation are left out."""
    allocs = model.allocations
    if not len(allocs.id):
        return {}
    share = allocs.num_gpu.astype(float) * allocs.gpu_milli / MILLI
    running = allocs.node >= 0
    names, index = np.unique([t or NO_TENANT for t in allocs.tenant.tolist()], return_inverse=True)
    held = np.bincount(index, weights=np.where(running, share, 0.0), minlength=len(names))
    asked = np.bincount(index, weights=np.where(running, 0.0, share), minlength=len(names))
    return {str(name): (float(h), float(a)) for name, h, a in zip(names, held, asked, strict=True)}


@dataclass(frozen=True)
class Point:
    timestamp: float
    measures: dict[str, float]
    pools: tuple[dict[str, Any], ...]
    tenants: dict[str, tuple[float, float]] = field(default_factory=dict)  # `tenant_rows`


class History:
    """Bounded, thread-safe record of observations of one source."""

    def __init__(
        self,
        max_points: int = 1440,
        usage_window_s: float = 3600.0,
        max_finished: int = 5000,
        node_hours: int = NODE_HOURS,
        hourly_after_s: float | None = None,
    ) -> None:
        """`hourly_after_s`: observations further than this behind the latest are thinned to
        the last one of each UTC hour, so `max_points` spans days of hours whatever the refresh
        rate (the forecasts read hours: an hour with one observation counts as observed, like a
        backfilled one); None keeps every observation until `max_points` is reached, and then
        thins the oldest hours first (`_keep`)."""
        if max_points < 1:
            raise ValueError("max_points must be >= 1")
        self.max_points = max_points
        self.usage_window_s = usage_window_s
        self.hourly_after_s = hourly_after_s
        self.jobs = JobLifetimes(max_finished)
        self.nodes = NodeRecord(node_hours)
        self._hourly: deque[Point] = deque()  # thinned: the last observation of each older hour
        self._points: deque[Point] = deque()  # every observation since
        # (timestamp, keys, util, memory) per observation inside the usage window
        self._usage: deque[tuple[float, np.ndarray, np.ndarray, np.ndarray]] = deque()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._hourly) + len(self._points)

    def fresh(self) -> History:
        """An empty history with these bounds: for a source whose clock went back (a new
        timeline, whose observations this one would skip as older than its last)."""
        return History(
            self.max_points,
            self.usage_window_s,
            self.jobs.max_finished,
            self.nodes.max_hours,
            self.hourly_after_s,
        )

    def _latest(self) -> Point | None:
        """Under the lock."""
        return self._points[-1] if self._points else self._hourly[-1] if self._hourly else None

    def _keep(self, point: Point) -> None:
        """Under the lock: record `point`, thin what fell behind `hourly_after_s`, bound.

        Without `hourly_after_s`, the bound thins the oldest full-resolution hour to its last
        observation before it drops anything, so the points span as many hours as they can
        whatever the interval (at 15 s, 20,000 points would otherwise hold 3.5 days, fewer than
        the idle windows need). With it, the bound drops the oldest hour."""
        self._points.append(point)
        if self.hourly_after_s is not None:
            cutoff = point.timestamp - self.hourly_after_s
            while self._points and self._points[0].timestamp < cutoff:
                self._to_hourly(self._points.popleft())
        while self._size() > self.max_points:
            if self.hourly_after_s is not None or not self._thin_oldest_hour():
                (self._hourly or self._points).popleft()

    def _size(self) -> int:
        return len(self._hourly) + len(self._points)

    def _to_hourly(self, old: Point) -> None:
        """Under the lock: `old` becomes its hour's thinned observation (the hour's latest)."""
        if self._hourly and self._hourly[-1].timestamp // 3600 == old.timestamp // 3600:
            self._hourly[-1] = old
        else:
            self._hourly.append(old)

    def _thin_oldest_hour(self) -> bool:
        """Under the lock: the oldest full-resolution hours before the latest's, down to their
        last observation each, until that freed a point (True) or none is left (False)."""
        before = self._size()
        latest_hour = self._points[-1].timestamp // 3600 if self._points else None
        while self._points and self._points[0].timestamp // 3600 != latest_hour:
            hour = self._points[0].timestamp // 3600
            while self._points and self._points[0].timestamp // 3600 == hour:
                self._to_hourly(self._points.popleft())
            if self._size() < before:
                return True
        return False

    def append(self, model: ClusterModel, result: dict[str, Any] | None = None) -> Point:
        """Record one observation; `result` is its `measures.analyze` output if already known.

        An observation no later than the last one is skipped (the series stays monotonic), and
        checked for that before anything is computed from it; the work per GPU, node and job is
        done outside the lock, then the check is repeated under it before recording."""
        timestamp = model.timestamp
        if math.isnan(timestamp):
            raise ValueError("a model without a timestamp cannot go into a history")
        with self._lock:
            latest = self._latest()
            if latest is not None and timestamp <= latest.timestamp:
                return latest  # same or older observation: nothing to compute
        result = measures.analyze(model) if result is None else result
        point = Point(timestamp, headline(result), tuple(pool_rows(model)), tenant_rows(model))
        keys = gpu_keys(model)
        util = model.gpus.utilization_ratio.astype(np.float32)
        memory = model.gpus.memory_used_bytes.astype(np.float32)
        jobs = running_jobs(model)
        nodes = node_rows(model)
        with self._lock:
            latest = self._latest()
            if latest is not None and timestamp <= latest.timestamp:
                return latest  # another thread recorded a later one meanwhile
            self.jobs.observe(model, jobs)  # in the same order as the points
            self.nodes.observe(timestamp, nodes.names, nodes.pools, nodes.held, nodes.capacity)
            self._keep(point)
            self._usage.append((timestamp, keys, util, memory))
            while self._usage and self._usage[0][0] < timestamp - self.usage_window_s:
                self._usage.popleft()
        return point

    def extend(self, models: Iterable[ClusterModel]) -> None:
        for model in models:
            self.append(model)

    def points(self) -> list[Point]:
        with self._lock:
            return [*self._hourly, *self._points]

    def latest_timestamp(self) -> float | None:
        """The last observation's time (None when empty), without copying the points."""
        with self._lock:
            latest = self._latest()
            return None if latest is None else latest.timestamp

    def node_hours(self) -> NodeHours | None:
        """Per node and hour: peak held GPUs, capacity, runs that saw it (`NodeRecord`)."""
        with self._lock:
            return self.nodes.snapshot()

    def finished_jobs(self) -> pd.DataFrame:
        """Jobs seen to finish between observations (`JobLifetimes.frame`)."""
        return self.jobs.frame()

    def trend(self) -> pd.DataFrame:
        """One row per observation: `time` (UTC) and the headline measures."""
        points = self.points()
        frame = pd.DataFrame([p.measures for p in points])
        frame.insert(0, "time", pd.to_datetime([p.timestamp for p in points], unit="s", utc=True))
        return frame

    def pool_demand(self) -> pd.DataFrame:
        """Long frame `time, pool, allocated_gpus, held_gpus, capacity_gpus, pending_gpus`
        (`pool_rows`)."""
        rows = [
            {"time": p.timestamp, **pool}
            for p in self.points()
            for pool in p.pools  # one row per pool per observation
        ]
        frame = pd.DataFrame(rows, columns=["time", "pool", *POOL_COLUMNS])
        frame["time"] = pd.to_datetime(frame["time"], unit="s", utc=True)
        return frame

    def tenant_demand(self) -> pd.DataFrame:
        """`pool_demand`'s frame with one series per tenant in the `pool` column: the GPUs its
        running allocations held at each observation, 0 where it held none (absent is none,
        not unknown), pending GPUs likewise; no capacity (NaN)."""
        points = self.points()
        names = sorted({name for p in points for name in p.tenants})
        rows = [
            (p.timestamp, name, *p.tenants.get(name, (0.0, 0.0))) for p in points for name in names
        ]
        frame = pd.DataFrame(rows, columns=["time", "pool", "allocated_gpus", "pending_gpus"])
        frame.insert(3, "capacity_gpus", np.nan)
        frame["time"] = pd.to_datetime(frame["time"], unit="s", utc=True)
        return frame

    def with_usage(self, model: ClusterModel) -> ClusterModel:
        """`model` with this history's per-GPU samples of the usage window before it, plus its
        own readings as the last row, as its `Usage`.

        GPUs are matched by `gpu_keys`; a GPU absent from an observation gets NaN (missing) for
        it, never a made-up value. Models that already carry usage are returned unchanged.
        """
        if len(model.usage.times):
            return model
        keys = gpu_keys(model)
        position = {key: i for i, key in enumerate(keys.tolist())}
        start = model.timestamp - self.usage_window_s
        with self._lock:
            samples = [s for s in self._usage if start <= s[0] < model.timestamp]
        if not samples:
            return model
        own = model.gpus
        samples.append(
            (
                model.timestamp,
                keys,
                own.utilization_ratio.astype(np.float32),
                own.memory_used_bytes.astype(np.float32),
            )
        )
        util = np.full((len(samples), len(keys)), np.nan, dtype=np.float32)
        memory = np.full_like(util, np.nan)
        for t, (_, sample_keys, sample_util, sample_memory) in enumerate(samples):
            if np.array_equal(sample_keys, keys):
                util[t], memory[t] = sample_util, sample_memory
                continue
            for j, key in enumerate(sample_keys.tolist()):
                i = position.get(key)
                if i is not None:
                    util[t, i], memory[t, i] = sample_util[j], sample_memory[j]
        usage = Usage(np.array([s[0] for s in samples], dtype=np.float64), util, memory)
        return dataclasses.replace(model, usage=usage, _cache={})
