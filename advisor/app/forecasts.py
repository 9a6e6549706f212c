"""Forecast data for the app: tables and the fan chart's series, from the served forecast.

Everything here reads the forecast document the advisor serves (`/api/forecast`, as JSON data):
per-pool and per-tenant demand forecasts with their backtest, idle windows per pool and per node,
and the hourly series the forecasts learned from (`/api/history`). Forecasts come only with
their measured error: a pool/horizon without enough history has a reason instead of a number, an
interval without enough known errors a blank (`interval_reasons`).

"Now" in these tables is the last complete hour, as the service forecasts from it: GPUs held
are that hour's mean, GPUs idle that hour's low; only the predicted free GPUs per node
(`advisor.pipeline.queries.free_gpus_by_node`) read the current snapshot.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

NAIVE = "naive"  # its held-back WAPE is shown beside the pick's and the baseline's
HELD = "GPUs held (last complete hour's mean)"
IDLE_LOW = "idle in the last complete hour (its low)"
FREE_LOW = "free in the last complete hour (its low)"


def hours_of(label: str) -> int:
    """'24h' -> 24: a horizon or window label in whole hours."""
    return int(label.removesuffix("h"))


def all_horizons(series: dict[str, Any]) -> list[dict[str, Any]]:
    """A pool's horizons and its outlook horizons (`/api/forecast` only), by hours."""
    both = [*series.get("horizons", []), *series.get("outlook", [])]
    return sorted(both, key=lambda h: hours_of(h["horizon"]))


def fan_frame(doc: dict[str, Any], pool: str) -> pd.DataFrame:
    """The fan chart's points for one pool: the last complete hour (the forecast's origin, its
    mean allocation) then every available horizon's target with the point forecast and the
    q0.1 / q0.5 / q0.9 (NaN where there is no interval)."""
    columns = ["horizon", "time", "point", "q0.1", "q0.5", "q0.9"]
    series = next((p for p in doc.get("pools", []) if p["pool"] == pool), None)
    if series is None or not doc.get("origin"):
        return pd.DataFrame(columns=columns)
    origin = pd.Timestamp(doc["origin"])
    now = series.get("allocated_gpus")
    rows: list[dict[str, Any]] = [
        {"horizon": "0h", "time": origin, "point": now, "q0.1": now, "q0.5": now, "q0.9": now}
    ]
    for h in all_horizons(series):
        if not h.get("available"):
            continue
        q = h.get("quantiles") or {}
        rows.append(
            {
                "horizon": h["horizon"],
                "time": pd.Timestamp(h["target"]),
                "point": h["point_gpus"],
                "q0.1": q.get("0.1"),
                "q0.5": q.get("0.5"),
                "q0.9": q.get("0.9"),
            }
        )
    frame = pd.DataFrame(rows, columns=columns)
    numbers = ["point", "q0.1", "q0.5", "q0.9"]
    frame[numbers] = frame[numbers].astype(float)
    return frame


def tenants_frame(doc: dict[str, Any]) -> pd.DataFrame:
    """One row per tenant and available horizon: GPUs held in the last complete hour (mean),
    forecast GPUs held, interval, the held-back errors and q0.9 coverage of the pick, the
    baseline and naive, as for pools (the tenants holding the most GPUs; no capacity)."""
    section = doc.get("tenants") or {}
    baseline = section.get("baseline", "")
    rows = []
    for tenant in section.get("tenants", []):
        for h in tenant["horizons"]:
            if not h.get("available"):
                continue
            rows.append(
                {
                    "tenant": tenant["tenant"],
                    "horizon": h["horizon"],
                    HELD: tenant["allocated_gpus"],
                    "quota GPUs": tenant.get("quota_gpus"),
                    **_forecast_cells(h),
                    **_wape_cells(h, baseline),
                    **_coverage_cells(h, baseline),
                }
            )
    return pd.DataFrame(rows)


def _forecast_cells(h: dict[str, Any]) -> dict[str, Any]:
    """An available horizon's model, forecast and interval, as the tables show them (a null
    interval quantile, too few known errors, is a blank)."""
    quantiles = h.get("quantiles") or {}
    return {
        "model": h["model"],
        "forecast GPUs": _rounded(h["point_gpus"]),
        "low (q0.1)": _rounded(quantiles.get("0.1")),
        "high (q0.9)": _rounded(quantiles.get("0.9")),
    }


