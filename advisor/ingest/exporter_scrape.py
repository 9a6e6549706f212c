"""Scrape exporters' `/metrics` pages (ours or NVIDIA dcgm-exporter's) into the cluster model.

The advisor's embedded default: no Prometheus, it reads the exporters itself. Our series are
read by their names in `exporter.contract` (a rename there is a rename here); dcgm-exporter
pages go through the exporter's dcgm-exporter page reader (`exporter.dcgm_page`, which its
dcgm-exporter backend reads with too), whose pod labels give allocations.
The same sample-to-readings functions serve Prometheus query results (`ingest.prometheus`).

Values no GPU can report are read as unknown, one rule for every command that reads pages
(analyze, snapshot, plan, the service) and for Prometheus results: a NaN is "no value" as
before; an infinity, a ratio outside 0-1, a negative or larger than 2^53 byte count or power
(`snapshot.MAX_EXACT`), an NVLink island, GPU index or priority that is not a whole number an
int32 holds, a `gpu_milli` label outside 0-1000 are dropped (that one value, or a GPU whose
index is impossible) and counted in one warning per read naming the first few. One bad series
does not fail the read of a fleet (the exporter's own rule: keep serving what it can), and
`gpu-defrag snapshot` of a page writes exactly what `analyze` of it measured, which the
snapshot loader then accepts. Info series (`*_info`, value always 1) are read by their labels
whatever their value: a GPU's identity or allocation is not lost to a corrupt sample.

Some values are impossible only together (`MEMORY_PARTS`): memory in use, free or reserved
larger than the GPU's total, a MIG instance's memory larger than its GPU's, its memory in use
larger than its own total. The part is read as unknown, the total kept (a static size of the
board, the same at every read, where the part is the moving value an exporter computes), in the
same warning, which names the GPU and both values.

A series (name and label set) given twice on one page is invalid exposition (Prometheus refuses
such a scrape's clashing samples): copies with different values read the series as unknown, not
as either value, with one warning per page naming the URL and the first few series; identical
copies are one sample, and so are an info series' copies whatever their values.

Several URLs are read as one fleet (`scrape`, `merge`): a URL listed twice is read once; a GPU
(node and index) that two URLs report, two exporters on one node (ours and dcgm-exporter both
scraped) or one exporter under two names, is read whole from the first URL listed that reports
it, with one warning per read naming both URLs and the first few such GPUs. Not a mix of the
two: they read at different instants, so their values differ without either being wrong, and
reading every such value as unknown would lose the GPU to a configuration slip; the order of the
URLs is the user's say in which exporter to believe.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import numpy as np
import requests

from advisor.ingest.readings import from_readings
from advisor.model import MILLI, ClusterModel
from advisor.snapshot import INT32_MAX, INT32_MIN, MAX_EXACT
from exporter.contract import spec
from exporter.dcgm_page import PageReader, canonical_name
from exporter.readings import (
    Allocation,
    GpuProcess,
    GpuReading,
    MigInstance,
    NodeReading,
    SimClock,
    TopologyLink,
)
from gpu_defrag_common.exposition import escape_label
from gpu_defrag_common.page_fetch import PageUnavailable, fetch_page, parse_samples

log = logging.getLogger(__name__)

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
# a MIG instance's activity -> MigInstance attribute (a busy instance no allocation names is in
# use with its owner unknown, `advisor.model`)
MIG_ACTIVITY: dict[str, str] = {
    _n("gpu_mig_graphics_engine_active_ratio"): "graphics_engine_active_ratio",
    _n("gpu_mig_sm_active_ratio"): "sm_active_ratio",
}
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
    _n("gpu_graphics_engine_active_ratio"): "graphics_engine_active_ratio",
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
# GpuReading attribute -> the values a GPU can report; anything else is read as unknown.
_RATIO = (0.0, 1.0)
_AMOUNT = (0.0, float(MAX_EXACT))
POSSIBLE: dict[str, tuple[float, float]] = {
    "utilization_ratio": _RATIO,
    "memory_utilization_ratio": _RATIO,
    "graphics_engine_active_ratio": _RATIO,
    "sm_active_ratio": _RATIO,
    "memory_total_bytes": _AMOUNT,
    "memory_used_bytes": _AMOUNT,
    "memory_free_bytes": _AMOUNT,
    "memory_reserved_bytes": _AMOUNT,
    "power_watts": _AMOUNT,
}
# GpuReading memory attributes that are parts of the framebuffer: none can exceed its total
# (NVML: total = used + free + reserved, or used including reserved on older drivers).
MEMORY_PARTS = ("memory_used_bytes", "memory_free_bytes", "memory_reserved_bytes")
INFO_SERIES = (GPU_INFO, MIG_INFO, LINK_INFO, ALLOCATION_INFO)  # value always 1: labels only
# Every name `our_readings` reads: the Prometheus ingest asks for exactly these.
OUR_NAMES: tuple[str, ...] = (
    GPU_INFO,
    NODE_INFO,
    MIG_INFO,
    MIG_MEMORY_TOTAL,
    MIG_MEMORY_USED,
    *MIG_ACTIVITY,
    LINK_INFO,
    NVLINKS,
    ISLAND,
    ALLOCATION_INFO,
    PROCESS_MEMORY,
    *GPU_NUMBERS,
    *GPU_FLAGS,
)


def impossible(attr: str, value: float | np.ndarray) -> bool | np.ndarray:
    """Whether (elementwise for an array) a value of GpuReading `attr` is one no GPU can report:
    outside `POSSIBLE[attr]`, an infinity included. NaN is "no value", never impossible. The
    one rule for a page, a Prometheus instant vector and a Prometheus history."""
    low, high = POSSIBLE[attr]
    return np.less(value, low) | np.greater(value, high)


SHOWN = 3  # the notes a warning shows; "..." says there were more


def first_few(notes: Sequence[str], count: int | None = None, sep: str = "; ") -> str:
    """The first `SHOWN` of `notes` for a warning line, with "..." when there are more (`count`:
    how many in all, where `notes` holds only the first few)."""
    more = (len(notes) if count is None else count) > SHOWN
    return sep.join(notes[:SHOWN]) + (f"{sep}..." if more else "")


def _int(text: str) -> int | None:
    """A label that holds an index or id (GPU, instance, peer, pid): a whole number >= 0."""
    return int(text) if text.isascii() and text.isdigit() else None


def _signed(text: str) -> int | None:
    """A label that holds a priority: a whole number, possibly negative; "" is unknown."""
    digits = text.removeprefix("-")
    return int(text) if digits.isascii() and digits.isdigit() else None


def _whole(value: float, low: int = 0, high: int = INT32_MAX) -> int | None:
    """A sample that holds a count or id: a whole number within low..high, else None."""
    return int(value) if float(value).is_integer() and low <= value <= high else None


def exact_bytes(value: float) -> str:
    """A byte count as a log line should show it: every digit (a MiB/bytes mix-up is a factor
    of 2^20 that `:g`'s six digits would blur); Python's shortest form beyond 2^53."""
    value = float(value)
    return str(int(value)) if value.is_integer() and abs(value) <= MAX_EXACT else repr(value)


def _above(part: float | None, whole: float | None) -> bool:
    return part is not None and whole is not None and part > whole


def _drop_beyond_total(gpu: GpuReading, where: str, notes: list[str]) -> None:
    """Read as unknown a part of the GPU's memory larger than the whole it is part of: used,
    free or reserved above the GPU's total; a MIG instance's total above the GPU's, its used
    above its own total. The whole is kept (`MEMORY_PARTS`)."""
    total = gpu.memory_total_bytes
    for attr in MEMORY_PARTS:
        value = getattr(gpu, attr)
        if _above(value, total):
            notes.append(
                f"{where} {attr}={exact_bytes(value)} > memory_total_bytes={exact_bytes(total)}"
            )
            setattr(gpu, attr, None)
    for mig in gpu.mig_instances:
        at = f"{where}/gi{mig.gpu_instance_id}"
        if _above(mig.memory_total_bytes, total):
            notes.append(
                f"{at} memory_total_bytes={exact_bytes(mig.memory_total_bytes)} > the GPU's "
                f"memory_total_bytes={exact_bytes(total)}"
            )
            mig.memory_total_bytes = None
        if _above(mig.memory_used_bytes, mig.memory_total_bytes):
            notes.append(
                f"{at} memory_used_bytes={exact_bytes(mig.memory_used_bytes)} > "
                f"memory_total_bytes={exact_bytes(mig.memory_total_bytes)}"
            )
            mig.memory_used_bytes = None


def drop_impossible(readings: list[NodeReading], already: Sequence[str] = ()) -> None:
    """Read as unknown (None) every value no GPU can report (`POSSIBLE`, an island, priority or
    `gpu_milli` out of range, a memory part above its total) and drop GPUs whose index an int32
    cannot hold; one warning names how many and the first few, with the `already` notes of the
    caller's own drops."""
    notes = list(already)
    for node in readings:
        kept = []
        for gpu in node.gpus:
            where = f"{node.node}/gpu{gpu.index}"
            if not 0 <= gpu.index <= INT32_MAX:
                notes.append(f"{node.node} GPU index {str(gpu.index)[:20]} (GPU left out)")
                continue
            kept.append(gpu)
            for attr in POSSIBLE:
                value = getattr(gpu, attr)
                if value is not None and impossible(attr, value):
                    notes.append(f"{where} {attr}={value:g}")
                    setattr(gpu, attr, None)
            _drop_beyond_total(gpu, where, notes)
            island = gpu.nvlink_island
            if island is not None and not 0 <= island <= INT32_MAX:
                notes.append(f"{where} nvlink_island={island}")
                gpu.nvlink_island = None
        node.gpus = kept
        for alloc in node.allocations:
            if alloc.priority is not None and not INT32_MIN <= alloc.priority <= INT32_MAX:
                notes.append(f"{node.node}/gpu{alloc.gpu} priority={str(alloc.priority)[:20]}")
                alloc.priority = None
            if alloc.gpu_milli is not None and not 0 <= alloc.gpu_milli <= MILLI:
                notes.append(f"{node.node}/gpu{alloc.gpu} gpu_milli={str(alloc.gpu_milli)[:20]}")
                alloc.gpu_milli = None
    if notes:
        log.warning(
            "%d impossible value(s) in the GPU series read as unknown: %s",
            len(notes),
            first_few(notes),
        )


def our_readings(samples: Iterable[Sample]) -> list[NodeReading]:
    """NodeReadings from samples named as in our contract; series without node/gpu are skipped."""
    notes: list[str] = []
    readings = our_readings_unchecked(samples, notes)
    drop_impossible(readings, notes)
    return readings


def our_readings_unchecked(samples: Iterable[Sample], notes: list[str]) -> list[NodeReading]:
    """`our_readings` before `drop_impossible`; what it leaves out is added to `notes`."""
    nodes: dict[str, NodeReading] = {}
    gpus: dict[tuple[str, int], GpuReading] = {}
    nvlink_counts: dict[tuple[str, int, int], int] = {}

    def node_of(name: str) -> NodeReading:
        return nodes.get(name) or nodes.setdefault(name, NodeReading(name))

    unread: set[tuple[str, str]] = set()  # (node, gpu label) of our series left out

    def gpu_of(name: str, labels: Mapping[str, str]) -> GpuReading | None:
        node, index = labels.get("node", ""), _int(labels.get("gpu", ""))
        if not node or index is None:
            # a node-level or self series has no gpu label; one of ours that names a GPU
            # without a node, or a GPU that is no index, is left out with a note
            if name in OUR_NAMES and "gpu" in labels and (node, labels["gpu"]) not in unread:
                unread.add((node, labels["gpu"]))
                shown = labels["gpu"][:20]
                notes.append(
                    f"{node}/gpu {shown!r} (not a GPU index: left out)"
                    if node
                    else f"GPU {shown!r} without a node label (left out)"
                )
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
        gpu = gpu_of(name, labels)
        if gpu is None:
            continue
        if name in INFO_SERIES:
            value = 1.0  # the labels are the reading, whatever the sample says
        elif math.isnan(value):  # no reading
            continue
        elif math.isinf(value) and name not in GPU_NUMBERS:  # those: drop_impossible
            notes.append(f"{labels['node']}/gpu{gpu.index} {name}={value}")
            continue
        node = node_of(labels["node"])
        if name in GPU_NUMBERS:
            setattr(gpu, GPU_NUMBERS[name], value)
        elif name in GPU_FLAGS:
            setattr(gpu, GPU_FLAGS[name], value != 0)
        elif name == ISLAND:
            gpu.nvlink_island = _whole(value)
            if gpu.nvlink_island is None:
                notes.append(f"{node.node}/gpu{gpu.index} {name}={value:g}")
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
        elif name in (MIG_INFO, MIG_MEMORY_TOTAL, MIG_MEMORY_USED) or name in MIG_ACTIVITY:
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
            elif name == MIG_MEMORY_USED:
                mig.memory_used_bytes = value
            elif 0.0 <= value <= 1.0:  # a ratio; anything else is no reading
                setattr(mig, MIG_ACTIVITY[name], value)
            else:
                notes.append(f"{labels['node']}/gpu{gpu.index}/gi{gi} {name}={value:g}")
        elif name == LINK_INFO:
            peer = _int(labels.get("peer_gpu", ""))
            if peer is not None:
                node.links.append(TopologyLink(gpu.index, peer, labels.get("link_type", "")))
        elif name == NVLINKS:
            peer, count = _int(labels.get("peer_gpu", "")), _whole(value)
            if count is None:
                notes.append(f"{node.node}/gpu{gpu.index} {name}={value:g}")
            elif peer is not None:
                nvlink_counts[(node.node, gpu.index, peer)] = count
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
    return any(canonical_name(name).startswith("DCGM_") for name, _, _ in samples)


def dcgm_readings(samples_by_target: Mapping[str, Sequence[Sample]]) -> list[NodeReading]:
    """dcgm-exporter samples per target host -> readings, by the exporter's dcgm-exporter page
    reader (its `Hostname` label names the node, else the target host)."""
    readings = dcgm_readings_unchecked(samples_by_target)
    drop_impossible(readings)
    return readings


def dcgm_readings_unchecked(samples_by_target: Mapping[str, Sequence[Sample]]) -> list[NodeReading]:
    """`dcgm_readings` before `drop_impossible`."""
    return PageReader().read(samples_by_target)


def fetch(url: str, timeout: float, session: requests.Session | None = None) -> str:
    """The page text; SourceUnavailable (one line naming the URL) on any HTTP failure."""
    try:
        return fetch_page(url, timeout, session)
    except PageUnavailable as error:
        raise SourceUnavailable(str(error)) from None


def parse(text: str, url: str) -> list[Sample]:
    """Samples of any exposition page (ours or dcgm-exporter's), names as written, each series
    once (`drop_duplicates`). Lines that cannot be parsed (a dcgm-exporter field DCGM cannot
    render) are left out with one warning naming how many and the first; the rest is read."""
    try:
        samples, skipped = parse_samples(text, url)
    except PageUnavailable as error:
        raise SourceUnavailable(str(error)) from None
    if skipped is not None:
        log.warning(
            "%s: %d line(s) of the page cannot be parsed and are left out, the rest is read; "
            "first: %s",
            url,
            skipped.count,
            skipped.describe(),
        )
    return drop_duplicates(samples, url)


def no_gpu(url: str, samples: Sequence[Sample], readings: Sequence[NodeReading]) -> None:
    """SourceUnavailable for a page that holds no GPU: read as a node without GPUs (or as no
    node), it would shrink the fleet silently. Our exporter whose backend is down serves only
    its own series, and says so (the last good GPU series it keeps for a few intervals of an
    outage are still read); any other page is not a GPU exporter's (node_exporter's, a wrong
    port) or names no node."""
    if any(node.gpus for node in readings):
        return
    down = [
        labels.get("backend", "")
        for name, labels, value in samples
        if name == "gpu_exporter_backend_up" and value == 0
    ]
    if down:
        raise SourceUnavailable(
            f"{url}: the exporter's {down[0] or 'GPU'} backend is down "
            "(gpu_exporter_backend_up 0) and it serves no GPU; its /health says why"
        )
    raise SourceUnavailable(
        f"{url}: no GPU series (gpu_* of gpu-defrag's exporter with node and gpu labels, "
        "or DCGM_* of dcgm-exporter)"
    )


def _same(values: Sequence[float]) -> bool:
    """All equal, NaN equal to NaN (two copies of "no value" agree)."""
    first = values[0]
    if math.isnan(first):
        return all(math.isnan(v) for v in values)
    return all(v == first for v in values)


def _series_text(name: str, labels: Mapping[str, str]) -> str:
    """The series as exposition text writes it (label values escaped: one line in a log)."""
    inner = ",".join(f'{key}="{escape_label(value)}"' for key, value in labels.items())
    return f"{name}{{{inner}}}"


def drop_duplicates(samples: Sequence[Sample], url: str) -> list[Sample]:
    """One sample per series (name and label set), in the order of first appearance. Copies
    with one value (NaN agreeing with NaN) are one sample, as are an info series' copies (its
    labels are the reading); copies with different values are left out, so the series reads as
    unknown rather than whichever copy came last, and one warning names the URL and the first
    few such series with their values."""
    copies: dict[tuple[str, frozenset[tuple[str, str]]], list[Sample]] = {}
    for sample in samples:
        name, labels, _ = sample
        copies.setdefault((name, frozenset(labels.items())), []).append(sample)
    if len(copies) == len(samples):
        return list(samples)
    kept: list[Sample] = []
    notes: list[str] = []
    for (name, _), group in copies.items():
        values = [value for _, _, value in group]
        if len(group) == 1 or name.endswith("_info") or _same(values):
            kept.append(group[0])
            continue
        shown = ", ".join(dict.fromkeys(f"{value:g}" for value in values))
        notes.append(f"{_series_text(name, group[0][1])} ({shown})")
    if notes:
        log.warning(
            "%s: %d series given more than once with different values, read as unknown: %s",
            url,
            len(notes),
            first_few(notes),
        )
    return kept


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


def merge(
    pages: Sequence[tuple[str, list[NodeReading]]], *, what: str = "URL", order: str = "listed"
) -> tuple[list[NodeReading], dict[tuple[str, int], str]]:
    """The readings of several URLs as one fleet, nodes in the order first seen, and the URL
    each GPU (node and GPU index) is read from. A GPU that more than one URL reports is read
    whole from the first of them (its values, MIG instances, processes, and the allocations and
    links of that GPU); the later copies are left out and one warning names the URLs and the
    first few such GPUs. A node's labels (pool, rack, versions) are the first non-empty ones.
    The first URL's reading objects are reused.

    `what` names a source in the warning and `order` says how `pages` are ordered (Prometheus'
    scrape targets, `ingest.prometheus`, are sorted rather than listed: our exporter's first,
    then dcgm-exporter's, each in name order)."""
    nodes: dict[str, NodeReading] = {}
    source: dict[tuple[str, int], str] = {}  # (node, GPU index) -> the URL it is read from
    clashes: dict[tuple[str, str], list[str]] = {}  # (URL kept, URL left out) -> node/GPUs
    for url, readings in pages:
        for node in readings:
            merged = nodes.setdefault(node.node, node)
            taken = set()
            for gpu in node.gpus:
                first = source.setdefault((node.node, gpu.index), url)
                if first != url:
                    clashes.setdefault((first, url), []).append(f"{node.node}/gpu{gpu.index}")
                else:
                    taken.add(gpu.index)
            if merged is node:
                continue
            merged.gpus += [gpu for gpu in node.gpus if gpu.index in taken]
            merged.links += [link for link in node.links if link.gpu in taken]
            merged.allocations += [a for a in node.allocations if a.gpu in taken]
            for attr in ("pool", "rack", "driver_version", "cuda_version"):
                setattr(merged, attr, getattr(merged, attr) or getattr(node, attr))
    if clashes:
        count = sum(len(gpus) for gpus in clashes.values())
        shown = [
            f"{first_few(gpus, sep=', ')} from {kept} (also reported by {left})"
            for (kept, left), gpus in clashes.items()
        ]
        log.warning(
            "%d GPU(s) reported by more than one %s, each read from the first %s %s "
            "that reports it: %s",
            count,
            what,
            what,
            order,
            first_few(shown),
        )
    return list(nodes.values()), source


def scrape(urls: Sequence[str], *, timeout: float = 5.0, source: str = "") -> ClusterModel:
    """One model from every page; each page may be ours or dcgm-exporter's. Any unreachable
    URL fails the whole read: an analysis of a partial fleet would mislead.

    The model is stamped with the time of reading, except when every page is a sim exporter's:
    then with the simulated clock (`SimClock.epoch + time_s`), so a fleet simulated faster than
    real time builds a history in simulated hours, continuous with its re-simulated past."""
    unique = list(dict.fromkeys(urls))  # a URL listed twice is one page, read once
    # Pages are fetched in parallel (one exporter per node: a fleet is many URLs), then read
    # in the order given so the model does not depend on which answered first.
    with ThreadPoolExecutor(max_workers=max(1, min(MAX_PARALLEL, len(unique)))) as pool:
        pages = list(pool.map(lambda url: parse(fetch(url, timeout), url), unique))
    notes: list[str] = []
    per_url = [
        (
            url,
            dcgm_readings_unchecked({urlsplit(url).hostname or url: samples})
            if is_dcgm(samples)
            else our_readings_unchecked(samples, notes),
        )
        for url, samples in zip(unique, pages, strict=True)
    ]
    for (url, read), samples in zip(per_url, pages, strict=True):
        no_gpu(url, samples, read)
    readings, _ = merge(per_url)
    drop_impossible(readings, notes)
    clocks = [sim_clock(samples) for samples in pages]
    stamp = (
        max(c.epoch + c.time_s for c in clocks if c is not None)
        if all(c is not None for c in clocks)
        else time.time()
    )
    return from_readings(readings, timestamp=stamp, source=source or ",".join(urls))
