"""`gpu-defrag analyze` and `gpu-defrag snapshot` end to end through the CLI dispatcher."""

from __future__ import annotations

import json
import os
import re
import sys

import numpy as np
import pytest

from advisor import snapshot
from advisor.cli import main
from advisor.model import ModelBuilder
from tests.advisor.test_measures import two_nodes
from tests.conftest import GIB, add_nodes
from tests.fakes.page_server import Routes, serve
from tests.ports import free_port


def test_snapshot_then_analyze_json_and_table(tmp_path, capsys) -> None:
    path = tmp_path / "two.json"
    snapshot.save(two_nodes().build(), path)
    assert main(["snapshot", str(path), "-o", str(tmp_path / "copy.json")]) == 0
    assert (
        main(["analyze", str(tmp_path / "copy.json"), "--json", "--shape", "2", "--shape", "4"])
        == 0
    )
    result = json.loads(capsys.readouterr().out)
    assert result["spatial"]["free_gpus"] == 9
    assert [(r["shape"], r["jobs_that_fit"]) for r in result["spatial"]["shapes"]] == [
        ("2 GPU", 4),
        ("4 GPU", 1),
    ]
    assert [row["node"] for row in result["nodes"]] == ["a", "b"]
    assert result["nodes"][1]["free_gpus"] == 6
    assert main(["analyze", str(path)]) == 0
    table = capsys.readouterr().out
    assert "free GPUs (whole, usable)" in table
    line = next(row for row in table.splitlines() if row.strip().startswith("4 GPU"))
    assert line.split()[2:4] == ["1", "5"]  # 1 job fits, 5 free GPUs it cannot use


