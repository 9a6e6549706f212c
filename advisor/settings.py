"""The advisor pipeline's one settings object, and every default it has, written once.

`gpu-defrag advise` builds a `Settings` from its flags, the app from its sidebar, tests from
keyword arguments; the pipeline (`advisor.pipeline`) reads nothing else. Each default below is
the only place that value is written: the flags' defaults and help texts, the forecasting
functions' keyword defaults and the app's labels refer to these names.

This module imports no analysis package at import time (the CLI's `--help` reads the defaults):
the parts that are objects of other modules (shapes, idle policy, planner policy, job-end
settings) are built on first use by their factories.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from advisor.forecast.job_ends import JobEndSettings
    from advisor.fragmentation.measures import Settings as MeasureSettings
    from advisor.fragmentation.measures import Shape
    from advisor.planner.constraints import Policy

NO_POOL = "(none)"  # the pool label of nodes whose source names no pool
NO_TENANT = "(none)"  # the tenant label of work whose source names no tenant

SHAPES_TEXT = "0.5,1,2,4,8,2x8,4x8"  # job shapes measured and planned for (`--shapes`)
HORIZONS_H: tuple[int, ...] = (1, 6, 24)  # demand forecast horizons (`--forecast.horizons`)
# more horizons served in /api/forecast only (`--forecast.outlook-horizons`): the app's fan
# chart over the coming hours and days; no /metrics series, so no alert on them
OUTLOOK_HORIZONS_H: tuple[int, ...] = (3, 12, 48, 72)
IDLE_WINDOWS_H: tuple[int, ...] = (1, 4, 8)  # idle windows W (`--forecast.idle-windows`)
IDLE_RISK = 0.05  # the idle windows' violation budget (`--forecast.idle-risk`)
IDLE_MAX_NODES = 1000  # nodes whose idle windows are computed each hour (~1.2 s on 2 cores)
MAX_TENANTS = 20  # tenants whose demand is forecast each hour, those holding the most GPUs first
HISTORY_MAX_POINTS = 20_000  # runs the history keeps (two weeks at 1m; `--history.max-points`)
TOP_ACTIONS = 10  # ranked actions on the `gpu_advisor_action_info` series (`--top-actions`)


def hours_text(hours: tuple[int, ...]) -> str:
    """(1, 6, 24) -> '1h,6h,24h': a tuple of hours as the flags write it."""
    return ",".join(f"{h}h" for h in hours)


def _measures() -> MeasureSettings:
    from advisor.fragmentation.measures import Settings as MeasureSettings

    return MeasureSettings()


def _policy() -> Policy:
    from advisor.planner.constraints import Policy

    return Policy()


def _job_ends() -> JobEndSettings:
    from advisor.forecast.job_ends import JobEndSettings

    return JobEndSettings()


@dataclass(frozen=True)
class Settings:
    """What the pipeline measures, forecasts and plans, and with which thresholds.

    `measures` holds the job shapes, the allocated-idle rule and the memory request size;
    `policy` the planner's quotas, restart time and locality; `job_ends` when learned job ends
    replace the planner's fallback. `backfill_s` is the past read at start (None: the source's
    own default, `advisor.ingest.backfill.default_span_s`; 0: none)."""

    measures: MeasureSettings = field(default_factory=_measures)
    policy: Policy = field(default_factory=_policy)
    horizons_h: tuple[int, ...] = HORIZONS_H
    outlook_horizons_h: tuple[int, ...] = OUTLOOK_HORIZONS_H
    idle_windows_h: tuple[int, ...] = IDLE_WINDOWS_H
    idle_risk: float = IDLE_RISK
    idle_max_nodes: int = IDLE_MAX_NODES
    max_tenants: int = MAX_TENANTS
    job_ends: JobEndSettings = field(default_factory=_job_ends)
    history_max_points: int = HISTORY_MAX_POINTS
    backfill_s: float | None = None

    @property
    def shapes(self) -> tuple[Shape, ...]:
        return self.measures.shapes
