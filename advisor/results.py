"""What one advisor run produced, and the pure functions that derive its tables from a model.

`/metrics`, the JSON API and the app read the same `Results`, so a number on a dashboard, in
the API and on a page can never disagree. Everything here is a pure function of the cluster
model and the `measures.analyze` result; the pipeline (`advisor.pipeline`) does the I/O and the
timing.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from advisor.fragmentation import measures
from advisor.fragmentation.measures import Shape
from advisor.model import MILLI, ClusterModel, spec_models
from advisor.settings import NO_POOL

STAGES: tuple[str, ...] = ("ingest", "analyze", "forecast", "plan")


def shape_label(shape: Shape) -> str:
    """The contract's shape label: `fractional`, `1`…`8` (GPUs on one node) or `KxG`."""
    if shape.gpu_milli < MILLI:
        return "fractional"
    base = f"{shape.tasks}x{shape.num_gpu}" if shape.tasks > 1 else str(shape.num_gpu)
    return base + (f"@{shape.gpu_spec}" if shape.gpu_spec else "")


def pool_names(model: ClusterModel) -> np.ndarray:
    """object (N): each node's pool, `(none)` where the source names none."""
    pools = model.nodes.pool.astype(object)
    return np.where(pools == "", NO_POOL, pools)


def idle_power_watts(model: ClusterModel, idle: np.ndarray, on_gpu: np.ndarray) -> float | None:
    """Observed power of the allocated-but-idle GPUs in `on_gpu`: the rate at which they waste
    energy. None when none of them has a power reading (unknown is not zero)."""
    watts = model.gpus.power_watts[on_gpu & idle]
    watts = watts[np.isfinite(watts)]
    return float(watts.sum()) if watts.size else None


def pool_table(
    model: ClusterModel, analysis: dict[str, Any], idle: np.ndarray
) -> list[dict[str, Any]]:
    """Per pool: GPUs, healthy and free GPUs, FGD fragment and rate, idle, stranded memory.

    The FGD rate of a pool is its fragment amount over its free capacity, the same ratio the
    cluster-wide `fgd.fragment_rate` is, restricted to the pool's nodes.
    """
    nodes = analysis["nodes"]
    pools = pool_names(model)
    gpu_pool = pools[model.gpus.node]
    healthy = model.gpus.healthy & ~model.gpus.lost
    rows = []
    for pool in sorted(set(pools.tolist())):
        on_node = pools == pool
        on_gpu = gpu_pool == pool
        fragment = float(nodes["fgd_fragment_gpus"][on_node].sum())
        free_capacity = float(nodes["free_capacity_gpus"][on_node].sum())
        rows.append(
            {
                "pool": pool,
                "nodes": int(on_node.sum()),
                "gpus": int(on_gpu.sum()),
                "healthy_gpus": int((on_gpu & healthy).sum()),
                "free_gpus": int((on_gpu & model.gpu_is_free).sum()),
                "free_capacity_gpus": free_capacity,
                "allocated_gpus": float(model.gpu_milli_allocated[on_gpu].sum()) / MILLI,
                "fragmented_gpus": fragment,
                "fragmentation_ratio": fragment / free_capacity if free_capacity > 0 else 0.0,
                "allocated_idle_gpus": int(nodes["allocated_idle_gpus"][on_node].sum()),
                "owner_unknown_gpus": int((on_gpu & healthy & model.gpu_owner_unknown).sum()),
                "allocated_idle_power_watts": idle_power_watts(model, idle, on_gpu),
                "stranded_memory_bytes": float(nodes["stranded_memory_bytes"][on_node].sum()),
            }
        )
    return rows


