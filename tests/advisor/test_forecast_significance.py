"""Paired tests of MAE differences: DM-HLN equals the paired t test at h = 1, overlapping
forecasts widen it, the day bootstrap brackets the observed difference; the upper quantile's
coverage and pinball loss get the same day bootstrap."""

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from advisor.forecast.significance import (
    coverage_bootstrap,
    day_bootstrap,
    diebold_mariano,
    interval_table,
    paired_table,
    pinball_bootstrap,
    release_bootstrap,
)


def test_at_one_step_dm_with_the_hln_correction_is_the_paired_t_test():
    rng = np.random.default_rng(1)
    a, b = rng.gamma(2.0, 1.0, 300), rng.gamma(2.0, 1.1, 300)
    statistic, p_value = diebold_mariano(a, b, h=1)
    expected = stats.ttest_rel(a, b)
    assert np.isclose(statistic, expected.statistic) and np.isclose(p_value, expected.pvalue)


def test_overlapping_forecasts_make_the_same_gain_less_certain():
    """A differential that persists for a day (as 24-h-ahead errors do) is fewer independent
    points than it looks: at h = 24 the statistic shrinks."""
    rng = np.random.default_rng(2)
    d = np.repeat(rng.normal(-0.3, 1.0, 14), 24)  # 14 independent days, each repeated hourly
    base = np.full(len(d), 5.0)
    one, p_one = diebold_mariano(base + d, base, h=1)
    day, p_day = diebold_mariano(base + d, base, h=24)
    assert one < 0 and day < 0 and abs(day) < abs(one) and p_day > p_one


def _dm_by_hand(d, h: int, weight):
    """DM-HLN written out from the formula: d̄ / √(V / n) × √((n + 1 − 2h + h(h − 1)/n) / n),
    V = γ₀ + 2 Σ_{k=1}^{h−1} weight(k) γ_k, γ_k = (1/n) Σ_{t=k}^{n−1} (d_t − d̄)(d_{t−k} − d̄);
    the p-value two-sided from t with n − 1 degrees of freedom. Returns (statistic, p, V); NaN
    for the first two where V ≤ 0."""
    n = len(d)
    mean = sum(d) / n
    gamma = [sum((d[t] - mean) * (d[t - k] - mean) for t in range(k, n)) / n for k in range(h)]
    v = gamma[0] + 2 * sum(weight(k) * gamma[k] for k in range(1, h))
    if v <= 0:
        return np.nan, np.nan, v
    statistic = mean / np.sqrt(v / n) * np.sqrt((n + 1 - 2 * h + h * (h - 1) / n) / n)
    return statistic, 2 * stats.t.sf(abs(statistic), n - 1), v


def _rectangular(k):
    return 1.0


def test_dm_at_h_24_is_the_formula_with_autocovariances_up_to_lag_23():
    """Three days of hourly losses whose differential persists for half a day: the
    rectangular window over lags 1 … 23 is positive, so it is the one used."""
    rng = np.random.default_rng(0)
    a = np.round(4 + np.repeat(rng.normal(-0.4, 0.6, 6), 12) + rng.normal(0, 0.5, 72), 2)
    b = np.round(4 + rng.normal(0, 0.5, 72), 2)
    d = (a - b).tolist()
    statistic, p_value, v = _dm_by_hand(d, 24, _rectangular)
    assert v > 0
    got = diebold_mariano(a, b, h=24)
    assert got[0] == pytest.approx(statistic, rel=1e-9)
    assert got[1] == pytest.approx(p_value, rel=1e-9)
    # the check can fail: leaving out lag 23 gives another figure
    assert abs(_dm_by_hand(d, 24, lambda k: float(k < 23))[0] - statistic) > 0.1


def test_a_negative_rectangular_long_run_variance_falls_back_to_bartlett_weights():
    """An alternating differential (negative autocovariance at odd lags): γ₀ + 2 Σ γ_k over
    lags 1 … 3 is negative, so the variance takes Bartlett weights 1 − k/h instead."""
    rng = np.random.default_rng(1)
    d = np.round(0.5 + 2.0 * (-1.0) ** np.arange(40) + rng.normal(0, 0.3, 40), 2)
    assert _dm_by_hand(d.tolist(), 4, _rectangular)[2] < 0
    statistic, p_value, v = _dm_by_hand(d.tolist(), 4, lambda k: 1 - k / 4)
    assert v > 0
    got = diebold_mariano(d, np.zeros(40), h=4)
    assert got[0] == pytest.approx(statistic, rel=1e-9)
    assert got[1] == pytest.approx(p_value, rel=1e-9)


