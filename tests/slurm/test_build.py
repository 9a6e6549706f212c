"""A parsed Slurm read as the cluster model (advisor.ingest.slurm.build), on the answers recorded
from a real 22.05 cluster and on the 24.11-shaped ones."""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from advisor.ingest.slurm.build import SlurmOptions, SlurmState, build_model
from advisor.ingest.slurm.jobs import parse_jobs
from advisor.ingest.slurm.nodes import parse_nodes
from advisor.ingest.slurm.reservations import parse_reservation_text, parse_reservations
from advisor.ingest.slurm.topology import racks

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
V2205, V2411 = FIXTURES / "22.05", FIXTURES / "24.11"
CASES = json.loads((V2205 / "cases.json").read_text())


def state_2205(with_topology: bool = True) -> SlurmState:
    nodes = parse_nodes(json.loads((V2205 / "sinfo.json").read_text()))
    jobs = parse_jobs(json.loads((V2205 / "squeue.json").read_text()), 8)
    reservations = parse_reservations(json.loads((V2205 / "rest-reservations.json").read_text()))
    topology = racks((V2205 / "topology.txt").read_text()) if with_topology else {}
    read_at = reservations[0].start + 60  # while maint16 holds node 16
    return SlurmState(nodes, jobs, topology, reservations, read_at, (22, 5))


def rows(model, column: str) -> dict[str, object]:
    allocs = model.allocations
    return dict(zip(allocs.id.tolist(), getattr(allocs, column).tolist(), strict=True))


def test_nodes_racks_pools_and_free_capacity():
    view = build_model(state_2205(), SlurmOptions(), source="slurm:")
    model = view.model
    assert len(model.nodes) == 16 and len(model.gpus) == 128
    racks_of = dict(zip(model.nodes.name, model.nodes.rack, strict=True))
    assert racks_of["a100-node-01"] == "rack-01" and racks_of["a100-node-16"] == "rack-02"
    pools = dict(zip(model.nodes.name, model.nodes.pool, strict=True))
    assert pools["a100-node-01"] == "borrow" and pools["a100-node-16"] == "a100"
    schedulable = dict(zip(model.nodes.name, model.nodes.schedulable.tolist(), strict=True))
    assert not schedulable["a100-node-05"]  # drained
    assert not schedulable["a100-node-16"]  # maintenance reservation, active
    assert schedulable["a100-node-15"]  # its reservation starts later
    assert view.unschedulable == {
        "a100-node-05": "idle+drain: bad GPU 3",
        "a100-node-16": "reservation maint16",
    }
    assert set(model.nodes.gpu_model) == {"a100"}
    assert model.nodes.cpu_milli[0] == 32_000 and model.nodes.memory_mib[0] == 256000
    assert np.isnan(model.gpus.memory_total_bytes).all()  # Slurm does not say
    assert (model.gpus.nvlink_island == -1).all()
    assert model.timestamp == state_2205().read_at and model.source == "slurm:"
    assert view.notes == ()


def test_running_jobs_are_placed_per_node_with_slurms_indices():
    model = build_model(state_2205(), SlurmOptions()).model
    allocs = model.allocations
    nodes = rows(model, "node")
    one, multi = CASES["running_2gpu"], CASES["multinode_3gpu"]
    assert model.nodes.name[nodes[one]] == "a100-node-01"
    tasks = [f"{multi}/a100-node-01", f"{multi}/a100-node-02"]
    assert all(rows(model, "job")[t] == multi for t in tasks)  # one gang
    row = allocs.id.tolist().index(tasks[0])
    held = model.placements.gpu[model.placements.alloc == row]
    assert model.gpus.index[held].tolist() == [2, 3, 4]
    assert rows(model, "num_gpu")[CASES["cpu_only"]] == 0
    assert rows(model, "cpu_milli")[CASES["cpu_only"]] == 4000
    assert rows(model, "tenant")[one] == "rnd"
    assert rows(model, "restart_cost_s")[tasks[0]] == 900
    assert math.isnan(rows(model, "restart_cost_s")[one])
    assert rows(model, "start_time")[one] > 0 and rows(model, "creation_time")[one] > 0
    assert model.gpu_milli_allocated.sum() == (2 + 3 + 3 + 1 + 4) * 1000


def test_migratable_follows_requeue_comment_and_priority_cap():
    model = build_model(state_2205(), SlurmOptions()).model
    movable = rows(model, "migratable")
    assert movable[CASES["running_2gpu"]]
    assert not movable[CASES["no_requeue"]]  # --no-requeue
    assert not movable[CASES["high_priority"]]  # its comment says gpu-defrag.io/migratable=false
    capped = build_model(state_2205(), SlurmOptions(max_priority=1000)).model
    # priority/basic gives every job 2^32-1-n (clipped to 2^31-1): above any cap
    assert not rows(capped, "migratable")[CASES["running_2gpu"]]


