"""The FGD paper's replay protocol: fill the cluster with shuffled, inflated arrivals.

Pods are shuffled by seed, then resampled (with replacement, from the original trace) until
the GPU request reaches `ratio` x cluster GPU capacity, exactly as the simulator's
`tuneUpPods` (it stops at the first draw that would overshoot). Pods only arrive; a pod that
fits nowhere is dropped. After every pod we record arrived GPU (failed pods included), allocated
GPU and the fragment amount w.r.t. the trace's workload; curves average within integer
arrived-% bins (the paper's analysis scripts).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from advisor.fragmentation.fgd import Workload, learn_workload
from advisor.ingest.openb import NodeTable, PodTable
from advisor.placement.base import Policy, place_with_gpus
from advisor.placement.fgd import FragTracker
from advisor.placement.state import ClusterState, PodSpec

DEFAULT_RATIO = 1.3


def arrival_order(pods: PodTable, capacity_milli: int, seed: int, ratio: float) -> np.ndarray:
    """Indices into `pods`: a seeded shuffle, then resampled (or trimmed) to `ratio` x capacity.

    ValueError for a ratio that is not finite and > 0: no draw ever overshoots an infinite or
    NaN target, so the resampling would never end."""
    if not (math.isfinite(ratio) and ratio > 0):
        raise ValueError(f"ratio must be a finite number > 0, got {ratio}")
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(pods))
    total = pods.total_gpu_milli
    target = ratio * capacity_milli
    current = int(total.sum())
    if current > target:
        keep = np.ones(len(order), dtype=bool)
        for j in rng.permutation(len(order)):
            if current <= target:
                break
            keep[j] = False
            current -= int(total[order[j]])
        return order[keep]
    if not total.any():
        return order  # no GPU demand to inflate (resampling would never reach the target)
    per_gpu = pods.gpu_milli * (pods.num_gpu > 0)
    extra: list[np.ndarray] = []
    while True:
        draw = rng.integers(0, len(pods), size=max(1024, len(pods)))
        before = current + np.concatenate(([0], np.cumsum(total[draw])[:-1]))
        over = np.flatnonzero(before + per_gpu[draw] > target)
        if over.size:
            extra.append(draw[: over[0]])
            break
        extra.append(draw)
        current = int(before[-1] + total[draw[-1]])
    return np.concatenate([order, *extra])


def pod_specs(pods: PodTable, index: np.ndarray) -> list[PodSpec]:
    return [
        PodSpec(
            cpu_milli=int(pods.cpu_milli[i]),
            memory_mib=int(pods.memory_mib[i]),
            num_gpu=int(pods.num_gpu[i]),
            gpu_milli=int(pods.gpu_milli[i]) if pods.num_gpu[i] > 0 else 0,
            gpu_spec=str(pods.gpu_spec[i]),
            name=str(pods.name[i]),
        )
        for i in index
    ]


def trace_workload(pods: PodTable) -> Workload:
    """The paper's target workload: the whole trace's task types (an oracle, known in advance)."""
    return learn_workload(pods.cpu_milli, pods.num_gpu, pods.gpu_milli, pods.gpu_spec)


@dataclass
class Curve:
    """Per-pod samples (percent of cluster GPU capacity), then binned by `binned`."""

    arrived_pct: list[float] = field(default_factory=list)
    unallocated_pct: list[float] = field(default_factory=list)
    frag_amount_pct: list[float] = field(default_factory=list)
    frag_rate: list[float] = field(default_factory=list)

    def binned(self) -> dict[str, np.ndarray]:
        """Means within integer arrived-% bins (round(arrived %)), as the paper's scripts; empty
        arrays when no pod arrived (a ratio so small that trimming left nothing)."""
        arrived = np.asarray(self.arrived_pct)
        bins = np.round(arrived).astype(np.int64)
        keys = np.unique(bins)
        out = {"arrived_pct": keys}
        if keys.size == 0:
            empty = np.zeros(0)
            return out | {k: empty for k in ("unallocated_pct", "frag_amount_pct", "frag_rate")}
        for name in ("unallocated_pct", "frag_amount_pct", "frag_rate"):
            values = np.asarray(getattr(self, name))
            sums = np.bincount(bins - keys[0], weights=values)[keys - keys[0]]
            counts = np.bincount(bins - keys[0])[keys - keys[0]]
            out[name] = sums / counts
        return out

    def at(self, arrived_pct: float, name: str = "unallocated_pct") -> float:
        """The binned value at an arrived-% (interpolated if no pod landed in that bin); NaN for
        a curve without arrivals."""
        b = self.binned()
        if b["arrived_pct"].size == 0:
            return math.nan
        return float(np.interp(arrived_pct, b["arrived_pct"], b[name]))


@dataclass
class ReplayResult:
    policy: str
    seed: int
    curve: Curve
    placed: int
    failed: int
    migration_budget: float = 0.0
    migrated_pods: int = 0
    migration_cost_gpu: float = 0.0
    wall_s: float = 0.0

    @property
    def unalloc_100(self) -> float:
        return self.curve.at(100.0)

    @property
    def unalloc_130(self) -> float:
        return self.curve.at(100.0 * DEFAULT_RATIO)


class Replay:
    """One replay run: state, policy, recorder; `step` places one arriving pod."""

    def __init__(
        self,
        nodes: NodeTable,
        policy: Policy,
        workload: Workload,
        seed: int,
    ) -> None:
        self.state = ClusterState.from_nodes(nodes)
        self.capacity = self.state.gpu_capacity_milli
        rng = np.random.default_rng([seed, 1])
        self.rank = rng.permutation(len(self.state))  # the seeded node-name order for ties
        self.policy = policy
        policy.attach(self.state, np.random.default_rng([seed, 2]))
        self.recorder = FragTracker(self.state, workload)
        self.curve = Curve()
        self.arrived = 0
        self.idle = int(self.state.idle.sum())
        self.placed = 0
        self.failed = 0
        # where each placed pod sits (for migrations): pod id -> (node, gpus, spec)
        self.where: dict[int, tuple[int, list[int], PodSpec]] = {}
        self.node_pods: list[set[int]] = [set() for _ in range(len(self.state))]
        self.gpu_pods = np.zeros_like(self.state.gpu_free)  # pods sharing each GPU
        self.rescue: Callable[[int, PodSpec], bool] | None = None
        self.after_arrival: Callable[[], None] | None = None

    def bind(self, pod_id: int, pod: PodSpec, node: int, gpus: list[int]) -> None:
        """Record a placement already applied to the state."""
        self.where[pod_id] = (node, gpus, pod)
        self.node_pods[node].add(pod_id)
        self.gpu_pods[node, gpus] += 1
        self.idle -= pod.total_gpu_milli

    def unbind(self, pod_id: int) -> tuple[int, list[int], PodSpec]:
        """Evict a placed pod (state and records); returns where it was."""
        node, gpus, pod = self.where.pop(pod_id)
        self.node_pods[node].discard(pod_id)
        self.gpu_pods[node, gpus] -= 1
        self.state.release(node, gpus, pod)
        self.idle += pod.total_gpu_milli
        return node, gpus, pod

    def try_place(self, pod_id: int, pod: PodSpec) -> bool:
        node, gpus = place_with_gpus(self.state, self.policy, pod, self.rank)
        if node < 0:
            return False
        self.bind(pod_id, pod, node, gpus)
        return True

    def step(self, pod_id: int, pod: PodSpec) -> bool:
        self.policy.observe(pod)
        self.arrived += pod.total_gpu_milli
        ok = self.try_place(pod_id, pod)
        if not ok and self.rescue is not None:
            ok = self.rescue(pod_id, pod)
        if ok:
            self.placed += 1
        else:
            self.failed += 1
        if self.after_arrival is not None:
            self.after_arrival()
        self.record()
        return ok

    def record(self) -> None:
        cap = self.capacity or 1  # a GPU-less cluster: keep absolute milli, avoid 0/0
        amount = self.recorder.amount
        self.curve.arrived_pct.append(100.0 * self.arrived / cap)
        self.curve.unallocated_pct.append(100.0 * self.idle / cap)
        self.curve.frag_amount_pct.append(100.0 * amount / cap)
        self.curve.frag_rate.append(amount / self.idle if self.idle > 0 else 0.0)


def run_replay(
    nodes: NodeTable,
    pods: PodTable,
    policy: Policy,
    seed: int,
    ratio: float = DEFAULT_RATIO,
    workload: Workload | None = None,
    limit: int | None = None,
    migration_budget: float = 0.0,
) -> ReplayResult:
    """The paper's protocol for one policy and seed (`limit` truncates arrivals, for tests).

    With `migration_budget` > 0 a pod that fits nowhere may be rescued by moving already placed
    pods (at most that fraction of the pods placed so far, in total): our second protocol.
    """
    from advisor.replay.migration import Migrator

    t0 = time.perf_counter()
    workload = workload or trace_workload(pods)
    replay = Replay(nodes, policy, workload, seed)
    migrator = Migrator(replay, migration_budget) if migration_budget > 0 else None
    if migrator is not None:
        replay.rescue = migrator.rescue
        replay.after_arrival = migrator.after_arrival
    order = arrival_order(pods, replay.capacity, seed, ratio)
    if limit is not None:
        order = order[:limit]
    for pod_id, pod in enumerate(pod_specs(pods, order)):
        replay.step(pod_id, pod)
    return ReplayResult(
        policy=policy.name,
        seed=seed,
        curve=replay.curve,
        placed=replay.placed,
        failed=replay.failed,
        migration_budget=migration_budget,
        migrated_pods=migrator.moves if migrator else 0,
        migration_cost_gpu=migrator.cost_gpu if migrator else 0.0,
        wall_s=time.perf_counter() - t0,
    )
