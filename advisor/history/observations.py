"""The advisor's own bounded history of what it measured at each look at the cluster
(`History`): per observation the headline measures, per-pool and per-tenant demand (small,
`max_points` of them), and per-GPU utilization and memory for the last `usage_window_s` only
(large, so kept short). `with_usage(model)` hands that window back as the model's `Usage`, so
"idle for the whole hour" is judged over real samples instead of one reading. Each observation
also goes to the other two trackers it holds: `JobLifetimes` and `NodeRecord`. Thread-safe: a
poller appends while pages read.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from advisor.fragmentation import measures
from advisor.history.job_lifetimes import JobLifetimes, running_jobs
from advisor.history.node_hours import NODE_HOURS, NodeHours, NodeRecord, node_rows
from advisor.model import MILLI, ClusterModel, Usage, spec_models, spec_parts
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
