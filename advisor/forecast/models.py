"""Forecasters behind one fit/predict interface, baselines and learned models alike.

All work on arrays: `y` (T, S) with NaN for masked points, `cap` (T, S) capacity, `times` the grid,
and optionally `within`: the sub-step readings of each step (`features.within_arrays` of a Panel's
`within`: last reading, min, max, slope; None when the input had no finer grid).
`fit(y, cap, times, until, horizons, within)` may use rows ≤ `until` only; `predict(..., origins,
horizon, within)` returns (len(origins), S) point forecasts that use rows ≤ each origin only (row t
includes the readings inside step t); `predict_quantiles` adds quantiles. Upper/lower quantiles of baselines come from their own trailing empirical errors
("naive plus empirical quantile"), so every model has an interval and the backtest treats them alike,
once it has `MIN_INTERVAL_ERRORS` known errors at the horizon: before that the quantiles other
than the median are NaN (no interval), never a zero-width interval from no or one or two errors.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from advisor.forecast import features as feat
from advisor.forecast.features import Within
from advisor.forecast.threads import bounded

RESID_WINDOW = 14 * 24  # trailing origins used for empirical error quantiles
# An empirical-error interval needs at least this many known (finite) errors of the series at the
# horizon; with fewer, its quantiles other than the median are NaN. The q-quantile of n
# exchangeable errors (linear interpolation, rank 1 + q(n - 1)) covers a new error with
# probability (1 + q(n - 1)) / (n + 1): for q = 0.1 that is 0.50 at n = 1 (the point itself),
# 0.37 at 2, 0.23 at 5, 0.16 at 12 and 0.13 at 24 (0.87 for q = 0.9). 24 errors, one day of
# hourly origins (the daily cycle seen once), keep the q0.1/q0.9 within 3 points of nominal.
MIN_INTERVAL_ERRORS = 24


class Forecaster:
    """Base: subclasses implement `_point`; residual quantiles come for free.

    The errors behind the quantiles are out of sample: a learned model's are those of a copy fitted
    `RESID_WINDOW` origins earlier (its own training rows would understate them).
    """

    name = "base"
    learned = False

    def __init__(self) -> None:
        self._resid: dict[int, np.ndarray] = {}  # horizon -> residuals (n, S)
        self._no_errors: dict[int, bool] = {}  # horizon -> no origin to measure an error at

    def fit(
        self,
        y: np.ndarray,
        cap: np.ndarray,
        times: pd.DatetimeIndex,
        until: int,
        horizons: Sequence[int],
        within: Within = None,
    ) -> Forecaster:
        self._fit(y, cap, times, until, horizons, within)
        at = max(0, until - max(horizons) - RESID_WINDOW)
        scorer = self._residual_model(y, cap, times, at, horizons, within) if self.learned else self
        for h in horizons:
            lo = at if self.learned else max(0, until - h - RESID_WINDOW)
            origins = np.arange(lo, until - h + 1)
            self._no_errors[h] = len(origins) == 0
            if len(origins) == 0:
                self._resid[h] = np.zeros((1, y.shape[1]))  # median: the point itself
                continue
            pred = scorer._point(y, cap, times, origins, h, within)
            self._resid[h] = y[origins + h] - pred
        return self

    def _residual_model(
        self,
        y: np.ndarray,
        cap: np.ndarray,
        times: pd.DatetimeIndex,
        at: int,
        horizons: Sequence[int],
        within: Within = None,
    ) -> Forecaster:
        """A copy fitted on rows ≤ `at` only, to measure out-of-sample errors after `at`."""
        return self

    def _fit(
        self,
        y: np.ndarray,
        cap: np.ndarray,
        times: pd.DatetimeIndex,
        until: int,
        horizons: Sequence[int],
        within: Within = None,
    ) -> None:
        """Learn parameters from rows ≤ until (baselines: nothing)."""

    def _point(
        self,
        y: np.ndarray,
        cap: np.ndarray,
        times: pd.DatetimeIndex,
        origins: np.ndarray,
        horizon: int,
        within: Within = None,
    ) -> np.ndarray:
        raise NotImplementedError

    def predict(
        self,
        y: np.ndarray,
        cap: np.ndarray,
        times: pd.DatetimeIndex,
        origins: np.ndarray,
        horizon: int,
        within: Within = None,
    ) -> np.ndarray:
        point = self._point(y, cap, times, origins, horizon, within)
        return clip_to_capacity(point, cap, origins, horizon)

    def predict_quantiles(
        self,
        y: np.ndarray,
        cap: np.ndarray,
        times: pd.DatetimeIndex,
        origins: np.ndarray,
        horizon: int,
        quantiles: Sequence[float],
        within: Within = None,
    ) -> dict[float, np.ndarray]:
        """Point plus each quantile of the horizon's known errors; a quantile other than the
        median is NaN for a series with fewer than `MIN_INTERVAL_ERRORS` known errors (no
        interval), the median is the point plus the median error whatever their number."""
        point = self._point(y, cap, times, origins, horizon, within)
        resid = self._resid.get(horizon)
        enough = self.known_errors(horizon, point.shape[1]) >= MIN_INTERVAL_ERRORS
        out = {}
        for q in quantiles:
            if resid is None or not np.isfinite(resid).any():
                adj = np.zeros(point.shape[1])
            else:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    adj = np.nan_to_num(np.nanquantile(resid, q, axis=0))
            if q != 0.5:
                adj = np.where(enough, adj, np.nan)
            out[q] = clip_to_capacity(point + adj, cap, origins, horizon)
        return sort_quantiles(out)

    def known_errors(self, horizon: int, n_series: int) -> np.ndarray:
        """Per series, the known (finite) errors behind the horizon's empirical quantiles (0
        before a fit at the horizon, or where the fit had no origin to measure one)."""
        resid = self._resid.get(horizon)
        if resid is None or self._no_errors.get(horizon, False):
            return np.zeros(n_series, dtype=int)
        return np.isfinite(resid).sum(axis=0)


def clip_to_capacity(
    pred: np.ndarray, cap: np.ndarray, origins: np.ndarray | Sequence[int], horizon: int
) -> np.ndarray:
    """Demand cannot be negative or exceed the (known, possibly changing) capacity at the target."""
    capf = feat.ffill(cap)
    idx = np.minimum(np.asarray(origins) + horizon, len(cap) - 1)
    upper = capf[idx]
    upper = np.where(np.isfinite(upper), upper, np.inf)
    return np.clip(pred, 0.0, upper)


def sort_quantiles(qs: dict[float, np.ndarray]) -> dict[float, np.ndarray]:
    """Make quantiles non-crossing: sort across levels at every point (`sort_known`: a NaN level,
    no interval, stays NaN where it is and never moves the median)."""
    levels = sorted(qs)
    stacked = sort_known(np.stack([np.asarray(qs[q], dtype=float) for q in levels]))
    return {q: stacked[i] for i, q in enumerate(levels)}


def sort_known(stacked: np.ndarray | Sequence[Any]) -> np.ndarray:
    """Sort along the first axis (the quantile levels) the values that are not NaN, leaving each
    NaN in its place: `np.sort` alone would put the NaN last, so a missing q0.1 would take the
    median's place and the median the q0.9's. Without NaN it is `np.sort(stacked, axis=0)`."""
    stacked = np.asarray(stacked, dtype=float)
    known = ~np.isnan(stacked)
    ordered = np.sort(np.where(known, stacked, np.inf), axis=0)  # known values first, in order
    rank = np.clip(np.cumsum(known, axis=0) - 1, 0, None)  # each known slot's place among them
    return np.where(known, np.take_along_axis(ordered, rank, axis=0), np.nan)


class Naive(Forecaster):
    """Last observed value."""

    name = "naive"

    def _point(
        self,
        y: np.ndarray,
        cap: np.ndarray,
        times: pd.DatetimeIndex,
        origins: np.ndarray,
        horizon: int,
        within: Within = None,
    ) -> np.ndarray:
        return feat.ffill(y)[origins]


class LastReading(Forecaster):
    """The latest reading known at the origin: the last sub-step reading (e.g. the last minute) of
    the latest observed step, for every horizon; the step's value where no finer grid is known."""

    name = "last_reading"

    def _point(
        self,
        y: np.ndarray,
        cap: np.ndarray,
        times: pd.DatetimeIndex,
        origins: np.ndarray,
        horizon: int,
        within: Within = None,
    ) -> np.ndarray:
        return feat.last_reading(y, within)[origins]