def type_table(model: ClusterModel, idle: np.ndarray) -> list[dict[str, Any]]:
    """Per GPU model: idle supply (free capacity + the share allocated on allocated-idle GPUs:
    a partly used idle GPU's free part is in the free capacity already) against demand (GPUs
    allocated + pending work; a pending task allowing several models is split evenly among
    the allowed models in the fleet, one allowing any model among all of them)."""
    gpu_model = model.nodes.gpu_model[model.gpus.node]
    names = sorted(set(gpu_model.tolist()))
    allocs = model.allocations
    pending: dict[str, float] = defaultdict(float)
    need = allocs.num_gpu * allocs.gpu_milli / MILLI
    for row in np.flatnonzero(allocs.node < 0).tolist():
        spec = str(allocs.gpu_spec[row])
        allowed = spec_models(spec, names)
        for name in allowed:
            pending[name] += float(need[row]) / len(allowed)
    rows = []
    for name in names:
        on = gpu_model == name
        free_capacity = float(model.gpu_free_milli[on].sum()) / MILLI
        allocated = float(model.gpu_milli_allocated[on].sum()) / MILLI
        idle_held = float(model.gpu_milli_allocated[on & idle].sum()) / MILLI
        rows.append(
            {
                "gpu_model": name,
                "gpus": int(on.sum()),
                "free_capacity_gpus": free_capacity,
                "allocated_idle_gpus": int((on & idle).sum()),
                "idle_capacity_gpus": free_capacity + idle_held,
                "allocated_gpus": allocated,
                "pending_gpus": pending.get(name, 0.0),
                "demand_gpus": allocated + pending.get(name, 0.0),
            }
        )
    return rows


def shape_table(analysis: dict[str, Any], shapes: tuple[Shape, ...]) -> list[dict[str, Any]]:
    """Per shape (contract labels): GPUs per job, jobs that could start now, stranded GPUs."""
    rows = []
    for shape, measured in zip(shapes, analysis["spatial"]["shapes"], strict=True):
        rows.append(
            {
                "shape": shape_label(shape),
                "gpus_per_job": float(shape.gpus),
                "schedulable_jobs": int(measured["jobs_that_fit"]),
                "stranded_gpus": measured["stranded_gpus"],
                "crosses_nvlink_islands": measured["crosses_nvlink_islands"],
            }
        )
    return rows


def pool_shape_table(model: ClusterModel, shapes: tuple[Shape, ...]) -> list[dict[str, Any]]:
    """Per pool and shape: jobs that could start now in that pool alone, and the pool's free
    whole GPUs no such job can use (None for a fractional shape). A pool is a scheduling
    domain: a job is placed in one, so a pool whose free GPUs are scattered shows here even
    when another pool could take the job."""
    pools = pool_names(model)
    free = measures.free_whole_per_node(model)
    free_in = {pool: int(free[pools == pool].sum()) for pool in set(pools.tolist())}
    rows = []
    for shape in shapes:
        fits = measures.jobs_that_fit_by_part(model, shape, pools)
        whole = shape.gpu_milli == MILLI
        for pool, fit in fits.items():
            free_whole = free_in[pool]
            rows.append(
                {
                    "pool": pool,
                    "shape": shape_label(shape),
                    "schedulable_jobs": fit,
                    "stranded_gpus": free_whole - fit * shape.tasks * shape.num_gpu
                    if whole
                    else None,
                }
            )
    return rows


def node_rows(model: ClusterModel, analysis: dict[str, Any]) -> list[dict[str, Any]]:
    """The per-node heatmap table of `measures.analyze`, as JSON-ready rows (the largest free
    NVLink group null on a node none of whose GPUs has a known island)."""
    nodes = analysis["nodes"]
    pools = pool_names(model)
    out = []
    for i in range(len(model.nodes)):
        out.append(
            {
                "node": str(nodes["node"][i]),
                "pool": str(pools[i]),
                "rack": str(nodes["rack"][i]),
                "gpu_model": str(nodes["gpu_model"][i]),
                "gpus": int(nodes["gpus"][i]),
                "free_gpus": int(nodes["free_gpus"][i]),
                "free_capacity_gpus": float(nodes["free_capacity_gpus"][i]),
                "largest_free_nvlink_group": None  # -1: the node's islands are unknown
                if nodes["largest_free_nvlink_group"][i] < 0
                else int(nodes["largest_free_nvlink_group"][i]),
                "allocated_idle_gpus": int(nodes["allocated_idle_gpus"][i]),
                "fgd_fragment_gpus": float(nodes["fgd_fragment_gpus"][i]),
                "score": float(nodes["score"][i]),
                "stranded_memory_bytes": float(nodes["stranded_memory_bytes"][i]),
            }
        )
    return out


