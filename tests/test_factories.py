"""The demand factories do what their parameters say (a factory that ignored one would let the
tests built on it check less than they claim)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.factories import demand_frame, demand_panel, jumping_panel


def test_demand_panel_keys_capacity_and_grid() -> None:
    panel = demand_panel(days=3, series=["a100", "h100"], capacity=[32, 16], freq="30min")
    assert panel.series == ["a100", "h100"]
    assert len(panel.index) == 3 * 48 and panel.index.freqstr == "30min"
    assert panel.capacity.max().tolist() == [32.0, 16.0]
    assert ((panel.values >= 0) & (panel.values <= panel.capacity)).all().all()
    assert demand_panel(days=1, series=3).series == ["pool0", "pool1", "pool2"]


def test_demand_panel_season_trend_and_noise_seed() -> None:
    calm = {"walk_sd": 0.0, "capacity": 1000.0, "series": 1}
    daily = demand_panel(days=2, daily_amplitude=0.1, **calm).values["pool0"]
    assert daily.iloc[6] - daily.iloc[18] == pytest.approx(200, abs=1)  # +/- 0.1 x 1000
    rising = demand_panel(days=4, daily_amplitude=0.0, trend_per_day=24.0, **calm).values
    assert np.diff(rising["pool0"].to_numpy()) == pytest.approx(np.ones(4 * 24 - 1), abs=1)
    same, other = demand_panel(seed=1).values, demand_panel(seed=2).values
    assert same.equals(demand_panel(seed=1).values) and not same.equals(other)


def test_jumping_panel_levels_are_whole_gpus_of_the_pool() -> None:
    panel = jumping_panel(48, 3, seed=0, gpus=4)
    assert panel.series == ["p0", "p1", "p2"]
    assert set(np.unique(panel.values.to_numpy())) <= {0.0, 1.0, 2.0, 3.0, 4.0}
    assert (panel.values.diff().abs().to_numpy()[1:] > 0).any()


def test_demand_frame_noise_is_drawn_only_when_asked() -> None:
    plain, noisy = demand_frame(5), demand_frame(5, noise_sd=3)
    assert len(plain) == 5 * 4 and plain["pool"].eq("a100").all()
    assert not plain["allocated_gpus"].equals(noisy["allocated_gpus"])
    assert plain["held_gpus"].equals(noisy["held_gpus"])  # held GPUs are the cycle's, unnoised
