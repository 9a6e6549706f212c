"""Random: one uniformly random feasible node scores 100, the rest 0; random fitting GPU."""

from __future__ import annotations

import numpy as np

from advisor.placement.base import Policy
from advisor.placement.state import PodSpec


class RandomPolicy(Policy):
    name = "random"

    def score(self, pod: PodSpec, cand: np.ndarray) -> np.ndarray:
        scores = np.zeros(len(cand), dtype=np.int64)
        scores[self.rng.integers(len(cand))] = 100
        return scores

    def gpus(self, pod: PodSpec, node: int) -> list[int]:
        if pod.is_share:
            return [self.state.random_fit_gpu(node, pod.gpu_milli, self.rng)]
        return self.state.default_gpus(node, pod)
