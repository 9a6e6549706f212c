"""The pipeline's results as typed documents: what `/api/*` serves and the app renders.

Each document is a pydantic model; the service's OpenAPI description is generated from these
classes (`advisor.service.api`), so the served JSON, its schema and the app's reading of it are
one definition. Every object is closed (`extra="forbid"`): a property the model does not declare
fails validation in the pipeline's stage that made it, never reaches a client unannounced. A
plan is the one open object: each recommendation kind adds its own details (docs/recommendations.md).

`build_*` turn a run's state (`advisor.pipeline.RunState`) into documents; the service encodes
them once per run (`encode`), the app reads them from the service (`advisor.client`) or from its
own in-process pipeline through the same functions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from advisor import snapshot
from advisor.forecast.job_ends import LISTED_QUANTILES
from advisor.forecast.live import MIN_COVERAGE_ORIGINS
from advisor.forecast.models import MIN_INTERVAL_ERRORS
from advisor.planner.actions import KINDS
from advisor.results import JOB_END_SOURCES, job_end_rows, jsonable, node_rows

if TYPE_CHECKING:
    from advisor.pipeline import RunState

SNAPSHOT_SCHEMA = Path(snapshot.__file__).with_name("snapshot.schema.json")

Count = Annotated[int, Field(ge=0)]
Gpus = Annotated[float, Field(ge=0)]
Ratio = Annotated[float, Field(ge=0, le=1)]


class Document(BaseModel):
    """A closed JSON object; NaN and infinities are served as null (JSON has neither)."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="null")


# --------------------------------------------------------------------------- texts

META_STALE = (
    "true when the whole answer is from an earlier good run: the latest run's ingest or "
    "analysis failed (source down or unreadable: source_up, source_error, last_error), or no "
    "run has succeeded yet; false when the latest run succeeded"
)
SECTION_STALE = (
    "true when the latest good run's {stage} stage failed, so this section (and error, which "
    "says why) is the one from an earlier run while the rest of the answer is current; it "
    "says nothing about the source: while meta.stale is true the whole answer, this flag "
    "included, is the last good run's"
)
POINT = (
    "the picked model's forecast at the horizon: the value its held-back WAPE "
    "(backtest.wape_ratio) scores; not the interval's median (quantiles['0.5'], which "
    "/metrics exports)"
)
QUANTILES = (
    "the interval, per quantile (0.1, 0.5, 0.9; the median included): the model's forecast "
    "plus that quantile of its own recent errors at this horizon, clipped to the capacity "
    "and sorted; /metrics exports these as gpu_advisor_forecast_demand_gpus "
    "(forecast_quantile), so the dashboard's median can differ from point_gpus by the "
    "median error. The quantiles other than the median are null (and absent from /metrics) "
    f"while the model has fewer than {MIN_INTERVAL_ERRORS} known errors at the horizon: no "
    "interval (interval_reason says so)"
)
INTERVAL_REASON = (
    "why the interval quantiles are null (too few known errors of the model at this horizon); "
    "null when the interval is served"
)
WAPE = (
    "per model: held-back WAPE (sum of absolute errors / sum of actuals) of the picked model, "
    "of the seasonal-naive baseline and of naive; null without an observed actual. Served, not "
    "used to pick: the pick comes from the earlier origins only, so it may lose to naive here"
)
COVERAGE = (
    "per model (the same three), per interval quantile: the share of held-back hours at or "
    "below it (nominal: the quantile), over the held-back hours with an observed actual and a "
    f"real interval (coverage_origins); null while fewer than {MIN_COVERAGE_ORIGINS} such "
    "hours remain"
)
COVERAGE_ORIGINS = (
    "per model: the held-back hours behind coverage_ratio (an observed actual and an interval: "
    f"origins whose model had fewer than {MIN_INTERVAL_ERRORS} known errors have none)"
)
ALLOCATED_HOURLY = (
    "mean allocated GPUs over the last complete hour (the latest observed one where it is "
    "masked): the forecast's input, not the latest run's value (/api/fragmentation has that)"
)
CURRENT_IDLE = (
    "GPUs wholly free throughout the last complete hour: capacity minus the hour's peak of "
    "GPUs with any share allocated (the hour's low of free GPUs), not the latest run's free "
    "GPUs; null when that hour is masked"
)


# --------------------------------------------------------------------------- freshness


class Meta(Document):
    """How fresh an answer is and where it comes from (every answer but the index has one)."""

    source: str
    stale: bool = Field(description=META_STALE)
    source_up: bool
    source_error: str | None
    last_error: str | None
    observed_at: float | None
    last_success_timestamp: float | None
    runs: Count
    source_left_out: list[str] = Field(
        description="GPU exporters the source knows but could not read when the served fleet "
        "was read (a Prometheus target down, or its GPU backend down): their nodes are not in "
        "any figure. Empty for a whole fleet."
    )


