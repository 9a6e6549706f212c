"""Hand-computed answers on small clusters for every SRE measure and the FGD measure."""

from __future__ import annotations

import re

import numpy as np
import pytest

from advisor.fragmentation import fgd
from advisor.fragmentation import measures as m
from advisor.model import ModelBuilder
from tests.conftest import GIB, add_nodes


def two_nodes(job3_cpu: float = 60000):
    """a: 4-GPU job on 0-3, half GPU on 4, 5-7 free. b: 1 GPU on 0, GPU 1 lost, 2-7 free."""
    b = add_nodes(
        ["a", "b"],
        rack="r1",
        gpu_model="A100",
        cpu_milli=64000,
        memory_mib=512000,
        island=4,
        memory_total_bytes=80 * GIB,
        lost=lambda name, i: name == "b" and i == 1,
    )
    b.add_allocation("job1", num_gpu=4, node="a", gpus=[0, 1, 2, 3], cpu_milli=16000, tenant="t1")
    b.add_allocation(
        "job2", num_gpu=1, gpu_milli=500, node="a", gpus=[4], cpu_milli=2000, tenant="t2"
    )
    b.add_allocation("job3", num_gpu=1, node="b", gpus=[0], cpu_milli=job3_cpu, tenant="t2")
    return b


def test_free_partial_and_shape_counts() -> None:
    model = two_nodes().build()
    result = m.analyze(model)
    spatial = result["spatial"]
    assert spatial["free_gpus"] == 9
    assert spatial["partial_free_gpus"] == 0.5
    assert spatial["free_capacity_gpus"] == 9.5
    fits = {row["shape"]: (row["jobs_that_fit"], row["stranded_gpus"]) for row in spatial["shapes"]}
    assert fits == {
        "0.5 GPU": (19, None),  # a: 1 on GPU 4 + 2 x 3 free; b: 2 x 6 free
        "1 GPU": (9, 0),
        "2 GPU": (4, 1),  # a: 3 // 2, b: 6 // 2
        "4 GPU": (1, 5),
        "8 GPU": (0, 9),
        "2x8 GPU": (0, 9),
        "4x8 GPU": (0, 9),
    }
    assert spatial["largest_job"] == {
        "single_node_gpus": 6,
        "nvlink_group_gpus": 4,  # b: GPUs 4-7 in island 1
        "multi_node_gpus_in_rack": 0,
        "fraction_gpu": 1.0,
    }
    assert result["cluster"]["unhealthy_gpus"] == 1
    assert result["cluster"]["allocated_gpus"] == 5.5


def test_cpu_limits_tasks_and_strands_gpus() -> None:
    model = two_nodes(job3_cpu=62000).build()  # b keeps 2000 milli CPU for 6 free GPUs
    assert m.min_host_need_per_gpu(model) == (4000.0, 0.0)  # job1 16000/4, job2 2000/0.5
    assert m.stranded_by_host(model, 4000, 0).tolist() == [0, 6]
    assert m.jobs_that_fit(model, m.Shape(1, cpu_milli=4000)) == 3  # only a's 3 free GPUs
    assert m.analyze(model)["spatial"]["stranded_gpus_by_host"] == 6
    assert m.jobs_that_fit(model, m.Shape(1, gpu_spec="H100")) == 0


def test_multi_node_jobs_count_within_one_rack() -> None:
    b = ModelBuilder()
    layout = {"n1": "r1", "n2": "r1", "n3": "r1", "n4": "r2", "n5": ""}
    for name, rack in layout.items():
        add_nodes([name], builder=b, rack=rack, gpu_model="H100")
    b.add_allocation("x", num_gpu=1, node="n3", gpus=[5])
    model = b.build()
    assert m.jobs_that_fit(model, m.Shape(8, tasks=2)) == 1  # n1+n2; n4 and n5 are alone
    assert m.jobs_that_fit(model, m.Shape(8)) == 4
    assert m.largest_fitting(model).rack_full_nodes == 2
    assert m.jobs_that_fit(model, m.parse_shape("2x8@A100")) == 0


