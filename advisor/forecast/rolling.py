"""Rolling-origin backtest: one origin per step, information ≤ origin, models refit at most daily.

`rolling_forecasts` is the engine shared by model selection (on the training part) and the test.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from advisor.forecast import metrics as M
from advisor.forecast.io import Panel
from advisor.forecast.models import BASELINES, make

CANDIDATES = (*BASELINES, "gbm", "linear", "combo")


def _origin_positions(index: pd.DatetimeIndex, start, end) -> np.ndarray:
    mask = (index >= pd.Timestamp(start)) & (index < pd.Timestamp(end))
    return np.flatnonzero(mask)


def rolling_forecasts(
    panel: Panel,
    model_names,
    horizons,
    quantiles,
    origins: np.ndarray,
    refit_every: int = 24,
    max_target: int | None = None,
) -> pd.DataFrame:
    """Forecast at every origin position; refit each model every `refit_every` origins (≤ daily).

    A model fitted at position p uses rows ≤ p only and serves origins p … p+refit_every−1.
    Origins whose target lies beyond `max_target` (e.g. inside the test part during selection)
    are dropped, so a validation score never touches test data.
    """
    y = panel.values.to_numpy(float)
    cap = panel.capacity.reindex_like(panel.values).to_numpy(float)
    times = panel.index
    quantiles = tuple(sorted(set(quantiles) | {0.5}))
    rows = []
    blocks = [origins[i : i + refit_every] for i in range(0, len(origins), refit_every)]
    # Members of a combination come first so the combination can reuse them, fitted, per block.
    order = sorted(model_names, key=lambda n: n == "combo")
    for block in blocks:
        until = int(block[0])
        fitted: dict = {}
        for name in order:
            model = make(name, quantiles, fitted).fit(y, cap, times, until, horizons)
            fitted[name] = model
        for name in model_names:
            model = fitted[name]
            for h in horizons:
                ok = block + h < len(y)
                if max_target is not None:
                    ok &= block + h <= max_target
                b = block[ok]
                if not len(b):
                    continue
                point = model.predict(y, cap, times, b, h)
                qs = model.predict_quantiles(y, cap, times, b, h, quantiles)
                for j, s in enumerate(panel.series):
                    rec = {
                        "origin": times[b],
                        "series": s,
                        "horizon": h,
                        "model": name,
                        "point": point[:, j],
                        "actual": y[b + h, j],
                    }
                    for q in quantiles:
                        rec[f"q{q:g}"] = qs[q][:, j]
                    rows.append(pd.DataFrame(rec))
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()


def validation_days(test_start: int, min_fit_days: int = 14, most: int = 21, least: int = 5) -> int:
    """As many trailing training days as possible (≤ `most`) while leaving `min_fit_days` to fit on."""
    return int(max(least, min(most, test_start // 24 - min_fit_days)))


def select(
    panel: Panel,
    horizons,
    quantiles,
    test_start: int,
    val_days: int | None = None,
    candidates=CANDIDATES,
    refit_every: int = 72,
    criterion: str = "mae",
) -> pd.DataFrame:
    """Pick a model per series × horizon by MAE on the trailing days of the training part only.

    Every validation target lies before `test_start`; a candidate must beat naive by ≥ 1 % MAE to be
    chosen (ties go to the simpler model), so noise in a short window does not pick a worse model.
    Refits every `refit_every` origins (every 3 days by default, to keep selection cheap).
    """
    val_days = val_days or validation_days(test_start)
    lo = max(24 * 8, test_start - val_days * 24 - max(horizons))
    origins = np.arange(lo, test_start)
    fc = rolling_forecasts(
        panel, candidates, horizons, quantiles, origins, refit_every, max_target=test_start - 1
    )
    return pick_models(fc, candidates, quantiles, criterion)


def pick_models(
    fc: pd.DataFrame, candidates, quantiles, criterion: str = "mae", fold_hours: int = 72
) -> pd.DataFrame:
    """Pick per series × horizon from validation forecasts.

    criterion "mae": lowest MAE over the whole window; "mean_rank": lowest mean rank over
    consecutive `fold_hours` folds (consistently good beats good in one calm stretch). Naive is kept
    unless beaten by ≥ 1 %. Each other quantile's source is picked the same way by pinball loss.
    """
    from advisor.forecast import metrics as M

    if fc.empty:  # nothing could be validated (history too short for these horizons)
        return pd.DataFrame(columns=["series", "horizon", "pick"])
    picks = []
    for (s, h), g in fc.groupby(["series", "horizon"], sort=True):
        g = g.assign(fold=(g["origin"] - g["origin"].min()) // pd.Timedelta(hours=fold_hours))
        rec = {"series": s, "horizon": h}

        def score(loss_fn, g=g) -> dict[str, float]:
            table = (
                g.groupby(["fold", "model"]).apply(loss_fn, include_groups=False).unstack("model")
            )
            if criterion == "mean_rank":
                ranks = table.rank(axis=1)
                # naive's 1 % advantage: compare others against 0.99 × naive in each fold
                return (ranks.mean() * np.where(ranks.columns == "naive", 0.99, 1.0)).to_dict()
            return g.groupby("model").apply(loss_fn, include_groups=False).to_dict()

        mae = score(lambda d: M.mae(d["actual"], d["point"]))
        rec["pick"] = _best(mae, candidates)
        for q in sorted(set(quantiles) - {0.5}):
            col = f"q{q:g}"
            loss = score(lambda d, col=col, q=q: M.pinball(d["actual"], d[col], q))
            rec[f"pick_{col}"] = _best(loss, candidates)
        rec.update({f"val_{criterion}_{m}": v for m, v in mae.items()})
        picks.append(rec)
    return pd.DataFrame(picks)


def _best(score: dict[str, float], candidates) -> str:
    best, best_score = "naive", score.get("naive", np.inf) * 0.99
    for name in candidates:
        v = score.get(name, np.nan)
        if name != "naive" and np.isfinite(v) and v < best_score:
            best, best_score = name, v
    return best


def advisor_rows(fc: pd.DataFrame, picks: pd.DataFrame) -> pd.DataFrame:
    """The advisor's forecast: per series × horizon the point (and median) of the model picked on
    the training part, each other quantile from its own pick; quantiles re-sorted so none cross."""
    key = ["origin", "series", "horizon"]
    chosen = fc.merge(picks[["series", "horizon", "pick"]], on=["series", "horizon"])
    out = chosen[chosen["model"] == chosen["pick"]].drop(columns="pick").set_index(key)
    qcols = sorted(c for c in fc.columns if c.startswith("q"))
    for col in qcols:
        pcol = f"pick_{col}"
        if pcol not in picks.columns:
            continue
        src = fc.merge(picks[["series", "horizon", pcol]], on=["series", "horizon"])
        src = src[src["model"] == src[pcol]].set_index(key)[col]
        out[col] = src.reindex(out.index)
    if qcols:
        levels = sorted(qcols, key=lambda c: float(c[1:]))
        out[levels] = np.sort(out[levels].to_numpy(), axis=1)
    return out.reset_index().assign(model="advisor")


def score(fc: pd.DataFrame, panel: Panel, test_start: int, quantiles=(0.9,)) -> pd.DataFrame:
    """Per series × horizon × model metrics (the columns of metrics.csv, plus extra quantiles)."""
    scales = {s: M.mase_scale(panel.values[s].to_numpy(float)[:test_start]) for s in panel.series}
    out = []
    for (s, h, m), g in fc.groupby(["series", "horizon", "model"], sort=False):
        y, f = g["actual"].to_numpy(), g["point"].to_numpy()
        rec = {
            "series": s,
            "horizon": h,
            "model": m,
            "mae": M.mae(y, f),
            "rmse": M.rmse(y, f),
            "wape": M.wape(y, f),
            "smape": M.smape(y, f),
            "mase": M.mase(y, f, scales[s]),
        }
        for q in sorted(set(quantiles) | {0.9}):
            col = f"q{q:g}"
            tag = f"q{round(q * 100):d}"
            rec[f"pinball_{tag}"] = M.pinball(y, g[col], q) if col in g else np.nan
            rec[f"coverage_{tag}"] = M.coverage(y, g[col]) if col in g else np.nan
        rec["n"] = int(np.isfinite(y).sum())
        out.append(rec)
    return pd.DataFrame(out)


def test_window(panel: Panel, test_from=None, test_to=None, default_days: int = 7):
    """Origins of the test window: explicit, the data set's published split, or the last days."""
    idx = panel.index
    start = pd.Timestamp(test_from) if test_from else panel.test_from
    end = pd.Timestamp(test_to) if test_to else panel.test_to
    if start is None:
        start = idx[-1].normalize() - pd.Timedelta(days=default_days - 1)
        if start + pd.Timedelta(days=default_days) > idx[-1] + pd.Timedelta(hours=1):
            start -= pd.Timedelta(days=1)
    if end is None:
        end = start + pd.Timedelta(days=default_days)
    return _origin_positions(idx, start, end)


def run(
    panel: Panel,
    horizons=(1, 24),
    quantiles=(0.5, 0.9),
    test_from=None,
    test_to=None,
    candidates=CANDIDATES,
    criterion: str = "mae",
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Full protocol on an hourly panel: selection on training, test forecasts, metrics.

    Returns (metrics, forecasts incl. `advisor`, picks).
    """
    origins = test_window(panel, test_from, test_to)
    if not len(origins):
        raise ValueError("empty test window")
    test_start = int(origins[0])
    picks = select(
        panel, horizons, quantiles, test_start, candidates=candidates, criterion=criterion
    )
    fc = rolling_forecasts(panel, candidates, horizons, quantiles, origins)
    fc = pd.concat([fc, advisor_rows(fc, picks)], ignore_index=True)
    return score(fc, panel, test_start, quantiles), fc, picks
