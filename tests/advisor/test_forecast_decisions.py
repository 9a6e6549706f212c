"""Idle-window rules, job-end prediction and the power-down replay on small hand-made inputs."""

import dataclasses
import warnings

import numpy as np
import pandas as pd
import pytest

from advisor.forecast import features as feat
from advisor.forecast import idle, jobs, powerdown
from advisor.forecast import metrics as M
from advisor.forecast.panel import Panel
from tests.factories import demand_panel, jumping_panel


def test_baseline_release_rules_are_causal_and_as_defined():
    x = np.array([[10.0], [8.0], [12.0], [6.0], [9.0]])
    past = idle.baseline_release(x, 2, "min_past_w")
    np.testing.assert_array_equal(past[:, 0], [10, 8, 8, 6, 6])
    np.testing.assert_array_equal(
        idle.baseline_release(x, 2, "half_min_past_w")[:, 0], [5, 4, 4, 3, 3]
    )
    z = x.copy()
    z[3:] = 0  # the future must not change decisions at t = 2
    assert idle.baseline_release(z, 2, "min_past_w")[2, 0] == past[2, 0]


def test_idle_backtest_releases_within_budget_on_a_steady_pool():
    steady = demand_panel(  # 40 of 64 GPUs, a slow walk, no daily cycle, per minute
        days=30,
        series=["pool"],
        seed=1,
        freq="min",
        capacity=64,
        level=40 / 64,
        daily_amplitude=0.0,
        walk_sd=0.05,
        name="t",
    )
    p = dataclasses.replace(
        steady, test_from=pd.Timestamp("2024-01-24"), test_to=pd.Timestamp("2024-01-30")
    )
    d = idle.backtest(p, windows=(1,), risk=0.05)
    adv = d[d.model == "advisor"].iloc[0]
    assert adv["violation_rate"] <= 10
    assert adv["capture"] > d[d.model == "half_min_past_w"].iloc[0]["capture"]
    assert "capture_lo" not in d  # the service's hourly backtest pays for no bootstrap
    # asked for (the CLI's replay): the same rows plus day-bootstrap intervals around them
    with_intervals = idle.backtest(p, windows=(1,), risk=0.05, intervals=True)
    pd.testing.assert_frame_equal(with_intervals[d.columns], d)
    for _, row in with_intervals.iterrows():
        assert row["capture_lo"] <= row["capture"] <= row["capture_hi"]
        assert row["violation_lo"] <= row["violation_rate"] <= row["violation_hi"]


def test_job_end_quantiles_condition_on_elapsed_time_and_fall_back_to_all_jobs():
    history = pd.concat(
        [
            pd.DataFrame({"duration_h": np.arange(1, 101, dtype=float), "tenant": "a", "gpus": 8}),
            pd.DataFrame({"duration_h": [500.0, 600.0], "tenant": "b", "gpus": 8}),
        ]
    )
    running = pd.DataFrame(
        {
            "job": ["j1", "j2", "j3"],
            "elapsed_h": [0.0, 90.0, 1.0],
            "tenant": ["a", "a", "b"],
            "gpus": 8,
        }
    )
    out = jobs.predict_job_end(running, history, min_jobs=5).set_index("job")
    # j1: all 100 jobs of group a outlive 0 h; median of 1..100 is 50.5
    assert out.loc["j1", "basis"] == "('a', 8)"
    assert out.loc["j1", "remaining_q0.5"] == pytest.approx(50.5)
    # j2: 10 jobs of group a outlive 90 h (91..100): the remaining median is 95.5 − 90
    assert out.loc["j2", "n"] == 10
    assert out.loc["j2", "remaining_q0.5"] == pytest.approx(5.5)
    assert out.loc["j2", "remaining_q0.1"] <= 5.5 <= out.loc["j2", "remaining_q0.9"]
    # j3: group b has only 2 jobs, fewer than min_jobs: fall back to all 102 jobs
    assert out.loc["j3", "basis"] == "all" and out.loc["j3", "n"] == 101


