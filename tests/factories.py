"""Demand the forecasting tests run on: panels (per pool, model or tenant on an hourly grid) and
the advisor's own run history, built from explicit parameters.

`tests/conftest.py` holds the cluster factory (`add_nodes`); these are its counterpart for
demand. They live apart so that a test session without forecasting (the exporter's tests)
does not load pandas. Every draw comes from `numpy.random.default_rng(seed)`, in a fixed order,
so a test that asserts exact figures keeps them as long as its parameters stay.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from advisor.forecast.panel import Panel


def series_keys(series: int | Sequence[str], prefix: str) -> list[str]:
    """The series names: `prefix0..prefix{n-1}` for a count, else as given."""
    return [f"{prefix}{j}" for j in range(series)] if isinstance(series, int) else list(series)


def demand_panel(
    days: int = 20,
    series: int | Sequence[str] = 2,
    *,
    seed: int = 0,
    freq: str = "h",
    start: str = "2024-01-01",
    capacity: float | Sequence[float] | None = None,
    level: float = 0.5,
    daily_amplitude: float = 0.2,
    trend_per_day: float = 0.0,
    walk_sd: float = 0.6,
    name: str = "synthetic",
) -> Panel:
    """`days` of whole-GPU demand per series (`pool0`, `pool1`, ... for a count) at `freq`:
    `level` and a daily sine of `daily_amplitude` (both shares of the series' capacity), plus
    `trend_per_day` GPUs a day and a random walk of steps N(0, `walk_sd`), rounded and clipped
    to 0..capacity. Capacity is constant per series (default 64, 128, ...: 64 x its rank)."""
    rng = np.random.default_rng(seed)
    steps_per_day = int(pd.Timedelta("1D") / pd.Timedelta(pd.tseries.frequencies.to_offset(freq)))
    n = days * steps_per_day
    idx = pd.date_range(start, periods=n, freq=freq)
    hour = np.asarray(idx.hour + idx.minute / 60)
    trend = trend_per_day * np.arange(n) / steps_per_day
    keys = series_keys(series, "pool")
    if capacity is None:
        caps_of = [64.0 * (j + 1) for j in range(len(keys))]
    elif isinstance(capacity, int | float):
        caps_of = [float(capacity)] * len(keys)
    else:
        caps_of = [float(c) for c in capacity]
    vals, caps = {}, {}
    for key, cap in zip(keys, caps_of, strict=True):
        walk = np.cumsum(rng.normal(0, walk_sd, n))
        y = level * cap + daily_amplitude * cap * np.sin(2 * np.pi * hour / 24) + trend + walk
        vals[key] = np.clip(np.round(y), 0, cap)
        caps[key] = np.full(n, cap)
    return Panel(pd.DataFrame(vals, index=idx), pd.DataFrame(caps, index=idx), name)


def minute_demand_panel(days: int = 14, seed: int = 1) -> Panel:
    """`demand_panel(days)` interpolated to minutes, with minute noise N(0, 1.5) drawn from
    `seed` (a fine-grid input)."""
    hourly = demand_panel(days=days)
    idx = pd.date_range(hourly.index[0], periods=len(hourly.index) * 60, freq="min")
    rng = np.random.default_rng(seed)
    vals = hourly.values.reindex(idx).interpolate(limit_direction="both")
    vals = np.clip(np.round(vals + rng.normal(0, 1.5, vals.shape)), 0, None)
    return Panel(vals, hourly.capacity.reindex(idx).ffill(), "minutes")


def jumping_panel(
    hours: int,
    series: int | Sequence[str],
    *,
    seed: int,
    start: str | pd.Timestamp = "2024-03-04",
    gpus: int = 8,
    prefix: str = "p",
    name: str = "t",
) -> Panel:
    """Hourly use of `gpus`-GPU pools or nodes that jumps to a new whole level at random, more
    often by day (chance 0.15 + 0.1 x a daily sine an hour): the idle-window rules' input."""
    rng = np.random.default_rng(seed)
    index = pd.date_range(start, periods=hours, freq="h")
    day = np.sin(2 * np.pi * np.asarray(index.hour) / 24)
    keys = series_keys(series, prefix)
    values = np.zeros((hours, len(keys)))
    level = rng.integers(0, gpus + 1, len(keys))
    for h in range(hours):
        jump = rng.uniform(size=len(keys)) < 0.15 + 0.1 * day[h]
        level = np.where(jump, rng.integers(0, gpus + 1, len(keys)), level)
        values[h] = level
    return Panel(
        pd.DataFrame(values, index=index, columns=keys),
        pd.DataFrame(float(gpus), index=index, columns=keys),
        name,
    )


def demand_frame(
    hours: int,
    per_hour: int = 4,
    start: str = "2026-01-05",
    *,
    noise_sd: float = 0.0,
    seed: int = 3,
) -> pd.DataFrame:
    """The advisor's run history of one pool (`a100`, 128 GPUs) whose allocation follows a
    daily cycle (40 +/- 30), observed `per_hour` times an hour; with `noise_sd`, plus noise
    N(0, noise_sd) drawn from `seed` (so errors, and intervals, have a width)."""
    times = pd.date_range(start, periods=hours * per_hour, freq=f"{60 // per_hour}min", tz="UTC")
    hour = times.hour.to_numpy()
    allocated = 40 + 30 * np.sin(2 * np.pi * hour / 24)
    frame = pd.DataFrame(
        {
            "time": times,
            "pool": "a100",
            "allocated_gpus": allocated,
            "held_gpus": np.ceil(allocated),  # idle windows count GPUs with any share held
            "capacity_gpus": 128.0,
            "pending_gpus": 0.0,
        }
    )
    if noise_sd:
        frame["allocated_gpus"] += np.random.default_rng(seed).normal(0, noise_sd, len(frame))
    return frame
