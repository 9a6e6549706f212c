"""The advisor's rule: which candidates serve a series at a horizon, and how wide its band is.

One rule, used alike by the backtest (`rolling.run`), the live forecast (`api.forecast`) and the
service's hourly forecast (`live.demand_section`):

1. Every candidate is forecast over validation origins before the part it will serve (rolling
   origin, information ≤ each origin: `rolling.rolling_forecasts`).
2. Those origins are cut into `Rule.windows` consecutive windows of whole days. A candidate is
   *good* when its MAE is below (1 − `Rule.margin`) × naive's in every window: a gain that holds
   across the windows, not one calm stretch (`good`). Naive itself is the simplest model and
   the default.
3. The advisor's point forecast is the median of naive and the good candidates (`members`;
   naive alone when none is good). With one good candidate that is the mean of it and naive,
   a shrinkage towards naive; with more, the middle one.
4. Its quantiles are split-conformal (`conformal`): the point plus the level's empirical
   quantile of the advisor's own errors whose targets are known at the origin, over the trailing
   `Rule.calibration_days` (at least `MIN_INTERVAL_ERRORS` of them, else none).

The defaults were chosen on the training parts only, by `bench/forecast_develop.py`;
docs/forecasting.md says on which data and with which figures.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from advisor.forecast.models import MIN_INTERVAL_ERRORS, NAMES, sort_known

CANDIDATES: tuple[str, ...] = NAMES  # every model `make` knows competes
NAIVE = "naive"
COMBINES = ("median", "best")


@dataclass(frozen=True)
class Rule:
    """The advisor's selection and calibration settings (one rule, module docstring)."""

    windows: int = 3  # consecutive validation windows a gain over naive must hold in
    margin: float = 0.0  # share of naive's MAE a good candidate beats it by in every window
    combine: str = (
        "median"  # "median": of naive and the good ones; "best": the good one of least MAE
    )
    calibration_days: int = 7  # trailing days of the advisor's own errors behind its quantiles

    def __post_init__(self) -> None:
        if self.windows < 1 or self.calibration_days < 1:
            raise ValueError("windows and calibration_days must be >= 1")
        if not 0.0 <= self.margin < 1.0:
            raise ValueError(f"margin must be in [0, 1), got {self.margin}")
        if self.combine not in COMBINES:
            raise ValueError(f"combine must be one of {COMBINES}, got {self.combine!r}")


RULE = Rule()


def window_of(origins: pd.DatetimeIndex, windows: int) -> np.ndarray:
    """Per origin, its window: the origins' calendar days cut into at most `windows` runs of
    consecutive days of (nearly) equal length; fewer days than windows: one window a day."""
    days = np.asarray(origins.normalize().asi8)
    uniq = np.unique(days)
    n = max(1, min(windows, len(uniq)))
    rank = np.searchsorted(uniq, days)
    return (rank * n) // len(uniq)


def good(loss: pd.DataFrame, rule: Rule = RULE) -> list[str]:
    """The candidates (columns of `loss`, absolute errors per validation origin) whose mean error
    is below (1 − margin) × naive's in every window, in the columns' order. Origins where any
    candidate has no forecast or the actual is masked are left out, so all are scored alike."""
    loss = loss.dropna()
    if loss.empty or NAIVE not in loss.columns:
        return []
    per_window = loss.groupby(window_of(pd.DatetimeIndex(loss.index), rule.windows)).mean()
    bar = per_window[NAIVE].to_numpy()[:, None] * (1.0 - rule.margin)
    below = (per_window.to_numpy() < bar).all(axis=0)
    return [str(c) for c, ok in zip(loss.columns, below, strict=True) if ok and c != NAIVE]


