"""Turn one collection into metric families and a pre-rendered /metrics page.

Rendering happens once per collection in the collector thread; a scrape only copies bytes.
The text is written here directly rather than through `prometheus_client.generate_latest`:
at 1,000 nodes × 8 GPUs (500k series) the library's per-sample label validation took ~20 s a
cycle. The output follows the library's rules exactly (HELP/TYPE naming, escaping, Go-style
floats): `Families.metric_families()` hands the same records to prometheus_client, and a test
checks that both renderings are byte-identical. One exception: the dcgm-exporter compatible
series (`--compat.dcgm-names`) are written as dcgm-exporter writes them: counters under DCGM's
names without `_total` (client_golang allows it, dashboards query those names) and a label left
out where it has no value; prometheus_client would add `_total` and write `label=""`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from exporter.contract import (
    BY_NAME,
    DCGM_COMPAT,
    DCGM_COMPAT_KEYED,
    DCGM_KINDS,
    DCGM_MIG_FIELDS,
)
from exporter.node_gauges import NodeGauges
from exporter.readings import Collection, GpuReading, MigInstance, NodeReading, SimClock
from gpu_defrag_common.exposition import Families, MetricSpec, Page, TextCache, page_of


@dataclass(frozen=True, slots=True)
class SelfState:
    """The exporter's own health, rendered beside the GPU series."""

    version: str
    backend: str
    up: bool
    last_duration_s: float | None
    last_success_ts: float | None
    collections: int
    errors: dict[str, float]
    interval_s: float | None = None  # --collect.interval
    skipped_lines: dict[str, float] = field(default_factory=dict)  # scraped target -> count


def _flag(value: bool | None) -> float | None:
    return None if value is None else float(value)


def _number(value: float | None) -> float | None:
    return None if value is None else float(value)


# Per-GPU scalar metrics: contract name -> how to read it from a GpuReading.
GPU_SCALARS: tuple[tuple[str, Callable[[GpuReading], float | None]], ...] = (
    ("gpu_lost", lambda g: float(g.lost)),
    ("gpu_healthy", lambda g: float(g.healthy and not g.lost)),
    ("gpu_utilization_ratio", lambda g: g.utilization_ratio),
    ("gpu_memory_utilization_ratio", lambda g: g.memory_utilization_ratio),
    ("gpu_graphics_engine_active_ratio", lambda g: g.graphics_engine_active_ratio),
    ("gpu_sm_active_ratio", lambda g: g.sm_active_ratio),
    ("gpu_sm_occupancy_ratio", lambda g: g.sm_occupancy_ratio),
    ("gpu_tensor_active_ratio", lambda g: g.tensor_active_ratio),
    ("gpu_dram_active_ratio", lambda g: g.dram_active_ratio),
    ("gpu_encoder_utilization_ratio", lambda g: g.encoder_utilization_ratio),
    ("gpu_decoder_utilization_ratio", lambda g: g.decoder_utilization_ratio),
    ("gpu_memory_total_bytes", lambda g: g.memory_total_bytes),
    ("gpu_memory_used_bytes", lambda g: g.memory_used_bytes),
    ("gpu_memory_free_bytes", lambda g: g.memory_free_bytes),
    ("gpu_memory_reserved_bytes", lambda g: g.memory_reserved_bytes),
    ("gpu_temperature_celsius", lambda g: g.temperature_celsius),
    ("gpu_memory_temperature_celsius", lambda g: g.memory_temperature_celsius),
    ("gpu_power_watts", lambda g: g.power_watts),
    ("gpu_power_limit_watts", lambda g: g.power_limit_watts),
    ("gpu_power_limit_max_watts", lambda g: g.power_limit_max_watts),
    ("gpu_power_limit_default_watts", lambda g: g.power_limit_default_watts),
    ("gpu_energy_joules_total", lambda g: g.energy_joules),
    ("gpu_fan_speed_ratio", lambda g: g.fan_speed_ratio),
    ("gpu_performance_state", lambda g: _number(g.performance_state)),
    ("gpu_sm_clock_hertz", lambda g: g.sm_clock_hertz),
    ("gpu_memory_clock_hertz", lambda g: g.memory_clock_hertz),
    ("gpu_graphics_clock_hertz", lambda g: g.graphics_clock_hertz),
    ("gpu_video_clock_hertz", lambda g: g.video_clock_hertz),
    ("gpu_pcie_tx_bytes_per_second", lambda g: g.pcie_tx_bytes_per_second),
    ("gpu_pcie_rx_bytes_per_second", lambda g: g.pcie_rx_bytes_per_second),
    ("gpu_pcie_replay_errors_total", lambda g: g.pcie_replay_errors),
    ("gpu_nvlink_bytes_per_second", lambda g: g.nvlink_bytes_per_second),
    ("gpu_retired_pages_pending", lambda g: _flag(g.retired_pages_pending)),
    ("gpu_remapped_rows_pending", lambda g: _flag(g.remapped_rows_pending)),
    ("gpu_remapped_rows_failure", lambda g: _flag(g.remapped_rows_failure)),
    ("gpu_xid_last_timestamp_seconds", lambda g: g.xid_last_timestamp_seconds),
    ("gpu_xid_last_code", lambda g: _number(g.xid_last_code)),
    ("gpu_recovery_action", lambda g: _number(g.recovery_action)),
    ("gpu_fabric_state", lambda g: _number(g.fabric_state)),
    ("gpu_fabric_error", lambda g: _flag(g.fabric_error)),
    ("gpu_vgpu_licensed", lambda g: _flag(g.vgpu_licensed)),
    ("gpu_mig_mode_enabled", lambda g: _flag(g.mig_enabled)),
    ("gpu_nvlink_island", lambda g: None if g.nvlink_island is None else float(g.nvlink_island)),
)

