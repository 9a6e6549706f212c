"""Per-pool demand forecasts from the advisor's own history, each with its measured backtest.

The history (`advisor.history.History.pool_demand()`) holds allocated GPUs per pool at every
run. It is averaged onto an hourly grid (complete hours only, so the result changes once an
hour), then for each pool and horizon:

1. rolling-origin forecasts (`advisor.forecast.rolling.rolling_forecasts`, information ≤ origin
   only) of a few cheap candidates over every origin whose target is already observed;
2. the earlier half of those origins picks the model (lowest MAE; it must beat naive by 1 %,
   as in `advisor.forecast.rolling.select`), the later half is held back and scores the pick and the
   seasonal-naive baseline by WAPE;
3. the pick, fitted on everything, forecasts from the last complete hour with its interval.

A pool/horizon without enough history for both halves gets no forecast at all (design rule:
no forecast is shown without a measured error against seasonal naive on held-back data).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from advisor.forecast import metrics as M
from advisor.forecast.io import Panel
from advisor.forecast.models import as_arrays, make
from advisor.forecast.rolling import rolling_forecasts

CANDIDATES: tuple[str, ...] = ("naive", "seasonal_naive_24", "same_hour_mean_7d", "holt_winters")
BASELINE = "seasonal_naive_24"
QUANTILES: tuple[float, ...] = (0.1, 0.5, 0.9)
MIN_HALF = 6  # origins in each of the selection and held-back halves
MAX_ORIGINS = 14 * 24  # bound the backtest's cost on a long history


def hourly_panel(pool_demand: pd.DataFrame) -> Panel | None:
    """Hourly mean allocated GPUs and max capacity per pool; the hour still running is left out.

    None when there is no complete hour yet.
    """
    if pool_demand.empty:
        return None
    frame = pool_demand.copy()
    frame["hour"] = pd.to_datetime(frame["time"], utc=True).dt.floor("h").dt.tz_localize(None)
    current = frame["hour"].max()
    frame = frame[frame["hour"] < current]
    if frame.empty:
        return None
    values = frame.pivot_table(
        index="hour", columns="pool", values="allocated_gpus", aggfunc="mean"
    )
    capacity = frame.pivot_table(
        index="hour", columns="pool", values="capacity_gpus", aggfunc="max"
    )
    grid = pd.date_range(values.index.min(), values.index.max(), freq="h")
    values = values.reindex(grid).astype(float)
    capacity = capacity.reindex(grid).reindex(columns=values.columns).ffill().astype(float)
    values.columns.name = capacity.columns.name = None
    return Panel(values, capacity, "advisor")


def _pick(mae: dict[str, float]) -> str:
    """Lowest validation MAE; anything but naive must beat naive by 1 % (noise guard)."""
    best, best_score = "naive", mae.get("naive", np.inf) * 0.99
    for name in CANDIDATES:
        score = mae.get(name, np.nan)
        if name != "naive" and np.isfinite(score) and score < best_score:
            best, best_score = name, score
    return best


def _horizon_label(hours: int) -> str:
    return f"{hours}h"


def forecast_pools(pool_demand: pd.DataFrame, horizons_h: Sequence[int]) -> dict[str, Any]:
    """The forecast document served at /api/forecast (see the module docstring)."""
    return forecast_panel(hourly_panel(pool_demand), horizons_h)


def same_panel(a: Panel | None, b: Panel | None) -> bool:
    """True when two hourly panels hold the same numbers (the forecast would not change)."""
    if a is None or b is None:
        return a is b
    return a.values.equals(b.values) and a.capacity.equals(b.capacity)


def forecast_panel(panel: Panel | None, horizons_h: Sequence[int]) -> dict[str, Any]:
    """`forecast_pools` on an already built hourly panel."""
    hours = 0 if panel is None else len(panel.index)
    doc: dict[str, Any] = {
        "history_hours": hours,
        "quantiles": list(QUANTILES),
        "baseline": BASELINE,
        "candidates": list(CANDIDATES),
        "pools": [],
    }
    if panel is None:
        doc["origin"] = None
        return doc
    y, cap, times = as_arrays(panel.values, panel.capacity)
    last = len(y) - 1
    doc["origin"] = times[last].isoformat() + "Z"
    by_pool: dict[str, dict[str, Any]] = {
        s: {
            "pool": s,
            "capacity_gpus": _last_finite(cap[:, j]),
            "allocated_gpus": _last_finite(y[:, j]),
            "horizons": [],
        }
        for j, s in enumerate(panel.series)
    }
    for h in sorted(set(horizons_h)):
        origins = np.arange(max(0, last - h - MAX_ORIGINS + 1), last - h + 1)
        if len(origins) < 2 * MIN_HALF:
            for entry in by_pool.values():
                entry["horizons"].append(
                    {
                        "horizon": _horizon_label(h),
                        "available": False,
                        "reason": f"needs {2 * MIN_HALF + h} complete hours of history, "
                        f"has {hours}",
                    }
                )
            continue
        half = len(origins) // 2
        fc = rolling_forecasts(panel, CANDIDATES, [h], QUANTILES, origins)
        fc["err"] = (fc["point"] - fc["actual"]).abs()
        select_until = times[origins[half]]
        for j, series in enumerate(panel.series):
            mine = fc[fc["series"] == series]
            early, late = mine[mine["origin"] < select_until], mine[mine["origin"] >= select_until]
            pick = _pick(early.groupby("model")["err"].mean().to_dict())
            wape = {
                name: _ratio(M.wape(g["actual"].to_numpy(), g["point"].to_numpy()))
                for name, g in late.groupby("model")
                if name in (pick, BASELINE)
            }
            model = make(pick, QUANTILES).fit(y, cap, times, last, [h])
            point = model.predict(y, cap, times, np.array([last]), h)[0, j]
            qs = model.predict_quantiles(y, cap, times, np.array([last]), h, QUANTILES)
            by_pool[series]["horizons"].append(
                {
                    "horizon": _horizon_label(h),
                    "available": True,
                    "target": (times[last] + pd.Timedelta(hours=h)).isoformat() + "Z",
                    "model": pick,
                    "point_gpus": float(point),
                    "quantiles": {f"{q:g}": float(qs[q][0, j]) for q in QUANTILES},
                    "backtest": {
                        "selection_origins": int(half),
                        "test_origins": int(len(origins) - half),
                        "wape_ratio": wape,
                    },
                }
            )
    doc["pools"] = list(by_pool.values())
    return doc


def _last_finite(column: np.ndarray) -> float | None:
    finite = column[np.isfinite(column)]
    return float(finite[-1]) if len(finite) else None


def _ratio(percent: float) -> float | None:
    """metrics.wape is in percent; the contract's unit is a ratio. NaN (no actuals) -> None."""
    return float(percent) / 100.0 if np.isfinite(percent) else None
