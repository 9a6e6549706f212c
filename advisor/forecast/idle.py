"""Idle windows: how many units (GPUs or nodes) will stay free for the whole next W hours.

The truth for an hourly decision at origin t is m = min idle over (t, t+W], where idle in an hour is
capacity − the hour's peak use. The advisor's release R comes from a pooled quantile model of m
(gradient boosting over all series of the panel at several quantile levels, on the change from the
current idle count, with features of the origin hour's minutes: the idle at its last minute, its
highest idle and how long the count has been unchanged). Each hour the release is the quantile
level that maximises expected released units minus λ × that level's risk (`idle_quantile.lagrange_release`), so
the violation budget is spent where a full release is likely safe and saved where a drop is likely.
λ is one parameter per data set, picked on out-of-sample forecasts of the whole training part so
that the pooled violation share stays within the budget. The share of the budget to spend, and
whether this model or the older per-series rules (past-W minimum lowered by an offset or a
factor, picked per series on the last two training weeks) serve a data set, is decided on the last
training week, calibrated on the weeks before it (`_quantile_advisor`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from advisor.forecast import features as feat
from advisor.forecast import idle_quantile as iq
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


def baseline_release(idle: np.ndarray, w: int, rule: str) -> np.ndarray:
    """The research note's naive release rules, all causal."""
    ffi = feat.ffill(idle)
    past = feat.past_min(ffi, w)
    if rule == "current_idle":
        return ffi
    if rule == "min_past_w":
        return past
    if rule == "half_min_past_w":
        return np.floor(past / 2)
    if rule == "min_past_w_and_yesterday":
        # Same window yesterday: rows t+1−24 … t+w−24, all ≤ t since w ≤ 24.
        yesterday = feat.shift(feat.past_min(ffi, w), 24 - w) if w <= 24 else past
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
        X, last, s = self._features(idle, cap, times)
        truth = window_min(idle, self.w)
        rows = np.arange(0, until - self.w + 1)
        target = ((truth[rows] - last[rows]) / s[rows]).reshape(-1)
        Xr = X[rows].reshape(-1, X.shape[-1])
        ok = np.isfinite(target)
        if ok.sum() < 50:
            self._model = None  # too little history: the past-minimum rules still apply
            return self
        params = {
            "loss": "quantile",
            "quantile": max(self.risk, 0.01),
            "max_iter": 150,
            "learning_rate": 0.05,
            "max_leaf_nodes": 15,
            "min_samples_leaf": 40,
            "random_state": self.seed,
        }
        self._model = iq.fit_gbm(params, Xr[ok], target[ok])
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
        "past_min+offset": feat.past_min(ffi, w)[origins],
        "past_min_yesterday+offset": baseline_release(idle, w, "min_past_w_and_yesterday")[origins],
        "past_min*factor": feat.past_min(ffi, w)[origins],
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


CHECK_H = 7 * 24  # the last training weeks decide the margin and the method
CHECK_WEEKS = 2  # how many of them (each a pseudo-test calibrated on the hours before it)
QUANTILE_MARGINS = (1.0, 0.75, 0.5)


def _check(rel, truth, risk) -> tuple[bool, float, float]:
    """(within budget pooled and for the median series, median capture, median violations)."""
    ok = np.isfinite(truth)
    viol = np.where(ok, rel > truth, False)
    per_series = viol.sum(axis=0) / np.maximum(ok.sum(axis=0), 1)
    got = np.where(ok, np.minimum(rel, truth), 0).sum(axis=0)
    capture = got / np.maximum(np.where(ok, truth, 0).sum(axis=0), 1e-9)
    within = ok.any() and viol.sum() / ok.sum() <= risk and np.median(per_series) <= risk
    return bool(within), float(np.median(capture)), float(np.median(per_series))


