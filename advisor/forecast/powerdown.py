"""Power-down replay in the Helios CES setting (10-minute steps, Philly Dec 1–14), without look-ahead.

`ces_replay` re-implements the published policy skeleton (buffer, keep, trend tests) so that only
the forecast fed to it differs; every forecast at step i uses data ≤ i. The advisor also tunes the
skeleton's buffer and keep on the last two training weeks (`ces_tuned`), never on the test days.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from advisor.forecast import features as feat
from advisor.forecast.panel import Panel
from advisor.forecast.threads import bounded

STEP = "10min"
SPH = 6  # steps per hour


@dataclass(frozen=True)
class CES:
    """The CES artifact's Philly settings (history, future, thresholds, buffer, keep)."""

    history: int = 2
    future: int = 30
    his_threshold: float = 0.1
    fut_threshold: float = 0.0
    de_threshold: int = 1
    buffer: int = 20
    keep: int = 10


def step_series(panel: Panel, column: str | None = None) -> tuple[pd.Series, pd.Series]:
    """Nodes in use as the 10-minute max (the CES target) and the node total."""
    col = column or panel.series[0]
    used = panel.values[col].resample(STEP).max()
    total = panel.capacity[col].resample(STEP).max().reindex(used.index).ffill()
    return used, total


def path_mean(used: np.ndarray, n: int) -> np.ndarray:
    """mean(used[i … i+n−1]) per step (the quantity the CES policy averages its forecasts over)."""
    s = pd.Series(used)
    return s[::-1].rolling(n, min_periods=n).mean()[::-1].to_numpy()


def future_max(used: np.ndarray, k: int) -> np.ndarray:
    """max(used[i+1 … i+k]) per step: the peak the kept-on nodes must cover."""
    s = pd.Series(used).shift(-1)
    return s[::-1].rolling(k, min_periods=k).max()[::-1].to_numpy()


def _hgb(loss: str, q: float | None = None, seed: int = 0) -> Any:
    from sklearn.ensemble import HistGradientBoostingRegressor

    kw = {"loss": loss} if q is None else {"loss": "quantile", "quantile": q}
    return HistGradientBoostingRegressor(
        **kw,
        max_iter=150,
        learning_rate=0.05,
        max_leaf_nodes=15,
        min_samples_leaf=80,
        random_state=seed,
    )


class PathModel:
    """Direct model of a future path statistic (mean or max over the next n steps) as a change."""

    def __init__(self, kind: str, n: int, q: float | None = None) -> None:
        self.kind, self.n, self.q = kind, n, q
        self._model: Any = None  # the fitted regressor

    def _target(self, used: np.ndarray) -> np.ndarray:
        return path_mean(used, self.n) if self.kind == "mean" else future_max(used, self.n)

    def fit(
        self, used: np.ndarray, cap: np.ndarray, times: pd.DatetimeIndex, until: int
    ) -> PathModel:
        y = used[:, None]
        X, _, last, s = feat.build(y, cap[:, None], times, self.n, sph=SPH)
        truth = self._target(used)
        rows = np.arange(24 * SPH, until - self.n + 1)
        target = (truth[rows] - last[rows, 0]) / s[rows, 0]
        ok = np.isfinite(target)
        loss = "absolute_error" if self.q is None else "quantile"
        with bounded():
            self._model = _hgb(loss, self.q).fit(X[rows, 0][ok], target[ok])
        return self

    def predict(
        self, used: np.ndarray, cap: np.ndarray, times: pd.DatetimeIndex, origins: np.ndarray
    ) -> np.ndarray:
        X, _, last, s = feat.build(used[:, None], cap[:, None], times, self.n, sph=SPH)
        with bounded():
            change = self._model.predict(X[origins, 0])
        return last[origins, 0] + s[origins, 0] * change


def ces_replay(
    used: np.ndarray, total: np.ndarray, mean_f: np.ndarray, mean_2f: np.ndarray, p: CES = CES()
) -> dict:
    """The CES skeleton; mean_f[i], mean_2f[i] are forecasts of the path means made at step i."""
    n = len(used)
    active = np.zeros(n, int)
    lack = np.zeros(n, int)
    change = np.zeros(n, int)
    stable = 0
    for i in range(n):
        if i < 6:
            active[i] = min(used[i] + p.buffer, total[i])
            continue
        active[i] = active[i - 1]
        if active[i] < used[i]:
            lack[i] = used[i] - active[i]
            active[i] = used[i] + p.buffer
            change[i] = active[i] - active[i - 1]
            stable = i + p.keep
        active[i] = min(active[i], total[i])
        history_trend = np.mean(used[i - p.history : i]) - used[i]
        future_trend = used[i] - mean_f[i]
        if history_trend >= p.his_threshold and future_trend >= p.fut_threshold:
            if i < stable:
                continue
            stable = i
            if mean_f[i] < mean_2f[i]:
                continue
            target = min(active[i], used[i] + p.buffer)
            if active[i] - target >= p.de_threshold:
                active[i] = target
                change[i] = active[i] - active[i - 1]
    return _summary(used, total, active, lack, change)


def _summary(
    used: np.ndarray, total: np.ndarray, active: np.ndarray, lack: np.ndarray, change: np.ndarray
) -> dict[str, float]:
    days = len(used) / (24 * SPH)
    off = total - active
    return {
        "pct_node_hours_off": float(100 * off.sum() / total.sum()),
        "mean_nodes_off": float(off.mean()),
        "node_hours_off": float(off.sum() / SPH),
        "shortfalls_per_day": float((lack > 0).sum() / days),
        "shortfall_steps": int((lack > 0).sum()),
        "short_node_steps": int(lack.sum()),
        "changes_per_day": float((change != 0).sum() / days),
        "util_before": float(100 * np.mean(used / total)),
        "util_after": float(100 * np.mean(used / np.maximum(active, 1))),
    }


