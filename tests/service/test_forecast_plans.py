"""The service's forecast (hourly panel, held-back backtest, no forecast without one) and its
recommendations (blocked shapes, per-action benefit summing to the job)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from advisor.forecast.live import BASELINE, forecast_pools
from advisor.forecast.panel import Panel
from advisor.forecast.runs import hourly_panel
from advisor.fragmentation.measures import Settings, parse_shape
from advisor.pipeline.stages import analyze_model, blocked_shapes, plans
from advisor.planner.actions import Action, Cost, GpuSet, Plan
from advisor.planner.ranking import ranked_actions
from advisor.settings import Settings as PipelineSettings
from tests.factories import demand_frame


def test_hourly_panel_averages_and_leaves_out_the_running_hour():
    frame = demand_frame(3)
    frame = frame.iloc[:-2]  # the third hour is half observed: still running
    panel = hourly_panel(frame)
    assert len(panel.index) == 2
    first_hour = frame[frame["time"] < frame["time"].iloc[0] + pd.Timedelta(hours=1)]
    assert panel.values["a100"].iloc[0] == pytest.approx(first_hour["allocated_gpus"].mean())
    assert hourly_panel(frame.iloc[:2]) is None  # nothing complete yet


def test_no_forecast_without_enough_history_for_a_backtest():
    doc = forecast_pools(demand_frame(10), [1, 24])
    (pool,) = doc["pools"]
    by = {h["horizon"]: h for h in pool["horizons"]}
    assert by["1h"]["available"] is False and "needs 13 complete hours" in by["1h"]["reason"]
    assert by["24h"]["available"] is False
    assert forecast_pools(demand_frame(0), [1])["pools"] == []


def test_seasonal_demand_is_forecast_with_a_measured_error_against_seasonal_naive():
    doc = forecast_pools(demand_frame(24 * 4), [6])
    (pool,) = doc["pools"]
    (h6,) = pool["horizons"]
    assert h6["available"]
    wape = h6["backtest"]["wape_ratio"]
    assert set(wape) == {h6["model"], BASELINE, "naive"}  # naive's held-back score is served too
    # a pure daily cycle: the seasonal baseline is near exact, and so is what was picked
    assert wape[BASELINE] < 0.01 and wape[h6["model"]] < 0.05
    target = pd.Timestamp(h6["target"])
    expected = 40 + 30 * np.sin(2 * np.pi * target.hour / 24)
    assert h6["point_gpus"] == pytest.approx(expected, abs=2.0)
    assert h6["backtest"]["test_origins"] >= 6 and h6["backtest"]["selection_origins"] >= 6


def test_the_interval_comes_with_its_held_back_coverage():
    """Each interval quantile's coverage is the share of held-back hours at or below it: a
    daily cycle with hour-level noise, whose steps the seasonal baseline's empirical quantiles
    learn, lands near nominal; the q0.1 never covers more than the q0.9. A level jump to
    beyond every trained change makes the q0.9 of the baseline miss each hour after it."""
    frame = demand_frame(24 * 6, per_hour=1)
    rng = np.random.default_rng(7)
    frame["allocated_gpus"] += rng.normal(0, 3, len(frame))
    (pool,) = forecast_pools(frame, [1])["pools"]
    (h1,) = pool["horizons"]
    coverage = h1["backtest"]["coverage_ratio"]
    assert set(coverage) == set(h1["backtest"]["wape_ratio"])
    for shares in coverage.values():
        assert set(shares) == {"0.1", "0.9"}
        assert 0 <= shares["0.1"] <= shares["0.9"] <= 1
    assert coverage[BASELINE]["0.9"] >= 0.7 and coverage[BASELINE]["0.1"] <= 0.3
    jump = frame.copy()
    late = jump["time"] >= jump["time"].iloc[-1] - pd.Timedelta(hours=30)
    jump.loc[late, "allocated_gpus"] += 40.0
    (pool,) = forecast_pools(jump, [1])["pools"]
    shares = pool["horizons"][0]["backtest"]["coverage_ratio"][BASELINE]
    assert shares["0.9"] < coverage[BASELINE]["0.9"]


def runs_frame(
    seconds: np.ndarray, allocated: np.ndarray, start: str = "2026-01-05"
) -> pd.DataFrame:
    """One pool observed at the given run times (seconds after `start`)."""
    return pd.DataFrame(
        {
            "time": pd.Timestamp(start, tz="UTC") + pd.to_timedelta(seconds, unit="s"),
            "pool": "a100",
            "allocated_gpus": allocated,
            "held_gpus": np.ceil(allocated),
            "capacity_gpus": 512.0,
            "pending_gpus": 0.0,
        }
    )


def random_walk(hours: int, per_hour: int = 12, seed: int = 7) -> pd.DataFrame:
    """Demand that wanders: the hour's last reading predicts the next hour better than its mean."""
    rng = np.random.default_rng(seed)
    n = hours * per_hour
    seconds = np.arange(n) * (3600.0 / per_hour) + rng.uniform(0, 60, n)
    return runs_frame(seconds, 256 + np.cumsum(rng.normal(0, 2.0, n)))


