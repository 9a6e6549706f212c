"""What one replay measured: the summary row, the waits per job size and the allocation curve.

Pure functions of a finished `Simulation`. Waits are start minus submission, in seconds, over
the jobs that started (a job no node of the cluster could ever host is counted apart, in
`never_fit`, never as a wait). A job's size is the GPUs it asks for (tasks x GPUs per task; a
share of one GPU is size 1, a CPU-only job size 0); "big" is at least `BIG_GPUS`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from advisor.simulate.engine import BIG_GPUS, DAY, Simulation

SUMMARY_COLUMNS = (
    "policy",
    "advisor",
    "seed",
    "jobs",
    "wait_p50_s",
    "wait_p90_s",
    "wait_p90_s_big",
    "wait_gpu_hours",
    "alloc_ratio",
    "migrations",
    "moved_pct_per_day",
    "restart_gpu_hours",
    "held_gpu_hours",
    "big_wait_capacity_pct",
)
BY_SIZE_COLUMNS = (
    "policy",
    "advisor",
    "seed",
    "size_gpus",
    "jobs",
    "wait_mean_s",
    "wait_p50_s",
    "wait_p90_s",
    "wait_p99_s",
    "wait_max_s",
    "wait_gpu_hours",
)


def size_label(size: int, share: bool) -> str:
    """The per-size table's label: "<1" for a share of one GPU, "cpu" for CPU-only jobs."""
    if size == 0:
        return "cpu"
    return "<1" if share else str(size)


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if values.size else math.nan


def summary_row(sim: Simulation, policy: str, advisor: str, seed: int) -> dict[str, Any]:
    jobs = sim.jobs
    waits = sim.waits()
    started = ~np.isnan(waits)
    big = started & (jobs.size_gpus >= BIG_GPUS)
    days = sim.task_days()
    return {
        "policy": policy,
        "advisor": advisor,
        "seed": seed,
        "jobs": int(started.sum()),
        "wait_p50_s": round(_pct(waits[started], 50), 1),
        "wait_p90_s": round(_pct(waits[started], 90), 1),
        "wait_p90_s_big": round(_pct(waits[big], 90), 1),
        "wait_gpu_hours": round(float((jobs.gpus[started] * waits[started]).sum()) / 3600, 2),
        "alloc_ratio": round(sim.alloc_ratio(), 4),
        "migrations": len(sim.moves),
        "moved_pct_per_day": round(100.0 * len(sim.moves) / days, 4) if days else 0.0,
        "restart_gpu_hours": round(sim.restart_gpu_s / 3600, 2),
        "held_gpu_hours": round(sim.held_area / 3600, 2),
        "big_wait_capacity_pct": _capacity_pct(sim),
    }


def _capacity_pct(sim: Simulation) -> float:
    """Of the time big jobs waited, the share (%) in which the cluster lacked the free GPUs
    altogether (`Simulation._why_big_jobs_wait`); NaN when no big job waited."""
    total = sum(sim.big_wait_s.values())
    return round(100.0 * sim.big_wait_s["capacity"] / total, 1) if total else math.nan


def by_size_rows(sim: Simulation, policy: str, advisor: str, seed: int) -> list[dict[str, Any]]:
    jobs = sim.jobs
    waits = sim.waits()
    started = ~np.isnan(waits)
    share = (jobs.num_nodes == 1) & (jobs.num_gpu == 1) & (jobs.gpu_milli < 1000)
    labels = np.array(
        [size_label(int(s), bool(h)) for s, h in zip(jobs.size_gpus, share, strict=True)],
        dtype=object,
    )
    rows = []
    for label in sorted(set(labels[started].tolist()), key=_label_order):
        on = started & (labels == label)
        w = waits[on]
        rows.append(
            {
                "policy": policy,
                "advisor": advisor,
                "seed": seed,
                "size_gpus": label,
                "jobs": int(on.sum()),
                "wait_mean_s": round(float(w.mean()), 1),
                "wait_p50_s": round(_pct(w, 50), 1),
                "wait_p90_s": round(_pct(w, 90), 1),
                "wait_p99_s": round(_pct(w, 99), 1),
                "wait_max_s": round(float(w.max()), 1),
                "wait_gpu_hours": round(float((jobs.gpus[on] * w).sum()) / 3600, 2),
            }
        )
    return rows


def _label_order(label: str) -> float:
    return {"cpu": -1.0, "<1": 0.5}.get(label, float(label) if label.isdigit() else math.inf)


def allocation_curve(sim: Simulation) -> np.ndarray:
    """(T, 4): hours since the first submission, allocated GPUs, held GPUs, waiting GPUs."""
    t = np.array(sim.timeline, dtype=np.float64).reshape(-1, 4)
    t[:, 0] = (t[:, 0] - sim.origin) / 3600.0
    return t


__all__ = ["BY_SIZE_COLUMNS", "DAY", "SUMMARY_COLUMNS", "by_size_rows", "summary_row"]