def _calibrated_rules(idle, cap, times, scale, truth, val, w, risk):
    """Each series' rule and parameter calibrated on the origins `val` (the model-based rule only
    with a week of history before them). Under a day of calibration hours there is nothing to
    calibrate on: half the past-W minimum, the note's safe rule. Returns (model or None, rules,
    params, margin)."""
    model = None
    if len(val) and int(val[0]) - w > 7 * 24:
        model = IdleModel(w, risk).fit(idle, cap, times, int(val[0]) - w)
    if len(val) < 24:
        return model, ["past_min*factor"] * idle.shape[1], np.full(idle.shape[1], 0.5), 1.0
    bases = candidate_bases(idle, cap, times, val, w, model)
    margin = choose_margin(bases, scale[val], truth[val], risk)
    rule, param = calibrate_rules(bases, scale[val], truth[val], risk * margin)
    return model, rule, param, margin


def _rule_advisor(
    idle, cap, times, scale, truth, o, start, w, risk, refit_every, recalibrate_every
):
    """The per-series rules (fallback): rule and parameter picked per series on the last
    `CALIBRATION_DAYS` of the training part, optionally re-picked every `recalibrate_every`
    origins on the trailing days of known outcomes. Returns (releases, params per series)."""
    val = np.arange(max(48, start - CALIBRATION_DAYS * 24 - w), start - w)
    model, rule, param, margin = _calibrated_rules(idle, cap, times, scale, truth, val, w, risk)
    # the release levels each rule gave at every origin, each from the model in force then:
    # the training origins from the calibration model, the test origins from the refits
    hist = np.arange(int(val[0]), start) if recalibrate_every else val
    hist_bases = candidate_bases(idle, cap, times, hist, w, model)
    test_bases = {k: np.empty((len(o), idle.shape[1])) for k in hist_bases}
    for i in range(0, len(o), refit_every):
        block = o[i : i + refit_every]
        if model is not None:
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
    rule, param = params[-1]
    extra = f",recalibrated={len(params)}x" if len(params) > 1 else ""
    return adv, [f"{rule[j]}={param[j]:.3f},margin={margin:g}{extra}" for j in range(len(rule))]


def _quantile_advisor(
    panel, idle, cap, times, truth, o, start, w, risk, refit_every, recal, method="auto"
):
    """The pooled quantile model with one λ per data set, picked on out-of-sample forecasts of
    every training hour whose outcome is known at `start`.

    Which share of the budget to spend (`QUANTILE_MARGINS`), and whether this model or the
    per-series rules serve the data set at all, is decided on the last `CHECK_WEEKS` training
    weeks (of `CHECK_H` hours; only those with `MIN_CALIBRATION_H` out-of-sample hours before
    them, and at least the last), each a pseudo-test calibrated on the hours before it, their
    releases and outcomes pooled: the most median capture among the candidates within the budget
    (pooled and for the median series), else the fewest violations. Returns (releases at `o`, params per series), or None where the rules won or
    there is too little history for the model. `method="quantile"` leaves the rules out of the
    choice.
    """
    refits = iq.refit_schedule(start, refit_every, iq.MIN_HISTORY_H, int(o[-1]))
    if not len(refits):
        return None
    # pseudo-test weeks, oldest first: the last CHECK_WEEKS training weeks that leave the model
    # at least MIN_CALIBRATION_H out-of-sample hours before them
    weeks = [
        start - k * CHECK_H
        for k in range(CHECK_WEEKS, 0, -1)
        if start - k * CHECK_H - w + 1 - refits[0] >= iq.MIN_CALIBRATION_H
    ]
    if start - CHECK_H not in weeks:
        return None
    refits = np.union1d(refits, weeks)  # each week's check sees the models of its time
    X, cur, s = iq.idle_features(panel, idle, cap, times, w)
    norm = iq.release_norm(idle)
    first = int(refits[0])
    rows = np.arange(first, int(o[-1]) + 1)
    Q = iq.quantile_paths(X, cur, s, cap, (truth - cur) / s, w, rows, refits)

    def q(t):
        return Q[:, np.asarray(t) - first]

    # each week's rows: its hours whose outcome is known at `start`; the weeks' releases and
    # outcomes are pooled into one check
    checks = [np.arange(c, min(c + CHECK_H, start - w + 1)) for c in weeks]
    truth_check = np.concatenate([truth[c] for c in checks])
    best_key, margin = (False, -np.inf), None
    if method != "quantile":
        scale = feat.scale_of(idle, cap)
        rules = np.concatenate(
            [
                _rule_advisor(
                    idle, cap, times, scale, truth, c, int(c[0]), w, risk, refit_every, None
                )[0]
                for c in checks
            ]
        )
        within, capture, viol = _check(rules, truth_check, risk)
        best_key = (within, capture if within else -viol)
    for m in QUANTILE_MARGINS:
        rel = []
        for c in checks:
            before = np.arange(first, int(c[0]) - w + 1)
            lam = iq.lambda_for(q(before), norm[before], truth[before], risk * m)
            rel.append(iq.lagrange_release(q(c), lam, norm[c]))
        within, capture, viol = _check(np.concatenate(rel), truth_check, risk)
        key = (within, capture if within else -viol)
        if key > best_key:
            best_key, margin = key, m
    if margin is None:
        return None
    cal = np.arange(first, start - w + 1)
    lam = iq.lambda_for(q(cal), norm[cal], truth[cal], risk * margin)
    adv = np.empty((len(o), idle.shape[1]))
    step = recal or len(o)
    n_picks = 0
    for i in range(0, len(o), step):
        block = o[i : i + step]
        if recal and i > 0:
            # re-pick λ on every hour whose outcome is known at the block's first origin
            known = np.arange(first, int(block[0]) - w + 1)
            lam = iq.lambda_for(q(known), norm[known], truth[known], risk * margin)
        n_picks += 1
        adv[i : i + len(block)] = iq.lagrange_release(q(block), lam, norm[block])
    extra = f",recalibrated={n_picks}x" if n_picks > 1 else ""
    return adv, [f"quantile_lagrange:lam={x:.3g},margin={margin:g}{extra}" for x in lam]


