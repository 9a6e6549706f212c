"""Idle-window release with the pooled quantile model: minute-level features, the λ rule, and
no look-ahead (altering data after an origin's hour must not change the release at it)."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from advisor.forecast import idle, idle_quantile
from advisor.forecast.panel import Panel


def _minute_panel(days: int = 24, seed: int = 3, test=("2024-01-19", "2024-01-22")) -> Panel:
    """Two pools per minute: jobs of 1–8 GPUs start and end at random, more by day."""
    rng = np.random.default_rng(seed)
    idx = pd.date_range("2024-01-01", periods=days * 24 * 60, freq="min")
    hour = np.asarray(idx.hour)
    vals, caps = {}, {}
    for j, cap in enumerate((16.0, 64.0)):
        used = np.zeros(len(idx))
        level = cap / 2
        for i in range(len(idx)):
            busy = 9 <= hour[i] <= 18
            if rng.random() < (0.004 if busy else 0.001):
                level = min(cap, level + rng.choice([1, 2, 4, 8]))
            if rng.random() < 0.002:
                level = max(0.0, level - rng.choice([1, 2, 4, 8]))
            used[i] = level
        vals[f"pool{j}"], caps[f"pool{j}"] = used, np.full(len(idx), cap)
    return Panel(
        pd.DataFrame(vals, index=idx),
        pd.DataFrame(caps, index=idx),
        "t",
        pd.Timestamp(test[0]),
        pd.Timestamp(test[1]),
    )


@pytest.fixture(scope="module")
def minute_panel() -> Panel:
    return _minute_panel()


LIVE_AS_OF = pd.Timestamp("2024-01-24 19:00")  # 4 h before the panel's end: outcomes known


@pytest.fixture(scope="module")
def live_history(minute_panel) -> Panel:
    """The minute panel up to the end of hour `LIVE_AS_OF`: what a live call at that hour sees
    (the live tests share it, and so the models fitted on it)."""
    upto = minute_panel.values.index < LIVE_AS_OF + pd.Timedelta(hours=1)
    return Panel(minute_panel.values.loc[upto], minute_panel.capacity.loc[upto])


def _altered_after(panel: Panel, cut: pd.Timestamp) -> Panel:
    later = panel.values.copy()
    after = later.index > cut
    later.loc[after] = panel.capacity.loc[after] - later.loc[after]  # a different future
    return Panel(later, panel.capacity, panel.name, panel.test_from, panel.test_to)


def test_minute_state_reads_the_hour_and_nothing_after_it():
    idx = pd.date_range("2024-01-01", periods=180, freq="min")
    used = np.full(180, 10.0)
    used[30:] = 12.0  # idle 6 → 4 at minute 30 of hour 0
    used[100:] = 8.0  # idle 8 from minute 40 of hour 1
    used[170] = np.nan  # a masked reading in hour 2
    p = Panel(pd.DataFrame({"a": used}, index=idx), pd.DataFrame({"a": 16.0}, index=idx))
    times = pd.date_range("2024-01-01", periods=3, freq="h")
    last, high, since = idle_quantile.minute_state(p, times)
    np.testing.assert_array_equal(last[:, 0], [4, 8, 8])
    np.testing.assert_array_equal(high[:, 0], [6, 8, 8])
    # unchanged for 29 min at 00:59 (since 00:30), 19 min at 01:59; 8 min at 02:59 (the count
    # restarts at the first reading after the masked one, 02:51)
    np.testing.assert_array_equal(since[:, 0], [29, 19, 8])
    q = used.copy()
    q[120:] = 0.0  # everything after hour 1 changes
    alt = Panel(pd.DataFrame({"a": q}, index=idx), pd.DataFrame({"a": 16.0}, index=idx))
    for a, b in zip(
        idle_quantile.minute_state(p, times), idle_quantile.minute_state(alt, times), strict=True
    ):
        np.testing.assert_array_equal(a[:2], b[:2])


def test_idle_features_use_nothing_after_the_origin_hour(minute_panel):
    cut = pd.Timestamp("2024-01-10 13:59")  # the last minute of the origin hour 13:00
    alt = _altered_after(minute_panel, cut)
    out = []
    for p in (minute_panel, alt):
        i, c, t = idle.hourly_idle(p)
        X, cur, s = idle_quantile.idle_features(p, i, c, t, 4)
        out.append((X, cur, s, t))
    t = out[0][3]
    rows = t <= pd.Timestamp("2024-01-10 13:00")
    for a, b in zip(out[0][:3], out[1][:3], strict=True):
        np.testing.assert_array_equal(a[rows], b[rows])
    assert not np.array_equal(out[0][0][~rows], out[1][0][~rows])


@pytest.mark.parametrize(
    ("recalibrate_every", "cut"),
    [
        # the model is refit at the test start (01-19 00:00): everything from 01:00 on differs
        (None, "2024-01-19 00:59"),
        # λ is re-picked at 01-20 00:00 (the second daily block): everything from 01:00 on differs
        (24, "2024-01-20 00:59"),
    ],
)
def test_quantile_release_uses_nothing_after_the_origin(minute_panel, recalibrate_every, cut):
    """The cut is the last minute of a refit's (or λ re-pick's) origin hour, so an outcome of
    even one hour after that origin leaking into the fit (or the pick) changes the release
    there."""
    cut = pd.Timestamp(cut)
    kw = {"windows": (1, 4), "method": "quantile", "recalibrate_every": recalibrate_every}
    got = []
    for p in (minute_panel, _altered_after(minute_panel, cut)):
        out: dict = {}
        d = idle.backtest(p, releases=out, **kw)
        adv = d[d.model == "advisor"]
        assert adv.params.str.startswith("quantile_lagrange").all()
        if recalibrate_every:
            assert adv.params.str.contains("recalibrated=3x").all()
        got.append(out)
    changed = False
    for w in (1, 4):
        assert len(got[0][w]) == 3 * 24
        keep = got[0][w].index <= cut.floor("h")
        assert keep.sum() == (1 if recalibrate_every is None else 25)
        pd.testing.assert_frame_equal(got[0][w][keep], got[1][w][keep])
        changed |= not got[0][w][~keep].equals(got[1][w][~keep])
    assert changed  # the check itself can fail: the altered hours do change later releases


def test_auto_choice_between_model_and_rules_uses_nothing_after_the_origin(minute_panel):
    cut = pd.Timestamp("2024-01-19 02:59")
    got = []
    for p in (minute_panel, _altered_after(minute_panel, cut)):
        out: dict = {}
        idle.backtest(p, windows=(1,), releases=out)
        got.append(out[1])
    keep = got[0].index <= pd.Timestamp("2024-01-19 02:00")
    pd.testing.assert_frame_equal(got[0][keep], got[1][keep])


def test_choice_over_several_pseudo_test_weeks_uses_nothing_after_the_origin(monkeypatch):
    """With three check weeks asked for, the two that leave the model enough calibration hours
    are pooled into one check; the releases up to a cut do not change when everything after
    the cut (all of the test part but its first six hours) is altered."""
    panel = _minute_panel(days=31, test=("2024-01-29", "2024-01-30"))
    monkeypatch.setattr(idle, "CHECK_WEEKS", 3)
    checked = []
    real = idle._check

    def spy(rel, truth, risk):
        checked.append(len(truth))
        return real(rel, truth, risk)

    monkeypatch.setattr(idle, "_check", spy)
    cut = pd.Timestamp("2024-01-29 05:59")
    got = []
    for p in (panel, _altered_after(panel, cut)):
        out: dict = {}
        idle.backtest(p, windows=(1,), releases=out)
        got.append(out[1])
    assert checked and set(checked) == {2 * 168}  # two weeks of hours, each known at the start
    keep = got[0].index <= pd.Timestamp("2024-01-29 05:00")
    assert keep.sum() == 6
    pd.testing.assert_frame_equal(got[0][keep], got[1][keep])
    assert not got[0][~keep].equals(got[1][~keep])


def test_lagrange_release_spends_risk_where_it_buys_units():
    levels = np.array(idle_quantile.LEVELS)
    # row 0: m is 10 for sure; row 1: 20 % chance that m drops to 2, else 10
    Q = np.stack([np.full((2, 1), 10.0) for _ in levels])
    Q[levels <= 0.2, 1, 0] = 2.0
    norm = np.full((2, 1), 10.0)
    # at λ = 5 the 8 more units of row 1 (worth 0.8 × 8 / 10 = 0.64) do not pay for the 30 %
    # level they need (5 × 0.3 = 1.5), while row 0 gets all 10 units at the lowest level
    rel = idle_quantile.lagrange_release(Q, 5.0, norm)
    assert rel[0, 0] == 10 and rel[1, 0] == 2
    assert idle_quantile.lagrange_release(Q, 1.0, norm)[1, 0] == 10  # at λ = 1 they do (0.64 > 0.3)
    cheap = idle_quantile.lagrange_release(
        Q, 0.01, norm
    )  # risk costs almost nothing: release 10 both
    np.testing.assert_array_equal(cheap[:, 0], [10, 10])
    dear = idle_quantile.lagrange_release(Q, 1e4, norm)  # any risk is too dear: release nothing
    np.testing.assert_array_equal(dear[:, 0], [0, 0])


def test_lambda_keeps_the_pooled_violation_share_within_the_budget():
    rng = np.random.default_rng(0)
    n = 400
    truth = rng.integers(5, 15, (n, 3)).astype(float)
    levels = np.array(idle_quantile.LEVELS)
    Q = np.stack([np.quantile(truth, u) + rng.normal(0, 1, (n, 3)) for u in levels])
    Q = np.sort(Q, axis=0)
    norm = np.full((n, 3), 10.0)
    lam = idle_quantile.lambda_for(Q, norm, truth, 0.05)
    assert np.all(lam == lam[0])  # one λ per data set
    rel = idle_quantile.lagrange_release(Q, lam, norm)
    assert np.mean(rel > truth) <= 0.05
    looser = idle_quantile.lagrange_release(Q, lam[0] / 2, norm)
    assert looser.sum() >= rel.sum()


def test_idle_windows_live_api_with_long_and_short_history(minute_panel, live_history):
    """Live at the last hour of the history is what the backtest decides at that origin on the
    whole panel (whose later hours it may not read), window by window."""
    as_of, hour = LIVE_AS_OF, pd.Timedelta(hours=1)
    live = idle.idle_windows(live_history, windows=(1, 4), risk=0.05)
    assert list(live.columns) == [
        "series",
        "window_h",
        "risk",
        "release",
        "current_idle",
        "rule",
        "as_of",
    ]
    assert len(live) == 4
    assert (live.as_of == as_of).all() and live.rule.str.startswith("quantile_lagrange").all()
    caps = {"pool0": 16, "pool1": 64}
    assert all(0 <= r.release <= caps[r.series] for r in live.itertuples())
    assert (live.release > 0).any()
    # the idle count now: capacity less the hour's highest use
    peak = live_history.values.loc[live_history.values.index >= as_of].max()
    for r in live.itertuples():
        assert r.current_idle == caps[r.series] - peak[r.series]
    replay: dict = {}
    idle.backtest(
        minute_panel, windows=(1, 4), test_from=as_of, test_to=as_of + hour, releases=replay
    )
    for w in (1, 4):
        at = live[live.window_h == w].set_index("series").release
        assert replay[w].index.tolist() == [as_of]
        assert at.to_dict() == replay[w].loc[as_of].to_dict()
    short = Panel(
        minute_panel.values.iloc[: 5 * 24 * 60], minute_panel.capacity.iloc[: 5 * 24 * 60]
    )
    few = idle.idle_windows(short, windows=(1,))
    assert len(few) == 2 and not few.rule.str.startswith("quantile").any()


def test_a_longer_window_never_releases_more_in_the_backtest(minute_panel):
    """min idle over 4 h ≤ min idle over 1 h, so the release at 4 h is capped by the one at 1 h
    at the same origin; windows given in any order, rows come back in that order."""
    out: dict = {}
    d = idle.backtest(minute_panel, windows=(4, 1), releases=out)
    assert list(d.window_h.unique()) == [4, 1]
    r1, r4 = out[1], out[4]
    assert r4.index.isin(r1.index).all()
    assert (r4.to_numpy() <= r1.loc[r4.index].to_numpy()).all()


def _hourly_walk(seed: int, days: int = 6) -> Panel:
    rng = np.random.default_rng(seed)
    idx = pd.date_range("2024-01-01", periods=days * 24, freq="h")
    caps = rng.choice([8.0, 16.0, 64.0], 3)
    vals = {
        f"s{j}": np.clip(np.cumsum(rng.integers(-3, 4, len(idx))) + c / 2, 0, c)
        for j, c in enumerate(caps)
    }
    cap = pd.DataFrame({f"s{j}": np.full(len(idx), c) for j, c in enumerate(caps)}, index=idx)
    return Panel(pd.DataFrame(vals, index=idx), cap)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    windows=st.lists(st.integers(1, 12), min_size=2, max_size=4, unique=True),
)
def test_idle_windows_releases_are_monotone_in_the_window(seed, windows):
    live = idle.idle_windows(_hourly_walk(seed), windows=tuple(windows))
    assert list(live.window_h.unique()) == windows
    by = live.pivot(index="series", columns="window_h", values="release")[sorted(windows)]
    assert (by.diff(axis=1).iloc[:, 1:].fillna(0) <= 0).all().all()


def test_idle_windows_monotone_with_the_quantile_model(live_history):
    live = idle.idle_windows(live_history, windows=(8, 1, 4))
    assert live.rule.str.startswith("quantile").any()
    by = live.pivot(index="series", columns="window_h", values="release")
    assert (by[4] <= by[1]).all() and (by[8] <= by[4]).all()


def test_fitted_models_are_reused_only_for_the_same_parameters_and_rows():
    rng = np.random.default_rng(1)
    X, y = rng.normal(size=(300, 3)), rng.normal(size=300)
    params = {"loss": "quantile", "quantile": 0.1, "max_iter": 5, "random_state": 0}
    first = idle_quantile.fit_gbm(params, X, y)
    assert idle_quantile.fit_gbm(params, X.copy(), y.copy()) is first
    nudged = y.copy()
    nudged[-1] += 1e-9
    assert idle_quantile.fit_gbm(params, X, nudged) is not first
    assert idle_quantile.fit_gbm({**params, "quantile": 0.2}, X, y) is not first
    fresh = idle_quantile.fit_gbm({**params, "max_iter": 6}, X, y)
    np.testing.assert_array_equal(
        fresh.predict(X), idle_quantile.fit_gbm({**params, "max_iter": 6}, X, y).predict(X)
    )


@pytest.mark.parametrize("test_from", ["2024-01-02", "2024-01-03 06:00"])  # 0 and 5 hours
def test_too_little_history_to_calibrate_releases_half_the_past_minimum(test_from):
    """Under a day of calibration hours before the test part (a short held-back series), the
    advisor falls back to the note's safe rule instead of failing."""
    panel = _minute_panel(days=5, test=(test_from, "2024-01-04"))
    rows = idle.backtest(panel, windows=(1, 4))
    adv = rows[rows["model"] == "advisor"].set_index(["series", "window_h"])
    half = rows[rows["model"] == "half_min_past_w"].set_index(["series", "window_h"])
    assert (adv["params"] == "past_min*factor=0.500,margin=1").all()
    np.testing.assert_allclose(adv["capture"], half["capture"])
    np.testing.assert_allclose(adv["violation_rate"], half["violation_rate"])


