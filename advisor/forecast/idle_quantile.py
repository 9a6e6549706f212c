"""The pooled quantile model behind idle-window release, and its release rule.

A gradient-boosting model of the window minimum m (as a change from the current idle count,
over capacity) at several quantile levels, fitted on all series of a panel together, with the
origin hour's minute state as features; and the rule that turns those quantiles into a release:
per hour the level maximising expected released units minus λ × its risk, with one λ per data
set. `advisor.forecast.idle` decides where this model serves and where the per-series rules do.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from advisor.forecast import features as feat
from advisor.forecast.panel import Panel
from advisor.forecast.threads import bounded

LEVELS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.9)  # quantile levels of m the model predicts


LAMBDAS = np.geomspace(0.01, 100.0, 81)  # price of one unit of risk, in hours of mean idle


MIN_HISTORY_H = 7 * 24  # history before the first model fit


MIN_CALIBRATION_H = 3 * 24  # out-of-sample hours needed to pick λ; fewer: the per-series rules


SHRINK_H = None  # None: one λ per data set (see `lambda_for`)


FITTED_MAX = 512  # fitted models kept for reuse (a few tens of kB each)
_fitted: OrderedDict = OrderedDict()
_fitted_lock = threading.Lock()


def fit_gbm(params: dict[str, Any], X: np.ndarray, y: np.ndarray) -> Any:
    """`HistGradientBoostingRegressor(**params).fit(X, y)`, reused when this process has already
    fitted the same parameters on the same rows (byte for byte). The fits are deterministic (fixed
    `random_state`), so reuse changes no result; it spares repeated `idle_windows` calls within an
    hour the refits whose training rows have not changed. At most `FITTED_MAX` models are kept,
    least recently used first out."""
    from sklearn.ensemble import HistGradientBoostingRegressor

    digest = hashlib.blake2b(repr(sorted(params.items())).encode(), digest_size=20)
    for a in (X, y):
        a = np.ascontiguousarray(a, dtype=float)
        digest.update(repr(a.shape).encode())
        digest.update(a.tobytes())
    key = digest.digest()
    with _fitted_lock:
        if key in _fitted:
            _fitted.move_to_end(key)
            return _fitted[key]
    with bounded():
        model = HistGradientBoostingRegressor(**params).fit(X, y)
    with _fitted_lock:
        _fitted[key] = model
        while len(_fitted) > FITTED_MAX:
            _fitted.popitem(last=False)
    return model


def minute_state(panel: Panel, times: pd.DatetimeIndex) -> tuple[np.ndarray, ...]:
    """Per hour t, from readings inside hour t and before it only: the idle count at the hour's
    last reading, the hour's highest idle count, and the minutes that count had been unchanged at
    that last reading. (On an hourly panel: the hour's value, the same, and hours × 60.)

    The first two come from the hour's `Panel.within` (capacity − the last and the lowest
    reading; NaN where the hour has too few readings, as the hourly values); the third, which
    `within` does not hold, from the readings themselves."""
    hourly = panel.resample("h")
    last = (hourly.capacity - hourly.within["last"]).reindex(times).to_numpy(float)
    high = (hourly.capacity - hourly.within["min"]).reindex(times).to_numpy(float)
    a = (panel.capacity.ffill() - panel.values).to_numpy(float)
    changed = np.ones(a.shape, bool)
    changed[1:] = ~(a[1:] == a[:-1])  # a masked reading counts as a change
    minutes = np.asarray((panel.index - panel.index[0]) / pd.Timedelta(minutes=1), float)
    since_change = minutes[:, None] - np.maximum.accumulate(
        np.where(changed, minutes[:, None], -np.inf), axis=0
    )
    since = (
        pd.DataFrame(np.where(np.isfinite(a), since_change, np.nan), index=panel.index)
        .resample("h")
        .last()
        .reindex(times)
        .to_numpy(float)
    )
    return last, high, since


def idle_features(
    panel: Panel, idle: np.ndarray, cap: np.ndarray, times: pd.DatetimeIndex, w: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """X (T, S, F), current idle (T, S) and scale (T, S) for windows of w hours; row t uses the
    minutes of hour t and earlier only (plus the calendar and capacity schedule at t + w)."""
    X, _, cur, s = feat.build(idle, cap, times, w)
    last, high, since = minute_state(panel, times)
    ffi = feat.ffill(idle)
    down = np.zeros_like(ffi)
    down[1:] = ffi[1:] < ffi[:-1]
    past = feat.past_min(ffi, w)
    yesterday = feat.shift(past, 24 - w) if w <= 24 else past
    extra = [
        (feat.ffill(last) - cur) / s,  # idle at the origin hour's last minute
        (feat.ffill(high) - cur) / s,  # the hour's highest idle
        np.log1p(np.clip(np.nan_to_num(since), 0, 7 * 24 * 60)),  # minutes unchanged
        pd.DataFrame(down).rolling(24, min_periods=1).mean().to_numpy(),  # hours with a drop
        pd.DataFrame(down).rolling(168, min_periods=1).mean().to_numpy(),
        cur,  # units: job sizes are absolute, not a share of the pool
        feat.ffill(cap),
        (past - cur) / s,
        (yesterday - cur) / s,
    ]
    Xe = np.nan_to_num(np.stack(extra, axis=-1), nan=0.0, posinf=0.0, neginf=0.0)
    return np.concatenate([X, Xe], axis=-1), cur, s


def quantile_paths(
    X: np.ndarray,
    cur: np.ndarray,
    s: np.ndarray,
    cap: np.ndarray,
    target: np.ndarray,
    w: int,
    rows: np.ndarray,
    refit_points: np.ndarray,
    levels: Sequence[float] = LEVELS,
    seed: int = 0,
) -> np.ndarray:
    """Quantiles of m at `rows`, (len(levels), len(rows), S), each from pooled models fitted at
    the latest refit point ≤ the row on the outcomes known there (rows t with t + w ≤ the refit
    point). NaN where no refit point precedes a row or too few outcomes are known."""
    rows = np.asarray(rows)
    refit_points = np.sort(np.asarray(refit_points))
    n_series, n_feat = X.shape[1], X.shape[-1]
    Q = np.full((len(levels), len(rows), n_series), np.nan)
    at = np.searchsorted(refit_points, rows, side="right") - 1
    capf = feat.ffill(cap)
    for k in np.unique(at[at >= 0]):
        until = int(refit_points[k])
        known = max(until - w + 1, 0)  # outcomes known at `until`: rows t ≤ until − w
        y = target[:known].reshape(-1)
        Xr = X[:known].reshape(-1, n_feat)
        ok = np.isfinite(y)
        if ok.sum() < 50:
            continue
        sel = np.flatnonzero(at == k)
        Xo = X[rows[sel]].reshape(-1, n_feat)
        for i, q in enumerate(levels):
            params = {
                "loss": "quantile",
                "quantile": q,
                "max_iter": 100,
                "learning_rate": 0.075,
                "max_leaf_nodes": 15,
                "min_samples_leaf": 40,
                "random_state": seed,
            }
            model = fit_gbm(params, Xr[ok], y[ok])
            with bounded():
                change = model.predict(Xo).reshape(len(sel), n_series)
            Q[i, sel] = cur[rows[sel]] + s[rows[sel]] * change
    Q = np.sort(Q, axis=0)  # quantiles must not cross
    upper = np.where(np.isfinite(capf[rows]), capf[rows], np.inf)
    return np.clip(Q, 0, upper[None])


FINE = np.concatenate([[0.0, 0.0025, 0.005, 0.01, 0.015], np.arange(0.02, 0.9001, 0.01)])


def fine_quantiles(
    Q: np.ndarray, levels: Sequence[float] = LEVELS
) -> tuple[np.ndarray, np.ndarray]:
    """The predicted quantile function on the grid `FINE` (linear between the model's levels,
    down to q(0) = 0 below the lowest, which can only understate a release) and its integral
    C(u) = ∫₀ᵘ q(v) dv per grid point: both (len(FINE), rows, S)."""
    u = np.concatenate([[0.0], levels])
    full = np.concatenate([np.zeros((1, *Q.shape[1:])), Q])
    k = np.clip(np.searchsorted(u, FINE, side="right") - 1, 0, len(u) - 2)
    frac = ((FINE - u[k]) / (u[k + 1] - u[k]))[:, None, None]
    fine = full[k] + frac * (full[k + 1] - full[k])
    steps = np.diff(FINE)[:, None, None] * (fine[1:] + fine[:-1]) / 2
    integral = np.concatenate([np.zeros((1, *Q.shape[1:])), np.cumsum(steps, axis=0)])
    return fine, integral


def lagrange_release(
    Q: np.ndarray | tuple[np.ndarray, np.ndarray],
    lam: float | np.ndarray,
    norm: np.ndarray,
    levels: Sequence[float] = LEVELS,
) -> np.ndarray:
    """Per row and series, the release R = floor(q(u)) over the grid `FINE` of quantile levels u
    (u = 0: release nothing) that maximises E[min(R, m)] / norm − lam × u, with E[min(R, m)] =
    ∫₀ᵘ q + (1 − u) R from the predicted quantile function: a unit of risk is spent where it buys
    many units and saved where a drop is likely. `Q` may also be `fine_quantiles(Q)`."""
    fine, integral = Q if isinstance(Q, tuple) else fine_quantiles(Q, levels)
    lam = np.broadcast_to(np.asarray(lam, float), fine.shape[2:])
    R = np.floor(fine)
    u = FINE[:, None, None]
    value = (np.minimum(integral, u * R) + (1 - u) * R) / norm - lam * u
    k = np.argmax(value, axis=0)
    return np.take_along_axis(R, k[None], axis=0)[0]


def lambda_for(
    Q: np.ndarray,
    norm: np.ndarray,
    truth: np.ndarray,
    budget: float,
    shrink: int | None = SHRINK_H,
) -> np.ndarray:
    """Per series, the smallest λ (most release) such that at it and every larger λ the series'
    violation share stays ≤ budget: with `shrink` None the share pooled over all series (one λ
    per data set), else each series' share shrunk towards the pooled one by `shrink` pseudo-hours.
    """
    ok = np.isfinite(truth) & np.isfinite(Q).all(axis=0)
    n = ok.sum(axis=0)
    lam = np.full(truth.shape[1], LAMBDAS[-1])
    alive = np.ones(truth.shape[1], bool)
    fq = fine_quantiles(np.nan_to_num(Q))
    for value in LAMBDAS[::-1]:
        viol = np.where(ok, lagrange_release(fq, value, norm) > truth, False)
        pooled = viol.sum() / max(ok.sum(), 1)
        if shrink is None:
            alive &= pooled <= budget
        else:
            alive &= (viol.sum(axis=0) + shrink * pooled) / (n + shrink) <= budget
        if not alive.any():
            break
        lam[alive] = value
    return lam


def release_norm(idle: np.ndarray) -> np.ndarray:
    """Per-row size of a series (trailing week's mean idle + 1), so one λ fits pools of any size."""
    return pd.DataFrame(feat.ffill(idle)).rolling(168, min_periods=1).mean().to_numpy() + 1.0


def refit_schedule(anchor: int, every: int, first: int, end: int) -> np.ndarray:
    """`first` (the earliest fit) and anchor + k × every for all integers k, within [first, end]."""
    k0 = -((anchor - first) // every)
    grid = [p for p in range(anchor + k0 * every, end + 1, every) if p > first]
    return np.array([first, *grid] if first <= end else [], int)
