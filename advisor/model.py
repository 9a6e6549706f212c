"""The one cluster model every advisor part reads: nodes, GPUs, allocations and observed usage.

Per-GPU state lives in flat numpy arrays (GPUs of node i are rows `gpu_offset[i]:gpu_offset[i+1]`,
ordered by node then device index), so measures over 10,000 nodes x 8 GPUs are vector operations,
not Python loops. Capacity that a source does not know is NaN (CPU, memory) or -1 (NVLink island)
and every measure treats "unknown" explicitly instead of guessing a value.

Allocations are per task (a pod, a Slurm step): a multi-node job is several allocations sharing
`job`. Each placed allocation holds `num_gpu` GPUs at `gpu_milli` (0..1000) each; the placement
rows (`Placements`) say which GPU and how much. An allocation with `node == -1` is demand that is
not placed (pending, or a trace task before replay).
"""

from __future__ import annotations

import functools
import logging
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import numpy as np

log = logging.getLogger(__name__)
if TYPE_CHECKING:
    from advisor.scheduler_view import SchedulerFacts

MILLI = 1000  # milli-GPU in one whole GPU
NO_LIMIT = 0  # allocation's gpu_limit_milli when no limit above its guaranteed share is given
UNKNOWN_ISLAND = -1
# Id prefix of the holder of a GPU (or MIG instance) in use that no allocation names: busy,
# holding memory or running processes (`exporter.usage`), its owner unknown. Never migratable
# (`advisor.ingest.readings`).
UNATTRIBUTED = "unattributed@"
# the qos of an allocation that holds GPUs for a waiting job (a reservation's placeholder,
# what `planner.check` adds for a `reserve` action): capacity taken, but no work running
RESERVATION_QOS = "reservation"
_WORD_BREAK = re.compile(r"[\s_-]+")


def spec_parts(spec: str) -> list[str]:
    """The GPU models a `gpu_spec` names ("A|B"; [] = any model)."""
    return [part for part in spec.split("|") if part]


@functools.lru_cache(maxsize=4096)
def model_matches(part: str, gpu_model: str) -> bool:
    """Whether one GPU model a spec names is `gpu_model`: its name, or the words of it in order,
    case ignored, so a shape or goal typed as `8@A100` asks for "NVIDIA A100-SXM4-80GB" (and
    every other A100) instead of matching nothing. Words break at spaces, `-` and `_`: "A10"
    is not "A100", and a trace's names ("V100M16") match only themselves."""
    if part == gpu_model:
        return True
    have = iter(w for w in _WORD_BREAK.split(gpu_model.casefold()) if w)
    want = [w for w in _WORD_BREAK.split(part.casefold()) if w]
    return bool(want) and all(any(w == h for h in have) for w in want)


def spec_allows(spec: str, gpu_model: str) -> bool:
    """Whether a `gpu_spec` ("A|B", "" = any) allows `gpu_model` (`model_matches`)."""
    parts = spec_parts(spec)
    return not parts or any(model_matches(part, gpu_model) for part in parts)


def spec_models(spec: str, names: Iterable[str]) -> list[str]:
    """The names in `names` a `gpu_spec` allows, in their order."""
    return [name for name in names if spec_allows(spec, name)]


class ModelError(ValueError):
    """A model (or the snapshot it came from) is inconsistent; `field` names where."""

    def __init__(self, field_name: str, problem: str) -> None:
        super().__init__(f"{field_name}: {problem}")
        self.field = field_name
        self.problem = problem


def object_array(values: Iterable[Any]) -> np.ndarray:
    """A 1-D object array of strings (numpy would otherwise pick a fixed-width dtype)."""
    items = list(values)
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array


def _first_duplicate(values: np.ndarray) -> str | None:
    seen: set[str] = set()
    for value in values.tolist():
        if value in seen:
            return value
        seen.add(value)
    return None


