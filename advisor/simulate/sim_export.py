"""The simulated fleet's workload as a node list and a generic job CSV, for `gpu-defrag simulate`.

`export(spec, days)` draws the jobs that arrive at a `sim:PRESET[?seed=&nodes=]` fleet over its
first `days` (the same draws the live simulation makes: its daily rhythm, its job kinds, and
multi-node training jobs of 16 and 32 GPUs where the pool is large enough), and its nodes:

- jobs: one row per job, `submit_time` its arrival, `duration_s` its run time, a fraction of a
  GPU as one GPU at `gpu_milli`, a job larger than a node as whole nodes (`num_nodes` x
  `gpus_per_node`), `gpu_model` the GPU model of its pool, `priority` and `migratable` its
  kind's (training 100 and batch 50 move; notebooks 10 and inference 1000 do not), and
  `utilization` its mean GPU utilization (its level while busy times the share of hours it is
  busy; stalled jobs about 0). Restart times are not modelled: left empty (the replay's
  default applies). Jobs running at t=0 (the fleet's warm start) are not arrivals: the replay
  starts empty.
- nodes: the openb node columns plus `rack` and `pool`; MIG nodes are left out (their GPUs are
  carved for inference outside the job mix). The simulated fleet has no CPU or memory model, so
  every node gets `NODE_CPU_MILLI` and `NODE_MEMORY_MIB` and jobs ask for none: they never bind.
"""

from __future__ import annotations

import csv
import io
import math

import numpy as np

from advisor.ingest.sources import sim_fleet
from advisor.model import MILLI
from advisor.simulate.jobs import JobTable

HOUR = 3600.0
NODE_CPU_MILLI = 256_000
NODE_MEMORY_MIB = 2 * 1024 * 1024
MAX_DAYS = 365


def export(spec: str, days: float) -> tuple[str, JobTable]:
    """(node list CSV text, jobs) of `sim:PRESET[?seed=&nodes=]` over its first `days`."""
    from gpu_defrag_sim.workload import KIND_BY_NAME

    if not (math.isfinite(days) and 0 < days <= MAX_DAYS):
        raise ValueError(f"--days must be above 0 and at most {MAX_DAYS}, got {days:g}")
    fleet, _ = sim_fleet(spec, {"seed", "nodes"}, why="does not apply to an exported workload")
    nodes = [n for n in fleet.spec.nodes if not n.mig]
    model_of_pool = {n.pool: n.model.name for n in nodes}
    per_node = fleet.gpus_per_node
    rows = []
    for pool, req in fleet.arrivals(math.ceil(days * 24)):
        if req.arrival >= days * 24 * HOUR or pool not in model_of_pool:
            continue
        kind = KIND_BY_NAME[req.kind]
        if req.gpus < 1:
            tasks, gpus, milli = 1, 1, round(req.gpus * MILLI)
        elif req.gpus <= per_node:
            tasks, gpus, milli = 1, round(req.gpus), MILLI
        else:
            tasks, gpus, milli = math.ceil(req.gpus / per_node), per_node, MILLI
        rows.append(
            (
                f"{req.kind}-{req.seed & 0xFFFFFFFFFF:010x}",
                req.arrival,
                req.duration,
                tasks,
                gpus,
                milli,
                model_of_pool[pool],
                req.tenant,
                kind.priority,
                req.util * (1.0 - req.idle_prob),
                kind.migratable,
            )
        )
    n = len(rows)
    col = list(zip(*rows, strict=True)) if rows else [()] * 11
    jobs = JobTable(
        name=np.array(col[0], dtype=object),
        submit_s=np.array(col[1], dtype=np.float64),
        duration_s=np.array(col[2], dtype=np.float64),
        num_nodes=np.array(col[3], dtype=np.int64),
        num_gpu=np.array(col[4], dtype=np.int64),
        gpu_milli=np.array(col[5], dtype=np.int64),
        cpu_milli=np.zeros(n, dtype=np.int64),
        memory_mib=np.zeros(n, dtype=np.int64),
        gpu_spec=np.array(col[6], dtype=object),
        tenant=np.array(col[7], dtype=object),
        priority=np.array(col[8], dtype=np.int64),
        utilization=np.array(col[9], dtype=np.float64),
        restart_s=np.full(n, np.nan),
        migratable=np.array(col[10], dtype=bool),
        source=spec,
    )
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["sn", "cpu_milli", "memory_mib", "gpu", "model", "rack", "pool"])
    for node in nodes:
        writer.writerow(
            [
                node.name,
                NODE_CPU_MILLI,
                NODE_MEMORY_MIB,
                node.board.gpus,
                node.model.name,
                node.rack,
                node.pool,
            ]
        )
    return out.getvalue(), jobs
