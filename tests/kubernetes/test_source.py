"""`k8s:` read with the real client from a fake API server: nodes, pods, gangs, the queue,
sharing, quotas. Every object is in the API's own JSON shape (tests/kubernetes/objects.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from advisor.ingest.sources import SourceError, load_source
from tests.kubernetes import objects as k

RACK = {"topology.kubernetes.io/rack": "r1"}


def rows(model):
    return {str(i): r for r, i in enumerate(model.allocations.id.tolist())}


def test_nodes_racks_pools_and_what_is_not_capacity(kube):
    kube(
        {
            "nodes": [
                k.node("n1", labels={**RACK, "cloud.google.com/gke-nodepool": "a100"}),
                k.node("n2", labels={"topology.kubernetes.io/rack": "r2"}, unschedulable=True),
                k.node("n3", ready=False),
                k.node("n4", taints=[{"key": "maintenance", "value": "x", "effect": "NoExecute"}]),
                k.node("cpu-only", gpus=0, product="")
                | {"metadata": {"name": "cpu-only", "labels": {}}},
            ]
        }
    )
    model = load_source("k8s:")
    names = model.nodes.name.tolist()
    assert names == ["n1", "n2", "n3", "n4"]  # GPU nodes only
    assert model.nodes.rack.tolist() == ["r1", "r2", "", ""]
    assert model.nodes.pool.tolist()[0] == "a100"
    # the nvidia.com/gpu dedication taint every node has is no cordon, even with no GPU pod
    assert model.nodes.schedulable.tolist() == [True, False, False, False]
    facts = model.scheduler
    assert facts.rack_from == "node label topology.kubernetes.io/rack"
    assert "2 GPU node(s) lack the rack label" in " ".join(facts.notes)
    assert model.nodes.gpu_model[0] == "NVIDIA-A100-SXM4-80GB"
    assert len(model.gpus) == 32


def test_dedication_taint_tolerated_by_gpu_pods_is_no_cordon(kube):
    kube(
        {
            "nodes": [
                k.node("n1", labels=RACK),
                k.node("n2", labels=RACK, unschedulable=True),
                k.node("n3", labels=RACK, taints=[{"key": "bad-gpu", "effect": "NoSchedule"}]),
            ],
            "pods": [k.pod("t", "p", 1, node_name="n1")],
        }
    )
    model = load_source("k8s:")
    assert model.nodes.schedulable.tolist() == [True, False, False]
    note = next(n for n in model.scheduler.notes if "not free capacity" in n)
    assert "cordoned" in note and "taint bad-gpu:NoSchedule" in note
    assert model.gpu_is_free.sum() == 7


def test_pods_placed_and_the_queue_with_gangs(kube):
    kube(
        {
            "nodes": [k.node("n1", labels=RACK), k.node("n2", labels=RACK)],
            "pods": [
                # a PyTorchJob of 2 workers, running
                k.pod(
                    "rnd",
                    "pt-0",
                    8,
                    node_name="n1",
                    owner=("PyTorchJob", "pt"),
                    labels={"training.kubeflow.org/job-name": "pt"},
                ),
                k.pod(
                    "rnd",
                    "pt-1",
                    4,
                    node_name="n2",
                    owner=("PyTorchJob", "pt"),
                    labels={"training.kubeflow.org/job-name": "pt"},
                ),
                # a coscheduling gang of 4 x 8, 3 pods created so far, waiting
                *[
                    k.pod("rnd", f"big-{i}", 8, labels={"scheduling.x-k8s.io/pod-group": "big"})
                    for i in range(3)
                ],
                # a CPU pod on a GPU node counts its CPU; a CPU pod elsewhere is not read
                k.pod("ops", "logger", 0, node_name="n2", owner=("DaemonSet", "logger")),
                k.pod("ops", "web", 0, node_name="elsewhere", owner=("ReplicaSet", "web-1")),
                # finished pods are no load (the server filters them)
                k.pod("rnd", "done", 8, node_name="n2", phase="Succeeded"),
            ],
            "coscheduling-podgroups": [k.coscheduling_podgroup("rnd", "big", 4)],
        }
    )
    model = load_source("k8s:")
    allocs, row = model.allocations, rows(model)
    assert set(row) == {"rnd/pt-0", "rnd/pt-1", "rnd/big-0", "rnd/big-1", "rnd/big-2", "ops/logger"}
    assert allocs.job[row["rnd/pt-0"]] == allocs.job[row["rnd/pt-1"]] == "rnd/pt"
    assert allocs.job[row["rnd/big-0"]] == "rnd/big" and allocs.node[row["rnd/big-0"]] == -1
    assert model.scheduler.gang_size["rnd/big"] == 4
    assert allocs.num_gpu[row["ops/logger"]] == 0 and allocs.cpu_milli[row["ops/logger"]] == 4000
    assert "Insufficient nvidia.com/gpu" in model.scheduler.waiting_reason["rnd/big"]
    assert allocs.tenant[row["rnd/pt-0"]] == "rnd"
    assert allocs.start_time[row["rnd/pt-0"]] == 1767229200.0


def test_movability_rules(kube):
    kube(
        {
            "nodes": [k.node("n1", 16, labels=RACK)],
            "pods": [
                k.pod("a", "job", 1, node_name="n1", owner=("Job", "j")),
                k.pod("a", "high", 1, node_name="n1", priority=1_000_000),
                k.pod(
                    "a",
                    "high-ok",
                    1,
                    node_name="n1",
                    priority=2_000_000,
                    annotations={"gpu-defrag.io/migratable": "true"},
                ),
                k.pod("a", "db-0", 1, node_name="n1", owner=("StatefulSet", "db")),
                k.pod(
                    "a",
                    "web",
                    1,
                    node_name="n1",
                    owner=("ReplicaSet", "web-5d8f"),
                    labels={"pod-template-hash": "5d8f"},
                ),
                k.pod("a", "bare", 1, node_name="n1", owner=None),
                k.pod(
                    "a",
                    "pinned",
                    1,
                    node_name="n1",
                    annotations={
                        "gpu-defrag.io/migratable": "false",
                        "gpu-defrag.io/restart-cost": "15m",
                    },
                ),
                k.pod(
                    "a",
                    "typo",
                    1,
                    node_name="n1",
                    annotations={
                        "gpu-defrag.io/migratable": "yes",
                        "gpu-defrag.io/restart-cost": "soon",
                    },
                ),
            ],
        }
    )
    model = load_source("k8s:")
    allocs, row = model.allocations, rows(model)
    movable = {name: bool(allocs.migratable[r]) for name, r in row.items()}
    assert movable == {
        "a/job": True,
        "a/high": False,
        "a/high-ok": True,
        "a/db-0": False,
        "a/web": False,
        "a/bare": False,
        "a/pinned": False,
        "a/typo": True,
    }
    assert allocs.restart_cost_s[row["a/pinned"]] == 900.0
    assert math.isnan(allocs.restart_cost_s[row["a/typo"]])
    assert any("not understood" in n and "a/typo" in n for n in model.scheduler.notes)
    lower = load_source("k8s:?priority-threshold=100")
    assert lower.allocations.migratable[rows(lower)["a/job"]] is not False  # priority 0 < 100


def test_priority_threshold_option(kube):
    kube(
        {
            "nodes": [k.node("n1", labels=RACK)],
            "pods": [k.pod("a", "p", 1, node_name="n1", priority=500)],
        }
    )
    assert load_source("k8s:").allocations.migratable.tolist() == [True]
    assert load_source("k8s:?priority-threshold=500").allocations.migratable.tolist() == [False]


def test_mig_fractions_and_time_slicing(kube):
    mig_node = k.node(
        "mig", 0, labels=RACK, extra={"nvidia.com/mig-3g.40gb": "2", "nvidia.com/mig-1g.10gb": "7"}
    )
    mig_node["metadata"]["labels"]["nvidia.com/gpu.count"] = "2"
    shared = k.node("shared", 16, labels={**RACK, "nvidia.com/gpu.replicas": "4"})
    shared["metadata"]["labels"]["nvidia.com/gpu.count"] = "4"
    kube(
        {
            "nodes": [mig_node, shared, k.node("n1", labels=RACK)],
            "pods": [
                k.pod("a", "mig", 0, node_name="mig", resources={"nvidia.com/mig-3g.40gb": "1"}),
                k.pod("a", "slice", 1, node_name="shared"),
                k.pod(
                    "a",
                    "hami",
                    1,
                    node_name="n1",
                    resources={"nvidia.com/gpucores": "30", "nvidia.com/gpumem": "8000"},
                ),
                k.pod(
                    "a",
                    "runai",
                    0,
                    node_name="n1",
                    annotations={"gpu-fraction": "0.25", "gpu-fraction-limit": "0.8"},
                ),
                k.pod("a", "mem", 1, node_name="n1", resources={"nvidia.com/gpumem": "40960"}),
            ],
        }
    )
    model = load_source("k8s:")
    allocs, row = model.allocations, rows(model)
    mig = model.nodes.name.tolist().index("mig")
    on_mig = model.gpus.node == mig
    assert on_mig.sum() == 2 and model.gpus.mig_enabled[on_mig].all()
    assert allocs.gpu_milli[row["a/mig"]] == 429
    shared_row = model.nodes.name.tolist().index("shared")
    assert (model.gpus.node == shared_row).sum() == 4  # 16 replicas of 4 GPUs
    assert allocs.gpu_milli[row["a/slice"]] == 250
    assert allocs.gpu_milli[row["a/hami"]] == 300
    assert allocs.gpu_milli[row["a/runai"]] == 250
    assert allocs.gpu_limit_milli[row["a/runai"]] == 800  # Run:ai's limit reaches the model
    assert allocs.gpu_limit_milli[row["a/mig"]] == 0  # a MIG instance bursts nowhere
    assert allocs.gpu_milli[row["a/mem"]] == 500  # 40 GiB of an 80 GiB GPU


def test_quotas_resourcequota_kueue_volcano(kube):
    kube(
        {
            "nodes": [k.node("n1", labels=RACK)],
            "pods": [
                k.pod(
                    "rnd", "a", 2, node_name="n1", labels={"kueue.x-k8s.io/queue-name": "default"}
                ),
                k.pod(
                    "vc",
                    "b-0",
                    2,
                    node_name="n1",
                    annotations={"scheduling.k8s.io/group-name": "b"},
                ),
            ],
            "resourcequotas": [
                k.resource_quota("prod", 16),
                k.resource_quota("prod", 12, "second"),
            ],
            "clusterqueues": [
                k.cluster_queue("rnd", 40, cohort="research", borrowing=20),
                k.cluster_queue("algo", 30, cohort="research", lending=10),
                k.cluster_queue("shared", 8),
            ],
            "localqueues": [
                k.local_queue("rnd", "rnd"),
                k.local_queue("algo", "algo"),
                k.local_queue("x", "shared"),
                k.local_queue("y", "shared"),
            ],
            "resourceflavors": [],
            "volcano-queues": [k.volcano_queue("vq", 24, deserved=16)],
            "volcano-podgroups": [k.volcano_podgroup("vc", "b", 1, "vq")],
        }
    )
    model = load_source("k8s:")
    quotas = {(q.tenant, q.gpu_model): q for q in model.scheduler.quotas}
    assert quotas[("prod", "")].gpus in (16, 12)  # both kept; the merge takes the smaller
    rnd = quotas[("rnd", "")]
    assert (rnd.gpus, rnd.cohort, rnd.borrowing_limit) == (40, "research", 20)
    assert quotas[("algo", "")].lending_limit == 10
    vq = quotas[("vc", "")]
    assert (vq.gpus, vq.borrowing_limit) == (16, 8)
    assert any("ClusterQueue shared is used by namespaces x, y" in n for n in model.scheduler.notes)
    by_queue = load_source("k8s:?tenant=queue")
    tenants = {q.tenant for q in by_queue.scheduler.quotas}
    assert {"rnd", "algo", "shared", "vq"} <= tenants
    assert by_queue.allocations.tenant.tolist() == ["rnd", "vq"]


def test_kueue_waiting_workloads_are_the_queue(kube):
    kube(
        {
            "nodes": [k.node("n1", labels=RACK)],
            "pods": [k.pod("rnd", "run-0", 8, node_name="n1", owner=("Job", "run"))],
            "workloads": [
                k.workload("rnd", "run", 1, 8, admitted=True),
                k.workload("rnd", "wait", 4, 8, priority=50),
            ],
            "localqueues": [k.local_queue("rnd", "rnd")],
            "clusterqueues": [k.cluster_queue("rnd", 16)],
        }
    )
    model = load_source("k8s:")
    allocs = model.allocations
    waiting = allocs.node < 0
    assert waiting.sum() == 4 and set(allocs.job[waiting].tolist()) == {"rnd/wait"}
    assert allocs.num_gpu[waiting].tolist() == [8] * 4 and (allocs.priority[waiting] == 50).all()
    assert model.scheduler.gang_size == {"rnd/run": 1, "rnd/wait": 4}
    assert "insufficient unused quota" in model.scheduler.waiting_reason["rnd/wait"]


def test_tenant_label_option(kube):
    kube(
        {
            "nodes": [k.node("n1", labels=RACK)],
            "pods": [
                k.pod("ns1", "a", 1, node_name="n1", labels={"team": "vision"}),
                k.pod("ns1", "b", 1, node_name="n1"),
            ],
        }
    )
    model = load_source("k8s:?tenant=label:team")
    assert sorted(model.allocations.tenant.tolist()) == ["ns1", "vision"]


def test_no_rack_label_says_so(kube):
    kube({"nodes": [k.node("n1"), k.node("n2")]})
    model = load_source("k8s:")
    assert (model.nodes.rack == "").all()
    assert model.scheduler.rack_from == ""
    assert any("no GPU node has a rack label" in n for n in model.scheduler.notes)
    chosen = load_source("k8s:?rack-label=kubernetes.io/hostname")
    assert chosen.nodes.rack.tolist() == ["n1", "n2"]


def test_join_with_exporter_pages(kube, tmp_path):
    """k8s + an exporter page: GPUs and usage from the page, jobs from the scheduler."""
    from exporter.readings import Allocation, GpuReading, NodeReading
    from tests.fakes.page_server import Routes, serve
    from tests.kubernetes.pages import exporter_page

    kube({"nodes": [k.node("n1", 2, labels=RACK)], "pods": [k.pod("a", "p", 1, node_name="n1")]})
    reading = NodeReading(
        "n1",
        gpus=[
            GpuReading(0, uuid="GPU-0", model="NVIDIA A100-SXM4-80GB", utilization_ratio=0.0),
            GpuReading(1, uuid="GPU-1", model="NVIDIA A100-SXM4-80GB", utilization_ratio=0.9),
        ],
        allocations=[Allocation(gpu=1, pod="p", namespace="a")],
    )
    routes = Routes()
    routes.text("/metrics", exporter_page([reading]))
    with serve(routes) as url:
        model = load_source(f"k8s:+{url}/metrics")
    row = rows(model)["a/p"]
    held = model.gpus.index[model.placements.gpu[model.placements.alloc == row]]
    assert held.tolist() == [1]
    assert np.isclose(model.gpus.utilization_ratio[1], 0.9)
    assert model.allocations.job[row] == "a/job"


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("k8s:?rack=x", "unknown option 'rack'"),
        ("k8s:?tenant=team", "expected namespace, queue or label:KEY"),
        ("k8s:?priority-threshold=high", "expected a whole number"),
    ],
)
def test_bad_options_are_one_line(kube, spec, problem):
    kube({})
    with pytest.raises(SourceError, match=problem) as error:
        load_source(spec)
    assert "\n" not in str(error.value)


def test_single_mig_strategy_hands_out_instances_not_gpus(kube):
    """Under the single MIG strategy `nvidia.com/gpu` counts MIG instances of the profile the
    product label names: 2 A100s as 14 x 1g.5gb are 2 GPUs in MIG mode, not 14 GPUs."""
    node = k.node("mig", 14, labels=RACK, product="NVIDIA-A100-SXM4-40GB-MIG-1g.5gb")
    node["metadata"]["labels"].update(
        {"nvidia.com/gpu.count": "2", "nvidia.com/mig.strategy": "single"}
    )
    kube({"nodes": [node], "pods": [k.pod("a", "p", 2, node_name="mig")]})
    model = load_source("k8s:")
    assert len(model.gpus) == 2 and model.gpus.mig_enabled.all()
    assert model.nodes.gpu_model[0] == "NVIDIA-A100-SXM4-40GB"
    row = rows(model)["a/p"]
    assert model.allocations.num_gpu[row] == 2 and model.allocations.gpu_milli[row] == 143


def test_snapshot_of_a_k8s_source(kube, tmp_path):
    from advisor import snapshot
    from advisor.cli import main

    kube(
        {
            "nodes": [k.node("n1", labels=RACK)],
            "pods": [k.pod("a", "p", 2, node_name="n1"), k.pod("a", "w", 8)],
        }
    )
    out = tmp_path / "snap.json"
    assert main(["snapshot", "k8s:", "-o", str(out)]) == 0
    model = snapshot.load(out)
    assert model.allocations.id.tolist() == ["a/p", "a/w"] and model.allocations.node.tolist() == [
        0,
        -1,
    ]
