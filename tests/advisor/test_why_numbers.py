"""When a goal cannot be met, every surface says why in numbers: the CLI, the service's plans
and notes, and the app's What-if, for job=, free-nodes=, forecast=, borrow=, share and
rebalance (one function per question: `advisor.planner.why` and the kinds' notes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from advisor import snapshot
from advisor.fragmentation import measures
from advisor.fragmentation.measures import Shape
from advisor.ingest.sources import load_source
from advisor.pipeline import Settings
from advisor.pipeline import queries as Q
from advisor.pipeline.stages import plans as plan_stage
from advisor.planner.consolidate import parse_goal, plan_heuristic
from advisor.planner.rebalance import plan_rebalance
from advisor.planner.share import plan_share
from advisor.planner.why import why_not_now
from tests.conftest import add_nodes

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SIM_8X8 = (
    "no 8 x 8-GPU job in one rack can be cleared: 68 GPUs are allocated; with the job's 64 "
    "taken the rest hold at most 64"
)


def _plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "advisor.cli", "plan", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_job_8x8_on_the_simulated_fleet_says_why_in_numbers_on_every_surface() -> None:
    """`job=8x8` on `sim:a100-16x8` said only "no 8 x 8-GPU job in one rack can be cleared"."""
    run = _plan("sim:a100-16x8", "--goal", "job=8x8", "--solver", "heuristic")
    assert run.returncode == 1
    assert f"why: {SIM_8X8}\n" in run.stdout
    exact = _plan("sim:a100-16x8", "--goal", "job=8x8", "--solver", "exact", "--json")
    assert json.loads(exact.stdout)["reason"] == (
        f"no placement reaches the goal (proved by the exact solver): {SIM_8X8}"
    )
    model = load_source("sim:a100-16x8")
    shape = Shape(8, tasks=8)
    rows = [{"schedulable_jobs": 0}]
    settings = Settings(measures=measures.Settings(shapes=(shape,)))
    doc = plan_stage(model, settings, rows)
    assert doc["plans"][0]["reason"] == SIM_8X8  # the service's API
    answer = Q.whatif(model, Settings(), 8, 8)  # the app's What-if
    assert answer.plan is not None and answer.plan.reason == SIM_8X8
    assert answer.why_not == "only 60 GPUs free, 64 needed"
    assert doc["notes"] and all(": " in note for note in doc["notes"])


def test_free_nodes_and_immovable_work() -> None:
    model = snapshot.load(EXAMPLES / "sim-a100-16x8.json")
    plan = plan_heuristic(model, parse_goal("free-nodes=8"))
    assert plan.reason == (
        "no set of 8 whole free nodes can be cleared: 68 GPUs are allocated; with 8 nodes "
        "empty the rest hold at most 64"
    )
    seed = snapshot.load(EXAMPLES / "seed-16x8-a100.json")
    plan = plan_heuristic(seed, parse_goal("job=8x8", priority=50))
    assert plan.reason == (
        "no 8 x 8-GPU job in one rack can be cleared: in rack rack-02 (NVIDIA A100-SXM4-80GB), "
        "8 node(s) with at least 8 GPUs, 3 of them hold work that may not move (3 tasks of "
        "priority above the goal's 50): 5 can be cleared, 8 needed"
    )
    plan = plan_heuristic(seed, parse_goal("free-nodes=8", priority=50))
    assert plan.reason.endswith(
        "16 node(s), 9 of them hold work that may not move (9 tasks of priority above the "
        "goal's 50, 1 task not migratable): 7 can be cleared, 8 needed"
    )


def test_forecast_names_what_the_earlier_jobs_of_the_demand_take(tmp_path) -> None:
    demand = tmp_path / "demand.json"
    demand.write_text('{"2x8": 8}')
    run = _plan(
        str(EXAMPLES / "seed-16x8-a100.json"),
        "--goal",
        "forecast=6h",
        "--demand",
        str(demand),
        "--solver",
        "heuristic",
    )
    assert run.returncode == 1
    why = run.stdout.splitlines()[1]
    assert why.startswith("why: no 2 x 8-GPU job in one rack can be cleared: in rack rack-01")
    assert "hold GPUs an earlier job of the goal takes" in why
    assert "can be cleared, 2 needed" in why


def test_why_a_job_cannot_start_now() -> None:
    islands = snapshot.load(EXAMPLES / "seed-nvlink-islands.json")
    assert why_not_now(islands, Shape(4)) == (
        "9 GPUs free, but no node has 4 for one task: a 4-GPU task must sit in one NVLink "
        "island where one holds it, and the most free in one is 3, island-node-02"
    )
    assert why_not_now(islands, Shape(2)) == ""  # one can start
    sim = snapshot.load(EXAMPLES / "sim-a100-16x8.json")
    assert why_not_now(sim, Shape(8, tasks=5)) == (
        "60 GPUs free, but no rack and GPU model has 5 nodes with 8 free GPUs for one task "
        "each: the most is 4, rack rack-02 (NVIDIA A100-SXM4-80GB)"
    )
    assert why_not_now(sim, Shape(8, tasks=9)) == "only 60 GPUs free, 72 needed"


def test_rebalance_and_share_say_why_they_do_nothing() -> None:
    seed = snapshot.load(EXAMPLES / "seed-16x8-a100.json")
    assert plan_rebalance(seed).reason == (
        "no GPU model is scarce (at least 90% allocated, with no queue): NVIDIA "
        "A100-SXM4-80GB 40 of 128 allocated, 88 free"
    )
    share16 = snapshot.load(EXAMPLES / "seed-share-16gb.json")
    assert plan_rebalance(share16).reason == (
        "Tesla V100-SXM2-16GB scarce, but no GPU model idles to take its light jobs (free "
        "GPUs and no shortfall): Tesla V100-SXM2-16GB 8 of 8 allocated, 0 free, 4 GPUs queued "
        "for it"
    )
    doc = snapshot.to_dict(snapshot.load(EXAMPLES / "seed-share-l4.json"))
    doc["allocations"] = [a for a in doc["allocations"] if a["id"] in ("infer-a", "notebook-3")]
    alone = snapshot.from_dict(doc)
    assert plan_share(alone).reason == (
        "of 1 task(s) holding a whole GPU alone, 1 have the 3 samples sizing needs, 1 need at "
        "most 0.8 GPU and 1 of those may move: fewer than two can share a GPU"
    )


@pytest.mark.parametrize(
    ("goal", "needle"),
    [
        ("borrow=rnd:40:80", "not enough free GPUs now: only 34 free, 40 needed"),
        ("borrow=rnd:1x8:10", "priority 10 is under the threshold of every rule"),
    ],
)
def test_borrow_says_why_in_numbers(goal, needle) -> None:
    run = _plan(
        str(EXAMPLES / "seed-quota-borrow.json"),
        "--goal",
        goal,
        "--policy",
        str(EXAMPLES / "policy-borrow.yaml"),
    )
    assert run.returncode == 1 and needle in run.stdout


def test_work_that_finds_no_home_is_counted() -> None:
    """Two A100 nodes, each with a 2-GPU task asking 100 of its 128 cores: an 8-GPU job needs
    one node cleared, but its task finds no node with the CPU left. Counting GPUs proves
    nothing (4 + 8 of 16); the reason says what moves and what finds no home."""

    b = add_nodes(["n1", "n2"], rack="r1", gpu_model="A100", cpu_milli=128000, island=8)
    for n in (1, 2):
        b.add_allocation(f"t{n}", num_gpu=2, node=f"n{n}", gpus=[0, 1], cpu_milli=100000)
    plan = plan_heuristic(b.build(), parse_goal("job=8"))
    assert not plan.feasible
    assert plan.reason == (
        "no 1 x 8-GPU job can be cleared: clearing the 1 cheapest node(s) moves 1 task(s) (2 "
        "GPUs); 1 of them (2 GPUs) find no free GPUs of their model, NVLink island, rack and "
        "CPU/memory elsewhere (6 GPUs free outside the room)"
    )
