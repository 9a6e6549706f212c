"""When will a running job end? Conditional remaining-time quantiles from similar finished jobs.

Given a job that has run for e hours, the remaining time is drawn from finished jobs of the same
group (e.g. tenant × GPU count) that lasted longer than e; groups with too few such jobs fall back
to all jobs. Pure and distribution-free: the planner reads the quantiles as reservation ends.

The durations are sorted once per group, so a job's "finished jobs that outlived it" is the tail
after a binary search and its quantiles are read off that tail: the service calls this every run
for every running job against thousands of finished ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd


def tail_quantiles(
    sorted_durations: np.ndarray, elapsed: np.ndarray, quantiles: Sequence[float]
) -> tuple[np.ndarray, dict[float, np.ndarray]]:
    """For each elapsed time e: how many durations exceed it, and per level q the q-quantile of
    those durations minus e (numpy's default linear interpolation; NaN when none exceeds e)."""
    d = np.asarray(sorted_durations, float)
    e = np.asarray(elapsed, float)
    start = np.searchsorted(d, e, side="right")
    n = len(d) - start
    out = {}
    for q in quantiles:
        if not len(d):
            out[q] = np.full(len(e), np.nan)
            continue
        pos = start + q * np.maximum(n - 1, 0)
        lo = np.minimum(np.floor(pos).astype(int), len(d) - 1)
        hi = np.minimum(lo + 1, len(d) - 1)
        t = pos - lo
        a, b = d[lo], d[hi]
        # numpy's lerp: from the nearer end, so an exact index gives the exact value
        value = np.where(t < 0.5, a + (b - a) * t, b - (b - a) * (1 - t))
        out[q] = np.where(n > 0, value - e, np.nan)
    return n, out


def predict_job_end(
    running: pd.DataFrame,
    history: pd.DataFrame,
    by: tuple[str, ...] = ("tenant", "gpus"),
    quantiles: Sequence[float] = (0.1, 0.5, 0.9),
    min_jobs: int = 20,
) -> pd.DataFrame:
    """`running`: job, elapsed_h[, by…]; `history`: duration_h[, by…] of finished jobs.

    Returns one row per running job: job, basis (the group used, or "all"), n (jobs in the basis)
    and remaining_q<level> in hours (NaN if no finished job outlived the elapsed time).
    """
    keys = [k for k in by if k in running.columns and k in history.columns]
    elapsed = running["elapsed_h"].to_numpy(float)
    n, remaining = tail_quantiles(
        np.sort(history["duration_h"].to_numpy(float)), elapsed, quantiles
    )
    basis = np.full(len(running), "all", dtype=object)
    if keys and len(running):
        groups = {k: np.sort(g["duration_h"].to_numpy(float)) for k, g in history.groupby(keys)}
        run_keys = list(running[keys].itertuples(index=False, name=None))
        members: dict = {}
        for i, key in enumerate(run_keys):
            members.setdefault(key[0] if len(key) == 1 else key, []).append(i)
        for key, rows in members.items():
            durations = groups.get(key)
            if durations is None:
                continue
            rows = np.asarray(rows)
            n_g, rem_g = tail_quantiles(durations, elapsed[rows], quantiles)
            use = n_g >= min_jobs
            if use.any():
                chosen = rows[use]
                n[chosen] = n_g[use]
                basis[chosen] = str(key)
                for q in quantiles:
                    remaining[q][chosen] = rem_g[q][use]
    out = pd.DataFrame(
        {"job": running["job"].to_numpy(), "elapsed_h": elapsed, "basis": basis, "n": n}
    )
    for q in quantiles:
        out[f"remaining_q{q:g}"] = remaining[q]
    return out
