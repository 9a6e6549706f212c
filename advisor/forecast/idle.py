"""Idle windows: how many units (GPUs or nodes) will stay free for the whole next W hours.

The truth for an hourly decision at origin t is m = min idle over (t, t+W], where idle in an hour is
capacity − the hour's peak use. The advisor's release R is a low quantile of m learned by gradient
boosting on the change from the current idle count, then shifted by an offset calibrated on the
last week of the training part so that violations (R > m) stay within the risk budget.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from advisor.forecast import features as feat
from advisor.forecast import metrics as M
from advisor.forecast.io import Panel

CALIBRATION_DAYS = 14
CALIBRATION_MARGIN = 0.5
BASELINE_RULES = ("current_idle", "min_past_w", "min_past_w_and_yesterday", "half_min_past_w")


def hourly_idle(panel: Panel) -> tuple[np.ndarray, np.ndarray, pd.DatetimeIndex]:
    """Idle units per hour = capacity − peak use in the hour (NaN where the hour is masked)."""
    peak = panel.resample("h", how="max")
    idle = peak.capacity.to_numpy(float) - peak.values.to_numpy(float)
    return np.maximum(idle, 0.0), peak.capacity.to_numpy(float), peak.index


def window_min(idle: np.ndarray, w: int) -> np.ndarray:
    """m[t] = min idle over rows t+1 … t+w (NaN if any is masked or beyond the data)."""
    out = np.full_like(idle, np.nan, dtype=float)
    n = len(idle)
    for t in range(n - w):
        seg = idle[t + 1 : t + 1 + w]
        out[t] = np.min(seg) if np.isfinite(seg).all() else np.nan
    return out


def _past_min(idle: np.ndarray, w: int) -> np.ndarray:
    return pd.DataFrame(idle).rolling(w, min_periods=1).min().to_numpy()


def baseline_release(idle: np.ndarray, w: int, rule: str) -> np.ndarray:
    """The research note's naive release rules, all causal."""
    ffi = feat.ffill(idle)
    past = _past_min(ffi, w)
    if rule == "current_idle":
        return ffi
    if rule == "min_past_w":
        return past
    if rule == "half_min_past_w":
        return np.floor(past / 2)
    if rule == "min_past_w_and_yesterday":
        # Same window yesterday: rows t+1−24 … t+w−24, all ≤ t since w ≤ 24.
        yesterday = feat.shift(_past_min(ffi, w), 24 - w) if w <= 24 else past
        return np.fmin(past, np.where(np.isfinite(yesterday), yesterday, past))
    raise ValueError(rule)


class IdleModel:
    """Low-quantile gradient boosting of the window minimum, with a calibrated safety offset."""

    def __init__(self, w: int, risk: float = 0.05, seed: int = 0) -> None:
        self.w, self.risk, self.seed = w, risk, seed
        self.offset = 0.0
        self._model = None
        self._cache = None

    def _features(self, idle, cap, times):
        if self._cache is None or self._cache[0] is not idle:
            X, _, last, s = feat.build(idle, cap, times, self.w)
            self._cache = (idle, X, last, s)
        return self._cache[1:]

    def fit(self, idle, cap, times, until: int) -> IdleModel:
        from sklearn.ensemble import HistGradientBoostingRegressor

        X, last, s = self._features(idle, cap, times)
        truth = window_min(idle, self.w)
        rows = np.arange(0, until - self.w + 1)
        target = ((truth[rows] - last[rows]) / s[rows]).reshape(-1)
        Xr = X[rows].reshape(-1, X.shape[-1])
        ok = np.isfinite(target)
        self._model = HistGradientBoostingRegressor(
            loss="quantile",
            quantile=max(self.risk, 0.01),
            max_iter=150,
            learning_rate=0.05,
            max_leaf_nodes=15,
            min_samples_leaf=40,
            random_state=self.seed,
        ).fit(Xr[ok], target[ok])
        return self

    def raw(self, idle, cap, times, origins) -> np.ndarray:
        X, last, s = self._features(idle, cap, times)
        Xo = X[origins]
        change = self._model.predict(Xo.reshape(-1, X.shape[-1])).reshape(Xo.shape[:2])
        return last[origins] + s[origins] * change, s[origins]

    def release(self, idle, cap, times, origins) -> np.ndarray:
        base, s = self.raw(idle, cap, times, origins)
        capf = feat.ffill(cap)[origins]
        return np.clip(
            np.floor(base + self.offset * s), 0, np.where(np.isfinite(capf), capf, np.inf)
        )

    def calibrate(self, idle, cap, times, origins) -> float:
        """Largest offset (in units of scale) with violations ≤ risk on these (training) origins."""
        truth = window_min(idle, self.w)[origins]
        base, s = self.raw(idle, cap, times, origins)
        ok = np.isfinite(truth)
        best = -1.0
        for off in np.linspace(-0.5, 0.5, 201):
            r = np.maximum(np.floor(base + off * s), 0)
            if np.mean(r[ok] > truth[ok]) <= self.risk:
                best = off
        self.offset = best
        return best


