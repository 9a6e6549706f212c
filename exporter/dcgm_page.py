"""How a dcgm-exporter page reads as our readings: the exporter's dcgm-exporter backend and the
advisor's ingest (pages and Prometheus results) both read it here.

DCGM field names in both namespaces (`-o` 1.x names mapped), the label spellings
(`hostname`/`Hostname`, `pod`/`pod_name`, `modelName`/`model_name`/`DCGM_FI_DEV_NAME`), the
node a page without a `Hostname` label describes (its target host), pod allocations, MIG
instances (a flex-mode GPU's memory is what its instances hold) and the computed XID, clock
event and health series. Units and blanks are DCGM's field semantics
(`exporter.backends.dcgm_common`); text parsing and fetching are `gpu_defrag_common`'s.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from exporter.backends.dcgm_common import (
    XID_FIELD,
    XidTracker,
    apply_fields,
    is_blank,
    mig_values,
)
from exporter.contract import DCGM_MIG_FIELDS
from exporter.readings import Allocation, GpuReading, MigInstance, NodeReading
from gpu_defrag_common.page_fetch import parse_samples
from gpu_defrag_common.page_parse import Sample, Skipped

# `-o/--use-old-namespace` (1.x) names -> today's DCGM names (etc/1.x-compatibility-metrics.csv).
OLD_NAMES: dict[str, str] = {
    "dcgm_sm_clock": "DCGM_FI_DEV_SM_CLOCK",
    "dcgm_memory_clock": "DCGM_FI_DEV_MEM_CLOCK",
    "dcgm_memory_temp": "DCGM_FI_DEV_MEMORY_TEMP",
    "dcgm_gpu_temp": "DCGM_FI_DEV_GPU_TEMP",
    "dcgm_power_usage": "DCGM_FI_DEV_POWER_USAGE",
    "dcgm_total_energy_consumption": "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "dcgm_pcie_replay_counter": "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "dcgm_gpu_utilization": "DCGM_FI_DEV_GPU_UTIL",
    "dcgm_mem_copy_utilization": "DCGM_FI_DEV_MEM_COPY_UTIL",
    "dcgm_enc_utilization": "DCGM_FI_DEV_ENC_UTIL",
    "dcgm_dec_utilization": "DCGM_FI_DEV_DEC_UTIL",
    "dcgm_xid_errors": "DCGM_FI_DEV_XID_ERRORS",
    "dcgm_power_violation": "DCGM_FI_DEV_POWER_VIOLATION",
    "dcgm_thermal_violation": "DCGM_FI_DEV_THERMAL_VIOLATION",
    "dcgm_sync_boost_violation": "DCGM_FI_DEV_SYNC_BOOST_VIOLATION",
    "dcgm_low_util_violation": "DCGM_FI_DEV_LOW_UTIL_VIOLATION",
    "dcgm_board_limit_violation": "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION",
    "dcgm_reliability_violation": "DCGM_FI_DEV_RELIABILITY_VIOLATION",
    "dcgm_fb_free": "DCGM_FI_DEV_FB_FREE",
    "dcgm_fb_used": "DCGM_FI_DEV_FB_USED",
    "dcgm_ecc_sbe_volatile_total": "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "dcgm_ecc_dbe_volatile_total": "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "dcgm_ecc_sbe_aggregate_total": "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
    "dcgm_ecc_dbe_aggregate_total": "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
    "dcgm_retired_pages_sbe": "DCGM_FI_DEV_RETIRED_SBE",
    "dcgm_retired_pages_dbe": "DCGM_FI_DEV_RETIRED_DBE",
    "dcgm_retired_pages_pending": "DCGM_FI_DEV_RETIRED_PENDING",
}
# dcgm-exporter computed series (ids 9000+), not DCGM fields.
XID_TOTAL = "DCGM_EXP_XID_ERRORS_TOTAL"
XID_COUNT = "DCGM_EXP_XID_ERRORS_COUNT"
CLOCK_EVENTS_COUNT = "DCGM_EXP_CLOCK_EVENTS_COUNT"
HEALTH_STATUS = "DCGM_EXP_GPU_HEALTH_STATUS"
HEALTH_RESULT_FAIL = 20  # DCGM_HEALTH_RESULT_PASS=0, _WARN=10, _FAIL=20
# `clock_event` label values of DCGM_EXP_CLOCK_EVENTS_COUNT -> our canonical reason names.
CLOCK_EVENT_LABELS: dict[str, str] = {
    "gpu_idle": "gpu_idle",
    "clocks_setting": "applications_clocks_setting",
    "power_cap": "sw_power_cap",
    "hw_slowdown": "hw_slowdown",
    "sync_boost": "sync_boost",
    "sw_thermal": "sw_thermal_slowdown",
    "hw_thermal": "hw_thermal_slowdown",
    "hw_power_brake": "hw_power_brake_slowdown",
    "display_clocks": "display_clock_setting",
}


def label(labels: dict[str, str], *names: str) -> str:
    """First non-blank value among label spellings (`hostname`/`Hostname`, `pod`/`pod_name`)."""
    for name in names:
        value = labels.get(name, "")
        if value and not is_blank(value):
            return value
    return ""


def canonical_name(sample_name: str) -> str:
    """The DCGM field name of a sample: old `-o` names mapped, parser-added `_total` removed."""
    if sample_name in OLD_NAMES:
        return OLD_NAMES[sample_name]
    name = sample_name
    if name.endswith("_total"):  # prometheus_client appends `_total` to counter samples
        name = name[: -len("_total")]
        if name in OLD_NAMES:
            return OLD_NAMES[name]
    if name.startswith("dcgm_fi_prof_"):  # old namespace kept DCP names, lower-cased
        return name.upper()
    return name


def parse_exposition(text: str, url: str) -> tuple[list[Sample], Skipped | None]:
    """(DCGM field name, labels, value) of every sample of a dcgm-exporter page, and the lines
    left out (`parse_samples`; PageUnavailable naming the URL for a page that cannot be read)."""
    samples, skipped = parse_samples(
        text, url, empty_hint="dcgm-exporter reloading?", none_hint="is it dcgm-exporter?"
    )
    return [(canonical_name(name), labels, value) for name, labels, value in samples], skipped


@dataclass
class PageGpu:
    """Everything one scrape said about one GPU, before it becomes a GpuReading."""

    index: int
    labels: dict[str, str] = field(default_factory=dict)
    own: dict[str, float] = field(default_factory=dict)  # GPU-level series
    inherited: dict[str, float] = field(default_factory=dict)  # repeated on MIG instance series
    mig: dict[int, tuple[str, dict[str, float]]] = field(default_factory=dict)
    xid_totals: dict[int, float] = field(default_factory=dict)
    xid_counts: dict[int, float] = field(default_factory=dict)
    clock_events: dict[str, bool] = field(default_factory=dict)
    health_failed: bool = False


@dataclass
class PageNode:
    """One node's GPUs and pod allocations, gathered from one or more targets' series."""

    name: str
    driver_version: str = ""
    gpus: dict[int, PageGpu] = field(default_factory=dict)
    allocations: dict[tuple, Allocation] = field(default_factory=dict)


class PageReader:
    """Grouped dcgm-exporter series -> readings. Keeps each GPU's XID counts between reads (the
    exporter's backend reads with one reader for its life; a one-shot read with a new one)."""

    def __init__(self) -> None:
        self._xids = XidTracker()

    def read(
        self, samples_by_host: Mapping[str, Sequence[Sample]], now: float | None = None
    ) -> list[NodeReading]:
        """Readings of dcgm-exporter samples (names as written) per target host: a node is its
        `Hostname` label, else the target host."""
        nodes: dict[str, PageNode] = {}
        for host, samples in samples_by_host.items():
            group([(canonical_name(n), labels, value) for n, labels, value in samples], host, nodes)
        stamp = time.time() if now is None else now
        return [self.node_reading(node, stamp) for node in nodes.values()]

    def node_reading(self, node: PageNode, now: float) -> NodeReading:
        """A grouped node as a reading, its GPUs by index."""
        reading = NodeReading(
            node=node.name,
            driver_version=node.driver_version,
            allocations=list(node.allocations.values()),
        )
        for index in sorted(node.gpus):
            reading.gpus.append(self.gpu_reading(node.name, node.gpus[index], now))
        return reading

    def gpu_reading(self, node: str, raw: PageGpu, now: float) -> GpuReading:
        """One GPU's series as a reading: identity from its labels, fields in base units, MIG
        instances, XIDs counted against what this reader saw of the GPU before."""
        labels = raw.labels
        gpu = GpuReading(
            index=raw.index,
            uuid=label(labels, "UUID", "uuid"),
            # modelName on GPU series, model_name on NVLink ones (and --replace-blanks-in-model-
            # name's dashes); a `DCGM_FI_DEV_NAME, label` counters row where a page has neither
            model=label(labels, "modelName", "model_name", "DCGM_FI_DEV_NAME"),
            pci_bus_id=label(labels, "pci_bus_id"),
            serial=label(labels, "DCGM_FI_DEV_SERIAL"),
            vbios_version=label(labels, "DCGM_FI_DEV_VBIOS_VERSION"),
        )
        apply_fields(gpu, {**raw.inherited, **raw.own})
        gpu.mig_enabled = bool(raw.mig)  # flex mode (-d f) shows instances iff MIG is on
        for gi_id in sorted(raw.mig):
            profile, values = raw.mig[gi_id]
            gpu.mig_instances.append(_mig_instance(gi_id, profile, values))
        if raw.mig and not any(name.startswith("DCGM_FI_DEV_FB_") for name in raw.own):
            _sum_instance_memory(gpu)
        gpu.clock_event_active.update(raw.clock_events)
        if raw.health_failed:
            gpu.healthy = False
        key = (node, gpu.uuid or raw.index)
        if raw.xid_totals:
            self._xids.observe_counts(key, raw.xid_totals, now, cumulative=True)
        elif raw.xid_counts:
            self._xids.observe_counts(key, raw.xid_counts, now, cumulative=False)
        else:
            self._xids.observe_last_code(
                key, raw.own.get(XID_FIELD, raw.inherited.get(XID_FIELD)), now
            )
        self._xids.apply(key, gpu)
        return gpu


