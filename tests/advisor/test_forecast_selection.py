"""The advisor's rule (`advisor.forecast.selection`): a candidate joins naive only with a gain
that holds in every validation window; the point is the median of naive and those; the
quantiles are split-conformal on the advisor's own errors known at each origin."""

import numpy as np
import pandas as pd
import pytest

from advisor.forecast import rolling, selection
from advisor.forecast.models import MIN_INTERVAL_ERRORS
from advisor.forecast.panel import Panel
from tests.factories import demand_panel


def _daily(values: dict[str, list[float]]) -> pd.DataFrame:
    """Absolute errors per hourly origin, one value per day and candidate."""
    days = len(next(iter(values.values())))
    idx = pd.date_range("2024-01-01", periods=days * 24, freq="h")
    return pd.DataFrame({k: np.repeat(v, 24).astype(float) for k, v in values.items()}, index=idx)


def test_a_gain_must_hold_in_every_window_to_count():
    # "a" wins on the whole window by far but loses the last third; "b" wins a little in each
    loss = _daily({"naive": [5] * 9, "a": [1, 1, 1, 1, 1, 1, 6, 6, 6], "b": [4.9] * 9})
    assert selection.good(loss) == ["b"]
    assert selection.members(loss) == ("naive", "b")
    assert selection.members(loss, selection.Rule(combine="best")) == ("b",)
    # the margin asks for more than a hair in every window
    assert selection.good(loss, selection.Rule(margin=0.05)) == []
    assert selection.members(loss, selection.Rule(margin=0.05)) == ("naive",)
    # one window: the whole validation part decides
    assert selection.good(loss, selection.Rule(windows=1)) == ["a", "b"]


def test_a_tie_with_naive_is_not_a_gain():
    loss = _daily({"naive": [3, 0, 3], "same": [3, 0, 3], "better": [2, 0, 2]})
    assert selection.good(loss) == []  # a window where naive is exact leaves nothing to beat
    loss = _daily({"naive": [3, 1, 3], "same": [3, 1, 3], "better": [2, 0.5, 2]})
    assert selection.good(loss) == ["better"]


def test_windows_are_runs_of_whole_days():
    origins = pd.date_range("2024-01-01", periods=24 * 7, freq="h")
    w = selection.window_of(origins, 3)
    assert sorted(set(w)) == [0, 1, 2]
    days = pd.Series(w, index=origins).groupby(origins.normalize()).nunique()
    assert (days == 1).all()  # no day is split
    assert selection.window_of(origins[:48], 3).max() == 1  # two days: two windows


def test_labels_name_the_members_and_read_back():
    assert selection.label(("naive",)) == "naive"
    assert selection.label(("naive", "gbm", "linear")) == "median(naive,gbm,linear)"
    assert selection.members_of("median(naive,gbm,linear)") == ("naive", "gbm", "linear")
    assert selection.members_of("holt_winters") == ("holt_winters",)


def test_the_advisor_is_the_median_of_its_members():
    origins = pd.date_range("2024-01-01", periods=3, freq="h")
    fc = pd.concat(
        pd.DataFrame(
            {"origin": origins, "series": "s", "horizon": 1, "model": m, "point": v}
            | {"actual": 10.0, "capacity": 50.0}
        )
        for m, v in (("naive", 10.0), ("gbm", 14.0), ("linear", 11.0), ("combo", 99.0))
    )
    picks = pd.DataFrame({"series": ["s"], "horizon": [1], "pick": ["median(naive,gbm,linear)"]})
    rows = selection.combined(fc, picks)
    assert rows["point"].tolist() == [11.0] * 3 and rows["actual"].tolist() == [10.0] * 3
    two = picks.assign(pick="median(naive,gbm)")
    assert selection.combined(fc, two)["point"].tolist() == [12.0] * 3


