"""The metric-name contract: every series the exporter may expose, in one table.

The renderer, the advisor's ingest, the dashboards' linter and the alert rules all read names
from here, so a rename is one edit and a test catches any dashboard that references a name
that does not exist. Names follow Prometheus conventions: base units, `_total` for counters,
`_ratio` for 0-1 values, identity in one `_info` series per GPU.
"""

from __future__ import annotations

from gpu_defrag_common.exposition import MetricSpec

GPU = ("node", "gpu")  # every per-GPU series carries these two stable, low-cardinality labels
# a process on a GPU (its MIG instance "" without MIG) and who runs it
PROCESS = (
    *GPU,
    "gpu_instance_id",
    "pid",
    "process_name",
    "pod",
    "namespace",
    "container",
    "slurm_job",
)


def _g(name: str, help_: str, labels: tuple[str, ...] = GPU) -> MetricSpec:
    return MetricSpec(name, "gauge", help_, labels)


def _c(name: str, help_: str, labels: tuple[str, ...] = GPU) -> MetricSpec:
    return MetricSpec(name, "counter", help_, labels)


def _i(name: str, help_: str, labels: tuple[str, ...]) -> MetricSpec:
    return MetricSpec(name, "info", help_, labels)


METRICS: tuple[MetricSpec, ...] = (
    # --- identity and health ---
    _i(
        "gpu_info",
        "GPU identity; value is always 1.",
        (
            *GPU,
            "uuid",
            "model",
            "pci_bus_id",
            "driver_version",
            "cuda_version",
            "serial",
            "vbios_version",
        ),
    ),
    _g("gpu_lost", "1 if the GPU fell off the bus or NVML reports it lost, else 0."),
    _g(
        "gpu_healthy",
        "1 if the GPU is usable (reachable, not lost, no fatal XID, no row-remap failure).",
    ),
    # --- utilization ---
    _g("gpu_utilization_ratio", "Fraction of the sample period a kernel ran on the GPU (0-1)."),
    _g(
        "gpu_memory_utilization_ratio",
        "Fraction of the sample period device memory was read or written (0-1).",
    ),
    _g(
        "gpu_graphics_engine_active_ratio",
        "Fraction of time the graphics/compute engine was busy (DCGM GR_ENGINE_ACTIVE, NVML GPM "
        "graphics utilization).",
    ),
    _g("gpu_sm_active_ratio", "Fraction of SM cycles with a warp resident (GPM or DCGM DCP)."),
    _g("gpu_sm_occupancy_ratio", "Resident warps over the SM maximum (GPM or DCGM DCP)."),
    _g("gpu_tensor_active_ratio", "Fraction of cycles the tensor pipes were active."),
    _g("gpu_dram_active_ratio", "Fraction of cycles the memory interface was active."),
    _g("gpu_encoder_utilization_ratio", "Video encoder utilization (0-1)."),
    _g("gpu_decoder_utilization_ratio", "Video decoder utilization (0-1)."),
    # --- memory ---
    _g("gpu_memory_total_bytes", "Framebuffer memory size."),
    _g(
        "gpu_memory_used_bytes", "Framebuffer memory in use (NVML v2 semantics, excludes reserved)."
    ),
    _g("gpu_memory_free_bytes", "Framebuffer memory free."),
    _g("gpu_memory_reserved_bytes", "Framebuffer memory reserved by the driver and firmware."),
    # --- thermals, power, clocks ---
    _g("gpu_temperature_celsius", "GPU die temperature."),
    _g("gpu_memory_temperature_celsius", "HBM temperature, where reported."),
    _g("gpu_power_watts", "Current power draw."),
    _g("gpu_power_limit_watts", "Enforced power limit."),
    _g("gpu_power_limit_max_watts", "Highest power limit the board may be set to."),
    _g("gpu_power_limit_default_watts", "Power limit the board ships with."),
    _c("gpu_energy_joules_total", "Energy consumed since the driver was loaded."),
    _g("gpu_fan_speed_ratio", "Fan speed as a fraction of its maximum (boards with a fan)."),
    _g("gpu_performance_state", "Performance state: 0 (P0, most performance) to 15 (P15)."),
    _i(
        "gpu_compute_mode_info",
        "Compute mode (default, exclusive_process: one process at a time, prohibited: none); "
        "value is always 1.",
        (*GPU, "mode"),
    ),
    _g("gpu_sm_clock_hertz", "Current SM clock."),
    _g("gpu_memory_clock_hertz", "Current memory clock."),
    _g("gpu_graphics_clock_hertz", "Current graphics clock."),
    _g("gpu_video_clock_hertz", "Current video encoder/decoder clock."),
    _g(
        "gpu_clock_event_active",
        "1 if this clock-event (throttle) reason is active now, else 0.",
        (*GPU, "reason"),
    ),
    _c(
        "gpu_clock_event_seconds_total",
        "Time clocks were held down for this reason (violation counter).",
        (*GPU, "reason"),
    ),
    # --- PCIe ---
    _g("gpu_pcie_tx_bytes_per_second", "PCIe transmit throughput (20 ms NVML window)."),
    _g("gpu_pcie_rx_bytes_per_second", "PCIe receive throughput (20 ms NVML window)."),
    _c("gpu_pcie_replay_errors_total", "PCIe link replays (retries)."),
    _g(
        "gpu_nvlink_bytes_per_second",
        "NVLink data sent plus received over all links, without protocol overhead, averaged "
        "over the collection interval.",
    ),
    # --- memory errors ---
    _c(
        "gpu_ecc_errors_total",
        "ECC errors over the GPU's lifetime (aggregate counter).",
        (*GPU, "error_type"),
    ),
    _g("gpu_retired_pages", "Pages retired by dynamic page retirement.", (*GPU, "cause")),
    _g("gpu_retired_pages_pending", "1 if a page retirement waits for a reboot."),
    _g("gpu_remapped_rows", "Memory rows remapped (A100 and later).", (*GPU, "severity")),
    _g("gpu_remapped_rows_pending", "1 if a row remap waits for a GPU reset."),
    _g("gpu_remapped_rows_failure", "1 if a row remap failed (GPU should be replaced)."),
    # --- XID ---
    _c("gpu_xid_errors_total", "XID events seen, by XID code (event-driven).", (*GPU, "xid")),
    _g("gpu_xid_last_timestamp_seconds", "Unix time of the last XID event."),
    _g(
        "gpu_xid_last_code",
        "Code of the last XID event seen (0: none since the exporter or DCGM started).",
    ),
    # --- what the driver asks for ---
    _g(
        "gpu_recovery_action",
        "What the driver says the GPU needs to be usable again: 0 nothing, 1 a GPU reset, "
        "2 a node reboot, 3 drain peer-to-peer traffic, 4 drain and reset.",
    ),
    _g(
        "gpu_fabric_state",
        "NVSwitch fabric registration of the GPU: 1 not started, 2 in progress, 3 completed "
        "(absent where the GPU is on no fabric).",
    ),
    _g("gpu_fabric_error", "1 if the fabric registration completed with an error, else 0."),
    _g(
        "gpu_vgpu_licensed",
        "1 if this vGPU guest holds an NVIDIA vGPU software license, 0 if it runs unlicensed "
        "(only in vGPU virtual machines).",
    ),
    # --- MIG ---
    _g("gpu_mig_mode_enabled", "1 if MIG mode is enabled on the GPU."),
    _i(
        "gpu_mig_instance_info",
        "One MIG compute instance of a GPU instance; value is always 1.",
        (*GPU, "gpu_instance_id", "compute_instance_id", "profile", "mig_uuid"),
    ),
    _g("gpu_mig_memory_total_bytes", "Memory of the MIG GPU instance.", (*GPU, "gpu_instance_id")),
    _g(
        "gpu_mig_memory_used_bytes",
        "Memory in use in the MIG GPU instance.",
        (*GPU, "gpu_instance_id"),
    ),
    _g(
        "gpu_mig_sm_active_ratio",
        "SM activity of the MIG GPU instance (NVML GPM: Hopper and later; DCGM DCP: A100 too).",
        (*GPU, "gpu_instance_id"),
    ),
    _g(
        "gpu_mig_graphics_engine_active_ratio",
        "Fraction of time the MIG GPU instance's engine was busy: its utilization (DCGM "
        "GR_ENGINE_ACTIVE, in dcgm-exporter's default counters; NVML GPM graphics utilization).",
        (*GPU, "gpu_instance_id"),
    ),
    _g(
        "gpu_mig_tensor_active_ratio",
        "Fraction of cycles the MIG GPU instance's tensor pipes were active.",
        (*GPU, "gpu_instance_id"),
    ),
    _g(
        "gpu_mig_dram_active_ratio",
        "Fraction of cycles the MIG GPU instance's memory interface was active.",
        (*GPU, "gpu_instance_id"),
    ),
    # --- topology ---
    _i(
        "gpu_topology_link_info",
        "How two GPUs of a node are connected; value is always 1.",
        (*GPU, "peer_gpu", "link_type"),
    ),
    _g(
        "gpu_nvlink_links",
        "Number of active NVLinks between two GPUs.",
        (*GPU, "peer_gpu"),
    ),
    _i(
        "gpu_numa_info",
        "NUMA node and CPU affinity of the GPU; value is always 1.",
        (*GPU, "numa_node", "cpu_affinity"),
    ),
    _g("gpu_nvlink_island", "Id of the NVLink-connected GPU group (island) on the node."),
    # --- processes and allocations ---
    _g(
        "gpu_process_memory_used_bytes",
        'GPU memory held by a process (gpu_instance_id: its MIG instance, "" without MIG).',
        PROCESS,
    ),
    _g(
        "gpu_process_sm_utilization_ratio",
        "SM utilization of one process on a shared (time-sliced) GPU.",
        PROCESS,
    ),
    _i(
        "gpu_allocation_info",
        "Who holds the GPU or MIG instance (kubelet pod-resources or Slurm), with its priority "
        "and its guaranteed share in milli-GPU where the source knows them; value is always 1.",
        (
            *GPU,
            "gpu_instance_id",
            "pod",
            "namespace",
            "container",
            "workload",
            "tenant",
            "priority",
            "gpu_milli",
        ),
    ),
    # --- node-level fragmentation ---
    _i(
        "gpu_node_info",
        "Node placement for the advisor; value is always 1.",
        ("node", "pool", "rack"),
    ),
    _g("gpu_node_gpus", "GPUs on the node.", ("node",)),
    _g(
        "gpu_node_free_gpus",
        "Healthy GPUs with no allocation and no sign of use (an unallocated GPU that is busy or "
        "holds memory is in use, owner unknown: gpu_node_owner_unknown_gpus).",
        ("node",),
    ),
    _g(
        "gpu_node_owner_unknown_gpus",
        "Healthy GPUs (or MIG instances' GPUs) in use, by utilization or memory held, with no "
        "allocation or process owner known: used capacity, never free.",
        ("node",),
    ),
    _g(
        "gpu_node_largest_free_nvlink_group_gpus",
        "Size of the largest group of free GPUs that are all NVLink-connected (absent where the "
        "node's topology is unknown).",
        ("node",),
    ),
    _g(
        "gpu_node_allocated_idle_gpus",
        "Allocated GPUs whose utilization stayed under the idle threshold for the idle window.",
        ("node",),
    ),
    _g(
        "gpu_node_stranded_memory_bytes",
        "Free memory on partly used GPUs that a typical request cannot use.",
        ("node",),
    ),
    # --- simulated fleet (sim backend only) ---
    _i(
        "gpu_sim_info",
        "The simulated fleet this exporter serves (nodes: the node-count override, empty for "
        "the preset's own); value is always 1.",
        ("preset", "seed", "nodes"),
    ),
    _g("gpu_sim_time_seconds", "Simulated seconds since the fleet's t = 0 at the collection.", ()),
    _g(
        "gpu_sim_epoch_timestamp_seconds",
        "Unix time stamped on simulated t = 0: a reading at simulated time t is stamped epoch + t "
        "(at --sim.speed 1 the wall clock; faster, the simulated clock runs ahead of it).",
        (),
    ),
    # --- exporter self-metrics ---
    _i("gpu_exporter_build_info", "Exporter build; value is always 1.", ("version", "backend")),
    _g("gpu_exporter_backend_up", "1 if the last collection reached the backend.", ("backend",)),
    _g(
        "gpu_exporter_collection_duration_seconds",
        "Wall time of the last collection cycle.",
        ("backend",),
    ),
    _g(
        "gpu_exporter_collection_interval_seconds",
        "How often the exporter collects (--collect.interval): a collection taking longer "
        "serves older data than the interval promises.",
        ("backend",),
    ),
    _g(
        "gpu_exporter_last_success_timestamp_seconds",
        "Unix time of the last complete collection.",
        ("backend",),
    ),
    _c("gpu_exporter_collections_total", "Collection cycles run.", ("backend",)),
    _c(
        "gpu_exporter_collection_errors_total",
        "Failed backend calls, by call name.",
        ("backend", "call"),
    ),
    _c(
        "gpu_exporter_skipped_lines_total",
        "Lines of a scraped page that could not be parsed and were skipped, the rest of the page "
        "kept (dcgm-exporter backend: e.g. `ERROR - FAILED TO CONVERT TO STRING` values).",
        ("backend", "target"),
    ),
)

