"""Fragmentation measures an SRE reads directly, as pure vector functions over the cluster model.

Spatial: free and stranded GPUs, how many jobs of each shape can start now, the largest job that
fits. Temporal: allocated-but-idle GPUs. Type: idle capacity by GPU model against demand by GPU
model. Memory: free GPU memory no typical request can use. Plus the FGD fragment amount (the
paper's measure, from `advisor.fragmentation.fgd`) and a per-node score for heatmaps.

"Free" always means usable (healthy, not lost, on a schedulable node), unallocated and not in
MIG mode (a MIG GPU is room for MIG instances only, what they carve): a lost or unhealthy GPU is
neither free nor allocatable. A GPU in use that no source attributes (busy or holding memory,
`advisor.model.UNATTRIBUTED`) is allocated with its owner unknown: counted as such, never free,
never "allocated but idle" (no owner to ask). Unknown CPU or memory capacity is no constraint;
unknown utilization is never "idle".
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from advisor.contract import GPU_STATE_CODES
from advisor.fragmentation import fgd, nvlink
from advisor.model import MILLI, ClusterModel, spec_models, spec_parts
from advisor.settings import NO_TENANT, SHAPES_TEXT

# --------------------------------------------------------------------------- shapes


@dataclass(frozen=True)
class Shape:
    """A job shape: `tasks` tasks (one per node, within one rack when > 1) of `num_gpu` GPUs at
    `gpu_milli` each, with optional per-task CPU/memory and allowed GPU models ("A|B")."""

    num_gpu: int
    gpu_milli: int = MILLI
    tasks: int = 1
    cpu_milli: float = 0.0
    memory_mib: float = 0.0
    gpu_spec: str = ""

    def __post_init__(self) -> None:
        if self.num_gpu < 1 or self.tasks < 1 or not 0 < self.gpu_milli <= MILLI:
            raise ValueError(
                f"invalid shape: {self.tasks} task(s) of {self.num_gpu} GPU(s) at "
                f"{self.gpu_milli} milli-GPU; a shape takes at least one task of at least "
                f"0.001 GPU"
            )
        if self.num_gpu > 1 and self.gpu_milli != MILLI:
            raise ValueError("a multi-GPU task takes whole GPUs (gpu_milli 1000)")

    @property
    def name(self) -> str:
        size = f"{self.gpu_milli / MILLI:g}" if self.gpu_milli < MILLI else str(self.num_gpu)
        base = f"{self.tasks}x{size}" if self.tasks > 1 else size
        return f"{base} GPU" + (f" [{self.gpu_spec}]" if self.gpu_spec else "")

    @property
    def gpus(self) -> float:
        return self.tasks * self.num_gpu * self.gpu_milli / MILLI


_SHAPE = re.compile(r"^(?:(\d+)x)?(\d+(?:\.\d+)?)(?:@([\w.|-]+))?$")


def parse_shape(text: str) -> Shape:
    """'0.5' (half a GPU), '1', '8', '2x8' (2 nodes x 8 GPUs in one rack), '4@A100' (model)."""
    match = _SHAPE.match(text.strip())
    if not match:
        raise ValueError(f"bad shape {text!r}: expected e.g. 0.5, 1, 8, 2x8 or 4@A100")
    tasks, size, spec = int(match.group(1) or 1), float(match.group(2)), match.group(3) or ""
    if size > 1 and not size.is_integer():
        raise ValueError(f"bad shape {text!r}: more than one GPU must be a whole number")
    if tasks < 1 or round(size * MILLI) < 1:
        raise ValueError(
            f"bad shape {text!r}: a shape takes at least one task of at least 0.001 GPU"
        )
    if size < 1:
        return Shape(1, round(size * MILLI), tasks, gpu_spec=spec)
    return Shape(int(size), MILLI, tasks, gpu_spec=spec)


DEFAULT_SHAPES: tuple[Shape, ...] = tuple(parse_shape(text) for text in SHAPES_TEXT.split(","))


# --------------------------------------------------------------------------- helpers


def _spec_mask(model: ClusterModel, spec: str) -> np.ndarray:
    """bool (N): nodes whose GPU model the spec allows."""
    models = model.nodes.gpu_model
    if not spec_parts(spec):
        return np.ones(len(models), dtype=bool)
    allowed = spec_models(spec, sorted(set(models.tolist())))
    return np.isin(models, np.array(allowed, dtype=object))


def check_models(model: ClusterModel, shape: Shape) -> None:
    """ValueError naming a GPU model the shape asks for that no GPU of the fleet is
    (`advisor.model.model_matches`): a typo must not read as "no such job can start"."""
    names = sorted(set(model.nodes.gpu_model.tolist()) - {""})
    unknown = [part for part in spec_parts(shape.gpu_spec) if not spec_models(part, names)]
    if unknown:
        raise ValueError(
            f"{shape.name}: no GPU model here matches {unknown[0]!r} (models: "
            f"{', '.join(names) or 'none'})"
        )


def _per_node(model: ClusterModel, values: np.ndarray) -> np.ndarray:
    return np.bincount(model.gpus.node, weights=values, minlength=len(model.nodes))


def free_whole_per_node(model: ClusterModel) -> np.ndarray:
    """int64 (N): free whole GPUs per node."""
    return _per_node(model, model.gpu_is_free.astype(np.float64)).astype(np.int64)


def _cap(free: np.ndarray, need: float) -> np.ndarray:
    """How many requests of `need` fit in `free` per node; unknown (NaN) capacity = no limit."""
    if need <= 0:
        return np.full(len(free), np.iinfo(np.int64).max // 4, dtype=np.int64)
    known = np.where(np.isnan(free), np.inf, free)
    return np.floor(np.clip(known, 0, 1e18) / need).astype(np.int64)


def tasks_per_node(model: ClusterModel, shape: Shape) -> np.ndarray:
    """int64 (N): how many single-node tasks of `shape` each node can host at once, whole-GPU
    tasks under the planner's NVLink-island rule (`nvlink.whole_tasks_per_node`): a 4-GPU task
    on 4-GPU islands needs 4 free in one island, not 2 + 2."""
    if shape.gpu_milli < MILLI:
        slots = _per_node(model, (model.gpu_free_milli // shape.gpu_milli).astype(np.float64))
        gpu_tasks = slots.astype(np.int64)
    else:
        gpu_tasks = nvlink.whole_tasks_per_node(model, model.gpu_is_free, shape.num_gpu)
    tasks = np.minimum(gpu_tasks, _cap(model.node_cpu_free, shape.cpu_milli))
    tasks = np.minimum(tasks, _cap(model.node_memory_free, shape.memory_mib))
    return np.where(_spec_mask(model, shape.gpu_spec), tasks, 0)


def _codes(values: np.ndarray) -> np.ndarray:
    return np.unique(values.astype(str), return_inverse=True)[1].reshape(len(values))


def _rack_groups(model: ClusterModel) -> np.ndarray:
    """int64 (N): group id of (rack, GPU model); nodes without a rack label are groups of one."""
    nodes = model.nodes
    if len(nodes) == 0:
        return np.zeros(0, dtype=np.int64)
    rack, gpu_model = _codes(nodes.rack), _codes(nodes.gpu_model)
    key = rack.astype(np.int64) * (int(gpu_model.max()) + 1) + gpu_model
    alone = nodes.rack == ""
    key = np.where(alone, -1 - np.arange(len(nodes)), key)
    return np.unique(key, return_inverse=True)[1].reshape(len(nodes))


def rack_could_hold(model: ClusterModel, shape: Shape) -> bool:
    """Whether an empty fleet could hold one job of `shape`: a node with enough usable GPUs of
    a model the shape allows, and for a multi-node job `tasks` such nodes in one rack group
    (`_rack_groups`: nodes without a rack label are groups of one)."""
    usable = _per_node(model, model.gpu_usable.astype(np.float64))
    ok = (usable >= shape.num_gpu) & _spec_mask(model, shape.gpu_spec)
    if shape.tasks <= 1:
        return bool(ok.any())
    groups = _rack_groups(model)[ok]
    return bool(groups.size) and int(np.bincount(groups).max()) >= shape.tasks


def jobs_that_fit(model: ClusterModel, shape: Shape, groups: np.ndarray | None = None) -> int:
    """How many jobs of `shape` could start now, each on its own free capacity (not jointly
    with other shapes). Multi-node jobs need `tasks` tasks within one rack and one GPU model."""
    per_node = tasks_per_node(model, shape)
    if shape.tasks > 1:
        groups = _rack_groups(model) if groups is None else groups
    return _jobs_of(per_node, shape.tasks, groups)


def _jobs_of(per_node: np.ndarray, tasks: int, groups: np.ndarray | None) -> int:
    """Whole jobs of `tasks` tasks from the tasks that fit per node, each multi-node job
    within one group (rack and GPU model)."""
    if tasks == 1:
        return int(per_node.sum())
    # only groups with at least `tasks` nodes where a task fits can hold a job (racks unknown:
    # every node is a group of one, and none can)
    has = per_node > 0
    size = np.bincount(groups[has], minlength=int(groups.max(initial=-1)) + 1)
    keep = has & (size[groups] >= tasks)
    if not keep.any():
        return 0
    per_node, groups = per_node[keep], groups[keep]
    order = np.argsort(groups, kind="stable")
    bounds = np.flatnonzero(np.diff(groups[order])) + 1
    return sum(_distinct_jobs(part, tasks) for part in np.split(per_node[order], bounds))


def _distinct_jobs(per_node: np.ndarray, tasks: int) -> int:
    """Most jobs of `tasks` tasks on distinct nodes of one group, `per_node` tasks fitting on
    each: J jobs fit exactly when the nodes, each giving at most one task to a job, hold
    tasks x J (sum of min(fits, J) >= tasks x J). A node holding two tasks still gives a job
    one: two free halves of one node are not a 2-node job. Fewer jobs always fit where more
    do, so the largest J is found by bisection."""
    fits = per_node[per_node > 0].astype(np.int64)
    low, high = 0, int(fits.sum()) // tasks
    while low < high:
        mid = (low + high + 1) // 2
        if int(np.minimum(fits, mid).sum()) >= tasks * mid:
            low = mid
        else:
            high = mid - 1
    return low


def jobs_that_fit_by_part(
    model: ClusterModel, shape: Shape, parts: np.ndarray, groups: np.ndarray | None = None
) -> dict[str, int]:
    """`jobs_that_fit` of each part of the fleet on its own (nodes labelled by `parts`, e.g.
    their pools, as scheduling domains): a multi-node job never spans two parts, so the parts'
    counts add up to the fleet's, or less where a rack of one GPU model spans parts."""
    per_node = tasks_per_node(model, shape)
    if shape.tasks > 1:
        groups = _rack_groups(model) if groups is None else groups
    out: dict[str, int] = {}
    for part in sorted(set(parts.tolist())):
        on = parts == part
        out[part] = _jobs_of(per_node[on], shape.tasks, None if groups is None else groups[on])
    return out


