"""Is a model's MAE gain over a baseline more than noise? Paired tests on the test origins.

A 1 % lower MAE over two weeks of hourly origins can be luck. The research note's protocol asks
for a paired test of the MAE difference against the baselines, so every backtest reports two:

* Diebold–Mariano on the loss differential d_t = |e_model,t| − |e_base,t|, with the
  Harvey–Leybourne–Newbold small-sample correction and a t distribution with n − 1 degrees of
  freedom. Forecasts h steps ahead from hourly origins overlap, so their errors are correlated up
  to lag h − 1; the variance of the mean difference uses those autocovariances.
* A bootstrap over days (days as blocks, which keeps each day's correlated errors together) of the
  relative MAE difference, as an interval that assumes nothing about the shape of d.

An upper quantile is judged by its coverage and pinball loss, and both are as noisy: a q0.9 that
is calibrated still covers anywhere from about 0.8 to 1.0 of one fortnight's hours, since
neighbouring h-step errors miss together. `interval_table` gives each the same day bootstrap, so
a coverage or pinball target can be read against the spread the test part allows.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike
from scipy import stats

from advisor.forecast import metrics as M

BOOTSTRAP_SAMPLES = 2000


def diebold_mariano(loss_model: ArrayLike, loss_base: ArrayLike, h: int) -> tuple[float, float]:
    """(statistic, two-sided p-value); negative statistic = the model's loss is lower.

    NaN when fewer than 3 paired points or the differential never varies (identical forecasts).
    """
    a, b = np.asarray(loss_model, float), np.asarray(loss_base, float)
    ok = np.isfinite(a) & np.isfinite(b)
    d = a[ok] - b[ok]
    n = len(d)
    if n < 3 or np.allclose(d, d[0]):
        return np.nan, np.nan
    centred = d - d.mean()
    lags = min(max(h - 1, 0), n - 1)
    autocov = [centred @ centred / n] + [centred[k:] @ centred[:-k] / n for k in range(1, lags + 1)]
    long_run = autocov[0] + 2 * sum(autocov[1:])
    if long_run <= 0:  # the rectangular window can go negative: Bartlett weights cannot
        weights = 1 - np.arange(1, lags + 1) / (lags + 1)
        long_run = autocov[0] + 2 * float(np.dot(weights, autocov[1:]))
    correction = np.sqrt(max((n + 1 - 2 * h + h * (h - 1) / n) / n, 1e-12))
    statistic = float(d.mean() / np.sqrt(long_run / n) * correction)
    return statistic, float(2 * stats.t.sf(abs(statistic), df=n - 1))


def _day_totals(
    values: list[np.ndarray], days: ArrayLike, ok: np.ndarray, samples: int, seed: int
) -> list[np.ndarray] | None:
    """The day bootstrap every interval here shares: each array's points where `ok`, summed per
    day, then totalled over `samples` draws of as many days with replacement (one draw matrix,
    so the totals stay paired). None with fewer than two days: nothing to resample."""
    labels, day = np.unique(np.asarray(days)[ok], return_inverse=True)
    if len(labels) < 2:
        return None
    draw = np.random.default_rng(seed).integers(0, len(labels), (samples, len(labels)))
    sums = [np.bincount(day, weights=v[ok], minlength=len(labels)) for v in values]
    return [per_day[draw].sum(axis=1) for per_day in sums]


def _interval(draws: np.ndarray, scale: float = 1.0) -> tuple[float, float]:
    """The central 95 % of the finite draws (× `scale`), or NaN where none is finite."""
    if not np.isfinite(draws).any():
        return np.nan, np.nan
    lo, hi = np.nanpercentile(scale * draws, [2.5, 97.5])
    return float(lo), float(hi)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    return np.divide(num, den, out=np.full(len(num), np.nan), where=den > 0)


def day_bootstrap(
    err_model: ArrayLike,
    err_base: ArrayLike,
    days: ArrayLike,
    samples: int = BOOTSTRAP_SAMPLES,
    seed: int = 0,
) -> tuple[float, float]:
    """95 % interval of MAE_model / MAE_base − 1 (in percent), resampling whole days."""
    a, b = np.abs(np.asarray(err_model, float)), np.abs(np.asarray(err_base, float))
    totals = _day_totals([a, b], days, np.isfinite(a) & np.isfinite(b), samples, seed)
    if totals is None:
        return np.nan, np.nan
    # NaN where the baseline is exact on every day drawn (a pool never used)
    return _interval(_ratio(*totals) - 1, scale=100)


def coverage_bootstrap(
    actual: ArrayLike,
    upper: ArrayLike,
    days: ArrayLike,
    samples: int = BOOTSTRAP_SAMPLES,
    seed: int = 0,
) -> tuple[float, float]:
    """95 % interval of the share of actuals at or below `upper`, resampling whole days."""
    y, f = np.asarray(actual, float), np.asarray(upper, float)
    hits = (y <= f).astype(float)
    totals = _day_totals(
        [hits, np.ones_like(hits)], days, np.isfinite(y) & np.isfinite(f), samples, seed
    )
    return (np.nan, np.nan) if totals is None else _interval(_ratio(*totals))


def pinball_bootstrap(
    actual: ArrayLike,
    q_model: ArrayLike,
    q_base: ArrayLike,
    q: float,
    days: ArrayLike,
    samples: int = BOOTSTRAP_SAMPLES,
    seed: int = 0,
) -> tuple[float, float]:
    """95 % interval of pinball_model / pinball_base − 1 (in percent) at level q, whole days."""
    y = np.asarray(actual, float)
    a, b = np.asarray(q_model, float), np.asarray(q_base, float)
    ok = np.isfinite(y) & np.isfinite(a) & np.isfinite(b)
    totals = _day_totals([M.pinball_losses(y, f, q) for f in (a, b)], days, ok, samples, seed)
    return (np.nan, np.nan) if totals is None else _interval(_ratio(*totals) - 1, scale=100)


def release_bootstrap(
    released: ArrayLike,
    truth: ArrayLike,
    days: ArrayLike,
    samples: int = BOOTSTRAP_SAMPLES,
    seed: int = 0,
) -> dict[str, float]:
    """95 % intervals of an idle-window release's capture Σmin(R, m)/Σm and violation share
    (R > m), both in percent, resampling whole days (`capture_lo` … `violation_hi`; NaN with
    fewer than two days of known outcomes)."""
    r, m = np.asarray(released, float), np.asarray(truth, float)
    values = [np.minimum(r, m), m, (r > m).astype(float), np.ones_like(r)]
    totals = _day_totals(values, days, np.isfinite(r) & np.isfinite(m), samples, seed)
    keys = ("capture_lo", "capture_hi", "violation_lo", "violation_hi")
    if totals is None:
        return dict.fromkeys(keys, np.nan)
    kept, idle, missed, hours = totals
    capture = _interval(_ratio(kept, idle), scale=100)
    violation = _interval(_ratio(missed, hours), scale=100)
    return dict(zip(keys, (*capture, *violation), strict=True))


def paired_table(
    fc: pd.DataFrame, model: str = "advisor", baselines: Sequence[str] | None = None
) -> pd.DataFrame:
    """Per series × horizon × baseline: both MAEs, the relative difference, the DM statistic and
    p-value, the day-bootstrap interval, and `best_baseline` (the baseline with the lowest test
    MAE, the note's "best baseline" — chosen on the test part, so only for this comparison)."""
    if baselines is None:
        from advisor.forecast.models import BASELINES

        baselines = BASELINES
    rows = []
    for (series, h), group in fc.groupby(["series", "horizon"], sort=True):
        wide = group.pivot_table(index="origin", columns="model", values="point", aggfunc="first")
        actual = group.drop_duplicates("origin").set_index("origin")["actual"].reindex(wide.index)
        if model not in wide:
            continue
        err = wide.sub(actual, axis=0)
        days = pd.DatetimeIndex(wide.index).normalize()
        present = [b for b in baselines if b in wide]
        maes = {b: float(err[b].abs().mean()) for b in present}
        best = min(maes, key=lambda b: maes[b]) if maes else None
        mae_model = float(err[model].abs().mean())
        for base in present:
            statistic, p_value = diebold_mariano(err[model].abs(), err[base].abs(), int(h))
            lo, hi = day_bootstrap(err[model], err[base], days)
            rows.append(
                {
                    "series": series,
                    "horizon": h,
                    "model": model,
                    "baseline": base,
                    "mae_model": mae_model,
                    "mae_baseline": maes[base],
                    "diff_pct": 100 * (mae_model / maes[base] - 1) if maes[base] > 0 else np.nan,
                    "dm_stat": statistic,
                    "p_value": p_value,
                    "boot_lo_pct": lo,
                    "boot_hi_pct": hi,
                    "best_baseline": base == best,
                    "n": int(err[model].notna().sum()),
                }
            )
    return pd.DataFrame(rows)


def interval_table(
    fc: pd.DataFrame, quantiles: Sequence[float], model: str = "advisor", baseline: str = "naive"
) -> pd.DataFrame:
    """Per series × horizon × quantile level (other than the median): the model's and the
    baseline's coverage and pinball loss on the test origins, each coverage with its 95 %
    day-bootstrap interval, and the relative pinball difference with its interval.

    The baseline is naive plus the empirical quantile of its own trailing errors, the reservation
    baseline the research note measures an upper quantile against. Days are the blocks, as for
    the MAE: an h-step error overlaps the next day's by h − 1 hours at h > 1, so at h = 24 the
    intervals are somewhat narrower than the truth.
    """
    rows = []
    for level in sorted(set(quantiles) - {0.5}):
        col = f"q{level:g}"
        if col not in fc.columns:
            continue
        for (series, h), group in fc.groupby(["series", "horizon"], sort=True):
            wide = group.pivot_table(index="origin", columns="model", values=col, aggfunc="first")
            if model not in wide or baseline not in wide:
                continue
            actual = group.drop_duplicates("origin").set_index("origin")["actual"]
            y = actual.reindex(wide.index).to_numpy(float)
            days = pd.DatetimeIndex(wide.index).normalize()
            fm, fb = wide[model].to_numpy(float), wide[baseline].to_numpy(float)
            cov_lo, cov_hi = coverage_bootstrap(y, fm, days)
            base_lo, base_hi = coverage_bootstrap(y, fb, days)
            pin_m, pin_b = M.pinball(y, fm, level), M.pinball(y, fb, level)
            lo, hi = pinball_bootstrap(y, fm, fb, level, days)
            rows.append(
                {
                    "series": series,
                    "horizon": h,
                    "level": level,
                    "model": model,
                    "baseline": baseline,
                    "coverage": M.coverage(y, fm),
                    "coverage_lo": cov_lo,
                    "coverage_hi": cov_hi,
                    "coverage_baseline": M.coverage(y, fb),
                    "coverage_baseline_lo": base_lo,
                    "coverage_baseline_hi": base_hi,
                    "pinball": pin_m,
                    "pinball_baseline": pin_b,
                    "diff_pct": 100 * (pin_m / pin_b - 1) if pin_b > 0 else np.nan,
                    "boot_lo_pct": lo,
                    "boot_hi_pct": hi,
                    "days": len(np.unique(days[np.isfinite(y) & np.isfinite(fm)])),
                }
            )
    return pd.DataFrame(rows)
