"""Small synthetic panels for the forecasting tests (daily cycle + random walk, known capacity)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from advisor.forecast.panel import Panel


def synthetic_panel(days: int = 20, n_series: int = 2, seed: int = 0, freq: str = "h") -> Panel:
    rng = np.random.default_rng(seed)
    steps_per_day = int(pd.Timedelta("1D") / pd.Timedelta(pd.tseries.frequencies.to_offset(freq)))
    n = days * steps_per_day
    idx = pd.date_range("2024-01-01", periods=n, freq=freq)
    hour = np.asarray(idx.hour + idx.minute / 60)
    vals, caps = {}, {}
    for j in range(n_series):
        cap = 64.0 * (j + 1)
        walk = np.cumsum(rng.normal(0, 0.6, n))
        y = 0.5 * cap + 0.2 * cap * np.sin(2 * np.pi * hour / 24) + walk
        vals[f"pool{j}"] = np.clip(np.round(y), 0, cap)
        caps[f"pool{j}"] = np.full(n, cap)
    return Panel(pd.DataFrame(vals, index=idx), pd.DataFrame(caps, index=idx), "synthetic")
