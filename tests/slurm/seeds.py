"""The examples' seed cases made real in the test cluster: every placed allocation of a seed
snapshot becomes a running `sbatch` job on its node and its GPU indices, with the snapshot's
tenant (account), priority, restart cost (`--comment gpu-defrag.io/restart-cost=`) and
migratable flag (`--no-requeue`).

Slurm hands a job the lowest free GPU indices of the node it runs on, so a job whose first GPU
is not the node's lowest free one gets filler jobs on the gap first, cancelled once everything
runs. Jobs are submitted at Slurm's default (first come, first served) priority, so one
scheduling pass starts them in submission order, and get the snapshot's priority afterwards.
"""

from __future__ import annotations

import math
from collections import defaultdict

from advisor.model import ClusterModel
from tests.slurm.cluster import SlurmCluster


def submit_placed(cluster: SlurmCluster, model: ClusterModel, minutes: int = 60) -> dict[str, str]:
    """Runs the model's placed allocations as Slurm jobs with a `minutes` time limit (so the
    backfill scheduler can plan when the nodes free up); {allocation id: Slurm job id}."""
    allocs, places = model.allocations, model.placements
    gpus_of: dict[int, list[int]] = defaultdict(list)
    for alloc, gpu in zip(places.alloc.tolist(), places.gpu.tolist(), strict=True):
        gpus_of[alloc].append(int(model.gpus.index[gpu]))
    by_node: dict[int, list[int]] = defaultdict(list)
    for row in range(len(allocs)):
        if allocs.node[row] >= 0:
            by_node[int(allocs.node[row])].append(row)
    ids: dict[str, str] = {}
    fillers: list[str] = []
    for node in sorted(by_node):
        name = str(model.nodes.name[node])
        rows = sorted(by_node[node], key=lambda r: min(gpus_of[r]))
        used: set[int] = set()
        for row in rows:
            indices = sorted(gpus_of[row])
            gap = [i for i in range(indices[0]) if i not in used]
            if gap:
                fillers.append(cluster.sbatch("-w", name, f"--gres=gpu:{len(gap)}", "-J", "filler"))
                used.update(gap)
            if indices != list(range(indices[0], indices[0] + len(indices))):
                raise ValueError(f"{allocs.id[row]}: GPUs {indices} are not one run")
            args = ["-w", name, f"--gres=gpu:{len(indices)}", "-J", str(allocs.id[row])]
            args += ["-t", str(minutes)]
            if allocs.tenant[row]:
                args += ["-A", str(allocs.tenant[row])]
            restart = float(allocs.restart_cost_s[row])
            if not math.isnan(restart):
                args += ["--comment", f"gpu-defrag.io/restart-cost={restart:g}s"]
            if not allocs.migratable[row]:
                args.append("--no-requeue")
            ids[str(allocs.id[row])] = cluster.sbatch(*args)
            used.update(indices)
    cluster.wait_running([*ids.values(), *fillers])
    for alloc, job in ids.items():
        priority = int(allocs.priority[allocs.id.tolist().index(alloc)])
        if priority <= 0:  # Slurm's priority 0 is a hold
            raise ValueError(f"{alloc}: priority {priority}: Slurm reads 0 as a hold")
        cluster.run("scontrol", "update", f"jobid={job}", f"priority={priority}")
    if fillers:
        cluster.cancel(*fillers)
    return ids