@dataclass(eq=False)
class Nodes:
    """Per-node columns (length N)."""

    name: np.ndarray  # object[str], unique
    pool: np.ndarray  # object[str], "" unknown
    rack: np.ndarray  # object[str], "" unknown
    gpu_model: np.ndarray  # object[str], model of the node's GPUs
    cpu_milli: np.ndarray  # float64 capacity, NaN unknown
    memory_mib: np.ndarray  # float64 capacity, NaN unknown
    schedulable: np.ndarray  # bool
    gpu_offset: np.ndarray  # int64, length N+1

    def __len__(self) -> int:
        return len(self.name)

    @property
    def gpu_count(self) -> np.ndarray:
        return np.diff(self.gpu_offset)


@dataclass(eq=False)
class Gpus:
    """Per-GPU columns (length G), ordered by node then device index."""

    node: np.ndarray  # int32 row in Nodes
    index: np.ndarray  # int32 device index on its node
    uuid: np.ndarray  # object[str]
    memory_total_bytes: np.ndarray  # float64, NaN unknown
    healthy: np.ndarray  # bool; False for lost GPUs too
    lost: np.ndarray  # bool
    nvlink_island: np.ndarray  # int32 node-local island id, -1 unknown
    mig_enabled: np.ndarray  # bool
    # int32 milli-GPU a scheduler can hand out: MILLI, except on a MIG GPU whose instances are
    # known, where it is the compute slices they carve (an A100 as 3g+3g carves 857: its seventh
    # slice has no memory left to carve, so no allocation can ever use it)
    carved_milli: np.ndarray
    utilization_ratio: np.ndarray  # float64 latest observation, NaN unknown
    memory_used_bytes: np.ndarray  # float64 latest observation, NaN unknown
    power_watts: np.ndarray  # float64 latest observation, NaN unknown (energy of idle GPUs)

    def __len__(self) -> int:
        return len(self.node)


@dataclass(eq=False)
class Allocations:
    """Per-task columns (length A). Times are seconds (Unix time, or trace seconds)."""

    id: np.ndarray  # object[str] pod/task id, unique
    job: np.ndarray  # object[str] job the task belongs to (== id for single-task jobs)
    tenant: np.ndarray  # object[str]
    priority: np.ndarray  # int32, higher = more important
    num_gpu: np.ndarray  # int32 GPUs per task
    gpu_milli: np.ndarray  # int32 milli-GPU per GPU (1000 = whole GPU)
    cpu_milli: np.ndarray  # float64 request, NaN unknown
    memory_mib: np.ndarray  # float64 request, NaN unknown
    gpu_spec: np.ndarray  # object[str] allowed GPU models "A|B", "" = any
    node: np.ndarray  # int32 row in Nodes, -1 = not placed
    start_time: np.ndarray  # float64, NaN unknown
    creation_time: np.ndarray  # float64, NaN unknown
    deletion_time: np.ndarray  # float64, NaN unknown
    scheduled_time: np.ndarray  # float64, NaN unknown
    migratable: np.ndarray  # bool
    restart_cost_s: np.ndarray  # float64 checkpoint/restart seconds, NaN unknown
    qos: np.ndarray  # object[str]
    # int32 milli-GPU per GPU the task may use when the GPU has room (fractional sharing's
    # limit, Run:ai-style 0.25 guaranteed / 0.8 limit: `gpu_milli` is the guarantee); NO_LIMIT
    # (0) where the source gives none: the task is held to its guarantee (`gpu_limit_allocated`)
    gpu_limit_milli: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.gpu_limit_milli is None:  # sources that know no limits
            self.gpu_limit_milli = np.full(len(self.id), NO_LIMIT, dtype=np.int32)

    def __len__(self) -> int:
        return len(self.id)