def backtest(
    panel: Panel,
    windows=(1, 4),
    risk: float = 0.05,
    test_from=None,
    test_to=None,
    refit_every: int = 168,
    recalibrate_every: int | None = None,
    releases: dict | None = None,
    method: str = "auto",
) -> pd.DataFrame:
    """Hourly release decisions over the test window for the advisor and the baseline rules.

    The advisor's pooled quantile model (`idle_quantile.quantile_paths`) is refit every `refit_every` origins
    on the outcomes known then; its λ is picked on its out-of-sample forecasts of the training
    hours whose outcome is known at the test start (`_quantile_advisor`, which also decides on
    the last training week whether it or the per-series rules serve the data set). Every `recalibrate_every`
    origins (None, the default: never) λ is re-picked on all hours known by then, the margin
    kept. With too little history the per-series rules are used instead (`_rule_advisor`).
    `releases`, if given, receives per window the advisor's decisions as a frame (origins ×
    series). `method`: "auto" (as above), "quantile" (the model wherever it has the history)
    or "rules" (the per-series rules only).
    """
    from advisor.forecast.rolling import test_window

    known = with_capacity(panel)
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
    capf = feat.ffill(cap)
    capf = np.where(np.isfinite(capf), capf, np.inf)
    bound = np.full(idle.shape, np.inf)  # the advisor's release for the shorter windows so far
    per_window = {}
    for w in sorted(set(windows)):
        truth = window_min(idle, w)
        ok = origins + w < len(idle)
        o = origins[ok]
        decisions = {rule: baseline_release(idle, w, rule)[o] for rule in BASELINE_RULES}
        args = (idle, cap, times, truth, o, start, w, risk, refit_every, recalibrate_every)
        picked = None if method == "rules" else _quantile_advisor(panel, *args, method=method)
        if picked is None:
            picked = _rule_advisor(idle, cap, times, scale, *args[3:])
        adv, params = picked
        # never more than capacity, nor more than a shorter window's release at the same origin
        # (the minimum over a longer window cannot exceed the minimum over a shorter one)
        decisions["advisor"] = np.minimum(np.minimum(adv, capf[o]), bound[o])
        bound[o] = np.fmin(bound[o], decisions["advisor"])  # a NaN release bounds nothing
        per_window[w] = (o, truth, decisions, params)
    rows = []
    for w in windows:
        o, truth, decisions, params = per_window[w]
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
                        "params": params[j] if name == "advisor" else "",
                    }
                )
    return pd.DataFrame(rows)