def test_snapshot_to_stdout_round_trips(tmp_path, capsys) -> None:
    assert main(["snapshot", "sim:a100-16x8?seed=2"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "gpu-defrag.snapshot" and len(doc["nodes"]) == 16
    path = tmp_path / "sim.json"
    path.write_text(json.dumps(doc))
    assert snapshot.load(path).summary()["gpus"] == 128


def test_errors_are_one_line_and_exit_2(capsys) -> None:
    port = free_port()
    assert main(["analyze", f"http://127.0.0.1:{port}/metrics", "--timeout", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpu-defrag analyze: error: http://127.0.0.1:") and err.count("\n") == 1
    assert main(["analyze", "sim:a100-16x8", "--shape", "1.5"]) == 2
    assert "bad shape '1.5'" in capsys.readouterr().err
    assert main(["snapshot", "missing.json"]) == 2
    assert "cannot read missing.json" in capsys.readouterr().err


def test_snapshot_to_an_unwritable_path_is_refused_before_the_source_is_read(
    tmp_path, capsys, monkeypatch
) -> None:
    import advisor.analyze as analyze

    monkeypatch.setattr(analyze, "load_source", lambda *a, **k: pytest.fail("read first"))
    target = tmp_path / "no" / "dir" / "x.json"
    assert main(["snapshot", "sim:a100-16x8", "-o", str(target)]) == 2
    err = capsys.readouterr().err
    assert err == f"gpu-defrag snapshot: error: -o {target}: {target.parent} does not exist\n"


def test_snapshot_a_write_that_fails_is_exit_1_and_keeps_the_old_file(
    tmp_path, capsys, monkeypatch
) -> None:
    """A full disk mid-write is no bad input (exit 1, as for the other commands' results and
    standard output), and the file that was there stays whole."""
    import errno

    import gpu_defrag_common.files as files

    source, target = tmp_path / "two.json", tmp_path / "out.json"
    snapshot.save(two_nodes().build(), source)
    target.write_text("previous")

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.os, "replace", full)
    assert main(["snapshot", str(source), "-o", str(target)]) == 1
    err = capsys.readouterr().err
    assert err == f"gpu-defrag snapshot: error: cannot write {target}: No space left on device\n"
    assert target.read_text() == "previous"
    assert {p.name for p in tmp_path.iterdir()} == {"two.json", "out.json"}  # no temporary


def test_json_has_no_nan_or_infinity() -> None:
    from advisor.analyze import to_json

    doc = to_json({"a": float("inf"), "b": [float("nan"), 0.123456], "nodes": {}})
    assert doc == {"a": None, "b": [None, 0.1235], "nodes": []}
    json.dumps(doc, allow_nan=False)


def test_durations_take_units_like_the_other_commands(capsys) -> None:
    source = "sim:a100-16x8?seed=2"
    assert main(["analyze", source, "--json", "--idle-window", "90m"]) == 0
    assert json.loads(capsys.readouterr().out)["temporal"]["window_s"] == 5400.0
    assert main(["analyze", source, "--json", "--idle-window", "5400"]) == 0
    assert json.loads(capsys.readouterr().out)["temporal"]["window_s"] == 5400.0


def test_snapshot_of_a_model_the_loader_would_refuse_writes_nothing(
    tmp_path, capsys, monkeypatch
) -> None:
    builder = ModelBuilder()
    builder.add_node("a")
    builder.add_gpu("a", 0, memory_total_bytes=-1)  # no reader makes this any more: a stand-in
    monkeypatch.setattr("advisor.analyze.load_source", lambda *_, **__: builder.build())
    out = tmp_path / "s.json"
    assert main(["snapshot", "any", "-o", str(out), "--timeout", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "nodes[0].gpus[0].memory_total_bytes: must be >= 0, got -1" in err
    assert list(tmp_path.iterdir()) == []


def test_snapshot_of_a_page_reads_an_impossible_value_as_unknown(tmp_path, caplog) -> None:
    """A page's impossible value is dropped with a warning, as `analyze` of it does (the
    exporter_scrape rule); the snapshot written holds null there and loads back."""
    routes = Routes()
    routes.text("/page", 'gpu_memory_total_bytes{node="a",gpu="0"} -1\n')
    out = tmp_path / "s.json"
    with serve(routes) as base:
        assert main(["snapshot", f"{base}/page", "-o", str(out)]) == 0
        assert main(["analyze", f"{base}/page"]) == 0
    assert json.loads(out.read_text())["nodes"][0]["gpus"][0]["memory_total_bytes"] is None
    assert np.isnan(snapshot.load(out).gpus.memory_total_bytes[0])
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 2 and "a/gpu0 memory_total_bytes=-1" in warnings[0]


@pytest.mark.parametrize(
    ("text", "why"),
    [("0", "at least 0.001 GPU"), ("0x8", "at least one task"), ("8x0", "at least 0.001 GPU")],
)
def test_an_impossible_shape_names_its_text_and_why(text, why, capsys) -> None:
    assert main(["analyze", "sim:a100-16x8", "--shape", text]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"bad shape {text!r}" in err and why in err
    assert "Shape(" not in err


@pytest.mark.parametrize(
    "flag",
    [
        "--idle-threshold=-1",
        "--idle-threshold=2",
        "--idle-threshold=nan",
        "--idle-window=0",
        "--min-request-memory=-1",
        "--min-request-memory=nan",
        "--min-request-memory=inf",
        "--top=-1",
        "--top=1.5",
    ],
)
def test_out_of_range_settings_are_refused_at_their_flag(flag, capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["analyze", "sim:a100-16x8", flag])
    assert stop.value.code == 2
    assert f"argument {flag.split('=')[0]}:" in capsys.readouterr().err


def test_snapshot_output_dash_is_standard_output_not_a_file_named_dash(
    tmp_path, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["snapshot", "sim:a100-16x8?seed=2", "-o", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["schema"]
    assert list(tmp_path.iterdir()) == []


def test_snapshot_to_a_closed_stdout_is_one_line(monkeypatch, capsys) -> None:
    monkeypatch.setattr(sys, "stdout", None)
    assert main(["snapshot", "sim:a100-16x8?seed=2"]) == 1  # as every command (advisor.cli)
    err = capsys.readouterr().err
    assert err == (
        "gpu-defrag snapshot: error: cannot write to standard output: standard output is closed\n"
    )


def test_snapshot_to_a_full_stdout_is_one_line(tmp_path, monkeypatch, capsys) -> None:
    class Full:
        def write(self, _text: str) -> int:
            raise OSError(28, os.strerror(28))

        def flush(self) -> None:
            pass

    monkeypatch.setattr(sys, "stdout", Full())
    assert main(["snapshot", "sim:a100-16x8?seed=2"]) == 1  # as every command (advisor.cli)
    err = capsys.readouterr().err
    assert (
        err
        == "gpu-defrag snapshot: error: cannot write to standard output: No space left on device\n"
    )


def test_the_table_lists_only_nodes_with_a_fragment(tmp_path, capsys) -> None:
    """A full or whole-free node is not "most fragmented": the demo fleet at 7 d has three
    fragmented nodes and the table used to pad them with full ones at 0.00."""
    assert main(["analyze", "sim:a100-16x8?t=7d"]) == 0
    table = capsys.readouterr().out
    head, rows = table.split("Most fragmented nodes")[1].split("\n", 1)
    listed = [line.split() for line in rows.splitlines()[2:] if line.strip()]
    assert listed and f"top {len(listed)} " in head
    assert all(float(row[-2]) > 0 for row in listed)
    empty = add_nodes(  # one whole free node: nothing is fragmented
        ["a"],
        rack="r1",
        gpu_model="A100",
        cpu_milli=64000,
        memory_mib=512000,
        island=8,
        memory_total_bytes=80 * GIB,
    )
    snapshot.save(empty.build(), tmp_path / "free.json")
    assert main(["analyze", str(tmp_path / "free.json")]) == 0
    assert "Most fragmented nodes: none" in capsys.readouterr().out


def test_unknown_islands_are_unknown_per_node_too_and_shares_keep_two_decimals(
    tmp_path, capsys
) -> None:
    """Without NVLink data the summary said "unknown" while each node's column said 1; and a
    quarter-GPU share printed as 0.2."""
    from advisor.analyze import _g
    from advisor.app import data
    from advisor.fragmentation import measures
    from advisor.results import node_rows

    b = add_nodes(  # no island known
        ["a", "b"],
        4,
        rack="r1",
        gpu_model="T4",
        cpu_milli=64000,
        memory_mib=512000,
        memory_total_bytes=16 * GIB,
    )
    b.add_allocation("quarter", num_gpu=1, gpu_milli=250, node="a", gpus=[0], cpu_milli=1000)
    b.add_allocation("four", num_gpu=4, node="b", gpus=[0, 1, 2, 3], cpu_milli=1000)
    model = b.build()
    snapshot.save(model, tmp_path / "t4.json")
    assert main(["analyze", str(tmp_path / "t4.json")]) == 0
    table = capsys.readouterr().out
    assert re.search(r"largest job in one NVLink island +unknown", table)
    row = next(line for line in table.splitlines() if line.strip().startswith("a "))
    assert row.split()[4] == "unknown"  # node, model, free, free cap., NVLink grp
    assert "4.25 GPUs allocated" in table
    served = node_rows(model, measures.analyze(model))  # the rows the app reads (the API's)
    shown = data.worst_nodes({"nodes": served})
    assert len(shown) and shown["largest free NVLink group"].isna().all()
    assert [_g(x) for x in (0.25, 57.75, 1 / 7, 2.5, 3.0)] == ["0.25", "57.75", "0.14", "2.5", "3"]
