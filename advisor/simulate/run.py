"""One replay per (scheduler, advisor mode, seed), in parallel processes, as plain rows.

Each worker reads the node list and the jobs itself (once per process) and compresses them
to the load, so nothing large crosses process boundaries. A seed sets the order in which
equal scores are broken between nodes (the FGD simulator's seeded node order), and the
random policy's draws; the trace fixes everything else.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from multiprocessing import get_context
from typing import Any

import numpy as np

from advisor.ingest.openb import NodeTable, read_nodes, read_pods
from advisor.placement.state import ClusterState
from advisor.simulate import ADVISOR_MODES
from advisor.simulate.defrag import ConsolidateWhenBlocked, HighNodeUtilization
from advisor.simulate.engine import Controller, Simulation
from advisor.simulate.jobs import JobTable, compress, from_openb, read_job_csv
from advisor.simulate.metrics import allocation_curve, by_size_rows, summary_row
from advisor.simulate.operator import AdvisorOperator
from advisor.simulate.schedulers import make_scheduler


@dataclass(frozen=True)
class Settings:
    load: float = 1.2
    every_s: float = 600.0  # the advisor's (and the defragmenters') period, simulated seconds
    migration_budget: float = 0.01  # moved tasks per task placed that day
    default_restart_s: float = 300.0  # a job's restart time where the jobs do not give one
    backfill: str = "kubernetes"


@dataclass(frozen=True)
class Task:
    nodes_path: str
    jobs_path: str
    jobs_format: str  # "pods" (openb pod list) or "jobs" (the generic job CSV)
    policy: str
    advisor: str
    seed: int
    settings: Settings = field(default_factory=Settings)


@dataclass
class Outcome:
    summary: dict[str, Any]
    by_size: list[dict[str, Any]]
    curve: np.ndarray  # allocation_curve
    waits: np.ndarray  # seconds per started job
    sizes: np.ndarray  # the by-size label of each started job
    wall_s: float
    capacity_gpus: float = 0.0
    advisor_calls: int = 0
    advisor_s: list[float] = field(default_factory=list)
    advisor_cpu_s: list[float] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)


def load_jobs(path: str, fmt: str) -> JobTable:
    return from_openb(read_pods(path)) if fmt == "pods" else read_job_csv(path)


@lru_cache(maxsize=4)
def _inputs(nodes_path: str, jobs_path: str, fmt: str, load: float) -> tuple[NodeTable, JobTable]:
    nodes = read_nodes(nodes_path)
    jobs, _, _ = compress(load_jobs(jobs_path, fmt), load, nodes.total_gpus)
    return nodes, jobs


def make_controller(mode: str, settings: Settings) -> Controller | None:
    if mode == "off":
        return None
    if mode == "on":
        return AdvisorOperator(settings.every_s, settings.default_restart_s)
    if mode == "descheduler":
        return HighNodeUtilization(settings.every_s)
    if mode == "consolidate":
        return ConsolidateWhenBlocked(settings.every_s)
    raise ValueError(f"unknown advisor mode {mode!r}; choose from {', '.join(ADVISOR_MODES)}")


def replay(
    nodes: NodeTable, jobs: JobTable, policy: str, advisor: str, seed: int, settings: Settings
) -> Outcome:
    """One replay of already compressed `jobs` on `nodes`."""
    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    state = ClusterState.from_nodes(nodes)
    scheduler = make_scheduler(policy, jobs)
    scheduler.attach(state, rng)
    rank = rng.permutation(len(nodes))
    controller = make_controller(advisor, settings)
    sim = Simulation(
        jobs,
        state,
        scheduler,
        rank,
        rng,
        backfill=settings.backfill,
        controller=controller,
        migration_budget=settings.migration_budget,
        default_restart_s=settings.default_restart_s,
        racks=nodes.rack,
        pools=nodes.pool,
    )
    sim.run()
    rows = by_size_rows(sim, policy, advisor, seed)
    waits = sim.waits()
    ok = ~np.isnan(waits)
    labels = _labels(jobs)
    outcome = Outcome(
        summary=summary_row(sim, policy, advisor, seed),
        by_size=rows,
        curve=allocation_curve(sim),
        waits=waits[ok],
        sizes=labels[ok],
        wall_s=time.perf_counter() - started,
        capacity_gpus=float(nodes.total_gpus),
    )
    adapter = getattr(controller, "adapter", None)
    if adapter is not None:
        outcome.advisor_calls = adapter.calls
        outcome.advisor_s = list(adapter.seconds)
        outcome.advisor_cpu_s = list(adapter.cpu_seconds)
    stats = getattr(controller, "stats", None)
    if stats is not None:
        outcome.notes = {k: v for k, v in vars(stats).items()}
    outcome.notes["never_fit"] = int(sim.never_fits.sum())
    outcome.notes["reclaimed"] = sim.reclaimed
    return outcome


def _labels(jobs: JobTable) -> np.ndarray:
    from advisor.simulate.metrics import size_label

    share = (jobs.num_nodes == 1) & (jobs.num_gpu == 1) & (jobs.gpu_milli < 1000)
    return np.array(
        [size_label(int(s), bool(h)) for s, h in zip(jobs.size_gpus, share, strict=True)],
        dtype=object,
    )


def run_task(task: Task) -> Outcome:
    nodes, jobs = _inputs(task.nodes_path, task.jobs_path, task.jobs_format, task.settings.load)
    return replay(nodes, jobs, task.policy, task.advisor, task.seed, task.settings)


def run_tasks(
    tasks: list[Task], processes: int = 2, done: Callable[[Outcome], None] | None = None
) -> list[Outcome]:
    """All tasks, `processes` at a time (1 = in this process), in task order; `done` is called
    with each outcome as it comes (in task order)."""
    out: list[Outcome] = []
    if processes <= 1 or len(tasks) <= 1:
        results: Iterable[Outcome] = (run_task(t) for t in tasks)
        for outcome in results:
            out.append(outcome)
            if done:
                done(outcome)
        return out
    with get_context("spawn").Pool(processes) as pool:
        for outcome in pool.imap(run_task, tasks, chunksize=1):
            out.append(outcome)
            if done:
                done(outcome)
    return out