def _rounded(value: float | None) -> float:
    return float("nan") if value is None else round(float(value), 1)


def _wape_cells(h: dict[str, Any], baseline: str) -> dict[str, Any]:
    """Held-back WAPE of the horizon's model, of the baseline and of naive (served beside the
    pick, never used to choose it: the pick can lose to naive on held-back hours)."""
    wape = h["backtest"]["wape_ratio"]
    return {
        "backtest WAPE": wape.get(h["model"]),
        f"{baseline} WAPE": wape.get(baseline),
        f"{NAIVE} WAPE": wape.get(NAIVE),
    }


def _coverage_cells(h: dict[str, Any], baseline: str) -> dict[str, Any]:
    """How often the held-back hours fell at or below the q0.9 of the horizon's model and of the
    baseline (nominal 0.9; blank over too few hours with an interval), the hours the model's
    share was measured on (those that had an interval) and all held-back hours."""
    backtest = h["backtest"]
    coverage = backtest.get("coverage_ratio", {})
    return {
        "q0.9 coverage": coverage.get(h["model"], {}).get("0.9"),
        f"{baseline} q0.9 coverage": coverage.get(baseline, {}).get("0.9"),
        "coverage hours": backtest.get("coverage_origins", {}).get(h["model"]),
        "held-back hours": backtest["test_origins"],
    }


def horizons_frame(doc: dict[str, Any]) -> pd.DataFrame:
    """One row per pool and available horizon (the outlook's included): forecast, interval, the
    held-back errors of the pick, the baseline and naive, and how often the held-back hours fell
    at or below the q0.9 (nominal 0.9; blank over too few held-back hours with an interval)."""
    baseline = doc.get("baseline", "")
    rows = []
    for pool in doc.get("pools", []):
        for h in all_horizons(pool):
            if not h.get("available"):
                continue
            rows.append(
                {
                    "pool": pool["pool"],
                    "horizon": h["horizon"],
                    "target (UTC)": h["target"].replace("T", " ")[:16],
                    **_forecast_cells(h),
                    "capacity GPUs": pool["capacity_gpus"],
                    **_wape_cells(h, baseline),
                    **_coverage_cells(h, baseline),
                }
            )
    return pd.DataFrame(rows)


def interval_reasons(doc: dict[str, Any]) -> list[str]:
    """'horizon: why (pools: …)' for every available pool horizon served without an interval
    (the blank low/high cells), deduplicated; tenants listed as such."""
    reasons: dict[str, list[str]] = {}
    tenants = (doc.get("tenants") or {}).get("tenants", [])
    series = [(p["pool"], all_horizons(p)) for p in doc.get("pools", [])]
    series += [(f"tenant {t['tenant']}", t["horizons"]) for t in tenants]
    for name, horizons in series:
        for h in horizons:
            if h.get("available") and h.get("interval_reason"):
                reasons.setdefault(f"{h['horizon']}: {h['interval_reason']}", []).append(name)
    return [f"{why} ({', '.join(names)})" for why, names in reasons.items()]


def missing_reasons(doc: dict[str, Any]) -> list[str]:
    """'pool horizon: why' for every horizon without a forecast (deduplicated)."""
    reasons: dict[str, list[str]] = {}
    for pool in doc.get("pools", []):
        for h in all_horizons(pool):
            if not h.get("available"):
                reasons.setdefault(f"{h['horizon']}: {h['reason']}", []).append(pool["pool"])
    return [f"{why} (pools: {', '.join(pools)})" for why, pools in reasons.items()]


def idle_frame(doc: dict[str, Any]) -> pd.DataFrame:
    """One row per pool and idle window with a release: GPUs that stay free for the whole window
    at the service's risk, next to how that release did on held-back hours (violations, capture)
    and how releasing the past-window minimum did."""
    idle = doc.get("idle") or {}
    baseline = idle.get("baseline", "")
    rows = []
    for pool in idle.get("pools", []):
        for w in pool["windows"]:
            if not w.get("available"):
                continue
            bt = w["backtest"]
            rows.append(
                {
                    "pool": pool["pool"],
                    "window": w["window"],
                    "until (UTC)": w["until"].replace("T", " ")[:16],
                    "free GPUs for the whole window": w["release_gpus"],
                    IDLE_LOW: pool["current_idle_gpus"],
                    "capacity GPUs": pool["capacity_gpus"],
                    "backtest violations": bt["violation_ratio"].get("advisor"),
                    "backtest capture": bt["capture_ratio"].get("advisor"),
                    f"{baseline} violations": bt["violation_ratio"].get(baseline),
                    f"{baseline} capture": bt["capture_ratio"].get(baseline),
                    "held-back hours": bt["test_origins"],
                }
            )
    return pd.DataFrame(rows)