def jsonable(value: Any) -> Any:
    """Plain JSON types: numpy scalars/arrays to Python, NaN/inf to None (JSON has neither)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, np.generic):
        return jsonable(value.item())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, str | int | float | bool):
        return value
    to_dict = getattr(value, "to_dict", None)
    return jsonable(to_dict()) if callable(to_dict) else str(value)


@dataclass(frozen=True)
class Results:
    """One complete run: the model it saw and everything derived from it."""

    model: ClusterModel
    observed_at: float  # the model's timestamp, or the wall time of the ingest without one
    finished_at: float  # wall time the run completed
    analysis: dict[str, Any]  # measures.analyze(model)
    shapes: list[dict[str, Any]]
    pools: list[dict[str, Any]]
    pool_shapes: list[dict[str, Any]]  # pool_shape_table
    gpu_models: list[dict[str, Any]]
    gpu_states: np.ndarray  # int8 (G), GPU_STATE_CODES
    forecast: dict[str, Any] = field(default_factory=dict)
    recommendations: dict[str, Any] = field(default_factory=dict)
    trend: pd.DataFrame | None = None  # History.trend(): the headline measures per observation
    demand: pd.DataFrame | None = None  # hourly allocated GPUs per pool the forecast learned from
    # the queue, unknown racks, why shapes cannot start, the biggest blocked job's plan
    # (advisor.pipeline.scheduler); {} before the analysis
    scheduler: dict[str, Any] = field(default_factory=dict)


JOB_END_SOURCES: tuple[str, ...] = ("learned", "prior", "known", "none")


def job_end_rows(
    model: ClusterModel,
    jobs: list[dict[str, Any]],
    tenant: str | None = None,
    node: str | None = None,
) -> list[dict[str, Any]]:
    """`/api/job-ends`' rows: the running jobs `advisor.forecast.job_ends.predict` listed (its
    document's `jobs`), those of `tenant` / with a task on `node` only when given, each with the
    GPUs its tasks hold in `model` per node, sorted by expected end (jobs without one last),
    then by planned end, tenant and job."""
    allocs, places = model.allocations, model.placements
    held: dict[str, list[tuple[str, int]]] = defaultdict(list)
    names = model.nodes.name[model.gpus.node[places.gpu]].tolist()
    for alloc, name, index in zip(
        allocs.id[places.alloc].tolist(),
        names,
        model.gpus.index[places.gpu].tolist(),
        strict=True,
    ):
        held[str(alloc)].append((str(name), int(index)))
    rows = []
    for job in jobs:
        if tenant is not None and job["tenant"] != tenant:
            continue
        if node is not None and node not in job["nodes"]:
            continue
        gpus: dict[str, set[int]] = {name: set() for name in job["nodes"]}
        for alloc in job["allocations"]:
            for name, index in held.get(alloc, ()):
                gpus.setdefault(name, set()).add(index)
        nodes = [{"node": name, "gpus": sorted(gpus[name])} for name in sorted(gpus)]
        rows.append({**job, "nodes": nodes})
    rows.sort(
        key=lambda r: (
            r["end"] is None,
            r["end"] if r["end"] is not None else 0.0,
            r["planned_end"] if r["planned_end"] is not None else math.inf,
            r["tenant"],
            r["job"],
        )
    )
    return rows
