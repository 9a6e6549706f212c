"""Run many (policy, seed, migration budget) replays, in parallel processes, as plain rows.

Each worker reads the CSVs itself (once per process) so nothing large crosses process
boundaries; results come back as summary and curve rows ready for `output`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from multiprocessing import get_context

from advisor.ingest.openb import NodeTable, PodTable, read_nodes, read_pods
from advisor.placement import make_policy
from advisor.replay.protocol import DEFAULT_RATIO, run_replay, trace_workload


@dataclass(frozen=True)
class Task:
    nodes_path: str
    pods_path: str
    policy: str
    seed: int
    migration_budget: float = 0.0
    ratio: float = DEFAULT_RATIO


@lru_cache(maxsize=4)
def _tables(nodes_path: str, pods_path: str) -> tuple[NodeTable, PodTable]:
    return read_nodes(nodes_path), read_pods(pods_path)


def run_task(task: Task) -> tuple[dict, list[dict]]:
    """One replay -> (summary row, curve rows)."""
    nodes, pods = _tables(task.nodes_path, task.pods_path)
    workload = trace_workload(pods)
    policy = make_policy(task.policy, workload)
    result = run_replay(
        nodes,
        pods,
        policy,
        task.seed,
        ratio=task.ratio,
        workload=workload,
        migration_budget=task.migration_budget,
    )
    label = policy_label(task.policy, task.migration_budget)
    summary = {
        "policy": label,
        "seed": task.seed,
        "migration_budget": task.migration_budget,
        "migrated_pods": result.migrated_pods,
        "unalloc_100": round(result.unalloc_100, 4),
        "unalloc_130": round(result.curve.at(100.0 * task.ratio), 4),
        "trace": os.path.basename(task.pods_path),
        "placed": result.placed,
        "failed": result.failed,
        "migration_cost_gpu": round(result.migration_cost_gpu, 3),
        "wall_s": round(result.wall_s, 2),
    }
    binned = result.curve.binned()
    curve = [
        {
            "policy": label,
            "seed": task.seed,
            "arrived_pct": int(a),
            "unallocated_gpu_pct": round(float(u), 4),
            "frag_amount_pct": round(float(f), 4),
            "frag_rate": round(float(r), 5),
        }
        for a, u, f, r in zip(
            binned["arrived_pct"],
            binned["unallocated_pct"],
            binned["frag_amount_pct"],
            binned["frag_rate"],
            strict=True,
        )
    ]
    return summary, curve


def policy_label(policy: str, migration_budget: float) -> str:
    """The policy name in CSVs; migration runs carry their budget, e.g. `fgd+mig0.02`."""
    return f"{policy}+mig{migration_budget:g}" if migration_budget > 0 else policy


def run_tasks(
    tasks: list[Task], processes: int = 2, done: Callable[[], None] = lambda: None
) -> tuple[list[dict], list[dict]]:
    """All tasks, `processes` at a time (1 = in this process); rows in task order. `done` is
    called as each task ends (in task order: a progress bar)."""
    results = []
    if processes <= 1 or len(tasks) <= 1:
        for task in tasks:
            results.append(run_task(task))
            done()
    else:
        with get_context("spawn").Pool(processes) as pool:
            for result in pool.imap(run_task, tasks, chunksize=1):
                results.append(result)
                done()
    summaries = [s for s, _ in results]
    curves = [row for _, rows in results for row in rows]
    return summaries, curves
