"""Idle windows in the service: per pool and window, the GPUs released as free for the whole
next W hours, served in /api/forecast and on /metrics only with their held-back backtest; from
complete hours only; irregular runs and the hourly backfill are aggregated by the service's own
coverage rule; short histories get a reason instead of a number."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from prometheus_client.parser import text_string_to_metric_families

from advisor.forecast import idle as I
from advisor.forecast.live import forecast_pools
from advisor.forecast.live_idle import IDLE_BASELINE, IDLE_MIN_TEST, idle_needs, idle_section
from advisor.forecast.panel import Panel
from advisor.forecast.runs import runs_panel
from advisor.ingest.live import LiveSim
from advisor.pipeline import stages
from advisor.service.loop import AdvisorLoop, Config
from advisor.service.metrics import families
from advisor.settings import Settings

START = pd.Timestamp("2026-01-05", tz="UTC")
HOUR = 3600.0


def pools_history(
    hours: int, every: float = 60.0, backfill_h: int = 0, seed: int = 0, pools: int = 3
) -> pd.DataFrame:
    """`History.pool_demand()`-shaped runs: one an hour for `backfill_h` hours (a sim backfill),
    then every `every` seconds with jitter; per pool a piecewise-constant job process with a
    daily cycle, capped at the pool's capacity. The last run opens the hour after `hours`."""
    rng = np.random.default_rng(seed)
    live = np.arange(backfill_h * HOUR, hours * HOUR, every)
    seconds = np.concatenate(
        [
            np.arange(0, backfill_h * HOUR, HOUR),
            live + rng.uniform(0, 3, len(live)),
            [hours * HOUR + 30],  # a run in the hour still running
        ]
    )
    frames = []
    for j in range(pools):
        cap = (64.0, 128.0, 32.0)[j % 3]
        arrivals = np.sort(rng.uniform(0, seconds[-1], hours * 6))
        phase = np.sin(2 * np.pi * (arrivals / HOUR % 24) / 24)
        arrivals = arrivals[rng.uniform(size=len(arrivals)) < 0.5 + 0.4 * phase]
        size = rng.choice([1, 2, 4, 8], size=len(arrivals)) * cap / 64
        ends = arrivals + rng.exponential(3 * HOUR, len(arrivals))
        when = np.concatenate([arrivals, ends])
        order = np.argsort(when)
        level = np.cumsum(np.concatenate([size, -size])[order])
        at = np.searchsorted(when[order], seconds, side="right") - 1
        allocated = np.minimum(np.where(at >= 0, level[np.maximum(at, 0)], 0.0), cap)
        frames.append(
            pd.DataFrame(
                {
                    "time": START + pd.to_timedelta(seconds, unit="s"),
                    "pool": f"pool{j}",
                    "allocated_gpus": allocated,
                    "held_gpus": allocated,  # whole-GPU jobs: every allocated GPU is held
                    "capacity_gpus": cap,
                    "pending_gpus": 0.0,
                }
            )
        )
    return pd.concat(frames).sort_values("time", kind="stable").reset_index(drop=True)


def windows_of(doc: dict) -> dict[tuple[str, str], dict]:
    return {(p["pool"], w["window"]): w for p in doc["idle"]["pools"] for w in p["windows"]}


@pytest.fixture(scope="module")
def history() -> pd.DataFrame:
    return pools_history(6 * 24, backfill_h=72)


@pytest.fixture(scope="module")
def doc(history) -> dict:
    return forecast_pools(history, [1])


def test_every_pool_and_window_has_a_release_with_its_backtest(doc):
    idle = doc["idle"]
    assert idle["windows"] == ["1h", "4h", "8h"] and idle["risk"] == 0.05
    assert idle["origin"] == doc["origin"] == "2026-01-10T23:00:00Z"  # the last complete hour
    assert idle["valid_from"] == "2026-01-11T00:00:00Z"
    got = windows_of(doc)
    assert set(got) == {(f"pool{j}", w) for j in range(3) for w in ("1h", "4h", "8h")}
    for (_, window), w in got.items():
        assert w["available"], w
        assert (
            w["until"]
            == str(pd.Timestamp("2026-01-11T00:00:00") + pd.Timedelta(window)).replace(" ", "T")
            + "Z"
        )
        bt = w["backtest"]
        assert bt["test_origins"] >= IDLE_MIN_TEST
        assert set(bt["violation_ratio"]) == set(bt["capture_ratio"]) == {"advisor", IDLE_BASELINE}
        for value in (*bt["violation_ratio"].values(), *bt["capture_ratio"].values()):
            assert 0.0 <= value <= 1.0