def test_hourly_panel_carries_each_hours_last_reading():
    frame = random_walk(5)
    panel = hourly_panel(frame)
    assert len(panel.index) == 4  # the fifth hour is the latest: still running
    hour = frame["time"].dt.floor("h").dt.tz_localize(None)
    for t in panel.index:
        mine = frame.loc[hour == t, "allocated_gpus"]
        assert panel.values.at[t, "a100"] == pytest.approx(mine.mean())
        assert panel.within["last"].at[t, "a100"] == mine.iloc[-1]
        assert panel.within["max"].at[t, "a100"] == mine.max()
        assert mine.iloc[-1] != pytest.approx(mine.mean())


def test_service_forecasts_from_the_last_reading_of_the_last_complete_hour():
    frame = random_walk(24 * 4)
    doc = forecast_pools(frame, [1])
    assert "last_reading" in doc["candidates"]
    ((h1,),) = [p["horizons"] for p in doc["pools"]]
    assert h1["model"] == "median(naive,last_reading)"  # the reading joins naive: it beat it
    complete = frame[frame["time"] < frame["time"].iloc[-1].floor("h")]
    last_hour = complete[complete["time"] >= complete["time"].iloc[-1].floor("h")]
    naive = last_hour["allocated_gpus"].mean()  # what the hourly mean alone would forecast
    reading = last_hour["allocated_gpus"].iloc[-1]
    assert h1["point_gpus"] == pytest.approx((naive + reading) / 2)
    assert abs(h1["point_gpus"] - naive) > 0.25
    # its held-back error was measured on the same inputs, and it beat the seasonal baseline
    wape = h1["backtest"]["wape_ratio"]
    assert wape[h1["model"]] < wape[BASELINE]
    q = h1["quantiles"]
    assert q["0.1"] < h1["point_gpus"] < q["0.9"]


def test_nothing_from_the_running_hour_is_used():
    frame = random_walk(24 * 3)
    doc = forecast_pools(frame, [1, 6])
    running = frame["time"] >= frame["time"].iloc[-1].floor("h")
    assert running.sum() > 2
    altered = frame.copy()
    altered.loc[running, "allocated_gpus"] *= 1.7
    assert forecast_pools(altered, [1, 6]) == doc
    assert forecast_pools(frame.iloc[: -(running.sum() - 1)], [1, 6]) == doc  # hour just begun
    # a complete hour does count: changing the last run of the last complete hour moves it
    changed = frame.copy()
    changed.loc[(~running).to_numpy().nonzero()[0][-1], "allocated_gpus"] += 40
    assert forecast_pools(changed, [1, 6]) != doc


