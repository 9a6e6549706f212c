"""Mutable node snapshot for placement: free GPU milli per device, free CPU and memory, models.

This is the replay's working state (the Kubernetes scheduler's node cache), kept as numpy
arrays so that filters and scores vectorise across nodes. Every change goes through
`allocate` / `release`, which check capacity and notify listeners (e.g. the FGD statistics), so
no placement can oversubscribe CPU, memory, a GPU's milli or a GPU model constraint.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from advisor.fragmentation.fgd import spec_allows
from advisor.ingest.openb import NodeTable
from advisor.model import MILLI

MAX_GPU_LABEL = 8  # GpuClustering labels: share, 1-gpu, ..., 8-gpu


@dataclass(frozen=True)
class PodSpec:
    """One pod's request: CPU/memory, `num_gpu` GPUs of `gpu_milli` each, allowed models."""

    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: str = ""
    name: str = ""

    @property
    def is_share(self) -> bool:
        return self.num_gpu == 1 and 0 < self.gpu_milli < MILLI

    @property
    def total_gpu_milli(self) -> int:
        return self.num_gpu * self.gpu_milli

    @property
    def affinity(self) -> int:
        """GpuClustering label: -1 no GPU, 0 share, k for k whole GPUs."""
        if self.num_gpu == 0:
            return -1
        return 0 if self.gpu_milli < MILLI else min(self.num_gpu, MAX_GPU_LABEL)


class PlacementError(RuntimeError):
    """A placement that would oversubscribe a node (a bug in a policy, never silently applied)."""


