"""Idle windows per node: the history keeps each node's hourly peak of held GPUs, capacity and
coverage (bounded, nothing per run), the service serves per node the same windows, risk, reasons
and backtest as per pool, with the per-series rules only; the pool section does not change."""

from __future__ import annotations

import math

import numpy as np
import pytest

from advisor.forecast import idle as I
from advisor.forecast.live import forecast_pools
from advisor.forecast.live_idle import IDLE_BASELINE, IDLE_MAX_H, IDLE_MIN_TEST
from advisor.forecast.runs import node_panel
from advisor.history import NODE_HOURS, History, NodeRecord, node_rows, pool_rows
from advisor.history import observations as history_module  # where History.append looks
from advisor.ingest.live import LiveSim
from advisor.model import ClusterModel, ModelBuilder
from advisor.service.loop import AdvisorLoop, Config
from advisor.settings import Settings
from tests.conftest import add_nodes
from tests.service.conftest import ScriptedSource

HOUR = 3600.0
START = 1_767_571_200.0  # 2026-01-05T00:00:00Z, a midnight
HOURS = 127  # complete hours: the last one (the origin) is 06:00, the day node is busy 08-19
GPUS = 8


def fleet(
    at: float, *, without: tuple[str, ...] = (), broken: bool = True, pool_b: bool = True
) -> ClusterModel:
    """Nodes of 8 GPUs: `busy` always full, `free` always empty, `day` full from 08:00 to 19:59
    UTC, `half` 4 GPUs at half share each (2 GPUs allocated, 4 held) and, in pool b, `broken` whose GPUs are all
    unhealthy (no capacity)."""
    hour = int(at // HOUR) % 24
    b = ModelBuilder()
    nodes = {"busy": "a", "free": "a", "day": "a", "half": "b", "broken": "b"}
    for name, pool in nodes.items():
        if name in without or (name == "broken" and not broken) or (pool == "b" and not pool_b):
            continue
        add_nodes([name], GPUS, builder=b, pool=pool, gpu_model="A100", healthy=name != "broken")
    if "busy" not in without:
        b.add_allocation("busy-job", num_gpu=GPUS, node="busy", gpus=range(GPUS), tenant="t")
    if "day" not in without and 8 <= hour < 20:
        b.add_allocation("day-job", num_gpu=GPUS, node="day", gpus=range(GPUS), tenant="t")
    if "half" not in without and pool_b:
        b.add_allocation("half-job", num_gpu=4, gpu_milli=500, node="half", gpus=range(4))
    return b.build(timestamp=at)


def hourly_runs(hours: int = HOURS, **kwargs) -> list[ClusterModel]:
    """One run an hour (a sim backfill) through `hours` complete hours, and one run in the hour
    still running."""
    return [fleet(START + h * HOUR + 60.0, **kwargs) for h in range(hours + 1)]


def recorded(models: list[ClusterModel], **kwargs) -> History:
    history = History(max_points=10_000, **kwargs)
    history.extend(models)
    return history


def doc_of(history: History, **kwargs) -> dict:
    return forecast_pools(history.pool_demand(), [1], nodes=history.node_hours(), **kwargs)


def by_node(doc: dict) -> dict[str, dict]:
    return {n["node"]: n for n in doc["idle"]["nodes"]}


@pytest.fixture(scope="module")
def models() -> list[ClusterModel]:
    return hourly_runs()


@pytest.fixture(scope="module")
def history(models) -> History:
    return recorded(models)


@pytest.fixture(scope="module")
def doc(history) -> dict:
    return doc_of(history)


# --------------------------------------------------------------------------- the record


def test_the_record_keeps_peak_capacity_and_coverage_per_node_and_hour(models, history):
    record = history.node_hours()
    assert len(record.hours) == HOURS + 1 and record.runs.tolist() == [1] * (HOURS + 1)
    assert set(record.names) == {"busy", "free", "day", "half", "broken"}
    assert dict(zip(record.names, record.pools, strict=True))["half"] == "b"
    j = {name: i for i, name in enumerate(record.names)}
    held = record.peak_held
    assert (held[:, j["busy"]] == GPUS).all() and (held[:, j["free"]] == 0).all()
    assert (record.capacity[:, j["broken"]] == 0).all()  # unhealthy GPUs are no capacity
    # 4 GPUs at half share: 2 GPUs allocated, but 4 held (no whole-GPU job can take them)
    assert (held[:, j["half"]] == 4.0).all()
    assert (record.seen == 1).all()
    # counted as pool_rows counts: per pool, the nodes' allocated, held and capacity add up
    for model, row in zip(models[:3], held[:3], strict=True):
        nodes = node_rows(model)
        for pool in pool_rows(model):
            mine = nodes.pools == pool["pool"]
            assert nodes.allocated[mine].sum() == pytest.approx(pool["allocated_gpus"])
            assert nodes.held[mine].sum() == pool["held_gpus"]
            assert nodes.capacity[mine].sum() == pool["capacity_gpus"]
            assert row[[j[n] for n in nodes.names[mine]]].sum() == pool["held_gpus"]
    half = node_rows(models[0]).names.tolist().index("half")
    assert node_rows(models[0]).allocated[half] == 2.0


def test_the_record_is_bounded_to_the_idle_history_and_forgets_gone_nodes():
    assert NODE_HOURS == IDLE_MAX_H and History().nodes.max_hours == IDLE_MAX_H
    record = NodeRecord(max_hours=5)
    names = np.array(["a", "b"], dtype=object)
    pools = np.array(["p", "p"], dtype=object)
    for h in range(4):  # "b" is seen in the first four hours only
        record.observe(h * HOUR, names, pools, np.array([1.0, 2.0]), np.array([8.0, 8.0]))
    for h in range(4, 12):
        for minute in (0, 20, 40):
            record.observe(h * HOUR + minute * 60, names[:1], pools[:1], [3.0], [8.0])
    snap = record.snapshot()
    assert snap.hours.tolist() == list(range(6, 12))  # 5 complete hours + the running one
    assert snap.names == ("a",) and snap.runs.tolist() == [3] * 6  # "b" has aged out
    assert len(snap.run_times) == 18 and snap.peak_held.shape == (6, 1)


def test_a_skipped_observation_costs_no_per_node_or_per_job_work(models, monkeypatch):
    history = recorded(models[:3])
    calls = []
    monkeypatch.setattr(history_module, "running_jobs", lambda m: calls.append("jobs") or [])
    monkeypatch.setattr(history_module, "node_rows", lambda m: calls.append("nodes"))
    monkeypatch.setattr(history_module.measures, "analyze", lambda m: calls.append("analyze"))
    point = history.append(models[1])  # older than the last one: skipped
    assert calls == [] and point.timestamp == models[2].timestamp
    assert len(history) == 3 and len(history.node_hours().hours) == 3


# --------------------------------------------------------------------------- the releases


def test_releases_per_node_match_what_must_hold(doc):
    idle = doc["idle"]
    assert idle["origin"] == "2026-01-10T06:00:00Z" and idle["node_history_hours"] == HOURS
    nodes = by_node(doc)
    assert list(nodes) == ["day", "free", "half", "broken", "busy"]  # most idle now, then name
    assert nodes["day"]["pool"] == "a" and nodes["half"]["pool"] == "b"
    release = {
        (name, w["window"]): w["release_gpus"] for name, n in nodes.items() for w in n["windows"]
    }
    for window in ("1h", "4h", "8h"):
        assert release[("free", window)] == GPUS  # always free: all of it, every window
        assert release[("busy", window)] == 0.0
        # 4 GPUs at half share each: 4 wholly free GPUs, not the 6 GPUs of free share
        assert release[("half", window)] == GPUS - 4
        assert release[("broken", window)] == 0.0  # no capacity: releases 0
    # from 07:00 the day node is free for one hour, then busy from 08:00 on
    assert release[("day", "4h")] == release[("day", "8h")] == 0.0
    for name, node in nodes.items():
        for w in node["windows"]:
            assert w["available"], (name, w)
            bt = w["backtest"]
            assert bt["test_origins"] >= IDLE_MIN_TEST
            assert set(bt["violation_ratio"]) == {"advisor", IDLE_BASELINE}
            assert bt["violation_ratio"]["advisor"] <= idle["risk"]
    assert by_node(doc)["broken"]["windows"][0]["rule"] == "no_capacity"


def test_releases_never_exceed_capacity_and_never_grow_with_the_window(doc):
    for node in doc["idle"]["nodes"]:
        releases = [w["release_gpus"] for w in node["windows"]]
        assert all(0 <= r <= node["capacity_gpus"] for r in releases), node
        assert releases == sorted(releases, reverse=True), node
        assert node["capacity_gpus"] == (0.0 if node["node"] == "broken" else GPUS)


def test_the_per_node_rules_are_the_backtested_ones(doc, history):
    """The node release is idle_windows' per-series rules on the node panel, nothing pooled."""
    panel = node_panel(history.node_hours())
    live = I.idle_windows(panel, (1, 4, 8), 0.05, method="rules")
    for row in live.to_dict("records"):
        node = by_node(doc)[row["series"]]
        served = {w["window"]: w for w in node["windows"]}[f"{row['window_h']}h"]
        assert served["release_gpus"] == row["release"] and served["rule"] == row["rule"]
        assert not served["backtest"]["method"].startswith("quantile")


def test_the_pool_section_is_unchanged_by_the_nodes(history, doc):
    alone = forecast_pools(history.pool_demand(), [1])
    assert alone["idle"]["nodes"] == [] and alone["idle"]["nodes_total"] == 0
    node_keys = ("nodes", "node_history_hours", "nodes_total", "node_error")
    assert {k: v for k, v in doc["idle"].items() if k not in node_keys} == {
        k: v for k, v in alone["idle"].items() if k not in node_keys
    }
    assert {k: v for k, v in doc.items() if k != "idle"} == {
        k: v for k, v in alone.items() if k != "idle"
    }


# --------------------------------------------------------------------------- bad input


def test_a_removed_node_keeps_its_hours_but_gets_no_release(models):
    gone = [*models[:-2], fleet(models[-2].timestamp, without=("day",)), models[-1]]
    nodes = by_node(doc_of(recorded(gone)))
    assert nodes["day"]["current_idle_gpus"] is None and nodes["day"]["capacity_gpus"] == GPUS
    for w in nodes["day"]["windows"]:
        assert not w["available"]
        assert w["reason"] == (
            "the last complete hour has too few runs for this node (source gap or new node): "
            "no release from older hours"
        )
    assert all(w["available"] for w in nodes["free"]["windows"])


def test_a_node_seen_in_fewer_than_half_of_the_hours_runs_is_masked(models):
    """Live runs every 10 minutes in the last complete hour; `free` misses four of six."""
    last = models[-2].timestamp - 60.0  # the last complete hour's start
    live = [fleet(last + m * 600.0 + 5.0, without=("free",) if m < 4 else ()) for m in range(6)]
    nodes = by_node(doc_of(recorded([*models[:-2], *live, models[-1]])))
    assert nodes["free"]["current_idle_gpus"] is None
    assert "too few runs for this node" in nodes["free"]["windows"][0]["reason"]
    assert nodes["busy"]["windows"][0]["available"]  # seen in all six: kept


def test_a_source_gap_masks_the_hour_for_every_node_as_for_pools(models):
    """Live runs every minute, then an outage of 50 minutes in the last complete hour."""
    last = models[-2].timestamp - 60.0
    live = [fleet(last - HOUR + m * 60.0) for m in range(60)]
    live += [fleet(last + m * 60.0) for m in range(50, 60)]
    doc = doc_of(recorded([*models[:-3], *live, models[-1]]))
    assert all(p["current_idle_gpus"] is None for p in doc["idle"]["pools"])
    assert all(n["current_idle_gpus"] is None for n in doc["idle"]["nodes"])


def test_short_history_and_the_node_limit_give_reasons():
    short = doc_of(recorded(hourly_runs(100)))
    for node in short["idle"]["nodes"]:
        windows = {w["window"]: w for w in node["windows"]}
        assert windows["1h"]["available"]
        assert windows["8h"]["reason"] == "needs 112 complete hours of history, has 100"
    capped = doc_of(recorded(hourly_runs(100)), max_nodes=2)["idle"]
    assert capped["nodes_total"] == 5 and capped["max_nodes"] == 2
    computed = [n["node"] for n in capped["nodes"] if n["windows"][0]["available"]]
    assert computed == ["day", "free"]  # the most GPUs idle in the last complete hour
    for node in capped["nodes"][2:]:
        assert node["windows"][0]["reason"].startswith("not among the 2 nodes with the most")


# --------------------------------------------------------------------------- the loop


def test_hourly_backfill_and_one_run_serve_the_node_section(models, doc):
    loop = AdvisorLoop(
        "scripted", ScriptedSource(models[-1]), Config(settings=Settings(horizons_h=(1,)))
    )
    loop.seed_history(models[:-1])
    state = loop.run_once()
    idle = state.results.forecast["idle"]
    assert idle["nodes"] == doc["idle"]["nodes"] and idle["pools"] == doc["idle"]["pools"]


def test_a_simulated_backfill_gives_every_node_a_release():
    clock = [0.0]
    source = LiveSim("sim:a100-16x8?nodes=3&t=5d", clock=lambda: clock[0])
    loop = AdvisorLoop("sim", source, Config(settings=Settings(horizons_h=(1,))))
    loop.seed_history(source.backfill(5 * 24 * HOUR))
    idle = loop.run_once().results.forecast["idle"]
    assert idle["nodes_total"] == 3 and idle["node_history_hours"] == 5 * 24
    for node in idle["nodes"]:
        assert node["pool"] == "a100" and node["capacity_gpus"] == 8.0
        for w in node["windows"]:
            assert w["available"] and 0 <= w["release_gpus"] <= node["capacity_gpus"]
    pool = idle["pools"][0]
    assert sum(n["capacity_gpus"] for n in idle["nodes"]) == pool["capacity_gpus"]
    # one run in the last complete hour: the nodes' idle GPUs add up to the pool's
    assert math.isclose(
        sum(n["current_idle_gpus"] for n in idle["nodes"]), pool["current_idle_gpus"]
    )
