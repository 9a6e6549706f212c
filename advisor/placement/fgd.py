"""FGD: place each pod where the expected fragment amount grows least (fragmentation descent).

Simulator `fgd_score.go`: score = int(100 * sigmoid((F_before - F_after) / 1000)); for a
GPU-sharing pod every fitting GPU is tried and the best one is both the node's score and the GPU
bound; whole-GPU pods take the first free GPUs; CPU-only pods go where exhausting CPU strands the
least GPU. `FragTracker` keeps per-node statistics current so a score needs no full recompute.
"""

from __future__ import annotations

import numpy as np

from advisor.fragmentation.fgd import (
    Workload,
    fragment_from_stats,
    type_stats,
)
from advisor.placement.base import Policy
from advisor.placement.state import MILLI, ClusterState, PodSpec


class FragTracker:
    """F_n(M) of every node for one workload, updated whenever the state changes a node."""

    def __init__(self, state: ClusterState, workload: Workload) -> None:
        self.state = state
        self.set_workload(workload)
        state.listeners.append(self.update)

    def set_workload(self, workload: Workload) -> None:
        s = self.state
        self.workload = workload
        self.access = workload.access(s.models)
        self.cnt, self.low = type_stats(s.gpu_free, workload)
        self.frag = fragment_from_stats(
            self.cnt, self.low, s.idle, s.cpu_free, s.model, workload, self.access
        )

    def update(self, node: int) -> None:
        s = self.state
        sl = slice(node, node + 1)
        cnt, low = type_stats(s.gpu_free[sl], self.workload)
        self.cnt[node] = cnt[0]
        self.low[node] = low[0]
        self.frag[node] = fragment_from_stats(
            cnt,
            low,
            s.gpu_free[sl].sum(axis=1),
            s.cpu_free[sl],
            s.model[sl],
            self.workload,
            self.access,
        )[0]

    @property
    def amount(self) -> float:
        return float(self.frag.sum())

    def after(self, nodes: np.ndarray, pod: PodSpec, old: np.ndarray | None = None) -> np.ndarray:
        """F_n(M) of `nodes` after a hypothetical placement of `pod`.

        For a sharing pod `old` gives the free milli of the GPU it would take on each node;
        whole-GPU pods take fully free GPUs; CPU-only pods change only CPU.
        """
        s, w = self.state, self.workload
        d = w.gpu_milli[None, :]
        cnt = self.cnt[nodes]
        low = self.low[nodes]
        idle = s.gpu_free[nodes].sum(axis=1)
        if pod.num_gpu and old is not None:
            a = old[:, None]
            b = a - pod.gpu_milli
            cnt = cnt - (a >= d) + (b >= d)
            low = low - np.where(a < d, a, 0) + np.where(b < d, b, 0)
            idle = idle - pod.gpu_milli
        elif pod.num_gpu:
            cnt = cnt - pod.num_gpu  # fully free GPUs (>= every d_m) become 0 (< every d_m)
            idle = idle - pod.num_gpu * MILLI
        return fragment_from_stats(
            cnt, low, idle, s.cpu_free[nodes] - pod.cpu_milli, s.model[nodes], w, self.access
        )

    def removal_gain(self, node: int, gpus: list[int], pod: PodSpec) -> float:
        """How much F_node(M) falls if `pod` (on `gpus`) leaves `node` (negative: it rises)."""
        s, w = self.state, self.workload
        row = s.gpu_free[node : node + 1].copy()
        row[0, gpus] += pod.gpu_milli
        cnt, low = type_stats(row, w)
        after = fragment_from_stats(
            cnt,
            low,
            row.sum(axis=1),
            s.cpu_free[node : node + 1] + pod.cpu_milli,
            s.model[node : node + 1],
            w,
            self.access,
        )[0]
        return float(self.frag[node] - after)

    def deltas(
        self, pod: PodSpec, cand: np.ndarray, quantize: bool = True
    ) -> tuple[np.ndarray, np.ndarray]:
        """Best fragment increase per candidate node and the GPU achieving it (-1: not share).

        For sharing pods every distinct free value on a node is tried (equal values give equal
        results). With `quantize` GPUs are compared by the integer FGD score and the first GPU
        of the best score wins, as in the simulator; without, by the exact increase.
        """
        if not pod.is_share:
            return self.after(cand, pod) - self.frag[cand], np.full(len(cand), -1)
        sub = self.state.gpu_free[cand]
        rows, cols = np.nonzero(sub >= pod.gpu_milli)
        vals = sub[rows, cols]
        _, first = np.unique(rows * (MILLI + 1) + vals, return_index=True)
        rows, cols, vals = rows[first], cols[first], vals[first]
        delta = self.after(cand[rows], pod, vals) - self.frag[cand[rows]]
        key = -fgd_scores(delta) if quantize else delta
        order = np.lexsort((cols, key, rows))
        rows_sorted = rows[order]
        _, pick = np.unique(rows_sorted, return_index=True)
        best = order[pick]
        return delta[best], cols[best]


def fgd_scores(delta: np.ndarray) -> np.ndarray:
    """int(100 * sigmoid(-delta / 1000)): the simulator's integer node score."""
    x = np.clip(delta / 1000.0, -700.0, 700.0)  # exp overflows beyond; sigmoid is 0/1 there
    return ((1.0 / (1.0 + np.exp(x))) * 100.0).astype(np.int64)


class FGDPolicy(Policy):
    """FGD with a given workload (the paper uses the replayed trace's own: an oracle)."""

    name = "fgd"

    def __init__(self, workload: Workload) -> None:
        self.workload = workload

    def attach(self, state: ClusterState, rng: np.random.Generator) -> None:
        super().attach(state, rng)
        self.tracker = FragTracker(state, self.workload)
        self._cand = np.zeros(0, dtype=np.int64)
        self._gpu = np.zeros(0, dtype=np.int64)

    def score(self, pod: PodSpec, cand: np.ndarray) -> np.ndarray:
        delta, self._gpu = self.tracker.deltas(pod, cand)
        self._cand = cand
        return fgd_scores(delta)

    def gpus(self, pod: PodSpec, node: int) -> list[int]:
        if pod.is_share:
            return [int(self._gpu[np.searchsorted(self._cand, node)])]
        return self.state.default_gpus(node, pod)
