"""A scheduled resize is a known covariate: rows after the last observation that carry only a
capacity are the future. The forecast starts at the last observed hour and is clipped to the
capacity at each target; idle windows start there too and release no GPU the resize takes."""

import numpy as np
import pandas as pd

from advisor.forecast import features as feat
from advisor.forecast.api import forecast, idle_windows
from advisor.forecast.idle import known_capacity_drop
from advisor.forecast.panel import Panel
from tests.factories import demand_panel


def _with_future_capacity(panel: Panel, hours: int, shrink_to: dict[str, float]) -> Panel:
    """`panel` plus `hours` rows with no value and each named series' capacity cut to a level."""
    step = panel.index[1] - panel.index[0]
    future = pd.date_range(panel.index[-1] + step, periods=hours, freq=step)
    values = pd.DataFrame(np.nan, index=future, columns=panel.series)
    capacity = pd.DataFrame(
        {s: shrink_to.get(s, panel.capacity[s].iloc[-1]) for s in panel.series}, index=future
    )
    return Panel(
        pd.concat([panel.values, values]), pd.concat([panel.capacity, capacity]), panel.name
    )


def test_last_observed_is_the_last_row_any_series_has():
    y = np.array([[1.0, np.nan], [np.nan, 2.0], [np.nan, np.nan]])
    assert feat.last_observed(y) == 1
    assert feat.last_observed(np.full((3, 2), np.nan)) == -1


def test_the_forecast_starts_at_the_last_observation_and_obeys_the_known_resize():
    past = demand_panel(days=14, series=2, seed=5)
    shrink = 20.0  # pool0 holds about 32 of 64: the resize cuts below what it uses
    panel = _with_future_capacity(past, 24, {"pool0": shrink})
    got = forecast(panel, horizons=(1, 6, 24), quantiles=(0.1, 0.5, 0.9), model="naive")
    assert (got["origin"] == past.index[-1]).all()
    assert (got["target_time"] == past.index[-1] + pd.to_timedelta(got["horizon"], "h")).all()
    pool0 = got[got["series"] == "pool0"]
    assert (pool0["capacity"] == shrink).all()
    assert (pool0[["q0.1", "q0.5", "q0.9"]].to_numpy() <= shrink).all()
    # pool1 keeps its size: the same forecast as without the future rows
    alone = forecast(past, horizons=(1, 6, 24), quantiles=(0.1, 0.5, 0.9), model="naive")
    pd.testing.assert_frame_equal(
        got[got["series"] == "pool1"].reset_index(drop=True),
        alone[alone["series"] == "pool1"].reset_index(drop=True),
    )


def test_a_resize_beyond_the_horizon_changes_nothing_before_it():
    past = demand_panel(days=14, series=1, seed=6)
    cap = past.capacity["pool0"].iloc[-1]
    # 6 more hours at full size, then the cut: h = 1 and 6 are untouched, h = 24 is clipped
    panel = _with_future_capacity(past, 6, {})
    panel = _with_future_capacity(panel, 18, {"pool0": 8.0})
    got = forecast(panel, horizons=(1, 6, 24), model="naive").set_index("horizon")
    assert got.loc[1, "capacity"] == got.loc[6, "capacity"] == cap
    assert got.loc[24, "capacity"] == 8.0 and got.loc[24, "q0.9"] <= 8.0
    assert (got["origin"] == past.index[-1]).all()


def test_known_capacity_drop_is_the_fall_within_the_window_only():
    cap = np.array([[64.0, 32.0], [64.0, 32.0], [40.0, 48.0], [20.0, 32.0]])
    assert known_capacity_drop(cap, 0, 1).tolist() == [0.0, 0.0]
    assert known_capacity_drop(cap, 0, 2).tolist() == [24.0, 0.0]  # a rise frees nothing
    assert known_capacity_drop(cap, 0, 8).tolist() == [44.0, 0.0]
    assert known_capacity_drop(cap, 3, 4).tolist() == [0.0, 0.0]  # nothing known after
    unknown = np.array([[64.0], [np.nan]])
    assert known_capacity_drop(unknown, 0, 1).tolist() == [0.0]  # ffilled: no change known


def test_idle_windows_start_at_the_last_observation_and_release_nothing_a_resize_takes():
    past = demand_panel(days=14, series=2, seed=7)
    before = idle_windows(past, (1, 4), 0.05, method="rules")
    # pool0: 64 GPUs, about 32 in use; a cut to 20 in 2 hours leaves nothing free from then
    panel = _with_future_capacity(past, 2, {})
    panel = _with_future_capacity(panel, 6, {"pool0": 20.0})
    after = idle_windows(panel, (1, 4), 0.05, method="rules")
    assert (after["as_of"] == past.index[-1]).all()
    b = before.set_index(["series", "window_h"])["release"]
    a = after.set_index(["series", "window_h"])["release"]
    assert b.loc[("pool0", 4)] > 0 and a.loc[("pool0", 4)] == 0.0
    assert a.loc[("pool0", 1)] == b.loc[("pool0", 1)]  # the cut comes after the first 2 hours
    assert a.loc["pool1"].equals(b.loc["pool1"])
