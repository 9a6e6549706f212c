"""A lower bound on unallocated GPU at 100 % arrival that no placement or migration can beat.

The replay's arrivals are fixed by the seed, whatever the policy, and without departures the
placed amount only grows, so unallocated GPU in the 100 % bin is at least cap − the most any
placement could hold of the pods arrived by the bin's end. We relax the cluster to its GPUs
alone: no CPU, memory, node boundaries or GPU models, each GPU a bin of 1000 milli, a k-GPU pod
k separate items (it may even be placed in part). What is left is one-dimensional bin packing,
and its arc-flow linear relaxation (Valério de Carvalho, 1999: positions 0 … 1000 milli on one
GPU, an arc per pod size that fits from each position, at most `gpus` paths, at most the
arrived count of each size) bounds the packed amount from above. HiGHS solves it in
milliseconds (SciPy's copy: highspy's clashes with OR-Tools' in one process). The LP optimum is
itself a valid bound; no integrality is needed.

On the default trace the slivers dominate: about 1,100 pods of 810 milli arrive by 100 %, no two
fit on one GPU, and only the ~100 pods of <= 190 milli fit beside one.

    python -m advisor.replay.floor NODES_CSV PODS_CSV [SEED ...]
"""

from __future__ import annotations

import sys
from collections import Counter

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from advisor.ingest.openb import PodTable, read_nodes, read_pods
from advisor.model import MILLI
from advisor.replay.protocol import DEFAULT_RATIO, arrival_order

BIN_HALF_WIDTH = 0.5  # curves average within round(arrived %) bins; numpy rounds 100.5 to 100


def arrived_by(
    pods: PodTable, gpus: int, seed: int, arrived_pct: float, ratio: float = DEFAULT_RATIO
) -> np.ndarray:
    """Indices of the pods (in arrival order) whose arrival keeps arrived GPU at or below `arrived_pct`."""
    cap = gpus * MILLI
    order = arrival_order(pods, cap, seed, ratio)
    cum = np.cumsum(pods.total_gpu_milli[order])
    return order[: int(np.searchsorted(cum, cap * arrived_pct / 100.0, side="right"))]


def max_packed_milli(sizes: Counter[int], gpus: int) -> float:
    """Upper bound on the milli-GPU that `gpus` bins of 1000 can hold of items {size: count}.

    Arc-flow LP over positions in units of the sizes' greatest common divisor.
    """
    sizes = Counter({s: n for s, n in sizes.items() if 0 < s <= MILLI and n > 0})
    if not sizes or gpus <= 0:
        return 0.0
    unit = int(np.gcd.reduce([*sizes, MILLI]))
    top = MILLI // unit
    kinds = sorted(sizes)
    # columns: item arcs (a -> a + s) for every size and start, loss arcs (a -> a + 1), paths z
    tails, heads, kind = [], [], []
    for a in range(top):
        for i, s in enumerate(kinds):
            if a + s // unit <= top:
                tails.append(a)
                heads.append(a + s // unit)
                kind.append(i)
        tails.append(a)
        heads.append(a + 1)
        kind.append(-1)
    n_arcs = len(tails)
    n_rows = top + 1 + len(kinds)
    # rows 0..top: flow conservation (out − in, with the paths z leaving 0 and entering top);
    # rows top+1..: arcs of each size ≤ the arrived count of that size
    arc = np.arange(n_arcs)
    sized = np.flatnonzero(np.asarray(kind) >= 0)
    row = np.concatenate([tails, heads, top + 1 + np.asarray(kind)[sized], [0, top]])
    col = np.concatenate([arc, arc, sized, [n_arcs, n_arcs]])
    val = np.concatenate([np.ones(n_arcs), -np.ones(n_arcs), np.ones(sized.size), [-1.0, 1.0]])
    a = coo_matrix((val, (row, col)), shape=(n_rows, n_arcs + 1)).tocsr()
    gain = np.array([kinds[k] if k >= 0 else 0 for k in kind] + [0], dtype=float)
    bounds = [(0, None)] * n_arcs + [(0, gpus)]
    res = linprog(
        -gain,  # linprog minimises
        A_eq=a[: top + 1],
        b_eq=np.zeros(top + 1),
        A_ub=a[top + 1 :],
        b_ub=np.array([sizes[s] for s in kinds], dtype=float),
        bounds=bounds,
        method="highs",
    )
    if res.status != 0:
        raise RuntimeError(f"packing bound LP not solved: {res.message}")
    return float(-res.fun)


def pod_items(pods: PodTable, index: np.ndarray) -> Counter[int]:
    """GPU items of the pods: a k-GPU pod is k items of its per-GPU milli (CPU-only pods none)."""
    k, d = pods.num_gpu[index], pods.gpu_milli[index]
    items: Counter[int] = Counter()
    for size, count in zip(d[k > 0].tolist(), k[k > 0].tolist(), strict=True):
        items[int(size)] += int(count)
    return items


def packing_floor_pct(
    pods: PodTable,
    gpus: int,
    seed: int,
    arrived_pct: float = 100.0 + BIN_HALF_WIDTH,
    ratio: float = DEFAULT_RATIO,
) -> float:
    """Lower bound (% of capacity) on unallocated GPU while arrivals stay at or below `arrived_pct`.

    The default covers the whole 100 % bin, so it bounds the replay's `unalloc_100`.
    """
    cap = gpus * MILLI
    if cap == 0:
        return 0.0
    items = pod_items(pods, arrived_by(pods, gpus, seed, arrived_pct, ratio))
    return 100.0 * max(0.0, cap - max_packed_milli(items, gpus)) / cap


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if len(args) < 2:
        print(__doc__)
        return 2
    nodes, pods = read_nodes(args[0]), read_pods(args[1])
    seeds = [int(s) for s in args[2:]] or list(range(42, 52))
    values = [packing_floor_pct(pods, nodes.total_gpus, s) for s in seeds]
    for s, v in zip(seeds, values, strict=True):
        print(f"seed {s}: unallocated GPU at 100 % >= {v:.2f} %")
    print(f"mean {np.mean(values):.2f} %  (min {min(values):.2f}, max {max(values):.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
