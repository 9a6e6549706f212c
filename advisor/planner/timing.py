"""When to act on a plan: now, or at the start of the next forecast low-demand window.

A plan's cost depends on when it is applied. Its moves cost their restart time whenever they
happen; the GPUs it holds cost what others could have run on them meanwhile, which is the
share of the pool's GPUs in demand at that hour; and every hour it waits, the jobs waiting on
it wait too. For each hour t the demand forecast covers (its horizons, with their interval):

    cost(t) = restart GPU-hours + held GPU-hours x busy(t) + waiting GPUs x (t - now)

where busy(t) = forecast allocated GPUs / capacity (P50; the P10 and P90 give the interval)
and busy(now) is the allocation now. The window is the forecast hour whose expected saving
cost(now) - cost(t) is largest, if it is positive and that hour's demand is below the demand
now (a low-demand window); else "now". A plan nobody waits on has nothing to lose by waiting,
so it waits for the quietest forecast hour whenever that hour is quieter than now (ties go
there too). Without a forecast (none served: too little history) the window is "now" and says
so: nothing shows a later hour to be cheaper.

Pure: plain data in (the plan and forecast documents the service serves), plain data out.
`plan_window` is what the service, the app and the replay's operator call.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np

from advisor.fragmentation.measures import parse_shape
from advisor.model import MILLI, ClusterModel, spec_allows

LOW_QUANTILE, MID_QUANTILE, HIGH_QUANTILE = "0.1", "0.5", "0.9"


@dataclass(frozen=True)
class DemandPoint:
    """Forecast demand of one pool at unix time `at`: allocated GPUs (P50, and the P10 / P90
    where an interval is served) out of `capacity` GPUs."""

    at: float
    p50: float
    capacity: float
    p10: float | None = None
    p90: float | None = None

    def busy(self, value: float | None = None) -> float:
        """Share of the capacity in demand (0..1) at this point, for `value` (default P50)."""
        x = self.p50 if value is None else value
        return min(1.0, max(0.0, x / self.capacity)) if self.capacity > 0 else 1.0


@dataclass(frozen=True)
class PlanCosts:
    """What acting on a plan costs: restart GPU-hours of its moves, the GPUs it holds and for
    how long if applied now, and the GPUs of the jobs that wait until it is applied."""

    restart_gpu_hours: float = 0.0
    held_gpu_hours: float = 0.0
    waiting_gpus: float = 0.0


@dataclass(frozen=True)
class Window:
    """When to act: `when` is "now" or "window" (at unix time `at`, the forecast hour)."""

    when: str
    at: float
    reason: str
    forecast: bool = False  # whether a served demand forecast informed it
    demand_gpus: float | None = None  # forecast P50 at the window (allocation now for "now")
    demand_interval: tuple[float | None, float | None] | None = None  # P10, P90 there
    capacity_gpus: float | None = None
    saving_gpu_hours: float = 0.0  # expected GPU-hours saved by waiting vs acting now
    saving_interval: tuple[float, float] | None = None  # from the forecast's P90 and P10

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        for key in ("demand_interval", "saving_interval"):
            if doc[key] is not None:
                doc[key] = list(doc[key])
        return doc


def cost_at(costs: PlanCosts, now: float, at: float, busy: float) -> float:
    """GPU-hours acting at `at` costs, with `busy` of the pool in demand then."""
    return (
        costs.restart_gpu_hours
        + costs.held_gpu_hours * busy
        + costs.waiting_gpus * max(0.0, at - now) / 3600.0
    )


def act_window(
    costs: PlanCosts, now: float, current: DemandPoint | None, forecast: Sequence[DemandPoint]
) -> Window:
    """The window for a plan with `costs` (module docstring). `current` is the pool's demand
    now (None: unknown), `forecast` its forecast points (later than now)."""
    points = [p for p in forecast if p.at > now and p.capacity > 0]
    if current is None or not points:
        why = "no demand forecast with a measured error yet" if not points else "demand unknown"
        return Window("now", now, f"act now: {why}, so no later hour is known to be cheaper")
    base = cost_at(costs, now, now, current.busy())
    best: tuple[float, DemandPoint] | None = None
    for point in points:
        if point.busy() >= current.busy():
            continue  # not a low-demand window
        saving = base - cost_at(costs, now, point.at, point.busy())
        quieter = best is None or point.busy() < best[1].busy()
        if (costs.waiting_gpus == 0 and quieter) or (
            costs.waiting_gpus > 0 and (best is None or saving > best[0])
        ):
            best = (saving, point)
    if best is None or (costs.waiting_gpus > 0 and best[0] <= 0):
        if best is None:
            why = "no forecast hour has less demand than now"
        else:
            why = (
                f"waiting costs more than it saves: the jobs waiting on this plan "
                f"({costs.waiting_gpus:g} GPUs) would lose {-best[0]:.1f} GPU-hours net"
            )
        return Window(
            "now",
            now,
            f"act now: {why}",
            forecast=True,
            demand_gpus=current.p50,
            capacity_gpus=current.capacity,
        )
    saving, point = best
    lo_busy = point.busy(point.p90) if point.p90 is not None else None  # more demand: less saved
    hi_busy = point.busy(point.p10) if point.p10 is not None else None
    interval = None
    if lo_busy is not None and hi_busy is not None:
        interval = (
            base - cost_at(costs, now, point.at, lo_busy),
            base - cost_at(costs, now, point.at, hi_busy),
        )
    who = "nothing waits on it" if costs.waiting_gpus == 0 else "waiting saves more than it costs"
    return Window(
        "window",
        point.at,
        f"act at the low-demand hour {_iso(point.at)} ({point.p50:.0f} of {point.capacity:.0f} "
        f"GPUs in demand, {current.p50:.0f} now): {who}",
        forecast=True,
        demand_gpus=point.p50,
        demand_interval=(point.p10, point.p90),
        capacity_gpus=point.capacity,
        saving_gpu_hours=saving,
        saving_interval=interval,
    )


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, tz=UTC).strftime("%Y-%m-%dT%H:%MZ")


def _parse_time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def forecast_points(forecast: Mapping[str, Any] | None) -> dict[str, list[DemandPoint]]:
    """Per pool, the demand forecast document's available horizons as points."""
    out: dict[str, list[DemandPoint]] = {}
    for pool in (forecast or {}).get("pools", []) or []:
        capacity = pool.get("capacity_gpus")
        points = []
        for h in pool.get("horizons", []):
            if not h.get("available") or capacity is None:
                continue
            q = h.get("quantiles") or {}
            points.append(
                DemandPoint(
                    at=_parse_time(h["target"]),
                    p50=float(h["point_gpus"] if q.get(MID_QUANTILE) is None else q[MID_QUANTILE]),
                    capacity=float(capacity),
                    p10=q.get(LOW_QUANTILE),
                    p90=q.get(HIGH_QUANTILE),
                )
            )
        out[str(pool.get("pool", ""))] = points
    return out


