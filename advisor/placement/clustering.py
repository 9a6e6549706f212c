"""GpuClustering: keep pods of the same GPU "affinity" (share, 1-gpu, 2-gpu, ...) together.

Tiers: node hosts only this label 75+, mixed labels incl. this one 50+, no GPU pods yet 25+,
only other labels 0+; within a tier +25 * (8000 - idle milli) / 8000 (integer), fuller first.
CPU-only pods score 0.
"""

from __future__ import annotations

import numpy as np

from advisor.placement.base import Policy
from advisor.placement.state import PodSpec

MAX_SPEC_GPU = 8000


def clustering_scores(affinity: np.ndarray, gpu_idle: np.ndarray, label: int) -> np.ndarray:
    """`affinity` (C, 9) GPU-pod counts per label on each node; `label` the pod's (-1: no GPU)."""
    if label < 0:
        return np.zeros(len(gpu_idle), dtype=np.int64)
    base = 25 * (MAX_SPEC_GPU - gpu_idle) // MAX_SPEC_GPU
    has = affinity[:, label] > 0
    labels = (affinity > 0).sum(axis=1)
    tier = np.where(has, np.where(labels == 1, 75, 50), np.where(labels == 0, 25, 0))
    return (base + tier).astype(np.int64)


class ClusteringPolicy(Policy):
    name = "clustering"

    def score(self, pod: PodSpec, cand: np.ndarray) -> np.ndarray:
        s = self.state
        return clustering_scores(s.affinity[cand], s.gpu_free[cand].sum(axis=1), pod.affinity)