def test_identical_forecasts_have_no_test():
    assert np.isnan(diebold_mariano([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], h=1)[0])


def test_day_bootstrap_brackets_the_observed_difference_and_is_repeatable():
    rng = np.random.default_rng(3)
    days = np.repeat(pd.date_range("2024-01-01", periods=14), 24)
    base = rng.normal(0, 2.0, len(days))
    model = 0.8 * base + rng.normal(0, 0.3, len(days))
    observed = 100 * (np.abs(model).mean() / np.abs(base).mean() - 1)
    lo, hi = day_bootstrap(model, base, days)
    assert lo < observed < hi < 0
    assert (lo, hi) == day_bootstrap(model, base, days)


def test_paired_table_flags_the_best_baseline_and_signs_the_difference():
    origins = pd.date_range("2024-01-01", periods=7 * 24, freq="h")
    rng = np.random.default_rng(4)
    actual = 50 + rng.normal(0, 3, len(origins))
    rows = []
    for name, noise in [("advisor", 1.0), ("naive", 2.0), ("seasonal_naive_24", 4.0)]:
        point = actual + rng.normal(0, noise, len(origins))
        rows.append(
            pd.DataFrame(
                {
                    "origin": origins,
                    "series": "s",
                    "horizon": 1,
                    "model": name,
                    "point": point,
                    "actual": actual,
                }
            )
        )
    table = paired_table(pd.concat(rows), baselines=("naive", "seasonal_naive_24"))
    naive = table.set_index("baseline").loc["naive"]
    assert naive["best_baseline"] and naive["diff_pct"] < 0 and naive["p_value"] < 0.01
    assert naive["boot_lo_pct"] < naive["diff_pct"] < naive["boot_hi_pct"]
    assert not table.set_index("baseline").loc["seasonal_naive_24", "best_baseline"]


def test_a_baseline_exact_on_every_day_has_no_interval_and_no_warning():
    """A pool never used (all zeros): the baseline's error is 0 on every day, so MAE ratios are
    undefined; numpy warned "All-NaN slice encountered" on the backtest's standard error."""
    import warnings

    days = np.repeat(pd.date_range("2020-05-25", periods=7, freq="D"), 24)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lo, hi = day_bootstrap(np.ones(len(days)), np.zeros(len(days)), days)
    assert np.isnan(lo) and np.isnan(hi)


DAYS_14 = np.repeat(pd.date_range("2024-01-01", periods=14), 24)