class SeasonalNaive(Forecaster):
    """Value one season before the target (the latest such value ≤ origin)."""

    def __init__(self, season: int) -> None:
        super().__init__()
        self.season = season
        self.name = f"seasonal_naive_{season}"

    def _point(
        self,
        y: np.ndarray,
        cap: np.ndarray,
        times: pd.DatetimeIndex,
        origins: np.ndarray,
        horizon: int,
        within: Within = None,
    ) -> np.ndarray:
        back = self.season * int(np.ceil(horizon / self.season)) - horizon
        idx = np.asarray(origins) - back
        ffy = feat.ffill(y)
        out = np.full((len(idx), y.shape[1]), np.nan)
        ok = idx >= 0
        out[ok] = ffy[idx[ok]]
        return np.where(np.isfinite(out), out, ffy[origins])


class SameHourMean(Forecaster):
    """Mean of the last 7 same-hour values ≤ origin."""

    name = "same_hour_mean_7d"

    def _point(
        self,
        y: np.ndarray,
        cap: np.ndarray,
        times: pd.DatetimeIndex,
        origins: np.ndarray,
        horizon: int,
        within: Within = None,
    ) -> np.ndarray:
        ffy = feat.ffill(y)
        m = feat.same_hour_mean(ffy, horizon)[origins]
        return np.where(np.isfinite(m), m, ffy[origins])


