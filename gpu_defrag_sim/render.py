"""Turn the fleet's arrays into NodeReadings, the shape every real backend produces.

Static facts (uuids, links, islands, NUMA) are built once per fleet and reused; per collection
only the values change. The `links` lists are shared between collections (and between nodes of
the same board): treat readings as read-only. Values are derived from the same activity the energy counters integrate,
so power, temperature and clocks move together with utilization.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from exporter.readings import (
    CLOCK_EVENT_REASONS,
    Allocation,
    GpuProcess,
    GpuReading,
    MigInstance,
    NodeReading,
    TopologyLink,
    nvlink_islands,
)
from gpu_defrag_sim.models import PCI_BUS_IDS_8
from gpu_defrag_sim.presets import NodeSpec
from gpu_defrag_sim.workload import DAY, HOUR, KIND_BY_NAME, hash01

if TYPE_CHECKING:
    from gpu_defrag_sim.fleet import SimFleet

_MIG_NAMESPACE = "prod-serving"


@dataclass(slots=True)
class _Static:
    """Per-fleet facts that never change: built on the first collection."""

    links: list[list[TopologyLink]]
    islands: list[dict[int, int]]
    serials: list[str]
    energy_offset: np.ndarray  # joules used before t=0 (driver loaded days earlier)
    temp_offset: np.ndarray


def _static(fleet: SimFleet) -> _Static:
    cached = fleet._render_static
    if isinstance(cached, _Static):
        return cached
    links, islands = [], []
    by_board: dict[str, tuple[list[TopologyLink], dict[int, int]]] = {}
    for node in fleet.spec.nodes:
        board = node.board
        if board.name not in by_board:
            node_links = [TopologyLink(a, b, kind, count) for a, b, kind, count in board.links]
            by_board[board.name] = (node_links, nvlink_islands(range(board.gpus), node_links))
        node_links, node_islands = by_board[board.name]
        links.append(node_links)
        islands.append(node_islands)
    serials = [f"{1650000000000 + int(s % np.uint64(9_000_000_000))}" for s in fleet.gpu_seed]
    days = 2 + 28 * hash01(fleet.gpu_seed, 0, salt=6)
    static = _Static(
        links,
        islands,
        serials,
        fleet.idle_power * days * DAY * 1.6,
        3.0 * hash01(fleet.gpu_seed, 0, salt=5),
    )
    fleet._render_static = static
    return static


def render(fleet: SimFleet, unix_time_of: Callable[[float], float]) -> list[NodeReading]:
    """One NodeReading per node for the fleet's current instant."""
    static = _static(fleet)
    t = fleet.now
    slot_util, util, power = fleet.activity_at(t)
    occupied = fleet.slot_job >= 0
    running = occupied & fleet.slot_proc
    wobble = 0.93 + 0.07 * hash01(fleet.slot_seed, np.int64(t // 300), salt=7)
    slot_mem = np.where(
        running, fleet.mem_total[:, None] * fleet.slot_frac * fleet.slot_mem * wobble, 0.0
    )
    mem_used = slot_mem.sum(axis=1)
    mig_used = np.zeros(len(fleet.mig))
    mig_util = np.zeros(len(fleet.mig))
    if fleet.mig:
        mig_util = fleet.activity_at_mig(t)
        mig_used = np.where(fleet.mig_base > 0, fleet.mig_mem * (0.3 + 0.5 * fleet.mig_base), 0.0)
        np.add.at(mem_used, fleet.mig_gpu_index, mig_used)
    limit = fleet.power_limit
    temperature = 27.0 + 48.0 * power / limit + static.temp_offset
    capped = power >= 0.95 * limit
    busy = running.any(axis=1) | (fleet.used > 0)
    max_clock, idle_clock = fleet.max_clock, fleet.idle_clock
    sm_clock = np.where(util > 0.01, max_clock * np.where(capped, 0.93, 1.0), idle_clock)
    sm_clock = np.where((util <= 0.01) & busy, 0.5 * (idle_clock + max_clock), sm_clock)
    jitter = hash01(fleet.gpu_seed, np.int64(t // 60), salt=8)
    mem_util = np.minimum(1.0, util * (0.35 + 0.25 * jitter))
    pcie = util * (1.5e9 + 3e9 * jitter)
    energy = fleet.energy_at_now() + static.energy_offset
    ecc = 3.0 + np.floor((t + 4 * HOUR) / (5 * HOUR))

    cols = {
        "util": util.tolist(),
        "mem_util": mem_util.tolist(),
        "mem_used": mem_used.tolist(),
        "temp": temperature.tolist(),
        "power": power.tolist(),
        "energy": energy.tolist(),
        "sm_clock": sm_clock.tolist(),
        "mem_clock": fleet.mem_clock.tolist(),
        "pcie": pcie.tolist(),
        "capped": capped.tolist(),
        "idle_s": fleet.idle_seconds.tolist(),
        "cap_s": fleet.power_cap_seconds.tolist(),
    }
    slot_rows = _slot_rows(fleet, slot_util, slot_mem)
    mig_rows = _mig_rows(fleet, mig_util, mig_used)
    nodes = []
    for index, spec in enumerate(fleet.spec.nodes):
        lo = int(fleet.node_start[index])
        gpus, allocations = [], []
        for local in range(spec.board.gpus):
            gpu = lo + local
            processes, allocs = slot_rows.get(gpu, ([], []))
            mig_instances, mig_procs, mig_allocs = mig_rows.get(gpu, ([], [], []))
            allocations.extend(allocs)
            allocations.extend(mig_allocs)
            reading = _gpu(
                fleet, static, spec, index, local, cols, ecc, mig_instances, unix_time_of
            )
            reading.processes = processes + mig_procs
            gpus.append(reading)
        nodes.append(
            NodeReading(
                node=spec.name,
                driver_version=spec.driver_version,
                cuda_version=spec.cuda_version,
                gpus=gpus,
                links=static.links[index],
                allocations=allocations,
                pool=spec.pool,
                rack=spec.rack,
            )
        )
    return nodes


def _gpu(
    fleet: SimFleet,
    static: _Static,
    spec: NodeSpec,
    node_index: int,
    local: int,
    cols: dict[str, list],
    ecc: float,
    mig_instances: list[MigInstance],
    unix_time_of: Callable[[float], float],
) -> GpuReading:
    """One GpuReading from the precomputed columns."""
    gpu = int(fleet.node_start[node_index]) + local
    model = spec.model
    mig = bool(mig_instances) or spec.mig
    util = cols["util"][gpu]
    used = cols["mem_used"][gpu]
    total = model.memory_bytes
    is_ecc = gpu == fleet.ecc_gpu
    idle = util <= 0.0
    capped = cols["capped"][gpu]
    xids = fleet.xid_counts.get(gpu)
    reading = GpuReading(
        index=local,
        uuid=fleet.uuids[gpu],
        model=model.name,
        pci_bus_id=PCI_BUS_IDS_8[local] if local < 8 else f"00000000:{0xC0 + local:02X}:00.0",
        serial=static.serials[gpu],
        vbios_version=model.vbios_version,
        utilization_ratio=None if mig else util,
        memory_utilization_ratio=None if mig else cols["mem_util"][gpu],
        graphics_engine_active_ratio=None if mig else util,
        sm_active_ratio=0.85 * util,
        sm_occupancy_ratio=0.4 * util,
        tensor_active_ratio=0.45 * util,
        dram_active_ratio=0.9 * cols["mem_util"][gpu],
        encoder_utilization_ratio=0.0,
        decoder_utilization_ratio=0.0,
        memory_total_bytes=total,
        memory_used_bytes=used,
        memory_free_bytes=max(0.0, total - used - model.reserved_bytes),
        memory_reserved_bytes=model.reserved_bytes,
        temperature_celsius=round(cols["temp"][gpu], 1),
        memory_temperature_celsius=round(cols["temp"][gpu] + 4.0, 1),
        power_watts=cols["power"][gpu],
        power_limit_watts=model.power_limit_watts,
        power_limit_max_watts=model.power_limit_watts,  # boards run at their maximum
        power_limit_default_watts=model.power_limit_watts,
        energy_joules=cols["energy"][gpu],
        performance_state=0,  # datacenter GPUs in persistence mode stay in P0
        compute_mode="default",
        sm_clock_hertz=cols["sm_clock"][gpu],
        memory_clock_hertz=cols["mem_clock"][gpu],
        graphics_clock_hertz=cols["sm_clock"][gpu],
        clock_event_active={
            reason: (reason == "gpu_idle" and idle) or (reason == "sw_power_cap" and capped)
            for reason in CLOCK_EVENT_REASONS
        },
        clock_event_seconds={
            "gpu_idle": cols["idle_s"][gpu],
            "sw_power_cap": cols["cap_s"][gpu],
            "hw_slowdown": 0.0,
            "sw_thermal_slowdown": 0.0,
        },
        pcie_tx_bytes_per_second=cols["pcie"][gpu],
        pcie_rx_bytes_per_second=1.4 * cols["pcie"][gpu],
        pcie_replay_errors=0.0,
        ecc_errors={"corrected": float(ecc) if is_ecc else 0.0, "uncorrected": 0.0},
        xid_errors={code: float(n) for code, n in xids.items()} if xids else {},
        xid_last_timestamp_seconds=(
            unix_time_of(fleet.xid_last[gpu]) if gpu in fleet.xid_last else None
        ),
        # the last XID's code where the fleet raised one code only (else which came last is
        # not kept: unknown)
        xid_last_code=(0 if not xids else next(iter(xids)) if len(xids) == 1 else None),
        recovery_action=0,
        mig_enabled=(mig if model.mig_profiles else None),
        mig_instances=mig_instances,
        numa_node=spec.board.numa[local],
        cpu_affinity=spec.board.cpu_affinity[local],
        nvlink_island=static.islands[node_index][local],
    )
    if model.row_remapping:
        reading.remapped_rows = {"correctable": 1.0 if is_ecc else 0.0, "uncorrectable": 0.0}
        reading.remapped_rows_pending = False
        reading.remapped_rows_failure = False
    else:
        reading.retired_pages = {"single_bit": 1.0 if is_ecc else 0.0, "double_bit": 0.0}
        reading.retired_pages_pending = False
    return reading


def _slot_rows(
    fleet: SimFleet, slot_util: np.ndarray, slot_mem: np.ndarray
) -> dict[int, tuple[list[GpuProcess], list[Allocation]]]:
    """Processes and allocations of every occupied job slot, keyed by global GPU."""
    rows: dict[int, tuple[list[GpuProcess], list[Allocation]]] = {}
    gpus, slots = np.nonzero(fleet.slot_job >= 0)
    jobs = fleet.slot_job[gpus, slots].tolist()
    procs = fleet.slot_proc[gpus, slots].tolist()
    utils = slot_util[gpus, slots].tolist()
    mems = slot_mem[gpus, slots].tolist()
    millis = np.rint(fleet.slot_frac[gpus, slots] * 1000).astype(int).tolist()
    locals_ = fleet.gpu_local[gpus].tolist()
    nodes = fleet.gpu_node[gpus].tolist()
    for gpu, job_id, proc, util, mem, milli, local, node in zip(
        gpus.tolist(), jobs, procs, utils, mems, millis, locals_, nodes, strict=True
    ):
        job = fleet.jobs[job_id]
        kind = KIND_BY_NAME[job.kind]
        pod = job.pods[node]
        processes, allocations = rows.setdefault(gpu, ([], []))
        allocations.append(
            Allocation(
                gpu=local,
                pod=pod,
                namespace=job.namespace,
                container=kind.container,
                job=job.name,
                tenant=job.tenant,
                priority=job.priority,
                gpu_milli=milli,
            )
        )
        if proc:
            processes.append(
                GpuProcess(
                    pid=1000 + (job.seed % 3_000_000) + local,
                    name=kind.process,
                    memory_used_bytes=mem,
                    sm_utilization_ratio=util,
                    pod=pod,
                    namespace=job.namespace,
                    container=kind.container,
                )
            )
    return rows


def _mig_rows(
    fleet: SimFleet, mig_util: np.ndarray, mig_used: np.ndarray
) -> dict[int, tuple[list[MigInstance], list[GpuProcess], list[Allocation]]]:
    """MIG instances of the MIG node with their inference pods, keyed by global GPU."""
    rows: dict[int, tuple[list[MigInstance], list[GpuProcess], list[Allocation]]] = {}
    for slot, util, used in zip(fleet.mig, mig_util.tolist(), mig_used.tolist(), strict=True):
        instances, processes, allocations = rows.setdefault(slot.gpu, ([], [], []))
        instances.append(
            MigInstance(
                gpu_instance_id=slot.gpu_instance_id,
                compute_instance_id=0,
                profile=slot.profile,
                uuid=slot.uuid,
                memory_total_bytes=slot.memory_bytes,
                memory_used_bytes=used,
                sm_active_ratio=0.85 * util,
                graphics_engine_active_ratio=util,  # engine busy whenever its pods run
                tensor_active_ratio=0.45 * util,
            )
        )
        if not slot.owner:
            continue
        local = int(fleet.gpu_local[slot.gpu])
        allocations.append(
            Allocation(
                gpu=local,
                pod=slot.owner,
                namespace=_MIG_NAMESPACE,
                container="server",
                job=slot.owner.rsplit("-", 2)[0],
                tenant="product",
                gpu_instance_id=slot.gpu_instance_id,
                priority=1000,
            )
        )
        processes.append(
            GpuProcess(
                pid=1000 + (slot.seed % 3_000_000),
                name="tritonserver",
                memory_used_bytes=used,
                sm_utilization_ratio=util,
                gpu_instance_id=slot.gpu_instance_id,
                pod=slot.owner,
                namespace=_MIG_NAMESPACE,
                container="server",
            )
        )
    return rows