def test_ces_skeleton_counts_shortfalls_and_savings():
    used = np.array([100] * 10 + [150] + [100] * 9)
    total = np.full(20, 200)
    flat = used.astype(float)
    r = powerdown.ces_replay(used, total, flat, flat, powerdown.CES(buffer=20, keep=2))
    assert r["shortfall_steps"] == 1  # the jump of 50 > buffer 20
    assert r["short_node_steps"] == 30
    assert 0 < r["pct_node_hours_off"] < 50
    big = powerdown.ces_replay(used, total, flat, flat, powerdown.CES(buffer=60, keep=2))
    assert big["shortfall_steps"] == 0 and big["pct_node_hours_off"] < r["pct_node_hours_off"]


def test_path_targets():
    u = np.array([1.0, 2, 3, 4])
    np.testing.assert_allclose(powerdown.path_mean(u, 2)[:3], [1.5, 2.5, 3.5])
    np.testing.assert_allclose(powerdown.future_max(u, 2)[:2], [3, 4])


def test_choose_margin_spends_the_whole_budget_only_when_training_weeks_agree():
    n = 200
    truth = np.full((n, 1), 10.0)
    base = {"past_min+offset": np.full((n, 1), 10.0)}
    scale = np.full((n, 1), 10.0)
    assert idle.choose_margin(base, scale, truth, 0.05) == 1.0
    drift = truth.copy()
    drift[n // 2 :: 5] = 2.0  # the second half drops every 5th hour: 20 % violations at any margin
    assert idle.choose_margin(base, scale, drift, 0.05) == min(idle.MARGINS)


def test_power_down_forecasts_use_nothing_after_the_step():
    rng = np.random.default_rng(2)
    n = 6 * 24 * 12
    times = pd.date_range("2017-11-01", periods=n, freq="10min")
    used = 200 + np.cumsum(rng.normal(0, 1, n))
    cap = np.full(n, 420.0)
    t = n - 300
    origins = np.arange(t - 50, t + 1)
    altered = used.copy()
    altered[t + 1 :] += 80
    out = []
    for data in (used, altered):
        model = powerdown.PathModel("mean", 30).fit(data, cap, times, t - 1)
        out.append(model.predict(data, cap, times, origins))
    np.testing.assert_allclose(out[0], out[1])


@pytest.mark.parametrize(
    "cut",
    [
        "2024-01-19 00:00",  # the model's refit at the test start
        "2024-01-21 00:00",  # the third day's re-pick of λ
    ],
)
def test_daily_recalibration_of_idle_release_uses_nothing_after_the_origin(cut):
    """Every hour after the cut, a refit or λ re-pick point, is altered to a full pool (no idle
    GPU at all): an outcome after the origin leaking into that fit or pick (each hour of it a
    violation of any release) changes the release there."""
    from advisor.forecast.panel import Panel

    rng = np.random.default_rng(2)
    idx = pd.date_range("2024-01-01", periods=24 * 24, freq="h")
    used = np.clip(30 + 8 * np.sin(np.arange(len(idx)) * 2 * np.pi / 24), 0, 64)
    used = np.round(used + rng.normal(0, 2, len(idx)))
    kw = {"windows": (1, 4), "test_from": "2024-01-19", "test_to": "2024-01-23"}
    kw["recalibrate_every"] = 24

    def releases(values):
        p = Panel(
            pd.DataFrame({"pool": values}, index=idx), pd.DataFrame({"pool": 64.0}, index=idx)
        )
        out: dict = {}
        d = idle.backtest(p, releases=out, **kw)
        adv = d[d.model == "advisor"]
        assert adv.params.str.contains("quantile_lagrange.*recalibrated=4x").all()
        return out

    cut = pd.Timestamp(cut)
    before = releases(used)
    later = used.copy()
    later[idx > cut] = 64.0  # a different future after the cut: every GPU in use
    after = releases(later)
    for w in (1, 4):
        assert len(before[w]) == 4 * 24
        pd.testing.assert_frame_equal(
            before[w][before[w].index <= cut], after[w][after[w].index <= cut]
        )
        assert not before[w][before[w].index > cut + pd.Timedelta(days=1)].equals(
            after[w][after[w].index > cut + pd.Timedelta(days=1)]
        )


def _node_minutes(days: int, start: str = "2019-03-01") -> Panel:
    idx = pd.date_range(start, periods=days * 1440, freq="min")
    rng = np.random.default_rng(4)
    used = np.clip(300 + np.cumsum(rng.normal(0, 0.3, len(idx))), 0, 420).round()
    vals = pd.DataFrame({"x/nodes": used}, index=idx)
    cap = pd.DataFrame({"x/nodes": 420.0}, index=idx)
    return Panel(vals, cap, "x", pd.Timestamp("2017-12-01"), pd.Timestamp("2017-12-15"))


def test_power_down_replay_on_other_dates_tests_the_last_week_or_says_it_is_too_short():
    """A Philly-format file of other dates: the replay runs on the demand backtest's window
    (the last 7 days), and with too little history before it returns nothing, not a crash."""
    rows = powerdown.replay(_node_minutes(29))
    assert set(rows["model"]) == {"naive", "seasonal_naive_24", "advisor", "oracle_lookahead"}
    assert np.allclose(rows["node_hours_off"], rows["mean_nodes_off"] * 7 * 24)  # 7 days long
    assert powerdown.replay(_node_minutes(20)).empty


def test_the_buffer_sweep_traces_savings_against_shortfalls_and_leaves_the_policies_alone():
    """Each forecast's sweep point at the published buffer is its ces_skeleton row; a larger
    buffer never powers off more, and the tuned policy is the one chosen on training days."""
    rows = powerdown.replay(_node_minutes(29))
    sweep = rows[rows["policy"] == "sweep"]
    assert len(sweep) == 4 * len(powerdown.SWEEP_BUFFERS)
    published = f"buffer={powerdown.CES().buffer},keep={powerdown.CES().keep}"
    for model, g in sweep.groupby("model"):
        skeleton = rows[(rows["model"] == model) & (rows["policy"] == "ces_skeleton")]
        at_published = g[g["params"] == published]
        pd.testing.assert_frame_equal(
            at_published.drop(columns=["policy", "params"]).reset_index(drop=True),
            skeleton.drop(columns=["policy", "params"]).reset_index(drop=True),
        )
        off = g.sort_values("params", key=lambda p: p.str.extract(r"buffer=(\d+)")[0].astype(int))
        assert (np.diff(off["pct_node_hours_off"].to_numpy()) <= 1e-9).all()
    assert (rows["policy"] == "ces_tuned").sum() == 1


def test_job_end_quantiles_are_numpys_quantiles_of_the_jobs_that_outlived_it():
    """The sorted-tail reading gives what np.quantile gives on the finished jobs longer than the
    elapsed time, group by group, including ties, exact indices and jobs older than all."""
    rng = np.random.default_rng(11)
    history = pd.DataFrame(
        {
            "duration_h": np.round(rng.pareto(1.5, 600) * 3, 1),  # ties from the rounding
            "tenant": rng.choice(["a", "b", "c"], 600),
            "gpus": rng.choice([1.0, 8.0], 600),
        }
    )
    running = pd.DataFrame(
        {
            "job": [f"j{i}" for i in range(300)],
            "elapsed_h": np.concatenate([rng.uniform(0, 12, 290), [0.0, 1e6], np.full(8, 3.0)]),
            "tenant": rng.choice(["a", "b", "d"], 300),
            "gpus": rng.choice([1.0, 8.0], 300),
        }
    )
    qs = (0.1, 0.5, 0.9)
    out = jobs.predict_job_end(running, history, quantiles=qs, min_jobs=20)
    groups = {k: g["duration_h"].to_numpy() for k, g in history.groupby(["tenant", "gpus"])}
    for job, row in zip(running.itertuples(), out.itertuples(), strict=True):
        e = job.elapsed_h
        own = groups.get((job.tenant, job.gpus))
        if own is not None and (own > e).sum() >= 20:
            basis, durations = str((job.tenant, job.gpus)), own
        else:
            basis, durations = "all", history["duration_h"].to_numpy()
        longer = durations[durations > e]
        assert (row.basis, row.n) == (basis, len(longer))
        for q, got in zip(qs, row[5:], strict=True):
            want = np.quantile(longer, q) - e if len(longer) else np.nan
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, equal_nan=True)


