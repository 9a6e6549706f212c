"""Reservations: earliest start from predicted ends, least idle GPU-hours, conflicts, quotas,
release time; and the recommend() entry point over every kind."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from advisor import snapshot
from advisor.model import ModelBuilder
from advisor.planner.check import check_plan
from advisor.planner.constraints import Policy, island_size_per_node
from advisor.planner.observed import DurationPrior, expected_end
from advisor.planner.recommend import plan_for_goal, recommend
from advisor.planner.reserve import (
    Outlook,
    Request,
    ReserveSettings,
    _node_choice,
    gpu_ready_times,
    node_ready_times,
    plan_reservations,
)
from tests.advisor._recommend_clusters import assert_checked, clusters, policies
from tests.conftest import add_nodes

T = 1_000_000.0
H = 3600.0
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def cluster(islands: bool = False):
    """Four 8-GPU A100 nodes in rack r1: n0 half busy until +1 h, n1 busy until +2 h, n2 busy
    until +5 h, n3 empty; job `big` (3 x 8 GPUs, tenant t) waits."""
    b = add_nodes(4, rack="r1", gpu_model="A100", island=4 if islands else 8)
    ends = {
        "a": ("n0", [0, 1, 2, 3], 1),
        "b": ("n1", list(range(8)), 2),
        "c": ("n2", list(range(8)), 5),
    }
    for alloc, (node, gpus, hours) in ends.items():
        b.add_allocation(
            alloc,
            num_gpu=len(gpus),
            node=node,
            gpus=gpus,
            tenant="u" if alloc == "c" else "t",
            start_time=T - 60,
            deletion_time=T + hours * H,
        )
    for task in range(3):
        b.add_allocation(f"big{task}", num_gpu=8, job="big", tenant="t", priority=5)
    return b.build(timestamp=T)


def test_earliest_start_with_least_idle_time() -> None:
    model = cluster()
    [plan] = plan_reservations(model, Policy())
    assert plan.feasible and plan.extra["job"] == "big"
    assert plan.extra["start_at"] == pytest.approx(T + 2 * H)  # when n1 frees up
    assert sorted(plan.extra["nodes"]) == ["n0", "n1", "n3"]  # n2 would wait until +5 h
    # held now: the free half of n0 and all of n3; n0's other half and n1 come later
    assert sorted(str(a.dst) for a in plan.actions) == ["n0[4,5,6,7]", "n3[0,1,2,3,4,5,6,7]"]
    later = {(s["node"], s["gpu"]): s for s in plan.extra["schedule"]}
    assert later[("n0", 0)]["hold_from"] == pytest.approx(T + H) and later[("n0", 0)]["after"] == [
        "a"
    ]
    assert later[("n1", 7)]["hold_from"] == pytest.approx(T + 2 * H)
    # idle while waiting: 4 x 2 h + 4 x 1 h on n0, 8 x 2 h on n3
    assert plan.extra["idle_gpu_hours"] == pytest.approx(28.0)
    assert plan.extra["release"]["if_not_started_by"] == pytest.approx(T + 2 * H + 1800)
    assert plan.extra["ends_from"] == "known end times"
    assert check_plan(model, plan.actions, Policy(), 5).ok
    assert all(a.rack_local and a.priority == 5 for a in plan.actions)
    # holding GPUs idle loses no work: its cost is held-idle GPU-hours (the free-now GPUs from
    # now to the start: 4 x 2 h on n0, 8 x 2 h on n3), not GPU-hours lost
    assert plan.cost.gpu_hours == 0 and plan.cost.restarts == 0
    assert plan.cost.idle_gpu_hours == pytest.approx(24.0)
    assert plan.to_dict()["cost"]["idle_gpu_hours"] == pytest.approx(24.0)


def test_fits_now_needs_no_reservation_and_single_node_islands() -> None:
    model = cluster(islands=True)
    assert plan_reservations(model, Policy(), [Request("small", "t", 1, 1, 8)]) == []
    # a 4-GPU job when no 4 are free in one island until n0's busy island frees at +1 h
    b = add_nodes(["x"], gpu_model="A100", island=4)
    b.add_allocation("p", num_gpu=2, node="x", gpus=[0, 1], deletion_time=T + H, start_time=T)
    b.add_allocation("q", num_gpu=1, node="x", gpus=[4], deletion_time=T + 3 * H, start_time=T)
    m = b.build(timestamp=T)
    [plan] = plan_reservations(m, Policy(), [Request("four", "t", 1, 1, 4)])
    assert plan.extra["start_at"] == pytest.approx(T + H)
    held = {g for a in plan.actions for g in a.dst.gpus} | {
        s["gpu"] for s in plan.extra["schedule"]
    }
    assert held == {0, 1, 2, 3}
    # without the island rule, 4 GPUs are free now (2, 3, 5, 6 ...): nothing to hold
    assert (
        plan_reservations(m, Policy(island_locality=False), [Request("four", "t", 1, 1, 4)]) == []
    )


def test_conflict_between_reservations_and_with_quota() -> None:
    model = cluster()
    first = Request("first", "t", 9, 3, 8)
    second = Request("second", "u", 3, 1, 8, duration_s=4 * H)
    plans = plan_reservations(model, Policy(), [second, first])
    by_job = {p.extra["job"]: p for p in plans}
    assert by_job["first"].extra["start_at"] == pytest.approx(T + 2 * H)
    # `second` fits n3 now, but n3 is held for `first` (higher priority, planned first); it
    # starts when n2 frees at +5 h, and says who delayed it
    assert by_job["second"].extra["start_at"] == pytest.approx(T + 5 * H)
    [conflict] = by_job["second"].extra["conflicts"]
    assert conflict["with"] == ["first"] and conflict["delay_s"] == pytest.approx(5 * H)
    together = [a for p in plans for a in p.actions]
    assert check_plan(model, together, Policy()).ok
    # quota: t holds nothing at +2 h (a, b ended) but 24 GPUs exceed a quota of 20
    [plan] = plan_reservations(model, Policy(quotas={("t", ""): 20.0}))
    assert not plan.feasible and not plan.actions
    assert "quota" in plan.reason and "24" in plan.reason and "borrow" in plan.reason


def test_forecast_ends_and_demand() -> None:
    model = cluster()
    outlook = Outlook(job_end={"c": T + 0.5 * H}, demand=(Request("later", "u", 1, 1, 8),))
    plans = plan_for_goal(model, Policy(), "reserve", outlook)
    big = next(p for p in plans if p.extra["job"] == "big")
    assert big.extra["start_at"] == pytest.approx(T + H)  # n2 now frees at +0.5 h
    assert big.extra["ends_from"] == "forecast job ends"
    assert plan_for_goal(model, Policy(), "reserve=big")[0].extra["job"] == "big"
    assert not plan_for_goal(model, Policy(), "reserve=nope")[0].feasible


def test_duration_prior() -> None:
    prior = DurationPrior(median_s=4 * H)
    mean = math.sqrt(2) * 4 * H
    assert prior.remaining(np.array([np.nan]))[0] == pytest.approx(mean)
    assert prior.remaining(np.array([0.0]))[0] == pytest.approx(mean)
    assert prior.remaining(np.array([10 * H]))[0] == pytest.approx(10 * H)  # heavy tail
    b = ModelBuilder()
    b.add_node("n", gpu_model="A100")
    b.add_gpu("n", 0)
    b.add_allocation("x", num_gpu=1, node="n", gpus=[0], start_time=T - 8 * H)
    b.add_allocation("y", num_gpu=0)
    m = b.build(timestamp=T)
    ends = expected_end(m, prior)
    assert ends[0] == pytest.approx(T + 8 * H)
    assert expected_end(m, prior, {"x": T + 5.0})[0] == pytest.approx(T + 5.0)


def test_recommend_runs_every_kind_on_the_seeds() -> None:
    share = snapshot.load(EXAMPLES / "seed-share-16gb.json")
    assert [p.method for p in recommend(share)] == ["share"]
    mixed = snapshot.load(EXAMPLES / "seed-mixed-fleet.json")
    methods = [p.method for p in recommend(mixed)]
    assert "rebalance" in methods and "reserve" in methods
    for plan in recommend(mixed):
        assert_checked(mixed, plan, Policy())


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
@given(
    m=clusters(),
    policy=policies(),
    arrival=st.sampled_from([None, 0.0, H, 6 * H]),
    size=st.sampled_from([(1, 4), (1, 8), (2, 8)]),
)
def test_every_recommended_plan_passes_the_check(m, policy, arrival, size) -> None:
    """Waiting jobs of the model plus, sometimes, one the forecast expects."""
    demand = (
        []
        if arrival is None
        else [
            {
                "job": "fc",
                "tenant": "a",
                "priority": 50,
                "tasks": size[0],
                "num_gpu": size[1],
                "expected_at": T + arrival,
            }
        ]
    )
    plans = recommend(m, policy, {"job_end": {}, "demand": demand})
    for plan in plans:
        assert_checked(m, plan, policy)
        assert "milli free" not in plan.reason  # a reservation never takes an earlier one's GPUs
        json.dumps(plan.to_dict())  # the JSON document of `gpu-defrag plan --json`
    held = [a for p in plans if p.method == "reserve" for a in p.actions]
    assert check_plan(m, held, policy).ok  # the reservations hold together, too


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
@given(m=clusters(), k=st.sampled_from([1, 2, 3, 4, 8]), islands=st.booleans())
def test_vectorised_node_times_match_the_per_node_choice(m, k, islands) -> None:
    ready = gpu_ready_times(m, expected_end(m))
    sizes = island_size_per_node(m) if islands else None
    fast = node_ready_times(m, ready, k, sizes)
    for node in range(len(m.nodes)):
        choice = _node_choice(m, ready, node, k, int(sizes[node]) if islands else 0, None)
        assert fast[node] == (np.inf if choice is None else pytest.approx(choice[0]))


def test_forecast_job_is_held_from_its_arrival_on_the_gpus_freeing_closest() -> None:
    model = cluster()
    expected = Request("forecast-8", "u", 1, 1, 8, expected_at=T + 3 * H)
    [plan] = plan_reservations(model, Policy(), [expected])
    assert plan.feasible and plan.extra["start_at"] == pytest.approx(T + 3 * H)
    # n1 frees at +2 h, closest to the arrival: nothing is held now, nothing idles before +3 h
    assert plan.extra["nodes"] == ["n1"] and not plan.actions
    assert [s["hold_from"] for s in plan.extra["schedule"]] == [pytest.approx(T + 3 * H)] * 8
    assert plan.extra["idle_gpu_hours"] == pytest.approx(0.0)
    assert plan.extra["conflicts"] == []
    # held an hour ahead: 8 GPUs x 1 h idle
    [early] = plan_reservations(
        model, Policy(), [expected], settings=ReserveSettings(hold_lead_s=H)
    )
    assert early.extra["idle_gpu_hours"] == pytest.approx(8.0)


def test_a_standing_reservation_is_renewed_from_what_it_holds() -> None:
    """A reservation that has gathered GPUs is renewed from them, not started again elsewhere:
    the GPUs its placeholders hold are its own (ready now), the rest of the node cordoned for
    it frees as its tasks end, and no other job is offered them."""
    b = add_nodes(["n0", "n1"], rack="r1", gpu_model="A100")
    add_nodes(["n2"], builder=b, rack="r1", gpu_model="A100", schedulable=False)  # held for big
    add_nodes(["n3"], builder=b, rack="r1", gpu_model="A100")
    for alloc, node, hours in (("a", "n0", 2), ("b", "n1", 3), ("c", "n3", 4)):
        b.add_allocation(
            alloc, num_gpu=8, node=node, gpus=range(8), start_time=T - 60,
            deletion_time=T + hours * H,
        )  # fmt: skip
    # big's reservation holds four GPUs of n2; the other four run a task until +1 h
    b.add_allocation(
        "reserve:big:n2", num_gpu=4, node="n2", gpus=[0, 1, 2, 3], job="big", qos="reservation",
        migratable=False,
    )  # fmt: skip
    b.add_allocation(
        "d", num_gpu=4, node="n2", gpus=[4, 5, 6, 7], start_time=T - 60, deletion_time=T + H
    )
    for task in range(2):
        b.add_allocation(f"big{task}", num_gpu=8, job="big", tenant="t", priority=5)
    b.add_allocation("other0", num_gpu=8, job="other", tenant="t", priority=1)
    model = b.build(timestamp=T)

    plans = {p.extra["job"]: p for p in plan_reservations(model, Policy())}
    big, other = plans["big"], plans["other"]
    # without its hold (n2 cordoned) big would start at +3 h on n0 and n1, starting again
    # from nothing; with it, n2 is its own, ready at +1 h, and big starts at +2 h with n0
    assert sorted(big.extra["nodes"]) == ["n0", "n2"]
    assert big.extra["start_at"] == pytest.approx(T + 2 * H)
    held = [s for s in big.extra["schedule"] if s["node"] == "n2"]
    assert {s["gpu"]: s["hold_from"] for s in held} == {
        **{g: pytest.approx(T) for g in range(4)},
        **{g: pytest.approx(T + H) for g in range(4, 8)},
    }
    assert all(s["after"] == ["reserve:big:n2"] for s in held if s["gpu"] < 4)
    assert "n2" not in other.extra["nodes"]
    # the placeholder is no idle allocation to reclaim
    from advisor.planner.reclaim import idle_allocations

    assert all(row["alloc"] != "reserve:big:n2" for row in idle_allocations(model))
