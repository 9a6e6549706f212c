"""When will a running job end? Conditional remaining-time quantiles from similar finished jobs.

Given a job that has run for e hours, the remaining time is drawn from finished jobs of the same
group (e.g. tenant × GPU count) that lasted longer than e; groups with too few such jobs fall back
to all jobs. Pure and distribution-free: the planner reads the quantiles as reservation ends.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def predict_job_end(
    running: pd.DataFrame,
    history: pd.DataFrame,
    by: tuple[str, ...] = ("tenant", "gpus"),
    quantiles=(0.1, 0.5, 0.9),
    min_jobs: int = 20,
) -> pd.DataFrame:
    """`running`: job, elapsed_h[, by…]; `history`: duration_h[, by…] of finished jobs.

    Returns one row per running job: job, basis (the group used, or "all"), n (jobs in the basis)
    and remaining_q<level> in hours (NaN if no finished job outlived the elapsed time).
    """
    keys = [k for k in by if k in running.columns and k in history.columns]
    dur_all = history["duration_h"].to_numpy(float)
    groups = {k: g["duration_h"].to_numpy(float) for k, g in history.groupby(keys)} if keys else {}
    out = []
    for job in running.itertuples(index=False):
        e = float(job.elapsed_h)
        key = tuple(getattr(job, k) for k in keys)
        key = key[0] if len(key) == 1 else key
        basis, durations = "all", dur_all
        cand = groups.get(key)
        if cand is not None and np.sum(cand > e) >= min_jobs:
            basis, durations = str(key), cand
        longer = durations[durations > e]
        rec = {"job": job.job, "elapsed_h": e, "basis": basis, "n": len(longer)}
        for q in quantiles:
            rec[f"remaining_q{q:g}"] = float(np.quantile(longer, q) - e) if len(longer) else np.nan
        out.append(rec)
    return pd.DataFrame(out)
