"""Read the Alibaba openb trace (node list + pod list CSVs) into plain typed arrays.

The trace is the one the FGD paper (USENIX ATC'23) was evaluated on. Readers return numpy
arrays, one per column, so the cluster model, the FGD measure and the replay can vectorise over
them. Malformed input raises `OpenbFormatError` with a one-line message naming file, line and
column, because a silent coercion here would shift every fragmentation figure downstream.
Numbers are bounded as a snapshot's are (at most 2^53 in size, `snapshot.MAX_EXACT`), so
`gpu-defrag snapshot openb:...` writes exactly the trace that `analyze openb:...` reads.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from advisor.input_bounds import (
    MAX_ALLOCATIONS,
    MAX_NODE_GPUS,
    MAX_NODES,
    MAX_TEXT,
    InputTooLarge,
    check_file_size,
)
from advisor.model import MILLI
from advisor.snapshot import MAX_EXACT

MAX_GPUS = MAX_NODE_GPUS  # the most GPUs a node holds or a pod asks for

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
NODE_OPTIONAL = ("rack", "pool")  # not in the trace; the simulated fleet's export writes them
POD_REQUIRED = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
POD_OPTIONAL = (
    "gpu_spec",
    "qos",
    "pod_phase",
    "creation_time",
    "deletion_time",
    "scheduled_time",
)


class OpenbFormatError(ValueError):
    """A trace file that does not follow the openb schema (message names file, line, column)."""


@dataclass(frozen=True)
class NodeTable:
    """One row per node; `model` is "" for CPU-only nodes."""

    name: np.ndarray  # str (object)
    cpu_milli: np.ndarray  # int64
    memory_mib: np.ndarray  # int64
    gpu: np.ndarray  # int64, number of GPUs
    model: np.ndarray  # str (object)
    source: str = ""
    # optional columns beyond the trace's own (the simulated fleet's export writes them):
    # rack and pool per node, "" unknown; None when the file has no such column
    rack: np.ndarray | None = None
    pool: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.name)

    @property
    def total_gpus(self) -> int:
        return int(self.gpu.sum())


@dataclass(frozen=True)
class PodTable:
    """One row per pod (task). `gpu_milli` is per GPU; `gpu_spec` "" means any model.

    Times are seconds as float, NaN where the file leaves them empty or lacks the column
    (the multigpu files have only the first five columns).
    """

    name: np.ndarray  # str (object)
    cpu_milli: np.ndarray  # int64
    memory_mib: np.ndarray  # int64
    num_gpu: np.ndarray  # int64
    gpu_milli: np.ndarray  # int64, per GPU, 0..1000
    gpu_spec: np.ndarray  # str (object), allowed models joined by "|", "" = any
    qos: np.ndarray  # str (object)
    pod_phase: np.ndarray  # str (object)
    creation_time: np.ndarray  # float64
    deletion_time: np.ndarray  # float64
    scheduled_time: np.ndarray  # float64
    source: str = ""

    def __len__(self) -> int:
        return len(self.name)

    @property
    def total_gpu_milli(self) -> np.ndarray:
        """GPU milli requested by each pod (num_gpu x gpu_milli)."""
        return self.num_gpu * self.gpu_milli

    def take(self, index: np.ndarray) -> PodTable:
        """A new table with the rows at `index` (for shuffles and resampling)."""
        idx = np.asarray(index, dtype=np.int64)
        return PodTable(
            name=self.name[idx],
            cpu_milli=self.cpu_milli[idx],
            memory_mib=self.memory_mib[idx],
            num_gpu=self.num_gpu[idx],
            gpu_milli=self.gpu_milli[idx],
            gpu_spec=self.gpu_spec[idx],
            qos=self.qos[idx],
            pod_phase=self.pod_phase[idx],
            creation_time=self.creation_time[idx],
            deletion_time=self.deletion_time[idx],
            scheduled_time=self.scheduled_time[idx],
            source=self.source,
        )


def _read_rows(path: Path, required: tuple[str, ...]) -> tuple[list[str], list[list[str]]]:
    """The header and rows of a trace CSV, bounded (`advisor.input_bounds`): the file's size,
    its rows, a field's length; a byte-order mark is taken at the start of the file only."""
    try:
        check_file_size(path, "trace file")
        # utf-8-sig: a spreadsheet's byte-order mark is not part of the first column's name
        with path.open(newline="", encoding="utf-8-sig") as fh:
            rows = _bounded_rows(path, csv.reader(fh))
    except InputTooLarge as exc:
        raise OpenbFormatError(str(exc)) from None
    except OSError as exc:
        raise OpenbFormatError(f"{path}: cannot read file ({exc.strerror or exc})") from exc
    except UnicodeDecodeError as exc:
        raise OpenbFormatError(f"{path}: not UTF-8 text ({exc.reason})") from exc
    if not rows:
        raise OpenbFormatError(f"{path}: empty file, expected a header line")
    header = [h.strip() for h in rows[0]]
    missing = [c for c in required if c not in header]
    if missing:
        raise OpenbFormatError(
            f"{path} line 1: missing column(s) {', '.join(missing)} (header: {','.join(header)})"
        )
    data = rows[1:]
    for i, row in enumerate(data, start=2):
        if len(row) != len(header):
            raise OpenbFormatError(
                f"{path} line {i}: {len(row)} fields, the header has {len(header)}"
            )
    return header, data


