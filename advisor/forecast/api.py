"""The pure entry points the service and the app call: forecast, idle windows, backtest, job ends."""

from __future__ import annotations

import numpy as np
import pandas as pd

from advisor.forecast import rolling as _bt
from advisor.forecast.idle import idle_windows
from advisor.forecast.io import Panel, from_long
from advisor.forecast.jobs import predict_job_end
from advisor.forecast.models import make

__all__ = ["backtest", "forecast", "idle_windows", "predict_job_end"]


def _panel(series) -> Panel:
    if isinstance(series, Panel):
        return series
    if isinstance(series, pd.DataFrame) and {"time", "series", "value"} <= set(series.columns):
        return from_long(series)
    raise TypeError("pass a Panel or a long frame with time, series, value[, capacity]")


def forecast(
    series,
    horizons=tuple(range(1, 25)),
    quantiles=(0.1, 0.5, 0.9),
    model: str = "advisor",
    picks: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Forecast every series from its last observation: one row per series × horizon.

    Columns: series, origin, horizon, target_time, model, q<level>… (clipped to capacity, sorted),
    capacity. `model="advisor"` uses the per-series pick (from `picks`, or chosen now by a backtest
    on the last week of history).
    """
    panel = _panel(series)
    y = panel.values.to_numpy(float)
    cap = panel.capacity.reindex_like(panel.values).to_numpy(float)
    times = panel.index
    origin = len(y) - 1
    horizons = tuple(horizons)
    quantiles = tuple(sorted(set(quantiles) | {0.5}))
    if model == "advisor":
        if picks is None:
            picks = _bt.select(panel, horizons, quantiles, test_start=len(y))
        chosen = {(r.series, int(r.horizon)): r.pick for r in picks.itertuples()}
    else:
        chosen = {(s, h): model for s in panel.series for h in horizons}
    step = times[1] - times[0] if len(times) > 1 else pd.Timedelta(hours=1)
    capf = pd.DataFrame(cap).ffill().to_numpy()
    rows = []
    for name in sorted(set(chosen.values())):
        m = make(name, quantiles).fit(y, cap, times, origin, horizons)
        for h in horizons:
            qs = m.predict_quantiles(y, cap, times, np.array([origin]), h, quantiles)
            for j, s in enumerate(panel.series):
                if chosen.get((s, h), "naive") != name:
                    continue
                rec = {
                    "series": s,
                    "origin": times[origin],
                    "horizon": h,
                    "target_time": times[origin] + step * h,
                    "model": name if model != "advisor" else f"advisor:{name}",
                }
                rec.update({f"q{q:g}": float(qs[q][0, j]) for q in quantiles})
                rec["capacity"] = float(capf[origin, j])
                rows.append(rec)
    return pd.DataFrame(rows).sort_values(["series", "horizon"]).reset_index(drop=True)


def backtest(series, horizons=(1, 24), quantiles=(0.5, 0.9), test_from=None, test_to=None):
    """Rolling-origin backtest; returns (metrics, forecasts, picks) — see `backtest.run`."""
    return _bt.run(_panel(series), horizons, quantiles, test_from, test_to)