def _walk_calibrate(bases, scale, truth, risk):
    """`idle.calibrate_rules` as first written: every parameter of every grid, series by series."""
    ok = np.isfinite(truth)
    best_rule = ["past_min*factor"] * truth.shape[1]
    best_param = np.zeros(truth.shape[1])
    best_capture = np.full(truth.shape[1], -1.0)
    for rule, base in bases.items():
        grid = idle.adjustment(rule).grid
        for param in grid:
            r = idle.apply_rule(rule, base, scale, param)
            viol = np.where(ok, r > truth, False).sum(axis=0) / np.maximum(ok.sum(axis=0), 1)
            cap_ = np.where(ok, np.minimum(r, truth), 0).sum(axis=0) / np.maximum(
                np.where(ok, truth, 0).sum(axis=0), 1e-9
            )
            better = (viol <= risk) & (cap_ > best_capture + 1e-9)
            for j in np.flatnonzero(better):
                best_rule[j], best_param[j], best_capture[j] = rule, param, cap_[j]
    return best_rule, best_param


def _random_rule_inputs(rng, n, whole):
    """Calibration inputs of 8-GPU-ish series: bases near the outcome, masked hours, a series
    with no outcome, an hour with an unknown base, zero scales and a base of −1."""
    cap = np.array([8.0, 8.0, 4.0, 64.0, 1.0, 8.0])
    idle_ = np.floor(rng.uniform(0, 1, (n, len(cap))) * (cap + 1))
    if not whole:
        idle_ = idle_ * rng.uniform(0.5, 1.0, idle_.shape)
    truth = np.where(rng.uniform(size=idle_.shape) < 0.15, np.nan, idle_)
    truth[:, 5] = np.nan
    scale = np.broadcast_to(cap, idle_.shape).copy()
    scale[rng.uniform(size=scale.shape) < 0.05] = 0.0
    past = np.clip(idle_ + rng.integers(-3, 4, idle_.shape), 0, None)
    past[3, 1] = np.nan
    yesterday = np.clip(idle_ + rng.integers(-2, 3, idle_.shape), 0, None)
    model = idle_ + rng.normal(0, 1.5, idle_.shape)
    bases = {
        "past_min+offset": past,
        "past_min_yesterday+offset": yesterday,
        "past_min*factor": past,
        "gbm_quantile+offset": model,
    }
    return bases, scale, truth