TUNE_MARGIN = 0.5
CES_GRID = {"buffer": (16, 18, 20, 22, 24, 26, 28, 30), "keep": (10, 20)}


SWEEP_BUFFERS = (
    0,
    5,
    10,
    15,
    20,
    25,
    30,
    40,
    50,
    60,
    80,
)  # the Pareto curves' points (keep as published)

FIT_DAYS = 7  # history the forecast models need before the tuning days


def replay(
    panel: Panel,
    test_from: object = None,
    test_to: object = None,
    tune_days: int = 14,
    max_shortfalls: float = 0.43,
) -> pd.DataFrame:
    """All forecasts through the CES skeleton (published settings), plus the skeleton with buffer and
    keep tuned on the training part for the advisor's forecast, plus each forecast over
    `SWEEP_BUFFERS` (policy "sweep": the savings-vs-shortfalls curve the report plots; not a choice).

    The test days are the demand backtest's (`rolling.test_window`: Philly's Dec 1–14 split, or the
    last 7 days of a file that does not reach it). A history too short to fit and tune before them
    gives an empty frame (the CLI says so) rather than a replay on made-up training.
    """
    from advisor.forecast.rolling import test_window

    hourly = panel.resample("h")
    hours = test_window(hourly, test_from, test_to)
    if not len(hours):
        return pd.DataFrame()
    first, end = hourly.index[hours[0]], hourly.index[hours[-1]] + pd.Timedelta(hours=1)
    used_s, total_s = step_series(panel)
    used_f = used_s.to_numpy(float)
    times = used_s.index
    # Masked steps: carry the last value so the replay has a number (they lie outside the test days).
    used_i = np.rint(feat.ffill(used_f[:, None])[:, 0]).astype(int)
    total_i = np.rint(total_s.to_numpy(float)).astype(int)
    test = np.flatnonzero((times >= first) & (times < end))
    if not len(test) or test[0] < (tune_days + FIT_DAYS) * 24 * SPH:
        return pd.DataFrame()
    start = int(test[0])
    p = CES()
    u, tot = used_i[test], total_i[test]
    rows = []

    def add(name: str, policy: str, res: dict[str, float], **extra: object) -> None:
        rows.append({"replay": "power_down", "model": name, "policy": policy, **res, **extra})

    # Forecasts fed to the CES skeleton; each is a function of data ≤ the step.
    last = used_f.copy()
    forecasts = {"naive": (last[test], last[test])}
    sn = pd.Series(used_f).shift(24 * SPH)
    forecasts["seasonal_naive_24"] = (
        path_mean(sn.to_numpy(), p.future)[test],
        path_mean(sn.to_numpy(), 2 * p.future)[test],
    )
    fit_until = start - 1
    m1 = PathModel("mean", p.future).fit(used_f, total_s.to_numpy(float), times, fit_until)
    m2 = PathModel("mean", 2 * p.future).fit(used_f, total_s.to_numpy(float), times, fit_until)
    forecasts["advisor"] = (
        m1.predict(used_f, total_s.to_numpy(float), times, test),
        m2.predict(used_f, total_s.to_numpy(float), times, test),
    )
    forecasts["oracle_lookahead"] = (
        path_mean(used_f, p.future)[test],
        path_mean(used_f, 2 * p.future)[test],
    )
    for name, (f1, f2) in forecasts.items():
        add(
            name,
            "ces_skeleton",
            ces_replay(u, tot, np.nan_to_num(f1, nan=u), np.nan_to_num(f2, nan=u), p),
        )

    # Savings vs shortfalls per forecast over the buffer: a Pareto curve for the report, on the test
    # days. Nothing is chosen from it (the tuned policy below sees training days only).
    for name, (f1, f2) in forecasts.items():
        for buffer in SWEEP_BUFFERS:
            cand = CES(buffer=buffer)
            res = ces_replay(u, tot, np.nan_to_num(f1, nan=u), np.nan_to_num(f2, nan=u), cand)
            add(name, "sweep", res, params=f"buffer={buffer},keep={cand.keep}")

    # The advisor's own policy, tuned on the last `tune_days` of training only, with a margin:
    # the shortfall budget on training is `TUNE_MARGIN` × the target, since out of sample it rises.
    tune = np.arange(start - tune_days * 24 * SPH, start)
    tune_fit = int(tune[0]) - 1
    budget = max_shortfalls * TUNE_MARGIN
    capf = total_s.to_numpy(float)
    t1 = PathModel("mean", p.future).fit(used_f, capf, times, tune_fit)
    t2 = PathModel("mean", 2 * p.future).fit(used_f, capf, times, tune_fit)
    tf1, tf2 = t1.predict(used_f, capf, times, tune), t2.predict(used_f, capf, times, tune)
    best, best_score = CES(), -np.inf
    for buffer in CES_GRID["buffer"]:
        for keep in CES_GRID["keep"]:
            cand = CES(buffer=buffer, keep=keep)
            r = ces_replay(used_i[tune], total_i[tune], tf1, tf2, cand)
            if r["shortfalls_per_day"] <= budget and r["pct_node_hours_off"] > best_score:
                best, best_score = cand, r["pct_node_hours_off"]
    f1, f2 = forecasts["advisor"]
    add(
        "advisor",
        "ces_tuned",
        ces_replay(u, tot, f1, f2, best),
        params=f"buffer={best.buffer},keep={best.keep}",
    )
    return pd.DataFrame(rows)