def test_release_is_within_capacity_and_never_grows_with_the_window(doc):
    for pool in doc["idle"]["pools"]:
        releases = [w["release_gpus"] for w in pool["windows"]]
        assert all(0 <= r <= pool["capacity_gpus"] for r in releases), pool
        assert releases == sorted(releases, reverse=True), pool  # 1h ≥ 4h ≥ 8h
        assert releases[0] <= pool["current_idle_gpus"] + pool["capacity_gpus"]


def test_gauges_carry_each_served_release_and_its_scores(islands, scripted, doc):
    state = AdvisorLoop("snap", scripted(islands), Config()).run_once()
    state = replace(state, results=replace(state.results, forecast=doc))
    page = families(state).text()
    rows = {
        (s.name, s.labels["pool"], s.labels["window"], s.labels.get("model")): s.value
        for family in text_string_to_metric_families(page)
        for s in family.samples
        if s.name.startswith("gpu_advisor_forecast_idle")
    }
    for (pool, window), w in windows_of(doc).items():
        assert rows[("gpu_advisor_forecast_idle_gpus", pool, window, None)] == w["release_gpus"]
        for model in ("advisor", IDLE_BASELINE):
            key = (pool, window, model)
            violation = rows[("gpu_advisor_forecast_idle_backtest_violation_ratio", *key)]
            capture = rows[("gpu_advisor_forecast_idle_backtest_capture_ratio", *key)]
            assert violation == pytest.approx(w["backtest"]["violation_ratio"][model])
            assert capture == pytest.approx(w["backtest"]["capture_ratio"][model])
    assert len(rows) == 9 * 5


def test_nothing_from_the_running_hour_or_later_is_used(history, doc):
    running = history["time"] >= history["time"].max().floor("h")
    assert running.sum() == 3  # one run per pool in the hour still running
    altered = history.copy()
    altered.loc[running, ["allocated_gpus", "held_gpus"]] = 0.0  # all free in the running hour
    assert forecast_pools(altered, [1])["idle"] == doc["idle"]
    more = pd.concat(
        [history, history[running].assign(time=history["time"].max() + pd.Timedelta(minutes=20))]
    )
    assert forecast_pools(more, [1])["idle"] == doc["idle"]
    # ...but the last complete hour does count
    last_complete = history["time"] >= history["time"].max().floor("h") - pd.Timedelta(hours=1)
    busy = history.copy()
    busy.loc[
        last_complete & ~running & (busy["pool"] == "pool0"), ["allocated_gpus", "held_gpus"]
    ] = 64.0
    moved = windows_of(forecast_pools(busy, [1]))
    assert moved[("pool0", "1h")]["release_gpus"] == 0.0  # nothing was idle at its peak
    assert windows_of(doc)[("pool0", "1h")]["release_gpus"] > 0.0


def test_backfilled_hours_count_as_observed_and_the_runs_panel_is_what_idle_sees(history):
    runs = runs_panel(history)
    idle, _, times = I.hourly_idle(runs)
    assert len(times) == 6 * 24 and np.isfinite(idle).all()  # 72 one-run hours kept
    # Panel.resample's own one-spacing rule, on the same runs, would mask the backfill
    plain = Panel(runs.values, runs.capacity)
    masked = np.isnan(I.hourly_idle(plain)[0])
    assert masked[:72].all() and not masked[72:].any()
    # and the hour's peak use is the max over its runs, not their mean
    hour = history["time"].dt.floor("h").dt.tz_localize(None) == times[100]
    peak = history[hour & (history["pool"] == "pool1")]["held_gpus"].max()
    assert idle[100, 1] == 128.0 - peak


