"""BestFit: least leftover of CPU and total GPU after placement, min-max normalised to 0..100.

Raw score int(100 * (1 - [0.5 (CPU free - c) / 128000 + 0.5 (GPU free - k d) / 8000])), then
the simulator's NormalizeScore over the feasible nodes (all equal -> all 0).
"""

from __future__ import annotations

import numpy as np

from advisor.placement.base import Policy
from advisor.placement.state import PodSpec

MAX_SPEC_CPU = 128000.0
MAX_SPEC_GPU = 8000.0


def normalize_scores(raw: np.ndarray) -> np.ndarray:
    """Min-max to 0..100 with integer division, as the simulator's NormalizeScore."""
    lo, hi = int(raw.min()), int(raw.max())
    if hi == lo:
        return np.zeros_like(raw)
    return (raw - lo) * 100 // (hi - lo)


def bestfit_scores(
    cpu_free: np.ndarray, gpu_idle: np.ndarray, cpu_req: int, gpu_req: int
) -> np.ndarray:
    left = (cpu_free - cpu_req) / MAX_SPEC_CPU * 0.5 + (gpu_idle - gpu_req) / MAX_SPEC_GPU * 0.5
    return normalize_scores(((1.0 - left) * 100.0).astype(np.int64))


class BestFitPolicy(Policy):
    name = "bestfit"

    def score(self, pod: PodSpec, cand: np.ndarray) -> np.ndarray:
        s = self.state
        return bestfit_scores(
            s.cpu_free[cand], s.gpu_free[cand].sum(axis=1), pod.cpu_milli, pod.total_gpu_milli
        )