class Error(Document):
    """An error answer: one line saying what is wrong (and, for a 503, how fresh the state is)."""

    error: str
    meta: Meta | None = None


class Index(Document):
    """What `/api/` answers: every route of this document with its summary."""

    title: str
    version: str
    openapi: str
    routes: dict[str, str]


# --------------------------------------------------------------------------- fragmentation


class Cluster(Document):
    nodes: Count
    gpus: Count
    allocations: Count
    placed_allocations: Count
    usage_samples: Count
    usable_gpus: Count
    unhealthy_gpus: Count
    allocated_gpus: Gpus
    owner_unknown_gpus: Count
    pending_tasks: Count
    nodes_rack_unknown: Count = Field(
        description="nodes whose rack no source knows (multi-node shapes count known racks "
        "only; see jobs_if_racks_allow)"
    )
    racks_from: str | None = Field(
        description="where the racks came from (a node label, Slurm's topology); null: no "
        "rack is known"
    )


class HostNeed(Document):
    cpu_milli: Gpus
    memory_mib: Gpus


CROSSING = (
    "per GPU model on whose nodes a job of the shape that fits spans NVLink islands (larger "
    "than an island): the estimated slowdown and where it comes from "
    "(advisor.fragmentation.nvlink); empty when every such job fits in one island"
)


class MeasuredShape(Document):
    shape: str
    gpus_per_job: Gpus
    jobs_that_fit: Count = Field(
        description="jobs that surely fit now; a multi-node shape counts nodes of known racks only"
    )
    jobs_if_racks_allow: Annotated[int, Field(ge=0)] | None = Field(
        description="jobs that would fit if the nodes of unknown rack shared a rack; null "
        "where no unknown rack decides it"
    )
    blocked_by: Literal["rack_unknown", "scattered"] | None = Field(
        description="why no job of the shape can start although a pool has enough free GPUs; "
        "null when one can, or too few are free"
    )
    stranded_gpus: int | None
    crosses_nvlink_islands: list[dict[str, Any]] = Field(description=CROSSING)


class LargestJob(Document):
    single_node_gpus: Count
    nvlink_group_gpus: Annotated[int, Field(ge=0)] | None
    multi_node_gpus_in_rack: Annotated[int, Field(ge=0)] | None
    fraction_gpu: Gpus


class Spatial(Document):
    free_gpus: Count
    free_capacity_gpus: Gpus
    partial_free_gpus: Gpus
    stranded_gpus_by_host: Count
    host_need_per_gpu: HostNeed
    shapes: list[MeasuredShape]
    largest_job: LargestJob


class Temporal(Document):
    threshold: Ratio
    window_s: Gpus
    allocated_idle_gpus: Count
    allocated_gpus: Count
    idle_gpus_by_tenant: dict[str, Gpus]


class ModelCapacity(Document):
    gpu_model: str
    gpus: Count
    usable_gpus: Count
    free_gpus: Count
    free_capacity_gpus: Gpus
    allocated_gpus: Gpus


class SpecDemand(Document):
    gpu_spec: str
    pending_tasks: Count
    pending_gpus: Gpus
    free_capacity_gpus: Gpus
    shortfall_gpus: Gpus


class TypeFragmentation(Document):
    capacity: list[ModelCapacity]
    demand: list[SpecDemand]


class Memory(Document):
    min_request_bytes: Gpus
    stranded_memory_bytes: Gpus
    gpus_with_stranded_memory: Count


class Fgd(Document):
    workload: str
    task_types: Count
    fragment_gpus: Gpus
    fragment_pct_of_capacity: Annotated[float, Field(ge=0)]
    fragment_rate: Annotated[float, Field(ge=0)]


class Pool(Document):
    pool: str
    nodes: Count
    gpus: Count
    healthy_gpus: Count
    free_gpus: Count
    free_capacity_gpus: Gpus
    allocated_gpus: Gpus
    fragmented_gpus: Gpus
    fragmentation_ratio: Annotated[float, Field(ge=0)]
    allocated_idle_gpus: Count
    owner_unknown_gpus: Count = Field(
        description="GPUs in use (busy or holding memory) that no allocation names: allocated, "
        "their owner unknown"
    )
    allocated_idle_power_watts: Annotated[float, Field(ge=0)] | None = Field(
        description="power drawn by the pool's allocated-but-idle GPUs; null where none of "
        "them has a power reading"
    )
    stranded_memory_bytes: Gpus


class Shape(Document):
    shape: str
    gpus_per_job: Gpus
    schedulable_jobs: Count
    stranded_gpus: int | None
    crosses_nvlink_islands: list[dict[str, Any]] = Field(description=CROSSING)