def test_pending_jobs_are_the_queue_with_their_reasons():
    view = build_model(state_2205(), SlurmOptions())
    model = view.model
    node = rows(model, "node")
    gang = CASES["gang_12x8"]
    tasks = [f"{gang}#{k}" for k in range(12)]
    assert all(node[t] == -1 for t in tasks)
    assert {rows(model, "job")[t] for t in tasks} == {gang}
    assert all(rows(model, "num_gpu")[t] == 8 for t in tasks)
    assert rows(model, "gpu_spec")[tasks[0]] == "a100"  # its partition's GPU model
    array = CASES["array_3x8"]
    assert [node[f"{array}_{t}"] for t in range(3)] == [-1] * 3
    assert view.pending_reasons[gang] == "Resources"
    assert view.pending_reasons[f"{array}_0"] == "Priority"
    assert CASES["held"] not in view.pending_reasons


def test_tenant_kind_and_partition_filter():
    by_user = build_model(state_2205(), SlurmOptions(tenant="user")).model
    assert set(by_user.allocations.tenant) == {"root"}
    only = build_model(state_2205(), SlurmOptions(partitions=("borrow",))).model
    assert len(only.nodes) == 13 and set(only.nodes.pool) == {"borrow"}
    assert CASES["gang_12x8"] + "#0" not in only.allocations.id.tolist()  # queued in a100


def test_no_topology_means_rack_unknown_and_says_so():
    view = build_model(state_2205(with_topology=False), SlurmOptions())
    assert set(view.model.nodes.rack) == {""}
    assert "every node's rack is unknown" in view.notes[0]
    partial = replace(state_2205(), racks={"a100-node-01": "r1"})
    assert "15 node(s) under no leaf switch" in build_model(partial, SlurmOptions()).notes[0]


def test_unknown_indices_take_the_lowest_free_and_never_overlap():
    state = state_2205()
    jobs = [
        replace(j, gpus=tuple((c, None) for c, _ in j.gpus)) if j.running else j for j in state.jobs
    ]
    model = build_model(replace(state, jobs=jobs), SlurmOptions()).model
    assert model.gpu_milli_allocated.max() == 1000  # no GPU held twice
    assert model.gpu_milli_allocated.sum() == 13 * 1000


def test_the_2411_shape_builds_the_same_way():
    nodes = parse_nodes(json.loads((V2411 / "nodes.json").read_text()))
    jobs = parse_jobs(json.loads((V2411 / "jobs.json").read_text()), 8)
    reservations = parse_reservations(json.loads((V2411 / "reservations.json").read_text()))
    state = SlurmState(nodes, jobs, {}, reservations, 1_767_225_600, (24, 11))
    view = build_model(state, SlurmOptions(tenant="qos"))
    model = view.model
    assert view.unschedulable == {"gpu2": "mixed+maintenance+reserved", "gpu3": "idle+drain: fan"}
    assert rows(model, "tenant")["103#0"] == "high"
    assert rows(model, "gpu_spec")["102"] == "h100"
    assert rows(model, "gpu_spec")["103#0"] == "h100"  # partition gpu: h100 (gpu4: h100 most)
    assert not rows(model, "migratable")["102"] and rows(model, "migratable")["101/gpu1"]
    assert rows(model, "restart_cost_s")["102"] == 600
    assert view.pending_reasons == {"103": "Priority", "106_0": "Resources", "106_1": "Resources"}


def test_text_reservations_build_like_json(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        text = parse_reservation_text((V2205 / "reservations.txt").read_text())
        a = build_model(replace(state_2205(), reservations=text), SlurmOptions())
        b = build_model(state_2205(), SlurmOptions())
        assert a.unschedulable == b.unschedulable
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_a_slurm_model_is_a_snapshot_like_any_other(tmp_path):
    """`gpu-defrag snapshot slurm:` writes what the loader reads back (ids JOB/NODE, JOB#K)."""
    from advisor import snapshot

    model = build_model(state_2205(), SlurmOptions(), source="slurm:").model
    snapshot.save(model, tmp_path / "slurm.json")
    again = snapshot.load(tmp_path / "slurm.json")
    assert again.summary() == model.summary()
    assert again.allocations.id.tolist() == model.allocations.id.tolist()
    assert again.nodes.schedulable.tolist() == model.nodes.schedulable.tolist()


def test_why_a_job_may_not_move_and_gang_sizes():
    view = build_model(state_2205(), SlurmOptions())
    assert view.pinned == {
        CASES["no_requeue"]: "not requeueable (--no-requeue or JobRequeue=0)",
        CASES["high_priority"]: "comment gpu-defrag.io/migratable=false",
    }
    assert view.gang_size[CASES["multinode_3gpu"]] == 2
    assert view.gang_size[CASES["gang_12x8"]] == 12
    capped = build_model(state_2205(), SlurmOptions(max_priority=1000))
    assert capped.pinned[CASES["running_2gpu"]] == "priority 2147483647 > max-priority 1000"