def _mig_instance(gi_id: int, profile: str, values: dict[str, float]) -> MigInstance:
    """A MIG instance from its own FB and DCP series (MiB -> bytes; ratios stay ratios): its
    engine activity (GR_ENGINE_ACTIVE, a default counter) is its utilization."""
    return MigInstance(
        gpu_instance_id=gi_id,
        compute_instance_id=0,  # dcgm-exporter labels GPU instances only
        profile=profile,
        **mig_values(values),
    )


def _sum_instance_memory(gpu: GpuReading) -> None:
    """A MIG GPU in flex mode has no GPU-level FB series; its memory is what its instances hold.

    Memory outside every instance cannot be used until the GPU is re-partitioned, so the sum
    over instances is the capacity a scheduler can actually place work into.
    """
    used = [m.memory_used_bytes for m in gpu.mig_instances]
    total = [m.memory_total_bytes for m in gpu.mig_instances]
    if used and None not in used:
        gpu.memory_used_bytes = sum(used)
    if total and None not in total:
        gpu.memory_total_bytes = sum(total)
        if gpu.memory_used_bytes is not None:
            gpu.memory_free_bytes = gpu.memory_total_bytes - gpu.memory_used_bytes


def group(
    samples: list[tuple[str, dict[str, str], float]], default_node: str, nodes: dict[str, PageNode]
) -> int:
    """Sort one target's samples into nodes and GPUs; series without a `gpu` label are skipped.

    Returns how many samples described a GPU, so a page from the wrong exporter is noticed.
    """
    used = 0
    for name, labels, value in samples:
        index_text = labels.get("gpu", "")
        if not index_text.isdigit() or "nvlink" in labels or "nvswitch" in labels:
            continue  # NVLink, NvSwitch, CPU and P2P series describe other entities
        node_name = label(labels, "hostname", "Hostname") or default_node
        node = nodes.get(node_name) or nodes.setdefault(node_name, PageNode(node_name))
        node.driver_version = node.driver_version or label(labels, "DCGM_FI_DRIVER_VERSION")
        index = int(index_text)
        gpu = node.gpus.get(index) or node.gpus.setdefault(index, PageGpu(index))
        for key, label_value in labels.items():
            if label_value and not is_blank(label_value):
                gpu.labels.setdefault(key, label_value)
        gi_text = labels.get("GPU_I_ID", "")
        gi_id = int(gi_text) if gi_text.isdigit() else None
        _allocate(node, index, gi_id, labels)
        _record(gpu, gi_id, labels, name, value)
        used += 1
    return used


