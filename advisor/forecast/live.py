"""Per-pool demand forecasts from the advisor's own history, each with its measured backtest.

The hourly panel of the history (`advisor.forecast.runs.hourly_panel`) goes, for each pool and
horizon, through:

1. rolling-origin forecasts (`advisor.forecast.rolling.rolling_forecasts`, information ≤ origin
   only) of every candidate the backtest has (`selection.CANDIDATES`) over every origin whose
   target is already observed;
2. the earlier half of those origins picks the advisor by the backtest's own rule
   (`advisor.forecast.selection`: naive and the candidates that beat it in every window, their
   median); the later half is held back and scores the advisor, the seasonal-naive baseline and
   naive by WAPE and by the coverage of their intervals (over the held-back origins that had
   one, `_coverage`); those scores are served, never used to choose (they would no longer be out
   of sample). The pick is scored only on the earlier origins whose target is observed at the
   first held-back origin (as the offline selection's targets lie before its test part), so no
   hour after a held-back origin chooses the model scored there: on a short history with a long
   horizon there may be none, and the pick is naive;
3. the pick's members, fitted on everything, forecast from the last complete hour; the advisor
   is their median, its interval split-conformal on its own errors known then
   (`selection.conformal`); with fewer than `MIN_INTERVAL_ERRORS` of them (a short history, a
   long horizon) the interval quantiles are null and `interval_reason` says why (the median is
   still served).

A pool's (tenant's) `allocated_gpus` is the mean of the latest observed complete hour (the last
complete hour unless it is masked), not the latest run's value: the forecast's own input.

Backtest, fit and forecast all see the same hourly values and readings inside each hour, so the
pick, its interval and its held-back error come from the same inputs.

A pool/horizon without enough history for both halves gets no forecast at all (design rule:
no forecast is shown without a measured error against seasonal naive on held-back data).

The idle windows (`advisor.forecast.live_idle`) join the demand in `forecast_pools`, the
document the service serves at /api/forecast.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from advisor.forecast import metrics as M
from advisor.forecast import rolling, selection
from advisor.forecast.features import within_arrays
from advisor.forecast.live_idle import idle_or_error
from advisor.forecast.models import MIN_INTERVAL_ERRORS, as_arrays, make
from advisor.forecast.panel import Panel
from advisor.forecast.rolling import rolling_forecasts
from advisor.forecast.runs import RunsPanel, hourly_panel, node_panel, runs_panel
from advisor.forecast.selection import CANDIDATES, RULE
from advisor.forecast.served import finite, horizon_label, last_finite, message, ratio
from advisor.settings import IDLE_MAX_NODES, IDLE_RISK, IDLE_WINDOWS_H, MAX_TENANTS

if TYPE_CHECKING:
    from advisor.history import NodeHours

BASELINE = "seasonal_naive_24"
NAIVE = selection.NAIVE  # its held-back scores are served too: the yardstick of the rule
QUANTILES: tuple[float, ...] = (0.1, 0.5, 0.9)
MIN_HALF = 6  # origins in each of the selection and held-back halves
# Held-back hours with a real interval (and an observed actual) below which no coverage is
# served: one hour moves a share of 12 by 8 points, near the 10 between q0.1 and the median, so
# fewer cannot tell a q0.1 from the median (binomial SE at 0.9 and 12 hours: 0.09).
MIN_COVERAGE_ORIGINS = 12
MAX_ORIGINS = 14 * 24  # bound the backtest's cost on a long history

log = logging.getLogger(__name__)


def forecast_pools(
    pool_demand: pd.DataFrame,
    horizons_h: Sequence[int],
    windows_h: Sequence[int] = IDLE_WINDOWS_H,
    risk: float = IDLE_RISK,
    nodes: NodeHours | None = None,
    max_nodes: int = IDLE_MAX_NODES,
) -> dict[str, Any]:
    """The forecast document served at /api/forecast (see the module docstring): demand from
    the pools' allocated GPUs, idle windows from their held GPUs (`advisor.history.NodeRows`:
    a GPU with any share handed out is not free); `nodes` (`History.node_hours()`) adds the
    per-node idle windows."""
    return forecast_panel(
        hourly_panel(pool_demand),
        horizons_h,
        runs_panel(pool_demand, "held_gpus"),
        windows_h,
        risk,
        node_panel(nodes),
        max_nodes,
    )


def forecast_panel(
    panel: Panel | None,
    horizons_h: Sequence[int],
    held: RunsPanel | None,
    windows_h: Sequence[int] = IDLE_WINDOWS_H,
    risk: float = IDLE_RISK,
    nodes: Panel | None = None,
    max_nodes: int = IDLE_MAX_NODES,
) -> dict[str, Any]:
    """`forecast_pools` on an already built hourly panel of allocated GPUs (demand), runs panel
    of held GPUs (idle windows; None: none) and hourly node panel (`node_panel`; None: no
    per-node idle windows)."""
    return {
        **demand_section(panel, horizons_h),
        "idle": idle_or_error(held, windows_h, risk, nodes, max_nodes),
    }


def demand_section(panel: Panel | None, horizons_h: Sequence[int]) -> dict[str, Any]:
    """The demand part of the document: per series of the hourly panel and horizon, the
    forecast with its interval and held-back backtest (`history_hours`, `quantiles`,
    `baseline`, `candidates`, `origin`, `pools`)."""
    hours = 0 if panel is None else len(panel.index)
    doc: dict[str, Any] = {
        "history_hours": hours,
        "quantiles": list(QUANTILES),
        "baseline": BASELINE,
        "candidates": list(CANDIDATES),
        "pools": [],
    }
    if panel is None:
        doc["origin"] = None
        return doc
    y, cap, times = as_arrays(panel.values, panel.capacity)
    last = len(y) - 1
    doc["origin"] = times[last].isoformat() + "Z"
    by_pool: dict[str, dict[str, Any]] = {
        s: {
            "pool": s,
            "capacity_gpus": last_finite(cap[:, j]),
            "allocated_gpus": last_finite(y[:, j]),
            "horizons": [],
        }
        for j, s in enumerate(panel.series)
    }
    for h in sorted(set(horizons_h)):
        origins = np.arange(max(0, last - h - MAX_ORIGINS + 1), last - h + 1)
        if len(origins) < 2 * MIN_HALF:
            for entry in by_pool.values():
                entry["horizons"].append(
                    {
                        "horizon": horizon_label(h),
                        "available": False,
                        "reason": f"needs {2 * MIN_HALF + h} complete hours of history, "
                        f"has {hours}",
                    }
                )
            continue
        for series, entry in _horizon(panel, h, origins).items():
            by_pool[series]["horizons"].append(entry)
    doc["pools"] = list(by_pool.values())
    return doc


def _horizon(panel: Panel, h: int, origins: np.ndarray) -> dict[str, dict[str, Any]]:
    """`demand_section`'s entry per series at horizon `h` from the backtest over `origins`."""
    times = panel.index
    last = len(times) - 1
    step = rolling.step_of(panel)
    half = len(origins) // 2
    fc = rolling_forecasts(panel, CANDIDATES, [h], QUANTILES, origins)
    select_until = times[origins[half]]
    # the pick is scored on the earlier half's origins whose target is observed at the first
    # held-back origin: a later target would let the hours after held-back origins choose
    # the model the held-back half scores at them (none: naive, the selection's default)
    scored = times[origins[:half][origins[:half] + h <= origins[half]]]
    picks = selection.complete(
        selection.choose(fc[fc["origin"].isin(scored)], RULE), panel.series, [h]
    )
    advisor = rolling.advisor_rows(fc, picks, QUANTILES, step, RULE)
    now = _now(panel, h, picks, last)
    now = rolling.advisor_rows(now, picks, QUANTILES, step, RULE, known=fc)
    pick_of = dict(zip(picks["series"], picks["pick"], strict=True))
    out = {}
    for series in panel.series:
        pick = str(pick_of[series])
        # the pick's scores are the served forecast's own (its conformal interval included),
        # also where the pick is naive: naive's own interval is another one
        shown = [(pick, advisor)] + [
            (name, fc[fc["model"] == name]) for name in (BASELINE, NAIVE) if name != pick
        ]
        late = {
            name: g[(g["series"] == series) & (g["origin"] >= select_until)] for name, g in shown
        }
        wape = {
            name: ratio(M.wape(g["actual"].to_numpy(), g["point"].to_numpy()))
            for name, g in late.items()
        }
        covered = {name: _coverage(g) for name, g in late.items()}
        mine = advisor[advisor["series"] == series]
        row = now[now["series"] == series].iloc[0]
        out[series] = {
            "horizon": horizon_label(h),
            "available": True,
            "target": (times[last] + pd.Timedelta(hours=h)).isoformat() + "Z",
            "model": pick,
            "point_gpus": float(row["point"]),
            "quantiles": {f"{q:g}": finite(row[f"q{q:g}"]) for q in QUANTILES},
            "interval_reason": _interval_reason(_known_errors(mine, h, times[last], step)),
            "backtest": {
                "selection_origins": len(scored),
                "test_origins": int(len(origins) - half),
                "wape_ratio": wape,
                "coverage_ratio": {name: c[0] for name, c in covered.items()},
                "coverage_origins": {name: c[1] for name, c in covered.items()},
            },
        }
    return out