BY_NAME: dict[str, MetricSpec] = {spec.name: spec for spec in METRICS}

# Names of the NVIDIA dcgm-exporter series we can also emit (`--compat.dcgm-names`), mapped to
# our metric and the factor from our base unit to DCGM's unit (MiB, MHz, %, mJ, MiB/s). The
# dcgm backends read the same table the other way. Their TYPE is dcgm-exporter's
# (`DCGM_KINDS`, else our metric's kind).
DCGM_COMPAT: dict[str, tuple[str, float]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("gpu_utilization_ratio", 100.0),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("gpu_memory_utilization_ratio", 100.0),
    "DCGM_FI_DEV_FB_USED": ("gpu_memory_used_bytes", 1.0 / 2**20),
    "DCGM_FI_DEV_FB_FREE": ("gpu_memory_free_bytes", 1.0 / 2**20),
    "DCGM_FI_DEV_FB_RESERVED": ("gpu_memory_reserved_bytes", 1.0 / 2**20),
    "DCGM_FI_DEV_FB_TOTAL": ("gpu_memory_total_bytes", 1.0 / 2**20),
    "DCGM_FI_DEV_ENC_UTIL": ("gpu_encoder_utilization_ratio", 100.0),
    "DCGM_FI_DEV_DEC_UTIL": ("gpu_decoder_utilization_ratio", 100.0),
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": ("gpu_power_limit_watts", 1.0),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX": ("gpu_power_limit_max_watts", 1.0),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF": ("gpu_power_limit_default_watts", 1.0),
    "DCGM_FI_DEV_GPU_TEMP": ("gpu_temperature_celsius", 1.0),
    "DCGM_FI_DEV_MEMORY_TEMP": ("gpu_memory_temperature_celsius", 1.0),
    "DCGM_FI_DEV_POWER_USAGE": ("gpu_power_watts", 1.0),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("gpu_energy_joules_total", 1000.0),
    "DCGM_FI_DEV_FAN_SPEED": ("gpu_fan_speed_ratio", 100.0),
    "DCGM_FI_DEV_PSTATE": ("gpu_performance_state", 1.0),
    "DCGM_FI_DEV_SM_CLOCK": ("gpu_sm_clock_hertz", 1e-6),
    "DCGM_FI_DEV_MEM_CLOCK": ("gpu_memory_clock_hertz", 1e-6),
    "DCGM_FI_DEV_VIDEO_CLOCK": ("gpu_video_clock_hertz", 1e-6),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("gpu_pcie_replay_errors_total", 1.0),
    # DCGM documents no unit; measured against nvidia-smi it is a rate in MB/s, not the counter
    # dcgm-exporter types it as (KempnerInstitute/kempnerpulse#10, NVIDIA/dcgm-exporter#472)
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": ("gpu_nvlink_bytes_per_second", 1.0 / 2**20),
    "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION": ("gpu_recovery_action", 1.0),
    # Graphics engine activity (GR_ENGINE_ACTIVE, in dcgm-exporter's default counters) and SM
    # activity (SM_ACTIVE, opt-in there) are different measures, each under its own name.
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gpu_graphics_engine_active_ratio", 1.0),
    "DCGM_FI_PROF_SM_ACTIVE": ("gpu_sm_active_ratio", 1.0),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("gpu_tensor_active_ratio", 1.0),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("gpu_dram_active_ratio", 1.0),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("gpu_sm_occupancy_ratio", 1.0),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("gpu_pcie_tx_bytes_per_second", 1.0),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("gpu_pcie_rx_bytes_per_second", 1.0),
}
# dcgm-exporter series read from one of our labelled or yes/no metrics: DCGM name -> (our
# metric, the value of its one extra label, "" for a metric without one). The dcgm backends
# read these back through their own tables (`dcgm_common.KEYED`, `FLAGS`, the XID tracker).
DCGM_COMPAT_KEYED: dict[str, tuple[str, str]] = {
    "DCGM_FI_DEV_XID_ERRORS": ("gpu_xid_last_code", ""),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("gpu_remapped_rows", "uncorrectable"),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("gpu_remapped_rows", "correctable"),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("gpu_remapped_rows_failure", ""),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": ("gpu_remapped_rows_pending", ""),
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": ("gpu_vgpu_licensed", ""),
}
# TYPE of the series whose dcgm-exporter type differs from our metric's kind
# (etc/default-counters.csv types remapped-row counts and NVLink bandwidth as counters).
DCGM_KINDS: dict[str, str] = {
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "counter",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "counter",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "counter",
}
# Fields a MIG GPU instance has a value of its own for: on a MIG GPU they are one series per
# instance (GPU_I_PROFILE, GPU_I_ID), as dcgm-exporter's flex mode has them; every other field
# is the GPU's (DCGM repeats it on each instance's series).
DCGM_MIG_FIELDS = frozenset(
    {
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_FB_RESERVED",
        "DCGM_FI_DEV_FB_TOTAL",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "DCGM_FI_PROF_SM_ACTIVE",
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "DCGM_FI_PROF_PCIE_RX_BYTES",
    }
)


def spec(name: str) -> MetricSpec:
    """The spec of an exposed metric name; KeyError names the unknown metric."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"metric {name!r} is not in the exporter contract") from None