def test_a_multi_node_job_takes_one_task_per_node() -> None:
    """Two 4-GPU halves of one free node are no 2x4 job: its tasks run on distinct nodes. r1:
    n1 (8 free) and n2 (4 free) give one 2x4 job (n1's other half has no second node). r2: n3
    alone, 8 free, gives none. The old count summed a rack's tasks (3 in r1, 2 in r2: 2 jobs)."""
    b = ModelBuilder()
    for name, rack in {"n1": "r1", "n2": "r1", "n3": "r2"}.items():
        add_nodes([name], builder=b, rack=rack, gpu_model="H100")
    b.add_allocation("x", num_gpu=4, node="n2", gpus=[0, 1, 2, 3])
    model = b.build()
    assert m.jobs_that_fit(model, m.parse_shape("2x4")) == 1
    assert m.jobs_that_fit(model, m.parse_shape("2x2")) == 2  # each on n1 and n2 (2 tasks)
    assert m.jobs_that_fit(model, m.parse_shape("3x2")) == 0  # r1 has two nodes
    assert m.jobs_that_fit_by_part(model, m.parse_shape("2x4"), model.nodes.rack) == {
        "r1": 1,
        "r2": 0,
    }


def _greedy_jobs(fits: list[int], tasks: int) -> int:
    """The oracle: start jobs one by one, each on the `tasks` nodes with the most room left
    (optimal for tasks on distinct nodes)."""
    room, jobs = sorted(fits, reverse=True), 0
    while len(room) >= tasks and room[tasks - 1] > 0:
        for i in range(tasks):
            room[i] -= 1
        room.sort(reverse=True)
        jobs += 1
    return jobs


def test_distinct_node_job_counts_agree_with_a_greedy_oracle() -> None:
    rng = np.random.default_rng(7)
    for _ in range(500):
        fits = rng.integers(0, 6, size=int(rng.integers(0, 9))).tolist()
        tasks = int(rng.integers(2, 5))
        groups = np.zeros(len(fits), dtype=np.int64)
        assert m._jobs_of(np.array(fits, dtype=np.int64), tasks, groups) == _greedy_jobs(
            fits, tasks
        ), (fits, tasks)


def test_multi_node_jobs_need_one_gpu_model_within_the_rack() -> None:
    """r1: one A100 and one H100 node, all free: no 2x8 job (not one model). r2: two A100 and
    two H100 nodes, all free: one 2x8 job per model. A rack-only grouping would count 3."""
    b = ModelBuilder()
    layout = {
        "a1": ("r1", "A100"),
        "h1": ("r1", "H100"),
        "a2": ("r2", "A100"),
        "h2": ("r2", "H100"),
        "a3": ("r2", "A100"),
        "h3": ("r2", "H100"),
    }
    for name, (rack, gpu_model) in layout.items():
        add_nodes([name], builder=b, rack=rack, gpu_model=gpu_model)
    model = b.build()
    assert m.jobs_that_fit(model, m.Shape(8)) == 6
    assert m.jobs_that_fit(model, m.Shape(8, tasks=2)) == 2  # a2+a3 and h2+h3
    assert m.jobs_that_fit(model, m.parse_shape("2x8@H100")) == 1
    assert m.jobs_that_fit(model, m.Shape(8, tasks=3)) == 0
    assert m.largest_fitting(model).rack_full_nodes == 2
    spatial = m.analyze(model)["spatial"]
    assert spatial["largest_job"]["multi_node_gpus_in_rack"] == 16
    fits = {row["shape"]: row["jobs_that_fit"] for row in spatial["shapes"]}
    assert (fits["2x8 GPU"], fits["4x8 GPU"]) == (2, 0)