class PoolShape(Document):
    pool: str
    shape: str
    schedulable_jobs: Count
    stranded_gpus: int | None


class GpuModel(Document):
    gpu_model: str
    gpus: Count
    free_capacity_gpus: Gpus
    allocated_idle_gpus: Count
    idle_capacity_gpus: Gpus
    allocated_gpus: Gpus
    pending_gpus: Gpus
    demand_gpus: Gpus


class Node(Document):
    node: str
    pool: str
    rack: str
    gpu_model: str
    gpus: Count
    free_gpus: Count
    free_capacity_gpus: Gpus = Field(description="free GPU share, partly used GPUs included")
    largest_free_nvlink_group: Annotated[int, Field(ge=0)] | None = Field(
        description="most free GPUs inside one NVLink island; null where no GPU of the node "
        "has a known island"
    )
    allocated_idle_gpus: Count
    fgd_fragment_gpus: Gpus
    score: Ratio
    stranded_memory_bytes: Gpus


class Fragmentation(Document):
    """Fragmentation measures of the latest good run: cluster, per pool, shape, GPU model
    (and per node when asked)."""

    meta: Meta
    source: str
    timestamp: float | None
    cluster: Cluster
    spatial: Spatial
    temporal: Temporal
    type: TypeFragmentation
    memory: Memory
    fgd: Fgd
    pools: list[Pool]
    shapes: list[Shape]
    pool_shapes: list[PoolShape]
    gpu_models: list[GpuModel]
    nodes: list[Node] = Field(default_factory=list)


# --------------------------------------------------------------------------- plans


class GpuSet(Document):
    node: str
    gpus: list[Count]
    milli: Annotated[int, Field(ge=1, le=1000)]
    mig_profile: str = Field(
        default="",
        description="a share target's MIG instance profile (e.g. 1g.10gb); absent for a plain "
        "GPU share",
    )
    limit_milli: Annotated[int, Field(ge=1, le=1000)] | None = Field(
        default=None,
        description="a plain share target's limit: milli-GPU the task may use when the GPU has "
        "room (milli is what it is guaranteed); absent: held to milli",
    )


class Cost(Document):
    restarts: Count
    restart_s: Gpus
    gpu_hours: Gpus
    idle_gpu_hours: Gpus
    jobs: list[str]
    tenants: list[str]


class PlanAction(Document):
    model_config = ConfigDict(populate_by_name=True)

    kind: Literal[KINDS]  # type: ignore[valid-type]
    alloc: str
    job: str
    tenant: str
    source: GpuSet | None = Field(alias="from")
    target: GpuSet | None = Field(alias="to")
    priority: int | None
    rack_local: bool
    quota: list[tuple[str, str, float]]
    reason: str
    cost: Cost


class PlanMeasures(Document):
    """Fragmentation measures of the model before or after the plan (empty for some
    infeasible plans)."""

    free_gpus: Count | None = None
    free_nodes: Count | None = None
    largest_free_nvlink_group: Count | None = Field(
        default=None,
        description="most free GPUs in one NVLink island; null: no node's islands are known",
    )
    fgd_fragment_gpus: Gpus | None = None
    fgd_fragment_rate: Gpus | None = None
    jobs_that_fit: dict[str, Count] | None = None


class Benefit(Document):
    shapes_before: dict[str, Count]
    shapes_after: dict[str, Count]
    newly_schedulable: list[str]
    more_jobs_fit: list[str]
    fragmentation_before: dict[str, float]
    fragmentation_after: dict[str, float]


class ActWindow(Document):
    """When to act on a plan: now, or at the forecast's low-demand hour where its moves and
    holds cost least (`advisor.planner.timing`; docs/recommendations.md, "When to act")."""

    when: Literal["now", "window"]
    at: float = Field(description="unix time to act")
    reason: str
    forecast: bool = Field(description="a served demand forecast said so")
    demand_gpus: float | None
    demand_interval: Annotated[list[float | None], Field(min_length=2, max_length=2)] | None = (
        Field(description="forecast P10, P90 at the window")
    )
    capacity_gpus: float | None
    saving_gpu_hours: float = Field(description="expected GPU-hours saved by waiting vs now")
    saving_interval: Annotated[list[float | None], Field(min_length=2, max_length=2)] | None = (
        Field(description="the saving at the P90 and at the P10 demand")
    )


