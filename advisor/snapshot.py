"""One JSON file per cluster model: versioned, documented in docs/snapshot.md, checked on load.

A snapshot is what `gpu-defrag snapshot SOURCE > FILE` writes and what every other command reads
back as a source, so a capacity review can be re-run on exactly the state an SRE saw. Loading
checks every field by hand and names the first bad one by its JSON path (for example
`nodes[3].gpus[2].memory_total_bytes: expected a number or null, got "abc"`), because a planner
fed a silently wrong snapshot would recommend migrations on a cluster that does not exist.

Bounds are those of the model's columns: integers (GPU index, NVLink island, priority) must fit
the int32 columns that hold them, and numbers must be at most 2^53 in size (`MAX_EXACT`, the
largest magnitude up to which a float64 holds every whole number; placement converts CPU and
memory to int64), so a value the model cannot hold is refused here by its path instead of
overflowing somewhere downstream. One check spans two fields: a GPU's `memory_used_bytes` is at
most its `memory_total_bytes` where both are known (more in use than the GPU holds would read as
negative free memory); JSON Schema cannot compare two fields, so only the loader checks it.
The usage history is not: its points are float32 (a full GPU's may round above the total). A
key given twice in one object is refused by its path too: Python's json would keep the last one
without a word; so is a key the version does not define, at every level (`nodes[3].gpus[2].rak:
unknown key (did you mean 'rack'?); ...`), as the JSON Schema's `additionalProperties: false`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import IO, Any

import numpy as np

from advisor.input_bounds import (
    MAX_ALLOCATIONS,
    MAX_NODE_GPUS,
    MAX_NODES,
    MAX_TEXT,
    MAX_USAGE_POINTS,
    InputTooLarge,
    check_file_size,
    over,
)
from advisor.model import (
    MILLI,
    NO_LIMIT,
    UNKNOWN_ISLAND,
    ClusterModel,
    ModelBuilder,
    ModelError,
)
from gpu_defrag_common.files import write_text_atomic
from gpu_defrag_common.messages import unknown_key

SCHEMA = "gpu-defrag.snapshot"
VERSION = 1
# docs/snapshot.md: a new field means a new version, so any other key, at any level, is a typo
# whose content would otherwise be lost without a word (a misspelt `"migratible": false` would
# leave a protected job movable). The keys each object may hold, as the JSON Schema lists them.
TOP_LEVEL = ("schema", "version", "timestamp", "source", "nodes", "allocations", "usage")
NODE_KEYS = ("name", "pool", "rack", "gpu_model", "cpu_milli", "memory_mib", "schedulable", "gpus")
GPU_KEYS = (
    "index",
    "uuid",
    "memory_total_bytes",
    "healthy",
    "lost",
    "nvlink_island",
    "mig_enabled",
    "carved_milli",
    "utilization_ratio",
    "memory_used_bytes",
    "power_watts",
)
ALLOCATION_KEYS = (
    "id",
    "job",
    "tenant",
    "priority",
    "num_gpu",
    "gpu_milli",
    "gpu_limit_milli",
    "cpu_milli",
    "memory_mib",
    "gpu_spec",
    "node",
    "gpus",
    "gpu_milli_each",
    "start_time",
    "creation_time",
    "deletion_time",
    "scheduled_time",
    "migratable",
    "restart_cost_s",
    "qos",
)
USAGE_KEYS = ("times", "utilization_ratio", "memory_used_bytes")
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1  # the model's integer columns are int32
# Largest magnitude of a number field: up to it a float64 holds every whole number exactly, and
# an int64 (placement's CPU and memory columns) or a float32 (usage matrices) holds it too.
MAX_EXACT = 2**53


class SnapshotError(ModelError):
    """The snapshot file is not a valid snapshot; `field` is the JSON path of the problem."""


# --------------------------------------------------------------------------- writing


def _num(value: float) -> float | None:
    value = float(value)
    return None if math.isnan(value) else value


def _int_or_num(value: float) -> int | float | None:
    """Integral floats as ints (CPU milli, MiB), so files read naturally."""
    number = _num(value)
    if number is not None and number.is_integer():
        return int(number)
    return number


def to_dict(model: ClusterModel) -> dict[str, Any]:
    """The snapshot document of `model` (plain JSON types, NaN as null)."""
    nodes, gpus, allocs = model.nodes, model.gpus, model.allocations
    node_docs = []
    for i in range(len(nodes)):
        start, stop = int(nodes.gpu_offset[i]), int(nodes.gpu_offset[i + 1])
        node_docs.append(
            {
                "name": nodes.name[i],
                "pool": nodes.pool[i],
                "rack": nodes.rack[i],
                "gpu_model": nodes.gpu_model[i],
                "cpu_milli": _int_or_num(nodes.cpu_milli[i]),
                "memory_mib": _int_or_num(nodes.memory_mib[i]),
                "schedulable": bool(nodes.schedulable[i]),
                "gpus": [
                    {
                        "index": int(gpus.index[g]),
                        "uuid": gpus.uuid[g],
                        "memory_total_bytes": _int_or_num(gpus.memory_total_bytes[g]),
                        "healthy": bool(gpus.healthy[g]),
                        "lost": bool(gpus.lost[g]),
                        "nvlink_island": (
                            None
                            if gpus.nvlink_island[g] == UNKNOWN_ISLAND
                            else int(gpus.nvlink_island[g])
                        ),
                        "mig_enabled": bool(gpus.mig_enabled[g]),
                        # only a MIG GPU can carve less than the whole GPU
                        **(
                            {"carved_milli": int(gpus.carved_milli[g])}
                            if gpus.mig_enabled[g]
                            else {}
                        ),
                        "utilization_ratio": _num(gpus.utilization_ratio[g]),
                        "memory_used_bytes": _int_or_num(gpus.memory_used_bytes[g]),
                        "power_watts": _num(gpus.power_watts[g]),
                    }
                    for g in range(start, stop)
                ],
            }
        )
    places = model.placements
    order = np.argsort(places.alloc, kind="stable")
    bounds = np.searchsorted(places.alloc[order], np.arange(len(allocs) + 1))
    alloc_docs = []
    for a in range(len(allocs)):
        rows = order[bounds[a] : bounds[a + 1]]
        node = int(allocs.node[a])
        doc: dict[str, Any] = {
            "id": allocs.id[a],
            "job": allocs.job[a],
            "tenant": allocs.tenant[a],
            "priority": int(allocs.priority[a]),
            "num_gpu": int(allocs.num_gpu[a]),
            "gpu_milli": int(allocs.gpu_milli[a]),
            # only where the source gives a limit: the others are held to their guarantee
            **(
                {"gpu_limit_milli": int(allocs.gpu_limit_milli[a])}
                if allocs.gpu_limit_milli[a] != NO_LIMIT
                else {}
            ),
            "cpu_milli": _int_or_num(allocs.cpu_milli[a]),
            "memory_mib": _int_or_num(allocs.memory_mib[a]),
            "gpu_spec": allocs.gpu_spec[a],
            "node": None if node < 0 else nodes.name[node],
            "gpus": [int(gpus.index[places.gpu[r]]) for r in rows],
        }
        milli_each = [int(places.milli[r]) for r in rows]
        if any(m != allocs.gpu_milli[a] for m in milli_each):
            doc["gpu_milli_each"] = milli_each
        doc.update(
            {
                "start_time": _num(allocs.start_time[a]),
                "creation_time": _num(allocs.creation_time[a]),
                "deletion_time": _num(allocs.deletion_time[a]),
                "scheduled_time": _num(allocs.scheduled_time[a]),
                "migratable": bool(allocs.migratable[a]),
                "restart_cost_s": _num(allocs.restart_cost_s[a]),
                "qos": allocs.qos[a],
            }
        )
        alloc_docs.append(doc)
    usage = model.usage

    def matrix(values: np.ndarray) -> list[list[float | None]]:
        return [[None if math.isnan(v) else v for v in row] for row in values.tolist()]

    return {
        "schema": SCHEMA,
        "version": VERSION,
        "timestamp": _num(model.timestamp),
        "source": model.source,
        "nodes": node_docs,
        "allocations": alloc_docs,
        "usage": {
            "times": usage.times.tolist(),
            "utilization_ratio": matrix(usage.utilization_ratio),
            "memory_used_bytes": matrix(usage.memory_used_bytes),
        },
    }


def dumps(model: ClusterModel) -> str:
    """The snapshot as one line of JSON text (built whole: a failure writes nothing). It passes
    the loader's own checks first (SnapshotError naming the field otherwise): a file `load`
    would refuse is never written, whatever the source let through."""
    doc = to_dict(model)
    from_dict(doc)
    return json.dumps(doc, allow_nan=False, separators=(",", ":")) + "\n"


def dump(model: ClusterModel, stream: IO[str]) -> None:
    stream.write(dumps(model))


def save(model: ClusterModel, path: str | Path) -> None:
    """Write atomically: a failure (disk full, a value JSON cannot hold) never leaves half a
    snapshot behind, and an existing file stays as it was."""
    write_text_atomic(path, dumps(model))


# --------------------------------------------------------------------------- reading


class _Fields:
    """Typed access to one JSON object that names the path of any bad field."""

    def __init__(self, doc: Any, path: str) -> None:
        if not isinstance(doc, dict):
            raise SnapshotError(path or "(top level)", f"expected an object, got {_show(doc)}")
        self.doc, self.path = doc, path
        if isinstance(doc, _RepeatedKeys):
            raise SnapshotError(
                self._where(doc.repeated), "key given twice in one object (only one may stay)"
            )

    def only(self, keys: tuple[str, ...], what: str) -> _Fields:
        """Refuse the first key that is not one of `keys` (`what` names the object), by its
        path: `nodes[3].gpus[2].migratible: unknown key (did you mean "mig_enabled"?; ...)`."""
        for key in self.doc:
            if key not in keys:
                raise SnapshotError(self._where(str(key)), unknown_key(str(key), keys, what))
        return self

    def _where(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def _get(self, key: str, required: bool) -> Any:
        if key not in self.doc:
            if required:
                raise SnapshotError(self._where(key), "required field is missing")
            return None
        return self.doc[key]

    def string(self, key: str, *, required: bool = False) -> str:
        value = self._get(key, required)
        if value is None and not required:
            return ""
        if not isinstance(value, str):
            raise SnapshotError(self._where(key), f"expected a string, got {_show(value)}")
        if len(value) > MAX_TEXT:
            raise SnapshotError(
                self._where(key), f"{len(value):,} characters, at most {MAX_TEXT:,}"
            )
        return value

    def number(
        self, key: str, *, minimum: float | None = None, maximum: float | None = None
    ) -> float:
        """A number or null (-> NaN), at most `MAX_EXACT` in size."""
        value = self._get(key, False)
        if value is None:
            return math.nan
        if not _is_number(value):
            raise SnapshotError(self._where(key), f"expected a number or null, got {_show(value)}")
        if minimum is not None and value < minimum and maximum is None:
            raise SnapshotError(self._where(key), f"must be >= {minimum:g}, got {_show(value)}")
        low = -MAX_EXACT if minimum is None else minimum
        high = MAX_EXACT if maximum is None else maximum
        if not low <= value <= high:
            raise SnapshotError(
                self._where(key), f"must be within {low}..{high}, got {_show(value)}"
            )
        return float(value)

    def integer(
        self,
        key: str,
        default: int | None = None,
        *,
        minimum: int = INT32_MIN,
        maximum: int = INT32_MAX,
    ) -> int:
        """An integer within minimum..maximum (by default what an int32 column holds)."""
        value = self._get(key, default is None)
        if value is None:
            return default  # type: ignore[return-value]
        if isinstance(value, bool) or not isinstance(value, int):
            raise SnapshotError(self._where(key), f"expected an integer, got {_show(value)}")
        if not minimum <= value <= maximum:
            raise SnapshotError(
                self._where(key), f"must be within {minimum}..{maximum}, got {_show(value)}"
            )
        return value

    def optional_integer(
        self, key: str, *, minimum: int = INT32_MIN, maximum: int = INT32_MAX
    ) -> int | None:
        if self._get(key, False) is None:
            return None
        return self.integer(key, minimum=minimum, maximum=maximum)

    def boolean(self, key: str, default: bool) -> bool:
        value = self._get(key, False)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise SnapshotError(self._where(key), f"expected true or false, got {_show(value)}")
        return value

    def array(self, key: str, *, required: bool = False) -> list[Any]:
        value = self._get(key, required)
        if value is None:
            return []
        if not isinstance(value, list):
            raise SnapshotError(self._where(key), f"expected an array, got {_show(value)}")
        return value


def _is_number(value: Any) -> bool:
    """A finite JSON number (Python's json reads NaN and Infinity, which JSON cannot hold). Any
    integer is one, however large: callers bound the size (`MAX_EXACT`, int32)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return isinstance(value, int) or math.isfinite(value)


def _show(value: Any) -> str:
    try:
        text = json.dumps(value)  # NaN, Infinity and -Infinity as Python's json reads them
    except (RecursionError, ValueError):  # nested deeper than json writes, a 5000-digit int
        return f"<{type(value).__name__} too large to show>"
    return text if len(text) <= 40 else text[:37] + "..."


class _RepeatedKeys(dict):
    """A JSON object that gave a key twice; `repeated` is the first such key."""

    repeated: str = ""


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json's object_pairs_hook: a plain dict, or `_RepeatedKeys` when a key came twice (the
    reader that looks at the object then names it by its path)."""
    doc = dict(pairs)
    if len(doc) == len(pairs):
        return doc
    marked = _RepeatedKeys(doc)
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            marked.repeated = key
            break
        seen.add(key)
    return marked


def parse_json(text: str) -> Any:
    """JSON text as Python values, objects with a repeated key marked (see `repeated_key`).
    Raises what json.loads raises, and RecursionError for arrays nested too deep to read."""
    return json.loads(text, object_pairs_hook=_object)


class JsonFileError(ValueError):
    """A file's text is no JSON the readers take; the message says why, in one line."""


