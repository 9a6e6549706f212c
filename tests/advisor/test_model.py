"""Model builder: whole, fractional, MIG and multi-GPU holders; lost GPUs; validation errors."""

from __future__ import annotations

import numpy as np
import pytest

from advisor.ingest.readings import from_readings
from advisor.model import MILLI, ModelBuilder, ModelError
from exporter.readings import (
    Allocation,
    GpuProcess,
    GpuReading,
    MigInstance,
    NodeReading,
    TopologyLink,
)
from tests.conftest import add_nodes


def _node(name: str = "n1", gpus: int = 8, model: str = "A100") -> NodeReading:
    return NodeReading(
        name,
        pool="train",
        rack="r1",
        gpus=[
            GpuReading(i, uuid=f"GPU-{name}-{i}", model=model, memory_total_bytes=80e9)
            for i in range(gpus)
        ],
    )


def test_multi_gpu_pod_is_one_allocation_holding_whole_gpus() -> None:
    node = _node()
    node.allocations = [
        Allocation(i, pod="train-0", namespace="ml", tenant="team-a") for i in (0, 1, 2, 3)
    ]
    model = from_readings([node])
    assert list(model.allocations.id) == ["ml/train-0"]
    assert model.allocations.num_gpu[0] == 4
    assert model.allocations.gpu_milli[0] == MILLI
    assert model.allocations.tenant[0] == "team-a"
    assert list(model.gpu_milli_allocated) == [1000] * 4 + [0] * 4
    assert int(model.gpu_is_free.sum()) == 4


def test_time_sliced_holders_share_the_whole_gpu() -> None:
    node = _node(gpus=2)
    node.allocations = [Allocation(0, pod=p, namespace="ns") for p in ("a", "b", "c")]
    model = from_readings([node])
    assert sorted(model.allocations.gpu_milli.tolist()) == [333, 333, 334]
    assert model.gpu_milli_allocated[0] == MILLI
    assert model.allocations.tenant.tolist() == ["ns"] * 3  # namespace when no tenant


def test_known_fractional_shares_leave_the_rest_of_the_gpu_free() -> None:
    node = _node(gpus=1)
    node.allocations = [
        Allocation(0, pod="small", namespace="ns", gpu_milli=250),
        Allocation(0, pod="half", namespace="ns", gpu_milli=500),
    ]
    model = from_readings([node])
    assert sorted(model.allocations.gpu_milli.tolist()) == [250, 500]
    assert model.gpu_free_milli[0] == 250


def test_power_reaches_the_model_and_survives_a_snapshot(tmp_path) -> None:
    from advisor import snapshot

    node = _node(gpus=2)
    node.gpus[0].power_watts = 312.5
    model = from_readings([node])
    assert model.gpus.power_watts[0] == 312.5 and np.isnan(model.gpus.power_watts[1])
    snapshot.save(model, tmp_path / "s.json")
    again = snapshot.load(tmp_path / "s.json")
    assert again.gpus.power_watts[0] == 312.5 and np.isnan(again.gpus.power_watts[1])


def test_sim_fractions_reach_the_model() -> None:
    from gpu_defrag_sim import SimFleet

    fleet = SimFleet("a100-16x8", seed=7)
    fleet.advance(6 * 3600)  # arrivals include fractional jobs
    model = from_readings(fleet.readings())
    assert np.allclose(model.gpu_milli_allocated, np.rint(fleet.used * 1000), atol=1)
    assert (model.allocations.gpu_milli < MILLI).any()


def test_mig_instances_hold_their_compute_slices_exactly() -> None:
    node = _node(gpus=2)
    gpu = node.gpus[0]
    gpu.mig_enabled = True
    gpu.mig_instances = [MigInstance(1, 0, "3g.40gb"), MigInstance(2, 0, "4g.40gb")]
    node.allocations = [Allocation(0, pod="m1", gpu_instance_id=1)]
    model = from_readings([node])
    assert model.allocations.gpu_milli.tolist() == [429]  # 3/7 of the GPU
    assert model.gpu_free_milli.tolist() == [571, 1000]
    node.allocations.append(Allocation(0, pod="m2", gpu_instance_id=2))
    model = from_readings([node])
    assert model.gpu_milli_allocated[0] == MILLI  # 3/7 + 4/7 is exactly the whole GPU
    assert not model.gpu_is_free[0]


