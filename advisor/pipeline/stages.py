"""The pipeline's stages as pure functions: analysis, forecast and plans of one run.

Each takes what the run read and the one `Settings`, and returns plain data (the documents'
dicts); the runner (`advisor.pipeline.runner`) times them, keeps their failures apart and
publishes the results. The forecasting itself is `advisor.forecast.live`'s and the job-end
learning `advisor.forecast.job_ends`'s: called here, not re-implemented.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pandas as pd

from advisor.forecast.job_ends import outlook, predict
from advisor.forecast.live import demand_section, forecast_panel, tenant_section
from advisor.forecast.runs import hourly_panel, node_panel, runs_panel
from advisor.fragmentation import measures
from advisor.fragmentation.measures import Shape
from advisor.history import History, RunningJob
from advisor.model import MILLI, ClusterModel
from advisor.planner.actions import KINDS
from advisor.planner.consolidate import Goal
from advisor.planner.ranking import ranked_actions
from advisor.planner.recommend import recommend_with_notes
from advisor.planner.reserve import pending_requests
from advisor.planner.timing import with_windows
from advisor.results import (
    Results,
    pool_shape_table,
    pool_table,
    shape_label,
    shape_table,
    type_table,
)
from advisor.settings import Settings

PLAN_METHOD = "consolidation+recommend"


def analyze_model(model: ClusterModel, settings: measures.Settings, observed_at: float) -> Results:
    """The fragmentation part of a run's results."""
    analysis = measures.analyze(model, settings)
    idle = measures.allocated_idle(model, settings.idle)
    return Results(
        model=model,
        observed_at=observed_at,
        finished_at=observed_at,
        analysis=analysis,
        shapes=shape_table(analysis, settings.shapes),
        pools=pool_table(model, analysis, idle),
        pool_shapes=pool_shape_table(model, settings.shapes),
        gpu_models=type_table(model, idle),
        gpu_states=measures.gpu_state_codes(model, idle),
    )


def blocked_shapes(
    model: ClusterModel, shapes: Sequence[Shape], shape_rows: Sequence[dict[str, Any]]
) -> list[Shape]:
    """Whole-GPU shapes with no job that fits now, smallest first, that the fleet's usable GPUs
    could hold at all (a 4x8 job on a 16-GPU fleet is not a fragmentation problem; nor is a
    multi-node job where no rack of one GPU model has that many nodes, e.g. racks unknown)."""
    usable = int(model.gpu_usable.sum())
    out = [
        shape
        for shape, row in zip(shapes, shape_rows, strict=True)
        if shape.gpu_milli == MILLI
        and row["schedulable_jobs"] == 0
        and shape.gpus <= usable
        and measures.rack_could_hold(model, shape)
    ]
    return sorted(out, key=lambda s: s.gpus)


MAX_WAITING_GOALS = 2  # waiting big jobs per run whose own shape gets a consolidation plan


def waiting_goals(model: ClusterModel, limit: int = MAX_WAITING_GOALS) -> list[tuple[str, Goal]]:
    """Consolidation goals for the first waiting jobs of at least 8 whole GPUs (queue order:
    priority, then creation) that cannot start now, in their own shape: GPUs per task, tasks,
    GPU models, and the CPU and memory a task asks for (a configured shape counts GPUs only,
    so freeing its GPUs may leave such a job without the CPU it needs)."""
    allocs = model.allocations
    created: dict[str, float] = {}
    for job, at in zip(
        allocs.job[allocs.node < 0].tolist(),
        allocs.creation_time[allocs.node < 0].tolist(),
        strict=True,
    ):
        created[job] = min(created.get(job, math.inf), at if math.isfinite(at) else math.inf)
    requests = sorted(
        pending_requests(model), key=lambda r: (-(r.priority or 0), created.get(r.job, 0.0), r.job)
    )
    out = []
    for request in requests:
        if len(out) >= limit:
            break
        shape = Shape(
            request.num_gpu,
            MILLI,
            request.tasks,
            request.cpu_milli,
            request.memory_mib,
            request.gpu_spec,
        )
        if measures.jobs_that_fit(model, shape) or not measures.rack_could_hold(model, shape):
            continue
        text = f"job={shape_label(shape)} for {request.job}"
        out.append((request.job, Goal(text, "job", shape, priority=request.priority)))
    return out


