"""Which pod, container or Slurm job a host PID belongs to, from `/proc/<pid>/cgroup`.

Why cgroups: on a time-sliced or MPS-shared GPU the kubelet only says which pods share the GPU;
NVML says which PIDs use it. The cgroup path joins the two (dcgm-exporter PR #594 does the same).
Pod UIDs become names through the kubelet's log directories (`/var/log/pods/<ns>_<name>_<uid>`,
`/var/log/containers/<pod>_<ns>_<container>-<id>.log`), which needs no API-server access.

Lookups answer from a bounded cache only. A PID not yet in it is queued and answered after the
background thread resolves it (it is woken for that, so a new process waits one short round,
not a whole refresh interval); the periodic refresh evicts exited or reused PIDs.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from exporter.attribution.base import Owner

log = logging.getLogger(__name__)

DEFAULT_PROC_ROOT = "/proc"
DEFAULT_POD_LOGS_DIR = "/var/log/pods"
DEFAULT_MAX_ENTRIES = 8192

_UUID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
# `pod<uid>` after "/" (cgroupfs) or "-" (systemd: kubepods-burstable-pod<uid>.slice, with "_"
# for "-" in the uid); static pods have a 32-hex config hash as uid. The next component, if any,
# is the container.
_POD = re.compile(rf"(?:^|[/-])pod({_UUID}|[0-9a-f]{{32}})(?:\.slice)?(?:/([^/]+))?")
_CONTAINER = re.compile(
    r"^(?:cri-containerd-|containerd-|docker-|crio-|cri-o-)?([0-9a-f]{64})(?:\.scope)?$"
)
# Slurm: v1 /slurm/uid_<u>/job_<j>/step_<s>; v2 /system.slice/slurmstepd.scope/job_<j>/step_<s>;
# and slurm-<j> (.scope/.slice) components.
_SLURM_JOB = re.compile(r"/job_(\d+)(?:/|$)")
_SLURM_UNIT = re.compile(r"(?:^|/)slurm[-_](\d+)(?:\.scope|\.slice)?(?:/|$)")
_POD_LOG_DIR = re.compile(
    rf"^([a-z0-9.-]+)_([a-z0-9.-]+)_({_UUID.replace('[-_]', '-')}|[0-9a-f]{{32}})$"
)
_CONTAINER_LOG = re.compile(r"^([a-z0-9.-]+)_([a-z0-9.-]+)_([a-z0-9.-]+)-([0-9a-f]{64})\.log$")


@dataclass(frozen=True, slots=True)
class CgroupInfo:
    """What one process's cgroup paths say about its owner."""

    pod_uid: str = ""
    container_id: str = ""
    slurm_job: str = ""


def parse_cgroup(text: str) -> CgroupInfo:
    """Read `/proc/<pid>/cgroup` (v1 `id:controllers:path` lines or the v2 `0::path` line)."""
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        path = parts[2]
        if match := _POD.search(path):
            container = _CONTAINER.match(match.group(2) or "")
            return CgroupInfo(
                pod_uid=match.group(1).replace("_", "-"),
                container_id=container.group(1) if container else "",
            )
        if "slurm" in path and (match := _SLURM_JOB.search(path) or _SLURM_UNIT.search(path)):
            return CgroupInfo(slurm_job=match.group(1))
    return CgroupInfo()


def slurm_job_from_environ(data: bytes) -> str:
    """SLURM_JOB_ID from a `/proc/<pid>/environ` blob ("" if absent)."""
    for item in data.split(b"\0"):
        if item.startswith(b"SLURM_JOB_ID="):
            return item.split(b"=", 1)[1].decode(errors="replace").strip()
    return ""


def scan_pod_logs(pod_logs_dir: str) -> dict[str, tuple[str, str]]:
    """Pod uid -> (namespace, name) from `<pod_logs_dir>/<namespace>_<name>_<uid>` entries."""
    try:
        names = os.listdir(pod_logs_dir)
    except OSError:
        return {}
    found = {}
    for name in names:
        if match := _POD_LOG_DIR.match(name):
            found[match.group(3)] = (match.group(1), match.group(2))
    return found


def scan_container_logs(containers_dir: str) -> dict[str, str]:
    """Container id -> container name from `<pod>_<namespace>_<container>-<id>.log` links."""
    try:
        names = os.listdir(containers_dir)
    except OSError:
        return {}
    return {m.group(4): m.group(3) for name in names if (m := _CONTAINER_LOG.match(name))}


@dataclass(slots=True)
class _Entry:
    start_time: str | None  # /proc/<pid>/stat field 22; None if the PID was not readable
    info: CgroupInfo
    owner: Owner | None


