"""Snapshot round trip and the field-naming errors of a bad file."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from advisor import snapshot
from advisor.model import ModelBuilder
from advisor.snapshot import SnapshotError


def _model():
    builder = ModelBuilder()
    builder.add_node("n1", pool="p", rack="r1", gpu_model="A100", cpu_milli=64000, memory_mib=1024)
    builder.add_node("n2", schedulable=False)
    for i in range(2):
        builder.add_gpu(
            "n1", i, uuid=f"u{i}", memory_total_bytes=80e9, nvlink_island=0, utilization_ratio=0.5
        )
    builder.add_gpu("n2", 0, lost=True)
    builder.add_allocation(
        "ns/a",
        num_gpu=2,
        node="n1",
        gpus=[0, 1],
        gpu_milli_each=[1000, 429],
        gpu_milli=1000,
        job="j",
        tenant="t",
        priority=5,
        cpu_milli=1500,
        start_time=10.0,
        migratable=False,
        restart_cost_s=60,
    )
    builder.add_allocation("pending", num_gpu=1, gpu_milli=300, gpu_spec="T4|P100", creation_time=3)
    usage = ([1.0, 2.0], np.array([[0.1, np.nan, 0.0], [0.2, 0.3, 0.0]]), np.zeros((2, 3)))
    return builder.build(timestamp=123.0, source="test", usage=usage)


def test_round_trip_keeps_every_field(tmp_path) -> None:
    model = _model()
    path = tmp_path / "s.json"
    snapshot.save(model, path)
    back = snapshot.load(path)
    assert snapshot.to_dict(back) == snapshot.to_dict(model)
    assert back.timestamp == 123.0 and back.source == "test"
    assert back.placements.milli.tolist() == [1000, 429]
    assert back.allocations.node.tolist() == [0, -1]
    assert np.isnan(back.usage.utilization_ratio[0, 1])
    assert back.gpus.lost.tolist() == [False, False, True]
    assert not back.nodes.schedulable[1]
    doc = json.loads(path.read_text())
    assert doc["schema"] == "gpu-defrag.snapshot" and doc["version"] == 1
    assert doc["nodes"][0]["cpu_milli"] == 64000 and doc["nodes"][1]["cpu_milli"] is None


def _bad(mutate) -> str:
    doc = snapshot.to_dict(_model())
    doc = copy.deepcopy(doc)
    mutate(doc)
    with pytest.raises(SnapshotError) as error:
        snapshot.from_dict(doc)
    return str(error.value)


def test_errors_name_the_field_and_the_problem() -> None:
    def bad_memory(d):
        d["nodes"][0]["gpus"][1]["memory_total_bytes"] = "abc"

    assert (
        _bad(bad_memory)
        == 'nodes[0].gpus[1].memory_total_bytes: expected a number or null, got "abc"'
    )

    def no_name(d):
        del d["nodes"][1]["name"]

    assert _bad(no_name) == "nodes[1].name: required field is missing"

    def newer(d):
        d["version"] = 2

    assert _bad(newer).startswith("version: snapshot version 2 is not readable")

    def milli(d):
        d["allocations"][1]["gpu_milli"] = 1500

    assert _bad(milli) == "allocations[1].gpu_milli: must be within 0..1000, got 1500"

    def unknown_node(d):
        d["allocations"][0]["node"] = "nope"

    assert _bad(unknown_node) == "allocations[0]: unknown node 'nope'"

    def wrong_gpu(d):
        d["allocations"][0]["gpus"] = [0, 5]

    assert "node 'n1' has no GPU 5" in _bad(wrong_gpu)

    def overbooked(d):
        d["allocations"][1].update(node="n1", gpus=[1], gpu_milli=700)

    assert _bad(overbooked) == "gpus[n1/gpu1]: oversubscribed: 1129 milli-GPU allocated > 1000"

    def ragged(d):
        d["usage"]["utilization_ratio"][1] = [0.1]

    assert _bad(ragged) == "usage.utilization_ratio[1]: expected an array of 3 numbers or nulls"

    # a history point no GPU can report would count as idle (or busy) in the idle window
    def negative_use(d):
        d["usage"]["utilization_ratio"][1][0] = -5.0

    assert _bad(negative_use) == "usage.utilization_ratio[1][0]: must be within 0..1, got -5.0"

    def over_full(d):
        d["usage"]["utilization_ratio"][0][2] = 1.5

    assert _bad(over_full) == "usage.utilization_ratio[0][2]: must be within 0..1, got 1.5"

    def negative_memory(d):
        d["usage"]["memory_used_bytes"][0][0] = -1

    assert _bad(negative_memory).startswith("usage.memory_used_bytes[0][0]: must be within 0..")

    def boolean(d):
        d["nodes"][0]["schedulable"] = "yes"

    assert _bad(boolean) == 'nodes[0].schedulable: expected true or false, got "yes"'

    def not_object(d):
        d["allocations"][0] = 7

    assert _bad(not_object) == "allocations[0]: expected an object, got 7"


def test_load_reports_non_json_and_missing_files(tmp_path) -> None:
    path = tmp_path / "x.json"
    path.write_text("{nope")
    with pytest.raises(SnapshotError, match=r"\(file\): not JSON: .* line 1 column 2"):
        snapshot.load(path)
    with pytest.raises(SnapshotError, match="cannot read"):
        snapshot.load(tmp_path / "missing.json")
    path.write_text(json.dumps({"schema": "other", "version": 1, "nodes": []}))
    with pytest.raises(SnapshotError, match=r"schema: expected 'gpu-defrag\.snapshot'"):
        snapshot.load(path)


def test_written_snapshots_follow_the_published_json_schema() -> None:
    import jsonschema

    schema = json.loads((Path(snapshot.__file__).parent / "snapshot.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    validator.validate(snapshot.to_dict(_model()))
    from advisor.ingest.sources import load_source

    validator.validate(snapshot.to_dict(load_source("sim:mixed-h100-a100-v100?t=1h")))
    doc = snapshot.to_dict(_model())
    doc["nodes"][0]["gpus"][0]["index"] = -1
    assert not validator.is_valid(doc)  # the schema is not vacuous
    assert not validator.is_valid({**snapshot.to_dict(_model()), "allocation": []})  # a typo
    with pytest.raises(SnapshotError, match=r"nodes\[0\]\.gpus\[0\]\.index: must be within 0"):
        snapshot.from_dict(doc)  # and the loader agrees
    # what the loader refuses, the schema refuses too (and what it writes, the schema takes)
    for path, value in (
        (("nodes", 0, "gpus", 0, "utilization_ratio"), 2.5),
        (("nodes", 0, "gpus", 0, "nvlink_island"), -1),
        (("nodes", 0, "name"), ""),
        (("nodes", 0, "gpus", 0, "carved_milli"), 1001),
        (("allocations", 0, "priority"), 2**31),
    ):
        bad = snapshot.to_dict(_model())
        *parents, key = path
        target = bad
        for step in parents:
            target = target[step]
        target[key] = value
        assert not validator.is_valid(bad), path
        with pytest.raises(SnapshotError):
            snapshot.from_dict(bad)
    carved = snapshot.to_dict(_model())
    carved["nodes"][0]["gpus"][0].update(mig_enabled=True, carved_milli=857)
    validator.validate(carved)
    assert snapshot.from_dict(carved).gpus.carved_milli[0] == 857


def test_failed_save_leaves_the_previous_file_whole(tmp_path) -> None:
    path = tmp_path / "s.json"
    snapshot.save(_model(), path)
    before = path.read_text()
    broken = ModelBuilder()
    broken.add_node("n1")
    broken.add_gpu("n1", 0, memory_total_bytes=float("inf"))  # JSON cannot hold infinity
    with pytest.raises(ValueError):
        snapshot.save(broken.build(), path)
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]  # no temporary file left


def test_an_unknown_top_level_field_is_refused_by_name() -> None:
    def typo(d):
        d["allocation"] = d.pop("allocations")

    assert _bad(typo).startswith("allocation: unknown key (did you mean 'allocations'?)")

    def newer_and_unknown(d):
        d.update(version=2, extra=1)

    assert _bad(newer_and_unknown).startswith("version: ")  # the version speaks first


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_a_number_json_cannot_hold_is_refused_on_load(value: float) -> None:
    def odd(d):
        d["nodes"][0]["gpus"][0]["power_watts"] = value

    assert _bad(odd).startswith("nodes[0].gpus[0].power_watts: expected a number or null")

    def odd_usage(d):
        d["usage"]["memory_used_bytes"][0][0] = value

    assert _bad(odd_usage).startswith("usage.memory_used_bytes[0][0]: expected a number")


def test_save_refuses_what_load_would_refuse_and_writes_nothing(tmp_path) -> None:
    builder = ModelBuilder()
    builder.add_node("a")
    builder.add_gpu("a", 0, memory_total_bytes=-1)
    path = tmp_path / "s.json"
    with pytest.raises(SnapshotError) as error:
        snapshot.save(builder.build(), path)
    assert str(error.value) == "nodes[0].gpus[0].memory_total_bytes: must be >= 0, got -1"
    assert list(tmp_path.iterdir()) == []


def test_memory_used_above_the_gpus_total_is_refused_by_its_path(tmp_path) -> None:
    def over(d):
        d["nodes"][0]["gpus"][1]["memory_used_bytes"] = 80_000_000_001

    assert _bad(over) == (
        "nodes[0].gpus[1].memory_used_bytes: must be at most memory_total_bytes "
        "(80000000000), got 80000000001"
    )
    for total, used in ((80e9, 80e9), (None, 1e12), (80e9, None)):  # full; unknown either way
        doc = snapshot.to_dict(_model())
        doc["nodes"][0]["gpus"][1].update(memory_total_bytes=total, memory_used_bytes=used)
        snapshot.from_dict(doc)
    builder = ModelBuilder()
    builder.add_node("a")
    builder.add_gpu("a", 0, memory_total_bytes=1024, memory_used_bytes=1024 * 2**20)
    path = tmp_path / "s.json"
    with pytest.raises(SnapshotError, match=r"^nodes\[0\]\.gpus\[0\]\.memory_used_bytes: must"):
        snapshot.save(builder.build(), path)  # never written, so never refused on load
    assert list(tmp_path.iterdir()) == []


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _schema_validator():
    import jsonschema

    schema = json.loads((Path(snapshot.__file__).parent / "snapshot.schema.json").read_text())
    return schema, jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize(
    ("where", "key", "expected"),
    [
        (("nodes", 3), "rak", "nodes[3].rak: unknown key (did you mean 'rack'?); a node has "),
        (
            ("nodes", 3, "gpus", 2),
            "migratible",
            "nodes[3].gpus[2].migratible: unknown key; a gpu has index, uuid,",
        ),
        (
            ("allocations", 3),
            "migratible",
            "allocations[3].migratible: unknown key (did you mean 'migratable'?); an "
            "allocation has id, job,",
        ),
        (("usage",), "time", "usage.time: unknown key (did you mean 'times'?); usage has "),
        ((), "allocation", "allocation: unknown key (did you mean 'allocations'?); a snapshot"),
    ],
)
def test_an_unknown_key_is_refused_at_every_level_by_its_path(where, key, expected) -> None:
    """A real example snapshot with one misspelt key, at each level: the loader names it by its
    JSON path, and the published schema refuses the same document."""
    doc = json.loads((EXAMPLES / "seed-16x8-a100.json").read_text())
    target = doc
    for step in where:
        target = target[step]
    target[key] = False
    with pytest.raises(SnapshotError) as error:
        snapshot.from_dict(doc)
    assert str(error.value).startswith(expected)
    _, validator = _schema_validator()
    assert not validator.is_valid(doc)


def test_a_misspelt_migratable_never_leaves_a_protected_job_movable(tmp_path) -> None:
    """The serving job of the seed (not migratable) with `migratable` misspelt: the file is
    refused (exit 2, the path named) instead of a plan that moves the job."""
    import subprocess
    import sys

    doc = json.loads((EXAMPLES / "seed-16x8-a100.json").read_text())
    alloc = doc["allocations"][3]
    assert alloc["migratable"] is False
    alloc["migratible"] = alloc.pop("migratable")
    path = tmp_path / "typo.json"
    path.write_text(json.dumps(doc))
    run = subprocess.run(
        [sys.executable, "-m", "advisor.cli", "plan", str(path), "--goal", "job=8x8"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2, run.stdout
    assert run.stdout == ""
    assert "allocations[3].migratible: unknown key (did you mean 'migratable'?)" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1


def test_the_schema_and_the_loader_know_the_same_keys() -> None:
    schema, _ = _schema_validator()
    defs = schema["$defs"]
    assert tuple(schema["properties"]) == snapshot.TOP_LEVEL
    assert tuple(defs["node"]["properties"]) == snapshot.NODE_KEYS
    assert tuple(defs["gpu"]["properties"]) == snapshot.GPU_KEYS
    assert tuple(defs["allocation"]["properties"]) == snapshot.ALLOCATION_KEYS
    assert tuple(defs["usage"]["properties"]) == snapshot.USAGE_KEYS
    for name in ("node", "gpu", "allocation", "usage"):
        assert defs[name]["additionalProperties"] is False, name
    assert schema["additionalProperties"] is False


def test_a_fraction_keeps_its_guarantee_and_its_limit_through_a_snapshot(tmp_path) -> None:
    """Run:ai-style fractions (0.25 guaranteed / 0.8 limit) from the L4 seed: the limit is
    written, read back and checked against the guarantee by path; a task without one has
    none written."""
    model = snapshot.load(EXAMPLES / "seed-share-l4.json")
    doc = snapshot.to_dict(model)
    notebook = next(a for a in doc["allocations"] if a["id"] == "notebook-1")
    assert (notebook["gpu_milli"], notebook["gpu_limit_milli"]) == (250, 800)
    assert "gpu_limit_milli" not in next(a for a in doc["allocations"] if a["id"] == "infer-a")
    _, validator = _schema_validator()
    validator.validate(doc)
    path = tmp_path / "back.json"
    snapshot.save(model, path)
    assert snapshot.to_dict(snapshot.load(path)) == doc
    index = doc["allocations"].index(notebook)
    notebook["gpu_limit_milli"] = 200
    with pytest.raises(SnapshotError) as error:
        snapshot.from_dict(doc)
    assert str(error.value) == (
        f"allocations[{index}].gpu_limit_milli: must be within gpu_milli..1000 (250..1000: a "
        "limit is at least the guaranteed share), got 200"
    )
    notebook["gpu_limit_milli"] = 1001
    assert not validator.is_valid(doc)
    with pytest.raises(SnapshotError, match=r"gpu_limit_milli: must be within 1\.\.1000, got 0"):
        notebook["gpu_limit_milli"] = 0
        snapshot.from_dict(doc)