def members(loss: pd.DataFrame, rule: Rule = RULE) -> tuple[str, ...]:
    """The models whose forecasts make the advisor's (`combine`): naive and the good candidates
    ("median"), or the good candidate with the least validation MAE ("best"); naive without any."""
    chosen = good(loss, rule)
    if not chosen:
        return (NAIVE,)
    if rule.combine == "best":
        mean = loss.dropna()[chosen].mean()
        return (str(mean.idxmin()),)
    return (NAIVE, *chosen)


def label(names: Sequence[str]) -> str:
    """The pick as picks.csv and the forecast's `model` column name it: the model itself, or
    `median(naive,gbm,…)` for a combination."""
    return names[0] if len(names) == 1 else f"median({','.join(names)})"


_MEDIAN = re.compile(r"median\((.*)\)")


def members_of(pick: str) -> tuple[str, ...]:
    """`label`'s inverse."""
    found = _MEDIAN.fullmatch(pick)
    return tuple(found.group(1).split(",")) if found else (pick,)


def choose(fc: pd.DataFrame, rule: Rule = RULE) -> pd.DataFrame:
    """Per series × horizon of validation forecasts `fc` (rows: origin, series, horizon, model,
    point, actual): the pick (`label` of `members`), the number of windows the validation
    origins were cut into, every candidate's validation MAE (`val_mae_<model>`) and the pick's
    own (`val_mae_advisor`: the measured error shown with a live forecast)."""
    columns = ["series", "horizon", "pick", "windows"]
    if fc.empty:  # nothing could be validated (history too short for these horizons)
        return pd.DataFrame(columns=columns)
    rows = []
    for (series, h), g in fc.groupby(["series", "horizon"], sort=True):
        points = g.pivot_table(
            index="origin", columns="model", values="point", aggfunc="first", dropna=False
        )
        actual = g.drop_duplicates("origin").set_index("origin")["actual"].reindex(points.index)
        loss = points.sub(actual, axis=0).abs().dropna()
        chosen = members(loss, rule)
        n = int(window_of(pd.DatetimeIndex(loss.index), rule.windows).max() + 1) if len(loss) else 0
        rec: dict[str, object] = {
            "series": series,
            "horizon": h,
            "pick": label(chosen),
            "windows": n,
        }
        rec.update({f"val_mae_{m}": float(v) for m, v in loss.mean().items()})
        own = points.loc[loss.index, list(chosen)].median(axis=1)
        rec["val_mae_advisor"] = float((own - actual[loss.index]).abs().mean())
        rows.append(rec)
    return pd.DataFrame(rows)


def combined(fc: pd.DataFrame, picks: pd.DataFrame) -> pd.DataFrame:
    """The advisor's point forecasts from the candidates' rows `fc`: per series × horizon × origin
    the median of its pick's members' points (one row per origin: origin, series, horizon,
    point, actual, capacity). Origins where a member has no forecast are left out."""
    key = ["origin", "series", "horizon"]
    wanted = [
        (s, int(h), m)
        for s, h, p in picks[["series", "horizon", "pick"]].itertuples(index=False)
        for m in members_of(str(p))
    ]
    if not wanted or fc.empty:
        return pd.DataFrame(columns=[*key, "point", "actual", "capacity"])
    chosen = pd.DataFrame(wanted, columns=["series", "horizon", "model"])
    rows = fc.merge(chosen, on=["series", "horizon", "model"])
    size = chosen.groupby(["series", "horizon"]).size().rename("size").reset_index()
    out = rows.groupby(key, sort=True).agg(
        point=("point", "median"),
        n=("point", "count"),
        actual=("actual", "first"),
        capacity=("capacity", "first"),
    )
    out = out.reset_index().merge(size, on=["series", "horizon"])
    return out[out["n"] == out["size"]].drop(columns=["n", "size"]).reset_index(drop=True)