def test_gaps_mask_their_hours_and_a_gap_at_the_origin_withholds_the_release(history):
    t = history["time"]
    end = t.max().floor("h")
    gap = (t >= end - pd.Timedelta(minutes=50)) & (t < end)  # the last complete hour, mostly
    doc = forecast_pools(history[~gap], [1])
    for pool in doc["idle"]["pools"]:
        assert pool["current_idle_gpus"] is None
        for w in pool["windows"]:
            assert not w["available"] and "last complete hour has too few runs" in w["reason"]
    # an outage earlier on masks its hours and still leaves a release at the origin
    early = (t >= START + pd.Timedelta(hours=100)) & (t < START + pd.Timedelta(hours=103))
    doc = forecast_pools(history[~early], [1])
    assert all(w["available"] for w in windows_of(doc).values())


def test_short_history_gives_each_window_a_reason_instead_of_a_number():
    hours = idle_needs(1) + 2  # enough for 1 h, not for 4 h or 8 h
    doc = forecast_pools(pools_history(hours, every=600.0, pools=1), [1])
    by = {w["window"]: w for w in doc["idle"]["pools"][0]["windows"]}
    assert by["1h"]["available"]
    assert not by["4h"]["available"]
    assert by["4h"]["reason"] == f"needs {idle_needs(4)} complete hours of history, has {hours}"
    assert by["8h"]["reason"].startswith(f"needs {idle_needs(8)} complete hours")
    empty = forecast_pools(pools_history(2, pools=1).iloc[:0], [1])["idle"]
    assert empty["pools"] == [] and empty["origin"] is None
    assert idle_section(None, (1, 4), 0.05)["pools"] == []


def test_a_steady_pool_is_released_safely():
    """Always 40 of 64 GPUs allocated: 24 stay free in every window, nothing is violated."""
    frame = pools_history(idle_needs(8) + 10, every=300.0, pools=1)
    frame["allocated_gpus"] = frame["held_gpus"] = 40.0
    doc = forecast_pools(frame, [1])
    for w in doc["idle"]["pools"][0]["windows"]:
        assert w["available"] and 0 < w["release_gpus"] <= 24.0
        assert w["backtest"]["violation_ratio"] == {"advisor": 0.0, IDLE_BASELINE: 0.0}
        assert w["backtest"]["capture_ratio"][IDLE_BASELINE] == 1.0


def test_a_gpu_with_any_share_handed_out_is_not_released():
    """40 of 64 GPUs each half allocated: 20 GPUs of share, but only 24 GPUs wholly free. The
    release counts whole GPUs (a reservation or a power-down needs the GPU empty); the demand
    forecast still forecasts the 20 GPUs allocated."""
    frame = pools_history(idle_needs(8) + 10, every=300.0, pools=1)
    frame["allocated_gpus"], frame["held_gpus"] = 20.0, 40.0
    doc = forecast_pools(frame, [1])
    pool = doc["idle"]["pools"][0]
    assert pool["current_idle_gpus"] == 24.0
    for w in pool["windows"]:
        assert w["available"] and 0 < w["release_gpus"] <= 24.0
        assert w["backtest"]["violation_ratio"]["advisor"] == 0.0
    assert doc["pools"][0]["allocated_gpus"] == 20.0


def test_the_loop_computes_the_forecast_once_per_completed_hour(monkeypatch):
    calls = []
    real = stages.forecast_panel

    def counting(*args, **kwargs):
        calls.append(args[0].index[-1])  # the hourly panel's latest complete hour
        return real(*args, **kwargs)

    monkeypatch.setattr(stages, "forecast_panel", counting)
    clock = [0.0]
    source = LiveSim("sim:a100-16x8?nodes=2", clock=lambda: clock[0])
    loop = AdvisorLoop("sim", source, Config(settings=Settings(horizons_h=(1,))))
    loop.seed_history(source.backfill(6 * 3600.0))
    hours = []
    for _ in range(12):  # runs 20 minutes apart: about four hours
        state = loop.run_once()
        hours.append(int(state.results.model.timestamp // 3600))
        clock[0] += 1200.0
    assert len(calls) == len(set(hours))  # once for the first run, then once per new hour
    assert state.results.forecast["idle"]["pools"]  # the idle section is part of it