def test_a_mig_gpu_counts_the_share_its_instances_carve_as_capacity(tmp_path) -> None:
    """3g+3g on an A100 strands its seventh slice: the pool is full at 6/7 of the GPU, so its
    capacity (what forecasts clip to and alerts compare with) must say so."""
    from advisor import snapshot
    from advisor.history import pool_rows

    node = _node(gpus=4)
    layouts = {
        0: ["3g.40gb", "3g.40gb"],  # 6 of 7 slices
        1: ["1g.10gb"] * 7,  # all 7
        2: [],  # MIG on, no instance known yet: the whole GPU
    }
    for index, profiles in layouts.items():
        node.gpus[index].mig_enabled = True
        node.gpus[index].mig_instances = [
            MigInstance(gi, 0, profile) for gi, profile in enumerate(profiles, start=1)
        ]
    node.allocations = [Allocation(0, pod="a", gpu_instance_id=1)]
    node.allocations += [Allocation(0, pod="b", gpu_instance_id=2)]
    model = from_readings([node])
    assert model.gpus.carved_milli.tolist() == [857, 1000, 1000, 1000]
    assert model.gpu_milli_allocated[0] == 857  # both instances held: the GPU is full
    (row,) = pool_rows(model)
    assert row["capacity_gpus"] == pytest.approx(3.857)  # not 4
    snapshot.save(model, tmp_path / "s.json")
    assert snapshot.load(tmp_path / "s.json").gpus.carved_milli.tolist() == [857, 1000, 1000, 1000]
    doc = (tmp_path / "s.json").read_text()
    assert doc.count('"carved_milli"') == 3  # written for the MIG GPUs only


def test_a_carved_share_outside_the_gpu_is_refused() -> None:
    with pytest.raises(ModelError, match="carved_milli"):
        builder = ModelBuilder()
        builder.add_node("n")
        builder.add_gpu("n", 0, carved_milli=1001)


def test_lost_and_unhealthy_gpus_are_neither_free_nor_allocatable() -> None:
    node = _node(gpus=4)
    node.gpus[1].lost = True
    node.gpus[2].healthy = False
    model = from_readings([node])
    assert model.gpu_is_free.tolist() == [True, False, False, True]
    assert model.gpu_free_milli.tolist() == [1000, 0, 0, 1000]
    assert not model.gpus.healthy[1]  # lost implies unhealthy


def test_processes_without_allocation_hold_the_gpu_unmigratably() -> None:
    node = _node(gpus=2)
    node.gpus[1].processes = [GpuProcess(pid=42)]
    model = from_readings([node])
    assert model.allocations.id.tolist() == ["unattributed@n1/gpu1"]
    assert not model.allocations.migratable[0]
    assert model.gpu_is_free.tolist() == [True, False]


def test_islands_come_from_links_when_not_given() -> None:
    node = _node(gpus=4)
    node.links = [TopologyLink(0, 1, "nvlink", 12), TopologyLink(2, 3, "nvlink", 12)]
    model = from_readings([node])
    assert model.gpus.nvlink_island.tolist() == [0, 0, 2, 2]


def test_gpus_are_ordered_by_node_then_index_and_nodes_keep_pool_and_rack() -> None:
    a, b = _node("a", gpus=2), _node("b", gpus=3)
    b.gpus.reverse()
    model = from_readings([a, b])
    assert model.nodes.gpu_offset.tolist() == [0, 2, 5]
    assert model.gpus.index.tolist() == [0, 1, 0, 1, 2]
    assert model.gpus.node.tolist() == [0, 0, 1, 1, 1]
    assert model.nodes.rack.tolist() == ["r1", "r1"]
    assert model.nodes.gpu_model.tolist() == ["A100", "A100"]
    assert model.gpu_row(1, 2) == 4


