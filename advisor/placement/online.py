"""Ours: FGD with a workload learned online from the arrivals so far (no oracle).

The paper's FGD knows the task-type popularity of the whole trace before the first pod
arrives. Here the popularity is counted from the pods seen so far (the same 95 % cut) and
refreshed on a doubling schedule, then every `refresh` arrivals. Nodes are ranked by the exact
fragment increase instead of the simulator's integer sigmoid score, which saturates beyond
about +-4.6 GPUs and lumps small differences together; ties fall to the seeded node order.
"""

from __future__ import annotations

import numpy as np

from advisor.fragmentation.fgd import OnlineWorkload, pod_shapes
from advisor.placement.base import Policy
from advisor.placement.fgd import FragTracker, fgd_scores
from advisor.placement.state import ClusterState, PodSpec


class OnlineFGDPolicy(Policy):
    name = "online"

    def __init__(self, refresh: int = 200, quantize: bool = False) -> None:
        self.refresh = refresh
        self.quantize = quantize

    def attach(self, state: ClusterState, rng: np.random.Generator) -> None:
        super().attach(state, rng)
        self.learner = OnlineWorkload()
        self.tracker: FragTracker | None = None
        self._next_refresh = 1
        self._cand = np.zeros(0, dtype=np.int64)
        self._gpu = np.zeros(0, dtype=np.int64)

    def observe(self, pod: PodSpec) -> None:
        shape = pod_shapes([pod.cpu_milli], [pod.num_gpu], [pod.gpu_milli], [pod.gpu_spec])[0]
        self.learner.observe(shape)
        if self.learner.seen >= self._next_refresh:
            workload = self.learner.workload()
            if self.tracker is None:
                self.tracker = FragTracker(self.state, workload)
            else:
                self.tracker.set_workload(workload)
            seen = self.learner.seen
            self._next_refresh = seen * 2 if seen < self.refresh else seen + self.refresh

    def score(self, pod: PodSpec, cand: np.ndarray) -> np.ndarray:
        if self.tracker is None:  # scored before any arrival was observed
            self.observe(pod)
        assert self.tracker is not None
        delta, self._gpu = self.tracker.deltas(pod, cand, quantize=self.quantize)
        self._cand = cand
        if self.quantize:
            return fgd_scores(delta)
        return -delta

    def gpus(self, pod: PodSpec, node: int) -> list[int]:
        if pod.is_share:
            return [int(self._gpu[np.searchsorted(self._cand, node)])]
        return self.state.default_gpus(node, pod)