class HoltWinters(Forecaster):
    """Additive Holt-Winters (24-step season); parameters refit on the trailing 21 days, state hourly."""

    name = "holt_winters"
    GRID = tuple((a, b, g) for a in (0.2, 0.5, 0.8, 1.0) for b in (0.0, 0.02) for g in (0.05, 0.2))

    def __init__(self, season: int = 24, window: int = 21 * 24) -> None:
        super().__init__()
        self.season, self.window = season, window
        self._params: np.ndarray | None = None
        self._start = 0
        self._memo: tuple | None = None  # (y, start, end, states): y held so identity is safe

    def _fit(
        self,
        y: np.ndarray,
        cap: np.ndarray,
        times: pd.DatetimeIndex,
        until: int,
        horizons: Sequence[int],
        within: Within = None,
    ) -> None:
        self._memo = None
        self._start = max(0, until + 1 - self.window)
        seg = feat.ffill(y)[self._start : until + 1]
        grid = np.array(self.GRID)
        n_series, n_grid = seg.shape[1], len(grid)
        # every series × every grid row in one vectorised recursion
        x = np.repeat(seg, n_grid, axis=1)
        params = np.tile(grid, (n_series, 1))
        sse = self._filter(x, params)[3].reshape(n_series, n_grid)
        sse = np.where(np.isfinite(sse), sse, np.inf)
        self._params = grid[np.argmin(sse, axis=1)]

    def _filter(
        self, x: np.ndarray, params: np.ndarray, keep: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Run the recursion on every column of x (n, K) with its own (alpha, beta, gamma) row.

        Returns level, trend and season states after the rows in `keep` (none if None) and the
        1-step SSE per column. Masked points advance the state without updating it.
        """
        m = self.season
        n, k = x.shape
        a, b, c = params[:, 0], params[:, 1], params[:, 2]
        head = x[: min(n, m)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            start = np.nan_to_num(np.nanmean(head, axis=0))
        level = start.copy()
        trend = np.zeros(k)
        season = np.nan_to_num(head - start) if n >= m else np.zeros((m, k))
        keep = np.array([], dtype=int) if keep is None else np.asarray(keep)
        slot = {int(t): i for i, t in enumerate(keep)}
        levels = np.empty((len(keep), k))
        trends = np.empty((len(keep), k))
        seasons = np.empty((len(keep), m, k))
        sse = np.zeros(k)
        for t in range(n):
            s_idx = t % m
            xt = x[t]
            seen = np.isfinite(xt)
            fc = level + trend + season[s_idx]
            if t >= m:
                sse += np.where(seen, (xt - fc) ** 2, 0.0)
            new_level = np.where(
                seen, a * (xt - season[s_idx]) + (1 - a) * (level + trend), level + trend
            )
            trend = np.where(seen, b * (new_level - level) + (1 - b) * trend, trend)
            season[s_idx] = np.where(
                seen, c * (xt - new_level) + (1 - c) * season[s_idx], season[s_idx]
            )
            level = new_level
            i = slot.get(t)
            if i is not None:
                levels[i], trends[i], seasons[i] = level, trend, season
        return levels, trends, seasons, sse

    def _point(
        self,
        y: np.ndarray,
        cap: np.ndarray,
        times: pd.DatetimeIndex,
        origins: np.ndarray,
        horizon: int,
        within: Within = None,
    ) -> np.ndarray:
        origins = np.asarray(origins)
        ffy = feat.ffill(y)
        out = ffy[origins].astype(float)
        if self._params is None or len(origins) == 0:
            return out
        start = min(self._start, int(origins.min()))
        end = int(origins.max())
        rel = origins - start
        memo = self._memo
        if (
            memo is None
            or memo[0] is not y
            or memo[1] != (start, end)
            or not np.array_equal(memo[2], rel)
        ):
            states = self._filter(ffy[start : end + 1], self._params, keep=rel)
            self._memo = memo = (y, (start, end), rel, states)
        lv, tr, se, _ = memo[3]
        s_idx = (rel + horizon) % self.season
        fc = lv + horizon * tr + se[np.arange(len(rel)), s_idx, :]
        # The state starts from the first season's rows: an origin inside that season would read
        # rows after it (a history of under a day, as the service has at first), so it is naive.
        fc[rel < self.season - 1] = np.nan
        return np.where(np.isfinite(fc), fc, out)


class Decomposed(Forecaster):
    """A level plus a daily and a weekly profile, the shape of MSTL (24 h + 168 h) without loess.

    On the trailing `window` steps before the fit, each season's profile is the mean deviation
    from its own centred moving average by position in the season, the other season removed
    first (two passes, as MSTL iterates). The level is simple exponential smoothing of the series
    with both profiles removed, its smoothing constant per series the one of `ALPHAS` with the
    least one-step error on the window. Forecast: the level at the origin plus both profiles at
    the target. Positions are grid steps, so a season is 24 and 168 steps of an hourly grid.
    """

    name = "decomposed_24_168"
    ALPHAS = np.linspace(0.05, 1.0, 20)
    PASSES = 2

    def __init__(self, seasons: tuple[int, ...] = (24, 168), window: int = 28 * 24) -> None:
        super().__init__()
        self.seasons, self.window = seasons, window
        self._start = 0
        self._profiles: dict[int, np.ndarray] = {}
        self._alpha: np.ndarray | None = None

    def _seasonal(self, pos: np.ndarray, skip: int | None = None) -> np.ndarray:
        """Sum of the fitted profiles (but `skip`'s) at grid positions `pos`: (len(pos), S)."""
        parts = [p[pos % s] for s, p in self._profiles.items() if s != skip]
        return np.sum(parts, axis=0) if parts else np.zeros((len(pos), 1))

    def _fit(
        self,
        y: np.ndarray,
        cap: np.ndarray,
        times: pd.DatetimeIndex,
        until: int,
        horizons: Sequence[int],
        within: Within = None,
    ) -> None:
        self._start = max(0, until + 1 - self.window)
        seg = feat.ffill(y)[self._start : until + 1]
        pos = np.arange(self._start, until + 1)
        self._profiles = {s: np.zeros((s, seg.shape[1])) for s in self.seasons}
        for _ in range(self.PASSES):
            for s in self.seasons:
                rest = seg - self._seasonal(pos, skip=s)
                trend = pd.DataFrame(rest).rolling(s, center=True, min_periods=s).mean()
                dev = pd.DataFrame(rest - trend.to_numpy()).groupby(pos % s).mean()
                prof = dev.reindex(range(s)).to_numpy()
                with warnings.catch_warnings():  # a season never seen yet: all NaN, then 0
                    warnings.simplefilter("ignore", RuntimeWarning)
                    prof = prof - np.nanmean(prof, axis=0)
                self._profiles[s] = np.nan_to_num(prof)
        adjusted = seg - self._seasonal(pos)
        n_series, n_alpha = adjusted.shape[1], len(self.ALPHAS)
        # every series × every constant in one vectorised recursion
        x = np.repeat(adjusted, n_alpha, axis=1)
        sse = self._smooth(x, np.tile(self.ALPHAS, n_series))[1].reshape(n_series, n_alpha)
        sse = np.where(np.isfinite(sse), sse, np.inf)
        self._alpha = self.ALPHAS[np.argmin(sse, axis=1)]

    @staticmethod
    def _smooth(x: np.ndarray, alpha: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Simple exponential smoothing down every column of `x` (NaN: the level carries on):
        the level after each row and the sum of squared one-step errors."""
        level = np.full(x.shape, np.nan)
        current = x[0].astype(float)
        sse = np.zeros(x.shape[1])
        for t in range(x.shape[0]):
            row = x[t]
            err = row - current
            seen = np.isfinite(err)
            sse += np.where(seen, err * err, 0.0)
            current = np.where(
                seen,
                current + alpha * err,
                np.where(np.isfinite(current), current, row),
            )
            level[t] = current
        return level, sse

    def _point(
        self,
        y: np.ndarray,
        cap: np.ndarray,
        times: pd.DatetimeIndex,
        origins: np.ndarray,
        horizon: int,
        within: Within = None,
    ) -> np.ndarray:
        origins = np.asarray(origins)
        ffy = feat.ffill(y)
        naive = ffy[origins].astype(float)
        if self._alpha is None or not len(origins):
            return naive
        start = min(self._start, int(origins.min()))
        pos = np.arange(start, int(origins.max()) + 1)
        level = self._smooth(ffy[start : pos[-1] + 1] - self._seasonal(pos), self._alpha)[0]
        point = level[origins - start] + self._seasonal(origins + horizon)
        return np.where(np.isfinite(point), point, naive)


class GradientBoosting(Forecaster):
    """HistGradientBoosting on the scaled change from the last value, pooled over series, per lead.

    The target is (y[t+h] − y[t]) / scale so the trees never have to learn a drifting level (the
    CES LightGBM's failure); quantile loss gives the interval directly.
    """

    name = "gbm"
    learned = True

    def __init__(
        self, quantiles: Sequence[float] = (0.1, 0.9), max_iter: int = 80, seed: int = 0
    ) -> None:
        super().__init__()
        self.quantiles = tuple(quantiles)
        self.max_iter, self.seed = max_iter, seed
        self._models: dict[tuple[int, float], Any] = {}  # fitted scikit-learn regressors
        self._cache: dict[int, tuple] = {}
        self._oos: tuple | None = None  # (y, at, fitted copy)

    def _residual_model(
        self,
        y: np.ndarray,
        cap: np.ndarray,
        times: pd.DatetimeIndex,
        at: int,
        horizons: Sequence[int],
        within: Within = None,
    ) -> Forecaster:
        oos = self._oos
        if oos is not None and oos[0] is y and oos[1] is within and oos[2] == at:
            return oos[3]
        clone = copy.copy(self)
        clone._models, clone._resid, clone._no_errors, clone._oos = {}, {}, {}, None
        clone.quantiles = ()  # only the median is needed to measure errors
        clone._fit(y, cap, times, at, horizons, within)
        self._oos = (y, within, at, clone)
        return clone

    def _features(
        self,
        y: np.ndarray,
        cap: np.ndarray,
        times: pd.DatetimeIndex,
        horizon: int,
        within: Within = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        key = horizon
        cached = self._cache.get(key)
        if cached is not None and cached[0] is y and cached[1] is within:
            return cached[2:]
        X, _, last, s = feat.build(y, cap, times, horizon, within=within)
        self._cache[key] = (y, within, X, last, s)
        return X, last, s

    def _regressor(self, q: float) -> Any:
        from sklearn.ensemble import HistGradientBoostingRegressor

        loss = {"loss": "absolute_error"} if q == 0.5 else {"loss": "quantile", "quantile": q}
        return HistGradientBoostingRegressor(
            **loss,
            max_iter=self.max_iter,
            learning_rate=0.1,
            max_leaf_nodes=15,
            min_samples_leaf=40,
            l2_regularization=1.0,
            random_state=self.seed,
        )

    def _fit(
        self,
        y: np.ndarray,
        cap: np.ndarray,
        times: pd.DatetimeIndex,
        until: int,
        horizons: Sequence[int],
        within: Within = None,
    ) -> None:
        for h in horizons:
            X, last, s = self._features(y, cap, times, h, within)
            rows = np.arange(0, until - h + 1)
            target = (y[rows + h] - last[rows]) / s[rows]
            Xr = self._inputs(X[rows].reshape(-1, X.shape[-1]))
            tr = target.reshape(-1)
            ok = np.isfinite(tr) & np.isfinite(last[rows]).reshape(-1)
            for q in (0.5, *self.quantiles):
                if ok.sum() < 50:
                    self._models.pop((h, q), None)
                    continue
                with bounded():
                    self._models[(h, q)] = self._regressor(q).fit(Xr[ok], tr[ok])

    def _predict_q(
        self,
        y: np.ndarray,
        cap: np.ndarray,
        times: pd.DatetimeIndex,
        origins: np.ndarray,
        horizon: int,
        q: float,
        within: Within = None,
    ) -> np.ndarray:
        X, last, s = self._features(y, cap, times, horizon, within)
        origins = np.asarray(origins)
        model = self._models.get((horizon, q))
        if model is None:
            return last[origins]
        Xo = self._inputs(X[origins])
        with bounded():
            change = model.predict(Xo.reshape(-1, X.shape[-1])).reshape(Xo.shape[:2])
        return last[origins] + s[origins] * change

    def _inputs(self, X: np.ndarray) -> np.ndarray:
        """The regressor's view of the features: gradient boosting takes NaN as missing."""
        return X

    def _point(
        self,
        y: np.ndarray,
        cap: np.ndarray,
        times: pd.DatetimeIndex,
        origins: np.ndarray,
        horizon: int,
        within: Within = None,
    ) -> np.ndarray:
        return self._predict_q(y, cap, times, origins, horizon, 0.5, within)

    def predict_quantiles(
        self,
        y: np.ndarray,
        cap: np.ndarray,
        times: pd.DatetimeIndex,
        origins: np.ndarray,
        horizon: int,
        quantiles: Sequence[float],
        within: Within = None,
    ) -> dict[float, np.ndarray]:
        learned = [q for q in quantiles if (horizon, q) in self._models]
        rest = [q for q in quantiles if q not in learned]
        out = (
            super().predict_quantiles(y, cap, times, origins, horizon, rest, within) if rest else {}
        )
        for q in learned:
            pred = self._predict_q(y, cap, times, origins, horizon, q, within)
            out[q] = clip_to_capacity(pred, cap, origins, horizon)
        return sort_quantiles(out)


class Linear(GradientBoosting):
    """Ridge regression on the same scaled-change features: a low-variance learned correction."""

    name = "linear"

    def __init__(self, seed: int = 0) -> None:
        super().__init__(quantiles=(), seed=seed)  # no quantile loss: the median only

    def _regressor(self, q: float) -> Any:
        from sklearn.linear_model import Ridge
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        return make_pipeline(StandardScaler(), Ridge(alpha=10.0))

    def _inputs(self, X: np.ndarray) -> np.ndarray:
        return np.nan_to_num(X)  # ridge takes no NaN


class Combination(Forecaster):
    """Equal-weight mean of member forecasts: combinations are hard to beat on noisy series.

    With `shared=True` the members are already fitted at the same `until` (the backtest fits each
    model once per block and reuses it here), so only the combination's own errors are computed.
    """

    def __init__(self, members: list[Forecaster], name: str, shared: bool = False) -> None:
        super().__init__()
        self.members, self.name, self.shared = members, name, shared
        self.learned = any(m.learned for m in members)

    def _residual_model(
        self,
        y: np.ndarray,
        cap: np.ndarray,
        times: pd.DatetimeIndex,
        at: int,
        horizons: Sequence[int],
        within: Within = None,
    ) -> Forecaster:
        return Combination(
            [m._residual_model(y, cap, times, at, horizons, within) for m in self.members],
            self.name,
            shared=True,
        )

    def _fit(
        self,
        y: np.ndarray,
        cap: np.ndarray,
        times: pd.DatetimeIndex,
        until: int,
        horizons: Sequence[int],
        within: Within = None,
    ) -> None:
        if not self.shared:
            for m in self.members:
                m._fit(y, cap, times, until, horizons, within)

    def _point(
        self,
        y: np.ndarray,
        cap: np.ndarray,
        times: pd.DatetimeIndex,
        origins: np.ndarray,
        horizon: int,
        within: Within = None,
    ) -> np.ndarray:
        points = [m._point(y, cap, times, origins, horizon, within) for m in self.members]
        return np.mean(points, axis=0)


COMBO_MEMBERS = ("naive", "linear", "gbm")

# Every model by the name reports give it, in the order the backtest runs and reports them: the
# baselines, then the learned models and their combination. `make` builds only these.
MAKERS: dict[str, Callable[[tuple[float, ...]], Forecaster]] = {
    "naive": lambda q: Naive(),
    "seasonal_naive_24": lambda q: SeasonalNaive(24),
    "seasonal_naive_168": lambda q: SeasonalNaive(168),
    "same_hour_mean_7d": lambda q: SameHourMean(),
    "holt_winters": lambda q: HoltWinters(),
    "last_reading": lambda q: LastReading(),
    "decomposed_24_168": lambda q: Decomposed(),
    "gbm": lambda q: GradientBoosting(quantiles=[x for x in q if x != 0.5]),
    "linear": lambda q: Linear(),
    "combo": lambda q: Combination([Naive(), Linear(), GradientBoosting(quantiles=())], "combo"),
}
NAMES: tuple[str, ...] = tuple(MAKERS)
BASELINES = NAMES[: NAMES.index("gbm")]


def make(
    name: str, quantiles: Sequence[float] = (0.1, 0.9), fitted: dict[str, Forecaster] | None = None
) -> Forecaster:
    """A fresh forecaster by its reported name (`fitted`: members a combination may reuse)."""
    if name == "combo" and fitted and all(m in fitted for m in COMBO_MEMBERS):
        return Combination([fitted[m] for m in COMBO_MEMBERS], "combo", shared=True)
    if name not in MAKERS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(NAMES)}")
    return MAKERS[name](tuple(quantiles))


def as_arrays(
    values: pd.DataFrame, capacity: pd.DataFrame
) -> tuple[np.ndarray, np.ndarray, pd.DatetimeIndex]:
    return values.to_numpy(float), capacity.reindex_like(values).to_numpy(float), values.index
