"""DotProd (Tetris-style, as configured in the paper: merged GPU dim, max-spec normalisation).

Node vector (CPU free / 128 cores, GPU free / 8 GPUs), pod vector the same for its request;
score = int(100 * (1 - <node, pod> / 2)), so the least-aligned node wins (a packing flavour).
"""

from __future__ import annotations

import numpy as np

from advisor.placement.base import Policy
from advisor.placement.state import PodSpec

MAX_SPEC_CPU = 128000.0
MAX_SPEC_GPU = 8000.0


def dotprod_scores(
    cpu_free: np.ndarray, gpu_idle: np.ndarray, cpu_req: int, gpu_req: int
) -> np.ndarray:
    dot = (cpu_free / MAX_SPEC_CPU) * (cpu_req / MAX_SPEC_CPU) + (gpu_idle / MAX_SPEC_GPU) * (
        gpu_req / MAX_SPEC_GPU
    )
    return (100.0 * (1.0 - dot / 2.0)).astype(np.int64)


class DotProdPolicy(Policy):
    name = "dotprod"

    def score(self, pod: PodSpec, cand: np.ndarray) -> np.ndarray:
        s = self.state
        return dotprod_scores(
            s.cpu_free[cand], s.gpu_free[cand].sum(axis=1), pod.cpu_milli, pod.total_gpu_milli
        )
