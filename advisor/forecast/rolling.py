"""Rolling-origin backtest: one origin per step, information ≤ origin, models refit at most daily.

`rolling_forecasts` is the engine shared by model selection (on the training part) and the test.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from advisor.forecast import features as feat
from advisor.forecast import metrics as M
from advisor.forecast import selection
from advisor.forecast.errors import InputError
from advisor.forecast.models import make
from advisor.forecast.panel import Panel
from advisor.forecast.selection import CANDIDATES, RULE, Rule


def _origin_positions(index: pd.DatetimeIndex, start: object, end: object) -> np.ndarray:
    mask = (index >= pd.Timestamp(start)) & (index < pd.Timestamp(end))
    return np.flatnonzero(mask)


def rolling_forecasts(
    panel: Panel,
    model_names: Sequence[str],
    horizons: Sequence[int],
    quantiles: Sequence[float],
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
    capf = pd.DataFrame(cap).ffill().to_numpy()  # known capacity at the target (a covariate)
    within = feat.within_arrays(panel.within, panel.values)  # readings inside each step
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
            model = make(name, quantiles, fitted).fit(y, cap, times, until, horizons, within)
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
                point = model.predict(y, cap, times, b, h, within)
                qs = model.predict_quantiles(y, cap, times, b, h, quantiles, within)
                for j, s in enumerate(panel.series):
                    rec = {
                        "origin": times[b],
                        "series": s,
                        "horizon": h,
                        "model": name,
                        "point": point[:, j],
                        "actual": y[b + h, j],
                        "capacity": capf[b + h, j],
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
    horizons: Sequence[int],
    quantiles: Sequence[float],
    test_start: int,
    val_days: int | None = None,
    candidates: Sequence[str] = CANDIDATES,
    refit_every: int = 72,
    rule: Rule = RULE,
) -> pd.DataFrame:
    """The advisor's picks per series × horizon on the training part only (`select_full`'s
    picks, without its validation forecasts)."""
    return select_full(
        panel, horizons, quantiles, test_start, val_days, candidates, refit_every, rule
    )[0]


def select_full(
    panel: Panel,
    horizons: Sequence[int],
    quantiles: Sequence[float],
    test_start: int,
    val_days: int | None = None,
    candidates: Sequence[str] = CANDIDATES,
    refit_every: int = 72,
    rule: Rule = RULE,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Pick per series × horizon by the advisor's rule (`selection`) on the trailing days of the
    training part only: every validation target lies before `test_start`. Refits every
    `refit_every` origins (every 3 days by default, to keep selection cheap). Returns (picks,
    validation forecasts of every candidate)."""
    val_days = val_days or validation_days(test_start)
    lo = max(24 * 8, test_start - val_days * 24 - max(horizons))
    origins = np.arange(lo, test_start)
    fc = rolling_forecasts(
        panel, candidates, horizons, quantiles, origins, refit_every, max_target=test_start - 1
    )
    picks = selection.choose(fc, rule)
    return selection.complete(picks, panel.series, horizons), fc


def step_of(panel: Panel) -> pd.Timedelta:
    """The panel's grid step (an hour for a one-row panel)."""
    idx = panel.index
    return idx[1] - idx[0] if len(idx) > 1 else pd.Timedelta(hours=1)


