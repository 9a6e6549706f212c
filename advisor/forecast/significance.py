"""Is a model's MAE gain over a baseline more than noise? Paired tests on the test origins.

A 1 % lower MAE over two weeks of hourly origins can be luck. The research note's protocol asks
for a paired test of the MAE difference against the baselines, so every backtest reports two:

* Diebold–Mariano on the loss differential d_t = |e_model,t| − |e_base,t|, with the
  Harvey–Leybourne–Newbold small-sample correction and a t distribution with n − 1 degrees of
  freedom. Forecasts h steps ahead from hourly origins overlap, so their errors are correlated up
  to lag h − 1; the variance of the mean difference uses those autocovariances.
* A bootstrap over days (days as blocks, which keeps each day's correlated errors together) of the
  relative MAE difference, as an interval that assumes nothing about the shape of d.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

BOOTSTRAP_SAMPLES = 2000


def diebold_mariano(loss_model, loss_base, h: int) -> tuple[float, float]:
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


def day_bootstrap(
    err_model, err_base, days, samples: int = BOOTSTRAP_SAMPLES, seed: int = 0
) -> tuple[float, float]:
    """95 % interval of MAE_model / MAE_base − 1 (in percent), resampling whole days."""
    a, b = np.abs(np.asarray(err_model, float)), np.abs(np.asarray(err_base, float))
    ok = np.isfinite(a) & np.isfinite(b)
    labels, day = np.unique(np.asarray(days)[ok], return_inverse=True)
    if len(labels) < 2:
        return np.nan, np.nan
    sum_a = np.bincount(day, weights=a[ok], minlength=len(labels))
    sum_b = np.bincount(day, weights=b[ok], minlength=len(labels))
    draw = np.random.default_rng(seed).integers(0, len(labels), (samples, len(labels)))
    total_b = sum_b[draw].sum(axis=1)
    ratio = np.divide(
        sum_a[draw].sum(axis=1), total_b, out=np.full(samples, np.nan), where=total_b > 0
    )
    if np.isnan(ratio).all():  # the baseline exact on every day drawn (a pool never used)
        return np.nan, np.nan
    lo, hi = np.nanpercentile(100 * (ratio - 1), [2.5, 97.5])
    return float(lo), float(hi)


def paired_table(fc: pd.DataFrame, model: str = "advisor", baselines=None) -> pd.DataFrame:
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
        best = min(maes, key=maes.get) if maes else None
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