# Per-GPU labelled maps: contract name -> (reading attribute, how the key becomes a label).
GPU_MAPS: tuple[tuple[str, str], ...] = (
    ("gpu_clock_event_active", "clock_event_active"),
    ("gpu_clock_event_seconds_total", "clock_event_seconds"),
    ("gpu_ecc_errors_total", "ecc_errors"),
    ("gpu_retired_pages", "retired_pages"),
    ("gpu_remapped_rows", "remapped_rows"),
    ("gpu_xid_errors_total", "xid_errors"),
)


def add_node(families: Families, node: NodeReading) -> None:
    """Every per-GPU, MIG, topology, process and allocation series of one node."""
    name = node.node
    for gpu in node.gpus:
        index = str(gpu.index)
        base = (name, index)
        families.add(
            "gpu_info",
            (
                *base,
                gpu.uuid,
                gpu.model,
                gpu.pci_bus_id,
                node.driver_version,
                node.cuda_version,
                gpu.serial,
                gpu.vbios_version,
            ),
            1,
        )
        for metric, read in GPU_SCALARS:
            families.add(metric, base, read(gpu))
        for metric, attribute in GPU_MAPS:
            for key, value in getattr(gpu, attribute).items():
                families.add(metric, (*base, str(key)), float(value))
        seen_gi: set[int] = set()
        for mig in gpu.mig_instances:
            if mig.gpu_instance_id in seen_gi:  # one sample per series: never a duplicate
                continue
            seen_gi.add(mig.gpu_instance_id)
            gi = str(mig.gpu_instance_id)
            computes = mig.compute_instances or {mig.compute_instance_id: mig.uuid}
            for ci, mig_uuid in sorted(computes.items()):  # info: one per compute instance
                families.add(
                    "gpu_mig_instance_info", (*base, gi, str(ci), mig.profile, mig_uuid), 1
                )
            families.add("gpu_mig_memory_total_bytes", (*base, gi), mig.memory_total_bytes)
            families.add("gpu_mig_memory_used_bytes", (*base, gi), mig.memory_used_bytes)
            families.add("gpu_mig_sm_active_ratio", (*base, gi), mig.sm_active_ratio)
            families.add(
                "gpu_mig_graphics_engine_active_ratio",
                (*base, gi),
                mig.graphics_engine_active_ratio,
            )
            families.add("gpu_mig_tensor_active_ratio", (*base, gi), mig.tensor_active_ratio)
            families.add("gpu_mig_dram_active_ratio", (*base, gi), mig.dram_active_ratio)
        if gpu.compute_mode:
            families.add("gpu_compute_mode_info", (*base, gpu.compute_mode), 1)
        if gpu.numa_node is not None or gpu.cpu_affinity:
            numa = "" if gpu.numa_node is None else str(gpu.numa_node)
            families.add("gpu_numa_info", (*base, numa, gpu.cpu_affinity), 1)
        for process in gpu.processes:
            labels = (
                *base,
                "" if process.gpu_instance_id is None else str(process.gpu_instance_id),
                str(process.pid),
                process.name,
                process.pod,
                process.namespace,
                process.container,
                process.slurm_job,
            )
            families.add("gpu_process_memory_used_bytes", labels, process.memory_used_bytes)
            families.add("gpu_process_sm_utilization_ratio", labels, process.sm_utilization_ratio)
    for link in node.links:
        base = (name, str(link.gpu))
        families.add("gpu_topology_link_info", (*base, str(link.peer), link.link_type), 1)
        if link.nvlink_count:
            families.add("gpu_nvlink_links", (*base, str(link.peer)), link.nvlink_count)
    for allocation in node.allocations:
        gi = "" if allocation.gpu_instance_id is None else str(allocation.gpu_instance_id)
        families.add(
            "gpu_allocation_info",
            (
                name,
                str(allocation.gpu),
                gi,
                allocation.pod,
                allocation.namespace,
                allocation.container,
                allocation.job,
                allocation.tenant,
                "" if allocation.priority is None else str(allocation.priority),
                "" if allocation.gpu_milli is None else str(allocation.gpu_milli),
            ),
            1,
        )
    if node.pool or node.rack:
        families.add("gpu_node_info", (name, node.pool, node.rack), 1)


