"""Metrics against hand-computed values."""

import numpy as np
import pytest

from advisor.forecast import metrics as M

Y = np.array([10.0, 0.0, 4.0, np.nan])
F = np.array([8.0, 0.0, 6.0, 3.0])


def test_point_metrics_by_hand():
    # valid pairs: (10,8) (0,0) (4,6); errors 2, 0, 2
    assert M.mae(Y, F) == pytest.approx(4 / 3)
    assert M.rmse(Y, F) == pytest.approx(np.sqrt(8 / 3))
    assert M.wape(Y, F) == pytest.approx(100 * 4 / 14)
    # sMAPE terms: 200*2/18, 0 (0/0 counts as 0), 200*2/10
    assert M.smape(Y, F) == pytest.approx((400 / 18 + 0 + 40) / 3)


def test_mase_scale_is_seasonal_naive_in_sample():
    train = np.array([1.0, 2, 3, 5, 2, 3])  # season 3: |5-1|, |2-2|, |3-3| -> 4/3
    assert M.mase_scale(train, season=3) == pytest.approx(4 / 3)
    assert M.mase(Y, F, 4 / 3) == pytest.approx(1.0)


def test_pinball_and_coverage_by_hand():
    y = np.array([10.0, 20.0])
    q = np.array([12.0, 15.0])
    # q=0.9: under-forecast by 5 costs 0.9*5, over-forecast by 2 costs 0.1*2
    assert M.pinball(y, q, 0.9) == pytest.approx((0.2 + 4.5) / 2)
    assert M.coverage(y, q) == pytest.approx(0.5)


def test_release_scores_by_hand():
    r = np.array([5.0, 3.0, 0.0])
    m = np.array([4.0, 6.0, 2.0])
    s = M.release_scores(r, m)
    assert s["capture"] == pytest.approx(100 * (4 + 3 + 0) / 12)
    assert s["violation_rate"] == pytest.approx(100 / 3)
    assert s["mean_shortfall"] == pytest.approx(1 / 3)


def test_window_min_is_per_series_and_masks_gaps():
    from advisor.forecast.idle import window_min

    idle = np.array([[5.0, 1.0], [3.0, 2.0], [4.0, np.nan], [6.0, 7.0]])
    m = window_min(idle, 2)
    np.testing.assert_array_equal(m[0], [3.0, np.nan])
    np.testing.assert_array_equal(m[1], [4.0, np.nan])
    assert np.isnan(m[2]).all() and np.isnan(m[3]).all()
