"""The pure entry points the service and the app call: forecast, idle windows, backtest, job ends."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from advisor.forecast import features as _feat
from advisor.forecast import rolling as _bt
from advisor.forecast import selection
from advisor.forecast.idle import idle_windows
from advisor.forecast.jobs import predict_job_end
from advisor.forecast.models import make
from advisor.forecast.panel import Panel
from advisor.forecast.readers.long import from_long

__all__ = ["backtest", "forecast", "idle_windows", "predict_job_end"]


def _panel(series: Panel | pd.DataFrame) -> Panel:
    if isinstance(series, Panel):
        return series
    if isinstance(series, pd.DataFrame) and {"time", "series", "value"} <= set(series.columns):
        return from_long(series)
    raise TypeError("pass a Panel or a long frame with time, series, value[, capacity]")


def forecast(
    series: Panel | pd.DataFrame,
    horizons: Sequence[int] = tuple(range(1, 25)),
    quantiles: Sequence[float] = (0.1, 0.5, 0.9),
    model: str = "advisor",
) -> pd.DataFrame:
    """Forecast every series from its last observation: one row per series × horizon.

    The origin is the last hour in which any series is observed; later rows (no value, a
    capacity) are known capacity changes: each forecast is clipped to the capacity at its target
    and the models see the change. Columns: series, origin, horizon, target_time, model,
    q<level>… (clipped to capacity, sorted), capacity (at the target); for the advisor also
    backtest_mae (its validation MAE) beside naive's and seasonal naive's, so no forecast is shown
    without its measured error. `model="advisor"` is the backtest's rule (`selection`): picked
    on the trailing history now, its quantiles calibrated on its own errors there.
    """
    panel = _panel(series)
    y = panel.values.to_numpy(float)
    cap = panel.capacity.reindex_like(panel.values).to_numpy(float)
    within = _feat.within_arrays(panel.within, panel.values)
    times = panel.index
    origin = max(_feat.last_observed(y), 0)
    horizons = tuple(horizons)
    quantiles = tuple(sorted(set(quantiles) | {0.5}))
    qcols = [f"q{q:g}" for q in quantiles]
    step = _bt.step_of(panel)
    capf = pd.DataFrame(cap).ffill().to_numpy()
    if model == "advisor":
        picks, val_fc = _bt.select_full(panel, horizons, quantiles, test_start=origin + 1)
        names = sorted({m for p in picks["pick"] for m in selection.members_of(str(p))})
    else:
        picks, val_fc, names = None, pd.DataFrame(), [model]
    at = np.array([origin])
    candidates = []
    for name in names:
        fitted = make(name, quantiles).fit(y, cap, times, origin, horizons, within)
        for h in horizons:
            point = fitted.predict(y, cap, times, at, h, within)[0]
            qs = fitted.predict_quantiles(y, cap, times, at, h, quantiles, within)
            for j, s in enumerate(panel.series):
                rec = {
                    "origin": times[origin],
                    "series": s,
                    "horizon": h,
                    "model": name,
                    "point": float(point[j]),
                    "actual": np.nan,
                    "capacity": float(capf[min(origin + h, len(capf) - 1), j]),
                }
                rec.update({c: float(qs[q][0, j]) for c, q in zip(qcols, quantiles, strict=True)})
                candidates.append(rec)
    rows = pd.DataFrame(candidates)
    if picks is not None:
        rows = _bt.advisor_rows(rows, picks, quantiles, step, known=val_fc)
        rows = rows.merge(picks, on=["series", "horizon"])
        rows["model"] = "advisor:" + rows["pick"].astype(str)
        for name, column in (
            ("advisor", "backtest_mae"),
            ("naive", "backtest_mae_naive"),
            ("seasonal_naive_24", "backtest_mae_seasonal_naive_24"),
        ):
            rows[column] = rows.get(f"val_mae_{name}", pd.Series(np.nan, index=rows.index))
            rows[column] = rows[column].astype(float)
    rows["target_time"] = rows["origin"] + step * rows["horizon"]
    order = {s: j for j, s in enumerate(panel.series)}
    rows = rows.sort_values(
        ["series", "horizon"], key=lambda c: c.map(order) if c.name == "series" else c
    )
    columns = ["series", "origin", "horizon", "target_time", "model", *qcols, "capacity"]
    if picks is not None:
        columns += ["backtest_mae", "backtest_mae_naive", "backtest_mae_seasonal_naive_24"]
    return rows[columns].reset_index(drop=True)


def backtest(
    series: Panel | pd.DataFrame,
    horizons: Sequence[int] = (1, 24),
    quantiles: Sequence[float] = (0.5, 0.9),
    test_from: object = None,
    test_to: object = None,
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Rolling-origin backtest; returns (metrics, forecasts, picks) — see `backtest.run`."""
    return _bt.run(_panel(series), horizons, quantiles, test_from, test_to)
