"""Quantile ordering, capacity clipping, selection on the training part only, masked actuals."""

import numpy as np
import pandas as pd
import pytest

from advisor.forecast import rolling, selection
from advisor.forecast.models import NAMES, clip_to_capacity, make, sort_quantiles
from advisor.forecast.panel import Panel
from tests.factories import demand_panel, minute_demand_panel

QS = (0.1, 0.5, 0.9)


@pytest.mark.parametrize("name", NAMES)
def test_every_model_keeps_the_one_contract(name):
    """The shared check over every name `make` knows (`models.NAMES`, the backtest's candidates):
    built by its reported name; after a fit on rows ≤ until, point forecasts and quantiles at
    every horizon, finite, ordered, inside [0, capacity at the target], the median in place;
    a refit on the same rows gives the same forecasts (deterministic)."""
    assert make(name, QS).name == name
    p = demand_panel(days=12)
    y, cap, t = p.values.to_numpy(float), p.capacity.to_numpy(float), p.index
    origins = np.arange(24 * 10, 24 * 11)
    m = make(name, QS).fit(y, cap, t, 24 * 10, (1, 24))
    again = make(name, QS).fit(y, cap, t, 24 * 10, (1, 24))
    for h in (1, 24):
        point = m.predict(y, cap, t, origins, h)
        qs = m.predict_quantiles(y, cap, t, origins, h, QS)
        assert point.shape == (len(origins), y.shape[1]) and np.isfinite(point).all()
        assert all(np.isfinite(qs[q]).all() for q in QS)
        assert np.all(qs[0.1] <= qs[0.5]) and np.all(qs[0.5] <= qs[0.9])
        assert np.all(qs[0.1] >= 0) and np.all(qs[0.9] <= cap[0])
        assert np.all(point >= 0) and np.all(point <= cap[0])
        np.testing.assert_array_equal(point, again.predict(y, cap, t, origins, h))


def test_make_knows_only_its_names():
    with pytest.raises(ValueError, match="unknown model 'seasonal_naive_12'"):
        make("seasonal_naive_12")
    assert set(NAMES) == set(selection.CANDIDATES)


