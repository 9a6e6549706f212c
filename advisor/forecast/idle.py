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

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from advisor.forecast import features as feat
from advisor.forecast import idle_quantile as iq
from advisor.forecast import metrics as M
from advisor.forecast.panel import Panel
from advisor.forecast.significance import release_bootstrap
from advisor.forecast.threads import bounded
from advisor.settings import IDLE_RISK, IDLE_WINDOWS_H

CALIBRATION_DAYS = 14
MARGINS = (1.0, 0.75, 0.5, 0.25)
BASELINE_RULES = ("current_idle", "min_past_w", "min_past_w_and_yesterday", "half_min_past_w")


def hourly_idle(panel: Panel) -> tuple[np.ndarray, np.ndarray, pd.DatetimeIndex]:
    """Idle units per hour = capacity − peak use in the hour (NaN where the hour is masked)."""
    peak = panel.resample("h", how="max")
    idle = peak.capacity.to_numpy(float) - peak.values.to_numpy(float)
    return np.maximum(idle, 0.0), peak.capacity.to_numpy(float), peak.index


def window_min(idle: np.ndarray, w: int) -> np.ndarray:
    """m[t] = min idle over rows t+1 … t+w per series (NaN if any is masked or beyond the data).

    What a rolling minimum with min_periods=w over the rows ahead gives (±inf counting as
    masked, as in pandas' rolling windows), in its memory layout, by NaN-propagating minima of
    doubling spans instead of pandas' loop over columns."""
    x = np.asarray(idle)
    if x.ndim != 2 or w < 1 or x.dtype.kind not in "biuf":
        ahead = pd.DataFrame(idle).shift(-1)[::-1]
        # rolling min with min_periods=w is NaN when any point in the window is NaN or missing
        return ahead.rolling(w, min_periods=w).min()[::-1].to_numpy()
    # rows t+1 … t+w, reversed in time so that the window trails: back[u] = idle[T − u]
    back = np.full(x.shape, np.nan, order="F")
    back[1:] = x[:0:-1]
    back[np.isinf(back)] = np.nan
    out = feat.trailing(back, w, np.minimum)
    out[: w - 1] = np.nan  # fewer than w rows left
    return out[::-1]


def baseline_release(
    idle: np.ndarray, w: int, rule: str, ffi: np.ndarray | None = None
) -> np.ndarray:
    """The research note's naive release rules, all causal. `ffi`: `feat.ffill(idle)` where the
    caller has it already."""
    ffi = feat.ffill(idle) if ffi is None else ffi
    if rule == "current_idle":
        return ffi
    past = feat.past_min(ffi, w)
    if rule == "min_past_w":
        return past
    if rule == "half_min_past_w":
        return np.floor(past / 2)
    if rule == "min_past_w_and_yesterday":
        return _and_yesterday(past, w)
    raise ValueError(rule)


def _and_yesterday(past: np.ndarray, w: int) -> np.ndarray:
    """The past-W minimum (`past`), no more than the same window yesterday: rows t+1−24 …
    t+w−24, all ≤ t since w ≤ 24."""
    yesterday = feat.shift(past, 24 - w) if w <= 24 else past
    return np.fmin(past, np.where(np.isfinite(yesterday), yesterday, past))


