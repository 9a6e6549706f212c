"""The one place the replay calls the advisor: the run step `gpu-defrag advise` runs.

`AdvisorAdapter.advise(sim, now)` shows the advisor's pipeline (`advisor.pipeline.Pipeline`,
whose `run_once` the service's loop runs every interval: ingest, analysis, forecast, plans)
the simulated cluster as a `ClusterModel`, and returns what that run served: the
recommendations and the forecast documents. The pipeline keeps its own `History`, fed only by
the models this adapter showed it, so its forecasts and learned job ends come from the
replay's past, never its future.

What the model shows (`model_of`): every node and GPU; each running task as an allocation with
its start time (end time unknown, as on a live cluster), tenant, priority, migratable flag and
restart time; each waiting job's tasks as unplaced allocations; a node held for a reservation
as cordoned (unschedulable: no plan moves work onto it), and the GPUs it holds already as that
job's reservation placeholders (qos `RESERVATION_QOS`, as `planner.check` adds them), so the
advisor's next plan for the job renews the reservation from them; per-GPU utilization where the jobs
give one (else unknown); racks and pools where the node list gives them. Without racks the
replay's scheduler places gangs on any nodes, so the advisor's policy turns rack locality
off; with them both keep a gang in one rack.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from advisor.history import History
from advisor.model import (
    ALLOCATION_COLUMNS,
    MILLI,
    RESERVATION_QOS,
    UNKNOWN_ISLAND,
    ClusterModel,
    Gpus,
    Nodes,
    Placements,
    Usage,
    allocations_from_columns,
    object_array,
)
from advisor.pipeline import Pipeline
from advisor.planner.constraints import Policy
from advisor.settings import Settings
from advisor.simulate.engine import RUNNING, WAITING, Simulation

EPOCH = 1767603600.0  # simulated t=0 as unix time: a Monday 09:00 UTC (the sim fleet's epoch)
USAGE_WINDOW_S = 24 * 3600.0  # utilization history the reclaim rule judges (it needs 2 h idle)
HISTORY_POINTS = 20_000  # the service's default (--history.max-points)


@dataclass(frozen=True)
class Advice:
    """What one advisor run served: its plans and forecast documents, and the model it read."""

    recommendations: dict[str, Any]
    forecast: dict[str, Any]
    model: ClusterModel
    error: str = ""


def task_id(name: str, task: int) -> str:
    return f"{name}#{task}"


class AdvisorAdapter:
    """Holds one advisor loop for one replay; `advise` runs it on the cluster at `now`."""

    def __init__(self, sim: Simulation, every_s: float, default_restart_s: float) -> None:
        self.static = _static_columns(sim)
        racks = sim.rack_names is not None
        self.policy = Policy(rack_locality=racks, default_restart_s=default_restart_s)
        self._model: ClusterModel | None = None
        self._clock = EPOCH
        self.pipeline = Pipeline(
            "simulate",
            Settings(policy=self.policy),
            ingest=self._ingest,
            history=History(max_points=HISTORY_POINTS, usage_window_s=USAGE_WINDOW_S),
            clock=lambda: self._clock,
            interval_s=every_s,
        )
        self.calls = 0
        self.seconds: list[float] = []  # wall seconds per call
        self.cpu_seconds: list[float] = []  # CPU seconds per call (a shared machine's load aside)

    def _ingest(self) -> ClusterModel:
        assert self._model is not None
        return self._model

    def advise(self, sim: Simulation, now: float) -> Advice:
        import time

        started, cpu = time.perf_counter(), time.process_time()
        self._model = model_of(sim, now, self.static)
        self._clock = EPOCH + now
        advice = self._run()
        self.calls += 1
        self.seconds.append(time.perf_counter() - started)
        self.cpu_seconds.append(time.process_time() - cpu)
        return advice

    def _run(self) -> Advice:
        state = self.pipeline.run_once()
        results = state.results
        assert self._model is not None
        if results is None or state.stale:
            return Advice({}, {}, self._model, state.last_error or "no results")
        return Advice(
            dict(results.recommendations or {}),
            dict(results.forecast or {}),
            results.model,
            state.last_error,
        )


# --------------------------------------------------------------------------- the model


def _static_columns(sim: Simulation) -> tuple[Nodes, Gpus]:
    """Nodes and GPUs never change in a replay: built once."""
    s = sim.state
    counts = s.n_gpu.astype(np.int64)
    offset = np.zeros(len(s) + 1, dtype=np.int64)
    np.cumsum(counts, out=offset[1:])
    n, g = len(s), int(offset[-1])
    nodes = Nodes(
        name=object_array(str(x) for x in s.names),
        pool=object_array(sim.pool_names or [""] * n),
        rack=object_array(sim.rack_names or [""] * n),
        gpu_model=object_array(s.models[m] for m in s.model),
        cpu_milli=s.cpu_cap.astype(np.float64),
        memory_mib=s.mem_cap.astype(np.float64),
        schedulable=np.ones(n, dtype=bool),
        gpu_offset=offset,
    )
    index = np.concatenate([np.arange(c) for c in counts]) if g else np.zeros(0, dtype=np.int64)
    gpus = Gpus(
        node=np.repeat(np.arange(n, dtype=np.int32), counts),
        index=index.astype(np.int32),
        uuid=object_array([""] * g),
        memory_total_bytes=np.full(g, np.nan),
        healthy=np.ones(g, dtype=bool),
        lost=np.zeros(g, dtype=bool),
        nvlink_island=np.full(g, UNKNOWN_ISLAND, dtype=np.int32),
        mig_enabled=np.zeros(g, dtype=bool),
        carved_milli=np.full(g, MILLI, dtype=np.int32),
        utilization_ratio=np.full(g, np.nan),
        memory_used_bytes=np.full(g, np.nan),
        power_watts=np.full(g, np.nan),
    )
    return nodes, gpus


def model_of(sim: Simulation, now: float, static: tuple[Nodes, Gpus]) -> ClusterModel:
    """The cluster at `now` as the advisor reads a live one (module docstring)."""
    nodes, gpus = static
    jobs = sim.jobs
    offset = nodes.gpu_offset
    rows: dict[str, list[Any]] = {k: [] for k in _ALLOC_KEYS}
    p_alloc: list[int] = []
    p_gpu: list[int] = []
    p_milli: list[int] = []
    util = np.zeros(len(gpus))
    util_known = np.ones(len(gpus), dtype=bool)
    for job in np.flatnonzero(sim.status == RUNNING).tolist():
        spec = sim.specs[job]
        u = float(jobs.utilization[job])
        for task, (node, task_gpus) in enumerate(sim.placement[job] or []):
            row = len(rows["id"])
            _add(rows, sim, job, task, node, float(sim.start[job]))
            for gpu in task_gpus:
                r = int(offset[node]) + gpu
                p_alloc.append(row)
                p_gpu.append(r)
                p_milli.append(spec.gpu_milli)
                if math.isnan(u):
                    util_known[r] = False
                else:
                    util[r] += u * spec.gpu_milli / MILLI
    for job in sim.queue.jobs_waiting():
        if sim.status[job] != WAITING:
            continue
        for task in range(int(jobs.num_nodes[job])):
            _add(rows, sim, job, task, -1, math.nan)
    for job, reservation in sim.reservations.items():
        by_node: dict[int, list[int]] = {}
        for node, gpu in sorted(reservation.held):
            by_node.setdefault(node, []).append(gpu)
        for node, held in by_node.items():
            row = len(rows["id"])
            _add_hold(rows, sim, job, node, len(held))
            for gpu in held:
                p_alloc.append(row)
                p_gpu.append(int(offset[node]) + gpu)
                p_milli.append(MILLI)
    rows["scheduled_time"] = rows["start_time"]
    allocations = allocations_from_columns(rows)
    known = bool((~np.isnan(jobs.utilization)).any())
    gpu_util = (
        np.where(util_known, np.minimum(util, 1.0), np.nan) if known else gpus.utilization_ratio
    )
    gpu_cols = Gpus(**{**gpus.__dict__, "utilization_ratio": gpu_util})
    # a node held for a reservation is cordoned, as `kubectl cordon` shows it: unschedulable
    node_cols = Nodes(**{**nodes.__dict__, "schedulable": sim.fence < 0})
    return ClusterModel(
        node_cols,
        gpu_cols,
        allocations,
        Placements(
            alloc=np.array(p_alloc, dtype=np.int32),
            gpu=np.array(p_gpu, dtype=np.int32),
            milli=np.array(p_milli, dtype=np.int32),
        ),
        Usage.empty(len(gpus)),
        timestamp=EPOCH + now,
        source="simulate",
    )


# the columns a row gives (`allocations_from_columns` fills the others: no end time is known,
# scheduled is the start, no limit)
_ALLOC_KEYS = tuple(
    k for k in ALLOCATION_COLUMNS if k not in ("deletion_time", "scheduled_time", "gpu_limit_milli")
)


def _add(
    rows: dict[str, list[Any]], sim: Simulation, job: int, task: int, node: int, start: float
) -> None:
    jobs = sim.jobs
    spec = sim.specs[job]
    name = str(jobs.name[job])
    rows["id"].append(task_id(name, task))
    rows["job"].append(name)
    rows["tenant"].append(str(jobs.tenant[job]))
    rows["priority"].append(int(jobs.priority[job]))
    rows["num_gpu"].append(spec.num_gpu)
    rows["gpu_milli"].append(spec.gpu_milli)
    rows["cpu_milli"].append(float(spec.cpu_milli))
    rows["memory_mib"].append(float(spec.memory_mib))
    rows["gpu_spec"].append(spec.gpu_spec)
    rows["node"].append(node)
    rows["start_time"].append(EPOCH + start if not math.isnan(start) else math.nan)
    rows["creation_time"].append(EPOCH + float(jobs.submit_s[job]))
    rows["migratable"].append(bool(jobs.migratable[job]))
    rows["restart_cost_s"].append(float(jobs.restart_s[job]))  # NaN: the policy default
    rows["qos"].append("")


def _add_hold(rows: dict[str, list[Any]], sim: Simulation, job: int, node: int, gpus: int) -> None:
    """The placeholder of `job`'s reservation holding `gpus` GPUs of `node`."""
    name = str(sim.jobs.name[job])
    row = {
        "id": f"reserve:{name}:{sim.state.names[node]}",
        "job": name,
        "tenant": str(sim.jobs.tenant[job]),
        "priority": int(sim.jobs.priority[job]),
        "num_gpu": gpus,
        "gpu_milli": MILLI,
        "cpu_milli": 0.0,
        "memory_mib": 0.0,
        "gpu_spec": "",
        "node": node,
        "start_time": math.nan,
        "creation_time": math.nan,
        "migratable": False,
        "restart_cost_s": math.nan,
        "qos": RESERVATION_QOS,
    }
    for key in _ALLOC_KEYS:
        rows[key].append(row[key])
