"""Seed cases of the planner (on the shipped example snapshots) and `gpu-defrag plan`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from advisor import snapshot
from advisor.cli import main
from advisor.fragmentation import measures
from advisor.planner.actions import Action, CostWeights, GpuSet
from advisor.planner.check import apply_plan, check_plan
from advisor.planner.consolidate import order_moves, parse_goal, plan_heuristic
from advisor.planner.constraints import Policy
from advisor.planner.exact import plan_exact
from tests.conftest import add_nodes

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SEED_16X8 = EXAMPLES / "seed-16x8-a100.json"
SEED_ISLANDS = EXAMPLES / "seed-nvlink-islands.json"
COUNT_MIGRATIONS = CostWeights(migration=1.0, restart_hour=0.0, gpu_hour=0.0)


def moves(plan):
    return [a for a in plan.actions if a.kind == "migrate"]


@pytest.mark.parametrize("goal", ["free-nodes=8", "job=8x8"])
def test_seed_16x8_frees_eight_nodes_with_minimum_migrations(goal) -> None:
    model = snapshot.load(SEED_16X8)
    assert int((measures.free_whole_per_node(model) == 8).sum()) == 4
    heuristic = plan_heuristic(model, parse_goal(goal))
    assert heuristic.feasible, heuristic.reason
    assert check_plan(model, heuristic.actions, Policy(), heuristic.extra["goal_priority"]).ok
    # the exact solver, counting migrations only, proves no plan needs fewer
    exact = plan_exact(model, parse_goal(goal), weights=COUNT_MIGRATIONS, time_limit_s=20)
    assert exact.extra["status"] == "optimal"
    assert exact.extra["objective"] == pytest.approx(6.0)
    assert len(moves(heuristic)) == len(moves(exact)) == 6
    after = apply_plan(model, moves(heuristic))
    free_nodes = np.flatnonzero(measures.free_whole_per_node(after) == 8)
    assert len(free_nodes) == 8
    if goal == "job=8x8":  # the eight nodes share one rack
        assert len(set(after.nodes.rack[free_nodes].tolist())) == 1
        assert measures.jobs_that_fit(after, measures.parse_shape("8x8")) == 1
    reserved = [a for a in heuristic.actions if a.kind == "reserve"]
    assert sorted(a.dst.node for a in reserved) == sorted(after.nodes.name[free_nodes].tolist())


def test_seed_16x8_never_moves_higher_priority_work() -> None:
    model = snapshot.load(SEED_16X8)
    goal = parse_goal("job=8x8", priority=50)
    assert not plan_heuristic(model, goal).feasible
    exact = plan_exact(model, goal, time_limit_s=10)
    assert exact.extra["status"] == "infeasible"
    # with a lower bar the same rack frees up, without touching priority-100 work ...
    plan = plan_heuristic(model, parse_goal("free-nodes=6", priority=50))
    assert plan.feasible
    rows = {a: i for i, a in enumerate(model.allocations.id.tolist())}
    assert all(model.allocations.priority[rows[a.alloc]] <= 50 for a in moves(plan))
    # ... and the non-migratable serving job on node 2 never moves
    for action in plan.actions:
        assert action.alloc != "a100-node-02-job2"


def test_seed_islands_never_split_a_four_gpu_job() -> None:
    model = snapshot.load(SEED_ISLANDS)
    islands = model.gpus.nvlink_island
    assert int(model.gpu_is_free.sum()) == 9  # node 1 has 4 free, but 2 + 2 over its islands
    for plan in (
        plan_heuristic(model, parse_goal("job=4")),
        plan_exact(model, parse_goal("job=4"), time_limit_s=10),
    ):
        assert plan.feasible, plan.reason
        assert len(moves(plan)) == 1
        (reserve,) = [a for a in plan.actions if a.kind == "reserve"]
        node = model.node_index(reserve.dst.node)
        rows = [model.gpu_row(node, i) for i in reserve.dst.gpus]
        assert len(set(islands[rows].tolist())) == 1
        for action in moves(plan):
            node = model.node_index(action.dst.node)
            rows = [model.gpu_row(node, i) for i in action.dst.gpus]
            assert len(set(islands[rows].tolist())) == 1
    split = [Action("reserve", alloc="r", dst=GpuSet("island-node-01", (2, 3, 4, 5)))]
    result = check_plan(model, split)
    assert not result.ok and "splits" in result.violation.reason


def test_moves_are_ordered_so_each_target_is_free() -> None:
    b = add_nodes(["n1", "n2"], 2, gpu_model="A100")
    b.add_allocation("x", num_gpu=1, node="n1", gpus=[0])
    b.add_allocation("y", num_gpu=1, node="n2", gpus=[0])
    model = b.build()
    x_to_n2 = Action("migrate", alloc="x", src=GpuSet("n1", (0,)), dst=GpuSet("n2", (0,)))
    y_away = Action("migrate", alloc="y", src=GpuSet("n2", (0,)), dst=GpuSet("n2", (1,)))
    assert not check_plan(model, [x_to_n2, y_away]).ok
    ordered = order_moves(model, [x_to_n2, y_away])
    assert [a.alloc for a in ordered] == ["y", "x"]
    assert check_plan(model, ordered).ok


def test_cli_json_document(capsys) -> None:
    rc = main(["plan", str(SEED_ISLANDS), "--goal", "job=4", "--json", "--time-limit", "5"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["goal"] == "job=4" and doc["feasible"] is True
    kinds = [a["kind"] for a in doc["actions"]]
    assert kinds == ["migrate", "reserve"]
    first = doc["actions"][0]
    assert {"kind", "job", "from", "to", "cost"} <= set(first)
    assert first["cost"]["restarts"] == 1 and first["cost"]["gpu_hours"] > 0
    assert doc["before"]["largest_free_nvlink_group"] == 3
    assert doc["after"]["largest_free_nvlink_group"] == 4
    assert doc["comparison"]["heuristic_gap"] == pytest.approx(1.0)


def test_cli_table_forecast_and_errors(tmp_path, capsys) -> None:
    assert main(["plan", str(SEED_16X8), "--goal", "job=8x8", "--solver", "heuristic"]) == 0
    out = capsys.readouterr().out
    assert out.count("migrate") == 6 and "free_nodes: 4 -> 8" in out
    assert main(["plan", str(SEED_16X8), "--goal", "job=8x8", "--time-limit", "20"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("objective"))
    # the weights named, the costs rounded, the proof given
    assert re.fullmatch(
        r"objective \(restarts x 1 \+ GPU-hours lost x 0\.1\): heuristic (\d+\.\d{3}), "
        r"exact \1 \(optimal\), heuristic/exact = 1\.000",
        line,
    ), line
    demand = tmp_path / "demand.json"
    demand.write_text(json.dumps({"8": 5, "4": 2}))
    args = ["plan", str(SEED_16X8), "--goal", "forecast=6h", "--demand", str(demand), "--json"]
    assert main(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert sum(a["kind"] == "reserve" for a in doc["actions"]) == 7
    policy = tmp_path / "policy.yaml"
    policy.write_text("quotas:\n  ml: 32\n")
    args = ["plan", str(SEED_16X8), "--goal", "job=8x8", "--tenant", "ml", "--policy", str(policy)]
    assert main(args) == 1
    assert "above its quota of 32" in capsys.readouterr().out
    assert main(["plan", str(SEED_16X8), "--goal", "job=banana"]) == 2
    assert "bad shape" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--goal", "forecast=6h"], "--goal forecast=6h needs --demand"),
        (["--goal", "forecast=0h", "--demand", "{demand}"], "horizon must be above zero"),
        (["--goal", "job=8", "--solver", "exact", "--time-limit", "nan"], "--time-limit: 'nan'"),
        (["--goal", "job=8", "--time-limit", "-1"], "--time-limit: '-1'"),
        (["--goal", "job=8", "--time-limit", "0"], "not a positive duration"),
        (
            ["--goal", "job=8", "--workers", "0"],
            "--workers: '0': expected a finite whole number >= 1",
        ),
        (["--goal", "job=8", "--workers", "-3"], "--workers: '-3'"),
        (["--goal", "job=8", "--exact-max-nodes", "-1"], "--exact-max-nodes: '-1'"),
        (["--goal", "reserve=nojob"], "no job 'nojob' in the model"),
        (["--goal", "borrow=nojob"], "no pending job 'nojob' in the model"),
        (["--goal", "job=0"], "bad shape '0': a shape takes at least one task"),
        (
            ["--goal", "nope"],
            "bad goal 'nope': unknown goal 'nope' (job=8x8, job=4, free-nodes=8, forecast=6h, "
            "recommend, reclaim, share, rebalance, reserve[=JOB] or borrow=JOB|TENANT:GPUS)",
        ),
        (["--goal", "job=8x0"], "bad shape '8x0'"),
        (
            ["--goal", "forecast=6h", "--demand", "{demand}", "--demand-quantile", "1.5"],
            "--demand-quantile: '1.5' is not a number strictly between 0 and 1",
        ),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, message) -> None:
    demand = tmp_path / "demand.json"
    demand.write_text(json.dumps({"8": 1}))
    args = [a.replace("{demand}", str(demand)) for a in args]
    try:
        code = main(["plan", str(SEED_16X8), *args])
    except SystemExit as exit_:  # argparse's flag errors
        code = exit_.code
    captured = capsys.readouterr()
    assert code == 2 and not captured.out
    assert message in captured.err.strip().splitlines()[-1]


def test_cli_refuses_demand_the_cluster_can_never_hold(tmp_path, capsys) -> None:
    """100000 8-GPU jobs used to become a list of 100000 shapes (36 s, 3.6 GB)."""
    demand = tmp_path / "demand.json"
    demand.write_text(json.dumps({"4": 2, "8": 100_000}))
    args = ["plan", str(SEED_16X8), "--goal", "forecast=6h", "--demand", str(demand)]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"gpu-defrag plan: error: {demand}: 100000 jobs of shape 8 GPU: the cluster's 128 GPUs "
        "hold at most 16"
    )
    demand.write_text(json.dumps({"2x8": 8}))  # exactly what fits stays a plan request
    assert main([*args, "--solver", "heuristic"]) in (0, 1)
    assert "jobs of shape" not in capsys.readouterr().err
    # JSON's 1e12 is a whole number written as a float: too many jobs, not "not whole"
    demand.write_text('{"8": 1e12}')
    assert main(args) == 2
    assert "1000000000000 jobs of shape 8 GPU" in capsys.readouterr().err
    demand.write_text('{"8": 2.5}')
    assert main(args) == 2
    assert "8: expected a whole number of jobs, got 2.5" in capsys.readouterr().err


def test_plans_with_chained_moves_are_ordered_and_checked() -> None:
    """sim:a100-16x8: 7 free nodes need moves onto GPUs that other moves vacate first (a 4-GPU
    job only fits where small jobs leave); both planners find it, ordered, in 9 migrations."""
    model = snapshot.load(EXAMPLES / "sim-a100-16x8.json")
    goal = parse_goal("free-nodes=7")
    exact = plan_exact(model, goal, time_limit_s=20)
    assert exact.extra["status"] == "optimal", exact.reason
    for plan in (plan_heuristic(model, goal), exact):
        assert plan.feasible, plan.reason
        assert len(moves(plan)) == 9
        assert check_plan(model, plan.actions, Policy(), plan.extra["goal_priority"]).ok
        steps = moves(plan)
        vacated = set()
        chained = False
        for action in steps:
            targets = {(action.dst.node, g) for g in action.dst.gpus}
            chained |= bool(targets & vacated)
            vacated |= {(action.src.node, g) for g in action.src.gpus}
        assert chained  # at least one move lands where an earlier move left
        # the same moves in reverse order break the step-by-step check
        assert not check_plan(model, steps[::-1], Policy(), plan.extra["goal_priority"]).ok


def test_infeasible_goal_says_why(capsys) -> None:
    sim = str(EXAMPLES / "sim-a100-16x8.json")
    assert main(["plan", sim, "--goal", "free-nodes=8", "--time-limit", "10"]) == 1
    out = capsys.readouterr().out
    assert "68 GPUs are allocated; with 8 nodes empty the rest hold at most 64" in out
    assert "proved by the exact solver" in out


def test_forecast_goal_from_an_arrival_history(tmp_path, capsys) -> None:
    """One 8-GPU job arrives every hour for three weeks: the next 6 h bring 6 of them, so the
    plan must hold 6 whole nodes (4 are free: 2 more need emptying)."""
    import pandas as pd

    times = pd.date_range("2026-01-01", periods=24 * 21, freq="h")
    history = tmp_path / "arrivals.csv"
    pd.DataFrame({"time": times, "series": "8", "value": 1.0}).to_csv(history, index=False)
    args = ["plan", str(SEED_16X8), "--goal", "forecast=6h", "--demand", str(history), "--json"]
    assert main([*args, "--solver", "heuristic"]) == 0
    doc = json.loads(capsys.readouterr().out)
    reserves = [a for a in doc["actions"] if a["kind"] == "reserve"]
    assert len(reserves) == 6 and all(len(a["to"]["gpus"]) == 8 for a in reserves)
    assert sum(a["kind"] == "migrate" for a in doc["actions"]) > 0
    assert doc["after"]["free_nodes"] == 6


def test_a_forecast_of_no_jobs_is_a_plan_with_nothing_to_do(tmp_path, capsys) -> None:
    """`--demand` given but empty (no job in the window, or a history of zeros): feasible, no
    action; not the "needs --demand" error of a missing flag."""
    import pandas as pd

    empty = tmp_path / "none.json"
    empty.write_text("{}")
    zeros = tmp_path / "zeros.csv"
    times = pd.date_range("2026-01-01", periods=24 * 7, freq="h")
    pd.DataFrame({"time": times, "series": "8", "value": 0.0}).to_csv(zeros, index=False)
    for demand in (empty, zeros):
        args = ["plan", str(SEED_16X8), "--goal", "forecast=6h", "--demand", str(demand)]
        assert main([*args, "--json"]) == 0, demand.name
        doc = json.loads(capsys.readouterr().out)
        assert doc["feasible"] is True and doc["actions"] == [], demand.name


def test_a_demand_history_series_that_is_no_shape_names_the_file(tmp_path, capsys) -> None:
    import pandas as pd

    history = tmp_path / "regions.csv"
    times = pd.date_range("2026-01-01", periods=48, freq="h")
    pd.DataFrame({"time": times, "series": "EU", "value": 1.0}).to_csv(history, index=False)
    args = ["plan", str(SEED_16X8), "--goal", "forecast=6h", "--demand", str(history)]
    assert main(args) == 2
    assert capsys.readouterr().err == (
        f"gpu-defrag plan: error: {history}: series 'EU': bad shape 'EU': expected e.g. 0.5, 1, 8, "
        "2x8 or 4@A100\n"
    )


def test_exact_solver_plans_several_forecast_jobs_at_once() -> None:
    model = snapshot.load(SEED_16X8)
    demand = [measures.parse_shape(s) for s in ("8", "8", "8", "8", "8", "4", "4", "2x8")]
    goal = parse_goal("forecast=6h")
    heuristic = plan_heuristic(model, goal, demand=demand)
    exact = plan_exact(model, goal, demand=demand, time_limit_s=20)
    assert heuristic.feasible and exact.feasible and exact.extra["status"] == "optimal"
    assert exact.cost.score() <= heuristic.cost.score() + 1e-4
    for plan in (heuristic, exact):
        assert check_plan(model, plan.actions, Policy(), plan.extra["goal_priority"]).ok
        reserves = [a for a in plan.actions if a.kind == "reserve"]
        assert sorted(len(a.dst.gpus) for a in reserves) == [4, 4] + [8] * 7


def test_shipped_seed_snapshots_match_their_generator() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_examples", EXAMPLES / "make_examples.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for build, path in ((module.seed_16x8, SEED_16X8), (module.seed_nvlink_islands, SEED_ISLANDS)):
        built = json.loads(json.dumps(snapshot.to_dict(build())))
        assert built == json.loads(path.read_text()), f"{path.name}: run examples/make_examples.py"


def test_the_shipped_arrival_history_matches_its_generator_and_plans(capsys) -> None:
    """examples/arrivals.csv is what make_examples.py writes, and the examples README's
    forecast command plans on it: the next 6 h after a Sunday night bring one 2x8 job."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_examples", EXAMPLES / "make_examples.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    arrivals = EXAMPLES / "arrivals.csv"
    assert arrivals.read_text() == module.arrivals_csv(), "run examples/make_examples.py"
    args = ["plan", str(SEED_16X8), "--goal", "forecast=6h", "--demand", str(arrivals), "--json"]
    assert main(args) == 0
    doc = json.loads(capsys.readouterr().out)
    reserves = [a for a in doc["actions"] if a["kind"] == "reserve"]
    assert len(reserves) == 2 and len({a["job"] for a in reserves}) == 1
    assert all(len(a["to"]["gpus"]) == 8 for a in reserves)