class CgroupAttribution:
    """PID -> Owner, answered from a bounded cache that `refresh()` and `resolve_pending()` fill."""

    def __init__(
        self,
        proc_root: str = DEFAULT_PROC_ROOT,
        pod_logs_dir: str = DEFAULT_POD_LOGS_DIR,
        containers_log_dir: str | None = None,
        max_entries: int = DEFAULT_MAX_ENTRIES,
    ) -> None:
        self.proc_root = proc_root
        self.pod_logs_dir = pod_logs_dir
        self.containers_log_dir = containers_log_dir or str(
            Path(pod_logs_dir).parent / "containers"
        )
        self.max_entries = max_entries
        self.errors: Counter[str] = Counter()
        self.on_miss: Callable[[], None] | None = None  # set by the refresher to be woken
        self._lock = threading.Lock()
        self._cache: OrderedDict[int, _Entry] = OrderedDict()
        self._pending: dict[int, None] = {}  # insertion-ordered set
        self._pods: dict[str, tuple[str, str]] = {}
        self._containers: dict[str, str] = {}
        self._host_pid_ns: bool | None = None  # checked on each refresh

    def process_owner(self, pid: int) -> Owner | None:
        """Cached answer; a miss queues the PID for the background thread and returns None."""
        with self._lock:
            entry = self._cache.get(pid)
            if entry is not None:
                self._cache.move_to_end(pid)
                return entry.owner
            if len(self._pending) < self.max_entries:
                self._pending[pid] = None
        if self.on_miss is not None:
            self.on_miss()
        return None

    def resolve_pending(self) -> int:
        """Read the cgroups of queued PIDs (background thread); returns how many were read."""
        with self._lock:
            pids = list(self._pending)
            self._pending.clear()
        entries = {pid: self._read(pid) for pid in pids}
        with self._lock:
            for pid, entry in entries.items():
                self._cache[pid] = entry
                self._cache.move_to_end(pid)
            while len(self._cache) > self.max_entries:
                self._cache.popitem(last=False)
        return len(entries)

    def refresh(self) -> None:
        """Periodic: re-scan pod names, drop exited/reused PIDs, recompute owners, read queued PIDs."""
        self._check_host_pid_namespace()
        self._pods = scan_pod_logs(self.pod_logs_dir)
        self._containers = scan_container_logs(self.containers_log_dir)
        with self._lock:
            cached = list(self._cache.items())
        dead = []
        for pid, entry in cached:
            start = self._start_time(pid)
            if start != entry.start_time and not (start is None and entry.start_time is None):
                dead.append(pid)  # exited (readable before, not now) or PID reused
            else:
                entry.owner = self._owner(entry.info)
        with self._lock:
            for pid in dead:
                self._cache.pop(pid, None)
        self.resolve_pending()

    def __len__(self) -> int:
        return len(self._cache)

    def _check_host_pid_namespace(self) -> bool:
        """NVML reports host PIDs; in a private PID namespace `/proc/<pid>` is someone else.

        PID 2 is the kernel's kthreadd only in the host namespace, so its absence means the
        exporter runs without `hostPID`, and answering would attribute the wrong process.
        """
        try:
            comm = Path(self.proc_root, "2", "comm").read_text().strip()
        except OSError:
            comm = ""
        host = comm == "kthreadd"
        if not host and self._host_pid_ns is not False:
            log.warning(
                "%s is not the host PID namespace (no kthreadd at PID 2); process owners "
                "unknown: run with hostPID and mount the host /proc",
                self.proc_root,
            )
        self._host_pid_ns = host
        return host

    def _read(self, pid: int) -> _Entry:
        base = os.path.join(self.proc_root, str(pid))
        start = self._start_time(pid)
        if not (self._host_pid_ns or self._check_host_pid_namespace()):
            return _Entry(start, CgroupInfo(), None)
        try:
            info = parse_cgroup(Path(base, "cgroup").read_text(errors="replace"))
        except OSError:  # exited between NVML's listing and now: nothing to attribute
            return _Entry(start, CgroupInfo(), None)
        if not info.pod_uid and not info.slurm_job:
            try:
                job = slurm_job_from_environ(Path(base, "environ").read_bytes())
            except OSError:  # other users' environ needs root; not an error
                job = ""
            if job:
                info = CgroupInfo(slurm_job=job)
        return _Entry(start, info, self._owner(info))

    def _owner(self, info: CgroupInfo) -> Owner | None:
        if info.pod_uid:
            namespace, pod = self._pods.get(info.pod_uid, ("", ""))
            if not pod:
                return None  # uid only: no name to label with yet; retried each refresh
            return Owner(
                pod=pod,
                namespace=namespace,
                container=self._containers.get(info.container_id, ""),
                slurm_job=info.slurm_job,
            )
        if info.slurm_job:
            return Owner(slurm_job=info.slurm_job)
        return None

    def _start_time(self, pid: int) -> str | None:
        try:
            stat = Path(self.proc_root, str(pid), "stat").read_text(errors="replace")
        except OSError:
            return None
        fields = stat[stat.rfind(")") + 2 :].split()  # comm may contain spaces and ")"
        return fields[19] if len(fields) > 19 else None
