"""The generic job CSV (read, refused, written back), the simulated fleet's export, and the
`simulate` / `export-jobs` commands end to end on small files."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

from advisor.cli import main
from advisor.ingest.openb import read_nodes, read_pods
from advisor.simulate.jobs import (
    JOB_COLUMNS,
    JobFormatError,
    from_openb,
    job_csv_text,
    read_job_csv,
)
from advisor.simulate.metrics import BY_SIZE_COLUMNS, SUMMARY_COLUMNS
from advisor.simulate.outputs import FILES
from advisor.simulate.targets import TARGET_COLUMNS

HEADER = ",".join(JOB_COLUMNS)


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_a_job_csv_reads_every_column(tmp_path: Path) -> None:
    path = write(
        tmp_path / "jobs.csv",
        f"{HEADER},name,cpu_milli,utilization,restart_s,migratable\n"
        "0,3600,2,8,1000,rnd,100,A100|H100,train-a,4000,0.75,600,true\n"
        "30.5,60,1,1,250,,10,,note-b,0,,,false\n",
    )
    jobs = read_job_csv(path)
    assert jobs.name.tolist() == ["train-a", "note-b"]
    assert jobs.num_nodes.tolist() == [2, 1] and jobs.num_gpu.tolist() == [8, 1]
    assert jobs.gpus.tolist() == [16.0, 0.25]
    assert jobs.gpu_spec.tolist() == ["A100|H100", ""]
    assert jobs.cpu_milli.tolist() == [4000, 0] and jobs.memory_mib.tolist() == [0, 0]
    assert jobs.utilization[0] == 0.75 and math.isnan(jobs.utilization[1])
    assert jobs.restart_s[0] == 600 and math.isnan(jobs.restart_s[1])
    assert jobs.migratable.tolist() == [True, False]
    again = read_job_csv(write(tmp_path / "again.csv", job_csv_text(jobs)))
    for column in ("submit_s", "duration_s", "num_nodes", "num_gpu", "gpu_milli", "priority"):
        assert getattr(again, column).tolist() == getattr(jobs, column).tolist()
    assert again.name.tolist() == jobs.name.tolist()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("submit_time,duration_s\n1,2\n", "line 1: missing column(s) num_nodes"),
        (f"{HEADER},colour\n0,1,1,1,1000,t,0,,red\n", "unknown column(s) colour"),
        (f"{HEADER}\n0,abc,1,1,1000,t,0,\n", "line 2, column duration_s: 'abc' is not a number"),
        (f"{HEADER}\n0,0,1,1,1000,t,0,\n", "line 2, column duration_s: 0 is not above 0"),
        (f"{HEADER}\n0,10,0,1,1000,t,0,\n", "line 2, column num_nodes: '0' is out of range"),
        (f"{HEADER}\n0,10,1,2,500,t,0,\n", "line 2, column gpu_milli: 500 with gpus_per_node 2"),
        (f"{HEADER}\n0,10,1,1.5,1000,t,0,\n", "column gpus_per_node: '1.5' is not an integer"),
        (f"{HEADER}\n0,10,1,1,1000,t,0\n", "line 2: 7 fields, the header has 8"),
        (f"{HEADER},name\n0,1,1,1,1000,t,0,,a\n0,1,1,1,1000,t,0,,a\n", "duplicate job name 'a'"),
        (f"{HEADER},migratable\n0,1,1,1,1000,t,0,,maybe\n", "'maybe' is not true or false"),
        (f"{HEADER}\n", "no jobs"),
    ],
)
def test_a_bad_job_csv_is_one_line_naming_where(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path / "jobs.csv", text)
    with pytest.raises(JobFormatError) as error:
        read_job_csv(path)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_pod_list_without_times_cannot_be_replayed(tmp_path: Path) -> None:
    pods = write(
        tmp_path / "pods.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,1024,1,1000\n",
    )
    with pytest.raises(JobFormatError, match="without creation_time or deletion_time"):
        from_openb(read_pods(pods))


def test_a_pod_runs_from_its_scheduled_time_and_waits_are_replayed_not_copied(
    tmp_path: Path,
) -> None:
    pods = write(
        tmp_path / "pods.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
        "deletion_time,scheduled_time\n"
        "p0,1000,1024,1,1000,,LS,Running,100,700,160\n"
        "p1,1000,1024,0,0,,BE,Pending,200,260,\n",
    )
    jobs = from_openb(read_pods(pods))
    assert jobs.submit_s.tolist() == [100.0, 200.0]
    assert jobs.duration_s.tolist() == [540.0, 60.0]  # scheduled..deleted; never scheduled: all


def cluster_files(tmp_path: Path) -> tuple[Path, Path]:
    nodes = write(
        tmp_path / "nodes.csv",
        "sn,cpu_milli,memory_mib,gpu,model\n"
        + "".join(f"n{i},64000,262144,8,A100\n" for i in range(4)),
    )
    rows = [f"{HEADER}"]
    for i in range(8):
        rows.append(f"{i},{36000 + 3600 * i},1,2,1000,t,0,")
    rows.append("100,3600,1,8,1000,t,0,")
    rows.append("5000,60,1,1,1000,t,0,")
    return nodes, write(tmp_path / "jobs.csv", "\n".join(rows) + "\n")


def test_simulate_writes_its_files_with_the_summary_columns(tmp_path: Path, capsys) -> None:
    nodes, jobs = cluster_files(tmp_path)
    out = tmp_path / "out"
    code = main(
        [
            "simulate",
            "--nodes",
            str(nodes),
            "--jobs",
            str(jobs),
            "--load",
            "0.5",
            "--policies",
            "leastallocated,mostallocated",
            "--advisor",
            "off,consolidate",
            "--migration-budget",
            "1",
            "--workers",
            "1",
            "--out",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    with (out / "summary.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert tuple(rows[0]) == SUMMARY_COLUMNS
    assert [(r["policy"], r["advisor"]) for r in rows] == [
        ("leastallocated", "off"),
        ("leastallocated", "consolidate"),
        ("mostallocated", "off"),
        ("mostallocated", "consolidate"),
    ]
    with (out / "by_size.csv").open() as fh:
        sizes = list(csv.DictReader(fh))
    assert tuple(sizes[0]) == BY_SIZE_COLUMNS
    assert {r["size_gpus"] for r in sizes} == {"1", "2", "8"}
    for name in ("wait_cdf.png", "allocation.png", "runs.csv"):
        assert (out / name).stat().st_size > 0
    with (out / "targets.csv").open() as fh:
        targets = list(csv.DictReader(fh))
    assert tuple(targets[0]) == TARGET_COLUMNS
    assert [(r["policy"], r["advisor"]) for r in targets] == [
        ("leastallocated", "consolidate"),
        ("mostallocated", "consolidate"),
    ]
    off = {r["policy"]: r for r in rows if r["advisor"] == "off"}
    for target in targets:
        base = float(off[target["policy"]]["wait_p90_s_big"])
        assert float(target["wait_p90_s_big_off"]) == base
        assert target["within_budget"] == "True"  # --migration-budget 1: 100 %/day
    verdicts = [line for line in printed.splitlines() if "targets " in line]
    assert len(verdicts) == 2 and all("advisor consolidate seed 42: " in v for v in verdicts)
    assert "wrote" in printed


def test_simulate_refuses_a_bad_job_file_in_one_line(tmp_path: Path, capsys) -> None:
    nodes, _ = cluster_files(tmp_path)
    bad = write(tmp_path / "bad.csv", f"{HEADER},extra\n0,1,1,1,1000,t,0,,x\n")
    code = main(["simulate", "--nodes", str(nodes), "--jobs", str(bad), "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "unknown column(s) extra" in err
    assert err.startswith("gpu-defrag simulate: error: ")
    assert not (tmp_path / "summary.csv").exists()


def test_simulate_json_is_the_csv_rows_and_nothing_else_on_stdout(tmp_path: Path, capsys) -> None:
    nodes, jobs = cluster_files(tmp_path)
    out = tmp_path / "out"
    args = ["--nodes", str(nodes), "--jobs", str(jobs), "--load", "0.5", "--workers", "1"]
    flags = ["--policies", "mostallocated", "--advisor", "off,consolidate", "--out", str(out)]
    assert main(["simulate", *args, *flags, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)  # the whole of stdout is one document
    with (out / "summary.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [tuple(r) for r in document["summary"]] == [SUMMARY_COLUMNS] * 2
    for row, written in zip(document["summary"], rows, strict=True):
        assert {k: str(v) for k, v in row.items() if v is not None} == {
            k: v for k, v in written.items() if v != ""
        }
    with (out / "by_size.csv").open() as fh:
        assert len(document["by_size"]) == len(list(csv.DictReader(fh)))
    with (out / "targets.csv").open() as fh:
        targets = list(csv.DictReader(fh))
    assert [r["advisor"] for r in document["targets"]] == [r["advisor"] for r in targets]
    assert [tuple(r) for r in document["targets"]] == [TARGET_COLUMNS]
    assert document["wrote"] == [str(out / name) for name in FILES]
    assert document["scaling"]["jobs"] > 0 and document["scaling"]["factor"] > 0


def test_export_jobs_writes_a_node_list_and_jobs_the_replay_reads(tmp_path: Path, capsys) -> None:
    out = tmp_path / "sim"
    code = main(["export-jobs", "sim:a100-16x8?nodes=8&seed=3", "--days", "2", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    nodes = read_nodes(out / "nodes.csv")
    jobs = read_job_csv(out / "jobs.csv")
    assert len(nodes) == 8 and nodes.rack is not None and set(nodes.rack) == {"rack-01"}
    assert nodes.pool is not None and set(nodes.pool) == {"a100"}
    assert len(jobs) > 50
    assert float(jobs.submit_s.max()) < 2 * 86400
    assert set(jobs.gpu_spec.tolist()) == {"NVIDIA A100-SXM4-80GB"}
    assert (jobs.num_nodes > 1).any()  # 16- and 32-GPU training jobs are gangs of 8-GPU tasks
    assert set(jobs.num_gpu[jobs.num_nodes > 1].tolist()) == {8}
    assert ((jobs.utilization >= 0) & (jobs.utilization <= 1)).all()
    assert not jobs.migratable[jobs.priority == 10].any()  # notebooks stay where they are
    assert np.isnan(jobs.restart_s).all()


def test_export_jobs_refuses_what_is_not_a_simulated_fleet(tmp_path: Path, capsys) -> None:
    code = main(["export-jobs", "openb:x.csv", "--out", str(tmp_path / "x")])
    assert code == 2 and "expected sim:PRESET" in capsys.readouterr().err