def _allocate(node: PageNode, index: int, gi_id: int | None, labels: dict[str, str]) -> None:
    """Pod labels on a series mean the kubelet assigned this GPU (or MIG instance) to the pod."""
    pod = label(labels, "pod", "pod_name")
    if not pod:
        return
    namespace = label(labels, "namespace", "pod_namespace")
    container = label(labels, "container", "container_name")
    key = (index, gi_id, namespace, pod, container)
    if key not in node.allocations:
        node.allocations[key] = Allocation(
            gpu=index,
            pod=pod,
            namespace=namespace,
            container=container,
            tenant=namespace,
            gpu_instance_id=gi_id,
        )


def _record(
    gpu: PageGpu, gi_id: int | None, labels: dict[str, str], name: str, value: float
) -> None:
    """File one sample under the GPU, its MIG instance, or the exporter-computed maps."""
    if name in (XID_TOTAL, XID_COUNT):
        code = labels.get("xid", "")
        if code.isdigit() and not is_blank(value):  # COUNT has a 0-valued series without `xid`
            # max, not sum: MIG instances and shared-GPU (vgpu) pods repeat the GPU's series
            target = gpu.xid_totals if name == XID_TOTAL else gpu.xid_counts
            target[int(code)] = max(target.get(int(code), 0.0), value)
        elif name == XID_COUNT:
            gpu.xid_counts.setdefault(0, 0.0)
        return
    if name == CLOCK_EVENTS_COUNT:
        reason = CLOCK_EVENT_LABELS.get(labels.get("clock_event", ""))
        if reason and not is_blank(value):
            gpu.clock_events[reason] = gpu.clock_events.get(reason, False) or value > 0
        return
    if name == HEALTH_STATUS:
        if not is_blank(value) and value >= HEALTH_RESULT_FAIL:
            gpu.health_failed = True
        return
    if gi_id is None:
        gpu.own[name] = value
        return
    profile = label(labels, "GPU_I_PROFILE")
    _, values = gpu.mig.setdefault(gi_id, (profile, {}))
    if name in DCGM_MIG_FIELDS:
        values[name] = value
    else:
        gpu.inherited.setdefault(name, value)
