"""No look-ahead in what the service computes on a short or young history (the shapes it gets:
from the fewest hours it accepts up to a few days, backtest origins from the first hour on).

Everything produced for an origin t must be unchanged when every run after t's hour is altered
(values changed, a pool's hour and the whole fleet's hour dropped, the spacing of the runs
changed): the hourly panel's rows up to t, the demand candidates' backtest forecasts at origins
≤ t, the model the held-back half scores at its first origin, the idle backtest's releases at
origins ≤ t (per pool and per node), and those releases' independence from a capacity a pool
only gains after t. (Holt-Winters, whose start-up state read the first day, was such a leak:
`tests/advisor/test_forecast_features.py`.)
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from advisor.forecast import idle as I
from advisor.forecast import live, live_idle
from advisor.forecast import runs as RP
from advisor.forecast.panel import Panel
from advisor.forecast.rolling import rolling_forecasts
from advisor.history import NodeRecord
from tests.factories import jumping_panel
from tests.service.test_idle_windows import START, pools_history

QUANTILES = live.QUANTILES
KEEP = 7


def _hour_end(index: pd.DatetimeIndex, t: int) -> pd.Timestamp:
    """The first instant after hour t of an (UTC-naive) hourly index, as the runs' UTC time."""
    return (index[t] + pd.Timedelta(hours=1)).tz_localize("UTC")


