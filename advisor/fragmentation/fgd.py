"""The FGD fragmentation measure, exactly as the paper's simulator defines it.

Weng et al., "Beware of Fragmentation" (USENIX ATC'23), simulator
hkust-adsl/kubernetes-scheduler-simulator `pkg/utils/frag.go`. A node's fragment amount is the
expected idle GPU milli that a task drawn from the workload cannot use on that node:

- for a task type m that fits the node (GPU model allowed, >= k_m GPUs with >= d_m milli free,
  CPU >= c_m) the fragment is the idle milli on GPUs with less than d_m free;
- for any other type (lacks GPU, lacks CPU, wrong model, or a CPU-only type) all idle milli on
  the node is fragment;
- F_n(M) = sum_m p_m F_n(m); the cluster amount is sum_n F_n(M) and the rate is amount / idle.

State is plain arrays: `gpu_free` (nodes x max GPUs per node, milli, padded with 0 for GPUs a
node does not have: a 0 slot never fits a GPU task and adds nothing to idle), `cpu_free`
(milli), `model` (index into a list of model names). Everything here is pure; the replay keeps
per-node statistics (`type_stats`) so that a placement only recomputes one node.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

DEFAULT_POPULARITY_THRESHOLD = 95  # the paper's runs (scripts/generate_config_and_run.py)
DEFAULT_INCREASE_STEP = 1

Shape = tuple[int, int, int, str]  # (cpu_milli, gpu_milli per GPU, num_gpu, gpu_spec)


def spec_allows(spec: str, model: str) -> bool:
    """Whether a pod's `gpu_spec` ("A|B", "" = any) admits a node's GPU model ("" = no GPU)."""
    wanted = [s for s in spec.split("|") if s]
    if not wanted:
        return True
    if not model:
        return False
    return model in wanted


@dataclass(frozen=True)
class Workload:
    """Task types (shapes) with popularity p_m summing to 1: the target workload M."""

    cpu_milli: np.ndarray  # (M,) int64
    gpu_milli: np.ndarray  # (M,) int64, per GPU; 0 for CPU-only types
    num_gpu: np.ndarray  # (M,) int64
    gpu_spec: tuple[str, ...]  # (M,) allowed models, "" = any
    popularity: np.ndarray  # (M,) float64

    def __len__(self) -> int:
        return len(self.popularity)

    @classmethod
    def from_shapes(cls, shapes: Sequence[Shape], popularity: Sequence[float]) -> Workload:
        p = np.asarray(popularity, dtype=np.float64)
        if len(shapes) != len(p) or len(p) == 0:
            raise ValueError("a workload needs one popularity per shape and at least one shape")
        if (p < 0).any() or not np.isclose(p.sum(), 1.0):
            raise ValueError(f"popularity must be >= 0 and sum to 1, got sum {p.sum():.6f}")
        return cls(
            cpu_milli=np.array([s[0] for s in shapes], dtype=np.int64),
            gpu_milli=np.array([s[1] for s in shapes], dtype=np.int64),
            num_gpu=np.array([s[2] for s in shapes], dtype=np.int64),
            gpu_spec=tuple(s[3] for s in shapes),
            popularity=p,
        )

    @property
    def shapes(self) -> list[Shape]:
        return [
            (int(c), int(d), int(k), s)
            for c, d, k, s in zip(
                self.cpu_milli, self.gpu_milli, self.num_gpu, self.gpu_spec, strict=True
            )
        ]

    @property
    def is_gpu(self) -> np.ndarray:
        return self.gpu_milli > 0

    def access(self, models: Sequence[str]) -> np.ndarray:
        """(M, len(models)) bool: may type m run on a node of model j."""
        return np.array(
            [[spec_allows(spec, m) for m in models] for spec in self.gpu_spec], dtype=bool
        ).reshape(len(self), len(models))


def pod_shapes(
    cpu_milli: Iterable[int],
    num_gpu: Iterable[int],
    gpu_milli: Iterable[int],
    gpu_spec: Iterable[str],
) -> list[Shape]:
    """The simulator's PodResource key of each pod (CPU-only pods have gpu_milli 0).

    A CPU request of 0 counts as 100 milli, as kube-scheduler's GetNonzeroRequests does.
    """
    return [
        (int(c) if int(c) > 0 else 100, int(d) if int(k) > 0 else 0, int(k), str(s))
        for c, k, d, s in zip(cpu_milli, num_gpu, gpu_milli, gpu_spec, strict=True)
    ]


def workload_from_counts(
    counts: dict[Shape, float],
    threshold_pct: float = DEFAULT_POPULARITY_THRESHOLD,
    step: int = DEFAULT_INCREASE_STEP,
) -> Workload:
    """Keep the most popular types until they cover `threshold_pct`% of pods, renormalise.

    Mirrors `GetTypicalPods`: sort by count descending, ties by the shape descending (cpu, gpu
    milli, gpu count, spec), add `step` types at a time until the cumulative count reaches the
    threshold.
    """
    items = [(s, float(c)) for s, c in counts.items() if c > 0]
    if not items:
        raise ValueError("cannot learn a workload from zero pods")
    items.sort(key=lambda sc: (sc[1], sc[0][0], sc[0][1], sc[0][2], sc[0][3]), reverse=True)
    total = sum(c for _, c in items)
    target = threshold_pct * total / 100.0
    kept = 0
    cum = 0.0
    while cum < target and kept < len(items):
        upto = min(kept + max(step, 1), len(items))
        cum += sum(c for _, c in items[kept:upto])
        kept = upto
    chosen = items[:kept]
    denom = sum(c for _, c in chosen)
    return Workload.from_shapes([s for s, _ in chosen], [c / denom for _, c in chosen])


def learn_workload(
    cpu_milli: Iterable[int],
    num_gpu: Iterable[int],
    gpu_milli: Iterable[int],
    gpu_spec: Iterable[str],
    threshold_pct: float = DEFAULT_POPULARITY_THRESHOLD,
    step: int = DEFAULT_INCREASE_STEP,
    include_cpu: bool = True,
) -> Workload:
    """The workload of a whole trace, as the paper's runs compute it (an oracle in advance)."""
    shapes = pod_shapes(cpu_milli, num_gpu, gpu_milli, gpu_spec)
    if not include_cpu:
        shapes = [s for s in shapes if s[2] > 0]
    return workload_from_counts(dict(Counter(shapes)), threshold_pct, step)


