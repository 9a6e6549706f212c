"""What each allocation was seen doing, and when it is expected to end: inputs every
recommendation kind shares (reclaim, share, rebalance, reserve, borrow).

- `observe(model, window_s, idle_threshold) -> Observed` — per allocation, over the last
  `window_s` of the usage history (or the latest reading when there is no history): p50/p95/peak
  utilization and peak memory of the GPUs it holds, and how long all of them have been under
  `idle_threshold`. Utilization of a shared GPU is the GPU's, not the holder's.
- `expected_end(model, prior, job_end) -> float64 (A,)` — predicted end time per allocation.
  No job-end forecaster exists yet in `advisor.forecast` (it forecasts pool demand), so the
  order is: an explicit prediction (`job_end` by allocation id, then by job), a known
  `deletion_time` (traces), else a duration prior: Pareto with tail index 2 and median
  `median_s`. For a job that has run `a` seconds, its expected remaining time is
  `sqrt(2)*median - a` while `a < median/sqrt(2)` and `a` after (heavy tail: the longer it has
  run, the longer it is expected to run); unknown start: the prior mean `sqrt(2)*median`.
- `now_of(model)` — the model's time (timestamp, else the last usage sample, else 0).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from advisor.model import ClusterModel


def now_of(model: ClusterModel) -> float:
    if math.isfinite(model.timestamp):
        return float(model.timestamp)
    if len(model.usage.times):
        return float(model.usage.times.max())
    return 0.0


@dataclass(frozen=True)
class Observed:
    """Per allocation (length A); NaN where nothing was observed on its GPUs."""

    util_p50: np.ndarray
    util_p95: np.ndarray
    util_peak: np.ndarray
    memory_peak_bytes: np.ndarray  # peak of the most-used GPU it holds
    memory_total_bytes: np.ndarray  # smallest memory size among its GPUs
    idle_s: np.ndarray  # seconds all its GPUs have been under the threshold (0 = not idle)
    samples: np.ndarray  # int: usage samples seen in the window
    window_s: float


def _alloc_gpu_lists(model: ClusterModel) -> list[np.ndarray]:
    places = model.placements
    order = np.argsort(places.alloc, kind="stable")
    bounds = np.searchsorted(places.alloc[order], np.arange(len(model.allocations) + 1))
    gpus = places.gpu[order]
    return [gpus[bounds[i] : bounds[i + 1]] for i in range(len(model.allocations))]


def observe(
    model: ClusterModel, window_s: float = 4 * 3600.0, idle_threshold: float = 0.05
) -> Observed:
    """Observed usage per allocation over the last `window_s` (see the module docstring)."""
    now = now_of(model)
    usage = model.usage
    if len(usage.times):
        rows = usage.times >= now - window_s
        times = usage.times[rows]
        util = usage.utilization_ratio[rows].astype(np.float64)
        memory = usage.memory_used_bytes[rows].astype(np.float64)
    else:
        times = np.array([now])
        util = model.gpus.utilization_ratio[None, :].astype(np.float64)
        memory = model.gpus.memory_used_bytes[None, :].astype(np.float64)
    idle_since = _idle_since(times, util, idle_threshold, now)
    a = len(model.allocations)
    out = {k: np.full(a, np.nan) for k in ("p50", "p95", "peak", "mem", "total")}
    idle_s = np.zeros(a)
    samples = np.zeros(a, dtype=np.int64)
    start = model.allocations.start_time
    for row, gpus in enumerate(_alloc_gpu_lists(model)):
        if not len(gpus):
            continue
        out["total"][row] = float(np.nanmin(model.gpus.memory_total_bytes[gpus], initial=np.inf))
        block = util[:, gpus]
        seen = ~np.isnan(block)
        samples[row] = int(seen.any(axis=1).sum())
        if seen.any():
            per_time = np.nanmax(np.where(seen, block, -np.inf), axis=1)
            per_time = per_time[np.isfinite(per_time)]
            out["p50"][row] = float(np.percentile(per_time, 50))
            out["p95"][row] = float(np.percentile(per_time, 95))
            out["peak"][row] = float(per_time.max())
        mem = memory[:, gpus]
        if (~np.isnan(mem)).any():
            out["mem"][row] = float(np.nanmax(mem))
        since = float(np.max(idle_since[gpus]))
        if math.isfinite(since):
            if math.isfinite(start[row]):
                since = max(since, float(start[row]))
            idle_s[row] = max(0.0, now - since)
    out["total"][np.isinf(out["total"])] = np.nan
    return Observed(
        util_p50=out["p50"],
        util_p95=out["p95"],
        util_peak=out["peak"],
        memory_peak_bytes=out["mem"],
        memory_total_bytes=out["total"],
        idle_s=idle_s,
        samples=samples,
        window_s=float(window_s),
    )


def _idle_since(times: np.ndarray, util: np.ndarray, threshold: float, now: float) -> np.ndarray:
    """float64 (G): when each GPU's trailing idle run began (inf = not idle now). Missing
    samples neither start nor break a run; a GPU never seen is not idle."""
    t, g = util.shape
    seen = ~np.isnan(util)
    busy = seen & (util >= threshold)
    idx = np.arange(t)[:, None]
    last_busy = np.where(busy, idx, -1).max(axis=0, initial=-1)
    after = seen & (idx > last_busy[None, :])
    first_idle = np.where(after, idx, t).min(axis=0, initial=t)
    out = np.full(g, np.inf)
    ok = first_idle < t
    if t:
        # a run with only one sample at `now` (no history) has length 0: idle now, duration unknown
        out[ok] = times[first_idle[ok]]
    return out


@dataclass(frozen=True)
class DurationPrior:
    """Job durations when nothing better is known: Pareto (tail index 2) with this median."""

    median_s: float = 4 * 3600.0
    min_remaining_s: float = 60.0

    def remaining(self, elapsed: np.ndarray) -> np.ndarray:
        mean = math.sqrt(2.0) * self.median_s
        scale = self.median_s / math.sqrt(2.0)
        rest = np.where(elapsed < scale, mean - elapsed, elapsed)
        rest = np.where(np.isnan(elapsed), mean, rest)
        return np.maximum(rest, self.min_remaining_s)


def expected_end(
    model: ClusterModel,
    prior: DurationPrior = DurationPrior(),
    job_end: Mapping[str, float] | None = None,
) -> np.ndarray:
    """float64 (A): predicted end time per allocation (module docstring: where it comes from)."""
    allocs = model.allocations
    now = now_of(model)
    elapsed = now - allocs.start_time
    end = now + prior.remaining(np.where(elapsed >= 0, elapsed, np.nan))
    known = np.isfinite(allocs.deletion_time) & (allocs.deletion_time > now)
    end = np.where(known, allocs.deletion_time, end)
    if job_end:
        for row, (alloc, job) in enumerate(
            zip(allocs.id.tolist(), allocs.job.tolist(), strict=True)
        ):
            value = job_end.get(alloc, job_end.get(job))
            if value is not None and math.isfinite(value):
                end[row] = max(float(value), now)
    return end


def end_source(
    model: ClusterModel,
    prior: DurationPrior = DurationPrior(),
    job_end: Mapping[str, float] | None = None,
) -> str:
    """One line saying where job ends come from, for the actions' reasons."""
    if job_end:
        return "forecast job ends"
    if np.isfinite(model.allocations.deletion_time).any():
        return "known end times"
    return f"a duration prior (Pareto, median {prior.median_s / 3600:g} h), not a forecast"