@pytest.mark.parametrize("whole", [True, False])
def test_calibrating_all_series_at_once_picks_what_walking_every_parameter_per_series_does(whole):
    """The vectorised calibration (its exact short-cut on whole GPUs, every parameter
    otherwise) against the walk over every parameter: series by series on whole units (where
    every sum is exact), on the same arrays otherwise (where the order of a sum may matter)."""
    rng = np.random.default_rng(7 if whole else 8)
    for trial in range(6):
        bases, scale, truth = _random_rule_inputs(rng, 60 + 40 * trial, whole)
        if trial == 5:
            bases["past_min*factor"] = bases["past_min*factor"] - 1  # no longer rising: a walk
        for risk in (0.0, 0.05, 0.2):
            rule, param = idle.calibrate_rules(bases, scale, truth, risk)
            if whole:
                for j in range(truth.shape[1]):
                    one = {k: v[:, j : j + 1] for k, v in bases.items()}
                    want = _walk_calibrate(one, scale[:, j : j + 1], truth[:, j : j + 1], risk)
                    assert (rule[j], param[j]) == (want[0][0], want[1][0]), (trial, risk, j)
            else:
                want_rule, want_param = _walk_calibrate(bases, scale, truth, risk)
                assert rule == want_rule
                np.testing.assert_array_equal(param, want_param)
            margins = {}
            again = idle.calibrate_rules(bases, scale, truth, risk, margins)
            assert again[0] == rule and np.array_equal(again[1], param)


