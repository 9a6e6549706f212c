"""The jobs a simulation replays: one table, read from an openb pod list or the generic job CSV.

A job is `num_nodes` tasks (one per node, a gang that starts whole or not at all), each of
`num_gpu` GPUs at `gpu_milli` per GPU, plus CPU and memory per task. It is submitted at
`submit_s` and, once started, runs `duration_s` (plus any restart time a migration costs it).

The generic job CSV (`read_job_csv`, `write_job_csv`; docs/simulate.md) has the columns
`submit_time, duration_s, num_nodes, gpus_per_node, gpu_milli, tenant, priority, gpu_model`
and, optionally, `name, cpu_milli, memory_mib, utilization, restart_s, migratable`. Any other
column is refused by name, as is a value out of range (file, line and column in one line).

`compress(jobs, load, capacity)` scales submit times so that the offered GPU demand
(`offered_load`) is `load` x capacity; durations are kept (docs/simulate.md, "Load").
"""

from __future__ import annotations

import csv
import functools
import math
from dataclasses import dataclass, fields, replace
from pathlib import Path

import numpy as np

from advisor.ingest.openb import MAX_GPUS, PodTable
from advisor.model import MILLI
from advisor.snapshot import MAX_EXACT

JOB_COLUMNS = (
    "submit_time",
    "duration_s",
    "num_nodes",
    "gpus_per_node",
    "gpu_milli",
    "tenant",
    "priority",
    "gpu_model",
)
OPTIONAL_COLUMNS = ("name", "cpu_milli", "memory_mib", "utilization", "restart_s", "migratable")
MAX_NODES_PER_JOB = 4096
MIN_DURATION_S = 1.0  # a trace row whose task ended the second it started still held its GPUs
_TRUE = {"true", "1", "yes"}
_FALSE = {"false", "0", "no"}


class JobFormatError(ValueError):
    """A job file that does not follow the schema (file, line and column in the message)."""


@dataclass(frozen=True)
class JobTable:
    """One row per job; times in seconds. NaN utilization / restart time: unknown."""

    name: np.ndarray  # object[str]
    submit_s: np.ndarray  # float64
    duration_s: np.ndarray  # float64, > 0
    num_nodes: np.ndarray  # int64 tasks (one per node)
    num_gpu: np.ndarray  # int64 GPUs per task
    gpu_milli: np.ndarray  # int64 milli-GPU per GPU (1000 whole; 0 for CPU-only)
    cpu_milli: np.ndarray  # int64 per task
    memory_mib: np.ndarray  # int64 per task
    gpu_spec: np.ndarray  # object[str] allowed GPU models "A|B", "" = any
    tenant: np.ndarray  # object[str]
    priority: np.ndarray  # int64, higher first
    utilization: np.ndarray  # float64 mean GPU utilization 0..1, NaN unknown
    restart_s: np.ndarray  # float64 checkpoint/restart seconds, NaN unknown
    migratable: np.ndarray  # bool
    source: str = ""

    def __len__(self) -> int:
        return len(self.name)

    @functools.cached_property
    def gpus(self) -> np.ndarray:
        """GPU share each job holds while it runs (all tasks), float."""
        return self.num_nodes * self.num_gpu * self.gpu_milli / MILLI

    @functools.cached_property
    def size_gpus(self) -> np.ndarray:
        """GPUs requested, whole GPUs counted whole and a share of one GPU as 1 (the per-size
        tables group by this; 0 for CPU-only jobs)."""
        return self.num_nodes * self.num_gpu

    def take(self, index: np.ndarray) -> JobTable:
        idx = np.asarray(index, dtype=np.int64)
        values = {f.name: getattr(self, f.name)[idx] for f in fields(self) if f.name != "source"}
        return JobTable(**values, source=self.source)


MAX_COPIES = 64  # a job list repeated more often than this to reach --load is refused