def plans(
    model: ClusterModel,
    settings: Settings,
    shape_rows: Sequence[dict[str, Any]],
    finished: pd.DataFrame | None = None,
    running: Sequence[RunningJob] | None = None,
    forecast: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The plan stage's document: goals tried, their plans, ranked actions, count by kind, and
    `job_ends`, where the plans' job ends came from.

    `recommend()` with a consolidation goal per blocked shape (a job of it starts once the plan
    is applied) and per waiting big job in its own shape (`waiting_goals`; such a plan names the
    job, `job`), and every other kind (reservations and loans for waiting jobs, reclaim of idle
    allocations, sharing, type rebalancing), its reservations on the running jobs' ends learned
    from `finished` (the history's finished jobs, `job_ends.predict`; `running`: the jobs with
    the starts the history used). No expected demand: the per-pool GPU forecast says how many
    GPUs, not which job shapes will arrive, which its expected-job reservations need. Each plan
    that acts gets its window from `forecast` (`advisor.planner.timing`): now, or the forecast's
    low-demand hour where its moves and holds cost least."""
    ends, ends_doc = predict(model, finished, settings.job_ends, running=running)
    goals: list[Goal | str] = [
        f"job={shape_label(shape)}" for shape in blocked_shapes(model, settings.shapes, shape_rows)
    ]
    waiting = waiting_goals(model)
    goals += [goal for _, goal in waiting]
    made, notes = recommend_with_notes(model, settings.policy, outlook(ends), goals=goals)
    first = len(goals) - len(waiting)  # consolidate() returns one plan per goal, in goal order
    for i, (job, _) in enumerate(waiting, start=first):
        made[i] = replace(made[i], extra={**made[i].extra, "job": job})
    actions = ranked_actions(made, model)
    counts = Counter(row["kind"] for row in actions)
    document = {
        "method": PLAN_METHOD,
        "goals": [plan.goal for plan in made],
        # per kind that recommends nothing, why, in numbers (what `plan --goal recommend` says)
        "notes": notes,
        "plans": [plan.to_dict() for plan in made],
        "actions": actions,
        "by_kind": {kind: counts.get(kind, 0) for kind in KINDS},
        "job_ends": ends_doc,
    }
    return with_windows(document, forecast, model)


def forecast(history: History, settings: Settings) -> dict[str, Any]:
    """The forecast stage's document (demand and idle windows per pool and per node, demand per
    tenant) from the history's complete hours: `advisor.forecast.live`, with the settings'
    horizons, idle windows, risk and limits; quotas from the policy. Each pool's `outlook` is
    the same forecast at the outlook horizons not among the horizons (the app's fan chart;
    /metrics exports the horizons only)."""
    pool_demand = history.pool_demand()
    panel = hourly_panel(pool_demand)
    doc = forecast_panel(
        panel,
        settings.horizons_h,
        runs_panel(pool_demand, "held_gpus"),
        settings.idle_windows_h,
        settings.idle_risk,
        node_panel(history.node_hours()),
        settings.idle_max_nodes,
    )
    more = sorted(set(settings.outlook_horizons_h) - set(settings.horizons_h))
    outlook = {p["pool"]: p["horizons"] for p in demand_section(panel, more)["pools"]}
    for pool in doc["pools"]:
        pool["outlook"] = outlook.get(pool["pool"], [])
    tenants = history.tenant_demand() if settings.max_tenants else None
    quotas = {t: q for (t, model), q in settings.policy.quotas.items() if not model}
    doc["tenants"] = tenant_section(tenants, settings.horizons_h, settings.max_tenants, quotas)
    return doc


def hourly_demand(history: History) -> pd.DataFrame:
    """Hourly mean allocated GPUs and capacity per pool: exactly the series the forecasts learn
    from (`hourly_panel`: complete hours only, thinly covered hours masked, NaN), long form
    `pool, hour, allocated_gpus, capacity_gpus`."""
    panel = hourly_panel(history.pool_demand())
    columns = ["pool", "hour", "allocated_gpus", "capacity_gpus"]
    if panel is None:
        return pd.DataFrame(columns=columns)
    allocated = panel.values.rename_axis(index="hour", columns="pool").stack(future_stack=True)
    capacity = panel.capacity.rename_axis(index="hour", columns="pool").stack(future_stack=True)
    frame = pd.DataFrame({"allocated_gpus": allocated, "capacity_gpus": capacity}).reset_index()
    return frame[columns].sort_values(["pool", "hour"], ignore_index=True)


def forecast_hour(history: History) -> int | None:
    """The hour of the history's latest run: the forecast changes only when it does (the hour
    still running is never used)."""
    latest = history.latest_timestamp()
    return None if latest is None else math.floor(latest / 3600.0)
