"""Idle windows: how many units (GPUs or nodes) will stay free for the whole next W hours.

The truth for an hourly decision at origin t is m = min idle over (t, t+W], where idle in an hour is
capacity − the hour's peak use. The advisor's release R comes from one of a few rules (a low
quantile of m by gradient boosting on the change from the current idle count, or the past-W
minimum lowered by an offset or a factor), picked per series with its safety parameter on the last
two weeks of the training part so that violations (R > m) stay within the risk budget; how much of
the budget to spend there is itself checked on those two weeks (`choose_margin`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from advisor.forecast import features as feat
from advisor.forecast import metrics as M
from advisor.forecast.io import Panel
from advisor.forecast.threads import bounded

CALIBRATION_DAYS = 14
MARGINS = (1.0, 0.75, 0.5, 0.25)
BASELINE_RULES = ("current_idle", "min_past_w", "min_past_w_and_yesterday", "half_min_past_w")


def hourly_idle(panel: Panel) -> tuple[np.ndarray, np.ndarray, pd.DatetimeIndex]:
    """Idle units per hour = capacity − peak use in the hour (NaN where the hour is masked)."""
    peak = panel.resample("h", how="max")
    idle = peak.capacity.to_numpy(float) - peak.values.to_numpy(float)
    return np.maximum(idle, 0.0), peak.capacity.to_numpy(float), peak.index


def window_min(idle: np.ndarray, w: int) -> np.ndarray:
    """m[t] = min idle over rows t+1 … t+w per series (NaN if any is masked or beyond the data)."""
    ahead = pd.DataFrame(idle).shift(-1)[::-1]
    # rolling min with min_periods=w is NaN when any point in the window is NaN or missing
    return ahead.rolling(w, min_periods=w).min()[::-1].to_numpy()


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
    """Low-quantile gradient boosting of the window minimum, as a change from the current idle count."""

    def __init__(self, w: int, risk: float = 0.05, seed: int = 0) -> None:
        self.w, self.risk, self.seed = w, risk, seed
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
        if ok.sum() < 50:
            self._model = None  # too little history: the past-minimum rules still apply
            return self
        with bounded():
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
        with bounded():
            change = self._model.predict(Xo.reshape(-1, X.shape[-1])).reshape(Xo.shape[:2])
        return last[origins] + s[origins] * change, s[origins]


OFFSETS = np.linspace(-0.6, 0.2, 161)  # additive, in units of scale (capacity)
FACTORS = np.linspace(0.0, 1.0, 101)  # multiplicative, on the past-W minimum


def candidate_bases(idle, cap, times, origins, w, model: IdleModel | None) -> dict[str, np.ndarray]:
    """Unadjusted release levels per rule (all causal); calibration then lowers them per series."""
    ffi = feat.ffill(idle)
    bases = {
        "past_min+offset": _past_min(ffi, w)[origins],
        "past_min_yesterday+offset": baseline_release(idle, w, "min_past_w_and_yesterday")[origins],
        "past_min*factor": _past_min(ffi, w)[origins],
    }
    if model is not None and model._model is not None:
        bases["gbm_quantile+offset"] = model.raw(idle, cap, times, origins)[0]
    return bases


def apply_rule(rule: str, base: np.ndarray, scale: np.ndarray, param) -> np.ndarray:
    if rule.endswith("*factor"):
        return np.maximum(np.floor(base * param), 0)
    return np.maximum(np.floor(base + param * scale), 0)


def calibrate_rules(bases, scale, truth, risk):
    """Per series: for each rule the parameter with the most capture at violations ≤ risk, then
    the rule with the most capture. Returns (rule per series, parameter per series)."""
    ok = np.isfinite(truth)
    n_series = truth.shape[1]
    best_rule = ["past_min*factor"] * n_series
    best_param = np.zeros(n_series)
    best_capture = np.full(n_series, -1.0)
    for rule, base in bases.items():
        grid = FACTORS if rule.endswith("*factor") else OFFSETS
        for param in grid:
            r = apply_rule(rule, base, scale, param)
            viol = np.where(ok, r > truth, False).sum(axis=0) / np.maximum(ok.sum(axis=0), 1)
            cap_ = np.where(ok, np.minimum(r, truth), 0).sum(axis=0) / np.maximum(
                np.where(ok, truth, 0).sum(axis=0), 1e-9
            )
            better = (viol <= risk) & (cap_ > best_capture + 1e-9)
            for j in np.flatnonzero(better):
                best_rule[j], best_param[j], best_capture[j] = rule, param, cap_[j]
    return best_rule, best_param


def choose_margin(bases, scale, truth, risk, margins=MARGINS) -> float:
    """How much of the violation budget to spend when calibrating, decided on training data only.

    Calibrate on the first half of the calibration days with budget risk × margin, check the
    second half; the largest margin whose out-of-sample violation share (pooled over series)
    stays within the risk wins. Drift between weeks differs by data set (Philly's doubles the
    violations, Earth's barely moves them), so a fixed margin is wrong somewhere.
    """
    n = len(truth)
    half = n // 2
    first = {k: v[:half] for k, v in bases.items()}
    second = {k: v[half:] for k, v in bases.items()}
    for margin in sorted(margins, reverse=True):
        rule, param = calibrate_rules(first, scale[:half], truth[:half], risk * margin)
        t2 = truth[half:]
        ok = np.isfinite(t2)
        rel = np.column_stack(
            [
                apply_rule(rule[j], second[rule[j]][:, j], scale[half:, j], param[j])
                for j in range(t2.shape[1])
            ]
        )
        if ok.any() and np.mean(rel[ok] > t2[ok]) <= risk:
            return float(margin)
    return float(min(margins))


def backtest(
    panel: Panel,
    windows=(1, 4),
    risk: float = 0.05,
    test_from=None,
    test_to=None,
    refit_every: int = 168,
    recalibrate_every: int | None = None,
    releases: dict | None = None,
) -> pd.DataFrame:
    """Hourly release decisions over the test window for the advisor and the baseline rules.

    The advisor picks, per series, a release rule and its safety parameter on the last
    `CALIBRATION_DAYS` of the training part (violation budget risk × a margin chosen on those days
    by `choose_margin`). Every `recalibrate_every` origins (None, the default: never) the rule and
    parameter are re-picked the same way on the trailing `CALIBRATION_DAYS` of origins whose
    outcome (the window minimum) is known by then, with the margin kept; its model is refit every
    `refit_every` origins. `releases`, if given, receives per window the advisor's decisions as
    a frame (origins × series).
    """
    from advisor.forecast.rolling import test_window

    known = [s for s in panel.series if panel.capacity[s].notna().any()]
    if not known:  # idle = capacity − use: nothing to say without a capacity
        return pd.DataFrame()
    panel = panel.select(known)
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
    scale = feat.scale_of(idle, cap)
    rows = []
    for w in windows:
        truth = window_min(idle, w)
        ok = origins + w < len(idle)
        o = origins[ok]
        decisions = {rule: baseline_release(idle, w, rule)[o] for rule in BASELINE_RULES}
        val = np.arange(max(48, start - CALIBRATION_DAYS * 24 - w), start - w)
        model = IdleModel(w, risk).fit(idle, cap, times, int(val[0]) - w)
        bases = candidate_bases(idle, cap, times, val, w, model)
        margin = choose_margin(bases, scale[val], truth[val], risk)
        rule, param = calibrate_rules(bases, scale[val], truth[val], risk * margin)
        # the release levels each rule gave at every origin, each from the model in force then:
        # the training origins from the calibration model, the test origins from the refits
        hist = np.arange(int(val[0]), start) if recalibrate_every else val
        hist_bases = candidate_bases(idle, cap, times, hist, w, model)
        test_bases = {k: np.empty((len(o), idle.shape[1])) for k in hist_bases}
        for i in range(0, len(o), refit_every):
            block = o[i : i + refit_every]
            model.fit(idle, cap, times, int(block[0]))
            b = candidate_bases(idle, cap, times, block, w, model)
            for k in test_bases:
                test_bases[k][i : i + len(block)] = b.get(k, b["past_min*factor"])
        pos = np.concatenate([hist, o])
        all_bases = {k: np.concatenate([hist_bases[k], test_bases[k]]) for k in test_bases}
        adv = np.empty((len(o), idle.shape[1]))
        params = []
        step = recalibrate_every or len(o)
        for i in range(0, len(o), step):
            block = o[i : i + step]
            if recalibrate_every and i > 0:
                # re-pick on the trailing days whose outcome is known at the block's first origin
                d0 = int(block[0])
                win = (pos >= d0 - CALIBRATION_DAYS * 24 - w) & (pos <= d0 - w)
                rule, param = calibrate_rules(
                    {k: v[win] for k, v in all_bases.items()},
                    scale[pos[win]],
                    truth[pos[win]],
                    risk * margin,
                )
            params.append((rule, param))
            for j in range(idle.shape[1]):
                adv[i : i + len(block), j] = apply_rule(
                    rule[j], test_bases[rule[j]][i : i + len(block), j], scale[block, j], param[j]
                )
        capf = feat.ffill(cap)[o]
        decisions["advisor"] = np.minimum(adv, np.where(np.isfinite(capf), capf, np.inf))
        if releases is not None:
            releases[w] = pd.DataFrame(decisions["advisor"], index=times[o], columns=panel.series)
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
                        "params": f"{params[-1][0][j]}={params[-1][1][j]:.3f},margin={margin:g}"
                        + (f",recalibrated={len(params)}x" if len(params) > 1 else "")
                        if name == "advisor"
                        else "",
                    }
                )
    return pd.DataFrame(rows)


def idle_windows(panel: Panel, windows=(1, 4, 8), risk: float = 0.05) -> pd.DataFrame:
    """Live use: units safe to release now per series and window (rule calibrated on history)."""
    idle, cap, times = hourly_idle(panel)
    last = len(idle) - 1
    scale = feat.scale_of(idle, cap)
    now = np.array([last])
    out = []
    for w in windows:
        truth = window_min(idle, w)
        val = np.arange(max(48, last - CALIBRATION_DAYS * 24 - w), last - w + 1)
        model = None
        if int(val[0]) - w > 7 * 24:
            model = IdleModel(w, risk).fit(idle, cap, times, int(val[0]) - w)
        if len(val) >= 24:
            bases = candidate_bases(idle, cap, times, val, w, model)
            margin = choose_margin(bases, scale[val], truth[val], risk)
            rule, param = calibrate_rules(bases, scale[val], truth[val], risk * margin)
        else:
            rule, param = ["past_min*factor"] * idle.shape[1], np.full(idle.shape[1], 0.5)
        if model is not None:
            model.fit(idle, cap, times, last)
        b = candidate_bases(idle, cap, times, now, w, model)
        for j, s in enumerate(panel.series):
            base = b.get(rule[j], b["past_min*factor"])
            rel = apply_rule(rule[j], base[:, j], scale[now, j], param[j])[0]
            out.append(
                {
                    "series": s,
                    "window_h": w,
                    "risk": risk,
                    "release": float(min(rel, np.nan_to_num(feat.ffill(cap)[last, j], nan=np.inf))),
                    "current_idle": float(feat.ffill(idle)[last, j]),
                    "rule": rule[j],
                    "as_of": times[last],
                }
            )
    return pd.DataFrame(out)