def offered_load(jobs: JobTable, capacity_gpus: float) -> float:
    """The GPU demand the submissions offer, as a multiple of capacity: with W the span of the
    submissions, sum of GPUs x min(duration, W) over the jobs, divided by capacity x W. A job
    counts its GPUs for as long as it runs within a window's length: one that outlasts the
    window holds its GPUs through it (docs/simulate.md, "Load"). NaN when the submissions span
    no time."""
    span = float(jobs.submit_s.max() - jobs.submit_s.min()) if len(jobs) else 0.0
    if span <= 0 or capacity_gpus <= 0:
        return math.nan
    return _load_at(jobs.gpus, jobs.duration_s, span, capacity_gpus)


def _load_at(gpus: np.ndarray, duration: np.ndarray, window: float, capacity: float) -> float:
    return float((gpus * np.minimum(duration, window)).sum()) / (capacity * window)


def repeat(jobs: JobTable, copies: int) -> JobTable:
    """The job list `copies` times back to back: copy k is submitted one span (plus one mean
    gap between submissions) after copy k-1, its names suffixed `~k`."""
    if copies <= 1:
        return jobs
    n = len(jobs)
    span = float(jobs.submit_s.max() - jobs.submit_s.min())
    shift = span + (span / (n - 1) if n > 1 else 1.0)
    index = np.tile(np.arange(n), copies)
    out = jobs.take(index)
    copy = np.repeat(np.arange(copies), n)
    names = np.array(
        [name if k == 0 else f"{name}~{k}" for name, k in zip(out.name, copy, strict=True)],
        dtype=object,
    )
    return replace(out, name=names, submit_s=out.submit_s + copy * shift)


def compress(jobs: JobTable, load: float, capacity_gpus: float) -> tuple[JobTable, float, int]:
    """Jobs whose submit times are scaled about the first one so that `offered_load` is `load`;
    returns them, the time factor applied (< 1 compresses) and how many copies of the list
    that took. Compressing alone cannot offer more than all jobs at once (their GPUs summed),
    so a list that asks for fewer GPUs than `load` x capacity is first repeated
    (`repeat`), the fewest times that can reach it. ValueError when nothing can: all jobs
    submitted at one instant, or no GPU demand."""
    if not (math.isfinite(load) and load > 0):
        raise ValueError(f"--load must be a finite number above 0, got {load}")
    span = float(jobs.submit_s.max() - jobs.submit_s.min()) if len(jobs) else 0.0
    total = float(jobs.gpus.sum())
    if span <= 0 or total <= 0:
        raise ValueError(
            "the jobs offer no GPU demand over time (all submitted at one instant, or no GPU "
            "asked for): --load cannot scale their arrivals"
        )
    copies = 1
    while total * copies <= load * capacity_gpus * 1.001:
        copies += 1
        if copies > MAX_COPIES:
            raise ValueError(
                f"--load {load:g}: the jobs ask for {total:.1f} GPUs in all, so reaching "
                f"{load:g} x {capacity_gpus:g} GPUs would take more than {MAX_COPIES} copies"
            )
    jobs = repeat(jobs, copies)
    span = float(jobs.submit_s.max() - jobs.submit_s.min())
    gpus, duration = jobs.gpus, jobs.duration_s
    lo, hi = 1e-12 * span, 1e6 * span  # window lengths; the load falls as the window grows
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        if _load_at(gpus, duration, mid, capacity_gpus) > load:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1 + 1e-9:
            break
    factor = math.sqrt(lo * hi) / span
    first = float(jobs.submit_s.min())
    return replace(jobs, submit_s=first + (jobs.submit_s - first) * factor), factor, copies


