"""Quantile calibration on errors known at each origin, and the training-only tie rule."""

import numpy as np
import pandas as pd
import pytest

from advisor.forecast import rolling
from advisor.forecast.io import Panel
from tests.advisor.forecast_synth import synthetic_panel


def test_rolling_shift_uses_only_errors_whose_target_is_known():
    pos = np.arange(10)
    score = np.arange(10, dtype=float) * 10  # the score of origin p is 10·p
    out = rolling.rolling_shift(pos, score, h=3, q=1.0, window=100, least=1)
    # at origin p the scores of origins ≤ p − 3 are known: the max is 10·(p − 3)
    assert np.isnan(out[:3]).all()
    assert out[3:] == pytest.approx(10.0 * (pos[3:] - 3))
    # a window of 2 steps keeps the scores that became known at p − 1 and p
    low = rolling.rolling_shift(pos, score, h=3, q=0.0, window=2, least=1)
    assert low[5:] == pytest.approx(10.0 * (pos[5:] - 4))


def test_adaptive_calibration_widens_after_misses():
    pos = np.arange(200)
    score = np.where(pos < 100, 0.0, 1.0) + np.linspace(0, 0.01, 200)  # a step up at 100
    plain = rolling.rolling_shift(pos, score, h=1, q=0.9, window=50, least=10)
    adaptive = rolling.rolling_shift(pos, score, h=1, q=0.9, window=50, least=10, gamma=0.05)
    assert adaptive[110] >= plain[110]
    assert np.isfinite(adaptive[20:]).all()


@pytest.mark.parametrize("calibrate", ["conformal", "adaptive"])
def test_calibrated_quantiles_use_nothing_after_the_origin(calibrate, monkeypatch):
    p = synthetic_panel(days=24)
    kw = {
        "test_from": "2024-01-21",
        "test_to": "2024-01-24",
        "candidates": ("naive", "same_hour_mean_7d", "linear"),
        "calibrate": calibrate,
    }
    rates = []
    orig = rolling.calibrate_rows

    def spy(*args):
        rates.append(args[4])
        return orig(*args)

    monkeypatch.setattr(rolling, "calibrate_rows", spy)
    _m, fc1, picks = rolling.run(p, (1, 24), (0.1, 0.5, 0.9), **kw)
    assert rates == [rolling.CALIBRATIONS[calibrate]]  # the test part gets the chosen rate
    assert picks["cal_q0.9"].str.contains("|", regex=False).all()
    cut = pd.Timestamp("2024-01-22 12:00")
    t = int(p.index.get_indexer([cut])[0])
    vals = p.values.copy()
    vals.iloc[t + 1 :] = vals.iloc[t + 1 :].to_numpy()[::-1] * 0.3 + 5  # alter everything after t
    vals.iloc[t + 3, 0] = np.nan
    _m, fc2, _p = rolling.run(Panel(vals, p.capacity, p.name), (1, 24), (0.1, 0.5, 0.9), **kw)
    cols = ["origin", "series", "horizon", "point", "q0.1", "q0.5", "q0.9"]

    def advisor_until_cut(fc):
        a = fc[(fc["model"] == "advisor") & (fc["origin"] <= cut)][cols]
        return a.sort_values(cols[:3]).reset_index(drop=True)

    a1, a2 = advisor_until_cut(fc1), advisor_until_cut(fc2)
    assert len(a1) > 0
    pd.testing.assert_frame_equal(a1, a2)
    # and the calibration did change the advisor's P90 somewhere (it is not a no-op)
    other = "conformal" if calibrate == "adaptive" else "none"
    _m, fc0, _p = rolling.run(p, (1, 24), (0.1, 0.5, 0.9), **{**kw, "calibrate": other})
    a0 = advisor_until_cut(fc0)
    assert not np.allclose(a0["q0.9"], a1["q0.9"])


def _daily(values: dict[str, list[float]]) -> pd.DataFrame:
    days = len(next(iter(values.values())))
    idx = pd.date_range("2024-01-01", periods=days * 24, freq="h")
    return pd.DataFrame({k: np.repeat(v, 24) for k, v in values.items()}, index=idx)


def test_ties_within_noise_go_to_the_steadier_candidate():
    # "a" is best on the mean by a hair but swings day to day; "b" is steady
    loss = _daily({"naive": [9, 9, 9, 9, 9, 9], "a": [1, 9, 1, 9, 1, 9], "b": [5, 5, 5, 5, 5, 5.2]})
    assert rolling._steady_pick(loss) == "b"
    # a clear winner stays the pick
    loss = _daily({"naive": [9, 9, 9, 9, 9, 9], "a": [1, 2, 1, 2, 1, 2], "b": [5, 5, 5, 5, 5, 5]})
    assert rolling._steady_pick(loss) == "a"
    # naive is kept unless beaten by ≥ 1 %
    loss = _daily({"naive": [5, 5, 5, 5, 5, 5], "b": [4.99, 4.99, 4.99, 4.99, 4.99, 4.99]})
    assert rolling._steady_pick(loss) == "naive"
