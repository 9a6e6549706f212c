"""No look-ahead: anything built at origin t must not change when data after t is altered."""

import numpy as np
import pytest

from advisor.forecast import features as feat
from advisor.forecast.models import make
from tests.advisor.forecast_synth import synthetic_panel


def _altered(y: np.ndarray, t: int) -> np.ndarray:
    z = y.copy()
    z[t + 1 :] = z[t + 1 :] * 3 + 100
    z[t + 5, 0] = np.nan
    return z


@pytest.mark.parametrize("horizon", [1, 24])
def test_feature_rows_use_nothing_after_origin(horizon):
    p = synthetic_panel(days=15)
    y, cap = p.values.to_numpy(float), p.capacity.to_numpy(float)
    t = 250
    X1, names, last1, s1 = feat.build(y, cap, p.index, horizon)
    X2, _, last2, s2 = feat.build(_altered(y, t), cap, p.index, horizon)
    np.testing.assert_array_equal(X1[: t + 1], X2[: t + 1])
    np.testing.assert_array_equal(last1[: t + 1], last2[: t + 1])
    np.testing.assert_array_equal(s1[: t + 1], s2[: t + 1])
    # and the check itself can fail: the rows after t do change
    assert not np.allclose(np.nan_to_num(X1[t + 2 :]), np.nan_to_num(X2[t + 2 :]))
    assert len(names) == X1.shape[-1]


def test_shift_refuses_the_future():
    with pytest.raises(ValueError):
        feat.shift(np.zeros((5, 1)), -1)


@pytest.mark.parametrize(
    "name",
    [
        "naive",
        "seasonal_naive_24",
        "seasonal_naive_168",
        "same_hour_mean_7d",
        "holt_winters",
        "gbm",
        "linear",
        "combo",
    ],
)
def test_models_fitted_at_t_ignore_data_after_t(name):
    p = synthetic_panel(days=14)
    y, cap, times = p.values.to_numpy(float), p.capacity.to_numpy(float), p.index
    t = 24 * 11
    origins = np.arange(t - 30, t + 1)
    out = []
    for data in (y, _altered(y, t)):
        m = make(name, (0.1, 0.5, 0.9)).fit(data, cap, times, t, (1, 24))
        point = m.predict(data, cap, times, origins, 24)
        qs = m.predict_quantiles(data, cap, times, origins, 24, (0.1, 0.5, 0.9))
        out.append((point, qs[0.9]))
    np.testing.assert_allclose(out[0][0], out[1][0])
    np.testing.assert_allclose(out[0][1], out[1][1])