def test_conformal_quantiles_use_only_errors_whose_target_is_known():
    n, h = 80, 3
    origins = pd.date_range("2024-01-01", periods=n, freq="h")
    rows = pd.DataFrame(
        {"origin": origins, "series": "s", "horizon": h, "point": 100.0}
        | {"actual": 100.0 + np.arange(n), "capacity": np.inf}  # the error of origin p is p
    )
    out = selection.conformal(rows, (0.1, 0.9), pd.Timedelta(hours=1), selection.Rule())
    known = np.arange(n) - h + 1  # errors known at origin p: those of origins 0 … p − h
    ready = known >= MIN_INTERVAL_ERRORS
    assert np.isnan(out["q0.9"][~ready]).all() and (out["q0.5"][~ready] == 100.0).all()
    for p in np.flatnonzero(ready):
        errors = np.arange(p - h + 1)
        assert out["q0.9"][p] == pytest.approx(100.0 + np.quantile(errors, 0.9))
        assert out["q0.1"][p] == pytest.approx(100.0 + np.quantile(errors, 0.1))


def test_conformal_quantiles_look_back_calibration_days_only():
    n, h = 24 * 10, 1
    origins = pd.date_range("2024-01-01", periods=n, freq="h")
    error = np.where(np.arange(n) < 24 * 5, 50.0, 1.0)  # large errors, then small ones
    rows = pd.DataFrame(
        {"origin": origins, "series": "s", "horizon": h, "point": 10.0}
        | {"actual": 10.0 + error, "capacity": np.inf}
    )
    rule = selection.Rule(calibration_days=2)
    out = selection.conformal(rows, (0.9,), pd.Timedelta(hours=1), rule)
    assert out["q0.9"].iloc[24 * 5] == pytest.approx(60.0)  # the last two days: large errors
    assert out["q0.9"].iloc[24 * 8] == pytest.approx(11.0)  # two days on: only small ones


def test_the_advisors_forecasts_use_nothing_after_the_origin():
    p = demand_panel(days=24)
    kw = {
        "test_from": "2024-01-21",
        "test_to": "2024-01-24",
        "candidates": ("naive", "same_hour_mean_7d", "linear"),
    }
    _m, fc1, picks1 = rolling.run(p, (1, 24), (0.1, 0.5, 0.9), **kw)
    cut = pd.Timestamp("2024-01-22 12:00")
    t = int(p.index.get_indexer([cut])[0])
    vals = p.values.copy()
    vals.iloc[t + 1 :] = vals.iloc[t + 1 :].to_numpy()[::-1] * 0.3 + 5  # alter everything after t
    vals.iloc[t + 3, 0] = np.nan
    _m, fc2, picks2 = rolling.run(Panel(vals, p.capacity, p.name), (1, 24), (0.1, 0.5, 0.9), **kw)
    pd.testing.assert_frame_equal(picks1, picks2)
    cols = ["origin", "series", "horizon", "point", "q0.1", "q0.5", "q0.9"]

    def advisor_until_cut(fc):
        a = fc[(fc["model"] == "advisor") & (fc["origin"] <= cut)][cols]
        return a.sort_values(cols[:3]).reset_index(drop=True)

    a1, a2 = advisor_until_cut(fc1), advisor_until_cut(fc2)
    assert len(a1) > 0 and a1[["q0.1", "q0.9"]].notna().all().all()
    pd.testing.assert_frame_equal(a1, a2)
    # and the check can fail: the forecasts after the cut do change
    after = fc1[(fc1["model"] == "advisor") & (fc1["origin"] > cut)]["q0.9"].to_numpy()
    changed = fc2[(fc2["model"] == "advisor") & (fc2["origin"] > cut)]["q0.9"].to_numpy()
    assert not np.allclose(after, changed, equal_nan=True)


def test_the_rule_refuses_settings_that_mean_nothing():
    for bad in ({"windows": 0}, {"margin": 1.0}, {"combine": "mean"}, {"calibration_days": 0}):
        with pytest.raises(ValueError):
            selection.Rule(**bad)
