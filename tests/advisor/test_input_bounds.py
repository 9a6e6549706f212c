"""Every size an input file can set is bounded and checked in linear time, each with one line:
a node of 100,000 GPUs stalled `plan` past 300 s (a quadratic duplicate-index check), a 1 MB
CSV field made `replay` print a traceback, and a duplicate GPU UUID, a byte-order mark inside a
file, duplicate pod names and negative pod times were read without a word."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from advisor import snapshot
from advisor.cli import main
from advisor.fragmentation.measures import largest_free_nvlink_group
from advisor.ingest import openb
from advisor.model import ModelBuilder
from gpu_defrag_common.config_text import load_yaml, parse_problem

ROOT = Path(__file__).resolve().parents[2]
POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,deletion_time,scheduled_time\n"
)
NODES = "sn,cpu_milli,memory_mib,gpu,model\nn1,64000,262144,2,P100\n"


def one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def snapshot_doc(nodes: list[dict]) -> dict:
    return {"schema": snapshot.SCHEMA, "version": 1, "nodes": nodes}


# --- snapshots ---


def test_a_node_of_100000_gpus_is_one_line_in_well_under_a_second_of_work(tmp_path):
    path = tmp_path / "huge.json"
    gpus = [{"index": i} for i in range(100_000)]
    path.write_text(json.dumps(snapshot_doc([{"name": "n1", "gpus": gpus}])))
    result = subprocess.run(
        [sys.executable, "-m", "advisor.cli", "plan", str(path), "--goal", "job=8"],
        capture_output=True,
        text=True,
        timeout=60,  # the old loader's quadratic check took > 300 s here
        cwd=ROOT,
    )
    assert result.returncode == 2
    assert result.stderr.strip().endswith("nodes[0].gpus: 100,000 GPUs on one node, at most 64")
    assert result.stderr.count("\n") == 1


def test_the_duplicate_gpu_index_check_is_linear():
    """The builder (also fed by live sources, without the snapshot's bound): 50,000 GPUs of
    one node took minutes with a list scan per GPU."""
    script = (
        "from advisor.model import ModelBuilder\n"
        "b = ModelBuilder(); b.add_node('n1')\n"
        "for i in range(50_000): b.add_gpu('n1', i)\n"
        "print(len(b.build().gpus))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert result.stdout.strip() == "50000", result.stderr
    builder = ModelBuilder()
    builder.add_node("n1")
    builder.add_gpu("n1", 3)
    with pytest.raises(ValueError, match=r"nodes\[n1\]\.gpus\[3\]: duplicate GPU index"):
        builder.add_gpu("n1", 3)


def test_a_gpu_uuid_given_twice_is_refused_by_path():
    nodes = [
        {"name": "n1", "gpus": [{"index": 0, "uuid": "GPU-a"}, {"index": 1, "uuid": ""}]},
        {"name": "n2", "gpus": [{"index": 0, "uuid": ""}, {"index": 1, "uuid": "GPU-a"}]},
    ]
    with pytest.raises(snapshot.SnapshotError) as error:
        snapshot.from_dict(snapshot_doc(nodes))
    assert str(error.value) == "nodes[1].gpus[1].uuid: 'GPU-a' is also nodes[0].gpus[0]'s"


def test_a_name_longer_than_the_bound_is_refused_by_path():
    with pytest.raises(snapshot.SnapshotError, match=r"^nodes\[0\]\.name: 5,000 characters"):
        snapshot.from_dict(snapshot_doc([{"name": "n" * 5000}]))


def test_counts_over_their_bounds_are_refused_before_they_are_read(monkeypatch):
    monkeypatch.setattr(snapshot, "MAX_NODES", 2)
    with pytest.raises(snapshot.SnapshotError, match=r"^nodes: 3 nodes, at most 2$"):
        snapshot.from_dict(snapshot_doc([{"name": f"n{i}"} for i in range(3)]))
    monkeypatch.setattr(snapshot, "MAX_USAGE_POINTS", 3)
    doc = snapshot_doc([{"name": "n1", "gpus": [{"index": 0}, {"index": 1}]}])
    doc["usage"] = {"times": [0, 60], "utilization_ratio": [], "memory_used_bytes": []}
    with pytest.raises(snapshot.SnapshotError, match=r"^usage\.times: 4 usage points"):
        snapshot.from_dict(doc)


def test_a_file_over_the_size_bound_is_refused_unread(tmp_path, monkeypatch, capsys):
    import advisor.input_bounds as bounds

    path = tmp_path / "s.json"
    path.write_text(json.dumps(snapshot_doc([{"name": "n1"}])) + " " * 2000)
    monkeypatch.setattr(bounds, "MAX_FILE_BYTES", 1024)
    assert main(["analyze", str(path)]) == 2
    assert "over the 0 MiB an input file may have" in one_line(capsys)


def test_gpu_indices_far_apart_keep_their_nodes_apart():
    """(node, island) was one int64 of node × 4096 + island: an index past 2,048 of an
    unknown island landed on another node (or out of range: IndexError in `plan`)."""
    builder = ModelBuilder()
    for node in ("n1", "n2"):
        builder.add_node(node)
        for index, island in ((0, 7), (5_000, 7), (3_000_000, 2_000_000_000)):
            builder.add_gpu(node, index, nvlink_island=island)
    model = builder.build()
    assert largest_free_nvlink_group(model).tolist() == [2, 2]  # two GPUs share island 7


# --- trace CSVs (replay, analyze openb:) ---


def write(path: Path, text: str, bom: bool = False) -> Path:
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode())
    return path


def replay(tmp_path: Path, pods: Path) -> list[str]:
    nodes = write(tmp_path / "nodes.csv", NODES)
    out = str(tmp_path / "out")
    return [
        *("replay", "--nodes", str(nodes), "--pods", str(pods)),
        *("--seeds", "1", "--policies", "fgd", "--out", out),
    ]


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (
            "p1,1000,1024,1,1000,0,9,0\np2,1000,1024,1,1000,0,9,0\np1,1000,1024,1,1000,0,9,0\n",
            "line 4, column name: duplicate pod name 'p1' (also line 2)",
        ),
        (
            "p1,1000,1024,1,1000,-50,-10,-50\n",
            "line 2, column creation_time: '-50' is out of range (0..",
        ),
        (
            "p1,1000,1024,1,1000,100,200,50\n",
            "line 2, column scheduled_time: 50 is before the pod's creation_time 100",
        ),
        (",1000,1024,1,1000,0,9,0\n", "line 2, column name: empty pod name"),
        ("p1,1000,1024,1,1000,0,9,0\n\ufeffp2,1000,1024,1,1000,0,9,0\n", "line 3: a byte-order"),
    ],
)
def test_pod_lists_that_cannot_be_a_trace_are_one_line(tmp_path, capsys, rows, message):
    pods = write(tmp_path / "pods.csv", POD_HEADER + rows)
    assert main(replay(tmp_path, pods)) == 2
    assert message in one_line(capsys)
    assert not (tmp_path / "out").exists()


def test_a_megabyte_field_is_one_line_not_a_traceback(tmp_path, capsys):
    pods = write(tmp_path / "pods.csv", POD_HEADER + f"p1,1,1,1,1000,0,9,0,{'x' * (1 << 20)}\n")
    assert main(replay(tmp_path, pods)) == 2
    assert "pods.csv line 2: a field longer than 131,072 characters" in one_line(capsys)


def test_a_byte_order_mark_at_the_start_only_reads_like_none(tmp_path):
    text = POD_HEADER + "p1,1000,1024,1,1000,0,9,0\n"
    with_mark = openb.read_pods(write(tmp_path / "a.csv", text, bom=True))
    without = openb.read_pods(write(tmp_path / "b.csv", text))
    assert with_mark.name.tolist() == without.name.tolist() == ["p1"]


def test_a_duplicate_node_name_at_the_end_of_a_long_list_is_found_in_linear_time(tmp_path):
    """The old check compared every name with the whole column until it met the duplicate."""
    lines = [f"n{i},64000,262144,8,A100" for i in range(60_000)] + ["n0,64000,262144,8,A100"]
    path = write(tmp_path / "nodes.csv", "sn,cpu_milli,memory_mib,gpu,model\n" + "\n".join(lines))
    script = (
        "import sys\nfrom advisor.ingest import openb\n"
        "try:\n    openb.read_nodes(sys.argv[1])\nexcept openb.OpenbFormatError as e:\n    print(e)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert "line 60002, column sn: duplicate node name 'n0' (also line 2)" in result.stdout


def test_rows_over_the_bound_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(openb, "MAX_ALLOCATIONS", 2)
    pods = write(tmp_path / "p.csv", POD_HEADER + "p1,1,1,1,1000,0,9,0\n" * 4)
    with pytest.raises(openb.OpenbFormatError, match=r"p\.csv: more than 2 rows"):
        openb.read_pods(pods)


# --- hand-written YAML configs (policy, web config) ---


def test_yaml_aliases_that_expand_past_the_bound_are_one_line():
    lines = ['a0: &a0 ["x","x","x","x","x","x","x","x","x","x"]']
    lines += [f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    with pytest.raises(yaml.YAMLError) as error:
        load_yaml("\n".join(lines))
    assert parse_problem(error.value) == (
        "line 1, column 1: aliases expand to 1,234,567,909 values, at most 100,000"
    )
    merged = load_yaml("base: &b {x: 1}\nother:\n  <<: *b\n  y: 2\n")  # a few aliases: fine
    assert merged["other"] == {"x": 1, "y": 2}