def add_node_gauges(families: Families, gauges: NodeGauges) -> None:
    labels = (gauges.node,)
    families.add("gpu_node_gpus", labels, gauges.gpus)
    families.add("gpu_node_free_gpus", labels, gauges.free_gpus)
    families.add("gpu_node_owner_unknown_gpus", labels, gauges.owner_unknown_gpus)
    families.add(
        "gpu_node_largest_free_nvlink_group_gpus", labels, gauges.largest_free_nvlink_group
    )
    families.add("gpu_node_allocated_idle_gpus", labels, gauges.allocated_idle_gpus)
    families.add("gpu_node_stranded_memory_bytes", labels, gauges.stranded_memory_bytes)


def add_self(families: Families, state: SelfState) -> None:
    backend = (state.backend,)
    families.add("gpu_exporter_build_info", (state.version, state.backend), 1)
    families.add("gpu_exporter_backend_up", backend, float(state.up))
    families.add("gpu_exporter_collection_duration_seconds", backend, state.last_duration_s)
    families.add("gpu_exporter_last_success_timestamp_seconds", backend, state.last_success_ts)
    families.add("gpu_exporter_collection_interval_seconds", backend, state.interval_s)
    families.add("gpu_exporter_collections_total", backend, state.collections)
    for call, count in sorted(state.errors.items()):
        families.add("gpu_exporter_collection_errors_total", (state.backend, call), count)
    for target, count in sorted(state.skipped_lines.items()):
        families.add("gpu_exporter_skipped_lines_total", (state.backend, target), count)


def add_sim(families: Families, clock: SimClock) -> None:
    nodes = "" if clock.nodes is None else str(clock.nodes)
    families.add("gpu_sim_info", (clock.preset, str(clock.seed), nodes), 1)
    families.add("gpu_sim_time_seconds", (), clock.time_s)
    families.add("gpu_sim_epoch_timestamp_seconds", (), clock.epoch)


# dcgm-exporter's label order (internal/pkg/rendermetrics): identity, the MIG instance, the host
# (`Hostname` in every release up to 4.5.3-4.8.2), the driver version label row, then the pod
# labels of `-k` and the XID code. A label without a value is left out, as dcgm-exporter leaves
# out the MIG and pod labels where they do not apply, never written as `label=""`.
DCGM_LABELS = (
    "gpu",
    "UUID",
    "pci_bus_id",
    "device",
    "modelName",
    "GPU_I_PROFILE",
    "GPU_I_ID",
    "Hostname",
    "DCGM_FI_DRIVER_VERSION",
    "pod",
    "namespace",
    "container",
    "err_code",
)
DCGM_NAMES: dict[str, str] = {
    **{name: ours for name, (ours, _factor) in DCGM_COMPAT.items()},
    **{name: ours for name, (ours, _key) in DCGM_COMPAT_KEYED.items()},
}
# Each DCGM series keeps dcgm-exporter's type (etc/default-counters.csv): energy and PCIe replays
# are counters there as here, the remapped-row counts and NVLink bandwidth counters there.
DCGM_SPECS = {
    name: MetricSpec(
        name,
        DCGM_KINDS.get(name, "counter" if BY_NAME[ours].kind == "counter" else "gauge"),
        f"dcgm-exporter compatible {ours} (DCGM units).",
        DCGM_LABELS,
        omit_empty=True,
    )
    for name, ours in DCGM_NAMES.items()
}
MIB = 2.0**20


_DCGM_READERS = [
    (name, dict(GPU_SCALARS)[ours], factor) for name, (ours, factor) in DCGM_COMPAT.items()
]


def _dcgm_gpu_values(gpu: GpuReading) -> dict[str, float | None]:
    """Every DCGM name's value for the whole GPU, in DCGM's units (None: not known)."""
    values: dict[str, float | None] = {}
    for name, read, factor in _DCGM_READERS:
        value = read(gpu)
        values[name] = None if value is None else value * factor
    remapped = gpu.remapped_rows
    values["DCGM_FI_DEV_XID_ERRORS"] = _number(gpu.xid_last_code)
    values["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"] = remapped.get("uncorrectable")
    values["DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"] = remapped.get("correctable")
    values["DCGM_FI_DEV_ROW_REMAP_FAILURE"] = _flag(gpu.remapped_rows_failure)
    values["DCGM_FI_DEV_ROW_REMAP_PENDING"] = _flag(gpu.remapped_rows_pending)
    values["DCGM_FI_DEV_VGPU_LICENSE_STATUS"] = _flag(gpu.vgpu_licensed)
    return values


