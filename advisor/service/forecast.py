"""Per-pool demand forecasts from the advisor's own history, each with its measured backtest.

The history (`advisor.history.History.pool_demand()`) holds allocated GPUs per pool at every
run. Its runs, at their own times, form a Panel that `Panel.resample("h")` (the one hourly
aggregation, as in the backtest) turns into hourly means plus each hour's readings
(`Panel.within`: last reading, min, max, slope); complete hours only, so the result changes
once an hour. An hour with fewer than half the runs expected from the spacing of the runs up
to it is masked (`hourly_panel`). Then for each pool and horizon:

1. rolling-origin forecasts (`advisor.forecast.rolling.rolling_forecasts`, information ≤ origin
   only) of a few cheap candidates over every origin whose target is already observed;
2. the earlier half of those origins picks the model (lowest MAE; it must beat naive by 1 %,
   as in `advisor.forecast.rolling.select`), the later half is held back and scores the pick and the
   seasonal-naive baseline by WAPE;
3. the pick, fitted on everything, forecasts from the last complete hour with its interval.

Backtest, fit and forecast all see the same hourly values and readings inside each hour, so the
pick, its interval and its held-back error come from the same inputs.

A pool/horizon without enough history for both halves gets no forecast at all (design rule:
no forecast is shown without a measured error against seasonal naive on held-back data).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from advisor.forecast import metrics as M
from advisor.forecast.features import within_arrays
from advisor.forecast.io import Panel
from advisor.forecast.models import as_arrays, make
from advisor.forecast.rolling import rolling_forecasts

CANDIDATES: tuple[str, ...] = (
    "naive",
    "last_reading",
    "seasonal_naive_24",
    "same_hour_mean_7d",
    "holt_winters",
)
BASELINE = "seasonal_naive_24"
QUANTILES: tuple[float, ...] = (0.1, 0.5, 0.9)
MIN_HALF = 6  # origins in each of the selection and held-back halves
MAX_ORIGINS = 14 * 24  # bound the backtest's cost on a long history
MIN_COVERAGE = 0.5  # an hour with fewer of its expected runs is masked (as Panel.resample)
SPACING_RUNS = 11  # trailing runs whose median gap sets the spacing (`_covered`)


def hourly_panel(pool_demand: pd.DataFrame) -> Panel | None:
    """Hourly mean allocated GPUs, the readings inside each hour (`within`) and max capacity per
    pool, by `Panel.resample("h")` of the runs at their own times; the hour still running is
    left out. None when there is no complete hour yet.

    The runs are irregular (an interval plus run time, jitter, a backfill one hour apart before
    the live runs, gaps while the source is down), so `resample`'s own rule, which takes one
    spacing for the whole input, would mask every backfilled hour once the live runs dominate.
    Here an hour is masked when it holds fewer than half the runs expected from the spacing of
    the runs up to it (`_covered`); hours without a run stay masked; capacity (the hour's max)
    is carried over them.
    """
    if pool_demand.empty:
        return None
    time = pd.to_datetime(pool_demand["time"], utc=True).dt.tz_localize(None)
    frame = pool_demand.assign(time=time)
    frame = frame[frame["time"] < time.max().floor("h")]  # the hour still running
    if frame.empty:
        return None
    runs_by_pool = (
        frame.groupby(["time", "pool"])
        .agg(allocated=("allocated_gpus", "mean"), capacity=("capacity_gpus", "max"))
        .unstack("pool")
    )
    values, capacity = runs_by_pool["allocated"], runs_by_pool["capacity"]
    values.columns.name = capacity.columns.name = values.index.name = capacity.index.name = None
    runs = Panel(values.astype(float), capacity.astype(float), "advisor")
    hourly = runs.resample("h", min_coverage=0.0)  # every hour with a reading; masked below
    keep = _covered(runs.values, hourly.index)
    return Panel(
        hourly.values.where(keep),
        hourly.capacity.ffill(),
        "advisor",
        within={k: v.where(keep) for k, v in hourly.within.items()},
    )


def _covered(values: pd.DataFrame, hours: pd.DatetimeIndex) -> pd.DataFrame:
    """Per hour and pool: True when the hour holds at least `MIN_COVERAGE` of the runs expected.

    A run's spacing is the median gap between the last `SPACING_RUNS` runs up to it (earlier
    runs only, so an hour's mask never depends on a later hour); an hour expects one hour ÷ the
    median spacing of its runs. A normal hour of runs is kept whatever the interval, a slower
    stretch or a restart; a source outage of more than half an hour masks the hour, and so does
    a lone run inside a long outage (its trailing window still sees the usual spacing).
    """
    seconds = ((values.index - values.index[0]) / pd.Timedelta(seconds=1)).to_numpy(float)
    gaps = pd.Series(np.diff(seconds, prepend=np.nan), index=values.index)
    spacing = gaps.rolling(SPACING_RUNS, min_periods=1).median()
    step = spacing.groupby(values.index.floor("h")).median().reindex(hours)
    expected = (3600.0 / step).fillna(1.0)
    counts = values.notna().resample("h").sum().reindex(hours, fill_value=0)
    need = np.maximum(1.0, MIN_COVERAGE * expected.to_numpy())
    return counts.ge(need, axis=0)


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
    return (
        a.values.equals(b.values)
        and a.capacity.equals(b.capacity)
        and a.within.keys() == b.within.keys()
        and all(a.within[k].equals(b.within[k]) for k in a.within)
    )


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
    within = within_arrays(panel.within, panel.values)  # as rolling_forecasts reads them
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
            model = make(pick, QUANTILES).fit(y, cap, times, last, [h], within)
            at = np.array([last])
            point = model.predict(y, cap, times, at, h, within)[0, j]
            qs = model.predict_quantiles(y, cap, times, at, h, QUANTILES, within)
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
