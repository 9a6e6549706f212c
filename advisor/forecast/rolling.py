"""Rolling-origin backtest: one origin per step, information ≤ origin, models refit at most daily.

`rolling_forecasts` is the engine shared by model selection (on the training part) and the test.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from advisor.forecast import features as feat
from advisor.forecast import metrics as M
from advisor.forecast.io import InputError, Panel
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
    horizons,
    quantiles,
    test_start: int,
    val_days: int | None = None,
    candidates=CANDIDATES,
    refit_every: int = 72,
    criterion: str = "mae",
    calibrate: str = "none",
) -> pd.DataFrame:
    """Pick a model per series × horizon by MAE on the trailing days of the training part only
    (the picks of `select_full`, without its validation forecasts)."""
    return select_full(
        panel,
        horizons,
        quantiles,
        test_start,
        val_days,
        candidates,
        refit_every,
        criterion,
        calibrate,
    )[0]


def select_full(
    panel: Panel,
    horizons,
    quantiles,
    test_start: int,
    val_days: int | None = None,
    candidates=CANDIDATES,
    refit_every: int = 72,
    criterion: str = "mae",
    calibrate: str = "none",
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Pick a model per series × horizon by MAE on the trailing days of the training part only.

    Every validation target lies before `test_start`; a candidate must beat naive by ≥ 1 % MAE to be
    chosen (ties go to the simpler model), so noise in a short window does not pick a worse model;
    when the best is not naive, among the candidates within one standard error (days as blocks)
    of it the one with the steadiest daily MAE is chosen (`_steady_pick`). Refits every
    `refit_every` origins (every 3 days by default, to keep selection cheap).
    With `calibrate` ("conformal" or "adaptive", see `CALIBRATIONS`) each quantile other than the
    median also gets a calibrated source (`pick_calibrated`). Returns (picks, validation forecasts).
    """
    val_days = val_days or validation_days(test_start)
    lo = max(24 * 8, test_start - val_days * 24 - max(horizons))
    origins = np.arange(lo, test_start)
    fc = rolling_forecasts(
        panel, candidates, horizons, quantiles, origins, refit_every, max_target=test_start - 1
    )
    picks = pick_models(fc, candidates, quantiles, criterion)
    if not fc.empty and CALIBRATIONS[calibrate] is not None:
        picks = pick_calibrated(fc, picks, quantiles, _step(panel), CALIBRATIONS[calibrate])
    return _naive_where_unvalidated(picks, panel.series, horizons, quantiles), fc


def _naive_where_unvalidated(picks: pd.DataFrame, series, horizons, quantiles) -> pd.DataFrame:
    """Every series × horizon gets a pick: naive wherever the training part was too short to
    validate anything (the selection rule's default), flagged `validated = False`."""
    picks = picks.assign(validated=True)
    have = set(zip(picks["series"], picks["horizon"], strict=True))
    missing = [(s, h) for s in series for h in horizons if (s, h) not in have]
    if not missing:
        return picks
    fill = pd.DataFrame(missing, columns=["series", "horizon"]).assign(pick="naive")
    for q in sorted(set(quantiles) - {0.5}):
        fill[f"pick_q{q:g}"] = "naive"
    fill["validated"] = False
    return pd.concat([picks, fill], ignore_index=True).sort_values(["series", "horizon"])