class OnlineWorkload:
    """The workload learned from the arrivals seen so far (no look-ahead).

    `observe` counts one arrival; `workload()` applies the same popularity cut as the paper.
    `decay` < 1 forgets old arrivals geometrically, for traces whose mix drifts.
    """

    def __init__(
        self,
        threshold_pct: float = DEFAULT_POPULARITY_THRESHOLD,
        step: int = DEFAULT_INCREASE_STEP,
        decay: float = 1.0,
    ) -> None:
        self.threshold_pct = threshold_pct
        self.step = step
        self.decay = decay
        self.counts: dict[Shape, float] = {}
        self.seen = 0

    def observe(self, shape: Shape) -> None:
        if self.decay < 1.0:
            for key in self.counts:
                self.counts[key] *= self.decay
        self.counts[shape] = self.counts.get(shape, 0.0) + 1.0
        self.seen += 1

    def workload(self) -> Workload:
        return workload_from_counts(self.counts, self.threshold_pct, self.step)


def type_stats(gpu_free: np.ndarray, workload: Workload) -> tuple[np.ndarray, np.ndarray]:
    """Per node and GPU type m: (# GPUs with >= d_m free, idle milli on GPUs with < d_m free).

    Shapes (N, M). CPU-only types get zeros (they are handled by `fragment_from_stats`).
    """
    g = np.asarray(gpu_free, dtype=np.int64)
    d = workload.gpu_milli
    fits = g[:, None, :] >= d[None, :, None]  # (N, M, G)
    cnt = fits.sum(axis=2)
    low = np.where(fits, 0, g[:, None, :]).sum(axis=2)
    cpu_types = d == 0
    cnt[:, cpu_types] = 0
    low[:, cpu_types] = 0
    return cnt, low


def fragment_by_type_from_stats(
    cnt: np.ndarray,
    low: np.ndarray,
    idle: np.ndarray,
    cpu_free: np.ndarray,
    model: np.ndarray,
    workload: Workload,
    access: np.ndarray,
) -> np.ndarray:
    """F_n(m) for every node n and type m, shape (N, M), from `type_stats` output."""
    satisfied = (
        (workload.gpu_milli[None, :] > 0)
        & access.T[model]  # (N, M)
        & (cnt >= workload.num_gpu[None, :])
        & (cpu_free[:, None] >= workload.cpu_milli[None, :])
    )
    return np.where(satisfied, low, idle[:, None]).astype(np.float64)


def fragment_from_stats(
    cnt: np.ndarray,
    low: np.ndarray,
    idle: np.ndarray,
    cpu_free: np.ndarray,
    model: np.ndarray,
    workload: Workload,
    access: np.ndarray,
) -> np.ndarray:
    """F_n(M) = sum_m p_m F_n(m), shape (N,)."""
    per_type = fragment_by_type_from_stats(cnt, low, idle, cpu_free, model, workload, access)
    return per_type @ workload.popularity


def node_fragment_by_type(
    gpu_free: np.ndarray,
    cpu_free: np.ndarray,
    model: np.ndarray,
    workload: Workload,
    access: np.ndarray,
) -> np.ndarray:
    """F_n(m) in milli-GPU, shape (nodes, types)."""
    g = np.atleast_2d(np.asarray(gpu_free, dtype=np.int64))
    cnt, low = type_stats(g, workload)
    idle = g.sum(axis=1)
    return fragment_by_type_from_stats(
        cnt, low, idle, np.asarray(cpu_free), np.asarray(model), workload, access
    )


def node_fragment(
    gpu_free: np.ndarray,
    cpu_free: np.ndarray,
    model: np.ndarray,
    workload: Workload,
    access: np.ndarray,
) -> np.ndarray:
    """F_n(M): expected idle milli-GPU on each node that a typical task cannot use."""
    return node_fragment_by_type(gpu_free, cpu_free, model, workload, access) @ workload.popularity


@dataclass(frozen=True)
class ClusterFragment:
    amount: float  # milli-GPU
    idle: float  # milli-GPU
    capacity: float  # milli-GPU

    @property
    def rate(self) -> float:
        """Share of idle GPU that is fragment (0..1); 0 when nothing is idle."""
        return self.amount / self.idle if self.idle > 0 else 0.0

    @property
    def amount_pct(self) -> float:
        """Fragment amount as % of cluster GPU capacity (the paper's Fig. 7a)."""
        return 100.0 * self.amount / self.capacity if self.capacity > 0 else 0.0


def cluster_fragment(
    gpu_free: np.ndarray,
    cpu_free: np.ndarray,
    model: np.ndarray,
    workload: Workload,
    access: np.ndarray,
    capacity_milli: float,
) -> ClusterFragment:
    """Cluster fragment amount, idle and rate (`ClusterGpuFragReport`)."""
    f = node_fragment(gpu_free, cpu_free, model, workload, access)
    idle = float(np.asarray(gpu_free).sum())
    return ClusterFragment(float(f.sum()), idle, float(capacity_milli))
