"""One NVLink-island rule for every counter and the planner (`advisor.fragmentation.nvlink`):
`analyze`, the service's shape tables, the app's What-if and a plan give one answer, and a job
that must span islands is shown slower, with the estimate and where it comes from."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from advisor import snapshot
from advisor.fragmentation import measures, nvlink
from advisor.fragmentation.measures import Shape
from advisor.ingest.sources import load_source
from advisor.pipeline import Settings
from advisor.pipeline import queries as Q
from advisor.planner.consolidate import parse_goal, plan_heuristic
from advisor.results import pool_shape_table, shape_table

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SHAPES = (Shape(2), Shape(4), Shape(8), Shape(8, tasks=2))


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "advisor.cli", *args], capture_output=True, text=True, timeout=120
    )


def _models():
    return {
        "seed-nvlink-islands": snapshot.load(EXAMPLES / "seed-nvlink-islands.json"),
        "sim-nvlink-islands": snapshot.load(EXAMPLES / "sim-nvlink-islands.json"),
        "seed-16x8-a100": snapshot.load(EXAMPLES / "seed-16x8-a100.json"),
        "seed-share-l4": snapshot.load(EXAMPLES / "seed-share-l4.json"),  # islands unknown
    }


def test_two_half_islands_are_no_room_for_a_job_that_fits_one_island() -> None:
    """seed-nvlink-islands: 9 GPUs free on 4-GPU islands, 2 + 3 on one node, none with 4. A
    4-GPU job needs one island (the planner's rule): no job can start now, every counter says
    so (it said 2 before), and the planner needs a migration to start one."""
    model = snapshot.load(EXAMPLES / "seed-nvlink-islands.json")
    shape = Shape(4)
    assert measures.jobs_that_fit(model, shape) == 0
    result = measures.analyze(model, measures.Settings(shapes=(shape,)))
    assert result["spatial"]["shapes"][0]["jobs_that_fit"] == 0
    assert result["spatial"]["shapes"][0]["stranded_gpus"] == 9
    assert shape_table(result, (shape,))[0]["schedulable_jobs"] == 0
    assert Q.whatif(model, Settings(), 4, 1).fits_now == 0
    plan = plan_heuristic(model, parse_goal("job=4"))
    assert plan.feasible and plan.migrations == 1
    assert plan.benefit is not None and "4 GPU" in plan.benefit.newly_schedulable()
    # the largest task one node can take: 5 (2 + 3 free: 5 > 4 spans islands, allowed)
    assert result["spatial"]["largest_job"]["single_node_gpus"] == 5
    assert result["spatial"]["largest_job"]["nvlink_group_gpus"] == 3


@pytest.mark.parametrize("name", ["seed-nvlink-islands", "sim-nvlink-islands", "seed-16x8-a100"])
def test_every_counter_and_the_planner_agree_on_what_starts_now(name) -> None:
    """For each shape: jobs fit now (measures, analyze, the service's fleet and per-pool
    tables, What-if) exactly when the planner starts one without moving anything."""
    model = _models()[name]
    result = measures.analyze(model, measures.Settings(shapes=SHAPES))
    fleet = shape_table(result, SHAPES)
    pools = pool_shape_table(model, SHAPES)
    for i, shape in enumerate(SHAPES):
        fits = measures.jobs_that_fit(model, shape)
        assert result["spatial"]["shapes"][i]["jobs_that_fit"] == fits
        assert fleet[i]["schedulable_jobs"] == fits
        assert sum(r["schedulable_jobs"] for r in pools if r["shape"] == fleet[i]["shape"]) <= fits
        assert Q.whatif(model, Settings(), shape.num_gpu, shape.tasks).fits_now == fits
        text = f"job={shape.tasks}x{shape.num_gpu}" if shape.tasks > 1 else f"job={shape.num_gpu}"
        plan = plan_heuristic(model, parse_goal(text))
        starts_without_moves = plan.feasible and plan.migrations == 0
        assert starts_without_moves == (fits > 0), (name, shape.name, plan.reason)


def test_the_rule_per_node_island_by_island() -> None:
    model = snapshot.load(EXAMPLES / "seed-nvlink-islands.json")
    free = model.gpu_is_free
    assert nvlink.whole_tasks_per_node(model, free, 4).tolist() == [0, 0]
    assert nvlink.whole_tasks_per_node(model, free, 4, island_locality=False).sum() == 2
    assert nvlink.whole_tasks_per_node(model, free, 5).sum() == 1  # 5 > 4: spans islands
    assert nvlink.needs_one_island(4, 4) and not nvlink.needs_one_island(5, 4)
    assert not nvlink.needs_one_island(4, 0)  # islands unknown: no rule
    assert not nvlink.needs_one_island(1, 4)
    assert nvlink.islands_ok(np.array([0, 0, 1, 1]), 4) is False
    assert nvlink.islands_ok(np.array([0, 0, 0, 0, 1]), 4) is True


def test_unknown_islands_stay_unknown() -> None:
    """The L4 seed gives no NVLink island: its largest free NVLink group is unknown, not 1
    (each GPU alone), in the measures, the plan's before/after and the CLI."""
    model = snapshot.load(EXAMPLES / "seed-share-l4.json")
    assert set(measures.largest_free_nvlink_group(model).tolist()) == {nvlink.UNKNOWN}
    assert measures.analyze(model)["spatial"]["largest_job"]["nvlink_group_gpus"] is None
    plan = plan_heuristic(model, parse_goal("job=2"))
    assert plan.before["largest_free_nvlink_group"] is None
    run = _cli(
        "plan", str(EXAMPLES / "seed-share-l4.json"), "--goal", "job=2", "--solver", "heuristic"
    )
    assert "largest_free_nvlink_group: unknown -> unknown" in run.stdout


A100_TEXT = (
    "crosses NVLink islands: est. 1.8x step time (collectives between islands over PCIe Gen4, "
    "64 GB/s, not NVLink, 600 GB/s: 9.4x slower, NVIDIA's A100 data sheet; at an assumed 10% "
    "of a step in collectives)"
)


def test_a_job_that_must_span_islands_is_shown_slower_with_the_estimate() -> None:
    """sim:nvlink-islands has 4-GPU islands: an 8-GPU job fits one node but spans two islands.
    analyze (text and JSON), the service's shape table, What-if and the plan's reasons say it
    runs slower, by how much and from which figures; a 4-GPU job (one island) is not."""
    estimate = nvlink.cross_island_estimate("NVIDIA A100-SXM4-40GB")
    assert estimate.bandwidth_ratio == 600 / 64
    assert estimate.step_slowdown == pytest.approx(1 + 0.1 * (600 / 64 - 1))
    assert estimate.text() == A100_TEXT
    unknown = nvlink.cross_island_estimate("Mystery GPU").text()
    assert unknown.endswith("by how much unknown (no NVLink/PCIe bandwidth known for Mystery GPU)")

    model = snapshot.load(EXAMPLES / "sim-nvlink-islands.json")
    result = measures.analyze(model, measures.Settings(shapes=(Shape(4), Shape(8))))
    four, eight = result["spatial"]["shapes"]
    assert four["jobs_that_fit"] > 0 and four["crosses_nvlink_islands"] == []
    assert eight["jobs_that_fit"] > 0
    assert [e["gpu_model"] for e in eight["crosses_nvlink_islands"]] == ["NVIDIA A100-SXM4-40GB"]
    assert eight["crosses_nvlink_islands"][0]["text"] == A100_TEXT
    assert shape_table(result, (Shape(4), Shape(8)))[1]["crosses_nvlink_islands"][0]["text"] == (
        A100_TEXT
    )
    answer = Q.whatif(model, Settings(), 8, 1)
    assert answer.fits_now > 0 and answer.crossing[0]["text"] == A100_TEXT
    run = _cli("analyze", str(EXAMPLES / "sim-nvlink-islands.json"))
    assert f"  8 GPU on NVIDIA A100-SXM4-40GB: {A100_TEXT}\n" in run.stdout
    doc = json.loads(_cli("analyze", "--json", str(EXAMPLES / "sim-nvlink-islands.json")).stdout)
    eight_json = next(s for s in doc["spatial"]["shapes"] if s["shape"] == "8 GPU")
    assert eight_json["crosses_nvlink_islands"][0]["step_slowdown"] == pytest.approx(1.8375)


def test_a_plan_that_places_a_job_across_islands_says_so() -> None:
    model = snapshot.load(EXAMPLES / "seed-nvlink-islands.json")
    plan = plan_heuristic(model, parse_goal("job=8"))
    assert plan.feasible
    reserves = [a for a in plan.actions if a.kind == "reserve"]
    assert reserves and all(A100_TEXT in a.reason for a in reserves)
    four = plan_heuristic(model, parse_goal("job=4"))
    assert all("crosses NVLink islands" not in a.reason for a in four.actions)


def test_a_source_with_islands_agrees_too() -> None:
    model = load_source("sim:nvlink-islands?t=6h")
    for shape in SHAPES[:3]:
        fits = measures.jobs_that_fit(model, shape)
        plan = plan_heuristic(model, parse_goal(f"job={shape.num_gpu}"))
        assert (plan.feasible and plan.migrations == 0) == (fits > 0), shape.name