# each column of `Allocations` and its dtype, in field order (`allocations_from_columns`)
ALLOCATION_COLUMNS: dict[str, Any] = {
    "id": object,
    "job": object,
    "tenant": object,
    "priority": np.int32,
    "num_gpu": np.int32,
    "gpu_milli": np.int32,
    "cpu_milli": np.float64,
    "memory_mib": np.float64,
    "gpu_spec": object,
    "node": np.int32,
    "start_time": np.float64,
    "creation_time": np.float64,
    "deletion_time": np.float64,
    "scheduled_time": np.float64,
    "migratable": bool,
    "restart_cost_s": np.float64,
    "qos": object,
    "gpu_limit_milli": np.int32,
}
# what a column not given holds: unknown times and requests, no limit, no qos
ALLOCATION_DEFAULTS: dict[str, Any] = {
    "deletion_time": math.nan,
    "scheduled_time": math.nan,
    "qos": "",
    "gpu_limit_milli": NO_LIMIT,
}


def allocations_from_columns(columns: Mapping[str, Sequence[Any]]) -> Allocations:
    """`Allocations` from one list per column, each cast to its dtype (`ALLOCATION_COLUMNS`);
    a column in `ALLOCATION_DEFAULTS` may be left out. The one place columns are typed, for
    the model builder, the replay and plans that add reservations."""
    size = len(columns["id"])
    arrays = {}
    for name, dtype in ALLOCATION_COLUMNS.items():
        values = columns[name] if name in columns else [ALLOCATION_DEFAULTS[name]] * size
        if dtype is object:
            arrays[name] = object_array(values)
        else:
            arrays[name] = np.array(list(values), dtype=dtype).reshape(size)
    return Allocations(**arrays)


@dataclass(eq=False)
class Placements:
    """Which GPU holds how much of which allocation (length P)."""

    alloc: np.ndarray  # int32 row in Allocations
    gpu: np.ndarray  # int32 row in Gpus
    milli: np.ndarray  # int32

    def __len__(self) -> int:
        return len(self.alloc)


@dataclass(eq=False)
class Usage:
    """Observed usage over time: row t of each (T, G) matrix is the fleet at `times[t]`."""

    times: np.ndarray  # float64 (T,)
    utilization_ratio: np.ndarray  # float32 (T, G), NaN missing
    memory_used_bytes: np.ndarray  # float32 (T, G), NaN missing

    @staticmethod
    def empty(gpu_count: int) -> Usage:
        return Usage(
            np.zeros(0, dtype=np.float64),
            np.zeros((0, gpu_count), dtype=np.float32),
            np.zeros((0, gpu_count), dtype=np.float32),
        )


