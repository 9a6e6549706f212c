"""No look-ahead in the idle-window backtest on short histories (the shapes the service gives it,
and the pooled quantile model at the least history it runs on): the releases at origins ≤ t,
and the rule or λ calibrated at the first held-back origin, do not change when every value
after t is altered, nor when a series without capacity up to t gains some after it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from advisor.forecast import idle as I
from advisor.forecast.panel import Panel
from tests.factories import demand_panel

TEST_H = 72  # held-back origins: the last three days


def _altered(p: Panel, t: int, columns=None) -> Panel:
    """Every value after row t changed (one series' use up to its capacity: nothing idle), the
    row after it masked for one series and a later row for another."""
    v = p.values.copy()
    v.iloc[t + 1 :] = np.round(v.iloc[t + 1 :].to_numpy() * 0.3 + 3)
    v.iloc[t + 1 :, 1] = p.capacity.iloc[t + 1 :, 1]
    v.iloc[t + 1, 0] = np.nan
    v.iloc[t + 4, 2] = np.nan
    return Panel(v, p.capacity, p.name)


def _backtest(p: Panel, method: str, windows=(1, 4)):
    """(releases per window, the advisor's params per series and window)."""
    releases: dict[int, pd.DataFrame] = {}
    table = I.backtest(
        p, windows, 0.05, test_from=p.index[-TEST_H], releases=releases, method=method
    )
    mine = table[table["model"] == "advisor"]
    params = dict(
        zip(zip(mine["series"], mine["window_h"], strict=True), mine["params"], strict=True)
    )
    return releases, params


def _assert_equal_up_to(before, after, until, columns=None) -> None:
    assert before.keys() == after.keys() and before
    for w in before:
        a, b = before[w], after[w]
        if columns is not None:
            a, b = a[columns], b[columns]
        assert (a.index <= until).any()
        pd.testing.assert_frame_equal(a[a.index <= until], b[b.index <= until], obj=f"W={w}")


@pytest.mark.parametrize(
    ("days", "method", "kind"),
    [
        (5, "auto", "past_min*factor=0.500"),  # no calibration day yet: half the past minimum
        (8, "rules", "+offset"),  # the per-series rules, calibrated
        (20, "quantile", "quantile_lagrange"),  # the pooled quantile model, at its least history
    ],
)
def test_idle_backtest_releases_ignore_data_after_the_origin(days, method, kind):
    p = demand_panel(days=days, series=3)
    n = len(p.index)
    before, params = _backtest(p, method)
    assert any(kind in v for v in params.values()), params
    for t in (n - TEST_H, n - TEST_H + 5)[: 1 if method == "quantile" else 2]:
        after, params_after = _backtest(_altered(p, t), method)
        _assert_equal_up_to(before, after, p.index[t])
        assert params_after == params  # decided at the first held-back origin
        # and the check itself can fail: a later origin's release does change
        assert any(not before[w].iloc[-30:].equals(after[w].iloc[-30:]) for w in before)


def _with_spares(p: Panel, gain_after: int | None, n: int = 3) -> Panel:
    """`p` and `n` series with no usable GPU (capacity 0, nothing used); with `gain_after`, they
    gain 32 GPUs after that row."""
    values, capacity = p.values.copy(), p.capacity.copy()
    for k in range(n):
        values[f"spare{k}"] = 0.0
        capacity[f"spare{k}"] = 0.0
        if gain_after is not None:
            capacity.iloc[gain_after + 1 :, capacity.columns.get_loc(f"spare{k}")] = 32.0
    return Panel(values, capacity, p.name)


@pytest.mark.parametrize(("days", "seed"), [(8, 1), (10, 0)])
def test_a_series_gaining_capacity_after_the_origin_changes_no_other_release(days, seed):
    """A series without capacity so far is left out of the backtest or not by whether it ever
    has capacity (`with_capacity`, over the whole history); the margin's pooled violation share
    must not count its hours without capacity, so that this changes nothing at origins ≤ t."""
    p = demand_panel(days=days, series=3, seed=seed)
    t = len(p.index) - TEST_H + 10
    before, _ = _backtest(_with_spares(p, None), "rules", (1, 4, 8))
    assert set(before[1].columns) == set(p.series)  # never any capacity: left out
    after, _ = _backtest(_with_spares(p, t), "rules", (1, 4, 8))
    assert set(after[1].columns) > set(p.series)
    _assert_equal_up_to(before, after, p.index[t], p.series)


def test_hours_without_capacity_do_not_count_in_the_pooled_margin():
    """`choose_margin` on some series equals it on those and series whose hours are not
    counted (no capacity), which counted would dilute the pooled violation share (they release
    nothing and never exceed)."""
    p = demand_panel(days=8, series=3, seed=1)
    idle, cap, times = I.hourly_idle(p)
    w, val, k = 1, np.arange(48, 150), 6
    truth = I.window_min(idle, w)[val]
    scale = I.feat.scale_of(idle, cap)[val]
    bases = I.candidate_bases(idle, cap, times, val, w, None)
    alone = I.choose_margin(bases, scale, truth, 0.05)
    nothing = np.zeros((len(val), k))
    widened = {key: np.concatenate([b, nothing], axis=1) for key, b in bases.items()}
    args = (widened, np.concatenate([scale, nothing + 1], 1), np.concatenate([truth, nothing], 1))
    assert I.choose_margin(*args, 0.05) > alone  # counted, they dilute: the check can fail
    counted = np.concatenate([np.ones(truth.shape, bool), nothing.astype(bool)], axis=1)
    assert I.choose_margin(*args, 0.05, counted=counted) == alone