def advisor_rows(
    fc: pd.DataFrame,
    picks: pd.DataFrame,
    quantiles: Sequence[float],
    step: pd.Timedelta,
    rule: Rule = RULE,
    known: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """The advisor's forecast at `fc`'s origins: per series × horizon the median of its pick's
    members (`selection.combined`) with split-conformal quantiles (`selection.conformal`) from
    its own errors known at each origin, those of `known` (candidates' rows before `fc`, e.g.
    the validation part) included."""
    earlier = None if known is None or known.empty else selection.combined(known, picks)
    rows = selection.conformal(selection.combined(fc, picks), quantiles, step, rule, known=earlier)
    return rows.assign(model="advisor")


def score(
    fc: pd.DataFrame, panel: Panel, test_start: int, quantiles: Sequence[float] = (0.9,)
) -> pd.DataFrame:
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
            if q > 0.5:  # an upper quantile is what a reservation holds
                rec[f"headroom_{tag}"] = M.headroom(y, g[col]) if col in g else np.nan
        rec["n"] = int(np.isfinite(y).sum())
        out.append(rec)
    return pd.DataFrame(out)


def test_window(
    panel: Panel, test_from: object = None, test_to: object = None, default_days: int = 7
) -> np.ndarray:
    """Origins of the test window (`test_bounds`)."""
    return _origin_positions(panel.index, *test_bounds(panel, test_from, test_to, default_days))


def test_bounds(
    panel: Panel, test_from: object = None, test_to: object = None, default_days: int = 7
) -> tuple[pd.Timestamp, pd.Timestamp]:
    """[start, end) of the test window: explicit, the data set's published split, or the last
    `default_days` whole days (the last day counts when its last hour is there).

    A published split that the data does not reach (a file of other dates in the same format)
    falls back to the last days, so a reader's built-in split never empties a run.
    """
    idx = panel.index
    start = pd.Timestamp(test_from) if test_from else panel.test_from
    end = pd.Timestamp(test_to) if test_to else panel.test_to
    if not test_from and start is not None and not len(_origin_positions(idx, start, end)):
        start, end = None, (pd.Timestamp(test_to) if test_to else None)
    if start is None:
        start = idx[-1].normalize() - pd.Timedelta(days=default_days - 1)
        if start + pd.Timedelta(days=default_days) > idx[-1] + pd.Timedelta(hours=1):
            start -= pd.Timedelta(days=1)
    if end is None:
        end = start + pd.Timedelta(days=default_days)
    return start, end


def _check_targets(panel: Panel, origins: np.ndarray, horizons: Sequence[int]) -> None:
    """Every horizon needs a test origin whose target lies inside the data, or it has nothing to
    score: h = 168 on the default last 7 days never does (a KeyError once, or a horizon missing
    from metrics.csv without a word). Said in one line with the longest horizon that would."""
    room = len(panel.index) - 1 - int(origins[0])  # the earliest test origin looks farthest
    short = [h for h in horizons if h > room]
    if not short:
        return
    longest = f"{room} h" if room > 0 else "none"
    raise InputError(
        f"h = {', '.join(map(str, short))}: no test origin from {panel.index[origins[0]]} has its "
        f"target inside the data (the last hour is {panel.index[-1]}), so nothing could be "
        f"scored (the longest horizon this test part can score: {longest}); ask for fewer "
        "hours ahead or start the test part earlier (--test-from)"
    )


def run(
    panel: Panel,
    horizons: Sequence[int] = (1, 24),
    quantiles: Sequence[float] = (0.5, 0.9),
    test_from: object = None,
    test_to: object = None,
    candidates: Sequence[str] = CANDIDATES,
    rule: Rule = RULE,
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Full protocol on an hourly panel: selection on training, test forecasts, metrics.

    The advisor's quantiles are calibrated at every test origin on its own errors known by then,
    the validation part's first (`advisor_rows`). Returns (metrics, forecasts incl. `advisor`,
    picks).
    """
    start, end = test_bounds(panel, test_from, test_to)
    origins = _origin_positions(panel.index, start, end)
    if not len(origins):
        hint = "" if test_from else " (--test-from sets it)"
        raise InputError(
            f"no hour of the data ({panel.index[0]} … {panel.index[-1]}) lies in the test part "
            f"[{start}, {end}){hint}"
        )
    _check_targets(panel, origins, horizons)
    test_start = int(origins[0])
    picks, val_fc = select_full(
        panel, horizons, quantiles, test_start, candidates=candidates, rule=rule
    )
    fc = rolling_forecasts(panel, candidates, horizons, quantiles, origins)
    adv = advisor_rows(fc, picks, quantiles, step_of(panel), rule, known=val_fc)
    fc = pd.concat([fc, adv[fc.columns.intersection(adv.columns)]], ignore_index=True)
    return score(fc, panel, test_start, quantiles), fc, picks