def _dcgm_instance_values(mig: MigInstance) -> dict[str, float | None]:
    """The values a MIG GPU instance has of its own (`DCGM_MIG_FIELDS`), in DCGM's units."""
    used, total = mig.memory_used_bytes, mig.memory_total_bytes
    free = None if used is None or total is None else total - used
    return {
        "DCGM_FI_DEV_FB_USED": None if used is None else used / MIB,
        "DCGM_FI_DEV_FB_FREE": None if free is None else free / MIB,
        "DCGM_FI_DEV_FB_TOTAL": None if total is None else total / MIB,
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": mig.graphics_engine_active_ratio,
        "DCGM_FI_PROF_SM_ACTIVE": mig.sm_active_ratio,
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": mig.tensor_active_ratio,
        "DCGM_FI_PROF_DRAM_ACTIVE": mig.dram_active_ratio,
    }


def _pod_of(node: NodeReading, gpu: int, gpu_instance_id: int | None) -> tuple[str, str, str]:
    """(pod, namespace, container) dcgm-exporter's `-k` puts on a GPU's (or MIG instance's)
    series: its one holder; none where several pods share it (dcgm-exporter would name one of
    them at random; gpu_allocation_info names them all)."""
    holders = {
        (a.pod, a.namespace, a.container)
        for a in node.allocations
        if a.gpu == gpu and a.gpu_instance_id == gpu_instance_id and a.pod
    }
    return next(iter(holders)) if len(holders) == 1 else ("", "", "")


def add_dcgm_compat(families: Families, nodes: Iterable[NodeReading]) -> None:
    """NVIDIA dcgm-exporter names, units and labels, so its stock Grafana dashboard and the
    rules users wrote for it work on our data. On a MIG GPU the fields a GPU instance has of its
    own are one series per instance (GPU_I_PROFILE, GPU_I_ID, the instance's pod), as in
    dcgm-exporter's flex mode; the device-wide ones stay one series per GPU, so a sum() over
    them counts each GPU once (dcgm-exporter repeats them on every instance)."""
    for node in nodes:
        for gpu in node.gpus:
            identity = (
                str(gpu.index),
                gpu.uuid,
                gpu.pci_bus_id,
                f"nvidia{gpu.index}",
                gpu.model,
            )
            host = (node.node, node.driver_version)
            per_instance = bool(gpu.mig_enabled and gpu.mig_instances)
            gpu_pod = _pod_of(node, gpu.index, None)
            labels = (*identity, "", "", *host, *gpu_pod, "")  # one tuple for every field
            for name, value in _dcgm_gpu_values(gpu).items():
                if value is None or (per_instance and name in DCGM_MIG_FIELDS):
                    continue
                if name == "DCGM_FI_DEV_XID_ERRORS":  # the code as a label too
                    xid = (*labels[:-1], str(int(value)))
                    families.add_spec(DCGM_SPECS[name], xid, value)
                else:
                    families.add_spec(DCGM_SPECS[name], labels, value)
            if not per_instance:
                continue
            seen: set[int] = set()
            for mig in gpu.mig_instances:
                if mig.gpu_instance_id in seen:
                    continue
                seen.add(mig.gpu_instance_id)
                pod = _pod_of(node, gpu.index, mig.gpu_instance_id)
                instance = (*identity, mig.profile, str(mig.gpu_instance_id), *host, *pod, "")
                for name, value in _dcgm_instance_values(mig).items():
                    if value is not None:
                        families.add_spec(DCGM_SPECS[name], instance, value)


def collect_families(
    collection: Collection | None,
    gauges: Iterable[NodeGauges],
    state: SelfState,
    *,
    dcgm_names: bool = False,
) -> Families:
    families = Families(BY_NAME)
    nodes = collection.nodes if collection else []
    for node in nodes:
        add_node(families, node)
    for gauge in gauges:
        add_node_gauges(families, gauge)
    add_self(families, state)
    if collection is not None and collection.sim is not None:
        add_sim(families, collection.sim)
    if dcgm_names:
        add_dcgm_compat(families, nodes)
    return families


def render_page(
    collection: Collection | None,
    gauges: Iterable[NodeGauges],
    state: SelfState,
    *,
    dcgm_names: bool = False,
    cache: TextCache | None = None,
) -> Page:
    families = collect_families(collection, gauges, state, dcgm_names=dcgm_names)
    if cache is not None:
        for name in set(cache) - {spec.name for spec, _ in families}:
            del cache[name]  # families that vanished must not pin old samples
    return page_of(families, cache)
