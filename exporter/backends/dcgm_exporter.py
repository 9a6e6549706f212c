"""Backend that scrapes running NVIDIA dcgm-exporter instances and re-reads their series.

For fleets that already run dcgm-exporter (GPU Operator), this turns its `/metrics` pages into
our readings: base units, one `_info` identity, pod allocations, MIG instances and per-code XID
counters, without touching the GPU a second time. Text is parsed with prometheus_client's own
parser; only the meaning of the series lives here.
"""

from __future__ import annotations

import argparse
import logging
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import requests

from exporter.backends.base import Backend, BackendUnavailable
from exporter.backends.dcgm_common import (
    XID_FIELD,
    XidTracker,
    apply_fields,
    is_blank,
    mig_values,
)
from exporter.backends.page_parse import PageError, Sample, Skipped, parse_page
from exporter.contract import DCGM_MIG_FIELDS
from exporter.readings import Allocation, Collection, GpuReading, MigInstance, NodeReading
from gpu_defrag_common import bounded_get, units

log = logging.getLogger(__name__)

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
# The most a /metrics page may hold. dcgm-exporter's page of an 8-GPU node is ~90 KB, with MIG
# and profiling fields a few hundred KB; our exporter's page of a big node a few MB. 64 MiB is
# ten times the largest real page, and still parses in bounded time and memory: more is a
# broken or hostile target (an endless page), refused rather than read until memory runs out.
MAX_PAGE_BYTES = 64 * 2**20


def _label(labels: dict[str, str], *names: str) -> str:
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


def parse_samples(
    text: str, url: str, *, empty_hint: str = "", none_hint: str = ""
) -> tuple[list[Sample], Skipped | None]:
    """(sample name, labels, value) of every sample of any exposition page, and the lines left
    out as unparseable (`page_parse`); BackendUnavailable with one line naming the URL for an
    empty page, one of which no line parses (naming its first bad line) or one without samples.
    The hints are added to the message of an empty page and of a page without samples."""
    if not text.strip():
        raise BackendUnavailable(f"{url}: empty /metrics page{_hint(empty_hint)}")
    try:
        samples, skipped = parse_page(text)
    except PageError as error:
        raise BackendUnavailable(f"{url}: {error}") from None
    if not samples:
        raise BackendUnavailable(f"{url}: no samples in the /metrics page{_hint(none_hint)}")
    return samples, skipped


def _hint(text: str) -> str:
    return f" ({text})" if text else ""


def parse_exposition(text: str, url: str) -> tuple[list[Sample], Skipped | None]:
    """(DCGM field name, labels, value) of every sample of a dcgm-exporter page, and the lines
    left out (`parse_samples`)."""
    samples, skipped = parse_samples(
        text, url, empty_hint="dcgm-exporter reloading?", none_hint="is it dcgm-exporter?"
    )
    return [(canonical_name(name), labels, value) for name, labels, value in samples], skipped


def fetch_page(url: str, timeout: float, session: requests.Session | None = None) -> str:
    """The text of one /metrics page; BackendUnavailable with one line naming the URL on any
    HTTP failure (timeout, refused, non-200, a page not complete within `timeout` or over
    `MAX_PAGE_BYTES`)."""
    try:
        response = bounded_get.get(url, timeout, cap=MAX_PAGE_BYTES, session=session)
    except requests.Timeout:
        raise BackendUnavailable(f"{url}: no answer within {timeout:g} s") from None
    except bounded_get.AnswerTooSlow:
        raise BackendUnavailable(f"{url}: no complete answer within {timeout:g} s") from None
    except bounded_get.AnswerTooLarge:
        raise BackendUnavailable(
            f"{url}: page larger than {units.size_text(MAX_PAGE_BYTES)}"
        ) from None
    except requests.RequestException as error:
        raise BackendUnavailable(f"{url}: unreachable ({type(error).__name__})") from None
    if response.status_code != 200:
        raise BackendUnavailable(f"{url}: HTTP {response.status_code} {response.reason}")
    return response.text


@dataclass
class _Gpu:
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
class _Node:
    name: str
    driver_version: str = ""
    gpus: dict[int, _Gpu] = field(default_factory=dict)
    allocations: dict[tuple, Allocation] = field(default_factory=dict)