def test_misses_bunched_into_days_make_coverage_uncertain_and_spread_misses_do_not():
    """Both forecasts cover 0.9 of the hours. Misses spread evenly (every day covers 0.9) leave
    nothing to resample: the interval is the point. Misses bunched into whole days, as
    overlapping 24-h errors are, give a wide interval around 0.9."""
    actual = np.zeros(len(DAYS_14))
    hour = np.tile(np.arange(24), 14)
    # 0.9 of each day: 21.6 hours, so miss hours 0-1 on every day and hour 2 on 14 × 0.4 ≈ 6 days
    spread = np.where((hour < 2) | ((hour == 2) & (np.arange(len(hour)) // 24 < 5)), -1.0, 1.0)
    assert np.mean(actual <= spread) == pytest.approx(1 - (2 * 14 + 5) / 336)
    lo, hi = coverage_bootstrap(actual, spread, DAYS_14)
    assert 0.88 < lo <= hi < 0.92 and hi - lo < 0.02
    day = np.arange(len(hour)) // 24
    bunched = np.where(day < 1, -1.0, 1.0)  # every hour of day 0 missed: 13 / 14 = 0.929
    full = np.mean(actual <= bunched)
    lo, hi = coverage_bootstrap(actual, bunched, DAYS_14)
    assert full == pytest.approx(13 / 14)
    assert lo < 0.80 and hi == 1.0 and lo < full < hi
    assert (lo, hi) == coverage_bootstrap(actual, bunched, DAYS_14)  # repeatable (fixed seed)


def test_one_day_or_no_known_point_has_no_coverage_interval():
    one_day = np.repeat(pd.date_range("2024-01-01", periods=1), 24)
    assert np.isnan(coverage_bootstrap(np.zeros(24), np.ones(24), one_day)).all()
    nan = np.full(len(DAYS_14), np.nan)
    assert np.isnan(coverage_bootstrap(nan, np.ones(len(DAYS_14)), DAYS_14)).all()


def test_pinball_bootstrap_brackets_the_observed_difference_and_is_zero_for_one_forecast():
    rng = np.random.default_rng(5)
    actual = 50 + rng.normal(0, 3, len(DAYS_14))
    tight = actual + 3.84 + rng.normal(0, 0.5, len(actual))  # about the true q0.9 of N(0, 3)
    wide = actual + 3.84 + rng.normal(0, 4.0, len(actual))
    pin = {
        n: np.mean(np.maximum(0.9 * (actual - f), -0.1 * (actual - f)))
        for n, f in (("tight", tight), ("wide", wide))
    }
    observed = 100 * (pin["tight"] / pin["wide"] - 1)
    lo, hi = pinball_bootstrap(actual, tight, wide, 0.9, DAYS_14)
    assert lo < observed < hi < 0
    assert pinball_bootstrap(actual, wide, wide, 0.9, DAYS_14) == (0.0, 0.0)


def _quantile_rows(origins, actual, model: str, q9) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "origin": origins,
            "series": "pool-a",
            "horizon": 24,
            "model": model,
            "point": actual,
            "actual": actual,
            "q0.5": actual,
            "q0.9": q9,
        }
    )


def test_interval_table_scores_the_advisor_against_naive_per_level():
    origins = pd.date_range("2024-01-01", periods=7 * 24, freq="h")
    actual = np.arange(len(origins), dtype=float) % 10
    advisor = actual + np.where(np.arange(len(origins)) % 10 == 0, -1.0, 0.5)  # misses 1 in 10
    naive = actual + 3.0  # never misses, three units of headroom
    fc = pd.concat(
        [
            _quantile_rows(origins, actual, "advisor", advisor),
            _quantile_rows(origins, actual, "naive", naive),
        ]
    )
    table = interval_table(fc, (0.5, 0.9))
    assert len(table) == 1  # the median is no interval
    row = table.iloc[0]
    assert row["level"] == 0.9 and row["days"] == 7 and row["baseline"] == "naive"
    misses = np.mean(np.arange(len(origins)) % 10 == 0)
    assert row["coverage"] == pytest.approx(1 - misses)
    assert row["coverage_baseline"] == 1.0 and row["coverage_baseline_lo"] == 1.0
    assert row["coverage_lo"] <= row["coverage"] <= row["coverage_hi"]
    pin_advisor = np.mean(np.where(np.arange(len(origins)) % 10 == 0, 0.9, 0.1 * 0.5))
    assert row["pinball"] == pytest.approx(pin_advisor)
    assert row["pinball_baseline"] == pytest.approx(0.3)
    assert row["diff_pct"] == pytest.approx(100 * (pin_advisor / 0.3 - 1))
    assert row["boot_lo_pct"] <= row["diff_pct"] <= row["boot_hi_pct"]


def test_interval_table_skips_a_series_without_the_baseline():
    origins = pd.date_range("2024-01-01", periods=48, freq="h")
    actual = np.ones(48)
    assert interval_table(_quantile_rows(origins, actual, "advisor", actual), (0.9,)).empty


def test_release_bootstrap_brackets_capture_and_violations_and_needs_two_days():
    """A release that overshoots the window minimum on the hours of one day in four: the
    violation share is 25 % of the hours, all on whole days, so its interval is wide; capture is
    Σmin(R, m)/Σm in percent, and its interval brackets it."""
    days = np.repeat(pd.date_range("2024-01-01", periods=8), 24)
    truth = np.full(len(days), 10.0)
    day = np.arange(len(days)) // 24
    released = np.where(day % 4 == 0, 12.0, 8.0)  # days 0 and 4 overshoot
    got = release_bootstrap(released, truth, days)
    capture = 100 * np.minimum(released, truth).sum() / truth.sum()
    assert got["capture_lo"] <= capture <= got["capture_hi"] and got["capture_hi"] <= 100
    assert got["violation_lo"] < 25.0 < got["violation_hi"]
    assert got["violation_lo"] >= 0 and got["violation_hi"] <= 100
    assert got == release_bootstrap(released, truth, days)  # repeatable
    one_day = release_bootstrap(released[:24], truth[:24], days[:24])
    assert all(np.isnan(v) for v in one_day.values())
