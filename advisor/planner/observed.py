"""What each allocation was seen doing, and when it is expected to end: inputs every
recommendation kind shares (reclaim, share, rebalance, reserve, borrow).

- `observe(model, window_s, idle_threshold) -> Observed` — per allocation, over the last
  `window_s` of the usage history (or the latest reading when there is no history): p50/p95/peak
  utilization and peak memory of the GPUs it holds, and how long all of them have been under
  `idle_threshold`. Utilization of a shared GPU is the GPU's, not the holder's. Utilization
  figures are read at the float32 history's own precision (`float32_decimal`: its 0.4 is 0.4).
- `expected_end(model, prior, job_end) -> float64 (A,)` — predicted end time per allocation.
  The order is: an explicit prediction (`job_end` by allocation id, then by job: the service
  passes the ends `advisor.forecast.job_ends` derives with `advisor.forecast.predict_job_end`
  from the jobs it saw finish), a known `deletion_time` (traces), else a duration prior:
  Pareto with tail index 2 and median `median_s`. For a job that has run `a` seconds, its expected remaining time is
  `sqrt(2)*median - a` while `a < median/sqrt(2)` and `a` after (heavy tail: the longer it has
  run, the longer it is expected to run); unknown start: the prior mean `sqrt(2)*median`.
- `now_of(model)` — the model's time (timestamp, else the last usage sample, else 0).
- `history_s(model, window_s)` — how far back the usage history inside the window reaches (0:
  none, only the latest reading); `HISTORY_HINT` says how to read a source with history.
"""

from __future__ import annotations

import math
import warnings
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


HISTORY_HINT = (
    "read the source with usage history (history=24h on a prometheus+ source; on a sim: source "
    "also t at least the history, as its past starts at t=0: sim:a100-16x8?t=2d&history=24h; "
    "docs/analyze.md; or a snapshot that carries usage)"
)


def history_s(model: ClusterModel, window_s: float = math.inf) -> float:
    """Seconds from the earliest usage sample within `window_s` before the model's time to that
    time: 0 without history (a lone reading says nothing about how long anything lasted)."""
    times = model.usage.times
    now = now_of(model)
    times = times[times >= now - window_s] if len(times) else times
    return max(0.0, now - float(times.min())) if len(times) else 0.0


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


def observe(
    model: ClusterModel, window_s: float = 4 * 3600.0, idle_threshold: float = 0.05
) -> Observed:
    """Observed usage per allocation over the last `window_s` (see the module docstring).

    Vectorised over placements: per time step, an allocation's utilization is the most-used of
    its GPUs (`maximum.reduceat` over placements sorted by allocation)."""
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
    places = model.placements
    if len(places):
        order = np.argsort(places.alloc, kind="stable")
        gpus, owner = places.gpu[order], places.alloc[order]
        starts = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])
        rows_of = owner[starts]
        total = np.nan_to_num(model.gpus.memory_total_bytes[gpus], nan=np.inf)
        smallest = np.minimum.reduceat(total, starts)
        out["total"][rows_of] = np.where(np.isinf(smallest), np.nan, smallest)
    if len(places) and len(times):
        per_time = _reduce_max(util[:, gpus], starts)  # (T, A') NaN where nothing seen
        seen = ~np.isnan(per_time)
        samples[rows_of] = seen.sum(axis=0)
        has = seen.any(axis=0)
        ordered = np.sort(per_time[:, has], axis=0)  # NaN sorts last
        for key, q in (("p50", 50), ("p95", 95)):
            out[key][rows_of[has]] = _percentile_sorted(ordered, seen[:, has].sum(axis=0), q)
        out["peak"][rows_of[has]] = np.nanmax(per_time[:, has], axis=0)
        mem = _reduce_max(memory[:, gpus], starts)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns stay NaN
            out["mem"][rows_of] = np.nanmax(mem, axis=0)
        since = np.maximum.reduceat(idle_since[gpus], starts)
        start = model.allocations.start_time[rows_of]
        since = np.where(np.isfinite(start), np.maximum(since, start), since)
        idle_s[rows_of] = np.where(np.isfinite(since), np.maximum(0.0, now - since), 0.0)
    return Observed(
        util_p50=float32_decimal(out["p50"]),
        util_p95=float32_decimal(out["p95"]),
        util_peak=float32_decimal(out["peak"]),
        memory_peak_bytes=out["mem"],
        memory_total_bytes=out["total"],
        idle_s=idle_s,
        samples=samples,
        window_s=float(window_s),
    )


def float32_decimal(values: np.ndarray) -> np.ndarray:
    """float64 of the shortest decimal each value's float32 reads as: 0.4 for the float32
    0.4000000059604645. The usage history is float32 (`model.Usage`), so its 0.4 arrives in
    float64 one float32 step above 0.4, and a size rounded up to a 0.05 step (`share._up`)
    went one step too far (0.45 guaranteed, 0.55 limit). A float32 holds about 7 significant
    digits; nothing below them was ever observed, so dropping them loses nothing."""
    return np.asarray(values, dtype=np.float32).astype(str).astype(np.float64)


def _percentile_sorted(ordered: np.ndarray, counts: np.ndarray, q: float) -> np.ndarray:
    """Per column, the q-th percentile (numpy's linear method) of the first `counts` values of
    each column of `ordered` (sorted, NaN last); every count is at least 1."""
    pos = (counts - 1) * (q / 100.0)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, counts - 1)
    cols = np.arange(ordered.shape[1])
    low, high = ordered[lo, cols], ordered[hi, cols]
    return low + (high - low) * (pos - lo)


def _reduce_max(block: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Column groups starting at `starts` -> their max per row, ignoring NaN (all NaN: NaN)."""
    filled = np.where(np.isnan(block), -np.inf, block)
    out = np.maximum.reduceat(filled, starts, axis=1)
    return np.where(np.isneginf(out), np.nan, out)


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
    end = np.where(known_deletion(model), allocs.deletion_time, end)
    if job_end:
        for row, (alloc, job) in enumerate(
            zip(allocs.id.tolist(), allocs.job.tolist(), strict=True)
        ):
            value = job_end.get(alloc, job_end.get(job))
            if value is not None and math.isfinite(value):
                end[row] = max(float(value), now)
    return end


def known_deletion(model: ClusterModel) -> np.ndarray:
    """bool (A): the source gives the allocation's deletion time, still ahead of the model's
    time: that time is its end, before any prior or learned end."""
    deletion = model.allocations.deletion_time
    return np.isfinite(deletion) & (deletion > now_of(model))


def end_source(
    model: ClusterModel,
    prior: DurationPrior = DurationPrior(),
    job_end: Mapping[str, float] | None = None,
) -> str:
    """One line saying where job ends come from, for the actions' reasons. With `job_end`,
    "forecast job ends" even where it covers only some allocations (the rest keep the order
    above; the service's recommendations document counts how many were covered)."""
    if job_end:
        return "forecast job ends"
    if np.isfinite(model.allocations.deletion_time).any():
        return "known end times"
    return f"a duration prior (Pareto, median {prior.median_s / 3600:g} h), not a forecast"