def pick_models(
    fc: pd.DataFrame, candidates, quantiles, criterion: str = "mae", fold_hours: int = 72
) -> pd.DataFrame:
    """Pick per series × horizon from validation forecasts.

    criterion "mae": lowest MAE over the whole window, ties within noise going to the steadier
    candidate (`_steady_pick`); "mean_rank": lowest mean rank over consecutive `fold_hours` folds
    (consistently good beats good in one calm stretch). Naive is kept unless beaten by ≥ 1 %. Each
    other quantile's source is picked by the lowest pinball loss (naive unless beaten by ≥ 1 %).
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
        if criterion == "mae":
            err = g.assign(loss=(g["actual"] - g["point"]).abs())
            rec["pick"] = _steady_pick(err.pivot(index="origin", columns="model", values="loss"))
        else:
            rec["pick"] = _best(mae, candidates)
        for q in sorted(set(quantiles) - {0.5}):
            col = f"q{q:g}"
            loss = score(lambda d, col=col, q=q: M.pinball(d["actual"], d[col], q))
            rec[f"pick_{col}"] = _best(loss, candidates)
        rec.update({f"val_{criterion}_{m}": v for m, v in mae.items()})
        picks.append(rec)
    return pd.DataFrame(picks)


def _best(score: dict[str, float], candidates, naive: str = "naive") -> str:
    best, best_score = naive, score.get(naive, np.inf) * 0.99
    for name in candidates:
        v = score.get(name, np.nan)
        if name != naive and np.isfinite(v) and v < best_score:
            best, best_score = name, v
    return best


def _steady_pick(loss: pd.DataFrame, naive: str = "naive") -> str:
    """Lowest mean loss (naive unless beaten by ≥ 1 %), with ties within noise broken by steadiness.

    `loss`: one row per validation origin, one column per candidate. When the best is not naive,
    every candidate whose mean daily loss exceeds the best's by no more than one standard error of
    the paired daily difference (days as blocks) is tied with it; among the tied, the one whose
    daily loss varies least from day to day is chosen (the window cannot tell them apart on the
    mean, so the steadier one is less exposed to a change of regime). Training data only.
    """
    loss = loss.dropna()
    if loss.empty:
        return naive
    mean = loss.mean().to_dict()
    best = _best(mean, list(loss.columns), naive)
    day = loss.groupby(loss.index.floor("D")).mean()
    if best == naive or len(day) < 3:
        return best
    diff = day.sub(day[best], axis=0)
    se = diff.std(ddof=1) / np.sqrt(len(day))
    tied = [c for c in day.columns if c == best or diff[c].mean() <= se[c]]
    return min(tied, key=lambda c: (day[c].std(ddof=1), mean[c]))


CAL_WINDOW = 14 * 24  # a calibrated quantile uses the errors that became known in the last 14 days
CAL_MIN = 24  # with fewer known errors than this the source's own quantile is used
CAL_BASES = ("quantile", "median")
# calibration of the advisor's non-median quantiles: None (off, the default), or the adaptation rate
# gamma of `rolling_shift` (0: split-conformal on the trailing errors; 0.005: adaptive conformal)
CALIBRATIONS = {"none": None, "conformal": 0.0, "adaptive": 0.005}


def _step(panel: Panel) -> pd.Timedelta:
    idx = panel.index
    return idx[1] - idx[0] if len(idx) > 1 else pd.Timedelta(hours=1)


def rolling_shift(
    pos: np.ndarray,
    score: np.ndarray,
    h: int,
    q: float,
    window=CAL_WINDOW,
    least=CAL_MIN,
    gamma: float = 0.0,
) -> np.ndarray:
    """Per origin position p: the q-quantile of the scores already known at p.

    The score of origin p' (actual − forecast, e.g. y[p'+h] − q̂(p')) is known once its target is,
    i.e. when p' + h ≤ p; only those that became known in the trailing `window` steps are used
    (split-conformal calibration, re-estimated at every origin). NaN where fewer than `least`.
    With `gamma` > 0 the level adapts to the misses already known (adaptive conformal inference,
    Gibbs & Candès 2021): level(p) = q + gamma · Σ (miss − (1 − q)) over the known calibrated
    origins, so a run of exceedances after a change of regime widens the next quantiles.
    """
    pos, score = np.asarray(pos, dtype=np.int64), np.asarray(score, float)
    order_p = np.argsort(pos, kind="stable")
    known = pos + h
    ok = np.isfinite(score)
    order = np.argsort(known[ok], kind="stable")
    k_sorted, s_sorted = known[ok][order], score[ok][order]
    idx_sorted = np.flatnonzero(ok)[order]  # row of each known score
    hi = np.searchsorted(k_sorted, pos, side="right")  # known ≤ p
    lo = np.searchsorted(k_sorted, pos - window, side="right")  # known > p − window
    out = np.full(len(pos), np.nan)
    drift, counted = 0.0, 0  # Σ (miss − (1 − q)) over the known calibrated origins
    for i in order_p:
        if gamma:
            while counted < hi[i]:
                j = idx_sorted[counted]
                if np.isfinite(out[j]):
                    drift += float(score[j] > out[j]) - (1 - q)
                counted += 1
        if hi[i] - lo[i] >= least:
            level = min(1.0, max(0.0, q + gamma * drift))
            out[i] = np.quantile(s_sorted[lo[i] : hi[i]], level)
    return out


def calibrated(
    g: pd.DataFrame, col: str, q: float, h: int, base: str, step, gamma: float = 0.0
) -> np.ndarray:
    """Calibrated q-quantile for one series × horizon × model's rows `g` (any order).

    base "quantile": the model's own q-quantile shifted by the q-quantile of its recent misses
    (conformalized quantile regression); base "median": the model's point forecast plus the
    q-quantile of its own recent errors. Clipped to [0, capacity at the target]; NaN where too
    few errors are known yet.
    """
    pos = ((g["origin"] - pd.Timestamp("1970-01-01", tz=g["origin"].dt.tz)) // step).to_numpy()
    raw = g[col if base == "quantile" else "point"].to_numpy(float)
    shift = rolling_shift(pos, g["actual"].to_numpy(float) - raw, h, q, gamma=gamma)
    upper = g["capacity"].to_numpy(float) if "capacity" in g else np.full(len(g), np.inf)
    upper = np.where(np.isfinite(upper), upper, np.inf)
    return np.clip(raw + shift, 0.0, upper)


def pick_calibrated(
    fc: pd.DataFrame, picks: pd.DataFrame, quantiles, step, gamma: float = 0.0
) -> pd.DataFrame:
    """Per series × horizon × quantile (≠ 0.5) the calibrated source with the lowest pinball loss on
    the validation forecasts (training part only): column `cal_q<level>` = "model|base".

    Every source is scored on the same origins (those where each has enough known errors); a
    source built on naive's median (the reservation baseline) is kept unless beaten by ≥ 1 %, and
    ties within noise go to the steadier source (`_steady_pick`).
    """
    picks = picks.copy()
    levels = sorted(set(quantiles) - {0.5})
    for q in levels:
        col = f"q{q:g}"
        picks[f"cal_{col}"] = ""
        if col not in fc.columns:
            continue
        for (s, h), g in fc.groupby(["series", "horizon"], sort=False):
            vals = {}
            for m, gm in g.groupby("model", sort=False):
                gm = gm.sort_values("origin")
                for base in CAL_BASES:
                    vals[f"{m}|{base}"] = pd.Series(
                        calibrated(gm, col, q, int(h), base, step, gamma), index=gm["origin"]
                    )
            actual = g.drop_duplicates("origin").set_index("origin")["actual"]
            table = pd.DataFrame(vals).reindex(actual.index)
            ok = table.notna().all(axis=1) & actual.notna()
            if ok.sum() < CAL_MIN:
                continue
            d = table[ok].rsub(actual[ok], axis=0)  # actual − calibrated quantile
            best = _steady_pick(np.maximum(q * d, (q - 1) * d), naive="naive|median")
            sel = (picks["series"] == s) & (picks["horizon"] == h)
            picks.loc[sel, f"cal_{col}"] = best
    return picks


def calibrate_rows(
    rows: pd.DataFrame, fc: pd.DataFrame, picks: pd.DataFrame, step, gamma: float = 0.0
) -> pd.DataFrame:
    """Replace the advisor's quantiles in `rows` by their calibrated sources (`cal_q…` picks).

    `fc` holds the candidates' forecasts at every origin known so far (validation part and test
    part): the calibration at an origin uses only errors whose targets are ≤ that origin. Where too
    few errors are known the uncalibrated quantile stays.
    """
    cal_cols = [c for c in picks.columns if c.startswith("cal_q")]
    if not cal_cols or rows.empty:
        return rows
    rows = rows.set_index(["origin", "series", "horizon"]).sort_index()
    for ccol in cal_cols:
        col = ccol[len("cal_") :]
        q = float(col[1:])
        if col not in rows.columns:
            continue
        for r in picks.to_dict("records"):
            src = r.get(ccol)
            if not isinstance(src, str) or "|" not in src:
                continue
            model, base = src.split("|")
            s, h = r["series"], int(r["horizon"])
            g = fc[(fc["series"] == s) & (fc["horizon"] == h) & (fc["model"] == model)]
            g = g.drop_duplicates("origin", keep="last").sort_values("origin")
            cal = calibrated(g, col, q, h, base, step, gamma)
            cal = pd.Series(cal, index=g["origin"].to_numpy())
            sel = rows.index.get_level_values("series") == s
            sel &= rows.index.get_level_values("horizon") == h
            origins = rows.index.get_level_values("origin")[sel]
            new = cal.reindex(origins).to_numpy()
            old = rows.loc[sel, col].to_numpy()
            rows.loc[sel, col] = np.where(np.isfinite(new), new, old)
    qcols = sorted((c for c in rows.columns if c.startswith("q")), key=lambda c: float(c[1:]))
    rows[qcols] = np.sort(rows[qcols].to_numpy(), axis=1)
    return rows.reset_index()


def advisor_rows(fc: pd.DataFrame, picks: pd.DataFrame) -> pd.DataFrame:
    """The advisor's forecast: per series × horizon the point (and median) of the model picked on
    the training part, each other quantile from its own pick (`coherent_quantile`: never on the
    wrong side of the median); quantiles re-sorted so none cross."""
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
        out[col] = coherent_quantile(
            float(col[1:]), src.reindex(out.index).to_numpy(), out[col].to_numpy(), out["q0.5"]
        )
    if qcols:
        levels = sorted(qcols, key=lambda c: float(c[1:]))
        out[levels] = np.sort(out[levels].to_numpy(), axis=1)
    return out.reset_index().assign(model="advisor")


def coherent_quantile(level: float, source, own, median) -> np.ndarray:
    """The advisor's quantile at `level` from its picked source, unless the source lies on the
    wrong side of the advisor's median (an upper quantile at or below it, a lower one at or above
    it): then the median model's own quantile. Quantiles picked from different models than the
    median can cross it, and sorting alone turns the upper bound into the median (a zero-width
    interval that a reservation would read as certainty). A NaN source (no interval) stays NaN."""
    source, own, median = (np.asarray(a, dtype=float) for a in (source, own, median))
    if level == 0.5:
        return source
    wrong = source <= median if level > 0.5 else source >= median
    return np.where(wrong & np.isfinite(source), own, source)


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
            if q > 0.5:  # an upper quantile is what a reservation holds
                rec[f"headroom_{tag}"] = M.headroom(y, g[col]) if col in g else np.nan
        rec["n"] = int(np.isfinite(y).sum())
        out.append(rec)
    return pd.DataFrame(out)


def test_window(panel: Panel, test_from=None, test_to=None, default_days: int = 7):
    """Origins of the test window (`test_bounds`)."""
    return _origin_positions(panel.index, *test_bounds(panel, test_from, test_to, default_days))


def test_bounds(
    panel: Panel, test_from=None, test_to=None, default_days: int = 7
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


def _check_targets(panel: Panel, origins: np.ndarray, horizons) -> None:
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
    horizons=(1, 24),
    quantiles=(0.5, 0.9),
    test_from=None,
    test_to=None,
    candidates=CANDIDATES,
    criterion: str = "mae",
    calibrate: str = "none",
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Full protocol on an hourly panel: selection on training, test forecasts, metrics.

    `calibrate` ("none", "conformal", "adaptive"): the advisor's non-median quantiles are
    recalibrated at every test origin on the errors known by then (`calibrate_rows`); the
    calibration history starts with the validation forecasts of the training part.

    Returns (metrics, forecasts incl. `advisor`, picks).
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
        panel,
        horizons,
        quantiles,
        test_start,
        candidates=candidates,
        criterion=criterion,
        calibrate=calibrate,
    )
    fc = rolling_forecasts(panel, candidates, horizons, quantiles, origins)
    adv = advisor_rows(fc, picks)
    gamma = CALIBRATIONS[calibrate]
    if gamma is not None and not val_fc.empty:  # errors known at each origin, training part first
        known = pd.concat([val_fc[val_fc["origin"] < panel.index[test_start]], fc])
        adv = calibrate_rows(adv, known, picks, _step(panel), gamma)
    fc = pd.concat([fc, adv], ignore_index=True)
    return score(fc, panel, test_start, quantiles), fc, picks