def crossing(model: ClusterModel, shape: Shape) -> list[dict[str, Any]]:
    """Per GPU model on whose nodes a task of `shape` that fits now spans NVLink islands (it
    is larger than an island there): the estimate of what that costs
    (`nvlink.cross_island_estimate`); [] when every such task fits in one island."""
    if shape.gpu_milli < MILLI:
        return []
    fits = tasks_per_node(model, shape) > 0
    models = nvlink.crossing_models(model, shape.num_gpu, fits)
    return [nvlink.cross_island_estimate(name).to_dict() for name in models]


def gpu_state_codes(model: ClusterModel, idle: np.ndarray) -> np.ndarray:
    """int8 (G): `GPU_STATE_CODES` per GPU, for the heatmaps of the app and the dashboards.
    Allocated GPUs are busy, or idle by `idle` (a cordoned node's still run their jobs), or
    `owner_unknown` where a holder no source names uses them; unhealthy or lost GPUs, and
    unallocated ones a scheduler may not use (cordoned), are unhealthy; an unallocated usable
    MIG GPU is `mig_free`: room for MIG instances, not a free whole GPU (`free` is exactly
    `model.gpu_is_free`)."""
    allocated = model.gpu_milli_allocated > 0
    codes = np.where(allocated, GPU_STATE_CODES["busy"], GPU_STATE_CODES["free"])
    codes = np.where(allocated & idle, GPU_STATE_CODES["allocated_idle"], codes)
    codes = np.where(model.gpu_owner_unknown, GPU_STATE_CODES["owner_unknown"], codes)
    codes = np.where(~allocated & model.gpus.mig_enabled, GPU_STATE_CODES["mig_free"], codes)
    broken = ~model.gpus.healthy | model.gpus.lost | (~model.gpu_usable & ~allocated)
    return np.where(broken, GPU_STATE_CODES["unhealthy"], codes).astype(np.int8)