class Plan(Document):
    """A plan in the `gpu-defrag plan --json` form. Besides these, each kind adds its own
    details (reserve: start_at, schedule, release, ends_from, ...; borrow: return; reclaim:
    waste, protected; docs/recommendations.md)."""

    model_config = ConfigDict(extra="allow")

    goal: str
    feasible: bool
    reason: str
    method: str
    actions: list[PlanAction]
    cost: Cost
    before: PlanMeasures
    after: PlanMeasures
    benefit: Benefit | None
    goal_priority: int | None = None
    elapsed_s: Gpus | None = None
    checked: bool | None = None
    waiting_job: str | None = Field(
        default=None, description='the waiting job the plan would start ("" none)'
    )
    window: ActWindow | None = None


class Action(Document):
    """One ranked action: a step of a feasible plan, cheapest plan first."""

    rank: Annotated[int, Field(ge=1)]
    goal: str
    kind: Literal[KINDS]  # type: ignore[valid-type]
    alloc: str
    job: str
    tenant: str
    source: str
    target: str
    summary: str
    cost_gpu_hours: Gpus
    cost_idle_gpu_hours: Gpus
    restarts: Count
    benefit_gpus: Gpus


class JobEnds(Document):
    """Where the plans' job ends came from: `source` as the reservations' reasons name it, the
    finished jobs learned from, and the running jobs given a learned end
    (docs/recommendations.md); /api/job-ends lists the jobs one by one."""

    source: str
    finished_jobs: Count
    min_finished: Count
    quantile: Annotated[float, Field(gt=0, lt=1)]
    by: list[str]
    running_jobs: Count
    unknown_start_jobs: Count
    predicted_jobs: Count
    by_group: Count
    predicted_allocations: Count
    median_duration_h: float | None
    median_censor_s: float | None
    reason: str
    as_of: float | None = Field(description="the model's time the ends are from")


class Recommendations(Document):
    """Checked plans and their actions ranked cheapest plan first."""

    meta: Meta
    method: str
    stale: bool = Field(description=SECTION_STALE.format(stage="plan"))
    error: str | None
    goals: list[str]
    notes: list[str] = Field(
        description="per recommendation kind with nothing to recommend, why (`KIND: reason`, "
        "with the numbers)"
    )
    by_kind: dict[str, Count]
    total_actions: Count
    actions: list[Action]
    plans: list[Plan]
    job_ends: JobEnds | None


class NodeGpus(Document):
    node: str
    gpus: list[Count]


class RunningJobEnd(Document):
    """One running job (tasks grouped by tenant and job) and when it is likely to end."""

    job: str
    tenant: str
    gpus: Gpus = Field(description="the GPU share its placed tasks hold, summed")
    nodes: list[NodeGpus] = Field(
        description="per node it runs on, the device indices of the GPUs its tasks hold there"
    )
    allocations: list[str] = Field(description="its tasks (pods): the planner's unit")
    start: float | None = Field(
        description="Unix seconds: the earliest start the source gives, or the one the service "
        "observed (it appeared between two looks); null when unknown"
    )
    elapsed_h: float | None = Field(description="hours from start to as_of")
    source: Literal[JOB_END_SOURCES] = Field(  # type: ignore[valid-type]
        description="learned: from similar_jobs finished jobs that outlived its elapsed time "
        "(end is their P50, end_p90 their P90); prior: the duration prior's mean remaining "
        "time, one value; known: the source's deletion time, one value; none: nothing to "
        "predict from (no known start), end null"
    )
    end: float | None = Field(
        description="Unix seconds, at or after as_of: the expected end, the median (P50) where "
        "learned, else the one value the prior or the source gives; null for source none "
        "(reason says why)"
    )
    end_p90: float | None = Field(
        description="Unix seconds: the learned P90, at or after end; null where the source "
        "gives one value (prior, known) or none"
    )
    planned_end: float | None = Field(
        description="Unix seconds: the end the reservations plan on (the learned `quantile` of "
        "the remaining time, else the planner's fallback, which for a job without a known "
        "start is the prior's mean from as_of)"
    )
    similar_jobs: Annotated[int, Field(ge=0)] | None = Field(
        description="finished jobs the learned end comes from (those that ran longer than its "
        "elapsed time); null unless learned"
    )
    basis: Literal["group", "all"] | None = Field(
        description="group: finished jobs of its own tenant and GPU count (by); all: all "
        "finished jobs; null unless learned"
    )
    reason: str | None = Field(
        description="why the end is not learned and what it is instead; null when learned"
    )


class BySource(Document):
    """The matching jobs per end source."""

    learned: Count
    prior: Count
    known: Count
    none: Count


