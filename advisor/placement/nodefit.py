"""Kubernetes' NodeResourcesFit scores: LeastAllocated (the default: spread) and MostAllocated
(bin-packing), over CPU, memory and GPUs with weight 1 each.

kube-scheduler (`noderesources/least_allocated.go`, `most_allocated.go`): per resource,
LeastAllocated scores (allocatable - requested) * 100 / allocatable and MostAllocated
requested * 100 / allocatable, where requested includes the pod being scored; the node score is
the weighted mean, in integers. GPUs count as the extended resource `nvidia.com/gpu`, as
KEP-964 bin-packs it: the milli-GPU requested over the node's GPUs (a sharing pod's share
counts its milli). A node without GPUs leaves the GPU term out. GPU choice inside the node is
best fit (the device plugin's), as for the paper's policies.
"""

from __future__ import annotations

import numpy as np

from advisor.placement.base import Policy
from advisor.placement.state import MILLI, ClusterState, PodSpec

MAX_NODE_SCORE = 100


def requested_ratios(state: ClusterState, pod: PodSpec, cand: np.ndarray) -> np.ndarray:
    """(3, C) int64: requested-after-placement * 100 // allocatable for CPU, memory and GPU on
    each candidate (GPU row -1 where the node has no GPUs)."""
    cpu_cap = np.maximum(state.cpu_cap[cand], 1)
    mem_cap = np.maximum(state.mem_cap[cand], 1)
    gpu_cap = state.n_gpu[cand] * MILLI
    cpu = (state.cpu_cap[cand] - state.cpu_free[cand] + pod.cpu_milli) * MAX_NODE_SCORE // cpu_cap
    mem = (state.mem_cap[cand] - state.mem_free[cand] + pod.memory_mib) * MAX_NODE_SCORE // mem_cap
    used = gpu_cap - state.gpu_free[cand].sum(axis=1) + pod.total_gpu_milli
    gpu = np.where(gpu_cap > 0, used * MAX_NODE_SCORE // np.maximum(gpu_cap, 1), -1)
    return np.stack([cpu, mem, gpu])


def _mean(parts: np.ndarray) -> np.ndarray:
    has_gpu = parts[2] >= 0
    total = parts[0] + parts[1] + np.where(has_gpu, parts[2], 0)
    return total // np.where(has_gpu, 3, 2)


class LeastAllocatedPolicy(Policy):
    """Kubernetes' default scoring: the node with the most left after the pod wins (spread)."""

    name = "leastallocated"

    def score(self, pod: PodSpec, cand: np.ndarray) -> np.ndarray:
        ratios = requested_ratios(self.state, pod, cand)
        free = np.where(ratios >= 0, MAX_NODE_SCORE - ratios, -1)
        free[:2] = MAX_NODE_SCORE - ratios[:2]
        return _mean(free)


class MostAllocatedPolicy(Policy):
    """Bin-packing: the node with the most requested after the pod wins."""

    name = "mostallocated"

    def score(self, pod: PodSpec, cand: np.ndarray) -> np.ndarray:
        return _mean(requested_ratios(self.state, pod, cand))