# --------------------------------------------------------------------------- spatial


largest_free_nvlink_group = nvlink.largest_free_nvlink_group  # -1 where islands are unknown


@dataclass(frozen=True)
class Largest:
    single_node_gpus: int  # largest whole-GPU task one node can start now (island rule)
    nvlink_group_gpus: int | None  # most free whole GPUs in one NVLink island (None: unknown)
    rack_full_nodes: int  # most fully free 8-GPU tasks within one rack and model
    fraction_milli: int  # largest free share on any single GPU


def largest_fitting(model: ClusterModel, groups: np.ndarray | None = None) -> Largest:
    groups = _rack_groups(model) if groups is None else groups
    eights_per_node = nvlink.whole_tasks_per_node(model, model.gpu_is_free, 8)
    eights = np.bincount(groups, weights=eights_per_node.astype(np.float64)) if len(groups) else [0]
    group = largest_free_nvlink_group(model)
    known = group != nvlink.UNKNOWN
    return Largest(
        single_node_gpus=int(nvlink.largest_task_per_node(model).max(initial=0)),
        nvlink_group_gpus=int(group[known].max(initial=0)) if known.any() else None,
        rack_full_nodes=int(np.max(eights, initial=0)),
        fraction_milli=int(model.gpu_free_milli.max(initial=0)),
    )


