from exporter.node_gauges import IdlePolicy, IdleTracker, node_gauges
from exporter.readings import Allocation, GpuReading, MigInstance, NodeReading, TopologyLink

GiB = 2**30


def two_island_node(allocated: dict[int, int], utilization: float = 0.0) -> NodeReading:
    gpus = [
        GpuReading(
            index=i,
            utilization_ratio=utilization,
            memory_total_bytes=16 * GiB,
            memory_used_bytes=12 * GiB if i in allocated else 0,
            memory_free_bytes=4 * GiB if i in allocated else 16 * GiB,
        )
        for i in range(8)
    ]
    links = [
        TopologyLink(a, b, "nvlink", 4)
        for group in (range(4), range(4, 8))
        for a in group
        for b in group
        if a != b
    ]
    allocations = [
        Allocation(gpu=gpu, pod=f"p{n}-{gpu}")
        for gpu, holders in allocated.items()
        for n in range(holders)
    ]
    return NodeReading(node="n", gpus=gpus, links=links, allocations=allocations)


def test_free_gpus_and_largest_free_nvlink_group():
    # GPUs 0 and 5 held: free = 1,2,3 (island 0) and 4,6,7 (island 4): largest connected = 3
    gauges = node_gauges(two_island_node({0: 1, 5: 1}), IdleTracker(IdlePolicy()), 0.0)
    assert gauges.free_gpus == 6
    assert gauges.largest_free_nvlink_group == 3


def test_lost_gpu_is_not_free():
    node = two_island_node({})
    node.gpus[3].lost = True
    gauges = node_gauges(node, IdleTracker(IdlePolicy()), 0.0)
    assert gauges.free_gpus == 7
    assert gauges.largest_free_nvlink_group == 4


def test_allocated_idle_needs_the_whole_window():
    tracker = IdleTracker(IdlePolicy(threshold=0.05, window_s=3600))
    node = two_island_node({0: 1, 1: 1}, utilization=0.01)
    assert node_gauges(node, tracker, 0.0).allocated_idle_gpus == 0
    assert node_gauges(node, tracker, 3599.0).allocated_idle_gpus == 0
    assert node_gauges(node, tracker, 3600.0).allocated_idle_gpus == 2
    busy = two_island_node({0: 1, 1: 1}, utilization=0.5)
    assert node_gauges(busy, tracker, 3700.0).allocated_idle_gpus == 0  # burst resets it
    assert node_gauges(node, tracker, 3800.0).allocated_idle_gpus == 0


def test_an_idle_history_follows_the_gpu_not_its_index():
    """NVML renumbers GPUs when one is added or removed: the GPU that takes index 0 starts its
    own idle window, while the GPU that moved to index 1 keeps the one it had."""
    tracker = IdleTracker(IdlePolicy(threshold=0.05, window_s=3600))

    def node(uuids: list[str]) -> NodeReading:
        gpus = [GpuReading(index=i, uuid=u, utilization_ratio=0.0) for i, u in enumerate(uuids)]
        allocations = [Allocation(gpu=i, pod=f"p{i}") for i in range(len(uuids))]
        return NodeReading(node="n", gpus=gpus, allocations=allocations)

    assert node_gauges(node(["GPU-a"]), tracker, 0.0).allocated_idle_gpus == 0
    renumbered = node(["GPU-new", "GPU-a"])
    assert node_gauges(renumbered, tracker, 1800.0).allocated_idle_gpus == 0
    new, moved = renumbered.gpus
    assert tracker.observe("n", moved, True, 3600.0)  # idle since 0 under index 0
    assert not tracker.observe("n", new, True, 3600.0)  # idle only since 1800
    assert node_gauges(renumbered, tracker, 5400.0).allocated_idle_gpus == 2


def test_stranded_memory_exclusive_vs_shared():
    policy = IdlePolicy(min_request_bytes=10 * GiB)
    # GPU 0 exclusively held: its 4 GiB free is stranded. GPU 1 shared by two pods: 4 GiB < 10 GiB
    # so stranded too. Free GPUs strand nothing.
    gauges = node_gauges(two_island_node({0: 1, 1: 2}), IdleTracker(policy), 0.0)
    assert gauges.stranded_memory_bytes == 8 * GiB
    big = IdlePolicy(min_request_bytes=2 * GiB)  # 4 GiB on a shared GPU still fits a request
    gauges = node_gauges(two_island_node({0: 1, 1: 2}), IdleTracker(big), 0.0)
    assert gauges.stranded_memory_bytes == 4 * GiB


def test_a_busy_gpu_nobody_holds_is_in_use_owner_unknown_never_free():
    """A dcgm-exporter page without pod labels: GPU 2 at 100 % with 70 GB in use, GPU 3 at 0 %
    holding 12 GiB (a process outside the scheduler), the rest idle."""
    node = two_island_node({})
    node.gpus[2].utilization_ratio, node.gpus[2].memory_used_bytes = 1.0, 70e9
    node.gpus[3].memory_used_bytes = 12 * GiB
    node.gpus[4].memory_used_bytes = 0.1 * GiB  # what an idle driver reserves: not use
    gauges = node_gauges(node, IdleTracker(IdlePolicy()), 0.0)
    assert (gauges.free_gpus, gauges.owner_unknown_gpus) == (6, 2)
    assert gauges.largest_free_nvlink_group == 4  # 4-7; 0-1 left in the first island
    assert gauges.allocated_idle_gpus == 0  # an unknown owner is no allocation


def test_a_mig_instance_busy_without_a_holder_makes_its_gpu_owner_unknown():
    node = two_island_node({})
    gpu = node.gpus[0]
    gpu.mig_enabled = True
    gpu.mig_instances = [
        MigInstance(1, 0, "3g.40gb", memory_total_bytes=40 * GiB, memory_used_bytes=0.0),
        MigInstance(2, 0, "3g.40gb", memory_total_bytes=40 * GiB, memory_used_bytes=0.0),
    ]
    gpu.mig_instances[1].graphics_engine_active_ratio = 0.996
    gauges = node_gauges(node, IdleTracker(IdlePolicy()), 0.0)
    assert (gauges.free_gpus, gauges.owner_unknown_gpus) == (7, 1)
    node.allocations.append(Allocation(gpu=0, pod="infer", gpu_instance_id=2))
    gauges = node_gauges(node, IdleTracker(IdlePolicy()), 0.0)
    assert (gauges.free_gpus, gauges.owner_unknown_gpus) == (7, 0)  # its holder is known now


def test_unknown_topology_gives_no_largest_free_nvlink_group():
    """An HGX node read from a dcgm-exporter page: no links, no islands. 1 would claim no two
    free GPUs are NVLink-connected, which the page does not say."""
    node = two_island_node({})
    node.links = []
    gauges = node_gauges(node, IdleTracker(IdlePolicy()), 0.0)
    assert gauges.free_gpus == 8 and gauges.largest_free_nvlink_group is None
    single = NodeReading(node="one", gpus=[GpuReading(index=0)])
    assert node_gauges(single, IdleTracker(IdlePolicy()), 0.0).largest_free_nvlink_group == 1
    islands = two_island_node({})
    islands.links = []
    for gpu in islands.gpus:
        gpu.nvlink_island = 0 if gpu.index < 4 else 4
    assert node_gauges(islands, IdleTracker(IdlePolicy()), 0.0).largest_free_nvlink_group == 4
