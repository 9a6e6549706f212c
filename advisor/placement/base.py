"""The policy interface and the shared filter-then-score step (Kubernetes scheduler framework).

A policy only scores the nodes that passed the filter and picks GPUs inside the chosen node;
`place` does the rest, identically for every policy, so policies stay small and comparable.
"""

from __future__ import annotations

import numpy as np

from advisor.placement.state import ClusterState, PodSpec, select_node


class Policy:
    """Base class: subclasses implement `score`; `gpus` defaults to best-fit GPU selection."""

    name = "base"

    def attach(self, state: ClusterState, rng: np.random.Generator) -> None:
        """Bind to a fresh cluster state at the start of a replay."""
        self.state = state
        self.rng = rng

    def observe(self, pod: PodSpec) -> None:
        """An arrival was seen (before it is placed); online policies learn from it."""

    def score(self, pod: PodSpec, cand: np.ndarray) -> np.ndarray:
        """One score per feasible node in `cand` (higher is better)."""
        raise NotImplementedError

    def gpus(self, pod: PodSpec, node: int) -> list[int]:
        """GPU ids on `node` for `pod` (gpusel "best": least milli left that fits)."""
        return self.state.default_gpus(node, pod)


def place(state: ClusterState, policy: Policy, pod: PodSpec, rank: np.ndarray) -> int:
    """Filter, score, select, bind. Returns the node index, or -1 when the pod fits nowhere."""
    cand = state.feasible(pod)
    if cand.size == 0:
        return -1
    scores = policy.score(pod, cand)
    node = select_node(cand, scores, rank)
    state.allocate(node, policy.gpus(pod, node), pod)
    return node


def place_with_gpus(
    state: ClusterState, policy: Policy, pod: PodSpec, rank: np.ndarray
) -> tuple[int, list[int]]:
    """Like `place`, also returning the GPU ids bound (the replay tracks them for migrations)."""
    cand = state.feasible(pod)
    if cand.size == 0:
        return -1, []
    scores = policy.score(pod, cand)
    node = select_node(cand, scores, rank)
    gpus = policy.gpus(pod, node)
    state.allocate(node, gpus, pod)
    return node, gpus
