"""Lead-matched features for direct h-step models, built causally over a whole (time × series) array.

Row t of every feature uses observations at indices ≤ t only (plus the calendar and the declared
capacity schedule at t + h, which are known in advance). Building all rows at once is therefore
leak-free and fast; `tests/advisor/test_forecast_features.py` alters data after t and checks row t.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

# the readings inside each step, as (T, S) arrays by field (`within_arrays`); None: none known
Within = dict[str, np.ndarray] | None

LAGS = (1, 2, 3, 6, 12, 24, 168)


def ffill(y: np.ndarray) -> np.ndarray:
    """Forward-fill NaNs along time (axis 0): the last observed value, never a later one."""
    return pd.DataFrame(y).ffill().to_numpy()


def last_observed(y: np.ndarray) -> int:
    """The last row in which any series is observed (−1 if none). Rows after it may still carry
    known capacity (a scheduled resize): they are the future, not the origin."""
    seen = np.flatnonzero(np.isfinite(np.asarray(y, float)).any(axis=1))
    return int(seen[-1]) if len(seen) else -1


def past_min(a: np.ndarray, w: int) -> np.ndarray:
    """Minimum over rows t − w + 1 … t (fewer at the start): the past-W minimum, causal.

    NaN (and, as in pandas' rolling windows, ±inf) is skipped; NaN where the window has nothing
    else. What `pd.DataFrame(a).rolling(w, min_periods=1).min()` gives, in the same memory
    layout, without its per-column loop: a minimum is exact, so the order of comparisons does
    not matter."""
    x = np.asarray(a)
    if x.ndim == 1:
        x = x[:, None]
    if x.ndim != 2 or w < 1 or x.dtype.kind not in "biuf":
        return pd.DataFrame(a).rolling(w, min_periods=1).min().to_numpy()
    x = np.array(x, dtype=np.float64, order="F")
    x[np.isinf(x)] = np.nan
    return trailing(x, w, np.fmin)


def trailing(x: np.ndarray, w: int, op: np.ufunc) -> np.ndarray:
    """op-reduction of rows t − w + 1 … t along axis 0, in place of `x` (which it returns): by
    doubling spans, so log2(w) passes. Rows t < w − 1 reduce the rows they have. For an
    idempotent `op` (min, fmin, …) only: spans overlap."""
    span = 1
    while 2 * span <= w:
        x[span:] = op(x[span:], x[:-span])
        span *= 2
    if span < w:
        x[w - span :] = op(x[w - span :], x[: max(len(x) - (w - span), 0)])
    return x


def shift(a: np.ndarray, k: int) -> np.ndarray:
    """a[t - k] at row t (NaN before the start); k must be ≥ 0 so nothing comes from the future."""
    if k < 0:
        raise ValueError("shift into the future")
    out = np.full_like(a, np.nan, dtype=float)
    if k == 0:
        return a.astype(float).copy()
    if k < len(a):
        out[k:] = a[:-k]
    return out


def lead(a: np.ndarray, k: int) -> np.ndarray:
    """a[t + k] at row t: only for known-in-advance covariates (calendar, capacity) and targets."""
    out = np.full_like(a, np.nan, dtype=float)
    out[: len(a) - k] = a[k:]
    return out


def scale_of(y: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """Per-row scale: capacity where known, else a trailing mean level (+1 so zero series work)."""
    trailing = pd.DataFrame(np.abs(ffill(y))).rolling(168, min_periods=1).mean().to_numpy() + 1.0
    capf = ffill(cap)
    return np.where(np.isfinite(capf) & (capf > 0), capf, trailing)


def same_hour_mean(ffy: np.ndarray, horizon: int, days: int = 7, period: int = 24) -> np.ndarray:
    """Mean of the last `days` observations at the target's time of day that are ≤ t."""
    first = period * int(np.ceil(horizon / period))
    stack = np.stack([shift(ffy, first - horizon + period * j) for j in range(days)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(stack, axis=0)


def within_arrays(within: dict[str, pd.DataFrame], values: pd.DataFrame) -> Within:
    """A Panel's `within` frames as (T, S) arrays aligned with `values` (None if it has none)."""
    if not within:
        return None
    return {
        k: v.reindex(index=values.index, columns=values.columns).to_numpy(float)
        for k, v in within.items()
    }


def last_reading(y: np.ndarray, within: Within) -> np.ndarray:
    """The latest reading known at each row: the last sub-step reading of the latest observed
    step (`within["last"]`), or the step's value where no finer reading is known."""
    ffy = ffill(y)
    if not within or "last" not in within:
        return ffy
    lr = ffill(np.where(np.isfinite(y), within["last"], np.nan))
    return np.where(np.isfinite(lr), lr, ffy)


def _within_cols(
    y: np.ndarray, within: dict[str, np.ndarray], last: np.ndarray, s: np.ndarray
) -> dict[str, np.ndarray]:
    """Sub-step features at the latest observed step, relative to its value and scaled."""
    seen = np.isfinite(y)

    def at_last(name: str) -> np.ndarray | None:
        a = within.get(name)
        return None if a is None else ffill(np.where(seen, a, np.nan))

    cols = {"last_reading": (last_reading(y, within) - last) / s}
    lo, hi, slope = at_last("min"), at_last("max"), at_last("slope")
    if lo is not None and hi is not None:
        cols["within_max"] = (hi - last) / s
        cols["within_min"] = (lo - last) / s
    if slope is not None:
        cols["within_slope"] = slope / s
    return cols


def build(
    y: np.ndarray,
    cap: np.ndarray,
    times: pd.DatetimeIndex,
    horizon: int,
    sph: int = 1,
    within: dict | None = None,
) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray]:
    """Return X (T, S, F), feature names, last value (T, S) and scale (T, S) for lead `horizon`.

    `horizon` is in grid steps; `sph` is steps per hour (1 hourly, 6 for 10-minute data).
    `within` (a Panel's sub-step arrays, `within_arrays`) adds the last reading, min and max of
    the latest observed step relative to its value, and its within-step slope; row t uses the
    readings inside step t and earlier only.
    """
    ffy = ffill(y)
    s = scale_of(y, cap)
    last = ffy
    cols: dict[str, np.ndarray] = {"level": last / s}
    if within:
        cols.update(_within_cols(y, within, last, s))
    lags = sorted({1, 2, *(k * sph for k in LAGS)})
    for k in lags:
        cols[f"d{k}"] = (last - shift(ffy, k)) / s
    day = 24 * sph
    first = day * int(np.ceil(horizon / day))
    cols["same_hour_1d"] = (shift(ffy, first - horizon) - last) / s
    cols["same_hour_7d"] = (same_hour_mean(ffy, horizon, period=day) - last) / s
    frame = pd.DataFrame(ffy)
    for w in (6 * sph, 24 * sph, 168 * sph):
        roll = frame.rolling(w, min_periods=1)
        cols[f"mean{w}"] = (roll.mean().to_numpy() - last) / s
        if w != 6 * sph:
            cols[f"std{w}"] = roll.std().to_numpy() / s
            cols[f"max{w}"] = (roll.max().to_numpy() - last) / s
            cols[f"min{w}"] = (roll.min().to_numpy() - last) / s
    observed = np.isfinite(y).astype(float)
    cols["stale"] = pd.DataFrame(observed).rolling(day, min_periods=1).mean().to_numpy()
    capf = ffill(cap)
    cap_h = lead(capf, horizon)
    cap_h = np.where(np.isfinite(cap_h), cap_h, capf)
    cols["headroom"] = (cap_h - last) / s
    cols["cap_change"] = (cap_h - capf) / s
    step = times[1] - times[0] if len(times) > 1 else pd.Timedelta(hours=1)
    target_time = times + step * horizon
    n_series = y.shape[1]
    tod = np.asarray(target_time.hour + target_time.minute / 60, float)
    cols["hour"] = np.repeat(tod[:, None], n_series, axis=1)
    cols["dow"] = np.repeat(np.asarray(target_time.day_of_week, float)[:, None], n_series, axis=1)
    names = list(cols)
    # Missing history (start of data, masked stretches) reads as "no change"; `stale` flags it.
    X = np.nan_to_num(np.stack([cols[n] for n in names], axis=-1), nan=0.0, posinf=0.0, neginf=0.0)
    return X, names, last, s