def min_host_need_per_gpu(model: ClusterModel) -> tuple[float, float]:
    """Smallest CPU milli and memory MiB per GPU among GPU tasks with known requests (0 if none)."""
    allocs = model.allocations
    gpu_tasks = allocs.num_gpu > 0
    share = allocs.num_gpu * allocs.gpu_milli / MILLI
    with np.errstate(invalid="ignore", divide="ignore"):
        cpu = allocs.cpu_milli[gpu_tasks] / share[gpu_tasks]
        mem = allocs.memory_mib[gpu_tasks] / share[gpu_tasks]
    cpu, mem = cpu[np.isfinite(cpu)], mem[np.isfinite(mem)]
    return (float(cpu.min()) if len(cpu) else 0.0, float(mem.min()) if len(mem) else 0.0)


def stranded_by_host(model: ClusterModel, cpu_per_gpu: float, memory_per_gpu: float) -> np.ndarray:
    """int64 (N): free whole GPUs on nodes whose CPU or memory left cannot feed even one of them."""
    starved = (_cap(model.node_cpu_free, cpu_per_gpu) < 1) | (
        _cap(model.node_memory_free, memory_per_gpu) < 1
    )
    return np.where(starved, free_whole_per_node(model), 0)


# --------------------------------------------------------------------------- temporal


@dataclass(frozen=True)
class IdlePolicy:
    """Allocated GPUs under `threshold` utilization for every sample in the last `window_s`."""

    threshold: float = 0.05
    window_s: float = 3600.0


def allocated_idle(model: ClusterModel, policy: IdlePolicy = IdlePolicy()) -> np.ndarray:
    """bool (G): allocated, usable GPUs idle over the window (latest value without history);
    a GPU held by an owner nobody names is not one (`model.gpu_owner_unknown`)."""
    allocated = (model.gpu_milli_allocated > 0) & model.gpus.healthy & ~model.gpu_owner_unknown
    usage = model.usage
    if len(usage.times):
        end = usage.times.max() if math.isnan(model.timestamp) else model.timestamp
        rows = usage.times >= end - policy.window_s
        util = usage.utilization_ratio[rows]
        seen = ~np.isnan(util)
        idle = seen.any(axis=0) & np.all(~seen | (util < policy.threshold), axis=0)
    else:
        util = model.gpus.utilization_ratio
        idle = ~np.isnan(util) & (util < policy.threshold)
    return allocated & idle


# --------------------------------------------------------------------------- type