def test_an_hours_mask_and_readings_do_not_depend_on_later_runs():
    frame = random_walk(30)
    early, full = hourly_panel(frame.iloc[: 12 * 20 + 5]), hourly_panel(frame)
    rows = early.index
    assert full.values.loc[rows].equals(early.values)
    for name, within in early.within.items():
        assert full.within[name].loc[rows].equals(within), name


def test_irregular_runs_keep_normal_hours_and_mask_real_gaps():
    """Hourly backfill, then runs every ~45 s with jitter, a slow stretch, a restart, a source
    outage and a lone run inside a longer outage; then a run in the hour still running."""
    rng = np.random.default_rng(3)
    backfill = np.arange(0, 24 * 3600, 3600.0)  # one run an hour (a sim backfill)

    def live(start: float, end: float, every: float) -> np.ndarray:
        return np.arange(start, end, every) + rng.uniform(-5, 5, len(np.arange(start, end, every)))

    hour = 3600.0
    seconds = np.concatenate(
        [
            backfill,
            live(24 * hour, 26 * hour, 45),  # hours 24, 25: normal
            live(26 * hour, 28 * hour, 100),  # hours 26, 27: a slow stretch (long runs)
            live(28 * hour, 28 * hour + 1700, 45),  # hour 28: restart after 28 minutes ...
            live(28 * hour + 1940, 29 * hour, 45),  # ... back 4 minutes later: normal
            live(29 * hour, 29 * hour + 1200, 45),  # hour 29: source down from minute 20 ...
            live(30 * hour + 2100, 31 * hour, 45),  # hour 30: ... to minute 35 of the next
            live(31 * hour, 31 * hour + 600, 45),  # hour 31: down from minute 10 ...
            [32 * hour + 1800],  # hour 32: one lone good run in the outage
            live(33 * hour + 2700, 35 * hour + 60, 45),  # hour 33 partial, 34 normal, 35 running
        ]
    )
    frame = runs_frame(seconds, np.full(len(seconds), 100.0))
    panel = hourly_panel(frame)
    observed = panel.values["a100"].notna()
    by_hour = dict(
        zip((panel.index - panel.index[0]) // pd.Timedelta(hours=1), observed, strict=True)
    )
    assert all(by_hour[h] for h in range(24)), "backfilled hours (one run each) are kept"
    assert all(by_hour[h] for h in (24, 25, 26, 27, 28, 34)), by_hour
    assert not any(by_hour[h] for h in (29, 30, 31, 32, 33)), by_hour
    assert len(panel.index) == 35  # hour 35 is still running
    assert panel.within["last"]["a100"].notna().equals(observed)
    assert panel.capacity["a100"].eq(512.0).all()  # carried over the masked hours
    # Panel.resample's own rule (one spacing for the whole input) would mask the backfill
    runs = frame[frame["time"] < frame["time"].iloc[-1].floor("h")]
    native = Panel(
        runs.set_index(runs["time"].dt.tz_localize(None))[["allocated_gpus"]],
        runs.set_index(runs["time"].dt.tz_localize(None))[["capacity_gpus"]],
    )
    assert native.resample("h").values.iloc[:24].isna().all().all()


def test_blocked_shapes_are_whole_gpu_jobs_that_do_not_fit_but_could(islands):
    shapes = tuple(parse_shape(s) for s in ("0.5", "1", "8", "2x8", "64x8"))
    results = analyze_model(islands, Settings(shapes=shapes), 0.0)
    blocked = blocked_shapes(islands, shapes, results.shapes)
    # 64x8 exceeds the fleet; 2x8 needs two nodes in one rack, and its two are in two racks
    assert [s.num_gpu * s.tasks for s in blocked] == [8]


def test_each_plans_actions_sum_to_its_job_and_are_ranked_cheapest_plan_first(islands):
    settings = PipelineSettings()
    results = analyze_model(islands, settings.measures, 0.0)
    doc = plans(islands, settings, results.shapes)
    feasible = [p for p in doc["plans"] if p["feasible"] and p["goal"].startswith("job=")]
    assert feasible
    for plan in feasible:
        mine = [a for a in doc["actions"] if a["goal"] == plan["goal"]]
        assert len(mine) == len(plan["actions"])
        goal_gpus = parse_shape(plan["goal"].removeprefix("job=")).gpus
        assert sum(a["benefit_gpus"] for a in mine) == pytest.approx(goal_gpus)
    moves = [a for a in doc["actions"] if a["kind"] == "migrate"]
    assert all(a["source"] and a["target"] and a["cost_gpu_hours"] > 0 for a in moves)
    assert doc["by_kind"]["migrate"] == len(moves)
    assert_ranked_cheapest_plan_first(doc)


def test_ranked_actions_put_the_cheapest_feasible_plan_first():
    """The fleets above give one feasible plan each; the order needs several."""

    def move(alloc: str, hours: float) -> Action:
        src, dst = GpuSet("n1", (0,), 1000), GpuSet("n2", (0,), 1000)
        return Action("migrate", alloc, src=src, dst=dst, cost=Cost(1, 600.0, hours))

    reserve = Action("reserve", "r", dst=GpuSet("n3", (0, 1), 1000))
    made = [
        Plan("job=dear", True, (move("a", 2.0), move("b", 3.0))),
        Plan("job=blocked", False, (move("c", 0.0),)),
        Plan("job=cheap", True, (move("d", 0.5), reserve)),
    ]
    rows = ranked_actions(made)
    assert [(r["rank"], r["goal"], r["alloc"]) for r in rows] == [
        (1, "job=cheap", "d"),
        (2, "job=cheap", "r"),
        (3, "job=dear", "a"),
        (4, "job=dear", "b"),
    ]
    doc = {"actions": rows, "plans": [p.to_dict() for p in made]}
    assert assert_ranked_cheapest_plan_first(doc) == ["job=cheap", "job=dear"]


def assert_ranked_cheapest_plan_first(doc: dict) -> list[str]:
    """Ranks are 1..n and the plans' actions come cheapest plan first (planner cost score);
    returns the goals in ranked order."""
    assert [a["rank"] for a in doc["actions"]] == list(range(1, len(doc["actions"]) + 1))
    feasible = [p for p in doc["plans"] if p["feasible"]]
    score = {p["goal"]: Cost(**p["cost"]).score() for p in feasible}
    assert len(score) == len(feasible)  # goals name plans uniquely
    order = list(dict.fromkeys(a["goal"] for a in doc["actions"]))
    assert [score[g] for g in order] == sorted(score[g] for g in order)
    return order


def test_recommend_kinds_join_the_ranked_actions():
    """The mixed fleet after three simulated days has a waiting job that `recommend` reserves
    for; its plan's actions are ranked beside the consolidation ones and counted by kind."""
    from advisor.ingest.live import LiveSim

    source = LiveSim("sim:mixed-h100-a100-v100", clock=lambda: 0.0)
    source.backfill(72 * 3600.0)
    model = source()
    settings = PipelineSettings()
    results = analyze_model(model, settings.measures, 0.0)
    doc = plans(model, settings, results.shapes)
    other = [p for p in doc["plans"] if not p["goal"].startswith("job=")]
    assert other, doc["goals"]
    kinds = {a["kind"] for p in other for a in p["actions"]}
    ranked = [a for a in doc["actions"] if a["goal"] in {p["goal"] for p in other}]
    assert {a["kind"] for a in ranked} == kinds
    assert sum(doc["by_kind"].values()) == len(doc["actions"])
    assert_ranked_cheapest_plan_first(doc)
    for action in ranked:
        if action["kind"] == "reserve":
            gpus = action["target"].split("[")[1].split("]")[0].split(",")
            assert action["benefit_gpus"] == pytest.approx(len(gpus))