def idle_missing_reasons(doc: dict[str, Any]) -> list[str]:
    """'window: why (pools)' for every idle window without a release (deduplicated)."""
    idle = doc.get("idle") or {}
    reasons: dict[str, list[str]] = {}
    for pool in idle.get("pools", []):
        for w in pool["windows"]:
            if not w.get("available"):
                reasons.setdefault(f"{w['window']}: {w['reason']}", []).append(pool["pool"])
    if idle.get("error"):
        reasons.setdefault(f"all windows: failed ({idle['error']})", [])
    return [f"{why} (pools: {', '.join(pools) or 'all'})" for why, pools in reasons.items()]


def idle_nodes_frame(doc: dict[str, Any]) -> pd.DataFrame:
    """One row per node of the idle section: its pool, GPUs, GPUs idle in the last complete
    hour, the GPUs released as free for each whole window (None: no release, see
    `idle_missing_reasons`), and the shortest window's held-back violations and capture; the
    most releasable nodes first (by the shortest window's release, then the longer ones')."""
    idle = doc.get("idle") or {}
    windows = list(idle.get("windows", []))
    first = windows[0] if windows else ""
    rows = []
    for node in idle.get("nodes", []):
        by = {w["window"]: w for w in node["windows"]}
        row: dict[str, Any] = {
            "node": node["node"],
            "pool": node["pool"],
            "GPUs": node["capacity_gpus"],
            FREE_LOW: node["current_idle_gpus"],
        }
        for window in windows:
            w = by.get(window, {})
            row[f"free for {window}"] = w.get("release_gpus") if w.get("available") else None
        shortest = by.get(first, {})
        bt = shortest.get("backtest", {}) if shortest.get("available") else {}
        row[f"{first} backtest violations"] = bt.get("violation_ratio", {}).get("advisor")
        row[f"{first} backtest capture"] = bt.get("capture_ratio", {}).get("advisor")
        rows.append(row)
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    keys = [f"free for {w}" for w in windows] + [FREE_LOW]
    order = frame[keys].astype(float).fillna(-1.0)
    order["node"] = frame["node"]
    ranked = order.sort_values([*keys, "node"], ascending=[False] * len(keys) + [True])
    return frame.loc[ranked.index].reset_index(drop=True)


def idle_node_reasons(doc: dict[str, Any]) -> list[str]:
    """'window: why (N nodes)' for every per-node window without a release (deduplicated),
    and the node part's failure if any."""
    idle = doc.get("idle") or {}
    reasons: dict[str, int] = {}
    for node in idle.get("nodes", []):
        for w in node["windows"]:
            if not w.get("available"):
                key = f"{w['window']}: {w['reason']}"
                reasons[key] = reasons.get(key, 0) + 1
    out = [f"{why} ({n} node{'s' if n != 1 else ''})" for why, n in reasons.items()]
    if idle.get("node_error"):
        out.append(f"all nodes: failed ({idle['node_error']})")
    return out


def job_ends_text(doc: dict[str, Any]) -> str:
    """Where the job ends come from, in markdown, from the plan stage's job-end document: its
    `source` line, with how many finished jobs the ends were learned from and for how many
    running jobs, or why the planner's fallback is used."""
    if not doc:
        return "**the planner's fallback** (the plan stage has not run)"
    reason = f" ({doc['reason']})" if doc.get("reason") else ""
    if not doc.get("predicted_allocations"):
        return f"**{doc['source']}**{reason}"
    return (
        f"**{doc['source']} learned from {doc['finished_jobs']} finished jobs**, for "
        f"{doc['predicted_jobs']} of {doc['running_jobs']} running jobs{reason}"
    )