def _now(panel: Panel, h: int, picks: pd.DataFrame, last: int) -> pd.DataFrame:
    """The picks' members, fitted on every hour, forecasting `h` hours from the last one (the
    candidates' rows that `rolling.advisor_rows` takes)."""
    y, cap, times = as_arrays(panel.values, panel.capacity)
    within = within_arrays(panel.within, panel.values)
    capf = pd.DataFrame(cap).ffill().to_numpy()
    names = sorted({m for p in picks["pick"] for m in selection.members_of(str(p))})
    at = np.array([last])
    rows = []
    for name in names:
        model = make(name, QUANTILES).fit(y, cap, times, last, [h], within)
        point = model.predict(y, cap, times, at, h, within)[0]
        for j, series in enumerate(panel.series):
            rows.append(
                {
                    "origin": times[last],
                    "series": series,
                    "horizon": h,
                    "model": name,
                    "point": float(point[j]),
                    "actual": np.nan,
                    "capacity": float(capf[min(last + h, len(capf) - 1), j]),
                }
            )
    return pd.DataFrame(rows)


def _known_errors(advisor: pd.DataFrame, h: int, now: pd.Timestamp, step: pd.Timedelta) -> int:
    """The advisor's errors behind its interval at `now`: targets known by then, within the
    rule's trailing calibration days (as `selection.conformal` takes them)."""
    target = advisor["origin"] + h * step
    window = RULE.calibration_days * pd.Timedelta(days=1)
    known = (target <= now) & (target > now - window) & advisor["actual"].notna()
    return int(known.sum())


