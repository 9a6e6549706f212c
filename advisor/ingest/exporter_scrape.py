"""Scrape exporters' `/metrics` pages (ours or NVIDIA dcgm-exporter's) into the cluster model.

The advisor's embedded default: no Prometheus, it reads the exporters itself. Our series are
read by their names in `exporter.contract` (a rename there is a rename here); dcgm-exporter
pages go through the dcgm-exporter backend's own grouping, whose pod labels give allocations.
The same sample-to-readings functions serve Prometheus query results (`ingest.prometheus`).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import requests

from advisor.model import ClusterModel, from_readings
from exporter.backends import dcgm_exporter as dx
from exporter.backends.base import BackendUnavailable
from exporter.contract import spec
from exporter.readings import (
    Allocation,
    GpuProcess,
    GpuReading,
    MigInstance,
    NodeReading,
    SimClock,
    TopologyLink,
)

Sample = tuple[str, dict[str, str], float]
MAX_PARALLEL = 32  # concurrent scrapes
SIM_CLOCK = ("gpu_sim_time_seconds", "gpu_sim_epoch_timestamp_seconds")


class SourceUnavailable(Exception):
    """A source cannot be read; the message is one line naming it and the reason."""


def _n(name: str) -> str:
    return spec(name).name  # KeyError at import if the contract loses a name we read


GPU_INFO = _n("gpu_info")
NODE_INFO = _n("gpu_node_info")
MIG_INFO = _n("gpu_mig_instance_info")
MIG_MEMORY_TOTAL = _n("gpu_mig_memory_total_bytes")
MIG_MEMORY_USED = _n("gpu_mig_memory_used_bytes")
LINK_INFO = _n("gpu_topology_link_info")
NVLINKS = _n("gpu_nvlink_links")
ISLAND = _n("gpu_nvlink_island")
ALLOCATION_INFO = _n("gpu_allocation_info")
PROCESS_MEMORY = _n("gpu_process_memory_used_bytes")
UTILIZATION = _n("gpu_utilization_ratio")
MEMORY_USED = _n("gpu_memory_used_bytes")
# contract name -> GpuReading attribute, for plain per-GPU numbers
GPU_NUMBERS: dict[str, str] = {
    _n("gpu_utilization_ratio"): "utilization_ratio",
    _n("gpu_memory_utilization_ratio"): "memory_utilization_ratio",
    _n("gpu_sm_active_ratio"): "sm_active_ratio",
    _n("gpu_memory_total_bytes"): "memory_total_bytes",
    _n("gpu_memory_used_bytes"): "memory_used_bytes",
    _n("gpu_memory_free_bytes"): "memory_free_bytes",
    _n("gpu_memory_reserved_bytes"): "memory_reserved_bytes",
    _n("gpu_power_watts"): "power_watts",
}
GPU_FLAGS: dict[str, str] = {
    _n("gpu_lost"): "lost",
    _n("gpu_healthy"): "healthy",
    _n("gpu_mig_mode_enabled"): "mig_enabled",
}
# Every name `our_readings` reads: the Prometheus ingest asks for exactly these.
OUR_NAMES: tuple[str, ...] = (
    GPU_INFO,
    NODE_INFO,
    MIG_INFO,
    MIG_MEMORY_TOTAL,
    MIG_MEMORY_USED,
    LINK_INFO,
    NVLINKS,
    ISLAND,
    ALLOCATION_INFO,
    PROCESS_MEMORY,
    *GPU_NUMBERS,
    *GPU_FLAGS,
)


def _int(text: str) -> int | None:
    """A label that holds an index or id (GPU, instance, peer, pid): a whole number >= 0."""
    return int(text) if text.isdigit() else None


def _signed(text: str) -> int | None:
    """A label that holds a priority: a whole number, possibly negative; "" is unknown."""
    return int(text) if text.lstrip("-").isdigit() else None


def our_readings(samples: Iterable[Sample]) -> list[NodeReading]:
    """NodeReadings from samples named as in our contract; series without node/gpu are skipped."""
    nodes: dict[str, NodeReading] = {}
    gpus: dict[tuple[str, int], GpuReading] = {}
    nvlink_counts: dict[tuple[str, int, int], int] = {}

    def node_of(name: str) -> NodeReading:
        return nodes.get(name) or nodes.setdefault(name, NodeReading(name))

    def gpu_of(labels: Mapping[str, str]) -> GpuReading | None:
        node, index = labels.get("node", ""), _int(labels.get("gpu", ""))
        if not node or index is None:
            return None
        key = (node, index)
        if key not in gpus:
            gpus[key] = GpuReading(index)
            node_of(node).gpus.append(gpus[key])
        return gpus[key]

    for name, labels, value in samples:
        if name == NODE_INFO:
            if labels.get("node"):
                reading = node_of(labels["node"])
                reading.pool, reading.rack = labels.get("pool", ""), labels.get("rack", "")
            continue
        gpu = gpu_of(labels)
        if gpu is None or not math.isfinite(value):  # NaN or ±Inf: no reading
            continue
        node = node_of(labels["node"])
        if name in GPU_NUMBERS:
            setattr(gpu, GPU_NUMBERS[name], value)
        elif name in GPU_FLAGS:
            setattr(gpu, GPU_FLAGS[name], value != 0)
        elif name == ISLAND:
            gpu.nvlink_island = int(value)
        elif name == GPU_INFO:
            gpu.uuid, gpu.model = labels.get("uuid", ""), labels.get("model", "")
            node.driver_version = labels.get("driver_version", node.driver_version)
            node.cuda_version = labels.get("cuda_version", node.cuda_version)
        elif name == ALLOCATION_INFO:
            node.allocations.append(
                Allocation(
                    gpu.index,
                    pod=labels.get("pod", ""),
                    namespace=labels.get("namespace", ""),
                    container=labels.get("container", ""),
                    job=labels.get("workload", ""),
                    tenant=labels.get("tenant", ""),
                    gpu_instance_id=_int(labels.get("gpu_instance_id", "")),
                    priority=_signed(labels.get("priority", "")),
                    gpu_milli=_int(labels.get("gpu_milli", "")),
                )
            )
        elif name in (MIG_INFO, MIG_MEMORY_TOTAL, MIG_MEMORY_USED):
            gi = _int(labels.get("gpu_instance_id", ""))
            if gi is None:
                continue
            mig = next((m for m in gpu.mig_instances if m.gpu_instance_id == gi), None)
            if mig is None:
                mig = MigInstance(gi, 0, "")
                gpu.mig_instances.append(mig)
            if name == MIG_INFO:
                mig.compute_instance_id = _int(labels.get("compute_instance_id", "")) or 0
                mig.profile, mig.uuid = labels.get("profile", ""), labels.get("mig_uuid", "")
            elif name == MIG_MEMORY_TOTAL:
                mig.memory_total_bytes = value
            else:
                mig.memory_used_bytes = value
        elif name == LINK_INFO:
            peer = _int(labels.get("peer_gpu", ""))
            if peer is not None:
                node.links.append(TopologyLink(gpu.index, peer, labels.get("link_type", "")))
        elif name == NVLINKS:
            peer = _int(labels.get("peer_gpu", ""))
            if peer is not None:
                nvlink_counts[(node.node, gpu.index, peer)] = int(value)
        elif name == PROCESS_MEMORY:
            pid = _int(labels.get("pid", ""))
            if pid is not None:
                gpu.processes.append(
                    GpuProcess(pid, name=labels.get("process_name", ""), memory_used_bytes=value)
                )
    for node in nodes.values():
        for link in node.links:
            link.nvlink_count = nvlink_counts.get((node.node, link.gpu, link.peer), 0)
    return list(nodes.values())


def is_dcgm(samples: Sequence[Sample]) -> bool:
    """A dcgm-exporter page: DCGM field names and none of ours (our exporter may add DCGM
    names with `--compat.dcgm-names`; its own series are richer, so they win)."""
    if any(name == GPU_INFO for name, _, _ in samples):
        return False
    return any(dx.canonical_name(name).startswith("DCGM_") for name, _, _ in samples)


def dcgm_readings(samples_by_target: Mapping[str, Sequence[Sample]]) -> list[NodeReading]:
    """dcgm-exporter samples per target host -> readings, via the dcgm-exporter backend's own
    grouping (its `Hostname` label names the node, else the target host)."""
    nodes: dict[str, dx._Node] = {}
    for host, samples in samples_by_target.items():
        canonical = [(dx.canonical_name(name), labels, value) for name, labels, value in samples]
        dx._group(canonical, host, nodes)
    backend = dx.DcgmExporterBackend(list(samples_by_target) or ["dcgm-exporter"])
    now = time.time()
    return [backend._reading(node, now) for node in nodes.values()]


def fetch(url: str, timeout: float, session: requests.Session | None = None) -> str:
    """The page text; SourceUnavailable (one line naming the URL) on any HTTP failure."""
    try:
        return dx.fetch_page(url, timeout, session)
    except BackendUnavailable as error:
        raise SourceUnavailable(str(error)) from None


def parse(text: str, url: str) -> list[Sample]:
    """Samples of any exposition page (ours or dcgm-exporter's), names as written."""
    try:
        return dx.parse_samples(text, url)
    except BackendUnavailable as error:
        raise SourceUnavailable(str(error)) from None


def sim_clock(samples: Sequence[Sample]) -> SimClock | None:
    """The clock a sim exporter's page carries (`gpu_sim_*`); None for any other page."""
    info = [labels for name, labels, _ in samples if name == "gpu_sim_info"]
    values = {name: value for name, _, value in samples if name in SIM_CLOCK}
    if not info or len(values) < len(SIM_CLOCK):
        return None
    labels = info[0]
    nodes = labels.get("nodes", "")
    try:
        seed = int(labels.get("seed", ""))
        count = int(nodes) if nodes else None
    except ValueError:
        return None  # not a page of ours
    return SimClock(
        labels.get("preset", ""),
        seed,
        count,
        values["gpu_sim_time_seconds"],
        values["gpu_sim_epoch_timestamp_seconds"],
    )


def scrape(urls: Sequence[str], *, timeout: float = 5.0, source: str = "") -> ClusterModel:
    """One model from every page; each page may be ours or dcgm-exporter's. Any unreachable
    URL fails the whole read: an analysis of a partial fleet would mislead.

    The model is stamped with the time of reading, except when every page is a sim exporter's:
    then with the simulated clock (`SimClock.epoch + time_s`), so a fleet simulated faster than
    real time builds a history in simulated hours, continuous with its re-simulated past."""
    ours: list[Sample] = []
    dcgm: dict[str, list[Sample]] = defaultdict(list)
    # Pages are fetched in parallel (one exporter per node: a fleet is many URLs), then read
    # in the order given so the model does not depend on which answered first.
    with ThreadPoolExecutor(max_workers=max(1, min(MAX_PARALLEL, len(urls)))) as pool:
        pages = list(pool.map(lambda url: parse(fetch(url, timeout), url), urls))
    for url, samples in zip(urls, pages, strict=True):
        if is_dcgm(samples):
            dcgm[urlsplit(url).hostname or url].extend(samples)
        else:
            ours.extend(samples)
    readings = our_readings(ours) + (dcgm_readings(dcgm) if dcgm else [])
    clocks = [sim_clock(samples) for samples in pages]
    stamp = (
        max(c.epoch + c.time_s for c in clocks if c is not None)
        if all(c is not None for c in clocks)
        else time.time()
    )
    return from_readings(readings, timestamp=stamp, source=source or ",".join(urls))
