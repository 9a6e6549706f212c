"""Processes on a GPU: memory, per-process SM share on time-sliced GPUs, and their owner.

`nvmlDeviceGetProcessUtilization` returns samples newer than a timestamp the caller passes;
passing 0 (or an old stamp) averages the whole driver buffer and lags (Syllo/nvtop#91,
XuehaiPan/nvitop#83), so the newest sample time seen is kept per GPU and passed next cycle.
No new sample since then is NVML_ERROR_NOT_FOUND: an answer, not an error. Process names
are asked once per pid while the pid stays on the GPU.
"""

from __future__ import annotations

from typing import Any

from exporter.attribution.base import Attribution
from exporter.backends.nvml_calls import NvmlCalls
from exporter.readings import GpuProcess

NOT_MIG = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId of a process outside MIG
# Per kind of process: the call of drivers from 510.39 on, then the one of older drivers.
LISTS = (
    ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"),
    ("nvmlDeviceGetGraphicsRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v2"),
)


class ProcessReader:
    """Lists processes per GPU, keeping the sample clock and the name cache between cycles."""

    def __init__(self) -> None:
        self._seen_us: dict[int, int] = {}
        self._names: dict[int, dict[int, str]] = {}

    def read(
        self,
        calls: NvmlCalls,
        index: int,
        handle: Any,
        attribution: Attribution,
        *,
        utilization: bool = True,
    ) -> list[GpuProcess]:
        """The GPU's compute and graphics processes; `utilization=False` under MIG."""
        scope = f"gpu{index}"
        found: dict[tuple[int, int | None], GpuProcess] = {}
        for current, older in LISTS:
            listed = calls(scope, current, handle)
            if listed is None and not calls.supported(scope, current):
                listed = calls(scope, older, handle)  # driver older than 510.39
            for info in listed or ():
                gi = info.gpuInstanceId
                gi = None if gi is None or int(gi) == NOT_MIG else int(gi)
                key = (int(info.pid), gi)
                if key in found:  # a process using compute and graphics is listed twice
                    continue
                memory = info.usedGpuMemory  # None where NVML cannot tell (MIG unprivileged)
                found[key] = GpuProcess(
                    pid=int(info.pid),
                    memory_used_bytes=float(memory) if memory is not None else None,
                    gpu_instance_id=gi,
                )
        if not found:
            self._names[index] = {}
            return []
        shares = self._utilization(calls, scope, index, handle) if utilization else {}
        old_names, names = self._names.get(index, {}), {}
        for process in found.values():
            pid = process.pid
            if pid not in old_names:
                old_names[pid] = self._name(calls, pid)
            names[pid] = process.name = old_names[pid]
            process.sm_utilization_ratio = shares.get(pid)
            _attribute(calls, attribution, process)
        self._names[index] = names
        return list(found.values())

    def renumber(self, moved: dict[int, int]) -> None:
        """Follow GPUs to their new index (old -> new); GPUs left out are forgotten."""
        self._seen_us = {moved[i]: v for i, v in self._seen_us.items() if i in moved}
        self._names = {moved[i]: v for i, v in self._names.items() if i in moved}

    def _utilization(self, calls: NvmlCalls, scope: str, index: int, handle: Any) -> dict:
        """pid -> SM share (0-1) from the samples newer than the last one seen."""
        nvml = calls.nvml
        samples = calls(
            scope,
            "nvmlDeviceGetProcessUtilization",
            handle,
            self._seen_us.get(index, 0),
            quiet=(nvml.NVML_ERROR_NOT_FOUND,),
        )
        latest: dict[int, tuple[int, float]] = {}
        for sample in samples or ():
            stamp, pid = int(sample.timeStamp), int(sample.pid)
            if pid not in latest or stamp > latest[pid][0]:
                latest[pid] = (stamp, min(float(sample.smUtil) / 100.0, 1.0))
            self._seen_us[index] = max(self._seen_us.get(index, 0), stamp)
        return {pid: share for pid, (_, share) in latest.items()}

    @staticmethod
    def _name(calls: NvmlCalls, pid: int) -> str:
        nvml = calls.nvml
        quiet = (nvml.NVML_ERROR_NOT_FOUND, nvml.NVML_ERROR_NO_PERMISSION)
        return calls("system", "nvmlSystemGetProcessName", pid, quiet=quiet) or ""


def _attribute(calls: NvmlCalls, attribution: Attribution, process: GpuProcess) -> None:
    try:
        owner = attribution.process_owner(process.pid)
    except Exception:  # an attribution bug must not cost the process list
        calls.errors["attribution.process_owner"] += 1
        return
    if owner is not None:
        process.pod, process.namespace = owner.pod, owner.namespace
        process.container, process.slurm_job = owner.container, owner.slurm_job