class JobEndList(Document):
    """Per running job, when it is likely to end: learned from the jobs the service saw finish,
    else the planner's fallback (docs/recommendations.md, "Job ends in the service"). Its
    measured error is offline: python bench/job_ends.py (docs/service.md)."""

    meta: Meta
    stale: bool = Field(description=SECTION_STALE.format(stage="plan"))
    error: str | None
    as_of: float | None = Field(
        description="Unix seconds: the model's time the ends were predicted at; null when the "
        "plan stage has not run"
    )
    source: str | None = Field(description="the job-end source the reservations' reasons name")
    quantile: float | None = Field(
        description="the quantile of the remaining time planned_end is, where learned"
    )
    listed_quantiles: list[float] = Field(
        description="the quantiles end and end_p90 are, where learned"
    )
    finished_jobs: Count = Field(description="finished jobs seen, learned from")
    min_finished: int | None = Field(description="finished jobs needed before any end is learned")
    by: list[str] = Field(description="what similar means: the same values of these")
    running_jobs: Count = Field(description="running jobs, before the filters")
    total_jobs: Count = Field(description="jobs matching the filters, before limit")
    by_source: BySource
    jobs: list[RunningJobEnd] = Field(
        description="sorted by end (jobs without one last), then planned_end"
    )

    def planned_ends(self) -> dict[str, float]:
        """{allocation id: end} of the jobs whose end is learned: the mapping the plan stage
        planned its reservations on (the planner's fallback for every other allocation). Only
        complete on an unfiltered, unlimited list."""
        return {
            alloc: job.planned_end
            for job in self.jobs
            if job.source == "learned" and job.planned_end is not None
            for alloc in job.allocations
        }


# --------------------------------------------------------------------------- forecast


class HorizonBacktest(Document):
    selection_origins: Count
    test_origins: Count
    wape_ratio: dict[str, float | None] = Field(description=WAPE)
    coverage_ratio: dict[str, dict[str, Ratio | None]] = Field(description=COVERAGE)
    coverage_origins: dict[str, Count] = Field(description=COVERAGE_ORIGINS)


class HorizonForecast(Document):
    horizon: str
    available: Literal[True]
    target: str
    model: str
    point_gpus: Gpus = Field(description=POINT)
    quantiles: dict[str, Annotated[float, Field(ge=0)] | None] = Field(description=QUANTILES)
    interval_reason: str | None = Field(description=INTERVAL_REASON)
    backtest: HorizonBacktest


class Unavailable(Document):
    """A horizon (or idle window) without a backtested forecast, and why."""

    available: Literal[False]
    reason: str


class HorizonUnavailable(Unavailable):
    horizon: str


Horizon = Annotated[HorizonForecast | HorizonUnavailable, Field(discriminator="available")]


class DemandSeries(Document):
    pool: str
    capacity_gpus: float | None
    allocated_gpus: float | None = Field(description=ALLOCATED_HOURLY)
    horizons: list[Horizon]
    outlook: list[Horizon] = Field(
        default_factory=list,
        description="the same forecast at the outlook horizons (--forecast.outlook-horizons, "
        "beyond the horizons): served here only, for the fan chart over the coming days; no "
        "/metrics series",
    )


class IdleBacktest(Document):
    test_from: str
    test_origins: Count
    method: str
    violation_ratio: dict[str, Ratio | None]
    capture_ratio: dict[str, Ratio | None]


class IdleRelease(Document):
    window: str
    available: Literal[True]
    until: str
    release_gpus: Gpus
    rule: str
    backtest: IdleBacktest


class WindowUnavailable(Unavailable):
    window: str


Window = Annotated[IdleRelease | WindowUnavailable, Field(discriminator="available")]


class IdlePool(Document):
    pool: str
    capacity_gpus: float | None
    current_idle_gpus: float | None = Field(description=CURRENT_IDLE)
    windows: list[Window]


class IdleNode(Document):
    node: str
    pool: str
    capacity_gpus: float | None
    current_idle_gpus: float | None = Field(description=CURRENT_IDLE)
    windows: list[Window]


class IdleWindows(Document):
    """Per pool and per node and window W: GPUs forecast to stay free for the whole next W
    hours (from valid_from) at the risk, with their held-back backtest (docs/service.md)."""

    risk: Ratio
    windows: list[str]
    baseline: str
    max_history_hours: Count
    history_hours: Count
    origin: str | None
    valid_from: str | None
    error: str | None
    pools: list[IdlePool]
    node_history_hours: Count
    nodes_total: Count
    max_nodes: Count
    node_error: str | None
    nodes: list[IdleNode] = Field(
        description="the same per node (per-series rules only), the most GPUs idle in the last "
        "complete hour first; nodes beyond max_nodes carry a reason"
    )


class TenantSeries(Document):
    tenant: str
    allocated_gpus: float | None = Field(description=ALLOCATED_HOURLY)
    quota_gpus: float | None
    horizons: list[Horizon]


