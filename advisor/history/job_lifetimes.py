"""How long jobs run (`JobLifetimes`): a job seen in one observation and gone from the next has
finished, and its duration goes into a bounded record that `advisor.forecast.job_ends` turns into
predicted ends for the running jobs (`running_jobs`).
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from advisor.model import MILLI, RESERVATION_QOS, UNATTRIBUTED, ClusterModel


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
    gives (NaN when it gives none). A reservation's placeholders are not the job running."""
    allocs = model.allocations
    rows = np.flatnonzero((allocs.node >= 0) & (allocs.qos != RESERVATION_QOS))
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
