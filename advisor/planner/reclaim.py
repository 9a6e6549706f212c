"""Reclaim: allocated GPUs that sat idle for a long window, and what they waste.

`plan_reclaim(model, policy, settings)` finds allocations whose GPUs have all been under
`threshold` utilization for at least `min_idle_s` (from the usage history; without history the
duration is unknown, so nothing qualifies, and the plan's note says so and how to read a source
with history) and returns one checked `Plan` of `reclaim` actions.
Each action says how long the GPUs idled, the GPU-hours and the energy that wasted, and what
stopping the job costs (one restart when its owner resumes it, its restart time). Waste is
counted on the guaranteed share (what the task held); a task with a limit above it says so,
and on a GPU it shares the reason gives what the GPU promises (the holders' guarantees) and
may be asked for under contention (their limits) before and after, and what that means for
the tasks left (`share.contention_text`).

Work that must not be touched is not reclaimed but still reported, with its waste, under
`extra["protected"]` (not migratable, or above `settings.max_priority`).

Energy: observed watts per GPU (the model's `gpus.power_watts`, or `power_watts` passed by the
caller, length G) × idle hours; where a GPU's power was not observed, idle-draw watts from
`IDLE_WATTS` (typical `nvidia-smi` idle draw at the idle clock, per GPU model; substring match,
first hit). Each action says which one it used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from advisor.model import MILLI, RESERVATION_QOS, ClusterModel
from advisor.planner.actions import Action, Cost, GpuSet, Plan, restart_seconds
from advisor.planner.check import check_plan
from advisor.planner.constraints import Policy
from advisor.planner.observed import HISTORY_HINT, history_s, observe
from advisor.planner.outcome import outcome
from advisor.planner.share import contention_text

# (substring of the NVML name, idle watts, board power limit watts); first match wins.
IDLE_WATTS: tuple[tuple[str, float, float], ...] = (
    ("H200", 75.0, 700.0),
    ("H100 PCIe", 50.0, 350.0),
    ("H100", 72.0, 700.0),
    ("A100-PCIE", 40.0, 250.0),
    ("A100-SXM4-40GB", 55.0, 400.0),
    ("A100", 62.0, 400.0),
    ("A30", 30.0, 165.0),
    ("L40S", 35.0, 350.0),
    ("L40", 35.0, 300.0),
    ("A10", 20.0, 150.0),
    ("L4", 16.0, 72.0),
    ("V100-PCIE", 35.0, 250.0),
    ("V100", 42.0, 300.0),
    ("T4", 10.0, 70.0),
)
DEFAULT_IDLE_WATTS = 50.0  # unknown model


def idle_watts(gpu_model: str) -> tuple[float, str]:
    """(watts, where the number comes from) for one idle GPU of `gpu_model`."""
    for key, watts, _ in IDLE_WATTS:
        if key.upper() in gpu_model.upper():
            return watts, f"idle-draw table ({key})"
    return DEFAULT_IDLE_WATTS, "idle-draw table (unknown model, default)"


@dataclass(frozen=True)
class ReclaimSettings:
    threshold: float = 0.05  # utilization under this is idle
    min_idle_s: float = 2 * 3600.0  # idle at least this long to be reclaimed
    lookback_s: float = 24 * 3600.0  # history searched for the idle run
    max_priority: int | None = None  # only reclaim work at or below this priority (None: any)


def idle_allocations(
    model: ClusterModel,
    settings: ReclaimSettings = ReclaimSettings(),
    power_watts: np.ndarray | None = None,
) -> list[dict[str, Any]]:
    """One row per placed allocation idle for at least `min_idle_s`: its waste so far."""
    obs = observe(model, settings.lookback_s, settings.threshold)
    allocs, places = model.allocations, model.placements
    if power_watts is None:
        power_watts = model.gpus.power_watts
    rows = np.flatnonzero(
        (allocs.node >= 0)
        & (allocs.num_gpu > 0)
        & (obs.idle_s >= settings.min_idle_s)
        & (allocs.qos != RESERVATION_QOS)  # a reservation is idle by design, until its job starts
    )
    out = []
    limits = model.placement_limit_milli
    for row in rows.tolist():
        on = places.alloc == row
        gpus, milli = places.gpu[on], places.milli[on]
        share = float(milli.sum()) / MILLI
        node = int(allocs.node[row])
        gpu_model = str(model.nodes.gpu_model[node])
        hours = float(obs.idle_s[row]) / 3600.0
        if power_watts is not None and np.isfinite(power_watts[gpus]).all():
            watts = float((power_watts[gpus] * milli / MILLI).sum())
            source = "observed power"
        else:
            per_gpu, source = idle_watts(gpu_model)
            watts = per_gpu * share
        out.append(
            {
                "row": row,
                "alloc": str(allocs.id[row]),
                "job": str(allocs.job[row]),
                "tenant": str(allocs.tenant[row]),
                "priority": int(allocs.priority[row]),
                "migratable": bool(allocs.migratable[row]),
                "node": str(model.nodes.name[node]),
                "gpu_model": gpu_model,
                "gpus": [int(model.gpus.index[g]) for g in gpus],
                "milli": int(milli.max()),
                "limit_milli": int(limits[on].max()),
                "gpu_share": share,
                "gpu_limit": float(limits[on].sum()) / MILLI,
                "gpu_rows": gpus.tolist(),
                "share_each": milli.tolist(),
                "limit_each": limits[on].tolist(),
                "idle_hours": hours,
                "gpu_hours": share * hours,
                "watts": watts,
                "energy_kwh": watts * hours / 1000.0,
                "power_source": source,
            }
        )
    return out


def plan_reclaim(
    model: ClusterModel,
    policy: Policy | None = None,
    settings: ReclaimSettings = ReclaimSettings(),
    power_watts: np.ndarray | None = None,
) -> Plan:
    """A checked plan of `reclaim` actions for long-idle allocations (module docstring)."""
    policy = policy or Policy()
    found = idle_allocations(model, settings, power_watts)
    actions: list[Action] = []
    protected = []
    # per GPU, what it promises (guarantees) and may be asked for (limits) as the plan goes
    promised = model.gpu_milli_allocated.copy()
    asked = model.gpu_limit_allocated.copy()
    for item in sorted(found, key=lambda r: -r["gpu_hours"]):
        why_not = ""
        if not item["migratable"]:
            why_not = "marked not migratable"
        elif settings.max_priority is not None and item["priority"] > settings.max_priority:
            why_not = f"priority {item['priority']} above {settings.max_priority}"
        if why_not:
            protected.append({**_public(item), "why_not": why_not})
            continue
        seconds = restart_seconds(model, item["row"], policy.default_restart_s)
        held = f"{item['gpu_share']:g}"
        if item["gpu_limit"] > item["gpu_share"]:
            held += f" guaranteed (limit {item['gpu_limit']:g})"
        reason = (
            f"{item['alloc']} ({item['tenant'] or 'no tenant'}) held {held} "
            f"{item['gpu_model']} GPU(s) under {settings.threshold:.0%} utilization for "
            f"{item['idle_hours']:.1f} h: {item['gpu_hours']:.1f} GPU-hours and "
            f"{item['energy_kwh']:.2f} kWh ({item['watts']:.0f} W, {item['power_source']}) "
            "wasted so far; give the GPUs back, the owner resumes from its last checkpoint"
            + _shared_effect(model, item, promised, asked)
        )
        actions.append(
            Action(
                "reclaim",
                alloc=item["alloc"],
                job=item["job"],
                tenant=item["tenant"],
                src=GpuSet(
                    item["node"],
                    tuple(item["gpus"]),
                    item["milli"],
                    limit_milli=item["limit_milli"]
                    if item["limit_milli"] > item["milli"]
                    else None,
                ),
                reason=reason,
                cost=Cost(
                    restarts=1,
                    restart_s=seconds,
                    gpu_hours=0.0,  # idle: no work is lost, only the restart later
                    jobs=(item["job"],),
                    tenants=(item["tenant"],) if item["tenant"] else (),
                ),
            )
        )
    goal = f"reclaim GPUs idle >= {settings.min_idle_s / 3600:g} h under {settings.threshold:.0%}"
    result = check_plan(model, actions, policy, settings.max_priority)
    if not result.ok:  # never return a plan that fails the replay
        return Plan(goal, False, (), reason=f"replay refused: {result}", method="reclaim")
    before, after, benefit = outcome(model, actions)
    items = [_public(r) for r in found]
    extra = {
        "waste": {
            "allocations": len(items),
            "gpu_hours": sum(r["gpu_hours"] for r in items),
            "energy_kwh": sum(r["energy_kwh"] for r in items),
            "gpus": sum(r["gpu_share"] for r in items),
        },
        "idle": items,
        "protected": protected,
    }
    note = "" if actions else _why_none(model, settings, protected)
    return Plan(goal, True, tuple(actions), before, after, note, "reclaim", benefit, extra)


def _shared_effect(
    model: ClusterModel, item: dict[str, Any], promised: np.ndarray, asked: np.ndarray
) -> str:
    """What giving back `item` changes on the GPUs it shares with others, as the plan goes
    (`promised`/`asked` per GPU, updated): the guarantees there (what the GPU promises) and
    the limits (what it may be asked for under contention), and what that means."""
    parts = []
    for row, share, limit in zip(
        item["gpu_rows"], item["share_each"], item["limit_each"], strict=True
    ):
        before = (int(promised[row]), int(asked[row]))
        promised[row] -= share
        asked[row] -= limit
        if promised[row] <= 0:
            continue  # nobody else on it: the GPU is simply given back
        where = f"{item['node']}/gpu{int(model.gpus.index[row])}"
        parts.append(
            f"{where} is shared: it promises {before[0] / MILLI:g} GPU (guarantees) and may be "
            f"asked for {before[1] / MILLI:g} under contention (limits); without this task the "
            "others' " + contention_text(int(promised[row]), int(asked[row]))
        )
    return "; " + "; ".join(parts) if parts else ""


def _why_none(
    model: ClusterModel, settings: ReclaimSettings, protected: list[dict[str, Any]]
) -> str:
    """Why the plan reclaims nothing: no history, too short a history, only protected work,
    or no allocation idle long enough."""
    need = f"{settings.min_idle_s / 3600:g} h"
    under = f"under {settings.threshold * 100:g}%"
    span = history_s(model, settings.lookback_s)
    if span <= 0:
        return (
            "the source has no usage history, so how long an allocation has been idle is "
            f"unknown and none can be reclaimed; {HISTORY_HINT}"
        )
    if span < settings.min_idle_s:
        return (
            f"the usage history covers {span / 3600:.3g} h, less than the {need} an allocation "
            f"must idle to be reclaimed; {HISTORY_HINT}"
        )
    if protected:
        return (
            f"{len(protected)} allocation(s) idle at least {need} {under}, all protected "
            "(not reclaimed, listed under protected)"
        )
    obs = observe(model, settings.lookback_s, settings.threshold)
    placed = (model.allocations.node >= 0) & (model.allocations.num_gpu > 0)
    if not placed.any():
        return "no allocation holds GPUs: nothing to reclaim"
    row = int(np.argmax(np.where(placed, obs.idle_s, -1.0)))
    longest = float(obs.idle_s[row])
    closest = (
        f"the longest idle is {model.allocations.id[row]}, {longest / 3600:.2g} h"
        if longest > 0
        else "none is idle now"
    )
    return (
        f"no allocation idle at least {need} {under} utilization: of {int(placed.sum())} "
        f"placed allocations, {closest}"
    )


def _public(item: dict[str, Any]) -> dict[str, Any]:
    return {
        k: (round(v, 4) if isinstance(v, float) and math.isfinite(v) else v)
        for k, v in item.items()
        if k not in ("row", "gpu_rows", "share_each", "limit_each")
    }