def test_allocated_idle_uses_latest_value_or_the_window() -> None:
    builder = two_nodes()
    model = builder.build()
    util = {("a", i): 0.9 for i in range(4)} | {("a", 4): 0.01, ("b", 0): 0.0, ("b", 5): 0.0}
    for (node, index), value in util.items():
        model.gpus.utilization_ratio[model.gpu_row(model.node_index(node), index)] = value
    idle = m.allocated_idle(model)
    assert idle.sum() == 2  # a/4 and b/0; b/5 is idle but not allocated
    result = m.analyze(model)["temporal"]
    assert result["allocated_idle_gpus"] == 2
    assert result["idle_gpus_by_tenant"] == {"t2": 1.5}
    # With history: a/4 was busy 30 min ago (inside the 1 h window), b/0 only 2 h ago.
    g = len(model.gpus)
    series = np.full((3, g), 0.0, dtype=np.float32)
    a4, b0 = model.gpu_row(0, 4), model.gpu_row(1, 0)
    series[:, :4] = 0.9
    series[0, b0] = 0.8
    series[1, a4] = 0.7
    history = builder.build(
        timestamp=10_000, usage=([10_000 - 7200, 10_000 - 1800, 10_000], series, series)
    )
    assert np.flatnonzero(m.allocated_idle(history)).tolist() == [b0]
    assert np.flatnonzero(m.allocated_idle(history, m.IdlePolicy(window_s=8000))).tolist() == []


def test_stranded_memory_per_gpu() -> None:
    model = two_nodes().build()
    used = {("a", 0): 60 * GIB, ("a", 4): 75 * GIB, ("b", 0): 10 * GIB, ("b", 3): 1 * GIB}
    for (node, index), value in used.items():
        model.gpus.memory_used_bytes[model.gpu_row(model.node_index(node), index)] = value
    stranded = m.stranded_memory_bytes(model)
    by = {
        (model.nodes.name[model.gpus.node[r]], int(model.gpus.index[r])): v
        for r, v in enumerate(stranded)
        if v
    }
    # a/0 whole GPU held: 20 GiB; a/4 half held, 5 GiB free < 10 GiB; b/0 whole: 70 GiB.
    # a/1-3 held, usage unknown: the free share of a fully held GPU is 0. b/3 is free: 0.
    assert by == {("a", 0): 20 * GIB, ("a", 4): 5 * GIB, ("b", 0): 70 * GIB}
    assert m.stranded_memory_bytes(model, min_request_bytes=4 * GIB)[model.gpu_row(0, 4)] == 0


def test_type_view_compares_idle_capacity_with_demand_by_model() -> None:
    builder = two_nodes()
    builder.add_allocation("p1", num_gpu=1, gpu_spec="A100")
    builder.add_allocation("p2", num_gpu=8, gpu_spec="V100")
    builder.add_allocation("p3", num_gpu=1, gpu_milli=250)
    view = m.by_gpu_model(builder.build())
    assert view["capacity"] == [
        {
            "gpu_model": "A100",
            "gpus": 16,
            "usable_gpus": 15,
            "free_gpus": 9,
            "free_capacity_gpus": 9.5,
            "allocated_gpus": 5.5,
        }
    ]
    demand = {
        row["gpu_spec"]: (row["pending_gpus"], row["shortfall_gpus"]) for row in view["demand"]
    }
    assert demand == {"A100": (1.0, 0.0), "V100": (8.0, 8.0), "any": (0.25, 0.0)}


def test_fgd_node_fragment_by_hand() -> None:
    model = two_nodes().build()
    whole = fgd.Workload.from_shapes([(0, 1000, 1, "")], [1.0])
    # a: the 500 left on GPU 4 is too small for a whole-GPU task; b: the type fits, nothing small.
    assert m.fgd_node_fragment(model, whole).tolist() == [500.0, 0.0]
    eight = fgd.Workload.from_shapes([(0, 1000, 8, "")], [1.0])
    # no node has 8 free GPUs: all idle milli is fragment (a: 3500, b: 6000)
    assert m.fgd_node_fragment(model, eight).tolist() == [3500.0, 6000.0]
    mix = fgd.Workload.from_shapes([(0, 1000, 1, ""), (0, 1000, 8, "")], [0.5, 0.5])
    assert m.fgd_node_fragment(model, mix).tolist() == [2000.0, 3000.0]
    result = m.analyze(model)
    assert result["fgd"]["workload"] == "allocations in the source"
    nodes = result["nodes"]
    assert nodes["free_gpus"].tolist() == [3, 6]
    assert nodes["largest_free_nvlink_group"].tolist() == [3, 4]
    assert ((nodes["score"] >= 0) & (nodes["score"] <= 1)).all()