def _bounded_rows(path: Path, reader: Any) -> list[list[str]]:
    """Every row, refusing a field longer than csv's limit (it raised a bare `_csv.Error`: a
    traceback), more rows than `MAX_ALLOCATIONS` and a byte-order mark past the file's start
    (two files joined with their marks: a name that looks like another and is not)."""
    rows: list[list[str]] = []
    try:
        for row in reader:
            if len(rows) > MAX_ALLOCATIONS:
                raise OpenbFormatError(f"{path}: more than {MAX_ALLOCATIONS:,} rows")
            if any("\ufeff" in field for field in row):
                raise OpenbFormatError(
                    f"{path} line {reader.line_num}: a byte-order mark (U+FEFF) inside the file "
                    "(files joined with their marks?)"
                )
            rows.append(row)
    except csv.Error as exc:
        if "field limit" in str(exc):
            raise OpenbFormatError(
                f"{path} line {reader.line_num}: a field longer than "
                f"{csv.field_size_limit():,} characters"
            ) from None
        raise OpenbFormatError(f"{path} line {reader.line_num}: not CSV ({exc})") from None
    return rows


def _int_column(
    path: Path, header: list[str], data: list[list[str]], col: str, lo: int, hi: int = MAX_EXACT
) -> np.ndarray:
    j = header.index(col)
    out = np.empty(len(data), dtype=np.int64)
    for i, row in enumerate(data):
        raw = row[j].strip()
        try:
            value = int(raw)
        except ValueError:
            try:
                f = float(raw)
            except ValueError:
                f = math.nan
            if not math.isfinite(f) or f != int(f):
                raise OpenbFormatError(
                    f"{path} line {i + 2}, column {col}: {raw!r} is not an integer"
                ) from None
            value = int(f)
        if not lo <= value <= hi:
            shown = str(value) if len(str(value)) <= 40 else str(value)[:37] + "..."
            raise OpenbFormatError(
                f"{path} line {i + 2}, column {col}: {shown} is out of range ({lo}..{hi})"
            )
        out[i] = value
    return out


def _str_column(path: Path, header: list[str], data: list[list[str]], col: str) -> np.ndarray:
    if col not in header:
        return np.full(len(data), "", dtype=object)
    j = header.index(col)
    values = [row[j].strip() for row in data]
    for i, value in enumerate(values):
        if len(value) > MAX_TEXT:
            raise OpenbFormatError(
                f"{path} line {i + 2}, column {col}: {len(value):,} characters, at most {MAX_TEXT:,}"
            )
    return np.array([("" if v.lower() == "nan" else v) for v in values], dtype=object)


def _time_column(path: Path, header: list[str], data: list[list[str]], col: str) -> np.ndarray:
    out = np.full(len(data), np.nan, dtype=np.float64)
    if col not in header:
        return out
    j = header.index(col)
    for i, row in enumerate(data):
        raw = row[j].strip()
        if raw == "" or raw.lower() == "nan":
            continue
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):  # "inf" too: a snapshot could not hold it
            raise OpenbFormatError(
                f"{path} line {i + 2}, column {col}: {raw!r} is not a number of seconds"
            )
        if not 0 <= value <= MAX_EXACT:  # seconds since the trace began
            raise OpenbFormatError(
                f"{path} line {i + 2}, column {col}: {raw!r} is out of range "
                f"(0..{MAX_EXACT} seconds since the trace began)"
            )
        out[i] = value
    return out