class TenantDemand(Document):
    """Per tenant (the max_tenants holding the most GPUs at the latest run, of tenants_total):
    the GPUs its running allocations hold, forecast and backtested as a pool's demand, next to
    its quota over all GPU models (policy; null without one); no capacity, no idle windows."""

    max_tenants: Count
    tenants_total: Count
    error: str | None
    history_hours: Count
    origin: str | None
    quantiles: list[float]
    baseline: str
    candidates: list[str]
    tenants: list[TenantSeries]


class Forecast(Document):
    """Per-pool and per-tenant demand forecasts with intervals, idle windows, and their
    backtests; only meta, stale and error before the first forecast."""

    meta: Meta
    stale: bool = Field(description=SECTION_STALE.format(stage="forecast"))
    error: str | None
    history_hours: Count = 0
    origin: str | None = None
    quantiles: list[float] = Field(default_factory=list)
    baseline: str = ""
    candidates: list[str] = Field(default_factory=list)
    pools: list[DemandSeries] = Field(default_factory=list)
    idle: IdleWindows | None = None
    tenants: TenantDemand | None = None


# --------------------------------------------------------------------------- history


class TrendPoint(Document):
    """One run's headline measures (`advisor.history.headline`)."""

    time: float = Field(description="Unix seconds: the model's time")
    fragment_rate: Annotated[float, Field(ge=0)]
    fragment_gpus: Gpus
    free_gpus: Count
    free_capacity_gpus: Gpus
    allocated_gpus: Gpus
    allocated_idle_gpus: Count
    unhealthy_gpus: Count
    pending_tasks: Count
    largest_single_node_gpus: Count
    jobs_that_fit: dict[str, Count] = Field(description="per measured shape")


class DemandHour(Document):
    """One pool's complete hour as the demand forecast learned from it."""

    pool: str
    hour: str = Field(description="the hour's start, UTC (ISO 8601)")
    allocated_gpus: float | None = Field(
        description="mean allocated GPUs over the hour; null where the hour is masked (fewer "
        "than half its expected runs)"
    )
    capacity_gpus: float | None


class History(Document):
    """The advisor's own history over the last `hours` (by the model's time): every run's
    headline measures (the trend) and, per pool, the complete hours the demand forecast learned
    from."""

    meta: Meta
    hours: Count
    trend: list[TrendPoint]
    demand: list[DemandHour]


# --------------------------------------------------------------------------- snapshot

SNAPSHOT_MARK = "x-gpu-defrag-snapshot"  # where the snapshot file's own schema goes
SnapshotBody = Annotated[dict[str, Any], WithJsonSchema({"type": "object", SNAPSHOT_MARK: True})]


class SnapshotResponse(Document):
    """The cluster model of the latest good run, in the snapshot file format
    (advisor/snapshot.schema.json)."""

    meta: Meta
    snapshot: SnapshotBody


# --------------------------------------------------------------------------- building

FORECAST_SECTION = set(Forecast.model_fields) - {"meta"}


def describe(state: RunState) -> Meta:
    """The freshness block every answer carries."""
    results = state.results
    return Meta(
        source=state.source,
        stale=state.stale or results is None,
        source_up=state.source_up,
        source_error=state.source_error or None,
        last_error=state.last_error or None,
        observed_at=results.observed_at if results else None,
        last_success_timestamp=state.last_success_ts,
        runs=state.runs,
        source_left_out=list(results.model.left_out) if results else [],
    )


def build_snapshot(state: RunState) -> SnapshotResponse:
    assert state.results is not None
    return SnapshotResponse(meta=describe(state), snapshot=snapshot.to_dict(state.results.model))


def build_fragmentation(state: RunState, nodes: bool = False) -> Fragmentation:
    results = state.results
    assert results is not None
    analysis = {k: v for k, v in results.analysis.items() if k != "nodes"}
    doc = {
        **jsonable(analysis),
        "pools": jsonable(results.pools),
        "shapes": results.shapes,
        "pool_shapes": results.pool_shapes,
        "gpu_models": results.gpu_models,
    }
    if nodes:
        doc["nodes"] = node_rows(results.model, results.analysis)
    return Fragmentation.model_validate({**doc, "meta": describe(state)})


def recommendations_section(recs: Mapping[str, Any]) -> dict[str, Any]:
    """The plan stage's document as `Recommendations` holds it (without meta), checked: a
    ValueError (pydantic's) names the first property the model does not declare."""
    doc = {
        "method": recs.get("method", ""),
        "stale": bool(recs.get("stale", False)),
        "error": recs.get("error") or None,
        "goals": recs.get("goals", []),
        "notes": recs.get("notes", []),
        "by_kind": recs.get("by_kind", {}),
        "total_actions": len(recs.get("actions", [])),
        "actions": recs.get("actions", []),
        "plans": recs.get("plans", []),
        "job_ends": _job_ends_summary(recs.get("job_ends")),
    }
    return jsonable(doc)


