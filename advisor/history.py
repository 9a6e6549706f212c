"""The advisor's own bounded history: what it measured at each look at the cluster.

When the advisor reads exporters directly (no Prometheus), nobody else keeps a past, yet the
fragmentation trend, the allocated-but-idle window and demand forecasts all need one. `History`
keeps, per observation, the headline measures and per-pool demand (small, `max_points` of them),
and per-GPU utilization and memory for the last `usage_window_s` only (large, so kept short).
`with_usage(model)` hands that window back as the model's `Usage`, so "idle for the whole hour"
is judged over real samples instead of one reading. Thread-safe: a poller appends while pages
read.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from advisor.fragmentation import measures
from advisor.model import MILLI, ClusterModel, Usage

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


def pool_rows(model: ClusterModel) -> list[dict[str, Any]]:
    """Per pool: GPUs allocated (demand being served), usable capacity and pending GPUs.

    Pending work is counted against the pool whose GPU model it asks for (split evenly when a
    spec allows several pools), so queued demand shows up in the demand forecast too.
    """
    pools = model.nodes.pool[model.gpus.node]
    allocated = model.gpu_milli_allocated / MILLI
    rows = []
    names = sorted(set(pools.tolist()))
    models_of_pool = {
        pool: set(model.nodes.gpu_model[model.nodes.pool == pool].tolist()) for pool in names
    }
    allocs = model.allocations
    pending_by_pool = dict.fromkeys(names, 0.0)
    waiting = np.flatnonzero(allocs.node < 0)
    for row in waiting.tolist():
        need = float(allocs.num_gpu[row]) * float(allocs.gpu_milli[row]) / MILLI
        allowed = {s for s in str(allocs.gpu_spec[row]).split("|") if s}
        targets = [p for p in names if not allowed or models_of_pool[p] & allowed]
        for pool in targets:
            pending_by_pool[pool] += need / len(targets)
    for pool in names:
        on = pools == pool
        rows.append(
            {
                "pool": pool or "(none)",
                "allocated_gpus": float(allocated[on].sum()),
                "capacity_gpus": float((on & model.gpu_usable).sum()),
                "pending_gpus": pending_by_pool[pool],
            }
        )
    return rows


@dataclass(frozen=True)
class Point:
    timestamp: float
    measures: dict[str, float]
    pools: tuple[dict[str, Any], ...]


class History:
    """Bounded, thread-safe record of observations of one source."""

    def __init__(self, max_points: int = 1440, usage_window_s: float = 3600.0) -> None:
        if max_points < 1:
            raise ValueError("max_points must be >= 1")
        self.max_points = max_points
        self.usage_window_s = usage_window_s
        self._points: deque[Point] = deque(maxlen=max_points)
        # (timestamp, keys, util, memory) per observation inside the usage window
        self._usage: deque[tuple[float, np.ndarray, np.ndarray, np.ndarray]] = deque()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._points)

    def append(self, model: ClusterModel, result: dict[str, Any] | None = None) -> Point:
        """Record one observation; `result` is its `measures.analyze` output if already known."""
        timestamp = model.timestamp
        if math.isnan(timestamp):
            raise ValueError("a model without a timestamp cannot go into a history")
        result = measures.analyze(model) if result is None else result
        point = Point(timestamp, headline(result), tuple(pool_rows(model)))
        keys = gpu_keys(model)
        util = model.gpus.utilization_ratio.astype(np.float32)
        memory = model.gpus.memory_used_bytes.astype(np.float32)
        with self._lock:
            if self._points and timestamp <= self._points[-1].timestamp:
                return self._points[-1]  # same or older observation: keep the series monotonic
            self._points.append(point)
            self._usage.append((timestamp, keys, util, memory))
            while self._usage and self._usage[0][0] < timestamp - self.usage_window_s:
                self._usage.popleft()
        return point

    def extend(self, models: Iterable[ClusterModel]) -> None:
        for model in models:
            self.append(model)

    def points(self) -> list[Point]:
        with self._lock:
            return list(self._points)

    def trend(self) -> pd.DataFrame:
        """One row per observation: `time` (UTC) and the headline measures."""
        points = self.points()
        frame = pd.DataFrame([p.measures for p in points])
        frame.insert(0, "time", pd.to_datetime([p.timestamp for p in points], unit="s", utc=True))
        return frame

    def pool_demand(self) -> pd.DataFrame:
        """Long frame `time, pool, allocated_gpus, capacity_gpus, pending_gpus`."""
        rows = [
            {"time": p.timestamp, **pool}
            for p in self.points()
            for pool in p.pools  # one row per pool per observation
        ]
        frame = pd.DataFrame(
            rows, columns=["time", "pool", "allocated_gpus", "capacity_gpus", "pending_gpus"]
        )
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
