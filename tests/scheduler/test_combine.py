"""A scheduler view joined with a usage model by node name: facts kept, mismatches named."""

from __future__ import annotations

import numpy as np

from advisor.ingest.combine import build_model
from advisor.model import ModelBuilder
from advisor.scheduler_view import SchedNode, SchedTask, SchedulerView


def usage_model():
    """Two exporter nodes: a (8 GPUs, islands 0-3/4-7, pod team/a on GPUs 4,5, a busy GPU 7
    with no known holder) and stray (known to no scheduler)."""
    b = ModelBuilder()
    b.add_node("a", gpu_model="NVIDIA A100-SXM4-80GB")
    for i in range(8):
        b.add_gpu("a", i, nvlink_island=i // 4, utilization_ratio=0.5 if i in (4, 5, 7) else 0.0)
    b.add_allocation("team/a", num_gpu=2, node="a", gpus=[4, 5], tenant="team", migratable=True)
    b.add_allocation("unattributed@a/gpu7", num_gpu=1, node="a", gpus=[7], migratable=False)
    b.add_node("stray", gpu_model="NVIDIA A100-SXM4-80GB")
    for i in range(2):
        b.add_gpu("stray", i)
    return b.build(timestamp=100.0)


def view(**kw):
    nodes = (
        SchedNode("a", pool="p", rack="r1", gpu_model="A100", gpus=8, cpu_milli=64000),
        SchedNode(
            "b",
            pool="p",
            rack="r1",
            gpu_model="A100",
            gpus=4,
            schedulable=False,
            unschedulable_reason="cordoned",
        ),
    )
    tasks = (
        SchedTask("team/a", "train", "a", 2, tenant="team", priority=5, migratable=False),
        SchedTask("team/b", "train", "a", 1, tenant="team"),
        SchedTask("team/c", "serve", "b", 2, tenant="team"),
        SchedTask("team/q", "big", None, 8, tenant="team"),
    )
    return SchedulerView("kubernetes", "k8s:", nodes, tasks, **kw)


def test_join_keeps_usage_gpus_and_scheduler_facts():
    model = build_model(view(), usage_model(), source="k8s:+http://x")
    names = model.nodes.name.tolist()
    assert names == ["a", "b", "stray"]
    a = names.index("a")
    assert model.nodes.rack[a] == "r1" and model.nodes.pool[a] == "p"
    assert model.nodes.cpu_milli[a] == 64000
    # islands come from the usage side
    assert model.gpus.nvlink_island[model.gpus.node == a].tolist() == [0] * 4 + [1] * 4
    allocs = model.allocations
    row = allocs.id.tolist().index("team/a")
    # the exporter's GPUs, the scheduler's job, priority and flag
    held = model.gpus.index[model.placements.gpu[model.placements.alloc == row]].tolist()
    assert held == [4, 5]
    assert allocs.job[row] == "train" and allocs.priority[row] == 5 and not allocs.migratable[row]
    # an unattributed task takes the GPU the exporter shows busy with no known holder
    row = allocs.id.tolist().index("team/b")
    assert model.gpus.index[model.placements.gpu[model.placements.alloc == row]].tolist() == [7]
    assert not any(i.startswith("unattributed@a") for i in allocs.id.tolist())
    # waiting work is the queue
    row = allocs.id.tolist().index("team/q")
    assert allocs.node[row] == -1 and allocs.num_gpu[row] == 8


def test_mismatches_are_named_not_dropped():
    model = build_model(view(), usage_model())
    notes = " | ".join(model.scheduler.notes)
    assert "have no usage reading" in notes and ": b" in notes
    assert "unknown to kubernetes" in notes and "stray" in notes
    stray = model.nodes.name.tolist().index("stray")
    assert not model.nodes.schedulable[stray]  # kept, but no capacity the scheduler can use
    b = model.nodes.name.tolist().index("b")
    assert not model.nodes.schedulable[b]  # cordoned
    assert model.gpus.healthy[model.gpus.node == b].all()


def test_gpu_count_disagreement_is_a_note():
    nodes = (SchedNode("a", gpus=7),)
    model = build_model(SchedulerView("kubernetes", "k8s:", nodes), usage_model())
    assert any("another number of GPUs" in n and "a (7 vs 8)" in n for n in model.scheduler.notes)
    assert int((model.gpus.node == 0).sum()) == 8  # the GPUs seen are kept


def test_task_without_room_is_left_out_with_its_name():
    nodes = (SchedNode("a", gpus=1),)
    tasks = (SchedTask("x/1", "1", "a", 1), SchedTask("x/2", "2", "a", 1))
    model = build_model(SchedulerView("kubernetes", "k8s:", nodes, tasks))
    assert model.allocations.id.tolist() == ["x/1"]
    assert any("left out" in n and "x/2" in n for n in model.scheduler.notes)


def test_scheduler_alone_numbers_gpus_and_carves_mig():
    nodes = (
        SchedNode("m", gpu_model="NVIDIA A100-SXM4-40GB", gpus=2, mig={"3g.20gb": 2, "1g.5gb": 1}),
    )
    tasks = (
        SchedTask("x/mig", "mig", "m", 1, mig_profile="3g.20gb"),
        SchedTask("x/whole", "w", "m", 2),
    )
    model = build_model(SchedulerView("kubernetes", "k8s:", nodes, tasks))
    assert model.gpus.mig_enabled.tolist() == [False, False, True]
    assert model.gpus.carved_milli.tolist() == [1000, 1000, 1000]
    assert np.isnan(model.gpus.utilization_ratio).all()
    mig = model.allocations.id.tolist().index("x/mig")
    assert model.allocations.gpu_milli[mig] == 429
    assert model.gpu_is_free.sum() == 0


def test_usage_history_follows_the_join():
    b = ModelBuilder()
    b.add_node("a")
    b.add_gpu("a", 0)
    b.add_gpu("a", 1)
    usage = b.build(
        timestamp=10.0,
        usage=([0.0, 10.0], np.array([[0.1, 0.2], [0.3, 0.4]]), np.zeros((2, 2))),
    )
    nodes = (SchedNode("z", gpus=1), SchedNode("a", gpus=2))
    model = build_model(SchedulerView("kubernetes", "k8s:", nodes), usage)
    assert model.nodes.name.tolist() == ["z", "a"]
    util = model.usage.utilization_ratio
    assert np.isnan(util[:, 0]).all()
    assert util[:, 1:].tolist() == [
        [np.float32(0.1), np.float32(0.2)],
        [np.float32(0.3), np.float32(0.4)],
    ]
