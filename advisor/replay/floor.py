"""A lower bound on unallocated GPU at 100 % arrival that no placement or migration can beat.

Relaxation: ignore CPU, memory, node boundaries and GPU models; every GPU is a bin of 1000
milli. Whole-GPU pods fill their bins exactly, so at best they all run; the remaining bins take
sharing pods. A sharing pod of d milli with 1000 - d below the smallest other sharing request
leaves a sliver only pods of at most 1000 - d can fill (on the default trace: 0.81-GPU pods,
1,078 of 8,152, leave 190 milli that only the ~100 pods of <= 190 milli fit). Packing every other
sharing pod perfectly, the bins left get one such pod each, and their slivers (minus what the
small pods fill) stay idle. The bound is optimistic for the packer, so real policies sit above.

    python -m advisor.replay.floor NODES_CSV PODS_CSV [SEED ...]
"""

from __future__ import annotations

import math
import sys

import numpy as np

from advisor.ingest.openb import PodTable, read_nodes, read_pods
from advisor.replay.protocol import arrival_order

MILLI = 1000


def sliver_floor_pct(pods: PodTable, gpus: int, seed: int, sliver_pod_milli: int = 810) -> float:
    """Lower bound (% of capacity) on unallocated GPU once arrivals reach 100 % of capacity."""
    cap = gpus * MILLI
    order = arrival_order(pods, cap, seed, ratio=1.3)
    cum = np.cumsum(pods.total_gpu_milli[order])
    arrived = order[: int(np.searchsorted(cum, cap, side="right"))]
    k, d = pods.num_gpu[arrived], pods.gpu_milli[arrived]
    whole_gpus = int((k * (d == MILLI)).sum())
    share = d[(k == 1) & (d < MILLI)]
    sliver = MILLI - sliver_pod_milli
    n_sliver = int((share == sliver_pod_milli).sum())
    fillers = int(share[share <= sliver].sum())
    others = int(share[share != sliver_pod_milli].sum())
    bins = gpus - whole_gpus - math.ceil(others / MILLI)
    packed = max(0, min(n_sliver, bins))
    return 100.0 * max(0, packed * sliver - fillers) / cap


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if len(args) < 2:
        print(__doc__)
        return 2
    nodes, pods = read_nodes(args[0]), read_pods(args[1])
    seeds = [int(s) for s in args[2:]] or list(range(42, 52))
    values = [sliver_floor_pct(pods, nodes.total_gpus, s) for s in seeds]
    for s, v in zip(seeds, values, strict=True):
        print(f"seed {s}: unallocated GPU at 100 % >= {v:.2f} %")
    print(f"mean {np.mean(values):.2f} %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