def backtest(
    panel: Panel,
    windows=(1, 4),
    risk: float = 0.05,
    test_from=None,
    test_to=None,
    refit_every: int = 168,
) -> pd.DataFrame:
    """Hourly release decisions over the test window for the advisor and the baseline rules.

    The model is refit every `refit_every` origins (weekly by default; the protocol allows daily).
    """
    from advisor.forecast.rolling import test_window

    idle, cap, times = hourly_idle(panel)
    hourly = Panel(
        pd.DataFrame(idle, index=times, columns=panel.series),
        pd.DataFrame(cap, index=times, columns=panel.series),
        panel.name,
        panel.test_from,
        panel.test_to,
    )
    origins = test_window(hourly, test_from, test_to)
    start = int(origins[0])
    rows = []
    for w in windows:
        truth = window_min(idle, w)
        ok = origins + w < len(idle)
        o = origins[ok]
        decisions = {rule: baseline_release(idle, w, rule)[o] for rule in BASELINE_RULES}
        # Calibrate on the last 14 days of training with a model that has not seen them, to
        # half the budget: week-to-week drift roughly doubles violation rates out of sample.
        val = np.arange(max(48, start - CALIBRATION_DAYS * 24 - w), start - w)
        model = IdleModel(w, risk * CALIBRATION_MARGIN).fit(idle, cap, times, int(val[0]) - w)
        offset = model.calibrate(idle, cap, times, val)
        adv = np.empty((len(o), idle.shape[1]))
        for i in range(0, len(o), refit_every):
            block = o[i : i + refit_every]
            model.fit(idle, cap, times, int(block[0]))
            adv[i : i + len(block)] = model.release(idle, cap, times, block)
        decisions["advisor"] = adv
        for name, rel in decisions.items():
            for j, s in enumerate(panel.series):
                sc = M.release_scores(rel[:, j], truth[o, j])
                rows.append(
                    {
                        "replay": "idle_window",
                        "series": s,
                        "window_h": w,
                        "model": name,
                        **sc,
                        "mean_idle": float(np.nanmean(truth[o, j])),
                        "offset": offset if name == "advisor" else np.nan,
                    }
                )
    return pd.DataFrame(rows)


def idle_windows(panel: Panel, windows=(1, 4, 8), risk: float = 0.05) -> pd.DataFrame:
    """Live use: units safe to release now for each series and window, fitted on all history."""
    idle, cap, times = hourly_idle(panel)
    last = len(idle) - 1
    out = []
    for w in windows:
        model = IdleModel(w, risk * CALIBRATION_MARGIN)
        if last - 2 * w - CALIBRATION_DAYS * 24 > 48:
            val = np.arange(last - CALIBRATION_DAYS * 24 - w, last - w)
            model.fit(idle, cap, times, int(val[0]) - w)
            model.calibrate(idle, cap, times, val)
            model.fit(idle, cap, times, last)
            rel = model.release(idle, cap, times, np.array([last]))[0]
        else:
            rel = baseline_release(idle, w, "half_min_past_w")[last]
        for j, s in enumerate(panel.series):
            out.append(
                {
                    "series": s,
                    "window_h": w,
                    "risk": risk,
                    "release": float(rel[j]),
                    "current_idle": float(feat.ffill(idle)[last, j]),
                    "as_of": times[last],
                }
            )
    return pd.DataFrame(out)