@dataclass(eq=False)
class ClusterModel:
    """One consistent view of a GPU cluster at `timestamp` (plus its usage history)."""

    nodes: Nodes
    gpus: Gpus
    allocations: Allocations
    placements: Placements
    usage: Usage
    timestamp: float = math.nan
    source: str = ""
    # Scrape targets known to serve GPUs whose GPUs this read lacks (down, or their backend
    # down), one line each: the model is then part of the fleet, and every view says so.
    left_out: tuple[str, ...] = ()
    # What a scheduler source said beyond nodes and allocations (quotas, gang sizes, where racks
    # came from, its notes); None for usage-only sources (`advisor.scheduler_view`).
    scheduler: SchedulerFacts | None = None
    _cache: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        validate(self)

    # --- derived per-GPU state (cached; the model is treated as immutable) ---
    def _cached(self, key: str, compute) -> np.ndarray:  # type: ignore[no-untyped-def]
        if key not in self._cache:
            value = compute()
            value.flags.writeable = False
            self._cache[key] = value
        return self._cache[key]

    @property
    def gpu_milli_allocated(self) -> np.ndarray:
        """int64 (G): milli-GPU handed out on each GPU."""
        return self._cached(
            "milli",
            lambda: np.bincount(
                self.placements.gpu, weights=self.placements.milli, minlength=len(self.gpus)
            ).astype(np.int64),
        )

    @property
    def gpu_owner_unknown(self) -> np.ndarray:
        """bool (G): GPUs (or a MIG instance of them) in use by a holder no source names
        (`UNATTRIBUTED`): allocated capacity with its owner unknown."""

        def compute() -> np.ndarray:
            ids = self.allocations.id
            unknown = np.fromiter(
                (str(i).startswith(UNATTRIBUTED) for i in ids.tolist()), bool, len(ids)
            )
            out = np.zeros(len(self.gpus), dtype=bool)
            out[self.placements.gpu[unknown[self.placements.alloc]]] = True
            return out

        return self._cached("owner_unknown", compute)

    @property
    def gpu_limit_allocated(self) -> np.ndarray:
        """int64 (G): milli-GPU each GPU may be asked for under contention: the sum of its
        holders' limits (`placement_limit_milli`). `gpu_milli_allocated`, the sum of the
        guarantees, is what the GPU can promise; this may exceed 1000 (limits overcommit)."""
        return self._cached(
            "limit",
            lambda: np.bincount(
                self.placements.gpu,
                weights=self.placement_limit_milli,
                minlength=len(self.gpus),
            ).astype(np.int64),
        )

    @property
    def placement_limit_milli(self) -> np.ndarray:
        """int64 (P): the limit of each placement: its allocation's `gpu_limit_milli` where
        one is given and above the share it holds there, else that share; a MIG instance
        never goes beyond its slices."""
        places = self.placements
        limit = self.allocations.gpu_limit_milli[places.alloc].astype(np.int64)
        share = places.milli.astype(np.int64)
        bursts = (limit != NO_LIMIT) & ~self.gpus.mig_enabled[places.gpu]
        return np.where(bursts, np.maximum(share, limit), share)

    @property
    def gpu_usable(self) -> np.ndarray:
        """bool (G): healthy, not lost, on a schedulable node: capacity a scheduler may use."""
        return self._cached(
            "usable",
            lambda: self.gpus.healthy & ~self.gpus.lost & self.nodes.schedulable[self.gpus.node],
        )

    @property
    def gpu_free_milli(self) -> np.ndarray:
        """int64 (G): allocatable milli-GPU left; 0 on unusable GPUs (`gpu_room`)."""
        return self._cached("free", lambda: self.gpu_room(self.gpu_milli_allocated)[1])

    @property
    def gpu_is_free(self) -> np.ndarray:
        """bool (G): a whole GPU a job can take (`gpu_room`)."""
        return self._cached("is_free", lambda: self.gpu_room(self.gpu_milli_allocated)[0])

    def gpu_room(self, allocated: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(whole GPU free: bool (G), free milli-GPU: int64 (G)) with `allocated` milli-GPU on
        each GPU: the model's own state, or a planner's trial one. A whole free GPU is usable,
        has nothing allocated and is not in MIG mode: a MIG GPU runs only work that fits its
        instances, and a whole-GPU job needs MIG turned off first (a drain and a reset). Free
        milli is what a usable GPU can still hand out: on a MIG GPU only what its instances
        carve (`carved_milli`), its uncarved slice being no capacity."""
        usable = self.gpu_usable
        whole = usable & (allocated == 0) & ~self.gpus.mig_enabled
        carved = self.gpus.carved_milli.astype(np.int64)
        return whole, np.where(usable, carved - allocated, 0).clip(0)

    @property
    def node_cpu_allocated(self) -> np.ndarray:
        """float64 (N): CPU milli requested by placed allocations (unknown requests count 0)."""
        return self._cached("cpu_alloc", lambda: self._per_node(self.allocations.cpu_milli))

    @property
    def node_memory_allocated(self) -> np.ndarray:
        """float64 (N): memory MiB requested by placed allocations (unknown requests count 0)."""
        return self._cached("mem_alloc", lambda: self._per_node(self.allocations.memory_mib))

    @property
    def node_cpu_free(self) -> np.ndarray:
        """float64 (N): CPU milli left; NaN where capacity is unknown (= not a constraint)."""
        return self._cached("cpu_free", lambda: self.nodes.cpu_milli - self.node_cpu_allocated)

    @property
    def node_memory_free(self) -> np.ndarray:
        """float64 (N): memory MiB left; NaN where capacity is unknown."""
        return self._cached("mem_free", lambda: self.nodes.memory_mib - self.node_memory_allocated)

    def _per_node(self, values: np.ndarray) -> np.ndarray:
        placed = self.allocations.node >= 0
        return np.bincount(
            self.allocations.node[placed],
            weights=np.nan_to_num(values[placed]),
            minlength=len(self.nodes),
        )

    def node_index(self, name: str) -> int:
        """Row of the node called `name`; KeyError if absent."""
        hits = np.flatnonzero(self.nodes.name == name)
        if len(hits) == 0:
            raise KeyError(f"no node named {name!r}")
        return int(hits[0])

    def gpu_row(self, node: int, index: int) -> int:
        """Row in Gpus of device `index` on node row `node`."""
        start, stop = self.nodes.gpu_offset[node], self.nodes.gpu_offset[node + 1]
        hits = np.flatnonzero(self.gpus.index[start:stop] == index)
        if len(hits) == 0:
            raise KeyError(f"node {self.nodes.name[node]!r} has no GPU {index}")
        return int(start + hits[0])

    def summary(self) -> dict[str, int]:
        return {
            "nodes": len(self.nodes),
            "gpus": len(self.gpus),
            "allocations": len(self.allocations),
            "placed_allocations": int((self.allocations.node >= 0).sum()),
            "usage_samples": len(self.usage.times),
        }


# --------------------------------------------------------------------------- validation


def _check_len(name: str, array: np.ndarray, length: int) -> None:
    if array.shape[:1] != (length,):
        raise ModelError(name, f"has length {array.shape[:1]}, expected {length}")


def validate(model: ClusterModel) -> None:
    """Raise ModelError naming the first inconsistent field; the model is otherwise trusted."""
    nodes, gpus, allocs, places = model.nodes, model.gpus, model.allocations, model.placements
    n, g, a = len(nodes), len(gpus), len(allocs)
    for name in ("pool", "rack", "gpu_model", "cpu_milli", "memory_mib", "schedulable"):
        _check_len(f"nodes.{name}", getattr(nodes, name), n)
    _check_len("nodes.gpu_offset", nodes.gpu_offset, n + 1)
    dup = _first_duplicate(nodes.name)
    if dup is not None:
        raise ModelError("nodes.name", f"duplicate node name {dup!r}")
    offset = nodes.gpu_offset
    if n and (offset[0] != 0 or offset[-1] != g or np.any(np.diff(offset) < 0)):
        raise ModelError("nodes.gpu_offset", "must start at 0, not decrease, and end at #GPUs")
    for name in (f.name for f in fields(Gpus) if f.name != "node"):
        _check_len(f"gpus.{name}", getattr(gpus, name), g)
    expected_node = np.repeat(np.arange(n), np.diff(offset)) if n else np.zeros(0)
    if not np.array_equal(gpus.node, expected_node):
        raise ModelError("gpus.node", "GPUs must be grouped by node in node order")
    for name in ALLOCATION_COLUMNS:
        _check_len(f"allocations.{name}", getattr(allocs, name), a)
    dup = _first_duplicate(allocs.id)
    if dup is not None:
        raise ModelError(f"allocations[{dup}]", "duplicate allocation id")
    if np.any(allocs.num_gpu < 0):
        raise ModelError("allocations.num_gpu", "must be >= 0")
    bad = (allocs.gpu_milli < 0) | (allocs.gpu_milli > MILLI)
    if np.any(bad):
        i = int(np.flatnonzero(bad)[0])
        raise ModelError(f"allocations[{allocs.id[i]}].gpu_milli", "must be within 0..1000")
    bad = (allocs.gpu_limit_milli < 0) | (allocs.gpu_limit_milli > MILLI)
    if np.any(bad):
        i = int(np.flatnonzero(bad)[0])
        raise ModelError(f"allocations[{allocs.id[i]}].gpu_limit_milli", "must be within 0..1000")
    if np.any((allocs.node < -1) | (allocs.node >= n)):
        raise ModelError("allocations.node", "refers to a node that does not exist")
    for name in ("gpu", "milli"):
        _check_len(f"placements.{name}", getattr(places, name), len(places))
    if len(places):
        if np.any((places.alloc < 0) | (places.alloc >= a)):
            raise ModelError("placements.alloc", "refers to an allocation that does not exist")
        if np.any((places.gpu < 0) | (places.gpu >= g)):
            raise ModelError("placements.gpu", "refers to a GPU that does not exist")
        if np.any((places.milli <= 0) | (places.milli > MILLI)):
            raise ModelError("placements.milli", "must be within 1..1000")
        wrong_node = gpus.node[places.gpu] != allocs.node[places.alloc]
        if np.any(wrong_node):
            i = int(places.alloc[np.flatnonzero(wrong_node)[0]])
            raise ModelError(f"allocations[{allocs.id[i]}].gpus", "GPU is not on its node")
    used = np.bincount(places.gpu, weights=places.milli, minlength=g) if g else np.zeros(0)
    over = np.flatnonzero(used > MILLI)
    if len(over):
        row = int(over[0])
        where = f"{nodes.name[gpus.node[row]]}/gpu{gpus.index[row]}"
        raise ModelError(
            f"gpus[{where}]", f"oversubscribed: {int(used[row])} milli-GPU allocated > 1000"
        )
    per_alloc = np.bincount(places.alloc, minlength=a) if a else np.zeros(0, dtype=np.int64)
    placed_gpu = (allocs.node >= 0) & (allocs.num_gpu > 0)
    short = placed_gpu & (per_alloc != allocs.num_gpu)
    if np.any(short):
        i = int(np.flatnonzero(short)[0])
        raise ModelError(
            f"allocations[{allocs.id[i]}].gpus",
            f"holds {int(per_alloc[i])} GPUs but num_gpu is {int(allocs.num_gpu[i])}",
        )
    if np.any(per_alloc[allocs.node < 0] > 0):
        i = int(np.flatnonzero((allocs.node < 0) & (per_alloc > 0))[0])
        raise ModelError(f"allocations[{allocs.id[i]}].gpus", "unplaced task holds GPUs")
    t = len(model.usage.times)
    for name in ("utilization_ratio", "memory_used_bytes"):
        if getattr(model.usage, name).shape != (t, g):
            raise ModelError(f"usage.{name}", f"must have shape ({t}, {g})")


# --------------------------------------------------------------------------- building


@dataclass
class _NodeRow:
    name: str
    pool: str
    rack: str
    gpu_model: str
    cpu_milli: float
    memory_mib: float
    schedulable: bool
    gpus: list[dict] = field(default_factory=list)
    indices: set[int] = field(default_factory=set)  # of `gpus`


class ModelBuilder:
    """Collects rows from any source (readings, trace, snapshot) and freezes them into arrays.

    Row-wise on purpose: sources are naturally row-wise, the arrays are built once in `build`.
    """

    def __init__(self) -> None:
        self._nodes: list[_NodeRow] = []
        self._node_pos: dict[str, int] = {}
        self._allocs: list[dict] = []
        # (alloc row, node name, gpu index, milli)
        self._places: list[tuple[int, str, int, int]] = []

    def add_node(
        self,
        name: str,
        *,
        pool: str = "",
        rack: str = "",
        gpu_model: str = "",
        cpu_milli: float = math.nan,
        memory_mib: float = math.nan,
        schedulable: bool = True,
    ) -> None:
        if name in self._node_pos:
            raise ModelError(f"nodes[{name}]", "duplicate node name")
        self._node_pos[name] = len(self._nodes)
        self._nodes.append(
            _NodeRow(name, pool, rack, gpu_model, cpu_milli, memory_mib, schedulable)
        )

    def add_gpu(
        self,
        node: str,
        index: int,
        *,
        uuid: str = "",
        memory_total_bytes: float = math.nan,
        healthy: bool = True,
        lost: bool = False,
        nvlink_island: int = UNKNOWN_ISLAND,
        mig_enabled: bool = False,
        carved_milli: int = MILLI,
        utilization_ratio: float = math.nan,
        memory_used_bytes: float = math.nan,
        power_watts: float = math.nan,
    ) -> None:
        row = self._node(node)
        if index < 0:
            raise ModelError(f"nodes[{node}].gpus[{index}]", "GPU index must be >= 0")
        if not 0 <= carved_milli <= MILLI:
            raise ModelError(
                f"nodes[{node}].gpus[{index}].carved_milli",
                f"must be 0..{MILLI}, not {carved_milli}",
            )
        if index in row.indices:  # a set: a list scan made 10,000 GPUs of one node 9.5 s
            raise ModelError(f"nodes[{node}].gpus[{index}]", "duplicate GPU index")
        row.indices.add(index)
        row.gpus.append(
            {
                "index": index,
                "uuid": uuid,
                "memory_total_bytes": memory_total_bytes,
                "healthy": healthy and not lost,
                "lost": lost,
                "nvlink_island": UNKNOWN_ISLAND if nvlink_island is None else nvlink_island,
                "mig_enabled": mig_enabled,
                "carved_milli": int(carved_milli),
                "utilization_ratio": utilization_ratio,
                "memory_used_bytes": memory_used_bytes,
                "power_watts": power_watts,
            }
        )

    def add_allocation(
        self,
        id: str,
        *,
        num_gpu: int,
        gpu_milli: int = MILLI,
        node: str | None = None,
        gpus: Sequence[int] = (),
        gpu_milli_each: Sequence[int] | None = None,
        job: str = "",
        tenant: str = "",
        priority: int = 0,
        cpu_milli: float = math.nan,
        memory_mib: float = math.nan,
        gpu_spec: str = "",
        start_time: float = math.nan,
        creation_time: float = math.nan,
        deletion_time: float = math.nan,
        scheduled_time: float = math.nan,
        migratable: bool = True,
        restart_cost_s: float = math.nan,
        qos: str = "",
        gpu_limit_milli: int | None = None,
    ) -> None:
        """One task. `node`+`gpus` place it (device indices); `gpu_milli_each` overrides the
        per-GPU share where GPUs differ (MIG slices). `gpu_milli` is the share guaranteed on
        each GPU, `gpu_limit_milli` (None: none) what it may use when the GPU has room: at
        least the guarantee, at most a whole GPU."""
        row = len(self._allocs)
        if gpu_limit_milli is not None and not gpu_milli <= gpu_limit_milli <= MILLI:
            raise ModelError(
                f"allocations[{id}].gpu_limit_milli",
                f"must be at least gpu_milli ({gpu_milli}) and at most {MILLI}, "
                f"got {gpu_limit_milli}",
            )
        if node is not None:
            self._node(node)
            shares = list(gpu_milli_each) if gpu_milli_each is not None else [gpu_milli] * len(gpus)
            if len(shares) != len(gpus):
                raise ModelError(f"allocations[{id}].gpu_milli_each", "one share per GPU")
            for index, milli in zip(gpus, shares, strict=True):
                self._places.append((row, node, int(index), int(milli)))
        self._allocs.append(
            {
                "id": id,
                "job": job or id,
                "tenant": tenant,
                "priority": priority,
                "num_gpu": num_gpu,
                "gpu_milli": gpu_milli,
                "cpu_milli": cpu_milli,
                "memory_mib": memory_mib,
                "gpu_spec": gpu_spec,
                "node": node,
                "start_time": start_time,
                "creation_time": creation_time,
                "deletion_time": deletion_time,
                "scheduled_time": scheduled_time,
                "migratable": migratable,
                "restart_cost_s": restart_cost_s,
                "qos": qos,
                "gpu_limit_milli": NO_LIMIT if gpu_limit_milli is None else int(gpu_limit_milli),
            }
        )

    def _node(self, name: str) -> _NodeRow:
        try:
            return self._nodes[self._node_pos[name]]
        except KeyError:
            raise ModelError(f"nodes[{name}]", f"unknown node {name!r}") from None

    def build(
        self,
        *,
        timestamp: float = math.nan,
        source: str = "",
        usage: tuple[Sequence[float], np.ndarray, np.ndarray] | None = None,
    ) -> ClusterModel:
        """Freeze into arrays. `usage` = (times, util (T,G), memory (T,G)) in built GPU order."""
        nodes = self._nodes
        for row in nodes:
            row.gpus.sort(key=lambda gpu: gpu["index"])
        counts = [len(row.gpus) for row in nodes]
        offset = np.zeros(len(nodes) + 1, dtype=np.int64)
        np.cumsum(counts, out=offset[1:])
        all_gpus = [gpu for row in nodes for gpu in row.gpus]
        gpu_pos = {
            (row.name, gpu["index"]): int(offset[i]) + j
            for i, row in enumerate(nodes)
            for j, gpu in enumerate(row.gpus)
        }

        def col(rows: list[dict], key: str, dtype: type) -> np.ndarray:
            if dtype is object:
                return object_array([r[key] for r in rows])
            return np.array([r[key] for r in rows], dtype=dtype).reshape(len(rows))

        node_cols = Nodes(
            name=object_array([r.name for r in nodes]),
            pool=object_array([r.pool for r in nodes]),
            rack=object_array([r.rack for r in nodes]),
            gpu_model=object_array([r.gpu_model for r in nodes]),
            cpu_milli=np.array([r.cpu_milli for r in nodes], dtype=np.float64),
            memory_mib=np.array([r.memory_mib for r in nodes], dtype=np.float64),
            schedulable=np.array([r.schedulable for r in nodes], dtype=bool),
            gpu_offset=offset,
        )
        gpu_cols = Gpus(
            node=np.repeat(np.arange(len(nodes), dtype=np.int32), counts),
            index=col(all_gpus, "index", np.int32),
            uuid=col(all_gpus, "uuid", object),
            memory_total_bytes=col(all_gpus, "memory_total_bytes", np.float64),
            healthy=col(all_gpus, "healthy", bool),
            lost=col(all_gpus, "lost", bool),
            nvlink_island=col(all_gpus, "nvlink_island", np.int32),
            mig_enabled=col(all_gpus, "mig_enabled", bool),
            carved_milli=col(all_gpus, "carved_milli", np.int32),
            utilization_ratio=col(all_gpus, "utilization_ratio", np.float64),
            memory_used_bytes=col(all_gpus, "memory_used_bytes", np.float64),
            power_watts=col(all_gpus, "power_watts", np.float64),
        )
        allocs = self._allocs
        node_of = np.array(
            [-1 if r["node"] is None else self._node_pos[r["node"]] for r in allocs],
            dtype=np.int32,
        )
        alloc_cols = allocations_from_columns(
            {
                **{k: [r[k] for r in allocs] for k in ALLOCATION_COLUMNS if k != "node"},
                "node": node_of,
            }
        )
        place_gpu = []
        for alloc_row, node, index, _ in self._places:
            try:
                place_gpu.append(gpu_pos[(node, index)])
            except KeyError:
                raise ModelError(
                    f"allocations[{allocs[alloc_row]['id']}].gpus",
                    f"node {node!r} has no GPU {index}",
                ) from None
        places = Placements(
            alloc=np.array([p[0] for p in self._places], dtype=np.int32),
            gpu=np.array(place_gpu, dtype=np.int32),
            milli=np.array([p[3] for p in self._places], dtype=np.int32),
        )
        if usage is None:
            usage_cols = Usage.empty(len(all_gpus))
        else:
            times, util, memory = usage
            usage_cols = Usage(
                np.asarray(times, dtype=np.float64),
                np.asarray(util, dtype=np.float32),
                np.asarray(memory, dtype=np.float32),
            )
        return ClusterModel(
            node_cols, gpu_cols, alloc_cols, places, usage_cols, timestamp=timestamp, source=source
        )