def _with_empty_pool(panel: Panel) -> Panel:
    """`panel` plus a pool that has no GPUs at all (a VC that exists but holds nothing)."""
    values = panel.values.assign(empty=0.0)
    capacity = panel.capacity.assign(empty=0.0)
    return Panel(values, capacity, panel.name, panel.test_from, panel.test_to)


def test_a_pool_without_capacity_changes_nothing_for_the_others(minute_panel, live_history):
    """Its hours cannot be wrong, so counted in the pooled budget they would let the other pools
    take more risk: it stays out of the model and its λ (backtest and live)."""
    alone = idle.backtest(minute_panel, windows=(1,))
    beside = idle.backtest(_with_empty_pool(minute_panel), windows=(1,))
    assert "empty" not in set(beside["series"])
    pd.testing.assert_frame_equal(alone, beside)
    live_alone = idle.idle_windows(live_history, windows=(1, 4))
    live = idle.idle_windows(_with_empty_pool(live_history), windows=(1, 4))
    assert list(live["series"]) == ["pool0", "pool1", "empty"] * 2
    assert list(live["window_h"]) == [1, 1, 1, 4, 4, 4]
    empty = live[live["series"] == "empty"]
    assert (empty["release"] == 0).all() and (empty["rule"] == "no_capacity").all()
    pd.testing.assert_frame_equal(
        live[live["series"] != "empty"].reset_index(drop=True), live_alone, check_dtype=False
    )


def test_every_release_rule_has_a_level_model_and_an_adjustment():
    """The per-series rules are looked up by name (`idle.RULES`), never told apart by a suffix:
    each names a level model with fit/predict and the adjustment its parameter drives."""
    hourly = np.array([[8.0], [6.0], [7.0], [5.0], [9.0], [9.0]])
    for name, (level, adjust) in idle.RULES.items():
        assert adjust.apply(np.array([4.0]), np.array([8.0]), adjust.grid[-1]) >= 0, name
        if level is idle.IdleModel:
            continue
        model = level(2).fit(hourly, None, None, 3)
        np.testing.assert_array_equal(
            model.predict(hourly, None, None, np.array([2, 5])), model.levels(hourly)[[2, 5]]
        )
    past = idle.PastMin(2).levels(hourly)[:, 0]
    assert past[1:].tolist() == [6.0, 6.0, 5.0, 5.0, 9.0]
    assert idle.apply_rule("past_min*factor", np.array([7.0]), np.array([8.0]), 0.5) == [3.0]
    assert idle.apply_rule("past_min+offset", np.array([7.0]), np.array([8.0]), -0.25) == [5.0]