def read_json(path: str | Path) -> Any:
    """`parse_json` of a file; JsonFileError for text that is not UTF-8, not JSON, nested deeper
    than the reader goes or holding an integer of more digits than Python converts (OSError,
    a file that cannot be read, is left to the caller, which names what it was reading)."""
    try:
        with open(path, encoding="utf-8") as stream:
            return parse_json(stream.read())
    except json.JSONDecodeError as error:
        raise JsonFileError(
            f"not JSON: {error.msg} at line {error.lineno} column {error.colno}"
        ) from None
    except UnicodeDecodeError as error:
        raise JsonFileError(
            f"not UTF-8 text: {error.reason} at byte offset {error.start}"
        ) from None
    except RecursionError:
        raise JsonFileError("JSON nested too deeply") from None
    except ValueError as error:  # an integer of more digits than Python converts
        reason = str(error).split(";")[0]  # not the hint to raise Python's own limit
        raise JsonFileError(f"JSON integer too long: {reason}") from None


def repeated_key(doc: Any) -> str | None:
    """The key an object read by `parse_json` gave twice, or None."""
    return doc.repeated if isinstance(doc, _RepeatedKeys) else None


def _usage(doc: Any, gpu_count: int) -> tuple[list[float], np.ndarray, np.ndarray] | None:
    if doc is None:
        return None
    fields = _Fields(doc, "usage").only(USAGE_KEYS, "usage")
    times = fields.array("times")
    for t, value in enumerate(times):
        if not _is_number(value):
            raise SnapshotError(f"usage.times[{t}]", f"expected a number, got {_show(value)}")
        if abs(value) > MAX_EXACT:
            raise SnapshotError(
                f"usage.times[{t}]", f"must be within {-MAX_EXACT}..{MAX_EXACT}, got {_show(value)}"
            )
        if t and value <= times[t - 1]:
            raise SnapshotError(
                f"usage.times[{t}]",
                f"times must ascend, got {_show(value)} after {_show(times[t - 1])}",
            )
    _bounded("usage.times", len(times) * gpu_count, MAX_USAGE_POINTS, "usage points (times × GPUs)")
    matrices = []
    # the values a GPU can report (as `ingest.exporter_scrape.POSSIBLE`): a point outside them
    # would count as idle or busy in the idle window; every reader writes a gap (null) instead
    bounds = {"utilization_ratio": (0, 1), "memory_used_bytes": (0, MAX_EXACT)}
    for key, (low, high) in bounds.items():
        rows = fields.array(key)
        if len(rows) != len(times):
            raise SnapshotError(f"usage.{key}", f"has {len(rows)} rows for {len(times)} times")
        out = np.full((len(times), gpu_count), np.nan, dtype=np.float32)
        for t, row in enumerate(rows):
            if not isinstance(row, list) or len(row) != gpu_count:
                raise SnapshotError(
                    f"usage.{key}[{t}]", f"expected an array of {gpu_count} numbers or nulls"
                )
            for g, value in enumerate(row):
                if value is None:
                    continue
                if not _is_number(value):
                    raise SnapshotError(
                        f"usage.{key}[{t}][{g}]", f"expected a number or null, got {_show(value)}"
                    )
                if not low <= value <= high:  # (and a float32 would hold beyond 2^53 as inf)
                    raise SnapshotError(
                        f"usage.{key}[{t}][{g}]",
                        f"must be within {low}..{high}, got {_show(value)}",
                    )
                out[t, g] = value
        matrices.append(out)
    return times, matrices[0], matrices[1]


