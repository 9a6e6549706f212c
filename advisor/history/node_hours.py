"""Per node, hours rather than runs (`NodeRecord`, `NodeHours`): for each of the last
`NODE_HOURS` hours the node's peak held GPUs (usable GPUs with anything allocated on them), its
largest usable capacity, and in how many of the hour's runs it was seen, beside the times of the
hour's runs; the per-node idle windows (`advisor.forecast.runs.node_panel`) are built from that.
Idle windows count held GPUs rather than the allocated share: a GPU with a tenth of it handed out
cannot be reserved, powered off or given to a whole-GPU job, so the share left on it is no free
GPU.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from advisor.model import MILLI, ClusterModel
from advisor.settings import NO_POOL


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
