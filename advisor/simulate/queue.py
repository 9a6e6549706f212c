"""The waiting queue: priority first, then submission order (FIFO), grouped by task shape.

Jobs of one shape (tasks, GPUs per task, milli, CPU, memory, allowed models) fit exactly the
same nodes, so the queue keeps one heap per shape and asks "can this shape start?" once per
shape, not once per waiting job. After a change that frees room on some nodes, only shapes
whose head task fits one of those nodes can start (nothing else changed), which
`candidates` finds with one vectorised comparison over every shape with waiting jobs: the
replay stays cheap with thousands of jobs waiting (Kubernetes' scheduling queue does the
same: unschedulable pods are retried on the cluster events that may make them fit).
"""

from __future__ import annotations

import heapq

import numpy as np

from advisor.placement.state import ClusterState
from advisor.simulate.jobs import JobTable


class WaitQueue:
    """Waiting jobs by shape; `order_key(job)` = (-priority, submit time, job index)."""

    def __init__(self, jobs: JobTable, state: ClusterState) -> None:
        self.jobs = jobs
        keys = list(
            zip(
                jobs.num_nodes.tolist(),
                jobs.num_gpu.tolist(),
                jobs.gpu_milli.tolist(),
                jobs.cpu_milli.tolist(),
                jobs.memory_mib.tolist(),
                jobs.gpu_spec.tolist(),
                strict=True,
            )
        )
        index: dict[tuple, int] = {}
        self.group_of = np.array([index.setdefault(k, len(index)) for k in keys], dtype=np.int64)
        shapes = list(index)
        self.g_nodes = np.array([s[0] for s in shapes], dtype=np.int64)
        self.g_gpu = np.array([s[1] for s in shapes], dtype=np.int64)
        self.g_milli = np.array([s[2] for s in shapes], dtype=np.int64)
        self.g_cpu = np.array([s[3] for s in shapes], dtype=np.int64)
        self.g_mem = np.array([s[4] for s in shapes], dtype=np.int64)
        self.g_spec = [s[5] for s in shapes]
        self.state = state
        self._access = np.stack([state.access(spec) for spec in self.g_spec]) if shapes else None
        self.heaps: list[list[tuple[int, float, int]]] = [[] for _ in shapes]
        self.waiting = 0
        self.waiting_gpus = 0.0
        self._gpus = jobs.gpus

    def __len__(self) -> int:
        return self.waiting

    def key(self, job: int) -> tuple[int, float, int]:
        return (-int(self.jobs.priority[job]), float(self.jobs.submit_s[job]), job)

    def push(self, job: int) -> None:
        heapq.heappush(self.heaps[self.group_of[job]], self.key(job))
        self.waiting += 1
        self.waiting_gpus += float(self._gpus[job])

    def has_peers(self, job: int) -> bool:
        """Whether jobs of `job`'s shape are waiting (then it cannot fit either)."""
        return bool(self.heaps[self.group_of[job]])

    def head(self, group: int) -> int | None:
        heap = self.heaps[group]
        return heap[0][2] if heap else None

    def pop(self, group: int) -> int:
        job = heapq.heappop(self.heaps[group])[2]
        self.waiting -= 1
        self.waiting_gpus -= float(self._gpus[job])
        return job

    def remove(self, job: int) -> None:
        """Take a job out of the queue wherever it is (it started through a reservation)."""
        heap = self.heaps[self.group_of[job]]
        key = self.key(job)
        heap.remove(key)
        heapq.heapify(heap)
        self.waiting -= 1
        self.waiting_gpus -= float(self._gpus[job])

    def jobs_waiting(self) -> list[int]:
        """Every waiting job, in queue order."""
        return [k[2] for k in sorted(k for heap in self.heaps for k in heap)]

    def active(self) -> np.ndarray:
        return np.array([g for g, heap in enumerate(self.heaps) if heap], dtype=np.int64)

    def candidates(self, nodes: np.ndarray) -> list[int]:
        """Shapes with waiting jobs whose task fits at least one of `nodes` now, in the order of
        their head jobs."""
        groups = self.active()
        if groups.size == 0 or len(nodes) == 0:
            return []
        s = self.state
        nodes = np.asarray(nodes, dtype=np.int64)
        ok = (s.cpu_free[nodes][None, :] >= self.g_cpu[groups][:, None]) & (
            s.mem_free[nodes][None, :] >= self.g_mem[groups][:, None]
        )
        gpu = self.g_gpu[groups]
        fits = (s.gpu_free[nodes][None, :, :] >= self.g_milli[groups][:, None, None]).sum(axis=2)
        ok &= (gpu[:, None] == 0) | (
            (fits >= gpu[:, None]) & self._access[groups][:, nodes]  # type: ignore[index]
        )
        chosen = groups[ok.any(axis=1)]
        return sorted(chosen.tolist(), key=lambda g: self.heaps[g][0])