def with_capacity(panel: Panel) -> list[str]:
    """The series that ever had capacity. A pool with none has nothing to release and cannot be
    wrong, so it stays out of the pooled model and its λ: its hours would only dilute the pooled
    violation share and let the other pools take more risk."""
    return [s for s in panel.series if (panel.capacity[s] > 0).any()]


def idle_windows(
    panel: Panel, windows=(1, 4, 8), risk: float = 0.05, method: str = "auto"
) -> pd.DataFrame:
    """Live use: units safe to release now per series and window.

    The same choice as `backtest` with the last hour as the origin: the pooled quantile model
    (refit weekly backwards from now) with λ picked on its out-of-sample forecasts of the history,
    where the last week says it beats the per-series rules; otherwise, and with too little
    history for it, the per-series rules. A series without capacity releases 0 (rule "no_capacity").
    `method`: "auto" (as above) or "rules" (the per-series rules only, as `backtest`'s)."""
    if method not in ("auto", "rules"):
        raise ValueError(f"idle_windows method must be 'auto' or 'rules', not {method!r}")
    known = with_capacity(panel)
    if len(known) < len(panel.series):
        empty = [s for s in panel.series if s not in known]
        as_of = panel.resample("h").index[-1]
        rows = [
            {
                "series": s,
                "window_h": w,
                "risk": risk,
                "release": 0.0,
                "current_idle": 0.0,
                "rule": "no_capacity",
                "as_of": as_of,
            }
            for w in windows
            for s in empty
        ]
        found = (
            idle_windows(panel.select(known), windows, risk, method) if known else pd.DataFrame()
        )
        out = pd.concat([found, pd.DataFrame(rows)], ignore_index=True)
        rank = {"window_h": {w: i for i, w in enumerate(windows)}}
        rank["series"] = {s: i for i, s in enumerate(panel.series)}
        out = out.sort_values(["window_h", "series"], key=lambda c: c.map(rank[c.name]))
        return out.reset_index(drop=True)
    idle, cap, times = hourly_idle(panel)
    last = len(idle) - 1
    scale = feat.scale_of(idle, cap)
    now = np.array([last])
    capf = np.nan_to_num(feat.ffill(cap)[last], nan=np.inf)
    bound = np.full(idle.shape[1], np.inf)  # the release for the shorter windows so far
    per_window = {}
    for w in sorted(set(windows)):
        truth = window_min(idle, w)
        picked = None
        if method != "rules":
            picked = _quantile_advisor(
                panel, idle, cap, times, truth, now, last, w, risk, 168, None
            )
        if picked is not None:
            rel, rules = picked[0][0], [r.split(",")[0] for r in picked[1]]
        else:
            rel, rules = _rule_release_now(idle, cap, times, scale, truth, last, w, risk)
        # a longer window never releases more than a shorter one (its minimum cannot be higher)
        rel = np.minimum(np.minimum(rel, capf), bound)
        bound = np.fmin(bound, rel)
        per_window[w] = (rel, rules)
    current = feat.ffill(idle)[last]  # once, not per series and window
    out = []
    for w in windows:
        rel, rules = per_window[w]
        for j, s in enumerate(panel.series):
            out.append(
                {
                    "series": s,
                    "window_h": w,
                    "risk": risk,
                    "release": float(rel[j]),
                    "current_idle": float(current[j]),
                    "rule": rules[j],
                    "as_of": times[last],
                }
            )
    return pd.DataFrame(out)


def _rule_release_now(idle, cap, times, scale, truth, last, w, risk):
    """The per-series rules' release at the last hour (short histories)."""
    now = np.array([last])
    val = np.arange(max(48, last - CALIBRATION_DAYS * 24 - w), last - w + 1)
    model, rule, param, _ = _calibrated_rules(idle, cap, times, scale, truth, val, w, risk)
    if model is not None:
        model.fit(idle, cap, times, last)
    b = candidate_bases(idle, cap, times, now, w, model)
    rel = [
        apply_rule(rule[j], b.get(rule[j], b["past_min*factor"])[:, j], scale[now, j], param[j])[0]
        for j in range(idle.shape[1])
    ]
    return np.array(rel), list(rule)