def test_gpus_of_unknown_island_have_an_unknown_nvlink_group() -> None:
    """k: islands 0 (GPUs 0-3) and 1 (4-7), with 1 and 3 free; u: 4 free GPUs whose island is
    unknown. u's largest free NVLink group is unknown (-1), not 1 (each alone) nor 4 (one
    island): nothing says how they connect, so the planner puts no island rule on u and the
    measures count its 4 free GPUs as one node's. On k a 4-GPU task needs one island: none."""
    b = add_nodes(["k"], rack="r1", gpu_model="A100", island=4)
    add_nodes(["u"], 4, builder=b, rack="r1", gpu_model="A100")  # island unknown
    b.add_allocation("x", num_gpu=3, node="k", gpus=[0, 1, 2])
    b.add_allocation("y", num_gpu=1, node="k", gpus=[7])
    model = b.build()
    assert m.free_whole_per_node(model).tolist() == [4, 4]
    assert m.largest_free_nvlink_group(model).tolist() == [3, -1]
    assert m.tasks_per_node(model, m.Shape(4)).tolist() == [0, 1]
    result = m.analyze(model)
    assert result["nodes"]["largest_free_nvlink_group"].tolist() == [3, -1]
    largest = result["spatial"]["largest_job"]
    assert (largest["single_node_gpus"], largest["nvlink_group_gpus"]) == (4, 3)


def test_parse_shape() -> None:
    assert m.parse_shape("0.5") == m.Shape(1, 500)
    assert m.parse_shape("2x8") == m.Shape(8, tasks=2)
    assert m.parse_shape("4@A100|H100") == m.Shape(4, gpu_spec="A100|H100")
    assert m.parse_shape("2x8").name == "2x8 GPU"
    for bad, why in (
        ("", "expected e.g. 0.5, 1, 8, 2x8 or 4@A100"),
        ("1.5", "more than one GPU must be a whole number"),
        ("x8", "expected e.g. 0.5, 1, 8, 2x8 or 4@A100"),
        ("0", "a shape takes at least one task of at least 0.001 GPU"),
    ):
        with pytest.raises(ValueError, match=re.escape(f"bad shape {bad!r}: {why}")):
            m.parse_shape(bad)


def test_workload_of_counts_shapes_like_fgd_learn_workload() -> None:
    builder = two_nodes()
    builder.add_allocation("cpu-only", num_gpu=0, gpu_milli=0, cpu_milli=0)
    builder.add_allocation("p1", num_gpu=1, gpu_milli=500, cpu_milli=2000, gpu_spec="T4")
    builder.add_allocation("p2", num_gpu=1, gpu_milli=500, cpu_milli=2000, gpu_spec="T4")
    model = builder.build()
    allocs = model.allocations
    expected = fgd.learn_workload(
        np.nan_to_num(allocs.cpu_milli).astype(int).tolist(),
        allocs.num_gpu.tolist(),
        allocs.gpu_milli.tolist(),
        allocs.gpu_spec.tolist(),
    )
    ours = m.workload_of(model)
    assert ours is not None
    assert sorted(ours.shapes) == sorted(expected.shapes)
    assert dict(zip(ours.shapes, ours.popularity.tolist(), strict=True)) == pytest.approx(
        dict(zip(expected.shapes, expected.popularity.tolist(), strict=True))
    )


def test_unknown_topology_and_racks_are_reported_as_unknown_not_as_one() -> None:
    b = add_nodes(["n"], 2, gpu_model="T4")
    largest = m.analyze(b.build())["spatial"]["largest_job"]
    assert largest["nvlink_group_gpus"] is None and largest["multi_node_gpus_in_rack"] is None
    assert largest["single_node_gpus"] == 2