def plan_costs(plan: Mapping[str, Any], waiting_gpus: float = 0.0) -> PlanCosts:
    """A plan document's costs: its restart GPU-hours, and the GPU-hours it holds idle if
    applied now (a reservation's `idle_gpu_hours`, now and later, else its actions' cost)."""
    cost = plan.get("cost") or {}
    held = plan.get("idle_gpu_hours", cost.get("idle_gpu_hours", 0.0))
    return PlanCosts(float(cost.get("gpu_hours", 0.0)), float(held or 0.0), waiting_gpus)


def plan_window(
    plan: Mapping[str, Any],
    forecast: Mapping[str, Any] | None,
    now: float,
    pool: str,
    allocated_gpus: float | None,
    capacity_gpus: float | None,
    waiting_gpus: float = 0.0,
) -> Window:
    """The window of one plan document (`Plan.to_dict()`), on its pool's forecast; the pool's
    allocation now (`allocated_gpus` of `capacity_gpus`) is the demand to beat."""
    points = forecast_points(forecast).get(pool or "(none)", [])
    current = None
    if allocated_gpus is not None and capacity_gpus and math.isfinite(allocated_gpus):
        current = DemandPoint(now, float(allocated_gpus), float(capacity_gpus))
    return act_window(plan_costs(plan, waiting_gpus), now, current, points)


# --------------------------------------------------------------------------- on a model


def pending_gpus_by_job(model: ClusterModel) -> dict[str, float]:
    """GPUs each waiting job asks for (its unplaced tasks summed)."""
    allocs = model.allocations
    out: dict[str, float] = {}
    for row in np.flatnonzero(allocs.node < 0).tolist():
        share = float(allocs.num_gpu[row]) * float(allocs.gpu_milli[row]) / MILLI
        out[str(allocs.job[row])] = out.get(str(allocs.job[row]), 0.0) + share
    return out