def by_gpu_model(model: ClusterModel) -> dict[str, list[dict[str, Any]]]:
    """Idle capacity per GPU model (`capacity`) against pending demand per allowed-model spec
    (`demand`, with the free capacity of the models it allows and the shortfall)."""
    gpu_model = model.nodes.gpu_model[model.gpus.node]
    allocs = model.allocations
    pending = allocs.node < 0
    rows = []
    for name in sorted(set(gpu_model.tolist())):
        on = gpu_model == name
        rows.append(
            {
                "gpu_model": name,
                "gpus": int(on.sum()),
                "usable_gpus": int((on & model.gpu_usable).sum()),
                "free_gpus": int((on & model.gpu_is_free).sum()),
                "free_capacity_gpus": float(model.gpu_free_milli[on].sum()) / MILLI,
                "allocated_gpus": float(model.gpu_milli_allocated[on].sum()) / MILLI,
            }
        )
    demand: Counter[str] = Counter()
    tasks: Counter[str] = Counter()
    need = allocs.num_gpu * allocs.gpu_milli / MILLI
    for spec, gpus in zip(allocs.gpu_spec[pending].tolist(), need[pending].tolist(), strict=True):
        if gpus > 0:
            demand[spec] += gpus
            tasks[spec] += 1
    free_by_model = {row["gpu_model"]: row["free_capacity_gpus"] for row in rows}
    demand_rows = []
    for spec in sorted(demand):
        allowed = spec_models(spec, free_by_model)
        free = sum(free_by_model.get(m, 0.0) for m in allowed)
        demand_rows.append(
            {
                "gpu_spec": spec or "any",
                "pending_tasks": tasks[spec],
                "pending_gpus": demand[spec],
                "free_capacity_gpus": free,
                "shortfall_gpus": max(0.0, demand[spec] - free),
            }
        )
    return {"capacity": rows, "demand": demand_rows}


# --------------------------------------------------------------------------- memory


def stranded_memory_bytes(model: ClusterModel, min_request_bytes: float = 10 * 2**30) -> np.ndarray:
    """float64 (G): free memory on in-use GPUs that no typical request can use.

    A GPU fully handed out (1000 milli) strands all its free memory; a partly handed-out one
    strands it only when it is less than `min_request_bytes`. Free memory is observed
    (total - used) where known, else the unallocated share of the total.
    """
    gpus = model.gpus
    allocated = model.gpu_milli_allocated
    in_use = (allocated > 0) & model.gpu_usable
    observed = gpus.memory_total_bytes - gpus.memory_used_bytes
    share = gpus.memory_total_bytes * (MILLI - allocated) / MILLI
    free = np.nan_to_num(np.where(np.isnan(observed), share, observed)).clip(0)
    full = allocated >= MILLI
    stranded = np.where(full, free, np.where(free < min_request_bytes, free, 0.0))
    return np.where(in_use, stranded, 0.0)


# --------------------------------------------------------------------------- FGD


def workload_of(model: ClusterModel) -> fgd.Workload | None:
    """The task-type mix of the model's own allocations (placed and pending), FGD-style.

    Shapes are counted with numpy (same keys as `fgd.pod_shapes`: a CPU request of 0 counts as
    100 milli, CPU-only tasks have gpu_milli 0) and cut with `fgd.workload_from_counts`.
    """
    allocs = model.allocations
    if not (allocs.num_gpu > 0).any():
        return None
    cpu = np.nan_to_num(allocs.cpu_milli).astype(np.int64)
    cpu = np.where(cpu > 0, cpu, 100)
    milli = np.where(allocs.num_gpu > 0, allocs.gpu_milli, 0).astype(np.int64)
    specs, spec_code = np.unique(allocs.gpu_spec.astype(str), return_inverse=True)
    keys = np.stack([cpu, milli, allocs.num_gpu.astype(np.int64), spec_code.reshape(-1)], axis=1)
    shapes, counts = np.unique(keys, axis=0, return_counts=True)
    return fgd.workload_from_counts(
        {
            (int(c), int(d), int(k), str(specs[s])): int(n)
            for (c, d, k, s), n in zip(shapes.tolist(), counts.tolist(), strict=True)
        }
    )


def default_workload(shapes: Sequence[Shape] = DEFAULT_SHAPES) -> fgd.Workload:
    """Single-node default shapes, equally likely: the fallback when no demand is known."""
    single = [s for s in shapes if s.tasks == 1]
    return fgd.Workload.from_shapes(
        [(int(s.cpu_milli), s.gpu_milli, s.num_gpu, s.gpu_spec) for s in single],
        [1.0 / len(single)] * len(single),
    )