def _job_ends_summary(doc: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The plans' job-end document without its per-job list (`/api/job-ends` serves that)."""
    return None if doc is None else {k: v for k, v in doc.items() if k != "jobs"}


def build_recommendations(state: RunState, limit: int | None = None) -> Recommendations:
    assert state.results is not None
    doc = recommendations_section(state.results.recommendations)
    if limit is not None:
        doc["actions"] = doc["actions"][:limit]
    return Recommendations.model_validate({**doc, "meta": describe(state)})


def build_job_ends(
    state: RunState, tenant: str | None = None, node: str | None = None, limit: int | None = None
) -> JobEndList:
    """Per running job its expected end as the plan stage predicted it (`job_ends.predict`'s
    `jobs`), sorted by that end; the summary fields are its document's."""
    assert state.results is not None
    recs = state.results.recommendations
    ends = recs.get("job_ends") or {}
    rows = job_end_rows(state.results.model, ends.get("jobs", []), tenant, node)
    by_source = dict.fromkeys(JOB_END_SOURCES, 0)
    for row in rows:
        by_source[row["source"]] += 1
    doc = {
        "stale": bool(recs.get("stale", False)),
        "error": recs.get("error") or None,
        "as_of": ends.get("as_of"),
        "source": ends.get("source"),
        "quantile": ends.get("quantile"),
        "listed_quantiles": list(LISTED_QUANTILES),
        "finished_jobs": ends.get("finished_jobs", 0),
        "min_finished": ends.get("min_finished"),
        "by": ends.get("by", []),
        "running_jobs": len(ends.get("jobs", [])),
        "total_jobs": len(rows),
        "by_source": by_source,
        "jobs": rows if limit is None else rows[:limit],
    }
    return JobEndList.model_validate({**jsonable(doc), "meta": describe(state)})


def forecast_section(forecast: Mapping[str, Any]) -> dict[str, Any]:
    """The forecast stage's document as `Forecast` holds it (without meta), checked."""
    doc = jsonable(dict(forecast))
    doc["error"] = doc.get("error") or None
    doc.setdefault("stale", False)
    return doc


def build_forecast(state: RunState) -> Forecast:
    assert state.results is not None
    doc = forecast_section(state.results.forecast)
    return Forecast.model_validate({**doc, "meta": describe(state)})


def check(kind: type[Document], doc: Mapping[str, Any]) -> None:
    """Validate a section against its document without `meta` (the stage that made it fails
    with pydantic's ValidationError, a ValueError, on a property the model does not declare)."""
    kind.model_validate({**doc, "meta": _NO_META})


_NO_META = {
    "source": "",
    "stale": True,
    "source_up": False,
    "source_error": None,
    "last_error": None,
    "observed_at": None,
    "last_success_timestamp": None,
    "runs": 0,
    "source_left_out": [],
}


def build_history(state: RunState, hours: int = 168) -> History:
    """The last `hours` of the run's trend and hourly demand (`Results.trend`, `.demand`)."""
    results = state.results
    assert results is not None
    trend, demand = results.trend, results.demand
    points: list[dict[str, Any]] = []
    cut = results.observed_at - hours * 3600.0
    if trend is not None and len(trend):
        times = _unix(trend["time"])
        fits = [c for c in trend.columns if c.startswith("fit ")]
        keep = times >= cut
        rows = trend[keep].to_dict("records")
        for t, row in zip(times[keep].tolist(), rows, strict=True):
            point = {k: v for k, v in row.items() if k != "time" and not k.startswith("fit ")}
            point["jobs_that_fit"] = {  # a shape measured since a later run: none before
                c.removeprefix("fit "): row[c] for c in fits if pd.notna(row[c])
            }
            points.append({"time": t, **point})
    hourly: list[dict[str, Any]] = []
    if demand is not None and len(demand):
        recent = demand[_unix(demand["hour"]) >= cut]
        for row in recent.to_dict("records"):
            hour = pd.Timestamp(row["hour"]).tz_localize(None)
            hourly.append({**row, "hour": hour.isoformat() + "Z"})
    doc = {"hours": hours, "trend": points, "demand": hourly}
    return History.model_validate({**jsonable(doc), "meta": describe(state)})


def _unix(times: pd.Series) -> np.ndarray:
    """Unix seconds of a datetime column, naive (UTC) or aware, at any resolution."""
    values = pd.to_datetime(times, utc=True).dt.tz_localize(None)
    return ((values - pd.Timestamp(0)) / pd.Timedelta(seconds=1)).to_numpy(dtype=float)


def as_json(document: Document) -> dict[str, Any]:
    """The document as the service serves it, parsed back into plain JSON data."""
    return json.loads(encode(document))


# --------------------------------------------------------------------------- the queue

Cause = Literal["rack_unknown", "scattered", "quota"]


class PendingJob(Document):
    job: str = Field(description="the gang: every task of one job")
    tenant: str
    priority: int
    tasks: Count = Field(description="tasks the job needs (the gang size if declared)")
    tasks_seen: Count = Field(description="waiting tasks the scheduler lists now")
    gang_size: int | None = Field(
        description="the size the scheduler declares (PodGroup minMember, a Kueue workload's "
        "pods); null where none is declared"
    )
    gpus_per_task: Gpus
    gpus: Gpus
    shape: str
    gpu_spec: str
    created: float | None
    waiting_reason: str | None = Field(description="the scheduler's own reason")
    jobs_of_shape_that_fit: Count = Field(
        description="jobs of its shape that could start now on known racks"
    )
    jobs_if_racks_allow: Annotated[int, Field(ge=0)] | None
    blocked_by: Cause | None = Field(
        description="why it cannot start although GPUs are free: its tenant's quota, unknown "
        "racks, or free GPUs scattered; null when its shape fits (or too few GPUs are free)"
    )


class Unschedulable(Document):
    shape: str
    cause: Cause
    free_gpus: Count
    jobs: list[str]


class RackRow(Document):
    pool: str
    shape: str
    jobs_that_fit: Count
    jobs_if_racks_allow: Count


class BlockedPlan(Document):
    job: str
    tenant: str
    shape: str
    gpus: Gpus
    blocked_by: Cause
    plan: Plan


class Pending(Document):
    """The scheduler's queue biggest first, why each waiting job cannot start, unknown racks,
    and a checked plan for the biggest blocked one (`advisor.pipeline.scheduler`)."""

    meta: Meta
    scheduler: str | None = Field(
        description="the scheduler source (kubernetes, slurm, kube-state-metrics); null for "
        "usage-only sources, which have no queue"
    )
    scheduler_stale: str | None = Field(
        description="why the scheduler's view is an older one (a watch that dropped); null "
        "when current"
    )
    racks_from: str | None
    notes: list[str]
    nodes_rack_unknown: dict[str, Count]
    if_racks_allow: list[RackRow]
    unschedulable: list[Unschedulable]
    quotas: list[str] = Field(description="the quotas the plans use and where each came from")
    total_jobs: Count
    pending_jobs: list[PendingJob]
    blocked_plan: BlockedPlan | None
    blocked_plan_error: str | None


def build_pending(state: RunState, tenant: str | None = None, limit: int | None = None) -> Pending:
    """The queue (biggest first), `tenant`'s only when given, at most `limit` jobs."""
    assert state.results is not None
    doc = state.results.scheduler or {}
    jobs = [r for r in doc.get("pending_jobs", []) if tenant is None or r["tenant"] == tenant]
    return Pending.model_validate(
        {
            "meta": describe(state),
            "scheduler": doc.get("kind"),
            "scheduler_stale": doc.get("stale"),
            "racks_from": doc.get("racks_from"),
            "notes": doc.get("notes", []),
            "nodes_rack_unknown": doc.get("nodes_rack_unknown", {}),
            "if_racks_allow": doc.get("if_racks_allow", []),
            "unschedulable": doc.get("unschedulable", []),
            "quotas": doc.get("quotas", []),
            "total_jobs": len(jobs),
            "pending_jobs": jsonable(jobs if limit is None else jobs[:limit]),
            "blocked_plan": jsonable(doc.get("blocked_plan")),
            "blocked_plan_error": doc.get("blocked_plan_error"),
        }
    )


def encode(document: Document) -> bytes:
    """The compact JSON the service serves: declared and set properties only, aliases (`from`,
    `to`) as JSON names, NaN as null."""
    return document.model_dump_json(by_alias=True, exclude_unset=True).encode()


def snapshot_schemas() -> dict[str, Any]:
    """The snapshot file's JSON Schema (draft 2020-12, which OpenAPI 3.1 uses) as components:
    `Snapshot` and its definitions as `Snapshot_*`."""
    doc = json.loads(SNAPSHOT_SCHEMA.read_text())
    defs = doc.pop("$defs", {})

    def rewrite(node: Any) -> Any:
        if isinstance(node, dict):
            return {
                k: (
                    v.replace("#/$defs/", "#/components/schemas/Snapshot_")
                    if k == "$ref" and isinstance(v, str)
                    else rewrite(v)
                )
                for k, v in node.items()
                if k not in ("$schema", "$id")
            }
        if isinstance(node, list):
            return [rewrite(v) for v in node]
        return node

    out = {"Snapshot": rewrite(doc)}
    out.update({f"Snapshot_{name}": rewrite(schema) for name, schema in defs.items()})
    return out
