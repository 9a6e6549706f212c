"""The Slurm readers' pure parsing: host lists, GRES/TRES strings, topology, reservations, and
whole answers recorded from a real 22.05 cluster (tests/fixtures/slurm/record.py) and written
in 24.11's v0.0.42 shape (make_v0042.py)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest

from advisor.ingest.slurm import gres
from advisor.ingest.slurm.hostlist import HostlistError, expand
from advisor.ingest.slurm.jobs import NEVER_STARTS, array_tasks, comment_fields, parse_jobs
from advisor.ingest.slurm.nodes import parse_nodes, partition_sizes, pool_of
from advisor.ingest.slurm.reservations import (
    parse_reservation_text,
    parse_reservations,
    reserved_nodes,
)
from advisor.ingest.slurm.rest import choose_api
from advisor.ingest.slurm.topology import racks
from advisor.ingest.slurm.values import SlurmFormatError, number, records, version, words

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
V2205 = FIXTURES / "22.05"
V2411 = FIXTURES / "24.11"


def load(path: Path) -> dict:
    return json.loads(path.read_text())


CASES = load(V2205 / "cases.json")


# --------------------------------------------------------------------------- small shapes


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("gpu[01-03]", ["gpu01", "gpu02", "gpu03"]),
        ("gpu[1,3-4],login", ["gpu1", "gpu3", "gpu4", "login"]),
        ("r[1-2]-n[08-09]", ["r1-n08", "r1-n09", "r2-n08", "r2-n09"]),
        ("a100-node-[09-10]", ["a100-node-09", "a100-node-10"]),
        ("n[098-101]", ["n098", "n099", "n100", "n101"]),
        ("", []),
        (None, []),
    ],
)
def test_hostlist_expands_as_slurm_prints(text, names):
    assert expand(text) == names


@pytest.mark.parametrize("text", ["gpu[1-", "gpu[3-1]", "gpu[a-b]", "gpu[[1]]", "gpu]1["])
def test_hostlist_refuses_what_slurm_never_prints(text):
    with pytest.raises(HostlistError, match="host list"):
        expand(text)


def test_gres_forms_of_every_version():
    entry = gres.GresEntry
    assert gres.entries("gpu:a100:8(S:0-1)") == (entry("a100", 8, None),)
    assert gres.entries("gpu:a100:3(IDX:0,2,5)") == (entry("a100", 3, (0, 2, 5)),)
    assert gres.entries("gpu:h100:2(IDX:0-1),gpu:h200:4(IDX:2-5)") == (
        entry("h100", 2, (0, 1)),
        entry("h200", 4, (2, 3, 4, 5)),
    )
    assert gres.entries("gpu:0(IDX:N/A)") == (entry("", 0, None),)
    assert gres.entries("gres:gpu:8") == (entry("", 8, None),)  # 22.05 request
    assert gres.entries("gres/gpu:h100:2,gres/nic:1") == (entry("h100", 2, None),)
    assert gres.entries("gpu:tesla") == (entry("tesla", 1, None),)
    assert gres.entries("nic:2,shard:a100:16") == ()
    assert gres.entries("N/A") == gres.entries("") == ()
    assert gres.gpu_type(gres.entries("gpu:h100:2,gpu:h200:4")) == "h200"
    with pytest.raises(SlurmFormatError, match="count"):
        gres.entries("gpu:a100:eight")


def test_tres_strings():
    values = gres.tres("cpu=4,mem=1000M,node=2,billing=4,gres/gpu=16,gres/gpu:a100=16")
    assert values["cpu"] == 4 and values["mem"] == 1000 and values["gres/gpu"] == 16
    assert gres.tres("mem=250G")["mem"] == 256000
    assert gres.tres("mem=2T")["mem"] == 2 * 1024**2
    assert gres.tres_gpus("cpu=2,gres/gpu=16,gres/gpu:a100=16") == (16, "a100")
    assert gres.tres_gpus("cpu=2,node=1") == (0, "")


def test_version_shapes():
    assert number({"set": True, "infinite": False, "number": 7}) == 7
    assert number({"set": False, "infinite": False, "number": 0}) is None
    assert number({"set": True, "infinite": True, "number": 0}) is None
    assert number(5) == 5 and number(None) is None and number(True) is None
    assert words("mixed") == ("MIXED",)
    assert words(["IDLE", "DRAIN"]) == ("IDLE", "DRAIN")
    assert words("IDLE+DRAIN") == ("IDLE", "DRAIN")
    assert version(load(V2205 / "squeue.json")) == (22, 5)
    assert version(load(V2411 / "jobs.json")) == (24, 11)


def test_an_old_slurm_an_error_and_an_unknown_shape_are_one_line_each():
    old = {"meta": {"Slurm": {"version": {"major": 20, "minor": 11, "micro": 9}}}, "jobs": []}
    with pytest.raises(SlurmFormatError, match=r"Slurm 20.11 prints no JSON.*21.08 or newer"):
        records(old, "jobs", "squeue --json")
    failed = {"errors": [{"error": "Unable to contact slurm controller", "error_number": 1007}]}
    with pytest.raises(SlurmFormatError, match=r"Slurm reported an error: Unable to contact.*1007"):
        records(failed, "jobs", "squeue --json")
    grouped = {"sinfo": [], "meta": {}, "errors": []}  # 23.02+ sinfo --json groups nodes
    with pytest.raises(SlurmFormatError, match=r"no 'nodes' list.*keys: errors, meta, sinfo"):
        records(grouped, "nodes", "sinfo --json")


def test_comment_words_and_array_tasks():
    assert comment_fields("eval gpu-defrag.io/restart-cost=15m, x") == {
        "gpu-defrag.io/restart-cost": "15m"
    }
    # the admin comment (users cannot edit it) wins over the user's
    assert comment_fields("gpu-defrag.io/migratable=true", "gpu-defrag.io/migratable=false") == {
        "gpu-defrag.io/migratable": "false"
    }
    assert array_tasks("0-3%2") == [0, 1, 2, 3]
    assert array_tasks("1,5-9:2") == [1, 5, 7, 9]
    assert array_tasks("") == []


# --------------------------------------------------------------------------- topology, reservations


def test_topology_leaf_switches_are_racks():
    found = racks((V2205 / "topology.txt").read_text())  # scontrol show topology
    assert found["a100-node-01"] == found["a100-node-08"] == "rack-01"
    assert found["a100-node-09"] == found["a100-node-16"] == "rack-02"
    assert len(found) == 16  # the spine lists every node too, and is not a rack
    conf = "# leaves\nSwitchName=s1 Nodes=gpu[1-2]\nSwitchName=s2 Nodes=gpu3\nSwitchName=top Switches=s[1-2]\n"
    assert racks(conf) == {"gpu1": "s1", "gpu2": "s1", "gpu3": "s2"}
    assert racks("BlockName=b1 Nodes=gpu[1-2]\n") == {"gpu1": "b1", "gpu2": "b1"}
    assert racks("") == {}


def test_reservations_from_text_and_json(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")  # scontrol printed local times on a machine in UTC
    time.tzset()
    text = parse_reservation_text((V2205 / "reservations.txt").read_text())
    rest = parse_reservations(load(V2205 / "rest-reservations.json"))
    assert [r.name for r in text] == [r.name for r in rest] == ["maint16", "later15"]
    for a, b in zip(text, rest, strict=True):  # scontrol's local time = slurmrestd's Unix time
        assert (a.nodes, a.start, a.end) == (b.nodes, b.start, b.end)
    maint, later = text
    assert maint.flags[0] == "MAINT" and later.accounts == "rnd"
    assert reserved_nodes(text, maint.start + 60) == {"a100-node-16": "maint16"}
    assert reserved_nodes(text, later.start + 60) == {"a100-node-15": "later15"}  # maint ended
    assert parse_reservation_text("No reservations in the system\n") == []
    (modern,) = parse_reservations(load(V2411 / "reservations.json"))
    assert modern.nodes == ("gpu2",) and modern.active(1_767_225_600)


# --------------------------------------------------------------------------- nodes


def test_nodes_of_a_real_2205_cluster():
    nodes = {n.name: n for n in parse_nodes(load(V2205 / "sinfo.json"))}
    assert len(nodes) == 16
    first = nodes["a100-node-01"]
    assert (first.gpu_count, first.gpu_type, first.cpus, first.memory_mib) == (
        8,
        "a100",
        32,
        256000,
    )
    assert first.used[0].indices == (0, 1, 2, 3, 4)  # job 1 on 0-1, job 2 on 2-4
    assert not nodes["a100-node-05"].free_for_work  # drained
    assert nodes["a100-node-05"].reason == "bad GPU 3"
    assert nodes["a100-node-09"].free_for_work
    # slurmrestd's /nodes is the same model as sinfo --json
    assert parse_nodes(load(V2205 / "rest-nodes.json")) == list(nodes.values())


def test_nodes_of_the_2411_shape():
    nodes = {n.name: n for n in parse_nodes(load(V2411 / "nodes.json"))}
    assert not nodes["gpu2"].free_for_work and not nodes["gpu3"].free_for_work
    assert nodes["gpu1"].free_for_work and nodes["gpu4"].free_for_work
    assert nodes["gpu4"].gpu_count == 8 and nodes["gpu4"].gpu_type == "h100"  # tie: first listed
    assert nodes["gpu1"].cpus == 64


def test_pool_is_the_most_specific_partition():
    nodes = parse_nodes(load(V2205 / "sinfo.json"))
    sizes = partition_sizes(nodes)
    assert sizes == {"a100": 16, "borrow": 13}
    pools = {n.name: pool_of(n, sizes) for n in nodes}
    assert pools["a100-node-13"] == "borrow" and pools["a100-node-14"] == "a100"


# --------------------------------------------------------------------------- jobs


def test_jobs_of_a_real_2205_cluster():
    jobs = {j.id: j for j in parse_jobs(load(V2205 / "squeue.json"), largest_node_gpus=8)}
    running = jobs[CASES["running_2gpu"]]
    assert running.running and running.nodes == ("a100-node-01",)
    assert running.gpus == ((2, (0, 1)),) and running.account == "rnd"
    multi = jobs[CASES["multinode_3gpu"]]
    assert multi.nodes == ("a100-node-01", "a100-node-02")
    assert multi.gpus == ((3, (2, 3, 4)), (3, (0, 1, 2)))
    assert multi.comment_fields == {"gpu-defrag.io/restart-cost": "15m"}
    assert not jobs[CASES["no_requeue"]].requeue and jobs[CASES["running_2gpu"]].requeue
    assert jobs[CASES["high_priority"]].priority == 100000
    # priority/basic prints 2^32 - 1 - n; the model holds int32
    assert running.priority == 2**31 - 1
    assert jobs[CASES["cpu_only"]].gpus == ((0, None),)
    gang = jobs[CASES["gang_12x8"]]
    assert not gang.running and gang.reason == "Resources" and gang.gpus == ((8, None),) * 12
    assert gang.memory_mib_per_task == 256000 and gang.cpus_per_task == 1
    per_job = jobs[CASES["per_job_12"]]  # --gpus=12: Slurm's node count 2, 6 GPUs on each
    assert per_job.gpus == ((6, None), (6, None))
    array = CASES["array_3x8"]
    assert [jobs[f"{array}_{t}"].gpus for t in range(3)] == [((8, None),)] * 3
    # a held job and one waiting on a dependency never start by themselves: not demand
    assert CASES["held"] not in jobs and CASES["dependency"] not in jobs
    assert {"JobHeldUser", "Dependency"} <= NEVER_STARTS
    rest = {j.id: j for j in parse_jobs(load(V2205 / "rest-jobs.json"), largest_node_gpus=8)}
    assert repr(rest) == repr(jobs)  # slurmrestd's /jobs is squeue --json's model (NaN == NaN)


def test_jobs_of_the_2411_shape():
    jobs = {j.id: j for j in parse_jobs(load(V2411 / "jobs.json"), largest_node_gpus=8)}
    assert set(jobs) == {"101", "102", "103", "106_0", "106_1"}  # 104 BeginTime, 105 done
    two = jobs["101"]
    assert two.gpus == ((4, (0, 1, 2, 3)), (4, (4, 5, 6, 7))) and two.priority == 5000
    assert two.cpus_per_task == 8 and two.memory_mib_per_task == 65536  # job_resources
    typed = jobs["102"]
    assert typed.gpu_type == "h100" and not typed.requeue and typed.account == "eval"
    queued = jobs["103"]
    assert queued.gpus == ((8, None), (8, None)) and queued.qos == "high"
    assert math.isnan(queued.start_time) and queued.submit_time == 1_767_225_000


def test_a_bad_job_is_named():
    doc = load(V2205 / "squeue.json")
    doc["jobs"][0]["nodes"] = "a100-node-[03-01]"
    with pytest.raises(SlurmFormatError, match=r"^job 1: host list .* runs backwards"):
        parse_jobs(doc)


@pytest.fixture(autouse=True)
def _restore_timezone():
    yield
    time.tzset()


def test_the_rest_version_is_the_newest_both_know():
    recorded = load(V2205 / "rest-openapi.json")  # what 22.05's slurmrestd serves
    assert choose_api(recorded, "slurmrestd") == "v0.0.38"
    newer = {
        "paths": {"/slurm/v0.0.41/jobs": {}, "/slurm/v0.0.42/jobs/": {}, "/slurm/v0.0.99/jobs": {}}
    }
    assert choose_api(newer, "slurmrestd") == "v0.0.42"
    with pytest.raises(
        SlurmFormatError, match=r"serves no Slurm API this reader knows \(it serves v0\.0\.36"
    ):
        choose_api({"paths": {"/slurm/v0.0.36/jobs": {}}}, "slurmrestd")
