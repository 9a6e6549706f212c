"""The dynamic replay on small hand-built traces whose waits are known by hand: departures free
GPUs, priority order, Kubernetes-style backfill, gangs that start whole, load compression; the
defragmenters and the advisor in the loop on cases where acting clearly helps."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from advisor.ingest.openb import NodeTable
from advisor.placement.state import MILLI, ClusterState
from advisor.simulate.defrag import ConsolidateWhenBlocked, HighNodeUtilization
from advisor.simulate.engine import Controller, Simulation
from advisor.simulate.jobs import JobTable, compress, offered_load, repeat
from advisor.simulate.metrics import by_size_rows, summary_row
from advisor.simulate.operator import AdvisorOperator
from advisor.simulate.schedulers import make_scheduler


def nodes(count: int, gpus: int = 8, racks: list[str] | None = None) -> NodeTable:
    return NodeTable(
        name=np.array([f"n{i}" for i in range(count)], dtype=object),
        cpu_milli=np.full(count, 64_000, dtype=np.int64),
        memory_mib=np.full(count, 512_000, dtype=np.int64),
        gpu=np.full(count, gpus, dtype=np.int64),
        model=np.array(["A100"] * count, dtype=object),
        rack=None if racks is None else np.array(racks, dtype=object),
    )


def jobs(rows: list[dict[str, Any]]) -> JobTable:
    """Rows of name, t (submit), d (duration), g (GPUs per task), k (tasks), m (milli), p."""
    n = len(rows)

    def col(key: str, default: float, dtype: type) -> np.ndarray:
        return np.array([r.get(key, default) for r in rows], dtype=dtype)

    return JobTable(
        name=np.array([r["name"] for r in rows], dtype=object),
        submit_s=col("t", 0.0, np.float64),
        duration_s=col("d", 3600.0, np.float64),
        num_nodes=col("k", 1, np.int64),
        num_gpu=col("g", 1, np.int64),
        gpu_milli=col("m", MILLI, np.int64),
        cpu_milli=col("cpu", 1000, np.int64),
        memory_mib=col("mem", 1000, np.int64),
        gpu_spec=np.array([""] * n, dtype=object),
        tenant=np.array(["team"] * n, dtype=object),
        priority=col("p", 0, np.int64),
        utilization=col("u", math.nan, np.float64),
        restart_s=np.full(n, math.nan),
        migratable=np.ones(n, dtype=bool),
    )


def simulate(
    table: JobTable,
    cluster: NodeTable,
    policy: str = "mostallocated",
    controller: Controller | None = None,
    budget: float = 0.01,
) -> Simulation:
    state = ClusterState.from_nodes(cluster)
    rng = np.random.default_rng(0)
    scheduler = make_scheduler(policy, table)
    scheduler.attach(state, rng)
    sim = Simulation(
        table,
        state,
        scheduler,
        np.arange(len(cluster)),
        rng,
        controller=controller,
        migration_budget=budget,
        racks=cluster.rack,
        pools=cluster.pool,
    )
    sim.run()
    return sim


def waits(sim: Simulation) -> dict[str, float]:
    return dict(zip(sim.jobs.name.tolist(), sim.waits().tolist(), strict=True))


def test_a_departure_frees_the_gpus_the_next_jobs_take() -> None:
    sim = simulate(
        jobs(
            [
                {"name": "a", "t": 0, "d": 100, "g": 8},
                {"name": "b", "t": 10, "d": 50, "g": 4},
                {"name": "c", "t": 20, "d": 50, "g": 4},
            ]
        ),
        nodes(1),
    )
    assert waits(sim) == {"a": 0.0, "b": 90.0, "c": 80.0}
    assert sim.end[1] == 150.0 and sim.end[2] == 150.0


def test_priority_goes_first_then_submission_order() -> None:
    sim = simulate(
        jobs(
            [
                {"name": "a", "t": 0, "d": 100, "g": 4},
                {"name": "low", "t": 10, "d": 50, "g": 4},
                {"name": "high", "t": 20, "d": 30, "g": 4, "p": 10},
                {"name": "low2", "t": 30, "d": 50, "g": 4},
            ]
        ),
        nodes(1, gpus=4),
    )
    # at 100 the higher priority starts first; then FIFO among equals: low before low2
    assert waits(sim) == {"a": 0.0, "high": 80.0, "low": 120.0, "low2": 150.0}


def test_kubernetes_backfill_lets_small_jobs_pass_a_blocked_one() -> None:
    sim = simulate(
        jobs(
            [
                {"name": "a", "t": 0, "d": 100, "g": 6},
                {"name": "big", "t": 1, "d": 10, "g": 8},
                {"name": "small", "t": 2, "d": 10, "g": 2},
                {"name": "big2", "t": 3, "d": 10, "g": 8},
            ]
        ),
        nodes(1),
    )
    # the small job starts at once beside `a`; `big` waits for `a`, then `big2` for `big`
    assert waits(sim) == {"a": 0.0, "big": 99.0, "small": 0.0, "big2": 107.0}


def test_a_gang_starts_whole_or_not_at_all() -> None:
    sim = simulate(
        jobs(
            [
                {"name": "a", "t": 0, "d": 100, "g": 4},
                {"name": "gang", "t": 1, "d": 50, "g": 8, "k": 2},
                {"name": "b", "t": 2, "d": 10, "g": 4},
            ]
        ),
        nodes(2),
    )
    w = waits(sim)
    assert w["gang"] == 99.0  # one node was free the whole time: no task of it started alone
    assert w["b"] == 0.0
    placement_nodes = {n for n, _ in sim.placement[1] or []} or {0, 1}
    assert len(placement_nodes) == 2
    # never more than 8 GPUs allocated before the gang starts (a, b: 8 GPUs on 2 nodes)
    before = [alloc for t, alloc, _, _ in sim.timeline if t < 100]
    assert max(before) <= 8.0


def test_a_gang_stays_in_one_rack_when_racks_are_known() -> None:
    sim = simulate(
        jobs(
            [
                {"name": "a", "t": 0, "d": 100, "g": 8},  # fills n0 (rack r1)
                {"name": "gang", "t": 1, "d": 50, "g": 8, "k": 2},
            ]
        ),
        nodes(3, racks=["r1", "r1", "r2"]),
    )
    # n1 and n2 are free but in two racks: the gang waits for n0 to free
    assert waits(sim)["gang"] == 99.0
    assert {n for n, _ in sim.placement[1] or []} <= {0, 1} or sim.status[1] == 3


def test_sharing_jobs_share_a_gpu() -> None:
    sim = simulate(
        jobs(
            [
                {"name": "half1", "t": 0, "d": 100, "g": 1, "m": 500},
                {"name": "half2", "t": 1, "d": 100, "g": 1, "m": 500},
                {"name": "whole", "t": 2, "d": 100, "g": 1},
            ]
        ),
        nodes(1, gpus=1),
    )
    assert waits(sim) == {"half1": 0.0, "half2": 0.0, "whole": 99.0}  # half2 ends at 101


def test_a_job_no_node_can_ever_hold_is_not_a_wait() -> None:
    sim = simulate(
        jobs([{"name": "ok", "t": 0, "g": 4}, {"name": "huge", "t": 1, "g": 16}]), nodes(2)
    )
    assert sim.never_fits.tolist() == [False, True]
    row = summary_row(sim, "mostallocated", "off", 0)
    assert row["jobs"] == 1


def test_summary_and_sizes_from_a_hand_built_trace() -> None:
    sim = simulate(
        jobs(
            [
                {"name": "a", "t": 0, "d": 3600, "g": 8},
                {"name": "b", "t": 0, "d": 3600, "g": 8},  # waits 1 h for a
                {"name": "c", "t": 0, "d": 3600, "g": 1, "m": 500},  # after b: FIFO
            ]
        ),
        nodes(1),
    )
    row = summary_row(sim, "mostallocated", "off", 0)
    assert row["jobs"] == 3
    assert row["wait_p90_s_big"] == pytest.approx(3240.0)  # p90 of (0, 3600)
    assert row["wait_gpu_hours"] == pytest.approx(9.0)  # b: 8 GPUs x 1 h, c: 0.5 x 2 h
    sizes = {r["size_gpus"]: r for r in by_size_rows(sim, "mostallocated", "off", 0)}
    assert sizes["8"]["jobs"] == 2 and sizes["8"]["wait_max_s"] == 3600.0
    assert sizes["<1"]["wait_max_s"] == 7200.0


# --------------------------------------------------------------------------- load


def test_offered_load_counts_each_job_for_at_most_the_window() -> None:
    table = jobs([{"name": "a", "t": 0, "d": 100}, {"name": "b", "t": 1000, "d": 5000}])
    # window 1000 s: 100 + 1000 GPU-seconds over 1 GPU x 1000 s
    assert offered_load(table, 1.0) == pytest.approx(1.1)


def test_compression_scales_submissions_to_the_load_by_hand() -> None:
    table = jobs([{"name": "a", "t": 0, "d": 100}, {"name": "b", "t": 1000, "d": 100}])
    scaled, factor, copies = compress(table, 1.0, 1.0)
    # 2 x min(100, W) / W = 1  ->  W = 200: the 1000 s span becomes 200 s
    assert copies == 1
    assert factor == pytest.approx(0.2, rel=1e-6)
    assert scaled.submit_s.tolist() == pytest.approx([0.0, 200.0], rel=1e-6)
    assert scaled.duration_s.tolist() == [100.0, 100.0]
    assert offered_load(scaled, 1.0) == pytest.approx(1.0, rel=1e-6)


def test_a_list_asking_for_too_few_gpus_is_repeated_first() -> None:
    table = jobs([{"name": "a", "t": 0, "d": 100}, {"name": "b", "t": 1000, "d": 100}])
    scaled, _, copies = compress(table, 1.0, 4.0)
    # 2 GPUs in all cannot offer 4: three copies (6 GPUs), then 6 min(100, W) / 4W = 1
    assert copies == 3
    assert len(scaled) == 6
    assert scaled.name.tolist()[2:4] == ["a~1", "b~1"]
    assert float(scaled.submit_s.max() - scaled.submit_s.min()) == pytest.approx(150.0)
    assert offered_load(scaled, 4.0) == pytest.approx(1.0, rel=1e-6)


def test_repeat_keeps_the_order_of_submissions() -> None:
    table = jobs([{"name": "a", "t": 0}, {"name": "b", "t": 10}])
    copied = repeat(table, 2)
    assert copied.submit_s.tolist() == [0.0, 10.0, 20.0, 30.0]


@pytest.mark.parametrize("load", [0.0, -1.0, math.inf, math.nan])
def test_a_load_that_cannot_be_reached_is_refused(load: float) -> None:
    with pytest.raises(ValueError, match="--load"):
        compress(jobs([{"name": "a", "t": 0}, {"name": "b", "t": 10}]), load, 1.0)


def test_jobs_submitted_at_one_instant_cannot_be_compressed() -> None:
    with pytest.raises(ValueError, match="one instant"):
        compress(jobs([{"name": "a", "t": 5}, {"name": "b", "t": 5}]), 1.0, 1.0)


# --------------------------------------------------------------------------- acting


def spread(small: int) -> list[dict[str, Any]]:
    """`small` long 2-GPU jobs, the first ending at 10 h (LeastAllocated spreads them: 8 are
    two per node of four nodes of 8 GPUs)."""
    return [
        {"name": f"small{i}", "t": float(i), "d": 36_000.0 + 3600 * i, "g": 2} for i in range(small)
    ]


def spread_then_big(extra: list[dict[str, Any]] | None = None, small: int = 8) -> JobTable:
    """`spread(small)`, then an 8-GPU job, `big`, that no node can take for hours."""
    rows = [*spread(small), {"name": "big", "t": 100.0, "d": 3600.0, "g": 8}]
    return jobs(rows + (extra or []))


def test_consolidate_when_blocked_moves_pods_and_starts_the_job() -> None:
    off = simulate(spread_then_big(), nodes(4), "leastallocated")
    kai = ConsolidateWhenBlocked(every_s=60.0)
    on = simulate(spread_then_big(), nodes(4), "leastallocated", kai, budget=1.0)
    assert waits(off)["big"] > 10 * 3600
    assert waits(on)["big"] == pytest.approx(20.0)  # the first tick after it arrived
    assert len(on.moves) == 2 and kai.started == 1
    assert on.restart_gpu_s == pytest.approx(2 * 300.0 * 2)  # two 2-GPU jobs restart once


def test_consolidate_when_blocked_keeps_a_gang_in_one_rack() -> None:
    """n3 (rack r2) is empty; 2-GPU jobs sit on n0 (r1) and n2 (r2), a 4-GPU one on n1 (r1).
    Clearing n0 beside n3 moves the least, but crosses racks: the gang goes to r2, n2 cleared."""
    table = jobs(
        [
            {"name": "s0", "t": 0.0, "d": 36_000.0, "g": 2},
            {"name": "s1", "t": 1.0, "d": 36_000.0, "g": 4},
            {"name": "s2", "t": 2.0, "d": 36_000.0, "g": 2},
            {"name": "gang", "t": 100.0, "d": 3600.0, "g": 8, "k": 2},
        ]
    )
    cluster = nodes(4, racks=["r1", "r1", "r2", "r2"])
    kai = ConsolidateWhenBlocked(every_s=60.0)
    sim = simulate(table, cluster, "leastallocated", kai, budget=1.0)
    assert kai.started == 1 and len(sim.moves) == 1
    assert {cluster.rack[n] for n, _ in sim.placement[3] or []} == {"r2"}


def test_consolidate_when_blocked_tries_the_next_rack_within_the_budget() -> None:
    """Rack r1 has the cheapest node (n0, one 1-GPU job) but clearing it and n1 (two 2-GPU
    jobs) takes 3 moves; rack r2 (a 3-GPU job on each node) takes 2, all the budget allows."""
    table = jobs(
        [
            {"name": "fill", "t": 0.0, "d": 50.0, "g": 7},  # keeps n0 busy while the rest land
            {"name": "a2", "t": 1.0, "d": 36_000.0, "g": 2},
            {"name": "b3", "t": 2.0, "d": 36_000.0, "g": 3},
            {"name": "c3", "t": 3.0, "d": 36_000.0, "g": 3},
            {"name": "d2", "t": 4.0, "d": 36_000.0, "g": 2},
            {"name": "e1", "t": 60.0, "d": 36_000.0, "g": 1},
            {"name": "gang", "t": 100.0, "d": 3600.0, "g": 8, "k": 2},
        ]
    )
    cluster = nodes(4, racks=["r1", "r1", "r2", "r2"])
    kai = ConsolidateWhenBlocked(every_s=60.0)
    sim = simulate(table, cluster, "leastallocated", kai, budget=0.4)  # 6 placed: 2 moves
    assert {n for n, _ in sim.placement[1] or []} == {1} and sim.placement[5][0][0] == 0
    assert kai.started == 1 and len(sim.moves) == 2
    assert {cluster.rack[n] for n, _ in sim.placement[6] or []} == {"r2"}
    assert waits(sim)["gang"] < 3600.0


def test_moves_respect_the_daily_budget() -> None:
    on = simulate(spread_then_big(), nodes(4), "leastallocated", ConsolidateWhenBlocked(60.0))
    assert len(on.moves) == 0  # 9 tasks placed: 1 % allows none
    assert waits(on)["big"] > 10 * 3600


def test_high_node_utilization_empties_underused_nodes() -> None:
    table = jobs(
        [
            {"name": "fill", "t": 0, "d": 10_000, "g": 7},
            {"name": "lonely", "t": 1, "d": 10_000, "g": 1},
            {"name": "later", "t": 500, "d": 10, "g": 1},  # the replay runs till it starts
        ]
    )
    # LeastAllocated put `lonely` on the empty node; the descheduler moves it beside `fill`
    sim = simulate(table, nodes(2), "leastallocated", HighNodeUtilization(60.0), budget=1.0)
    assert len(sim.moves) == 1
    assert {n for n, _ in sim.placement[1] or [(None, [])]} in ({0}, set())


def test_the_advisor_in_the_loop_starts_a_blocked_big_job_by_consolidation() -> None:
    operator = AdvisorOperator(every_s=60.0, default_restart_s=300.0)
    on = simulate(spread_then_big(), nodes(4), "leastallocated", operator, budget=1.0)
    off = simulate(spread_then_big(), nodes(4), "leastallocated")
    assert waits(off)["big"] > 10 * 3600
    assert waits(on)["big"] <= 60.0
    assert operator.stats.consolidations >= 1 and len(on.moves) == 2
    assert operator.adapter is not None and operator.adapter.calls >= 1


def test_two_jobs_of_one_shape_start_in_one_tick_with_no_moves_for_taken_gpus() -> None:
    """Two 8-GPU jobs of one shape wait on six nodes of spread 2-GPU jobs. One run plans both
    consolidations on the same cluster, so both name the same node; once the first is applied
    that node is held for the first job, and the second plan's moves would start nothing. The
    advisor runs again in the same tick, on the cluster the first plan left, for the second."""
    table = spread_then_big([{"name": "big1", "t": 101.0, "g": 8}], small=12)
    operator = AdvisorOperator(every_s=60.0, default_restart_s=300.0)
    sim = simulate(table, nodes(6), "leastallocated", operator, budget=1.0)
    assert waits(sim)["big"] == pytest.approx(20.0)  # the first tick after it arrived
    assert waits(sim)["big1"] == pytest.approx(19.0)  # the same tick, planned again
    assert operator.stats.consolidations == 2 and operator.stats.again >= 1
    assert operator.stats.skipped_taken >= 1  # plans naming GPUs held for the other job
    assert len(sim.moves) == 4  # two per job; none spent on the plan that named taken GPUs


def test_a_repeated_run_plans_for_the_jobs_still_waiting_not_the_one_just_started() -> None:
    """Three 8-GPU jobs of one shape. Before a run is repeated the scheduler starts the job the
    last run made room for, so the next run's goals name the jobs still waiting: all three
    start in the tick after they arrive. (Had the started job still shown as waiting, the
    third run's two goals would both name jobs already served, and the third job would wait
    for the next tick.)"""
    extra = [{"name": "big1", "t": 101.0, "g": 8}, {"name": "big2", "t": 102.0, "g": 8}]
    table = spread_then_big(extra, small=12)
    operator = AdvisorOperator(every_s=60.0, default_restart_s=300.0)
    sim = simulate(table, nodes(6), "leastallocated", operator, budget=1.0)
    assert [waits(sim)[j] for j in ("big", "big1", "big2")] == pytest.approx([20.0, 19.0, 18.0])
    assert operator.stats.consolidations == 3 and operator.stats.again >= 2
    assert len(sim.moves) == 6  # two per job


def test_with_one_run_a_tick_the_second_job_of_a_shape_waits_for_the_next_tick() -> None:
    """`runs_per_tick=1` is the operator before runs were repeated: the second job waits for
    the next tick."""
    table = spread_then_big([{"name": "big1", "t": 101.0, "g": 8}], small=12)
    operator = AdvisorOperator(every_s=60.0, default_restart_s=300.0, runs_per_tick=1)
    sim = simulate(table, nodes(6), "leastallocated", operator, budget=1.0)
    assert waits(sim)["big1"] == pytest.approx(79.0)
    assert operator.stats.again == 0


def test_moves_wait_for_a_low_demand_window_when_the_waiting_job_is_small() -> None:
    """Twelve 2-GPU jobs leave 2 GPUs free on each of four nodes; a 4-GPU job waits. One move
    would start it, but a job smaller than `BIG_GPUS` starts once churn frees one node's GPUs:
    the plan is served, and kept for a low-demand window (none is forecast this early)."""
    table = jobs([*spread(12), {"name": "mid", "t": 100.0, "d": 3600.0, "g": 4}])
    operator = AdvisorOperator(every_s=60.0, default_restart_s=300.0)
    sim = simulate(table, nodes(4), "leastallocated", operator, budget=1.0)
    assert not sim.moves and operator.stats.consolidations == 0
    assert operator.stats.small_waiting >= 1  # the shape's plan, served for `mid`
    assert operator.stats.skipped_window >= 1  # and not applied now
    assert waits(sim)["mid"] == pytest.approx(36_000.0 - 100.0)  # the first small job's end


def test_a_consolidation_over_the_budget_is_counted_and_why() -> None:
    """The big job's plan moves two tasks; 9 tasks placed that day: 1 % allows none (the
    budget is spent), 15 % allows one (the plan asks for more than is left)."""
    spent = AdvisorOperator(every_s=60.0, default_restart_s=300.0)
    on = simulate(spread_then_big(), nodes(4), "leastallocated", spent, budget=0.01)
    assert len(on.moves) == 0 and spent.stats.skipped_budget >= 1
    assert spent.stats.budget_spent == spent.stats.skipped_budget
    short = AdvisorOperator(every_s=60.0, default_restart_s=300.0)
    simulate(spread_then_big(), nodes(4), "leastallocated", short, budget=0.15)
    assert short.stats.skipped_budget > short.stats.budget_spent


def test_the_advisor_holds_gpus_for_a_big_job_small_ones_would_starve() -> None:
    """One node; short 1-GPU jobs keep arriving, so under Kubernetes' backfill its 8 GPUs are
    never all free at once and the 8-GPU job waits until the stream ends. The advisor reserves
    the node: GPUs are held as they free, and the job starts once the last one is held."""
    stream = [{"name": f"s{i}", "t": 30.0 * i, "d": 240.0, "g": 1} for i in range(60)]
    table = jobs([*stream, {"name": "big", "t": 600.0, "d": 600.0, "g": 8}])
    off = simulate(table, nodes(1), "mostallocated")
    operator = AdvisorOperator(every_s=60.0, default_restart_s=300.0)
    on = simulate(table, nodes(1), "mostallocated", operator)
    assert waits(off)["big"] == 59 * 30.0 + 240.0 - 600.0  # until the stream is over
    assert waits(on)["big"] < 600.0
    assert operator.stats.reservations >= 1 and on.held_area > 0
    assert not on.moves


def test_the_advisor_is_not_run_again_while_nothing_changes() -> None:
    """A big job waits 3 h behind one long job on the only node; nothing arrives or ends in
    between, so after its first runs the operator reuses the answer, except once an hour (the
    forecast's step), and every tick is either a run or a reuse."""
    table = jobs([{"name": "long", "g": 4, "d": 3 * 3600.0}, {"name": "big", "t": 1.0, "g": 8}])
    operator = AdvisorOperator(every_s=60.0, default_restart_s=300.0)
    sim = simulate(table, nodes(1), "mostallocated", operator)
    assert waits(sim)["big"] == 3 * 3600.0 - 1.0
    assert operator.adapter is not None
    ticks = operator.stats.calls + operator.stats.reused
    assert ticks >= 179
    assert 3 <= operator.stats.calls <= 12
    assert operator.adapter.calls == operator.stats.calls


def test_a_plan_on_a_gpu_model_the_job_does_not_allow_is_not_applied() -> None:
    """The cluster would refuse it (node affinity): the operator counts it by method instead
    of starting the job there."""
    cluster = nodes(2)
    cluster.model[1] = "V100"
    table = jobs([{"name": "big", "g": 8, "d": 60.0}])
    table.gpu_spec[0] = "A100"
    sim = simulate(table, cluster)
    operator = AdvisorOperator(every_s=60.0, default_restart_s=300.0)
    plan = {"method": "reserve"}
    assert operator._models_allowed(sim, 0, {0: list(range(8))}, plan)
    assert not operator._models_allowed(sim, 0, {1: list(range(8))}, plan)
    assert operator.stats.wrong_model == {"reserve": 1}


def test_a_consolidation_is_not_said_to_start_a_job_its_gpu_model_excludes() -> None:
    """A configured shape (`job=8`, any model) makes room on an A100 node; the first waiting
    8-GPU job asks for V100s, so the plan does not start it (it would name it before)."""
    from advisor.planner.timing import waiting_on
    from advisor.simulate.advisor_adapter import _static_columns, model_of

    cluster = nodes(2)
    cluster.model[1] = "V100"
    table = jobs([{"name": "a", "g": 1}, {"name": "v", "g": 1}, {"name": "big", "t": 1.0, "g": 8}])
    table.gpu_spec[:] = ["A100", "V100", "V100"]
    seen: list[Any] = []

    class Look:
        name, every_s = "look", 60.0

        def tick(self, sim: Simulation, now: float) -> None:
            if not seen:
                seen.append(model_of(sim, now, _static_columns(sim)))

    simulate(table, cluster, controller=Look())
    model = seen[0]

    def plan(node: str) -> dict[str, Any]:
        action = {"kind": "reserve", "to": {"node": node, "gpus": list(range(8))}}
        return {"goal": "job=8", "actions": [action]}

    assert waiting_on(plan("n0"), model) == ("", 0.0)
    assert waiting_on(plan("n1"), model) == ("big", 8.0)


def test_a_reservation_that_outlives_its_planned_start_is_renewed_not_started_again() -> None:
    """A 2 x 8 gang waits behind two 1-GPU jobs that run far longer than the advisor expects,
    so its planned start passes with the job still waiting. Each run sees the GPUs the
    reservation holds and renews it from them: one reservation whose holds are kept (released
    at the planned start, its 14 held GPUs were let go and gathered again, as before this
    rule), and the gang starts as the second long job ends."""
    stream = [{"name": f"s{i}", "t": 600.0 * i, "d": 300.0, "g": 1} for i in range(72)]
    longs = [{"name": "l0", "d": 10 * 3600.0, "g": 1}, {"name": "l1", "d": 12 * 3600.0, "g": 1}]
    table = jobs([*longs, *stream, {"name": "big", "t": 60.0, "g": 8, "k": 2}])
    operator = AdvisorOperator(every_s=60.0, default_restart_s=300.0)
    on = simulate(table, nodes(2), "mostallocated", operator)
    assert waits(on)["big"] == 12 * 3600.0 - 60.0
    assert operator.stats.reservations == 1 and operator.stats.renewals >= 1
    assert not on.moves


def test_why_big_jobs_wait_capacity_or_fragmentation() -> None:
    """An 8-GPU job behind 4 busy GPUs of the only node lacks the GPUs altogether (capacity:
    no move could start it); behind 4 busy GPUs on each of two nodes it has 8 free GPUs in
    all, scattered (fragmentation). Its wait is counted under that cause, about to the minute."""
    busy = [{"name": "a", "g": 4, "d": 3600.0}, {"name": "b", "g": 4, "d": 3600.0}]
    big = {"name": "big", "t": 1.0, "g": 8, "d": 60.0}
    one = simulate(jobs([busy[0], big]), nodes(1))
    two = simulate(jobs([*busy, big]), nodes(2), "leastallocated")
    assert waits(one)["big"] == waits(two)["big"] == 3599.0
    assert one.big_wait_s["fragmentation"] == 0.0
    assert one.big_wait_s["capacity"] == pytest.approx(3599.0, abs=60.0)
    assert two.big_wait_s["capacity"] == 0.0
    assert two.big_wait_s["fragmentation"] == pytest.approx(3599.0, abs=60.0)
    assert summary_row(one, "m", "off", 0)["big_wait_capacity_pct"] == 100.0
    assert summary_row(two, "l", "off", 0)["big_wait_capacity_pct"] == 0.0


def test_one_reservation_stands_at_a_time_for_the_head_of_the_queue() -> None:
    """Two 8-GPU jobs wait on two nodes kept busy by a stream of 1-GPU jobs. As Slurm's EASY
    backfill, the operator holds GPUs for the head of the queue only: the second job gets its
    reservation once the first has started, so held GPUs never sit idle for two jobs at once."""
    stream = [{"name": f"s{i}", "t": 15.0 * i, "d": 240.0, "g": 1} for i in range(240)]
    bigs = [{"name": "big", "t": 600.0, "g": 8, "d": 600.0}, {"name": "big2", "t": 610.0, "g": 8}]
    table = jobs([*stream, *bigs])

    class Watch(AdvisorOperator):
        most = 0

        def tick(self, sim: Simulation, now: float) -> None:
            super().tick(sim, now)
            Watch.most = max(Watch.most, len(sim.reservations))

    operator = Watch(every_s=60.0, default_restart_s=300.0)
    on = simulate(table, nodes(2), "mostallocated", operator)
    off = simulate(table, nodes(2), "mostallocated")
    assert Watch.most == 1 and operator.stats.skipped_holds >= 1
    assert operator.stats.reservations == 2
    assert waits(on)["big"] < waits(off)["big"] and waits(on)["big2"] < waits(off)["big2"]
