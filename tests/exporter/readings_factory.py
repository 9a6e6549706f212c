"""Readings with every field populated, so rendering and promtool see every metric family."""

from __future__ import annotations

from exporter.readings import (
    CLOCK_EVENT_REASONS,
    Allocation,
    Collection,
    GpuProcess,
    GpuReading,
    MigInstance,
    NodeReading,
    TopologyLink,
)

GiB = 2**30


def gpu(index: int, *, utilization: float = 0.5, used_gib: float = 40.0) -> GpuReading:
    return GpuReading(
        index=index,
        uuid=f"GPU-{index:08d}-aaaa-bbbb-cccc-000000000000",
        model="NVIDIA H100 80GB HBM3",
        pci_bus_id=f"00000000:{0x18 + index:02X}:00.0",
        serial=f"16523{index:05d}",
        vbios_version="96.00.74.00.01",
        utilization_ratio=utilization,
        memory_utilization_ratio=utilization / 2,
        graphics_engine_active_ratio=utilization * 0.95,
        sm_active_ratio=utilization * 0.9,
        sm_occupancy_ratio=0.3,
        tensor_active_ratio=0.2,
        dram_active_ratio=0.25,
        encoder_utilization_ratio=0.0,
        decoder_utilization_ratio=0.0,
        memory_total_bytes=80 * GiB,
        memory_used_bytes=used_gib * GiB,
        memory_free_bytes=(80 - used_gib - 0.5) * GiB,
        memory_reserved_bytes=0.5 * GiB,
        temperature_celsius=55.0,
        memory_temperature_celsius=60.0,
        power_watts=350.5,
        power_limit_watts=700.0,
        power_limit_max_watts=700.0,
        power_limit_default_watts=700.0,
        energy_joules=1.25e9,
        fan_speed_ratio=0.3,
        performance_state=0,
        compute_mode="default",
        sm_clock_hertz=1.98e9,
        memory_clock_hertz=2.619e9,
        graphics_clock_hertz=1.98e9,
        video_clock_hertz=1.755e9,
        clock_event_active={reason: reason == "sw_power_cap" for reason in CLOCK_EVENT_REASONS},
        clock_event_seconds={"sw_power_cap": 12.5, "hw_thermal_slowdown": 0.0},
        pcie_tx_bytes_per_second=1.2e9,
        pcie_rx_bytes_per_second=3.4e9,
        pcie_replay_errors=0.0,
        nvlink_bytes_per_second=5.0e10,
        ecc_errors={"corrected": 3.0, "uncorrected": 0.0},
        retired_pages={"single_bit": 0.0, "double_bit": 0.0},
        retired_pages_pending=False,
        remapped_rows={"correctable": 1.0, "uncorrectable": 0.0},
        remapped_rows_pending=False,
        remapped_rows_failure=False,
        xid_errors={13: 2.0, 31: 1.0},
        xid_last_timestamp_seconds=1.7e9,
        xid_last_code=31,
        recovery_action=0,
        fabric_state=3,
        fabric_error=False,
        vgpu_licensed=True,
        mig_enabled=False,
        numa_node=0 if index < 4 else 1,
        cpu_affinity="0-31" if index < 4 else "32-63",
        nvlink_island=0,
    )


def node(name: str = "node-a", gpus: int = 8) -> NodeReading:
    """GPUs 0 and 1 allocated and busy, the last one in MIG mode with instance 3 allocated and
    busy, GPU `gpus - 2` busy with no holder known (in use, owner unknown), the rest idle."""
    readings = [
        gpu(i) if i < 2 or i >= gpus - 2 else gpu(i, utilization=0.0, used_gib=0.0)
        for i in range(gpus)
    ]
    mig_gpu = readings[-1]
    mig_gpu.mig_enabled = True
    mig_gpu.mig_instances = [
        MigInstance(
            gpu_instance_id=gi,
            compute_instance_id=0,
            profile="1g.10gb",
            uuid=f"MIG-{gi:08d}-0000-0000-0000-000000000000",
            memory_total_bytes=10 * GiB,
            memory_used_bytes=GiB if gi == 3 else 0.0,
            sm_active_ratio=0.3 if gi == 3 else 0.0,
            graphics_engine_active_ratio=0.35 if gi == 3 else 0.0,
            tensor_active_ratio=0.1 if gi == 3 else 0.0,
            dram_active_ratio=0.2 if gi == 3 else 0.0,
        )
        for gi in range(7)
    ]
    mig_gpu.processes = [
        GpuProcess(
            pid=4444,
            name="tritonserver",
            memory_used_bytes=GiB,
            gpu_instance_id=3,
            pod="infer",
            namespace="product",
            container="server",
        )
    ]
    readings[0].processes = [
        GpuProcess(
            pid=4242,
            name="python",
            memory_used_bytes=20 * GiB,
            sm_utilization_ratio=0.4,
            pod="train-0",
            namespace="rnd",
            container="trainer",
        ),
        GpuProcess(pid=4343, name="python3", memory_used_bytes=10 * GiB, slurm_job="1234"),
    ]
    links = [
        TopologyLink(gpu=a, peer=b, link_type="nvlink", nvlink_count=18)
        for a in range(gpus)
        for b in range(gpus)
        if a != b
    ]
    allocations = [
        Allocation(gpu=0, pod="train-0", namespace="rnd", container="trainer", tenant="rnd"),
        Allocation(
            gpu=1,
            pod="idle-1",
            namespace="product",
            container="c",
            tenant="product",
            priority=-5,
            gpu_milli=500,
        ),
        Allocation(
            gpu=gpus - 1, gpu_instance_id=3, pod="infer", namespace="product", tenant="product"
        ),
    ]
    return NodeReading(
        node=name,
        driver_version="550.54.15",
        cuda_version="12.4",
        gpus=readings,
        links=links,
        allocations=allocations,
        pool="h100",
        rack="rack-1",
    )


def collection(timestamp: float = 1_700_000_000.0, nodes: int = 1) -> Collection:
    return Collection(nodes=[node(f"node-{i}") for i in range(nodes)], timestamp=timestamp)
