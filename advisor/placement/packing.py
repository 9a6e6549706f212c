"""GpuPacking: prefer already-shared GPUs, then free GPUs on used nodes, then empty nodes.

Tiers (simulator `gpu_packing_score.go`): shared GPU 100 - sum(free %)/10 (>= 50); free GPUs
on a used node 50 - GPUs consumed (>= 33); an empty node max(33 - free GPUs, free GPUs).
CPU-only pods score 0 everywhere (left to tie-breaking).
"""

from __future__ import annotations

import numpy as np

from advisor.placement.base import Policy
from advisor.placement.state import MILLI, PodSpec


def packing_scores(
    gpu_free: np.ndarray, n_gpu: np.ndarray, num_gpu: int, gpu_milli: int
) -> np.ndarray:
    """Scores for nodes `gpu_free` (C, G) that can host the pod."""
    if num_gpu == 0 or gpu_milli <= 0:
        return np.zeros(len(gpu_free), dtype=np.int64)
    fully_free = (gpu_free == MILLI).sum(axis=1)
    empty = fully_free == n_gpu
    if gpu_milli >= MILLI:
        used = np.maximum(50 - num_gpu, 33)
        return np.where(empty, np.maximum(33 - fully_free, fully_free), used).astype(np.int64)
    best = np.where(gpu_free >= gpu_milli, gpu_free, MILLI + 1).min(axis=1)
    shared = np.maximum(100 - (best * 100 // MILLI) // 10, 50)
    tier = np.where(best == MILLI, np.maximum(50 - 1, 33), shared)
    return np.where(empty, np.maximum(33 - fully_free, fully_free), tier).astype(np.int64)


class PackingPolicy(Policy):
    name = "packing"

    def score(self, pod: PodSpec, cand: np.ndarray) -> np.ndarray:
        s = self.state
        return packing_scores(s.gpu_free[cand], s.n_gpu[cand], pod.num_gpu, pod.gpu_milli)