def _coverage(held_back: pd.DataFrame) -> tuple[dict[str, float | None], int]:
    """Per interval quantile (not the median): the share of held-back hours at or below it,
    the interval's measured calibration (nominal: the quantile itself), over the held-back
    hours with an observed actual and a real interval (every interval quantile known: an origin
    whose model had fewer than `MIN_INTERVAL_ERRORS` errors has none); and their number. Every
    share is None while fewer than `MIN_COVERAGE_ORIGINS` such hours remain."""
    levels = [f"q{q:g}" for q in QUANTILES if q != 0.5]
    y = held_back["actual"].to_numpy(float)
    bounds = held_back[levels].to_numpy(float)
    real = np.isfinite(y) & np.isfinite(bounds).all(axis=1)
    n = int(real.sum())
    out: dict[str, float | None] = {}
    for i, level in enumerate(levels):
        share = M.coverage(y[real], bounds[real, i]) if n >= MIN_COVERAGE_ORIGINS else np.nan
        out[level[1:]] = None if np.isnan(share) else share
    return out, n


def _interval_reason(errors: int) -> str | None:
    """Why the served interval quantiles are null (None: they are not)."""
    if errors >= MIN_INTERVAL_ERRORS:
        return None
    return (
        f"no interval: the model has {errors} known errors at this horizon, an interval needs "
        f"{MIN_INTERVAL_ERRORS}; the median is the forecast plus the median of those it has"
    )


def tenant_section(
    tenant_demand: pd.DataFrame | None,
    horizons_h: Sequence[int],
    max_tenants: int = MAX_TENANTS,
    quotas: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Demand per tenant (`History.tenant_demand()`: the GPUs its running allocations hold) for
    the `max_tenants` tenants holding the most GPUs at the latest run, each horizon forecast
    and backtested as a pool's is (`demand_section`), next to the tenant's quota (`quotas`:
    tenant -> GPUs over all models, from the policy; None where it has none). Tenants have
    quotas rather than GPUs of their own, so there is no capacity to clip to and no idle
    window; a failure here is reported in the section and leaves the pools' forecast alone."""
    head: dict[str, Any] = {"max_tenants": max_tenants, "tenants_total": 0, "error": None}
    try:
        panel = None
        if tenant_demand is not None and not tenant_demand.empty:  # None: not asked for
            latest = tenant_demand[tenant_demand["time"] == tenant_demand["time"].max()]
            head["tenants_total"] = int(latest["pool"].nunique())
            ranked = latest.sort_values(["allocated_gpus", "pool"], ascending=[False, True])
            kept = tenant_demand[tenant_demand["pool"].isin(ranked["pool"].head(max_tenants))]
            panel = hourly_panel(kept) if len(kept) else None
        demand = demand_section(panel, horizons_h)
    except Exception as error:
        log.exception("tenant demand forecast failed")
        head["error"] = message(error)
        demand = demand_section(None, horizons_h)
    return {**head, **_tenants(demand, quotas)}


def _tenants(demand: dict[str, Any], quotas: dict[str, float] | None) -> dict[str, Any]:
    """`demand_section`'s pools as tenants, each with its quota (no capacity)."""
    pools = demand.pop("pools")
    demand["tenants"] = [
        {
            "tenant": e["pool"],
            "allocated_gpus": e["allocated_gpus"],
            "quota_gpus": (quotas or {}).get(e["pool"]),
            "horizons": e["horizons"],
        }
        for e in pools
    ]
    return demand