def from_openb(pods: PodTable) -> JobTable:
    """One single-task job per pod: submitted at its creation time, running from its scheduled
    to its deletion time (a pod the trace never scheduled: from creation to deletion). The trace
    has no priorities (QoS is not one), tenants, utilization or restart times."""
    created, deleted, scheduled = pods.creation_time, pods.deletion_time, pods.scheduled_time
    missing = np.flatnonzero(np.isnan(created) | np.isnan(deleted))
    if missing.size:
        raise JobFormatError(
            f"{pods.source}: {missing.size} pod(s) without creation_time or deletion_time "
            f"(first: line {int(missing[0]) + 2}); a replay with departures needs both"
        )
    began = np.where(np.isnan(scheduled), created, np.maximum(scheduled, created))
    n = len(pods)
    return JobTable(
        name=pods.name.copy(),
        submit_s=created.astype(np.float64),
        duration_s=np.maximum(deleted - began, MIN_DURATION_S),
        num_nodes=np.ones(n, dtype=np.int64),
        num_gpu=pods.num_gpu.astype(np.int64),
        gpu_milli=np.where(pods.num_gpu > 0, pods.gpu_milli, 0).astype(np.int64),
        cpu_milli=pods.cpu_milli.astype(np.int64),
        memory_mib=pods.memory_mib.astype(np.int64),
        gpu_spec=pods.gpu_spec.copy(),
        tenant=np.full(n, "", dtype=object),
        priority=np.zeros(n, dtype=np.int64),
        utilization=np.full(n, np.nan),
        restart_s=np.full(n, np.nan),
        migratable=np.ones(n, dtype=bool),
        source=pods.source,
    )


# --------------------------------------------------------------------------- the job CSV


