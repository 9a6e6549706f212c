"""Slurm job per GPU from a job-mapping directory (dcgm-exporter's `--hpc-job-mapping-dir`).

A Slurm prolog writes a file named `<gpu>` (GPU index) or `<gpu>.<gpu_instance_id>` (a MIG
instance) listing the job ids on it, one per line; the epilog removes it. Reading a directory
is how Slurm nodes say who holds a GPU without running slurmctld queries from every node.
"""

from __future__ import annotations

import logging
import os
import re
from collections import Counter
from collections.abc import Mapping

from exporter.readings import Allocation

log = logging.getLogger(__name__)

_NAME = re.compile(r"^(\d+)(?:\.(\d+))?$")
_JOB = re.compile(r"^[0-9]+(?:[_+][0-9]+)?$")  # 123, array task 123_4, het job 123+1


def read_mapping_dir(directory: str) -> list[tuple[int, int | None, str]]:
    """(gpu index, gpu instance id or None, job id) for every valid file line; raises OSError."""
    found = []
    for name in sorted(os.listdir(directory)):
        match = _NAME.match(name)
        path = os.path.join(directory, name)
        if match is None or not os.path.isfile(path):
            continue
        gpu, gi = int(match.group(1)), None if match.group(2) is None else int(match.group(2))
        try:
            with open(path, errors="replace") as handle:
                lines = handle.read().splitlines()
        except FileNotFoundError:  # removed by the epilog between listing and reading
            continue
        found.extend((gpu, gi, job) for line in lines if _JOB.match(job := line.strip()))
    return found


class SlurmJobMapping:
    """Holds the last read of the mapping directory; `refresh()` re-reads it."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.errors: Counter[str] = Counter()
        self._entries: list[tuple[int, int | None, str]] = []
        self._missing_logged = False

    def refresh(self) -> None:
        if not os.path.isdir(self.directory):
            if not self._missing_logged:
                log.info("slurm job-mapping dir %s not found; no job attribution", self.directory)
                self._missing_logged = True
            self._entries = []  # the directory going away means no jobs are mapped
            return
        self._missing_logged = False
        try:
            self._entries = read_mapping_dir(self.directory)
        except OSError as exc:  # e.g. permissions; keep the last read, try again next round
            self.errors["slurm_mapping"] += 1
            log.warning("reading slurm job-mapping dir %s failed: %s", self.directory, exc)

    def allocations(self, gpu_index_by_uuid: Mapping[str, int]) -> list[Allocation]:
        """One Allocation per (GPU or MIG instance, job); GPUs this node lacks are dropped."""
        known = set(gpu_index_by_uuid.values())
        return [
            Allocation(gpu=gpu, job=job, gpu_instance_id=gi)
            for gpu, gi, job in self._entries
            if not known or gpu in known
        ]
