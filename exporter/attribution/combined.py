"""One `Attribution` for the exporter: kubelet pod-resources + Slurm job mapping + cgroups.

A single background thread refreshes every source on `--attribution.refresh-interval`; lookups
made during collection only read what it left behind. That is the fix for dcgm-exporter's
per-scrape kubelet calls (CPU, latency and hangs on big and MIG nodes: #599, #607, #509).
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping

from exporter.attribution.base import Owner
from exporter.attribution.cgroups import DEFAULT_POD_LOGS_DIR, DEFAULT_PROC_ROOT, CgroupAttribution
from exporter.attribution.podresources import DEFAULT_SOCKET, PodResourcesSource
from exporter.attribution.slurm import SlurmJobMapping
from exporter.readings import Allocation
from gpu_defrag_common.units import positive_duration

log = logging.getLogger(__name__)

DEFAULT_REFRESH_S = 10.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The attribution flags; an empty path turns that source off."""
    group = parser.add_argument_group("attribution (pods, Slurm jobs)")
    group.add_argument(
        "--kubelet.pod-resources-socket",
        dest="pod_resources_socket",
        default=DEFAULT_SOCKET,
        help="kubelet PodResources socket; absent file = not on Kubernetes ('' turns it off)",
    )
    group.add_argument(
        "--kubelet.gpu-resource-names",
        dest="gpu_resource_names",
        default="",
        help="extra comma-separated resource names that hold GPUs "
        "(nvidia.com/gpu, nvidia.com/gpu.shared and nvidia.com/mig-* are always read)",
    )
    group.add_argument(
        "--kubelet.pod-logs-dir",
        dest="pod_logs_dir",
        default=DEFAULT_POD_LOGS_DIR,
        help="kubelet pod log dirs <ns>_<pod>_<uid>, to name the pod of a process; "
        "container names come from ../containers",
    )
    group.add_argument(
        "--proc-root",
        dest="proc_root",
        default=DEFAULT_PROC_ROOT,
        help="host /proc (needs the host PID namespace) for process -> pod/job via cgroups "
        "('' turns it off)",
    )
    group.add_argument(
        "--slurm.job-mapping-dir",
        dest="slurm_job_mapping_dir",
        default="",
        help="directory of files <gpu>[.<gpu_instance>] listing Slurm job ids (off when empty)",
    )
    group.add_argument(
        "--attribution.refresh-interval",
        dest="attribution_refresh_interval",
        type=positive_duration,
        default=DEFAULT_REFRESH_S,
        help="how often the background thread re-reads all sources (default 10s)",
    )


def build_attribution(args: argparse.Namespace) -> CombinedAttribution:
    """The sources the flags ask for; call `start()` to begin refreshing."""
    extra = [name.strip() for name in args.gpu_resource_names.split(",") if name.strip()]
    return CombinedAttribution(
        pod_resources=(
            PodResourcesSource(args.pod_resources_socket, extra_resource_names=extra)
            if args.pod_resources_socket
            else None
        ),
        slurm=SlurmJobMapping(args.slurm_job_mapping_dir) if args.slurm_job_mapping_dir else None,
        cgroups=(
            CgroupAttribution(args.proc_root, pod_logs_dir=args.pod_logs_dir)
            if args.proc_root
            else None
        ),
        refresh_interval_s=args.attribution_refresh_interval,
    )


class Refresher:
    """A daemon thread: `periodic` on a timer (first run at once), `on_demand` when woken."""

    def __init__(
        self,
        interval_s: float,
        periodic: list[Callable[[], object]],
        on_demand: list[Callable[[], object]],
        name: str = "attribution-refresh",
    ) -> None:
        self.interval_s = interval_s
        self.periodic = periodic
        self.on_demand = on_demand
        self.rounds = 0  # completed periodic rounds
        self._name = name
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def close(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        due = time.monotonic()
        while not self._stop.is_set():
            woken = self._wake.wait(max(0.0, due - time.monotonic()))
            if self._stop.is_set():
                return
            if woken:
                self._wake.clear()
                _run_all(self.on_demand)
            if time.monotonic() >= due:
                _run_all(self.periodic)
                self.rounds += 1
                due = time.monotonic() + self.interval_s


def _run_all(tasks: list[Callable[[], object]]) -> None:
    for task in tasks:
        try:
            task()
        except Exception:  # a source's own bug must not end the thread
            log.exception("attribution refresh step %r failed", getattr(task, "__qualname__", task))


class CombinedAttribution:
    """Implements `Attribution` from cached source state; `errors` merges the sources' counters."""

    def __init__(
        self,
        pod_resources: PodResourcesSource | None = None,
        slurm: SlurmJobMapping | None = None,
        cgroups: CgroupAttribution | None = None,
        refresh_interval_s: float = DEFAULT_REFRESH_S,
    ) -> None:
        self.pod_resources = pod_resources
        self.slurm = slurm
        self.cgroups = cgroups
        sources = [s for s in (pod_resources, slurm, cgroups) if s is not None]
        self._sources = sources
        self.refresher = Refresher(
            refresh_interval_s,
            periodic=[s.refresh for s in sources],
            on_demand=[cgroups.resolve_pending] if cgroups is not None else [],
        )
        if cgroups is not None:
            cgroups.on_miss = self.refresher.wake

    @property
    def errors(self) -> Counter[str]:
        merged: Counter[str] = Counter()
        for source in self._sources:
            merged.update(dict(source.errors))  # C-level copy: the refresher may add keys
        return merged

    def process_owner(self, pid: int) -> Owner | None:
        return self.cgroups.process_owner(pid) if self.cgroups is not None else None

    def allocations(
        self,
        gpu_index_by_uuid: dict[str, int],
        mig_by_uuid: Mapping[str, tuple[int, int]] | None = None,
    ) -> list[Allocation]:
        found: list[Allocation] = []
        if self.pod_resources is not None:
            found.extend(self.pod_resources.allocations(gpu_index_by_uuid, mig_by_uuid))
        if self.slurm is not None:
            found.extend(self.slurm.allocations(gpu_index_by_uuid))
        return found

    def refresh(self) -> None:
        """Every source once, in the caller's thread (one-shot tools and tests)."""
        _run_all([s.refresh for s in self._sources])

    def start(self) -> None:
        self.refresher.start()

    def close(self) -> None:
        self.refresher.close()
        if self.cgroups is not None:
            self.cgroups.on_miss = None

    def __enter__(self) -> CombinedAttribution:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