def from_dict(doc: Any) -> ClusterModel:
    """Check and build; SnapshotError names the first bad field by its JSON path."""
    top = _Fields(doc, "")
    schema = top.string("schema", required=True)
    if schema != SCHEMA:
        raise SnapshotError("schema", f"expected {SCHEMA!r}, got {schema!r}")
    version = top.integer("version")
    if version > VERSION or version < 1:
        raise SnapshotError(
            "version", f"snapshot version {version} is not readable here (reads 1..{VERSION})"
        )
    top.only(TOP_LEVEL, "a snapshot")  # after the version: a newer file says so first
    builder = ModelBuilder()
    gpu_count = 0
    uuids: dict[str, str] = {}  # GPU uuid -> the path that gave it first
    nodes = top.array("nodes", required=True)
    _bounded("nodes", len(nodes), MAX_NODES, "nodes")
    for i, raw in enumerate(nodes):
        node = _Fields(raw, f"nodes[{i}]").only(NODE_KEYS, "a node")
        name = node.string("name", required=True)
        if not name:
            raise SnapshotError(f"{node.path}.name", "must not be empty")
        _wrap(
            node.path,
            lambda node=node, name=name: builder.add_node(
                name,
                pool=node.string("pool"),
                rack=node.string("rack"),
                gpu_model=node.string("gpu_model"),
                cpu_milli=node.number("cpu_milli", minimum=0),
                memory_mib=node.number("memory_mib", minimum=0),
                schedulable=node.boolean("schedulable", True),
            ),
        )
        node_gpus = node.array("gpus")
        _bounded(f"{node.path}.gpus", len(node_gpus), MAX_NODE_GPUS, "GPUs on one node")
        for j, raw_gpu in enumerate(node_gpus):
            gpu = _Fields(raw_gpu, f"nodes[{i}].gpus[{j}]").only(GPU_KEYS, "a gpu")
            uuid = gpu.string("uuid")
            if uuid:  # "" is unknown; a uuid names one GPU in the whole fleet
                first = uuids.setdefault(uuid, gpu.path)
                if first != gpu.path:
                    raise SnapshotError(f"{gpu.path}.uuid", f"{uuid!r} is also {first}'s")
            island = gpu.optional_integer("nvlink_island", minimum=0)  # null is unknown
            _wrap(
                gpu.path,
                lambda gpu=gpu, name=name, island=island: builder.add_gpu(
                    name,
                    gpu.integer("index", minimum=0),
                    uuid=gpu.string("uuid"),
                    memory_total_bytes=gpu.number("memory_total_bytes", minimum=0),
                    healthy=gpu.boolean("healthy", True),
                    lost=gpu.boolean("lost", False),
                    nvlink_island=UNKNOWN_ISLAND if island is None else island,
                    mig_enabled=gpu.boolean("mig_enabled", False),
                    carved_milli=gpu.integer("carved_milli", MILLI, minimum=0, maximum=MILLI),
                    utilization_ratio=gpu.number("utilization_ratio", minimum=0, maximum=1),
                    memory_used_bytes=gpu.number("memory_used_bytes", minimum=0),
                    power_watts=gpu.number("power_watts", minimum=0),
                ),
            )
            used = gpu.number("memory_used_bytes", minimum=0)
            if used > gpu.number("memory_total_bytes", minimum=0):  # False where either is null
                raise SnapshotError(
                    f"{gpu.path}.memory_used_bytes",
                    f"must be at most memory_total_bytes ({_show(gpu.doc['memory_total_bytes'])}),"
                    f" got {_show(gpu.doc['memory_used_bytes'])}",
                )
            gpu_count += 1
    allocations = top.array("allocations")
    _bounded("allocations", len(allocations), MAX_ALLOCATIONS, "allocations")
    for i, raw in enumerate(allocations):
        alloc = _Fields(raw, f"allocations[{i}]").only(ALLOCATION_KEYS, "an allocation")
        node_name = alloc.doc.get("node")
        if node_name is not None:
            node_name = alloc.string("node")
        gpus = alloc.array("gpus")
        for j, index in enumerate(gpus):
            if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index <= INT32_MAX:
                raise SnapshotError(
                    f"{alloc.path}.gpus[{j}]", f"expected a GPU index, got {_show(index)}"
                )
        if gpus and node_name is None:
            raise SnapshotError(f"{alloc.path}.gpus", "GPUs listed but node is null")
        each = alloc.array("gpu_milli_each") if "gpu_milli_each" in alloc.doc else None
        if each is not None:
            for j, milli in enumerate(each):
                if isinstance(milli, bool) or not isinstance(milli, int) or not 0 < milli <= MILLI:
                    raise SnapshotError(
                        f"{alloc.path}.gpu_milli_each[{j}]", f"expected 1..1000, got {_show(milli)}"
                    )
        milli = alloc.integer("gpu_milli", MILLI, minimum=0, maximum=MILLI)
        if gpus and each is None and milli == 0:  # each listed GPU would hold nothing
            raise SnapshotError(
                f"{alloc.path}.gpu_milli",
                "must be within 1..1000 for a task that holds GPUs, got 0",
            )
        limit = alloc.optional_integer("gpu_limit_milli", minimum=1, maximum=MILLI)
        if limit is not None and not max(milli, 1) <= limit <= MILLI:
            raise SnapshotError(
                f"{alloc.path}.gpu_limit_milli",
                f"must be within gpu_milli..1000 ({max(milli, 1)}..{MILLI}: a limit is at "
                f"least the guaranteed share), got {limit}",
            )
        _wrap(
            alloc.path,
            lambda alloc=alloc, node_name=node_name, gpus=gpus, each=each, limit=limit: (
                builder.add_allocation(
                    alloc.string("id", required=True),
                    num_gpu=alloc.integer("num_gpu", minimum=0, maximum=MAX_NODE_GPUS),
                    gpu_milli=alloc.integer("gpu_milli", MILLI, minimum=0, maximum=MILLI),
                    node=node_name,
                    gpus=gpus,
                    gpu_milli_each=each,
                    job=alloc.string("job"),
                    tenant=alloc.string("tenant"),
                    priority=alloc.integer("priority", 0),
                    cpu_milli=alloc.number("cpu_milli", minimum=0),
                    memory_mib=alloc.number("memory_mib", minimum=0),
                    gpu_spec=alloc.string("gpu_spec"),
                    start_time=alloc.number("start_time"),
                    creation_time=alloc.number("creation_time"),
                    deletion_time=alloc.number("deletion_time"),
                    scheduled_time=alloc.number("scheduled_time"),
                    migratable=alloc.boolean("migratable", True),
                    restart_cost_s=alloc.number("restart_cost_s", minimum=0),
                    qos=alloc.string("qos"),
                    gpu_limit_milli=limit,
                )
            ),
        )
    usage = _usage(doc.get("usage"), gpu_count)
    timestamp = top.number("timestamp")
    try:
        return builder.build(timestamp=timestamp, source=top.string("source"), usage=usage)
    except SnapshotError:
        raise
    except ModelError as error:
        raise SnapshotError(error.field, error.problem) from None


def _bounded(path: str, count: int, bound: int, what: str) -> None:
    problem = over(count, bound, what)
    if problem is not None:
        raise SnapshotError(path, problem)


def _wrap(path: str, add: Any) -> None:
    """Run a builder call; a ModelError from it is re-raised under the snapshot path."""
    try:
        add()
    except SnapshotError:
        raise
    except ModelError as error:
        raise SnapshotError(path, error.problem) from None


def load(path: str | Path) -> ClusterModel:
    """Read a snapshot file; SnapshotError (a ValueError) says which field is wrong and why:
    also for a file that is not UTF-8, not JSON, or nested deeper than the reader goes."""
    try:
        check_file_size(path, "snapshot")
        doc = read_json(path)
    except InputTooLarge as error:
        raise SnapshotError("(file)", str(error)) from None
    except JsonFileError as error:
        raise SnapshotError("(file)", str(error)) from None
    except OSError as error:
        raise SnapshotError("(file)", f"cannot read {path}: {error.strerror}") from None
    return from_dict(doc)
