"""What one collection saw, in base units, independent of where it came from.

Every backend (NVML, DCGM, a dcgm-exporter scrape, the simulated fleet) fills these records;
the renderer turns them into metric families and the advisor ingests the same shape. `None`
means "not supported or failed this cycle": the metric is left out rather than faked, so a
dashboard shows a gap instead of a sentinel value.

With `exporter.contract` (the metric names) this module is the contract between exporter and
advisor, the only exporter modules the advisor imports: the records, and the facts both sides
derive from them (`nvlink_islands`) so that they agree on what a reading means.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

# Canonical clock-event (throttle) reason names, in NVML bit order. Labels use these strings.
CLOCK_EVENT_REASONS: tuple[str, ...] = (
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "sync_boost",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "display_clock_setting",
)

# NVML compute modes (nvmlComputeMode_t) -> label values; EXCLUSIVE_THREAD (1) is gone from
# every supported driver.
COMPUTE_MODES: dict[int, str] = {0: "default", 2: "prohibited", 3: "exclusive_process"}

# Link types between two GPUs of one node, closest first (NVML topology levels + NVLink).
LINK_TYPES: tuple[str, ...] = (
    "nvlink",  # one or more NVLinks (nvlink_count says how many)
    "pcie_switch",  # NVML_TOPOLOGY_SINGLE: behind one PCIe switch
    "pcie_multi_switch",  # NVML_TOPOLOGY_MULTIPLE: several switches, no host bridge
    "host_bridge",  # NVML_TOPOLOGY_HOSTBRIDGE: same PCIe host bridge
    "numa_node",  # NVML_TOPOLOGY_NODE: same NUMA node, different host bridges
    "cross_socket",  # NVML_TOPOLOGY_SYSTEM: across the CPU interconnect (QPI/UPI/xGMI)
)


@dataclass(slots=True)
class MigInstance:
    """One MIG GPU instance on a MIG-enabled GPU, once however many compute instances it has.

    Memory and SM activity belong to the GPU instance, so series keyed by `gpu_instance_id`
    get one sample each; `compute_instance_id` and `uuid` name its lowest compute instance,
    `compute_instances` all of them where the backend sees them (each is a MIG device with
    its own UUID, which device plugins hand out).
    """

    gpu_instance_id: int
    compute_instance_id: int
    profile: str  # GPU instance profile, e.g. "1g.10gb"
    uuid: str = ""  # "MIG-..." where known
    memory_total_bytes: float | None = None
    memory_used_bytes: float | None = None
    sm_active_ratio: float | None = None  # GPM on Hopper+, DCGM DCP elsewhere
    # Time the instance's graphics/compute engine was busy (DCGM GR_ENGINE_ACTIVE, in
    # dcgm-exporter's default counters; NVML GPM GRAPHICS_UTIL): the MIG instance's utilization.
    graphics_engine_active_ratio: float | None = None
    tensor_active_ratio: float | None = None
    dram_active_ratio: float | None = None
    compute_instances: dict[int, str] = field(default_factory=dict)  # CI id -> MIG device UUID

    @property
    def activity_ratio(self) -> float | None:
        """How busy the instance was: engine activity where known, else SM activity (the two
        a MIG instance has in place of the GPU's utilization)."""
        if self.graphics_engine_active_ratio is not None:
            return self.graphics_engine_active_ratio
        return self.sm_active_ratio


@dataclass(slots=True)
class GpuProcess:
    """A process holding memory on a GPU, attributed to a pod or a Slurm job where possible."""

    pid: int
    name: str = ""
    memory_used_bytes: float | None = None
    sm_utilization_ratio: float | None = None  # per-process share on time-sliced GPUs
    gpu_instance_id: int | None = None  # MIG instance it runs in
    pod: str = ""
    namespace: str = ""
    container: str = ""
    slurm_job: str = ""


@dataclass(slots=True)
class Allocation:
    """Who holds a GPU (or one MIG instance of it), whether or not a process runs on it."""

    gpu: int
    pod: str = ""
    namespace: str = ""
    container: str = ""
    job: str = ""  # Slurm job id, or a workload/job name above the pod
    tenant: str = ""  # quota owner; namespace when nothing better is known
    gpu_instance_id: int | None = None
    priority: int | None = None
    # Share of the GPU this holder is guaranteed, in milli-GPU (1000 = whole), where the source
    # knows it (fractional sharing, e.g. a 0.25 GPU request); None = unknown: consumers then
    # split a time-sliced GPU equally among its holders or use the MIG slice.
    gpu_milli: int | None = None


@dataclass(slots=True)
class TopologyLink:
    """How GPU `gpu` reaches GPU `peer` on the same node (stored once per ordered pair)."""

    gpu: int
    peer: int
    link_type: str  # one of LINK_TYPES
    nvlink_count: int = 0


def nvlink_islands(gpu_indices: Iterable[int], links: Iterable[TopologyLink]) -> dict[int, int]:
    """Map each GPU index to the id of its NVLink-connected group (id = smallest member index).

    A GPU with no NVLink is an island of one. Islands are connected components, so a
    GPU reached only through another GPU's NVLink still belongs to the same island.
    """
    parent = {index: index for index in gpu_indices}

    def find(index: int) -> int:
        while parent[index] != index:
            parent[index] = parent[parent[index]]
            index = parent[index]
        return index

    for link in links:
        if link.link_type != "nvlink" or link.gpu not in parent or link.peer not in parent:
            continue
        root_a, root_b = find(link.gpu), find(link.peer)
        if root_a != root_b:
            parent[max(root_a, root_b)] = min(root_a, root_b)
    return {index: find(index) for index in parent}


def largest_connected_subset(members: Iterable[int], islands: dict[int, int]) -> int:
    """Size of the largest subset of `members` that lies inside one NVLink island."""
    counts: dict[int, int] = {}
    for index in members:
        island = islands.get(index, index)
        counts[island] = counts.get(island, 0) + 1
    return max(counts.values(), default=0)


@dataclass(slots=True)
class GpuReading:
    """One GPU at one collection. Values are in base units: bytes, watts, joules, hertz, ratios."""

    index: int
    uuid: str = ""
    model: str = ""
    pci_bus_id: str = ""
    serial: str = ""
    vbios_version: str = ""

    lost: bool = False  # fell off the bus / NVML says GPU is lost: nothing else is trusted
    healthy: bool = True

    utilization_ratio: float | None = None
    memory_utilization_ratio: float | None = None
    graphics_engine_active_ratio: float | None = None  # DCGM GR_ENGINE_ACTIVE, GPM GRAPHICS_UTIL
    sm_active_ratio: float | None = None
    sm_occupancy_ratio: float | None = None
    tensor_active_ratio: float | None = None
    dram_active_ratio: float | None = None
    encoder_utilization_ratio: float | None = None
    decoder_utilization_ratio: float | None = None

    memory_total_bytes: float | None = None
    memory_used_bytes: float | None = None
    memory_free_bytes: float | None = None
    memory_reserved_bytes: float | None = None

    temperature_celsius: float | None = None
    memory_temperature_celsius: float | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    power_limit_max_watts: float | None = None  # the most the limit may be set to
    power_limit_default_watts: float | None = None  # the limit the board ships with
    energy_joules: float | None = None  # counter since driver load
    fan_speed_ratio: float | None = None  # share of the fan's maximum; none on passive boards
    performance_state: int | None = None  # P-state 0 (most performance) to 15
    compute_mode: str = ""  # COMPUTE_MODES value; "" unknown

    sm_clock_hertz: float | None = None
    memory_clock_hertz: float | None = None
    graphics_clock_hertz: float | None = None
    video_clock_hertz: float | None = None

    clock_event_active: dict[str, bool] = field(default_factory=dict)  # reason -> set now
    clock_event_seconds: dict[str, float] = field(default_factory=dict)  # reason -> counter

    pcie_tx_bytes_per_second: float | None = None
    pcie_rx_bytes_per_second: float | None = None
    pcie_replay_errors: float | None = None  # counter
    nvlink_bytes_per_second: float | None = None  # data sent plus received over every NVLink

    ecc_errors: dict[str, float] = field(default_factory=dict)  # corrected/uncorrected -> counter
    retired_pages: dict[str, float] = field(default_factory=dict)  # single_bit/double_bit
    retired_pages_pending: bool | None = None
    remapped_rows: dict[str, float] = field(default_factory=dict)  # correctable/uncorrectable
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None

    xid_errors: dict[int, float] = field(default_factory=dict)  # xid code -> count (counter)
    xid_last_timestamp_seconds: float | None = None
    xid_last_code: int | None = None  # the last XID seen (0: none), DCGM's XID_ERRORS field

    # What the driver says to do to make the GPU usable again (NVML's GPU recovery action:
    # 0 none, 1 GPU reset, 2 node reboot, 3 drain peer-to-peer traffic, 4 drain and reset)
    recovery_action: int | None = None
    # NVSwitch fabric registration (NVML's GPU fabric info): 1 not started, 2 in progress,
    # 3 completed; None where the GPU is on no fabric. `fabric_error`: completed with an error.
    fabric_state: int | None = None
    fabric_error: bool | None = None
    vgpu_licensed: bool | None = None  # a vGPU guest's license; None where it does not apply

    mig_enabled: bool | None = None
    mig_instances: list[MigInstance] = field(default_factory=list)

    numa_node: int | None = None
    cpu_affinity: str = ""  # e.g. "0-31,64-95"
    nvlink_island: int | None = None  # id of the NVLink-connected group this GPU belongs to

    processes: list[GpuProcess] = field(default_factory=list)


@dataclass(slots=True)
class NodeReading:
    """One node at one collection: its GPUs, how they connect, and who holds them."""

    node: str
    driver_version: str = ""
    cuda_version: str = ""
    gpus: list[GpuReading] = field(default_factory=list)
    links: list[TopologyLink] = field(default_factory=list)
    allocations: list[Allocation] = field(default_factory=list)
    # Labels that describe the node for the advisor (pool, rack, gpu model); sim and DCGM fill them.
    pool: str = ""
    rack: str = ""


@dataclass(frozen=True, slots=True)
class SimClock:
    """Where a simulated fleet stands (sim backend only): enough for a reader to re-simulate the
    same fleet's past, since a `SimFleet` depends only on preset, seed, node count and time."""

    preset: str
    seed: int
    nodes: int | None  # the node-count override, None for the preset's own
    time_s: float  # simulated seconds since the fleet's t = 0
    epoch: float  # Unix time stamped on simulated t = 0; a simulated second is stamped as one


@dataclass(slots=True)
class Collection:
    """The result of one backend cycle. `errors` counts failed calls by name for self-metrics."""

    nodes: list[NodeReading]
    timestamp: float
    errors: Counter[str] = field(default_factory=Counter)
    sim: SimClock | None = None
    # lines of scraped pages left out as unparseable this cycle, by target (dcgm-exporter)
    skipped_lines: Counter[str] = field(default_factory=Counter)
