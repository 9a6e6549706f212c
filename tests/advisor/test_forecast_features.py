"""No look-ahead: anything built at origin t must not change when data after t is altered."""

import numpy as np
import pandas as pd
import pytest

from advisor.forecast import features as feat
from advisor.forecast import rolling
from advisor.forecast.models import NAMES, make
from advisor.forecast.panel import Panel
from tests.factories import demand_panel, minute_demand_panel


def _altered(y: np.ndarray, t: int) -> np.ndarray:
    z = y.copy()
    z[t + 1 :] = z[t + 1 :] * 3 + 100
    # masked points right after the origin (a one- or two-step lead of anything, the observed
    # flags included, reads them at row t) and a later one
    z[t + 1, 0] = np.nan
    z[t + 2, -1] = np.nan
    z[t + 5, 0] = np.nan
    return z


@pytest.mark.parametrize("horizon", [1, 24])
def test_feature_rows_use_nothing_after_origin(horizon):
    p = demand_panel(days=15)
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
    p = demand_panel(days=14)
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


@pytest.mark.parametrize("name", NAMES)
def test_models_on_a_short_history_ignore_data_after_the_origin(name):
    """The service's shape: under two days of history, fitted from the first hour on, origins in
    the first day. A model whose start-up state reads a whole season (Holt-Winters) leaked the
    day's later hours into these forecasts, scored near zero error and won the selection."""
    p = demand_panel(days=2)
    y = p.values.to_numpy(float)
    origins = np.arange(0, 40)
    out = []
    for t in (5, 22):
        for data in (y, _altered(y, t)):
            panel = Panel(
                pd.DataFrame(data, index=p.index, columns=p.values.columns), p.capacity, p.name
            )
            fc = rolling.rolling_forecasts(panel, [name], (1, 6), (0.1, 0.5, 0.9), origins)
            out.append(fc[fc["origin"] <= p.index[t]].reset_index(drop=True))
        before, after = out[-2], out[-1]
        assert len(before) > 0
        for column in ("point", "q0.1", "q0.5", "q0.9"):
            np.testing.assert_allclose(before[column], after[column], err_msg=f"{column} t={t}")


def _altered_minutes(p: Panel, start: pd.Timestamp) -> Panel:
    """Every minute reading from `start` on changed, one masked, the first two hours from `start`
    masked outright (one series each) and a later hour."""
    vals = p.values.copy()
    after = vals.index >= start
    vals.loc[after] = vals.loc[after].to_numpy() * 3 + 100
    first = int(np.argmax(after))
    vals.iloc[first + 7, 0] = np.nan
    # the two hours after the origin's hour masked outright (a one- or two-hour lead reads them
    # at the origin), and a later one
    vals.iloc[first : first + 60, 1] = np.nan
    vals.iloc[first + 60 : first + 120, 0] = np.nan
    vals.iloc[first + 180 : first + 240, 1] = np.nan
    return Panel(vals, p.capacity, p.name)


def _hourly_arrays(p: Panel):
    h = p.resample("h")
    y, cap = h.values.to_numpy(float), h.capacity.to_numpy(float)
    return y, cap, h.index, feat.within_arrays(h.within, h.values)


@pytest.mark.parametrize("horizon", [1, 24])
def test_sub_hour_features_use_no_minute_after_the_origin_hour(horizon):
    p = minute_demand_panel(days=15)
    t = 250
    after_hour = p.resample("h").index[t + 1]  # the first minute after origin hour t
    built = []
    for panel in (p, _altered_minutes(p, after_hour)):
        y, cap, times, within = _hourly_arrays(panel)
        built.append(feat.build(y, cap, times, horizon, within=within))
    (X1, names, last1, s1), (X2, _, last2, s2) = built
    assert {"last_reading", "within_min", "within_max", "within_slope"} <= set(names)
    np.testing.assert_array_equal(X1[: t + 1], X2[: t + 1])
    np.testing.assert_array_equal(last1[: t + 1], last2[: t + 1])
    np.testing.assert_array_equal(s1[: t + 1], s2[: t + 1])
    assert not np.allclose(X1[t + 2 :], X2[t + 2 :])  # the check itself can fail
    # and row t does read the minutes inside its own hour: changing the last one changes it
    vals = p.values.copy()
    vals.iloc[vals.index.get_loc(after_hour) - 1] += 30
    y, cap, times, within = _hourly_arrays(Panel(vals, p.capacity, p.name))
    X3 = feat.build(y, cap, times, horizon, within=within)[0]
    j = names.index("last_reading")
    assert np.all(X3[t, :, j] != X1[t, :, j])
    np.testing.assert_array_equal(X3[:t], X1[:t])


@pytest.mark.parametrize("name", NAMES)
def test_models_at_minute_resolution_ignore_minutes_after_the_origin_hour(name):
    p = minute_demand_panel(days=14)
    t = 24 * 11
    origins = np.arange(t - 30, t + 1)
    after_hour = p.resample("h").index[t + 1]
    out = []
    for panel in (p, _altered_minutes(p, after_hour)):
        y, cap, times, within = _hourly_arrays(panel)
        m = make(name, (0.1, 0.5, 0.9)).fit(y, cap, times, t, (1, 24), within)
        for h in (1, 24):
            point = m.predict(y, cap, times, origins, h, within)
            qs = m.predict_quantiles(y, cap, times, origins, h, (0.1, 0.5, 0.9), within)
            out.append((point, qs[0.1], qs[0.9]))
    half = len(out) // 2
    for a, b in zip(out[:half], out[half:], strict=True):
        for x1, x2 in zip(a, b, strict=True):
            np.testing.assert_array_equal(x1, x2)


def test_rolling_forecasts_at_minute_resolution_ignore_minutes_after_the_origin_hour():
    """End to end through `rolling_forecasts` (the backtest's engine), refits included."""
    p = minute_demand_panel(days=14)
    t = 24 * 11
    origins = np.arange(24 * 10, t + 1)
    after_hour = p.resample("h").index[t + 1]
    runs = []
    for panel in (p, _altered_minutes(p, after_hour)):
        fc = rolling.rolling_forecasts(
            panel.resample("h"), rolling.CANDIDATES, (1, 24), (0.1, 0.9), origins, refit_every=12
        )
        runs.append(fc.drop(columns=["actual"]))  # the targets lie after t and do change
    assert set(runs[0]["model"]) == set(rolling.CANDIDATES)
    pd.testing.assert_frame_equal(runs[0], runs[1])