def test_decomposed_follows_a_daily_and_a_weekly_season():
    """`decomposed_24_168` learns both profiles from the trailing weeks: on a series whose level
    wanders and whose weekends sit higher, a day ahead it beats naive and the weekly seasonal
    naive (which carries last week's noise and level), and an hour ahead it is no worse than
    naive by more than the noise."""
    n = 24 * 60
    t = np.arange(n)
    rng = np.random.default_rng(0)
    weekend = ((t // 24) % 7 >= 5).astype(float)
    level = 100 + np.cumsum(rng.normal(0, 0.5, n))
    y = (level + 10 * np.sin(2 * np.pi * t / 24) + 8 * weekend + rng.normal(0, 2, n))[:, None]
    y[100:110] = np.nan  # a gap in the history
    cap = np.full_like(y, 200.0)
    times = pd.date_range("2020-01-06", periods=n, freq="h")
    until, origins = 24 * 40, np.arange(24 * 40, 24 * 54)

    def mae(name: str, h: int) -> float:
        m = make(name, QS).fit(y, cap, times, until, (1, h))
        return float(np.mean(np.abs(y[origins + h] - m.predict(y, cap, times, origins, h))))

    assert mae("decomposed_24_168", 24) < 0.8 * min(mae("naive", 24), mae("seasonal_naive_168", 24))
    assert mae("decomposed_24_168", 1) < 1.05 * mae("naive", 1)


def test_sort_quantiles_uncrosses():
    out = sort_quantiles({0.1: np.array([5.0]), 0.9: np.array([3.0])})
    assert out[0.1][0] == 3 and out[0.9][0] == 5


def test_clipping_uses_capacity_at_the_target_time():
    cap = np.array([[10.0], [10.0], [4.0]])
    pred = np.array([[8.0], [-1.0]])
    out = clip_to_capacity(pred, cap, np.array([1, 0]), 1)
    assert out[0, 0] == 4.0  # capacity drops to 4 at the target of origin 1
    assert out[1, 0] == 0.0


def test_naive_forecast_is_clipped_when_capacity_shrinks():
    p = demand_panel(days=10, series=1)
    y, cap, t = p.values.to_numpy(float), p.capacity.to_numpy(float).copy(), p.index
    cap[200:] = 5.0  # a known resize: the pool shrinks to 5
    pred = make("naive").fit(y, cap, t, 190, (24,)).predict(y, cap, t, np.array([190]), 24)
    assert pred[0, 0] == 5.0


def test_selection_uses_the_training_part_only():
    p = demand_panel(days=24)
    test_start = 24 * 20
    picks1 = rolling.select(
        p, (1, 24), (0.5, 0.9), test_start, candidates=("naive", "same_hour_mean_7d", "linear")
    )
    vals = p.values.copy()
    vals.iloc[test_start:] = vals.iloc[test_start:][::-1].to_numpy() * 0.5  # scramble the test part
    p2 = Panel(vals, p.capacity, p.name)
    picks2 = rolling.select(
        p2, (1, 24), (0.5, 0.9), test_start, candidates=("naive", "same_hour_mean_7d", "linear")
    )
    pd.testing.assert_frame_equal(picks1, picks2)
    chosen = {m for pick in picks1["pick"] for m in selection.members_of(pick)}
    assert chosen <= {"naive", "same_hour_mean_7d", "linear"}


def test_backtest_ignores_masked_actuals_and_reports_every_model():
    p = demand_panel(days=24)
    vals = p.values.copy()
    vals.iloc[24 * 21 : 24 * 21 + 10] = np.nan
    p = Panel(vals, p.capacity, p.name)
    metrics, fc, picks = rolling.run(
        p,
        (1, 24),
        (0.5, 0.9),
        test_from="2024-01-21",
        test_to="2024-01-23",
        candidates=("naive", "seasonal_naive_24", "linear"),
    )
    assert set(metrics["model"]) == {"naive", "seasonal_naive_24", "linear", "advisor"}
    assert metrics[["mae", "rmse", "wape", "smape", "mase", "pinball_q90"]].notna().all().all()
    row = metrics[(metrics.model == "naive") & (metrics.horizon == 1)].iloc[0]
    assert row["n"] == 48 - 10
    # the advisor's points are the median of its pick's members at every test origin
    for r in picks.itertuples():
        mine = fc[(fc.series == r.series) & (fc.horizon == r.horizon)]
        points = mine.pivot(index="origin", columns="model", values="point")
        want = points[list(selection.members_of(r.pick))].median(axis=1)
        np.testing.assert_allclose(points["advisor"], want)


def test_api_forecast_advisor_carries_its_measured_error():
    from advisor.forecast import forecast

    p = demand_panel(days=15, series=1)
    out = forecast(p, horizons=(1, 24), quantiles=(0.1, 0.5, 0.9))
    assert len(out) == 2
    assert out["model"].str.startswith("advisor:").all()
    assert (out["q0.1"] <= out["q0.5"]).all() and (out["q0.5"] <= out["q0.9"]).all()
    assert (out["q0.9"] <= out["capacity"]).all()
    assert (
        out[["backtest_mae", "backtest_mae_naive", "backtest_mae_seasonal_naive_24"]]
        .notna()
        .all()
        .all()
    )


def test_learned_models_measure_interval_errors_out_of_sample():
    from advisor.forecast.models import RESID_WINDOW

    p = demand_panel(days=24)
    y, cap, t = p.values.to_numpy(float), p.capacity.to_numpy(float), p.index
    until = 24 * 22
    m = make("gbm", QS).fit(y, cap, t, until, (1, 24))
    y_seen, within_seen, at, clone = m._oos
    assert y_seen is y and within_seen is None and at == until - 24 - RESID_WINDOW
    assert clone is not m and m._resid[24].shape[0] == until - 24 - at + 1


def test_api_forecast_falls_back_to_naive_when_a_horizon_cannot_be_validated():
    from advisor.forecast import forecast

    p = demand_panel(days=12, series=1)
    out = forecast(p, horizons=(168,), quantiles=(0.5, 0.9)).iloc[0]
    assert out["model"] == "advisor:naive"
    assert np.isnan(
        out["backtest_mae"]
    )  # no measured error: the caller must not present it as validated


def test_api_forecast_without_an_interval_keeps_the_median_in_its_place():
    """30 hours and a 24 h horizon: naive has 6 known errors, too few for an interval; its
    q0.1/q0.9 are NaN and the median stays the median (np.sort would move it to q0.1)."""
    from advisor.forecast import forecast

    p = demand_panel(days=2, series=1)
    p = Panel(p.values.iloc[:30], p.capacity.iloc[:30], p.name)
    out = forecast(p, horizons=(1, 24), quantiles=(0.1, 0.5, 0.9), model="naive")
    h1, h24 = out.iloc[0], out.iloc[1]
    assert np.isnan(h24["q0.1"]) and np.isnan(h24["q0.9"])
    y = p.values.to_numpy(float)[:, 0]
    errors = y[24:30] - y[0:6]  # naive's six errors at 24 h
    assert h24["q0.5"] == pytest.approx(y[-1] + np.median(errors))
    assert h1["q0.1"] <= h1["q0.5"] <= h1["q0.9"]  # 29 errors at 1 h: an interval


def test_sort_quantiles_leaves_a_missing_level_in_its_place():
    out = sort_quantiles({0.1: np.array([np.nan]), 0.5: np.array([4.0]), 0.9: np.array([np.nan])})
    assert out[0.5][0] == 4.0 and np.isnan(out[0.1][0]) and np.isnan(out[0.9][0])


def test_last_reading_forecasts_the_origin_hours_last_reading_at_every_horizon():
    from advisor.forecast import features as feat

    p = minute_demand_panel(days=12).resample("h")
    y, cap, t = p.values.to_numpy(float).copy(), p.capacity.to_numpy(float), p.index
    y[200, 0] = np.nan  # a masked origin hour: the last reading of the hour before it
    within = feat.within_arrays(p.within, p.values)  # hour 200's own readings are ignored
    origins = np.arange(24 * 8, 24 * 11)
    m = make("last_reading", QS).fit(y, cap, t, int(origins[0]), (1, 24), within)
    expected = p.within["last"].to_numpy(float)[origins]
    expected[origins == 200, 0] = p.within["last"].iloc[199, 0]
    for h in (1, 24):
        point = m.predict(y, cap, t, origins, h, within)
        np.testing.assert_array_equal(point, np.clip(expected, 0, cap[0]))
        qs = m.predict_quantiles(y, cap, t, origins, h, QS, within)
        assert np.all(qs[0.1] <= qs[0.5]) and np.all(qs[0.5] <= qs[0.9])
        assert np.all(qs[0.1] >= 0) and np.all(qs[0.9] <= cap[0])
        assert np.any(qs[0.9] > qs[0.1])  # an interval from its own trailing errors
    # the last reading is a different level from the hour's mean (naive)
    naive = make("naive").fit(y, cap, t, int(origins[0]), (1,)).predict(y, cap, t, origins, 1)
    assert not np.allclose(naive, m.predict(y, cap, t, origins, 1, within))
    # without sub-hour information it is naive
    np.testing.assert_array_equal(m.predict(y, cap, t, origins, 1), naive)


def test_last_reading_is_a_candidate_of_the_backtest():
    assert "last_reading" in rolling.CANDIDATES
    p = minute_demand_panel(days=12).resample("h")
    _m, fc, picks = rolling.run(
        p, (1,), (0.5, 0.9), test_from=p.index[24 * 11], candidates=("naive", "last_reading")
    )
    lr = fc[fc["model"] == "last_reading"].set_index(["origin", "series"])["point"]
    want = p.within["last"].stack()
    want.index.names = ["origin", "series"]
    np.testing.assert_allclose(lr, want.reindex(lr.index))
    assert set(picks["pick"]) <= {"naive", "median(naive,last_reading)"}