@dataclass
class ClusterState:
    """Free resources per node. `gpu_free` is (nodes, max GPUs) with 0 in missing slots."""

    names: np.ndarray
    models: list[str]
    model: np.ndarray  # (N,) index into models ("" = no GPU)
    n_gpu: np.ndarray  # (N,)
    cpu_cap: np.ndarray
    mem_cap: np.ndarray
    gpu_free: np.ndarray  # (N, G) int64
    cpu_free: np.ndarray
    mem_free: np.ndarray
    affinity: np.ndarray  # (N, 9) GPU pods per clustering label
    listeners: list[Callable[[int], None]] = field(default_factory=list)
    _access_cache: dict[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def from_nodes(cls, nodes: NodeTable) -> ClusterState:
        n = len(nodes)
        g = max(1, int(nodes.gpu.max()) if n else 1)
        models = sorted(set(nodes.model.tolist()) | {""})
        index = {m: i for i, m in enumerate(models)}
        gpu_free = np.zeros((n, g), dtype=np.int64)
        for i, k in enumerate(nodes.gpu):
            gpu_free[i, :k] = MILLI
        return cls(
            names=nodes.name.copy(),
            models=models,
            model=np.array([index[m] for m in nodes.model], dtype=np.int64),
            n_gpu=nodes.gpu.astype(np.int64).copy(),
            cpu_cap=nodes.cpu_milli.astype(np.int64).copy(),
            mem_cap=nodes.memory_mib.astype(np.int64).copy(),
            gpu_free=gpu_free,
            cpu_free=nodes.cpu_milli.astype(np.int64).copy(),
            mem_free=nodes.memory_mib.astype(np.int64).copy(),
            affinity=np.zeros((n, MAX_GPU_LABEL + 1), dtype=np.int64),
        )

    def __len__(self) -> int:
        return len(self.names)

    @property
    def gpu_capacity_milli(self) -> int:
        return int(self.n_gpu.sum()) * MILLI

    @property
    def idle(self) -> np.ndarray:
        """Idle GPU milli per node (R_n)."""
        return self.gpu_free.sum(axis=1)

    def access(self, spec: str) -> np.ndarray:
        """(N,) bool: nodes whose GPU model the spec allows (cached per spec string)."""
        mask = self._access_cache.get(spec)
        if mask is None:
            allowed = np.array([spec_allows(spec, m) for m in self.models], dtype=bool)
            mask = allowed[self.model]
            self._access_cache[spec] = mask
        return mask

    def feasible(self, pod: PodSpec, among: np.ndarray | None = None) -> np.ndarray:
        """Filter: indices of nodes with enough CPU, memory and fitting GPUs of an allowed model
        (only among the node indices `among` when given: a replay that knows where room
        appeared checks those alone)."""
        if among is not None:
            nodes = np.asarray(among, dtype=np.int64)
            ok = (self.cpu_free[nodes] >= pod.cpu_milli) & (self.mem_free[nodes] >= pod.memory_mib)
            if pod.num_gpu > 0:
                ok &= self.access(pod.gpu_spec)[nodes] & (self.n_gpu[nodes] > 0)
                ok &= (self.gpu_free[nodes] >= pod.gpu_milli).sum(axis=1) >= pod.num_gpu
            return nodes[ok]
        ok = (self.cpu_free >= pod.cpu_milli) & (self.mem_free >= pod.memory_mib)
        if pod.num_gpu > 0:
            ok &= self.access(pod.gpu_spec) & (self.n_gpu > 0)
            ok &= (self.gpu_free >= pod.gpu_milli).sum(axis=1) >= pod.num_gpu
        return np.flatnonzero(ok)

    def tight_holes(self, nodes: np.ndarray, milli: int) -> tuple[np.ndarray, np.ndarray]:
        """Per node, the partly used GPU that `milli` fills most tightly: (milli left over, GPU).

        Whole GPUs do not count (nothing to fill); where no partly used GPU fits, the left-over
        is MILLI + 1.
        """
        free = self.gpu_free[nodes]
        left = np.where((free >= milli) & (free < MILLI), free - milli, MILLI + 1)
        gpu = left.argmin(axis=1)
        return left[np.arange(len(gpu)), gpu], gpu

    # GPU choice within a node (open-gpu-share's gpusel methods)
    def best_fit_gpu(self, node: int, gpu_milli: int) -> int:
        """The fitting GPU with the least milli left (first index on ties)."""
        row = self.gpu_free[node]
        fit = row >= gpu_milli
        return int(np.argmin(np.where(fit, row, np.iinfo(np.int64).max)))

    def random_fit_gpu(self, node: int, gpu_milli: int, rng: np.random.Generator) -> int:
        fit = np.flatnonzero(self.gpu_free[node] >= gpu_milli)
        return int(fit[rng.integers(len(fit))])

    def free_gpus(self, node: int, count: int) -> list[int]:
        """The first `count` fully free GPUs (AllocateExclusiveGpuId)."""
        return [int(i) for i in np.flatnonzero(self.gpu_free[node] == MILLI)[:count]]

    def default_gpus(self, node: int, pod: PodSpec) -> list[int]:
        """Best-fit GPU for a share pod, first free GPUs otherwise (gpusel "best")."""
        if pod.num_gpu == 0:
            return []
        if pod.is_share:
            return [self.best_fit_gpu(node, pod.gpu_milli)]
        return self.free_gpus(node, pod.num_gpu)

    def allocate(self, node: int, gpus: Sequence[int], pod: PodSpec) -> None:
        """Bind `pod` to `node` on `gpus`; raises PlacementError instead of oversubscribing."""
        if len(gpus) != pod.num_gpu or len(set(gpus)) != len(gpus):
            raise PlacementError(f"{pod.name}: {pod.num_gpu} GPU(s) wanted, got ids {list(gpus)}")
        if self.cpu_free[node] < pod.cpu_milli or self.mem_free[node] < pod.memory_mib:
            raise PlacementError(f"{pod.name}: not enough CPU or memory on node {node}")
        if pod.num_gpu:
            if not self.access(pod.gpu_spec)[node]:
                raise PlacementError(f"{pod.name}: GPU model of node {node} not allowed")
            for gpu in gpus:
                if not 0 <= gpu < self.n_gpu[node] or self.gpu_free[node, gpu] < pod.gpu_milli:
                    raise PlacementError(f"{pod.name}: GPU {gpu} of node {node} lacks milli")
        self.cpu_free[node] -= pod.cpu_milli
        self.mem_free[node] -= pod.memory_mib
        for gpu in gpus:
            self.gpu_free[node, gpu] -= pod.gpu_milli
        if pod.affinity >= 0:
            self.affinity[node, pod.affinity] += 1
        for listener in self.listeners:
            listener(node)

    def release(self, node: int, gpus: Sequence[int], pod: PodSpec) -> None:
        """Undo `allocate` (a departure or a migration's eviction)."""
        if self.cpu_free[node] + pod.cpu_milli > self.cpu_cap[node]:
            raise PlacementError(f"{pod.name}: releasing more CPU than node {node} has")
        for gpu in gpus:
            if self.gpu_free[node, gpu] + pod.gpu_milli > MILLI:
                raise PlacementError(f"{pod.name}: releasing more milli than GPU {gpu} has")
        self.cpu_free[node] += pod.cpu_milli
        self.mem_free[node] += pod.memory_mib
        for gpu in gpus:
            self.gpu_free[node, gpu] += pod.gpu_milli
        if pod.affinity >= 0:
            self.affinity[node, pod.affinity] -= 1
        for listener in self.listeners:
            listener(node)


def select_node(cand: np.ndarray, scores: np.ndarray, rank: np.ndarray) -> int:
    """Highest score wins; ties go to the lowest `rank` (the simulator's seeded name order)."""
    best = scores.max()
    top = cand[scores == best]
    return int(top[np.argmin(rank[top])])
