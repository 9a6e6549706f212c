"""Unknown racks stay unknown: counts, causes and plans say "rack unknown", never 0/proved."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from advisor import snapshot
from advisor.fragmentation import measures
from advisor.planner.cli import solve
from advisor.planner.consolidate import parse_goal
from advisor.planner.constraints import Policy

SEED = Path(__file__).parents[2] / "examples" / "seed-16x8-a100.json"


def without_racks(tmp_path: Path):
    doc = json.loads(SEED.read_text())
    for node in doc["nodes"]:
        node["rack"] = ""
    path = tmp_path / "norack.json"
    path.write_text(json.dumps(doc))
    return snapshot.load(path)


def shape_rows(model):
    result = measures.analyze(model)
    return {row["shape"]: row for row in result["spatial"]["shapes"]}, result


def test_multi_node_shapes_say_rack_unknown(tmp_path):
    rows, result = shape_rows(without_racks(tmp_path))
    assert rows["2x8 GPU"]["jobs_that_fit"] == 0
    assert rows["2x8 GPU"]["jobs_if_racks_allow"] == 2
    assert rows["2x8 GPU"]["blocked_by"] == "rack_unknown"
    assert rows["2x8 GPU"]["stranded_gpus"] is None  # not a confident number
    assert rows["8 GPU"]["jobs_if_racks_allow"] is None
    assert result["cluster"]["nodes_rack_unknown"] == 16
    assert result["spatial"]["largest_job"]["multi_node_gpus_in_rack"] is None


def test_known_racks_unchanged(tmp_path):
    rows, result = shape_rows(snapshot.load(SEED))
    assert rows["2x8 GPU"]["jobs_if_racks_allow"] is None
    assert rows["2x8 GPU"]["blocked_by"] is None
    assert result["cluster"]["nodes_rack_unknown"] == 0


def test_scattered_named_as_such(tmp_path):
    doc = json.loads(SEED.read_text())
    model = snapshot.load(SEED)
    _rows, _ = shape_rows(model)
    # 8x8 needs 64 GPUs in one rack; 88 are free but no rack has 8 free nodes
    big = measures.parse_shape("8x8")
    result = measures.analyze(model, measures.Settings(shapes=(big,)))
    assert result["spatial"]["shapes"][0]["blocked_by"] == "scattered"
    assert doc  # the seed case as shipped


def test_plan_says_rack_unknown_not_proved(tmp_path):
    model = without_racks(tmp_path)
    plan = solve(model, parse_goal("job=8x8"), Policy(), time_limit_s=10)
    assert not plan.feasible
    assert "rack unknown" in plan.reason and "proved" not in plan.reason
    exact = solve(model, parse_goal("job=8x8"), Policy(), solver="exact", time_limit_s=10)
    assert "rack unknown" in exact.reason and "proved" not in exact.reason
    # without rack locality the planner plans on the same nodes
    free = solve(model, parse_goal("job=8x8"), Policy(rack_locality=False), time_limit_s=10)
    assert free.feasible


def test_analyze_table_says_rack_unknown(tmp_path, capsys):
    from advisor.cli import main

    shutil.copy(SEED, tmp_path / "seed.json")
    without_racks(tmp_path)
    assert main(["analyze", str(tmp_path / "norack.json"), "--top", "0"]) == 0
    out = capsys.readouterr().out
    assert "racks: unknown for all 16 nodes" in out
    assert "0 to 2 (rack unknown)" in out
    assert "scattered" not in out