def _altered(runs: pd.DataFrame, cut: pd.Timestamp, pool: str = "pool0") -> pd.DataFrame:
    """Every run from `cut` on changed: allocations moved (still within capacity; pool1's to
    all of it), the first hour's runs twice as dense but `pool`'s dropped (its hour masked),
    every other run from the sixth hour on (a slower interval) and every run of the 13th hour
    (a source outage, after the widest idle window); the last run (in the hour still running)
    kept, so the hours are the same."""
    first = runs[(runs["time"] >= cut) & (runs["time"] < cut + pd.Timedelta(hours=1))]
    denser = first.assign(time=first["time"] + pd.Timedelta(seconds=120))
    r = pd.concat([runs, denser]).sort_values("time", kind="stable").reset_index(drop=True)
    after = r["time"] >= cut
    moved = np.round(r.loc[after, "allocated_gpus"].to_numpy() * 0.3 + 5)
    full = (r.loc[after, "pool"] == "pool1").to_numpy()
    moved[full] = 1000.0  # pool1 fully allocated: nothing idle
    r.loc[after, "allocated_gpus"] = np.fmin(moved, r.loc[after, "capacity_gpus"].to_numpy())
    since = (r["time"] - cut) / pd.Timedelta(hours=1)
    last = r["time"] == r["time"].max()
    drop = (since >= 0) & (since < 1) & (r["pool"] == pool)
    drop |= (since >= 12) & (since < 13)
    later = np.flatnonzero((since >= 5).to_numpy())
    thinned = np.zeros(len(r), bool)
    thinned[later[(np.arange(len(later)) // r["pool"].nunique()) % 2 == 1]] = True
    return r[~((drop | thinned) & ~last)].reset_index(drop=True)


def _thin_hour(runs: pd.DataFrame, hour: int, keep: int) -> pd.DataFrame:
    """Hour `hour` of the runs with only its last `keep` runs."""
    since = (runs["time"] - START) / pd.Timedelta(hours=1)
    inside = runs[(since >= hour) & (since < hour + 1)]
    times = sorted(inside["time"].unique())[:-keep]
    return runs[~runs["time"].isin(times)].reset_index(drop=True)


def _assert_rows_equal(a: pd.DataFrame, b: pd.DataFrame, t: int, what: str) -> None:
    pd.testing.assert_frame_equal(a.iloc[: t + 1], b.iloc[: t + 1], obj=what)


# --------------------------------------------------------------------------- the hourly panel


@pytest.mark.parametrize("t", [0, 4, 11, 20])
def test_the_hourly_panels_up_to_an_hour_ignore_the_runs_after_it(t):
    """The demand forecast's hourly panel (values, capacity, the readings inside each hour) and
    the idle windows' hourly peaks, through hour t: the coverage rule that masks a thin hour
    (hour 9 here) and keeps hour t at exactly half its runs reads the spacing of the runs up to
    it only (denser, sparser or no runs after t change nothing), from the first hour on and
    across the backfill."""
    runs = _thin_hour(pools_history(30, every=300.0, backfill_h=8), 9, keep=5)
    runs = _thin_hour(runs, t, keep=KEEP)  # hour t just kept (a backfilled hour has one)
    before = RP.hourly_panel(runs)
    assert np.isnan(before.values.iloc[9]).all()  # a thin live hour is masked ...
    assert not np.isnan(
        before.values.iloc[[2, t]].to_numpy()
    ).any()  # ... a backfilled one, half of one not
    cut = _hour_end(before.index, t)
    after = RP.hourly_panel(_altered(runs, cut))
    assert before.index.equals(after.index)
    _assert_rows_equal(before.values, after.values, t, "values")
    _assert_rows_equal(before.capacity, after.capacity, t, "capacity")
    for k in before.within:
        _assert_rows_equal(before.within[k], after.within[k], t, f"within[{k}]")
    # and the check itself can fail: the hours after t do change
    assert not before.values.iloc[t + 1 :].equals(after.values.iloc[t + 1 :])
    peaks = [RP.runs_panel(r).resample("h", how="max") for r in (runs, _altered(runs, cut))]
    _assert_rows_equal(peaks[0].values, peaks[1].values, t, "hourly peaks")


# --------------------------------------------------------------------------- demand


@pytest.mark.parametrize("t", [2, 17, 30])
def test_the_demand_backtest_forecasts_ignore_data_after_the_origin(t):
    """The service's candidates on its own hourly panel (readings inside each hour included),
    fitted and scored from origin 0 on, as `demand_section` does on a history under two days."""
    runs = pools_history(40, every=600.0)
    panels = [RP.hourly_panel(runs)]
    panels.append(RP.hourly_panel(_altered(runs, _hour_end(panels[0].index, t))))
    origins = np.arange(0, len(panels[0].index))
    out = []
    for panel in panels:
        fc = rolling_forecasts(panel, live.CANDIDATES, (1, 6), QUANTILES, origins)
        out.append(fc[fc["origin"] <= panel.index[t]].reset_index(drop=True))
    assert len(out[0]) and set(out[0]["model"]) == set(live.CANDIDATES)
    pd.testing.assert_frame_equal(out[0].drop(columns="actual"), out[1].drop(columns="actual"))


def _picks(section: dict, key: str) -> dict[tuple[str, str], dict]:
    return {(e[key], h["horizon"]): h for e in section[f"{key}s"] for h in e["horizons"]}


def _first_held_back(panel: Panel, h: int) -> int:
    last = len(panel.index) - 1
    origins = np.arange(max(0, last - h - live.MAX_ORIGINS + 1), last - h + 1)
    return int(origins[len(origins) // 2])


@pytest.mark.parametrize("hours", [36, 48, 60])
@pytest.mark.parametrize("h", [6, 24])
@pytest.mark.parametrize("kind", ["pool", "tenant"])
def test_the_model_scored_on_held_back_origins_is_picked_from_hours_up_to_them(kind, h, hours):
    """The held-back half scores the pick at each of its origins, so the pick must be made from
    what is known at its first origin t: selection origins whose target lies after t would let
    the hours after t choose the model (on a short history every selection target may lie
    there). The held-back error itself does change with those hours."""
    runs = pools_history(hours, every=600.0, seed=1)
    if kind == "tenant":
        runs = runs.assign(capacity_gpus=np.nan)

    def section(frame):
        if kind == "pool":
            return live.demand_section(RP.hourly_panel(frame), [h])
        return live.tenant_section(frame, [h])

    panel = RP.hourly_panel(runs)
    t = _first_held_back(panel, h)
    cut = _hour_end(panel.index, t)
    before, after = _picks(section(runs), kind), _picks(section(_altered(runs, cut)), kind)
    assert before.keys() == after.keys()
    assert all(e["available"] for e in before.values())
    for key, e in before.items():
        assert e["model"] == after[key]["model"], key
        assert e["backtest"]["selection_origins"] == after[key]["backtest"]["selection_origins"]
    assert any(
        e["backtest"]["wape_ratio"] != after[k]["backtest"]["wape_ratio"] for k, e in before.items()
    )


def test_a_short_history_selects_on_the_origins_whose_target_is_known_else_keeps_naive():
    """`selection_origins` counts the origins the pick was scored on: those of the earlier half
    whose target is observed at the first held-back origin; none at the fewest hours a 24 h
    horizon accepts (the pick is then naive, the selection rule's default), all but h − 1 of
    the half on a longer history; a 1 h horizon loses none."""
    for hours, h, expected in ((36, 24, 0), (96, 24, 13), (96, 1, 47)):
        doc = live.demand_section(RP.hourly_panel(pools_history(hours, every=600.0)), [h])
        for pool in doc["pools"]:
            (entry,) = pool["horizons"]
            assert entry["backtest"]["selection_origins"] == expected, (hours, h)
            if expected == 0:
                assert entry["model"] == "naive"


# --------------------------------------------------------------------------- idle windows


@pytest.fixture
def releases(monkeypatch):
    """The idle backtest's releases per window (origins × series), as `_idle_series` gets them,
    and the rule and parameter each series was calibrated to at the first held-back origin."""
    seen: list[tuple[dict[int, pd.DataFrame], dict]] = []
    backtest = I.backtest

    def spy(*args, **kwargs):
        table = backtest(*args, **kwargs)
        mine = table[table["model"] == "advisor"]
        rules = dict(
            zip(zip(mine["series"], mine["window_h"], strict=True), mine["params"], strict=True)
        )
        seen.append(({w: frame.copy() for w, frame in kwargs["releases"].items()}, rules))
        return table

    monkeypatch.setattr(I, "backtest", spy)
    return seen


def _idle_releases(seen, runs=None, nodes=None, max_nodes=live_idle.IDLE_MAX_NODES):
    seen.clear()
    doc = live_idle.idle_section(
        RP.runs_panel(runs) if runs is not None else None, [1, 4, 8], 0.05, nodes, max_nodes
    )
    assert len(seen) == 1
    return (*seen[0], doc)


def _compare_up_to(before, after, until, columns=None) -> int:
    """Asserts the releases at origins ≤ `until` are equal; returns how many were compared."""
    n = 0
    assert before.keys() == after.keys() and before
    for w in before:
        a, b = before[w], after[w]
        if columns is not None:
            a, b = a[columns], b[columns]
        pd.testing.assert_frame_equal(a[a.index <= until], b[b.index <= until], obj=f"W={w}")
        n += int((a.index <= until).sum())
    return n


@pytest.mark.parametrize("hours", [live_idle.idle_needs(1), live_idle.idle_needs(8), 150])
@pytest.mark.parametrize("dt", [0, 13])
def test_the_idle_backtest_releases_ignore_data_after_the_origin(releases, hours, dt):
    """From the fewest hours a window accepts: the releases the held-back part scores, at its
    first origin and later ones, come from the hours up to each origin; so does each series'
    rule, calibrated at the first held-back origin on the outcomes known there."""
    runs = pools_history(hours, every=600.0, seed=0)
    before, rules, doc = _idle_releases(releases, runs)
    assert doc["history_hours"] == hours
    first = min(frame.index[0] for frame in before.values())
    t = pd.Timestamp(first) + pd.Timedelta(hours=dt)
    after, rules_after, _ = _idle_releases(
        releases, _altered(runs, (t + pd.Timedelta(hours=1)).tz_localize("UTC"))
    )
    assert _compare_up_to(before, after, t) > 0
    assert rules_after == rules


@pytest.mark.parametrize(("hours", "seed"), [(live_idle.idle_needs(8), 1), (150, 3)])
def test_a_pools_releases_ignore_capacity_another_pool_gains_after_the_origin(
    releases, hours, seed
):
    """Pools with no usable GPU (0 capacity) up to t: whether they gain capacity after t must
    not change the other pools' releases at origins ≤ t. (The series without capacity are left
    out of the backtest by the whole history, so the margin's pooled violation share counted
    their hours or not by what happened after t.)"""
    runs = pools_history(hours, every=600.0, seed=seed)
    spares = []
    for k in range(3):
        spare = runs[runs["pool"] == "pool0"].assign(
            pool=f"spare{k}", capacity_gpus=0.0, allocated_gpus=0.0
        )
        spares.append(spare)
    runs = pd.concat([runs, *spares]).sort_values("time", kind="stable").reset_index(drop=True)
    before, _, _ = _idle_releases(releases, runs)
    first = min(frame.index[0] for frame in before.values())
    t = pd.Timestamp(first) + pd.Timedelta(hours=12)
    grown = runs.copy()
    later = grown["pool"].str.startswith("spare") & (
        grown["time"] >= (t + pd.Timedelta(hours=1)).tz_localize("UTC")
    )
    grown.loc[later, "capacity_gpus"] = 32.0
    after, _, _ = _idle_releases(releases, grown)
    assert set(before[1].columns) == {"pool0", "pool1", "pool2"}  # no capacity: left out
    assert _compare_up_to(before, after, t, ["pool0", "pool1", "pool2"]) > 0


# --------------------------------------------------------------------------- idle windows per node


def _node_record(
    hours: int, nodes: int = 6, seed: int = 0, alter_from: int | None = None
) -> NodeRecord:
    """A `NodeRecord` of runs every 10 minutes for `hours` complete hours (and one in the hour
    still running): 8-GPU nodes whose allocation jumps at random, more often by day. With
    `alter_from`: from that hour on every allocation moved, node n0 unseen for an hour and no
    run at all two hours later."""
    rng = np.random.default_rng(seed)
    record = NodeRecord()
    names = np.array([f"n{j}" for j in range(nodes)], dtype=object)
    pools = np.array(["a"] * nodes, dtype=object)
    level = rng.integers(0, 9, nodes).astype(float)
    capacity = np.full(nodes, 8.0)
    for step in range(hours * 6 + 1):
        at = START.timestamp() + step * 600.0 + 7.0
        hour = step // 6
        jump = rng.uniform(size=nodes) < 0.05 * (1.5 + np.sin(2 * np.pi * (hour % 24) / 24))
        level = np.where(jump, rng.integers(0, 9, nodes), level)
        allocated = level.copy()
        seen = np.ones(nodes, bool)
        if alter_from is not None and hour >= alter_from and step < hours * 6:
            allocated = np.minimum(np.round(allocated * 0.3 + 3), 8.0)
            if hour == alter_from + 2:
                continue  # a source outage
            if hour == alter_from:
                seen[0] = False
        record.observe(at, names[seen], pools[seen], allocated[seen], capacity[seen])
    return record


@pytest.mark.parametrize("hours", [live_idle.idle_needs(8), 140])
def test_the_node_panel_and_node_releases_ignore_data_after_the_origin(releases, hours):
    before_panel = RP.node_panel(_node_record(hours).snapshot())
    before, rules, _ = _idle_releases(releases, nodes=before_panel)
    first = min(frame.index[0] for frame in before.values())
    for dt in (0, 9):
        t = before_panel.index.get_loc(pd.Timestamp(first) + pd.Timedelta(hours=dt))
        after_panel = RP.node_panel(_node_record(hours, alter_from=t + 1).snapshot())
        assert before_panel.index.equals(after_panel.index)
        _assert_rows_equal(before_panel.values, after_panel.values, t, "node values")
        _assert_rows_equal(before_panel.capacity, after_panel.capacity, t, "node capacity")
        assert not before_panel.values.iloc[t + 1 :].equals(after_panel.values.iloc[t + 1 :])
        after, rules_after, _ = _idle_releases(releases, nodes=after_panel)
        assert _compare_up_to(before, after, before_panel.index[t]) > 0
        assert rules_after == rules


def _node_hours(hours: int, nodes: int, seed: int) -> Panel:
    """An hourly node panel (as `node_panel` gives it, nodes n00.. of pool "a"): 8-GPU nodes
    whose allocation jumps at random, more often by day."""
    names = [f"n{j:02d}" for j in range(nodes)]
    panel = jumping_panel(
        hours, names, seed=seed, start=START.tz_localize(None), name="advisor-nodes"
    )
    return dataclasses.replace(panel, meta={"pools": dict.fromkeys(names, "a")})


def _served(doc) -> list[str]:
    """The nodes whose idle windows `idle_section` computed (not left out by the node limit)."""
    return [
        e["node"]
        for e in doc["nodes"]
        if not e["windows"][0].get("reason", "").startswith("not among")
    ]


def test_node_releases_ignore_which_nodes_are_most_idle_after_the_origin(releases):
    """On a fleet over the node limit the hours after a held-back origin choose which nodes are
    served (the most idle now); the served nodes' releases at that origin stay the same, as the
    rules' pooled model and margin learn from nodes picked without those hours."""
    panel = _node_hours(live_idle.IDLE_MAX_H, 10, seed=3)
    before, _, doc = _idle_releases(releases, nodes=panel, max_nodes=5)
    chosen = _served(doc)
    assert len(chosen) == 5
    t = panel.index.get_loc(before[1].index[0]) + 5
    values = panel.values.copy()
    later = values.index > panel.index[t]
    others = [name for name in panel.series if name not in chosen]
    values.loc[later, others[:2]] = 0.0  # two nodes left out become the most idle ...
    values.loc[later, chosen[:2]] = 8.0  # ... and two computed ones full
    after, _, doc_after = _idle_releases(
        releases, nodes=Panel(values, panel.capacity, panel.name, meta=panel.meta), max_nodes=5
    )
    served_after = _served(doc_after)
    assert set(others[:2]) <= set(served_after) and not set(chosen[:2]) & set(served_after)
    both = [name for name in chosen if name in served_after]
    assert len(both) == 3
    assert _compare_up_to(before, after, panel.index[t], both) > 0


def test_the_nodes_the_pooled_rules_learn_from_are_fixed_before_the_held_back_hours():
    """`_pool_nodes`: only nodes with a reading before the held-back part, at most the limit,
    picked by name (a hash), never by the hours from the held-back part on."""
    panel = _node_hours(live_idle.IDLE_MAX_H, 10, seed=3)
    start = live_idle._held_back_start(len(panel.index), [1, 4, 8])
    values = panel.values.copy()
    values.iloc[:start, 9] = np.nan  # n09 first reports in the held-back part
    pool = live_idle._pool_nodes(Panel(values, panel.capacity, panel.name), start, 5)
    assert len(pool) == 5 and "n09" not in pool and pool != panel.series[:5]
    values.iloc[start:] = 8.0 - values.iloc[start:]
    assert live_idle._pool_nodes(Panel(values, panel.capacity, panel.name), start, 5) == pool
    assert live_idle._pool_nodes(Panel(values, panel.capacity, panel.name), start, 20) == [
        f"n{j:02d}" for j in range(9)
    ]
