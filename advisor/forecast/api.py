"""The pure entry points the service and the app call: forecast, idle windows, backtest, job ends."""

from __future__ import annotations

import numpy as np
import pandas as pd

from advisor.forecast import features as _feat
from advisor.forecast import rolling as _bt
from advisor.forecast.idle import idle_windows
from advisor.forecast.io import Panel, from_long
from advisor.forecast.jobs import predict_job_end
from advisor.forecast.models import make, sort_known

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

    The origin is the last hour in which any series is observed; later rows (no value, a
    capacity) are known capacity changes: each forecast is clipped to the capacity at its target
    and the models see the change. Columns: series, origin, horizon, target_time, model,
    q<level>… (clipped to capacity, sorted), capacity (at the target); for the advisor also
    backtest_mae (its validation MAE) beside naive's and seasonal naive's, so no forecast is shown
    without its measured error. `model="advisor"` uses the per-series picks (from `picks`, or
    chosen now by a backtest on the trailing history).
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
    if model == "advisor":
        if picks is None:
            picks = _bt.select(panel, horizons, quantiles, test_start=origin + 1)
        source = {}
        for r in picks.to_dict("records"):
            key = (r["series"], int(r["horizon"]))
            source[(*key, "point")] = r["pick"]
            for col in qcols:
                q_pick = r.get(f"pick_{col}")
                source[(*key, col)] = q_pick if isinstance(q_pick, str) else r["pick"]
    else:
        source = {
            (s, h, c): model for s in panel.series for h in horizons for c in ("point", *qcols)
        }
    for s_name in panel.series:  # a horizon too long to validate on the history: naive
        for h in horizons:
            for c in ("point", *qcols):
                source.setdefault((s_name, h, c), "naive")
    step = times[1] - times[0] if len(times) > 1 else pd.Timedelta(hours=1)
    capf = pd.DataFrame(cap).ffill().to_numpy()
    values: dict[tuple[str, int], dict[str, np.ndarray]] = {}
    for name in sorted(set(source.values())):
        m = make(name, quantiles).fit(y, cap, times, origin, horizons, within)
        for h in horizons:
            qs = m.predict_quantiles(y, cap, times, np.array([origin]), h, quantiles, within)
            values[(name, h)] = {f"q{q:g}": qs[q][0] for q in quantiles}
    val = picks.set_index(["series", "horizon"]) if model == "advisor" else None
    rows = []
    for j, s in enumerate(panel.series):
        for h in horizons:
            pick = source[(s, h, "point")]
            levels = [values[(source[(s, h, c)], h)][c][j] for c in qcols]
            if model == "advisor":
                # the median is the picked point model's; the other levels come from their picks,
                # never on the wrong side of that median (as the backtest's `advisor_rows`)
                own = values[(pick, h)]
                levels = [
                    own[c][j]
                    if c == "q0.5"
                    else _bt.coherent_quantile(float(c[1:]), v, own[c][j], own["q0.5"][j])
                    for c, v in zip(qcols, levels, strict=True)
                ]
            # sorted with a missing level (no interval: too few errors) left in its place
            qv = sort_known(levels)
            rec = {
                "series": s,
                "origin": times[origin],
                "horizon": h,
                "target_time": times[origin] + step * h,
                "model": f"advisor:{pick}" if model == "advisor" else pick,
            }
            rec.update({c: float(v) for c, v in zip(qcols, qv, strict=True)})
            rec["capacity"] = float(capf[min(origin + h, len(capf) - 1), j])
            if val is not None:
                # the measured error behind the forecast (validation part of the history)
                r = val.loc[(s, h)] if (s, h) in val.index else pd.Series(dtype=float)
                rec["backtest_mae"] = float(r.get(f"val_mae_{pick}", np.nan))
                rec["backtest_mae_naive"] = float(r.get("val_mae_naive", np.nan))
                rec["backtest_mae_seasonal_naive_24"] = float(
                    r.get("val_mae_seasonal_naive_24", np.nan)
                )
            rows.append(rec)
    return pd.DataFrame(rows)


def backtest(series, horizons=(1, 24), quantiles=(0.5, 0.9), test_from=None, test_to=None):
    """Rolling-origin backtest; returns (metrics, forecasts, picks) — see `backtest.run`."""
    return _bt.run(_panel(series), horizons, quantiles, test_from, test_to)