def _builder() -> ModelBuilder:
    return add_nodes(["n1"], 2, cpu_milli=64000, memory_mib=262144)


def test_builder_counts_cpu_and_memory_of_placed_tasks_only() -> None:
    builder = _builder()
    builder.add_allocation(
        "a", num_gpu=1, gpu_milli=500, node="n1", gpus=[0], cpu_milli=8000, memory_mib=1024
    )
    builder.add_allocation("pending", num_gpu=1, cpu_milli=4000)
    model = builder.build()
    assert model.node_cpu_free.tolist() == [56000]
    assert model.node_memory_free.tolist() == [262144 - 1024]
    assert model.gpu_free_milli.tolist() == [500, 1000]


def test_oversubscribed_gpu_is_rejected_with_its_name() -> None:
    builder = _builder()
    builder.add_allocation("a", num_gpu=1, gpu_milli=600, node="n1", gpus=[1])
    builder.add_allocation("b", num_gpu=1, gpu_milli=600, node="n1", gpus=[1])
    with pytest.raises(ModelError, match=r"gpus\[n1/gpu1\]: oversubscribed: 1200"):
        builder.build()


def test_task_holding_fewer_gpus_than_requested_is_rejected() -> None:
    builder = _builder()
    builder.add_allocation("a", num_gpu=2, node="n1", gpus=[0])
    with pytest.raises(ModelError, match=r"allocations\[a\]\.gpus: holds 1 GPUs but num_gpu is 2"):
        builder.build()


def test_unknown_gpu_and_duplicate_ids_are_rejected() -> None:
    builder = _builder()
    builder.add_allocation("a", num_gpu=1, node="n1", gpus=[7])
    with pytest.raises(ModelError, match="node 'n1' has no GPU 7"):
        builder.build()
    builder = _builder()
    builder.add_allocation("a", num_gpu=0)
    builder.add_allocation("a", num_gpu=0)
    with pytest.raises(ModelError, match=r"allocations\[a\]: duplicate allocation id"):
        builder.build()
    with pytest.raises(ModelError, match="duplicate GPU index"):
        _builder().add_gpu("n1", 0)
    with pytest.raises(ModelError, match=r"gpus\[-1\]: GPU index must be >= 0"):
        _builder().add_gpu("n1", -1)  # the snapshot format could not hold it


def test_derived_arrays_are_read_only() -> None:
    model = _builder().build()
    with pytest.raises(ValueError, match="read-only"):
        model.gpu_free_milli[0] = 0
    assert np.isnan(model.gpus.utilization_ratio).all()


def test_two_mig_instances_of_one_pod_add_up_on_that_gpu() -> None:
    node = _node(gpus=1)
    node.gpus[0].mig_enabled = True
    node.gpus[0].mig_instances = [MigInstance(1, 0, "2g.20gb"), MigInstance(2, 0, "1g.10gb")]
    node.allocations = [
        Allocation(0, pod="p", gpu_instance_id=1),
        Allocation(0, pod="p", gpu_instance_id=2),
    ]
    model = from_readings([node])
    assert model.allocations.num_gpu.tolist() == [1]
    assert model.placements.milli.tolist() == [429]  # 3 of 7 slices


def test_empty_and_gpu_less_clusters_build_and_analyze() -> None:
    from advisor.fragmentation.measures import analyze

    assert analyze(ModelBuilder().build())["spatial"]["free_gpus"] == 0
    builder = ModelBuilder()
    builder.add_node("cpu-only", cpu_milli=32000)
    builder.add_allocation("c", num_gpu=0, gpu_milli=0, node="cpu-only", cpu_milli=1000)
    result = analyze(builder.build())
    assert result["cluster"]["gpus"] == 0 and result["fgd"]["fragment_gpus"] == 0