def waiting_on(plan: Mapping[str, Any], model: ClusterModel) -> tuple[str, float]:
    """The waiting job a plan would start and its GPUs: a reservation's own job; for a
    consolidation goal `job=SHAPE`, the first waiting job (queue order: priority, then
    creation) of that many tasks x GPUs whose `gpu_spec` allows the GPU models of the nodes
    the plan makes room on; ("", 0) when none waits on it."""
    pending = pending_gpus_by_job(model)
    job = plan.get("job")
    if isinstance(job, str) and job in pending:
        return job, pending[job]
    goal = str(plan.get("goal", ""))
    if not goal.startswith("job="):
        return "", 0.0
    try:
        shape = parse_shape(goal.removeprefix("job="))
    except ValueError:
        return "", 0.0
    allocs = model.allocations
    rows = np.flatnonzero(allocs.node < 0)
    tasks: dict[str, list[int]] = {}
    for row in rows.tolist():
        tasks.setdefault(str(allocs.job[row]), []).append(row)
    # the GPU models of the nodes the plan makes room on: a job that does not allow one of
    # them could not start there (a configured shape may name no model at all)
    targets = {
        str(a["to"]["node"])
        for a in plan.get("actions", [])
        if a.get("kind") == "reserve" and a.get("to")
    }
    on = np.isin(model.nodes.name, np.array(sorted(targets), dtype=object))
    models = sorted({str(m) for m in model.nodes.gpu_model[on].tolist()})
    best: tuple[tuple[int, float], str] | None = None
    for name, members in tasks.items():
        first = members[0]
        spec = str(allocs.gpu_spec[first])
        if (
            len(members) == shape.tasks
            and int(allocs.num_gpu[first]) == shape.num_gpu
            and int(allocs.gpu_milli[first]) == shape.gpu_milli
            and (not shape.gpu_spec or spec in ("", shape.gpu_spec))
            and all(spec_allows(spec, m) for m in models)
        ):
            key = (-int(allocs.priority[first]), float(allocs.creation_time[first]))
            if best is None or key < best[0]:
                best = (key, name)
    return ("", 0.0) if best is None else (best[1], pending[best[1]])


def pool_of_plan(plan: Mapping[str, Any], model: ClusterModel) -> str:
    """The pool of the first node a plan's actions touch ("" unknown)."""
    for action in plan.get("actions", []):
        for side in ("to", "from"):
            target = action.get(side)
            if target:
                hits = np.flatnonzero(model.nodes.name == target["node"])
                if hits.size:
                    return str(model.nodes.pool[hits[0]])
    return ""


def pool_demand_now(model: ClusterModel, pool: str) -> tuple[float, float]:
    """(allocated GPUs, usable GPUs) of one pool now."""
    on = (model.nodes.pool[model.gpus.node] == pool) & model.gpu_usable
    allocated = float(model.gpu_milli_allocated[on].sum()) / MILLI
    return allocated, float(on.sum())


def acts(plan: Mapping[str, Any]) -> bool:
    """Whether a plan document has something to do: a feasible plan with actions, or a
    reservation with GPUs to hold later (`schedule`) though none is free now."""
    return bool(plan.get("feasible")) and bool(plan.get("actions") or plan.get("schedule"))


def with_windows(
    recommendations: Mapping[str, Any], forecast: Mapping[str, Any] | None, model: ClusterModel
) -> dict[str, Any]:
    """The recommendations document with a `window` on every plan that acts (`acts`;
    `plan_window` on its pool's forecast, the job it would start counted as waiting) and
    `waiting_job` naming that job ("" none)."""
    now = model.timestamp
    plans = []
    for plan in recommendations.get("plans", []):
        if not acts(plan) or math.isnan(now):
            plans.append(plan)
            continue
        job, gpus = waiting_on(plan, model)
        pool = pool_of_plan(plan, model)
        allocated, capacity = pool_demand_now(model, pool)
        window = plan_window(plan, forecast, now, pool, allocated, capacity, gpus)
        plans.append({**plan, "waiting_job": job, "window": window.to_dict()})
    return {**recommendations, "plans": plans}