def _unique_names(path: Path, names: np.ndarray, col: str, what: str) -> np.ndarray:
    """`names`, each non-empty and given once (one pass: a name -> its first line)."""
    first: dict[str, int] = {}
    for i, name in enumerate(names.tolist()):
        if name == "":
            raise OpenbFormatError(f"{path} line {i + 2}, column {col}: empty {what}")
        line = first.setdefault(name, i + 2)
        if line != i + 2:
            raise OpenbFormatError(
                f"{path} line {i + 2}, column {col}: duplicate {what} {name[:80]!r} "
                f"(also line {line})"
            )
    return names


def read_nodes(path: str | Path) -> NodeTable:
    """Read an openb node list (`sn,cpu_milli,memory_mib,gpu,model`, optionally `rack` and
    `pool`); a list without nodes is an error, not an empty cluster whose measures would all
    read zero."""
    p = Path(path)
    header, data = _read_rows(p, NODE_COLUMNS)
    if not data:
        raise OpenbFormatError(f"no nodes in {p}")
    gpu = _int_column(p, header, data, "gpu", 0, MAX_GPUS)
    model = _str_column(p, header, data, "model")
    for i in range(len(data)):
        if gpu[i] > 0 and model[i] == "":
            raise OpenbFormatError(f"{p} line {i + 2}, column model: empty for a node with GPUs")
    if len(data) > MAX_NODES:
        raise OpenbFormatError(f"{p}: {len(data):,} nodes, at most {MAX_NODES:,}")
    names = _unique_names(p, _str_column(p, header, data, "sn"), "sn", "node name")
    return NodeTable(
        name=names,
        cpu_milli=_int_column(p, header, data, "cpu_milli", 0),
        memory_mib=_int_column(p, header, data, "memory_mib", 0),
        gpu=gpu,
        model=model,
        source=str(p),
        rack=_str_column(p, header, data, "rack") if "rack" in header else None,
        pool=_str_column(p, header, data, "pool") if "pool" in header else None,
    )


def read_pods(path: str | Path) -> PodTable:
    """Read an openb pod list; the six columns after `gpu_milli` are optional."""
    p = Path(path)
    header, data = _read_rows(p, POD_REQUIRED)
    num_gpu = _int_column(p, header, data, "num_gpu", 0, MAX_GPUS)
    gpu_milli = _int_column(p, header, data, "gpu_milli", 0, MILLI)
    for i in range(len(data)):
        if num_gpu[i] == 0 and gpu_milli[i] != 0:
            raise OpenbFormatError(
                f"{p} line {i + 2}, column gpu_milli: {gpu_milli[i]} but num_gpu is 0"
            )
        if num_gpu[i] >= 1 and gpu_milli[i] == 0:
            raise OpenbFormatError(
                f"{p} line {i + 2}, column gpu_milli: 0 but num_gpu is {num_gpu[i]}"
            )
        if num_gpu[i] > 1 and gpu_milli[i] != MILLI:
            raise OpenbFormatError(
                f"{p} line {i + 2}, column gpu_milli: {gpu_milli[i]} with num_gpu "
                f"{num_gpu[i]}; multi-GPU requests must be whole GPUs (1000)"
            )
    created = _time_column(p, header, data, "creation_time")
    deleted = _time_column(p, header, data, "deletion_time")
    scheduled = _time_column(p, header, data, "scheduled_time")
    for later, name in ((deleted, "deletion_time"), (scheduled, "scheduled_time")):
        backwards = np.flatnonzero(later < created)  # NaN (unknown) compares false: kept
        if backwards.size:
            i = int(backwards[0])
            raise OpenbFormatError(
                f"{p} line {i + 2}, column {name}: {later[i]:g} is before the pod's "
                f"creation_time {created[i]:g}"
            )
    return PodTable(
        name=_unique_names(p, _str_column(p, header, data, "name"), "name", "pod name"),
        cpu_milli=_int_column(p, header, data, "cpu_milli", 0),
        memory_mib=_int_column(p, header, data, "memory_mib", 0),
        num_gpu=num_gpu,
        gpu_milli=gpu_milli,
        gpu_spec=_str_column(p, header, data, "gpu_spec"),
        qos=_str_column(p, header, data, "qos"),
        pod_phase=_str_column(p, header, data, "pod_phase"),
        creation_time=created,
        deletion_time=deleted,
        scheduled_time=scheduled,
        source=str(p),
    )