class _Rows:
    """The cells of one CSV file, read column by column with one-line errors."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            with path.open(newline="", encoding="utf-8-sig") as fh:
                rows = list(csv.reader(fh))
        except OSError as exc:
            raise JobFormatError(f"{path}: cannot read file ({exc.strerror or exc})") from exc
        except UnicodeDecodeError as exc:
            raise JobFormatError(f"{path}: not UTF-8 text ({exc.reason})") from exc
        if not rows:
            raise JobFormatError(f"{path}: empty file, expected a header line")
        self.header = [h.strip() for h in rows[0]]
        missing = [c for c in JOB_COLUMNS if c not in self.header]
        if missing:
            raise JobFormatError(f"{path} line 1: missing column(s) {', '.join(missing)}")
        unknown = [c for c in self.header if c not in JOB_COLUMNS + OPTIONAL_COLUMNS]
        if unknown:
            raise JobFormatError(
                f"{path} line 1: unknown column(s) {', '.join(unknown)} (known: "
                f"{', '.join(JOB_COLUMNS + OPTIONAL_COLUMNS)})"
            )
        dup = next((c for c in self.header if self.header.count(c) > 1), None)
        if dup:
            raise JobFormatError(f"{path} line 1: column {dup} given twice")
        self.data = rows[1:]
        for i, row in enumerate(self.data, start=2):
            if len(row) != len(self.header):
                raise JobFormatError(
                    f"{path} line {i}: {len(row)} fields, the header has {len(self.header)}"
                )
        if not self.data:
            raise JobFormatError(f"{path}: no jobs")

    def cells(self, column: str) -> list[str] | None:
        if column not in self.header:
            return None
        j = self.header.index(column)
        return [row[j].strip() for row in self.data]

    def fail(self, index: int, column: str, problem: str) -> JobFormatError:
        return JobFormatError(f"{self.path} line {index + 2}, column {column}: {problem}")

    def numbers(
        self, column: str, lo: float, hi: float, *, integer: bool, default: float | None = None
    ) -> np.ndarray:
        cells = self.cells(column)
        out = np.empty(len(self.data), dtype=np.float64)
        for i, raw in enumerate(cells if cells is not None else [""] * len(self.data)):
            if raw == "" and default is not None:
                out[i] = default
                continue
            try:
                value = float(raw)
            except ValueError:
                value = math.nan
            if not math.isfinite(value):
                raise self.fail(i, column, f"{raw!r} is not a number")
            if integer and value != int(value):
                raise self.fail(i, column, f"{raw!r} is not an integer")
            if not lo <= value <= hi:
                raise self.fail(i, column, f"{raw!r} is out of range ({lo:g}..{hi:g})")
            out[i] = value
        return out


def read_job_csv(path: str | Path) -> JobTable:
    """Read the generic job CSV (module docstring); JobFormatError names file, line, column."""
    rows = _Rows(Path(path))
    n = len(rows.data)
    submit = rows.numbers("submit_time", 0, MAX_EXACT, integer=False)
    duration = rows.numbers("duration_s", 0, MAX_EXACT, integer=False)
    for i in np.flatnonzero(duration <= 0).tolist():
        raise rows.fail(i, "duration_s", f"{duration[i]:g} is not above 0")
    num_nodes = rows.numbers("num_nodes", 1, MAX_NODES_PER_JOB, integer=True).astype(np.int64)
    num_gpu = rows.numbers("gpus_per_node", 0, MAX_GPUS, integer=True).astype(np.int64)
    milli = rows.numbers("gpu_milli", 0, MILLI, integer=True).astype(np.int64)
    for i in range(n):
        if num_gpu[i] == 0 and milli[i] != 0:
            raise rows.fail(i, "gpu_milli", f"{milli[i]} but gpus_per_node is 0")
        if num_gpu[i] > 0 and milli[i] == 0:
            raise rows.fail(i, "gpu_milli", f"0 but gpus_per_node is {num_gpu[i]}")
        if num_gpu[i] > 1 and milli[i] != MILLI:
            raise rows.fail(
                i,
                "gpu_milli",
                f"{milli[i]} with gpus_per_node {num_gpu[i]}: several GPUs are whole",
            )
    priority = rows.numbers("priority", -(2**31), 2**31 - 1, integer=True).astype(np.int64)
    util = rows.numbers("utilization", 0, 1, integer=False, default=math.nan)
    restart = rows.numbers("restart_s", 0, MAX_EXACT, integer=False, default=math.nan)
    migratable = np.ones(n, dtype=bool)
    for i, raw in enumerate(rows.cells("migratable") or []):
        if raw.lower() in _FALSE:
            migratable[i] = False
        elif raw and raw.lower() not in _TRUE:
            raise rows.fail(i, "migratable", f"{raw!r} is not true or false")
    names = rows.cells("name") or [""] * n
    names = [name or f"job-{i:06d}" for i, name in enumerate(names)]
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            raise rows.fail(i, "name", f"duplicate job name {name!r}")
        seen.add(name)
    return JobTable(
        name=np.array(names, dtype=object),
        submit_s=submit,
        duration_s=duration,
        num_nodes=num_nodes,
        num_gpu=num_gpu,
        gpu_milli=milli,
        cpu_milli=rows.numbers("cpu_milli", 0, MAX_EXACT, integer=True, default=0).astype(np.int64),
        memory_mib=rows.numbers("memory_mib", 0, MAX_EXACT, integer=True, default=0).astype(
            np.int64
        ),
        gpu_spec=np.array(rows.cells("gpu_model"), dtype=object),
        tenant=np.array(rows.cells("tenant"), dtype=object),
        priority=priority,
        utilization=util,
        restart_s=restart,
        migratable=migratable,
        source=str(path),
    )


def job_csv_text(jobs: JobTable) -> str:
    """The jobs as the generic CSV (every optional column; unknown values left empty)."""
    import io

    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*JOB_COLUMNS, *OPTIONAL_COLUMNS])

    def num(value: float) -> str:
        return "" if math.isnan(value) else f"{value:.10g}"

    for i in range(len(jobs)):
        writer.writerow(
            [
                f"{jobs.submit_s[i]:.3f}",
                f"{jobs.duration_s[i]:.3f}",
                int(jobs.num_nodes[i]),
                int(jobs.num_gpu[i]),
                int(jobs.gpu_milli[i]),
                jobs.tenant[i],
                int(jobs.priority[i]),
                jobs.gpu_spec[i],
                jobs.name[i],
                int(jobs.cpu_milli[i]),
                int(jobs.memory_mib[i]),
                num(float(jobs.utilization[i])),
                num(float(jobs.restart_s[i])),
                "true" if jobs.migratable[i] else "false",
            ]
        )
    return out.getvalue()