class DcgmExporterBackend(Backend):
    """Scrapes one or more dcgm-exporter `/metrics` URLs; one failing target does not stop the rest."""

    name = "dcgm-exporter"

    def __init__(self, urls: list[str], timeout: float = 5.0) -> None:
        if not urls:
            raise ValueError("--dcgm-exporter.url is required (e.g. http://localhost:9400/metrics)")
        self.urls = urls
        self.timeout = timeout
        self._session: requests.Session | None = None
        self._xids = XidTracker()
        self._said_skipped: dict[str, tuple[int, int]] = {}  # url -> (count, first line) said

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("dcgm-exporter backend")
        group.add_argument(
            "--dcgm-exporter.url",
            dest="dcgm_exporter_url",
            action="append",
            default=[],
            metavar="URL",
            help="dcgm-exporter /metrics URL; repeat or comma-separate for several targets",
        )
        group.add_argument(
            "--dcgm-exporter.timeout",
            dest="dcgm_exporter_timeout",
            type=float,
            default=5.0,
            metavar="SECONDS",
            help="HTTP timeout per target, for its whole page (default 5)",
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> DcgmExporterBackend:
        urls = [
            url.strip()
            for value in getattr(args, "dcgm_exporter_url", None) or []
            for url in value.split(",")
            if url.strip()
        ]
        for url in urls:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"--dcgm-exporter.url {url!r} is not an http(s) URL")
        timeout = getattr(args, "dcgm_exporter_timeout", 5.0)
        if timeout <= 0:
            raise ValueError("--dcgm-exporter.timeout must be positive")
        return cls(urls, timeout)

    def start(self) -> None:
        if self._session is None:
            self._session = bounded_get.new_session()

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    def fetch(self, url: str) -> str:
        """The page text; BackendUnavailable with one line naming the URL on any HTTP failure."""
        self.start()
        return fetch_page(url, self.timeout, self._session)

    def collect(self) -> Collection:
        now = time.time()
        nodes: dict[str, _Node] = {}
        errors: dict[str, str] = {}
        skipped: dict[str, int] = {}
        for url in self.urls:
            try:
                samples, bad = parse_exposition(self.fetch(url), url)
                if not _group(samples, urlsplit(url).hostname or url, nodes):
                    raise BackendUnavailable(f"{url}: no per-GPU series (is it dcgm-exporter?)")
            except BackendUnavailable as error:
                errors[url] = str(error)
                log.warning("%s", error)
                continue
            self._say_skipped(url, bad)
            if bad is not None:
                skipped[url] = bad.count
        if len(errors) == len(self.urls):
            if len(errors) == 1:
                raise BackendUnavailable(next(iter(errors.values())))
            first = next(iter(errors.values()))
            raise BackendUnavailable(f"all {len(errors)} dcgm-exporter targets failed; {first}")
        collection = Collection(
            nodes=[self._reading(node, now) for node in nodes.values()], timestamp=now
        )
        for url in errors:
            collection.errors[f"scrape {url}"] += 1
        collection.skipped_lines.update(skipped)
        return collection

    def _say_skipped(self, url: str, bad: Skipped | None) -> None:
        """One warning when a target's page starts having unparseable lines or has others, one
        line when it has none again: not one every collection."""
        said = self._said_skipped.get(url)
        now = None if bad is None else (bad.count, bad.first_number)
        if now == said:
            return
        if bad is None:
            del self._said_skipped[url]
            log.info("%s: every line of the page parses again", url)
            return
        self._said_skipped[url] = now
        log.warning(
            "%s: %d line(s) of the page cannot be parsed and are left out, the rest is read; "
            "first: %s",
            url,
            bad.count,
            bad.describe(),
        )

    def _reading(self, node: _Node, now: float) -> NodeReading:
        reading = NodeReading(
            node=node.name,
            driver_version=node.driver_version,
            allocations=list(node.allocations.values()),
        )
        for index in sorted(node.gpus):
            reading.gpus.append(self._gpu_reading(node.name, node.gpus[index], now))
        return reading

    def _gpu_reading(self, node: str, raw: _Gpu, now: float) -> GpuReading:
        labels = raw.labels
        gpu = GpuReading(
            index=raw.index,
            uuid=_label(labels, "UUID", "uuid"),
            # modelName on GPU series, model_name on NVLink ones (and --replace-blanks-in-model-
            # name's dashes); a `DCGM_FI_DEV_NAME, label` counters row where a page has neither
            model=_label(labels, "modelName", "model_name", "DCGM_FI_DEV_NAME"),
            pci_bus_id=_label(labels, "pci_bus_id"),
            serial=_label(labels, "DCGM_FI_DEV_SERIAL"),
            vbios_version=_label(labels, "DCGM_FI_DEV_VBIOS_VERSION"),
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


def _group(
    samples: list[tuple[str, dict[str, str], float]], default_node: str, nodes: dict[str, _Node]
) -> int:
    """Sort one target's samples into nodes and GPUs; series without a `gpu` label are skipped.

    Returns how many samples described a GPU, so a page from the wrong exporter is noticed.
    """
    used = 0
    for name, labels, value in samples:
        index_text = labels.get("gpu", "")
        if not index_text.isdigit() or "nvlink" in labels or "nvswitch" in labels:
            continue  # NVLink, NvSwitch, CPU and P2P series describe other entities
        node_name = _label(labels, "hostname", "Hostname") or default_node
        node = nodes.get(node_name) or nodes.setdefault(node_name, _Node(node_name))
        node.driver_version = node.driver_version or _label(labels, "DCGM_FI_DRIVER_VERSION")
        index = int(index_text)
        gpu = node.gpus.get(index) or node.gpus.setdefault(index, _Gpu(index))
        for key, label_value in labels.items():
            if label_value and not is_blank(label_value):
                gpu.labels.setdefault(key, label_value)
        gi_text = labels.get("GPU_I_ID", "")
        gi_id = int(gi_text) if gi_text.isdigit() else None
        _allocate(node, index, gi_id, labels)
        _record(gpu, gi_id, labels, name, value)
        used += 1
    return used


def _allocate(node: _Node, index: int, gi_id: int | None, labels: dict[str, str]) -> None:
    """Pod labels on a series mean the kubelet assigned this GPU (or MIG instance) to the pod."""
    pod = _label(labels, "pod", "pod_name")
    if not pod:
        return
    namespace = _label(labels, "namespace", "pod_namespace")
    container = _label(labels, "container", "container_name")
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


def _record(gpu: _Gpu, gi_id: int | None, labels: dict[str, str], name: str, value: float) -> None:
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
    profile = _label(labels, "GPU_I_PROFILE")
    _, values = gpu.mig.setdefault(gi_id, (profile, {}))
    if name in DCGM_MIG_FIELDS:
        values[name] = value
    else:
        gpu.inherited.setdefault(name, value)