def free_matrix(model: ClusterModel) -> np.ndarray:
    """int64 (N, max GPUs per node): free milli per GPU slot, padded with 0."""
    counts = model.nodes.gpu_count
    width = int(counts.max(initial=0))
    out = np.zeros((len(model.nodes), max(width, 1)), dtype=np.int64)
    slot = np.arange(len(model.gpus)) - model.nodes.gpu_offset[model.gpus.node]
    out[model.gpus.node, slot] = model.gpu_free_milli
    return out


def fgd_node_fragment(model: ClusterModel, workload: fgd.Workload) -> np.ndarray:
    """float64 (N): FGD F_n(M), expected idle milli-GPU a typical task cannot use."""
    names, index = np.unique(model.nodes.gpu_model.astype(str), return_inverse=True)
    cpu_free = np.where(np.isnan(model.node_cpu_free), np.inf, model.node_cpu_free)
    return fgd.node_fragment(
        free_matrix(model), cpu_free, index.reshape(-1), workload, workload.access(list(names))
    )


# --------------------------------------------------------------------------- all together


@dataclass(frozen=True)
class Settings:
    shapes: tuple[Shape, ...] = DEFAULT_SHAPES
    idle: IdlePolicy = IdlePolicy()
    min_request_bytes: float = 10 * 2**30


def node_table(
    model: ClusterModel, fragment: np.ndarray, idle: np.ndarray, stranded_mem: np.ndarray
) -> dict[str, np.ndarray]:
    """Per-node columns for heatmaps. `score` = FGD fragment / idle GPU on the node (0..1)."""
    idle_milli = _per_node(model, model.gpu_free_milli.astype(np.float64))
    with np.errstate(invalid="ignore", divide="ignore"):
        score = np.where(idle_milli > 0, fragment / idle_milli, 0.0)
    return {
        "node": model.nodes.name,
        "pool": model.nodes.pool,
        "rack": model.nodes.rack,
        "gpu_model": model.nodes.gpu_model,
        "gpus": model.nodes.gpu_count,
        "free_gpus": free_whole_per_node(model),
        "free_capacity_gpus": idle_milli / MILLI,
        "largest_free_nvlink_group": largest_free_nvlink_group(model),
        "allocated_idle_gpus": _per_node(model, idle.astype(np.float64)).astype(np.int64),
        "stranded_memory_bytes": _per_node(model, stranded_mem),
        "fgd_fragment_gpus": fragment / MILLI,
        "score": np.clip(score, 0.0, 1.0),
    }


def most_fragmented(nodes: dict[str, np.ndarray], top: int = 10) -> np.ndarray:
    """Row numbers of `node_table`'s nodes with an FGD fragment, the largest first (ties: more
    free capacity first), at most `top`: a node with none is not fragmented, however full."""
    order = np.lexsort((-nodes["free_capacity_gpus"], -nodes["fgd_fragment_gpus"]))
    return order[nodes["fgd_fragment_gpus"][order] > 0][: max(0, top)]