class IdleModel:
    """Low-quantile gradient boosting of the window minimum, as a change from the current idle count.

    `fit(idle, cap, times, until)` learns from rows whose outcome is known at `until`;
    `predict(idle, cap, times, origins)` gives the release level at each origin (rows ≤ it), as
    the other level models (`PastMin`, `PastMinYesterday`) and the demand forecasters do. `pool`
    (a boolean mask over the series; None: all): the series it learns from. It forecasts every
    series; a caller that serves a data-dependent set of series learns from a fixed one."""

    name = "gbm_quantile"

    def __init__(
        self, w: int, risk: float = 0.05, seed: int = 0, pool: np.ndarray | None = None
    ) -> None:
        self.w, self.risk, self.seed, self.pool = w, risk, seed, pool
        self._model: Any = None  # the fitted regressor
        self._cache: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None

    def _features(
        self, idle: np.ndarray, cap: np.ndarray, times: pd.DatetimeIndex
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._cache is None or self._cache[0] is not idle:
            X, _, last, s = feat.build(idle, cap, times, self.w)
            self._cache = (idle, X, last, s)
        return self._cache[1], self._cache[2], self._cache[3]

    @property
    def fitted(self) -> bool:
        """False until a fit had enough rows (then only the past-minimum rules apply)."""
        return self._model is not None

    def fit(
        self, idle: np.ndarray, cap: np.ndarray, times: pd.DatetimeIndex, until: int
    ) -> IdleModel:
        X, last, s = self._features(idle, cap, times)
        truth = window_min(idle, self.w)
        rows = np.arange(0, until - self.w + 1)
        cols = slice(None) if self.pool is None else np.flatnonzero(self.pool)
        target = ((truth[rows][:, cols] - last[rows][:, cols]) / s[rows][:, cols]).reshape(-1)
        Xr = X[rows][:, cols].reshape(-1, X.shape[-1])
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

    def predict(
        self, idle: np.ndarray, cap: np.ndarray, times: pd.DatetimeIndex, origins: np.ndarray
    ) -> np.ndarray:
        X, last, s = self._features(idle, cap, times)
        Xo = X[origins]
        with bounded():
            change = self._model.predict(Xo.reshape(-1, X.shape[-1])).reshape(Xo.shape[:2])
        return last[origins] + s[origins] * change


class PastMin:
    """The lowest idle over the past W hours (masked hours read as the last observed): the
    per-series rules' level, with the fit/predict of the other models (fitting learns nothing)."""

    name = "past_min"

    def __init__(self, w: int) -> None:
        self.w = w
        self._cache: tuple[np.ndarray, np.ndarray] | None = None

    def fit(self, idle: np.ndarray, cap: object, times: object, until: int) -> PastMin:
        return self

    def levels(self, idle: np.ndarray) -> np.ndarray:
        """The level at every row (each from rows ≤ it)."""
        if self._cache is None or self._cache[0] is not idle:
            self._cache = (idle, self._compute(idle))
        return self._cache[1]

    def _compute(self, idle: np.ndarray) -> np.ndarray:
        return feat.past_min(feat.ffill(idle), self.w)

    def predict(
        self, idle: np.ndarray, cap: object, times: object, origins: np.ndarray
    ) -> np.ndarray:
        return self.levels(idle)[origins]


class PastMinYesterday(PastMin):
    """The past-W minimum, no more than the same window yesterday (`_and_yesterday`)."""

    name = "past_min_yesterday"

    def _compute(self, idle: np.ndarray) -> np.ndarray:
        return _and_yesterday(super()._compute(idle), self.w)


Param = float | np.ndarray  # a rule's parameter: one, or one per series
OFFSETS = np.linspace(-0.6, 0.2, 161)  # additive, in units of scale (capacity)
FACTORS = np.linspace(0.0, 1.0, 101)  # multiplicative, on the past-W minimum


class Offset:
    """A release `floor(level + param × scale)`, at least 0, param on the `OFFSETS` grid."""

    grid = OFFSETS

    def apply(self, base: np.ndarray, scale: np.ndarray, param: Param) -> np.ndarray:
        return np.maximum(np.floor(base + param * scale), 0)

    def guess(self, level: np.ndarray, base: np.ndarray, scale: np.ndarray) -> np.ndarray:
        """The parameter at which the release reaches `level` (the formula, before flooring)."""
        return (level - base) / scale

    def monotone(self, base: np.ndarray, scale: np.ndarray, ok: np.ndarray) -> bool:
        """The release never falls along the rising grid where `ok`: a finite scale ≥ 0."""
        sc = np.broadcast_to(scale, ok.shape)[ok]
        return bool((np.isfinite(sc) & (sc >= 0)).all())


class Factor:
    """A release `floor(level × param)`, at least 0, param on the `FACTORS` grid."""

    grid = FACTORS

    def apply(self, base: np.ndarray, scale: np.ndarray, param: Param) -> np.ndarray:
        return np.maximum(np.floor(base * param), 0)

    def guess(self, level: np.ndarray, base: np.ndarray, scale: np.ndarray) -> np.ndarray:
        return level / base

    def monotone(self, base: np.ndarray, scale: np.ndarray, ok: np.ndarray) -> bool:
        """The release never falls along the rising grid where `ok`: a finite level ≥ 0."""
        b = np.broadcast_to(base, ok.shape)[ok]
        return not ((b < 0) | np.isinf(b)).any()


OFFSET, FACTOR = Offset(), Factor()
# the per-series rules by the name decisions.csv gives them: their level model and adjustment
RULES: dict[str, tuple[type[PastMin] | type[IdleModel], Offset | Factor]] = {
    "past_min+offset": (PastMin, OFFSET),
    "past_min_yesterday+offset": (PastMinYesterday, OFFSET),
    "past_min*factor": (PastMin, FACTOR),
    "gbm_quantile+offset": (IdleModel, OFFSET),
}
DEFAULT_RULE = "past_min*factor"  # half the past-W minimum: the note's safe rule


def rule_levels(idle: np.ndarray, w: int) -> dict[str, np.ndarray]:
    """The past-minimum rules' unadjusted release levels at every row (`candidate_bases` takes
    its origins' rows), for callers that take several sets of origins."""
    models: dict[type, PastMin] = {PastMin: PastMin(w), PastMinYesterday: PastMinYesterday(w)}
    return {
        name: models[level].levels(idle)
        for name, (level, _adjust) in RULES.items()
        if level in models
    }


def candidate_bases(
    idle: np.ndarray,
    cap: np.ndarray,
    times: pd.DatetimeIndex,
    origins: np.ndarray,
    w: int,
    model: IdleModel | None,
    levels: dict[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """Unadjusted release levels per rule (all causal); calibration then lowers them per series.
    `levels`: `rule_levels(idle, w)` where the caller has it already."""
    levels = rule_levels(idle, w) if levels is None else levels
    bases = {rule: level[origins] for rule, level in levels.items()}
    if model is not None and model.fitted:
        bases["gbm_quantile+offset"] = model.predict(idle, cap, times, origins)
    return bases


def adjustment(rule: str) -> Offset | Factor:
    """How the named rule lowers its level (`RULES`)."""
    return RULES[rule][1]


def apply_rule(rule: str, base: np.ndarray, scale: np.ndarray, param: Param) -> np.ndarray:
    return adjustment(rule).apply(base, scale, param)


def calibrate_rules(
    bases: dict[str, np.ndarray],
    scale: np.ndarray,
    truth: np.ndarray,
    risk: float,
    violations: dict[str, np.ndarray] | None = None,
) -> tuple[list[str], np.ndarray]:
    """Per series: for each rule the parameter with the most capture at violations ≤ risk, then
    the rule with the most capture. Returns (rule per series, parameter per series).

    The grids are walked in order and a parameter wins only with 1e-9 more capture than the
    best so far. All series at once; where the outcomes are whole units (GPUs, nodes) the walk
    is short-cut exactly (`_calibrate_whole`), otherwise every parameter is tried.
    `violations`: a dict that keeps each rule's violation shares between calls on the same
    bases, scale and truth at other risks (`choose_margin`)."""
    ok = np.isfinite(truth)
    n_series = truth.shape[1]
    rule_at = np.zeros(n_series, dtype=int)  # index into `names`; 0: the default
    names = [DEFAULT_RULE]
    best_param = np.zeros(n_series)
    best_capture = np.full(n_series, -1.0)
    n_ok = np.maximum(ok.sum(axis=0), 1)
    total = np.maximum(np.where(ok, truth, 0).sum(axis=0), 1e-9)
    whole = _whole_units(truth, ok)
    for rule, base in bases.items():
        grid = adjustment(rule).grid
        names.append(rule)
        if whole and _monotone(rule, base, scale, ok, grid):
            memo = {} if violations is None else violations
            if rule not in memo:
                memo[rule] = _violations(rule, base, scale, truth, ok, grid, n_ok)
            better, param, capture = _calibrate_whole(
                rule, base, scale, truth, ok, grid, risk, total, best_capture, memo[rule]
            )
            best_param[better] = param[better]
            best_capture[better] = capture[better]
            rule_at[better] = len(names) - 1
            continue
        for param in grid:
            r = apply_rule(rule, base, scale, param)
            viol = np.where(ok, r > truth, False).sum(axis=0) / n_ok
            cap_ = np.where(ok, np.minimum(r, truth), 0).sum(axis=0) / total
            better = (viol <= risk) & (cap_ > best_capture + 1e-9)
            best_param[better] = param
            best_capture[better] = cap_[better]
            rule_at[better] = len(names) - 1
    return [names[k] for k in rule_at], best_param


WHOLE_MAX = 1e8  # Σ outcome per series up to which captures of whole units are told apart by 1e-9


def _whole_units(truth: np.ndarray, ok: np.ndarray) -> bool:
    """Outcomes in whole units ≥ 0 with per-series sums ≤ WHOLE_MAX: then every capture sum is
    an exact integer (any summation order gives the same figure) and two different sums give
    captures more than 1e-9 apart."""
    t = truth[ok]
    if not len(t):
        return True
    if (t < 0).any() or (t != np.floor(t)).any():
        return False
    return bool((np.where(ok, truth, 0).sum(axis=0) <= WHOLE_MAX).all())


def _monotone(
    rule: str, base: np.ndarray, scale: np.ndarray, ok: np.ndarray, grid: np.ndarray
) -> bool:
    """Whether each hour's release never falls along the (rising) grid, NaN at no or every
    parameter: offsets need a finite scale ≥ 0, factors a finite base ≥ 0 (where known)."""
    if not (np.diff(grid) > 0).all():
        return False
    return adjustment(rule).monotone(base, scale, ok)


def _first_reaching(
    rule: str,
    base: np.ndarray,
    scale: np.ndarray,
    grid: np.ndarray,
    level: np.ndarray,
    active: np.ndarray,
) -> np.ndarray:
    """Per element: the first grid index whose release is ≥ `level` (a whole number), len(grid)
    if none; 0 where not `active`. A guess from the rule's formula, confirmed by the release
    itself at that index and the one before (the release never falls along the grid), and a
    bisection where the guess was off."""
    n_grid = len(grid)
    with np.errstate(all="ignore"):
        p = adjustment(rule).guess(level, base, scale)
    k = np.where(active & (level > 0), np.searchsorted(grid, p), 0)  # NaN p: n_grid

    def reaches(b: np.ndarray, s: np.ndarray, lv: np.ndarray, kk: np.ndarray) -> np.ndarray:
        return apply_rule(rule, b, s, grid[np.clip(kk, 0, n_grid - 1)]) >= lv

    fine = ((k == n_grid) | reaches(base, scale, level, k)) & (
        (k == 0) | ~reaches(base, scale, level, k - 1)
    )
    off = np.flatnonzero(active & ~fine)
    if len(off):
        b = np.broadcast_to(base, k.shape).ravel()[off]
        s = np.broadcast_to(scale, k.shape).ravel()[off]
        lv = np.broadcast_to(level, k.shape).ravel()[off]
        lo, hi = np.zeros(len(off), dtype=np.intp), np.full(len(off), n_grid, dtype=np.intp)
        while (lo < hi).any():
            mid = (lo + hi) // 2
            up = reaches(b, s, lv, mid) & (lo < hi)
            hi = np.where(up, mid, hi)
            lo = np.where(up | (lo >= hi), lo, mid + 1)
        k.flat[off] = lo
    return k


def _violations(
    rule: str,
    base: np.ndarray,
    scale: np.ndarray,
    truth: np.ndarray,
    ok: np.ndarray,
    grid: np.ndarray,
    n_ok: np.ndarray,
) -> np.ndarray:
    """(grid, series) violation shares of a rule whose release never falls along the grid, on
    whole-unit outcomes: each hour's first violating parameter, counted."""
    n_grid, n_series = len(grid), truth.shape[1]
    # each hour's first violating grid index (n_grid: none); release > whole outcome t ⇔ ≥ t + 1
    first = np.where(ok, _first_reaching(rule, base, scale, grid, truth + 1, ok), n_grid)
    # violations at each grid index per series: hours whose first violation is at or before it
    cols = np.broadcast_to(np.arange(n_series), first.shape)
    counts = np.bincount((first * n_series + cols).ravel(), minlength=(n_grid + 1) * n_series)
    return np.cumsum(counts.reshape(n_grid + 1, n_series), axis=0)[:n_grid] / n_ok


def _calibrate_whole(
    rule: str,
    base: np.ndarray,
    scale: np.ndarray,
    truth: np.ndarray,
    ok: np.ndarray,
    grid: np.ndarray,
    risk: float,
    total: np.ndarray,
    best_capture: np.ndarray,
    viol: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One rule of `calibrate_rules` on whole-unit outcomes with a release that never falls
    along the grid: the same pick as walking the grid, from a few passes instead of one per
    parameter.

    Violations never fall along the grid, so the parameters within the budget are a prefix of
    it; capture never falls either, and as an integer sum over a common total it either stays
    the same figure or rises by more than 1e-9. Walking the prefix therefore ends on the first
    parameter with the prefix's last capture, if that capture beats the best so far by 1e-9:
    the first where every hour's min(release, outcome) has reached its value at the prefix's
    end. Returns (series whose pick this rule takes, its parameter, its capture)."""
    n_grid, n_series = len(grid), truth.shape[1]
    within = viol <= risk  # `_violations`
    n_within = np.where(within.all(axis=0), n_grid, within.argmin(axis=0))
    last = np.maximum(n_within - 1, 0)
    got = np.minimum(apply_rule(rule, base, scale, grid[last]), truth)
    capture = np.where(ok, got, 0).sum(axis=0) / total
    better = (n_within > 0) & (capture > best_capture + 1e-9)  # NaN capture: never
    param = np.full(n_series, grid[0])
    j = np.flatnonzero(better)  # only these series need the first parameter
    if len(j):
        b, sc = np.broadcast_to(base, truth.shape), np.broadcast_to(scale, truth.shape)
        reach = _first_reaching(rule, b[:, j], sc[:, j], grid, got[:, j], ok[:, j])
        param[j] = grid[reach.max(axis=0, initial=0)]
    return better, param, capture


def _apply_per_series(
    rule: Sequence[str],
    base_of: Callable[[str], np.ndarray],
    scale: np.ndarray,
    param: np.ndarray,
) -> np.ndarray:
    """Column j: `apply_rule(rule[j], base_of(rule[j])[:, j], scale[:, j], param[j])`, a rule at
    a time for all its series."""
    out = np.empty(np.shape(scale))
    names = np.asarray(rule, dtype=object)
    for name in dict.fromkeys(rule):
        j = np.flatnonzero(names == name)
        out[:, j] = apply_rule(name, base_of(name)[:, j], scale[:, j], param[j])
    return out


def choose_margin(
    bases: dict[str, np.ndarray],
    scale: np.ndarray,
    truth: np.ndarray,
    risk: float,
    margins: Sequence[float] = MARGINS,
    counted: np.ndarray | None = None,
) -> float:
    """How much of the violation budget to spend when calibrating, decided on training data only.

    Calibrate on the first half of the calibration days with budget risk × margin, check the
    second half; the largest margin whose out-of-sample violation share (pooled over series)
    stays within the risk wins. Drift between weeks differs by data set (Philly's doubles the
    violations, Earth's barely moves them), so a fixed margin is wrong somewhere.
    `counted` (as `truth`; None: all): the hours the pooled share counts.
    """
    n = len(truth)
    half = n // 2
    first = {k: v[:half] for k, v in bases.items()}
    second = {k: v[half:] for k, v in bases.items()}
    violations: dict = {}  # the same half at every margin
    for margin in sorted(margins, reverse=True):
        rule, param = calibrate_rules(first, scale[:half], truth[:half], risk * margin, violations)
        t2 = truth[half:]
        ok = np.isfinite(t2) if counted is None else np.isfinite(t2) & counted[half:]
        rel = _apply_per_series(rule, second.__getitem__, scale[half:], param)
        if ok.any() and np.mean(rel[ok] > t2[ok]) <= risk:
            return float(margin)
    return float(min(margins))


CHECK_H = 7 * 24  # the last training weeks decide the margin and the method
CHECK_WEEKS = 2  # how many of them (each a pseudo-test calibrated on the hours before it)
QUANTILE_MARGINS = (1.0, 0.75, 0.5)


def _check(rel: np.ndarray, truth: np.ndarray, risk: float) -> tuple[bool, float, float]:
    """(within budget pooled and for the median series, median capture, median violations)."""
    ok = np.isfinite(truth)
    viol = np.where(ok, rel > truth, False)
    per_series = viol.sum(axis=0) / np.maximum(ok.sum(axis=0), 1)
    got = np.where(ok, np.minimum(rel, truth), 0).sum(axis=0)
    capture = got / np.maximum(np.where(ok, truth, 0).sum(axis=0), 1e-9)
    within = ok.any() and viol.sum() / ok.sum() <= risk and np.median(per_series) <= risk
    return bool(within), float(np.median(capture)), float(np.median(per_series))


def _calibrated_rules(
    idle: np.ndarray,
    cap: np.ndarray,
    times: pd.DatetimeIndex,
    scale: np.ndarray,
    truth: np.ndarray,
    val: np.ndarray,
    w: int,
    risk: float,
    levels: dict[str, np.ndarray] | None = None,
    pool: np.ndarray | None = None,
) -> tuple[IdleModel | None, list[str], np.ndarray, float]:
    """Each series' rule and parameter calibrated on the origins `val` (the model-based rule only
    with a week of history before them). Under a day of calibration hours there is nothing to
    calibrate on: half the past-W minimum, the note's safe rule. The model and the margin learn
    from the series of `pool` (a boolean mask; None: all). Returns (model or None, rules,
    params, margin)."""
    model = None
    if len(val) and int(val[0]) - w > 7 * 24:
        model = IdleModel(w, risk, pool=pool).fit(idle, cap, times, int(val[0]) - w)
    if len(val) < 24:
        return model, [DEFAULT_RULE] * idle.shape[1], np.full(idle.shape[1], 0.5), 1.0
    bases = candidate_bases(idle, cap, times, val, w, model, levels)
    # an hour without capacity (known 0 at the origin) cannot be wrong: like a series without
    # any (`with_capacity`) it does not dilute the pooled share, and whether a series that has
    # none yet is in the panel at all (it gains capacity later) then changes nothing here
    counted = ~(feat.ffill(cap)[val] <= 0)
    if pool is not None:
        counted &= pool
    margin = choose_margin(bases, scale[val], truth[val], risk, counted=counted)
    rule, param = calibrate_rules(bases, scale[val], truth[val], risk * margin)
    return model, rule, param, margin


def _rule_advisor(
    idle: np.ndarray,
    cap: np.ndarray,
    times: pd.DatetimeIndex,
    scale: np.ndarray,
    truth: np.ndarray,
    o: np.ndarray,
    start: int,
    w: int,
    risk: float,
    refit_every: int,
    recalibrate_every: int | None,
    pool: np.ndarray | None = None,
) -> tuple[np.ndarray, list[str]]:
    """The per-series rules (fallback): rule and parameter picked per series on the last
    `CALIBRATION_DAYS` of the training part, optionally re-picked every `recalibrate_every`
    origins on the trailing days of known outcomes; model and margin learn from `pool`
    (`_calibrated_rules`). Returns (releases, params per series)."""
    val = np.arange(max(48, start - CALIBRATION_DAYS * 24 - w), start - w)
    levels = rule_levels(idle, w)
    model, rule, param, margin = _calibrated_rules(
        idle, cap, times, scale, truth, val, w, risk, levels, pool
    )
    # the release levels each rule gave at every origin, each from the model in force then:
    # the training origins from the calibration model, the test origins from the refits
    hist = np.arange(int(val[0]), start) if recalibrate_every else val
    hist_bases = candidate_bases(idle, cap, times, hist, w, model, levels)
    test_bases = {k: np.empty((len(o), idle.shape[1])) for k in hist_bases}
    for i in range(0, len(o), refit_every):
        block = o[i : i + refit_every]
        if model is not None:
            model.fit(idle, cap, times, int(block[0]))
        b = candidate_bases(idle, cap, times, block, w, model, levels)
        for k in test_bases:
            test_bases[k][i : i + len(block)] = b.get(k, b[DEFAULT_RULE])
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
        rows = slice(i, i + len(block))

        def base_of(k: str, rows: slice = rows) -> np.ndarray:
            return test_bases[k][rows]

        adv[rows] = _apply_per_series(rule, base_of, scale[block], param)
    rule, param = params[-1]
    extra = f",recalibrated={len(params)}x" if len(params) > 1 else ""
    return adv, [f"{rule[j]}={param[j]:.3f},margin={margin:g}{extra}" for j in range(len(rule))]


def _quantile_advisor(
    panel: Panel,
    idle: np.ndarray,
    cap: np.ndarray,
    times: pd.DatetimeIndex,
    truth: np.ndarray,
    o: np.ndarray,
    start: int,
    w: int,
    risk: float,
    refit_every: int,
    recal: int | None,
    method: str = "auto",
) -> tuple[np.ndarray, list[str]] | None:
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

    def q(t: np.ndarray) -> np.ndarray:
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
    windows: Sequence[int] = (1, 4),
    risk: float = 0.05,
    test_from: object = None,
    test_to: object = None,
    refit_every: int = 168,
    recalibrate_every: int | None = None,
    releases: dict[int, pd.DataFrame] | None = None,
    method: str = "auto",
    pooled_over: Sequence[str] | None = None,
    intervals: bool = False,
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
    or "rules" (the per-series rules only). `pooled_over` (with "rules"; None: every series):
    the series whose hours the rules' pooled model and margin learn from (`pool_mask`).
    `intervals`: add each row's 95 % day-bootstrap intervals of capture and violations
    (`significance.release_bootstrap`, about 1 ms a row: the CLI's replay asks for them, the
    service's hourly backtest over up to a thousand nodes does not).
    """
    from advisor.forecast.rolling import test_window

    known = with_capacity(panel)
    if not known:  # idle = capacity − use: nothing to say without a capacity
        return pd.DataFrame()
    panel = panel.select(known)
    pool = pool_mask(panel.series, pooled_over, method)
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
    ffi = feat.ffill(idle)  # once for every window's baseline rules
    bound = np.full(idle.shape, np.inf)  # the advisor's release for the shorter windows so far
    per_window = {}
    for w in sorted(set(windows)):
        truth = window_min(idle, w)
        ok = origins + w < len(idle)
        o = origins[ok]
        decisions = {rule: baseline_release(idle, w, rule, ffi)[o] for rule in BASELINE_RULES}
        args = (idle, cap, times, truth, o, start, w, risk, refit_every, recalibrate_every)
        picked = None if method == "rules" else _quantile_advisor(panel, *args, method=method)
        if picked is None:
            picked = _rule_advisor(idle, cap, times, scale, *args[3:], pool=pool)
        adv, params = picked
        # never more than capacity, nor more than a shorter window's release at the same origin
        # (the minimum over a longer window cannot exceed the minimum over a shorter one)
        decisions["advisor"] = np.minimum(np.minimum(adv, capf[o]), bound[o])
        bound[o] = np.fmin(bound[o], decisions["advisor"])  # a NaN release bounds nothing
        per_window[w] = (o, truth, decisions, params)
    rows = []
    series = panel.series
    for w in windows:
        o, truth, decisions, params = per_window[w]
        if releases is not None:
            releases[w] = pd.DataFrame(decisions["advisor"], index=times[o], columns=series)
        mean_idle = None
        days = times[o].normalize()
        for name, rel in decisions.items():
            scores, mean_idle = release_scores_per_series(rel, truth[o], mean_idle)
            for j, s in enumerate(series):
                rows.append(
                    {
                        "replay": "idle_window",
                        "series": s,
                        "window_h": w,
                        "model": name,
                        **scores[j],
                        "mean_idle": mean_idle[j],
                        "params": params[j] if name == "advisor" else "",
                        **(release_bootstrap(rel[:, j], truth[o, j], days) if intervals else {}),
                    }
                )
    return pd.DataFrame(rows)


def release_scores_per_series(
    rel: np.ndarray, truth: np.ndarray, mean_idle: list[float] | None = None
) -> tuple[list[dict[str, float]], list[float]]:
    """(`metrics.release_scores(rel[:, j], truth[:, j])` and `float(np.nanmean(truth[:, j]))`
    for every column j; `mean_idle`: the latter where the caller has it already).

    All columns at once where every figure is a whole number (GPUs, nodes) small enough that
    each sum is exact in any order, so the figures are those of the per-column functions;
    otherwise column by column through them."""
    rel, truth = np.asarray(rel, float), np.asarray(truth, float)
    valid = np.isfinite(rel) & np.isfinite(truth)
    r, m = np.where(valid, rel, 0.0), np.where(valid, truth, 0.0)
    seen = ~np.isnan(truth)
    t = np.where(seen, truth, 0.0)
    if mean_idle is None:  # np.nanmean's sum and count; NaN, without its warning, for a
        # column never seen (an all-masked series)
        counts = seen.sum(axis=0)
        mean_idle = [float(t[:, j].sum() / c) if c else np.nan for j, c in enumerate(counts)]
    bound = 2.0**52 / max(len(truth), 1)
    if not all((x == np.floor(x)).all() and np.abs(x).max(initial=0) <= bound for x in (r, m, t)):
        scores = [M.release_scores(rel[:, j], truth[:, j]) for j in range(rel.shape[1])]
        return scores, mean_idle
    n = valid.sum(axis=0)
    total = m.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        capture = 100 * np.minimum(r, m).sum(axis=0) / total
        violation = 100 * ((r > m).sum(axis=0).astype(float) / n)
        shortfall = np.maximum(r - m, 0).sum(axis=0) / n
    scores = [
        {
            "capture": float(capture[j]) if total[j] > 0 else np.nan,
            "violation_rate": float(violation[j]),
            "mean_shortfall": float(shortfall[j]),
        }
        if n[j]
        else {"capture": np.nan, "violation_rate": np.nan, "mean_shortfall": np.nan}
        for j in range(len(n))
    ]
    return scores, mean_idle


def pool_mask(
    series: list[str], pooled_over: Sequence[str] | None, method: str
) -> np.ndarray | None:
    """The series (a boolean mask; None: all) whose hours the per-series rules' pooled model and
    margin learn from. A caller that serves a set of series chosen by their latest hours (the
    nodes most idle now) names a set chosen without them, so that a held-back origin's release
    does not depend on which series the hours after it put in the served set."""
    if pooled_over is None:
        return None
    if method != "rules":
        raise ValueError(f"pooled_over needs method 'rules', not {method!r}")
    return np.isin(np.asarray(series, dtype=object), list(pooled_over))


def with_capacity(panel: Panel) -> list[str]:
    """The series that ever had capacity. A pool with none has nothing to release and cannot be
    wrong, so it stays out of the pooled model and its λ: its hours would only dilute the pooled
    violation share and let the other pools take more risk."""
    series = panel.series
    if len(set(series)) < len(series):  # a name twice: per column, as it always was
        return [s for s in series if (panel.capacity[s] > 0).any()]
    has = (panel.capacity[series] > 0).any(axis=0).to_numpy()
    return [s for s, h in zip(series, has, strict=True) if h]


def known_capacity_drop(cap: np.ndarray, last: int, w: int) -> np.ndarray:
    """Per series, how far the capacity known for the next `w` rows after `last` falls below the
    capacity at `last` (0 where it does not fall, or nothing is known yet). Idle is capacity −
    use, so a scheduled shrink lowers what stays free one for one; the models and rules learned
    idle from the past and cannot see it."""
    capf = feat.ffill(cap)
    ahead = capf[last + 1 : last + 1 + w]
    if not len(ahead):
        return np.zeros(cap.shape[1])
    with np.errstate(invalid="ignore"):
        lowest = np.fmin.reduce(ahead, axis=0)
    drop = capf[last] - lowest
    return np.where(np.isfinite(drop), np.maximum(drop, 0.0), 0.0)


def idle_windows(
    panel: Panel,
    windows: Sequence[int] = IDLE_WINDOWS_H,
    risk: float = IDLE_RISK,
    method: str = "auto",
    pooled_over: Sequence[str] | None = None,
) -> pd.DataFrame:
    """Live use: units safe to release now per series and window.

    The same choice as `backtest` with the last observed hour as the origin (rows after it that
    carry only capacity are a known resize: a shrink within the window lowers the release by as
    much, `known_capacity_drop`): the pooled quantile model (refit weekly backwards from now)
    with λ picked on its out-of-sample forecasts of the history,
    where the last week says it beats the per-series rules; otherwise, and with too little
    history for it, the per-series rules. A series without capacity releases 0 (rule "no_capacity").
    `method`: "auto" (as above) or "rules" (the per-series rules only, as `backtest`'s);
    `pooled_over` as `backtest`'s."""
    if method not in ("auto", "rules"):
        raise ValueError(f"idle_windows method must be 'auto' or 'rules', not {method!r}")
    known = with_capacity(panel)
    if len(known) < len(panel.series):
        empty = [s for s in panel.series if s not in known]
        hourly = panel.resample("h")
        as_of = hourly.index[max(feat.last_observed(hourly.values.to_numpy(float)), 0)]
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
            idle_windows(panel.select(known), windows, risk, method, pooled_over)
            if known
            else pd.DataFrame()
        )
        out = pd.concat([found, pd.DataFrame(rows)], ignore_index=True)
        rank: dict[str, dict[Any, int]] = {"window_h": {w: i for i, w in enumerate(windows)}}
        rank["series"] = {s: i for i, s in enumerate(panel.series)}
        out = out.sort_values(["window_h", "series"], key=lambda c: c.map(rank[c.name]))
        return out.reset_index(drop=True)
    pool = pool_mask(panel.series, pooled_over, method)
    idle, cap, times = hourly_idle(panel)
    last = max(feat.last_observed(idle), 0)  # later rows: known capacity, no use yet
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
            rel, rules = _rule_release_now(idle, cap, times, scale, truth, last, w, risk, pool)
        rel = np.maximum(rel - known_capacity_drop(cap, last, w), 0.0)
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


def _rule_release_now(
    idle: np.ndarray,
    cap: np.ndarray,
    times: pd.DatetimeIndex,
    scale: np.ndarray,
    truth: np.ndarray,
    last: int,
    w: int,
    risk: float,
    pool: np.ndarray | None = None,
) -> tuple[np.ndarray, list[str]]:
    """The per-series rules' release at the last hour (short histories); model and margin learn
    from `pool` (`_calibrated_rules`)."""
    now = np.array([last])
    val = np.arange(max(48, last - CALIBRATION_DAYS * 24 - w), last - w + 1)
    levels = rule_levels(idle, w)
    model, rule, param, _ = _calibrated_rules(
        idle, cap, times, scale, truth, val, w, risk, levels, pool
    )
    if model is not None:
        model.fit(idle, cap, times, last)
    b = candidate_bases(idle, cap, times, now, w, model, levels)
    rel = _apply_per_series(rule, lambda k: b.get(k, b[DEFAULT_RULE]), scale[now], param)
    return rel[0], list(rule)