@pytest.mark.parametrize("whole", [True, False])
def test_release_scores_of_all_series_at_once_are_the_per_series_figures(whole):
    rng = np.random.default_rng(9)
    truth = np.floor(rng.uniform(0, 9, (50, 5)))
    rel = np.floor(rng.uniform(0, 9, (50, 5)))
    if not whole:
        truth = truth * 0.37
    truth[rng.uniform(size=truth.shape) < 0.2] = np.nan
    rel[rng.uniform(size=rel.shape) < 0.1] = np.inf  # no capacity: left out as unscored
    truth[:, 3] = np.nan  # nothing scored
    truth[:, 4] = np.where(np.isnan(truth[:, 4]), np.nan, 0.0)  # nothing idle
    with warnings.catch_warnings():  # column 3 (an all-masked series): no warning printed
        warnings.simplefilter("error")
        scores, mean_idle = idle.release_scores_per_series(rel, truth)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # column 3: numpy's mean of nothing
        want_mean = [float(np.nanmean(truth[:, j])) for j in range(5)]
    for j in range(5):
        assert scores[j].keys() == M.release_scores(rel[:, j], truth[:, j]).keys()
        for k, v in M.release_scores(rel[:, j], truth[:, j]).items():
            assert (np.isnan(v) and np.isnan(scores[j][k])) or v == scores[j][k], (j, k)
        assert (np.isnan(want_mean[j]) and np.isnan(mean_idle[j])) or want_mean[j] == mean_idle[j]


def test_rolling_minima_are_pandas_rolling_minima_in_their_layout():
    rng = np.random.default_rng(10)
    for w in (1, 2, 3, 4, 8, 24, 70):
        x = np.floor(rng.uniform(0, 9, (60, 4))) + (w % 2) * rng.uniform(0, 1, (60, 4))
        x[rng.uniform(size=x.shape) < 0.2] = np.nan
        x[5, 2] = np.inf
        past = pd.DataFrame(x).rolling(w, min_periods=1).min().to_numpy()
        got = feat.past_min(x, w)
        np.testing.assert_array_equal(got, past)
        assert got.strides == past.strides
        ahead = pd.DataFrame(x).shift(-1)[::-1].rolling(w, min_periods=w).min()[::-1].to_numpy()
        got = idle.window_min(x, w)
        np.testing.assert_array_equal(got, ahead)
        assert got.strides == ahead.strides


def test_rules_pooled_over_a_set_of_series_learn_nothing_from_the_others():
    """`pooled_over`: the rules' pooled model and margin learn from the named series only, so a
    series outside the set changes no other series' release; without it, it does."""
    pools = jumping_panel(24 * 24, 4, seed=5)  # the last two days held back
    panel = dataclasses.replace(
        pools, test_from=pools.index[-2 * 24], test_to=pools.index[-1] + pd.Timedelta(hours=1)
    )
    changed = panel.values.copy()
    changed["p3"] = 8.0 - changed["p3"]  # p3's whole history turned over

    def releases(values, **kw):
        out: dict = {}
        p = Panel(values, panel.capacity, panel.name, panel.test_from, panel.test_to)
        idle.backtest(p, (1,), method="rules", releases=out, **kw)
        now = idle.idle_windows(p, (1,), method="rules", **kw)
        return out, now[now.series != "p3"].reset_index(drop=True)

    for kw, same in (({"pooled_over": ["p0", "p1", "p2"]}, True), ({}, False)):
        (a, now_a), (b, now_b) = releases(panel.values, **kw), releases(changed, **kw)
        held_back = [a[w].drop(columns="p3").equals(b[w].drop(columns="p3")) for w in a]
        assert (held_back, now_a.equals(now_b)) == ([same], same), kw
    with pytest.raises(ValueError, match="pooled_over needs method 'rules'"):
        idle.backtest(panel, (1,), pooled_over=["p0"])