def analyze(model: ClusterModel, settings: Settings = Settings()) -> dict[str, Any]:
    """Every measure as plain data (JSON-ready apart from the `nodes` numpy columns).

    A multi-node shape's `jobs_that_fit` counts known racks only; `jobs_if_racks_allow` is
    what nodes of unknown rack could add (None where no rack is unknown or the shape is one
    node), and `blocked_by` says why a shape with enough free GPUs fits nowhere
    (`advisor.fragmentation.racks`: rack_unknown or scattered; None otherwise)."""
    from advisor.fragmentation import racks  # racks counts with this module's functions

    groups = _rack_groups(model)
    shared = racks.shared_rack_groups(model)
    any_unknown = bool(racks.rack_unknown(model).any())
    free_whole = int(model.gpu_is_free.sum())
    free_per_pool = (
        np.bincount(_codes(model.nodes.pool), weights=free_whole_per_node(model).astype(np.float64))
        if len(model.nodes)
        else np.zeros(1)
    )
    partial = model.gpu_free_milli * ((model.gpu_milli_allocated > 0) & model.gpu_usable)
    cpu_per_gpu, memory_per_gpu = min_host_need_per_gpu(model)
    shapes = []
    for shape in settings.shapes:
        fit = jobs_that_fit(model, shape, groups)
        generous = jobs_that_fit(model, shape, shared) if shape.tasks > 1 and any_unknown else fit
        rack_decides = racks.depends_on_racks(shape, fit, generous)
        # free whole GPUs it cannot use: unknown where unknown racks decide the count
        whole = shape.gpu_milli == MILLI and not rack_decides
        shapes.append(
            {
                "shape": shape.name,
                "gpus_per_job": shape.gpus,
                "jobs_that_fit": fit,
                "jobs_if_racks_allow": generous if rack_decides else None,
                "blocked_by": racks.blocked_cause(
                    shape, fit, generous, float(free_per_pool.max(initial=0))
                ),
                "stranded_gpus": free_whole - fit * shape.tasks * shape.num_gpu if whole else None,
                "crosses_nvlink_islands": crossing(model, shape) if fit else [],
            }
        )
    idle = allocated_idle(model, settings.idle)
    allocs = model.allocations
    idle_tenants: Counter[str] = Counter()
    on_idle = idle[model.placements.gpu]
    for alloc_row, milli in zip(
        model.placements.alloc[on_idle].tolist(),
        model.placements.milli[on_idle].tolist(),
        strict=True,
    ):
        idle_tenants[allocs.tenant[alloc_row] or NO_TENANT] += milli / MILLI
    stranded_mem = stranded_memory_bytes(model, settings.min_request_bytes)
    workload = workload_of(model)
    workload_source = "allocations in the source"
    if workload is None:
        workload, workload_source = default_workload(settings.shapes), "default shapes (uniform)"
    fragment = fgd_node_fragment(model, workload)
    idle_total = float(model.gpu_free_milli.sum())
    capacity = float(len(model.gpus) * MILLI)
    largest = largest_fitting(model, groups)
    return {
        "source": model.source,
        "timestamp": None if math.isnan(model.timestamp) else model.timestamp,
        "cluster": {
            **model.summary(),
            "usable_gpus": int(model.gpu_usable.sum()),
            "unhealthy_gpus": int((~model.gpus.healthy).sum()),
            "allocated_gpus": float(model.gpu_milli_allocated.sum()) / MILLI,
            # in use (busy, holding memory, running processes) by a holder no source names
            "owner_unknown_gpus": int((model.gpu_owner_unknown & model.gpus.healthy).sum()),
            "pending_tasks": int((allocs.node < 0).sum()),
            **racks.rack_summary(model),
        },
        "spatial": {
            "free_gpus": free_whole,
            "free_capacity_gpus": idle_total / MILLI,
            "partial_free_gpus": float(partial.sum()) / MILLI,
            "stranded_gpus_by_host": int(
                stranded_by_host(model, cpu_per_gpu, memory_per_gpu).sum()
            ),
            "host_need_per_gpu": {"cpu_milli": cpu_per_gpu, "memory_mib": memory_per_gpu},
            "shapes": shapes,
            "largest_job": {
                "single_node_gpus": largest.single_node_gpus,
                # None when no node's NVLink islands are known (e.g. the openb trace)
                "nvlink_group_gpus": largest.nvlink_group_gpus,
                "multi_node_gpus_in_rack": (
                    8 * largest.rack_full_nodes if (model.nodes.rack != "").any() else None
                ),
                "fraction_gpu": largest.fraction_milli / MILLI,
            },
        },
        "temporal": {
            "threshold": settings.idle.threshold,
            "window_s": settings.idle.window_s,
            "allocated_idle_gpus": int(idle.sum()),
            "allocated_gpus": int((model.gpu_milli_allocated > 0).sum()),
            "idle_gpus_by_tenant": dict(idle_tenants.most_common()),
        },
        "type": by_gpu_model(model),
        "memory": {
            "min_request_bytes": settings.min_request_bytes,
            "stranded_memory_bytes": float(stranded_mem.sum()),
            "gpus_with_stranded_memory": int((stranded_mem > 0).sum()),
        },
        "fgd": {
            "workload": workload_source,
            "task_types": len(workload),
            "fragment_gpus": float(fragment.sum()) / MILLI,
            "fragment_pct_of_capacity": 100.0 * float(fragment.sum()) / capacity
            if capacity
            else 0.0,
            "fragment_rate": float(fragment.sum()) / idle_total if idle_total else 0.0,
        },
        "nodes": node_table(model, fragment, idle, stranded_mem),
    }
