"""The openb reader: typed columns, optional columns, one-line errors naming file/line/column."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from advisor.ingest.openb import OpenbFormatError, read_nodes, read_pods

POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time\n"
)


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_read_nodes(tmp_path: Path) -> None:
    p = _write(
        tmp_path,
        "nodes.csv",
        "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,P100\nn1,96000,1000,0,\n",
    )
    t = read_nodes(p)
    assert len(t) == 2
    assert t.cpu_milli.dtype == np.int64
    assert t.gpu.tolist() == [2, 0]
    assert t.model.tolist() == ["P100", ""]
    assert t.total_gpus == 2


def test_read_pods_all_columns(tmp_path: Path) -> None:
    p = _write(
        tmp_path,
        "pods.csv",
        POD_HEADER
        + "p0,12000,16384,1,1000,,LS,Running,0,12537496,0\n"
        + "p1,6000,12288,1,460,V100M16|V100M32,BE,Pending,427061,,\n"
        + "p2,88000,1000,8,1000,,LS,Failed,5,6,5\n",
    )
    t = read_pods(p)
    assert t.num_gpu.tolist() == [1, 1, 8]
    assert t.gpu_milli.tolist() == [1000, 460, 1000]
    assert t.total_gpu_milli.tolist() == [1000, 460, 8000]
    assert t.gpu_spec.tolist() == ["", "V100M16|V100M32", ""]
    assert t.qos.tolist() == ["LS", "BE", "LS"]
    assert t.pod_phase[1] == "Pending"
    assert t.creation_time[1] == 427061.0
    assert np.isnan(t.deletion_time[1]) and np.isnan(t.scheduled_time[1])
    assert t.take(np.array([2, 0])).name.tolist() == ["p2", "p0"]


def test_read_pods_five_columns(tmp_path: Path) -> None:
    p = _write(
        tmp_path, "mg.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,10,2,1000\n"
    )
    t = read_pods(p)
    assert t.gpu_spec.tolist() == [""]
    assert np.isnan(t.creation_time).all()


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        ("p0,abc,1,1,500,,LS,Running,0,1,0", "line 2, column cpu_milli: 'abc' is not an integer"),
        ("p0,1000,1,1,1500,,LS,Running,0,1,0", "line 2, column gpu_milli: 1500 is out of range"),
        ("p0,1000,1,0,500,,LS,Running,0,1,0", "column gpu_milli: 500 but num_gpu is 0"),
        ("p0,1000,1,2,500,,LS,Running,0,1,0", "multi-GPU requests must be whole GPUs"),
        ("p0,1000,1,1,500,,LS,Running,x,1,0", "column creation_time: 'x' is not a number"),
        ("p0,1000,1,1,500", "line 2: 5 fields, the header has 11"),
        ("p0,-5,1,1,500,,LS,Running,0,1,0", "column cpu_milli: -5 is out of range"),
    ],
)
def test_malformed_pods_name_file_line_column(tmp_path: Path, row: str, needle: str) -> None:
    p = _write(tmp_path, "bad.csv", POD_HEADER + row + "\n")
    with pytest.raises(OpenbFormatError) as info:
        read_pods(p)
    msg = str(info.value)
    assert str(p) in msg
    assert needle in msg
    assert "\n" not in msg


def test_missing_column_and_missing_file(tmp_path: Path) -> None:
    p = _write(tmp_path, "nodes.csv", "sn,cpu_milli,gpu,model\nn0,1,1,T4\n")
    with pytest.raises(OpenbFormatError, match="line 1: missing column\\(s\\) memory_mib"):
        read_nodes(p)
    with pytest.raises(OpenbFormatError, match="cannot read file"):
        read_nodes(tmp_path / "nope.csv")
    q = _write(tmp_path, "n2.csv", "sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,2,\n")
    with pytest.raises(OpenbFormatError, match="line 2, column model: empty"):
        read_nodes(q)


def test_a_node_list_without_nodes_is_refused(tmp_path: Path, capsys) -> None:
    from advisor.cli import main

    p = _write(tmp_path, "nodes.csv", "sn,cpu_milli,memory_mib,gpu,model\n")
    with pytest.raises(OpenbFormatError, match=f"^no nodes in {p}$"):
        read_nodes(p)
    assert main(["analyze", f"openb:{p}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"no nodes in {p}" in err