def conformal(
    rows: pd.DataFrame,
    quantiles: Sequence[float],
    step: pd.Timedelta,
    rule: Rule = RULE,
    known: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """`rows` (the advisor's points: origin, series, horizon, point, actual, capacity) with a
    column q<level> per level: the point plus the level's quantile of the advisor's errors
    (actual − point) whose targets are known at the row's origin, over the trailing
    `rule.calibration_days`; where fewer than `MIN_INTERVAL_ERRORS` are known the other levels
    are NaN (no interval) and the median is the point itself. `known`: more
    rows whose errors count (e.g. the validation part before `rows`), never forecast here. Levels
    are sorted (a NaN stays in place), clipped to [0, capacity at the target]."""
    levels = sorted(set(quantiles) | {0.5})
    cols = [f"q{q:g}" for q in levels]
    rows = rows.reset_index(drop=True)
    if rows.empty:
        return rows.assign(**dict.fromkeys(cols, np.nan))
    history = rows if known is None or known.empty else pd.concat([known, rows])
    out = np.full((len(rows), len(levels)), np.nan)
    window = rule.calibration_days * pd.Timedelta(days=1) // step
    for (series, h), g in rows.groupby(["series", "horizon"], sort=False):
        past = history[(history["series"] == series) & (history["horizon"] == h)]
        past = past.drop_duplicates("origin", keep="last")
        pos_all = _positions(past["origin"], step)
        pos_now = _positions(g["origin"], step)
        errors = (past["actual"] - past["point"]).to_numpy(float)
        shifts = _trailing_quantiles(pos_all, errors, pos_now, int(h), levels, int(window))
        point = g["point"].to_numpy(float)
        shifts[:, levels.index(0.5)] = np.nan_to_num(shifts[:, levels.index(0.5)])
        out[g.index.to_numpy()] = point[:, None] + shifts
    cap = rows["capacity"].to_numpy(float)
    upper = np.where(np.isfinite(cap), cap, np.inf)[:, None]
    out = np.where(np.isnan(out), np.nan, np.clip(out, 0.0, upper))
    out = sort_known(out.T).T
    return rows.assign(**{c: out[:, i] for i, c in enumerate(cols)})


def _positions(origins: pd.Series, step: pd.Timedelta) -> np.ndarray:
    """Origins as whole grid steps since the epoch (the errors' clock)."""
    times = pd.DatetimeIndex(origins)
    return np.asarray((times - pd.Timestamp(0)) // step, dtype=np.int64)


def _trailing_quantiles(
    pos: np.ndarray,
    errors: np.ndarray,
    at: np.ndarray,
    h: int,
    levels: Sequence[float],
    window: int,
) -> np.ndarray:
    """Per position in `at`: each level's quantile of the `errors` (made at `pos`) whose target
    pos + h is ≤ the position and within the trailing `window` steps; NaN with fewer than
    `MIN_INTERVAL_ERRORS` such errors."""
    ok = np.isfinite(errors)
    known = pos[ok] + h
    order = np.argsort(known, kind="stable")
    known, values = known[order], errors[ok][order]
    hi = np.searchsorted(known, at, side="right")
    lo = np.searchsorted(known, at - window, side="right")
    out = np.full((len(at), len(levels)), np.nan)
    for i, (a, b) in enumerate(zip(lo.tolist(), hi.tolist(), strict=True)):
        if b - a >= MIN_INTERVAL_ERRORS:
            out[i] = np.quantile(values[a:b], levels)
    return out


def complete(picks: pd.DataFrame, series: Sequence[str], horizons: Sequence[int]) -> pd.DataFrame:
    """Every series × horizon gets a pick: naive wherever nothing could be validated (the
    rule's default), flagged `validated = False`."""
    picks = picks.assign(validated=True)
    have = set(zip(picks["series"], picks["horizon"], strict=True))
    missing = [(s, h) for s in series for h in horizons if (s, h) not in have]
    if not missing:
        return picks
    fill = pd.DataFrame(missing, columns=["series", "horizon"]).assign(
        pick=NAIVE, windows=0, validated=False
    )
    parts = [p for p in (picks, fill) if len(p)]
    return pd.concat(parts, ignore_index=True).sort_values(["series", "horizon"])
