"""Per-pool demand forecasts from the advisor's own history, each with its measured backtest.

The history (`advisor.history.History.pool_demand()`) holds allocated GPUs per pool at every
run. Its runs, at their own times, form a Panel that `Panel.resample("h")` (the one hourly
aggregation, as in the backtest) turns into hourly means plus each hour's readings
(`Panel.within`: last reading, min, max, slope); complete hours only, so the result changes
once an hour. An hour with fewer than half the runs expected from the spacing of the runs up
to it is masked (`hourly_panel`). Then for each pool and horizon:

1. rolling-origin forecasts (`advisor.forecast.rolling.rolling_forecasts`, information ≤ origin
   only) of a few cheap candidates over every origin whose target is already observed;
2. the earlier half of those origins picks the model (lowest MAE; it must beat naive by 1 %,
   as in `advisor.forecast.rolling.select`), the later half is held back and scores the pick,
   the seasonal-naive baseline and naive by WAPE and by the coverage of their intervals (over
   the held-back origins that had one, `_coverage`); those scores are served, never used to
   choose the model (they would no longer be out of sample). The pick is scored only on the
   earlier origins whose target is observed at the first held-back origin (as the offline
   selection's targets lie before its test part), so no hour after a held-back origin chooses
   the model scored there: on a short history with a long horizon there may be none, and the
   pick is naive;
3. the pick, fitted on everything, forecasts from the last complete hour with its interval:
   the forecast plus quantiles of its own known errors at the horizon; with fewer than
   `MIN_INTERVAL_ERRORS` of them (a short history, a long horizon) the interval quantiles are
   null and `interval_reason` says why (the median is still served).

A pool's (tenant's) `allocated_gpus` is the mean of the latest observed complete hour (the last
complete hour unless it is masked), not the latest run's value: the forecast's own input.

Backtest, fit and forecast all see the same hourly values and readings inside each hour, so the
pick, its interval and its held-back error come from the same inputs.

A pool/horizon without enough history for both halves gets no forecast at all (design rule:
no forecast is shown without a measured error against seasonal naive on held-back data).

Idle windows (GPUs that stay wholly free for the whole next W hours), per pool from the runs
panel of held GPUs and per node from the history's per-node hours, each with its held-back
backtest: `idle_section`.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from advisor.forecast import idle as I
from advisor.forecast import idle_windows
from advisor.forecast import metrics as M
from advisor.forecast.features import within_arrays
from advisor.forecast.io import Panel
from advisor.forecast.models import MIN_INTERVAL_ERRORS, as_arrays, make
from advisor.forecast.rolling import rolling_forecasts
from advisor.settings import IDLE_MAX_NODES, IDLE_RISK, IDLE_WINDOWS_H, MAX_TENANTS
from gpu_defrag_common.messages import one_line

if TYPE_CHECKING:
    from advisor.history import NodeHours

CANDIDATES: tuple[str, ...] = (
    "naive",
    "last_reading",
    "seasonal_naive_24",
    "same_hour_mean_7d",
    "holt_winters",
)
BASELINE = "seasonal_naive_24"
NAIVE = "naive"  # its held-back scores are served too: the pick must beat it to be picked
QUANTILES: tuple[float, ...] = (0.1, 0.5, 0.9)
MIN_HALF = 6  # origins in each of the selection and held-back halves
# Held-back hours with a real interval (and an observed actual) below which no coverage is
# served: one hour moves a share of 12 by 8 points, near the 10 between q0.1 and the median, so
# fewer cannot tell a q0.1 from the median (binomial SE at 0.9 and 12 hours: 0.09).
MIN_COVERAGE_ORIGINS = 12
MAX_ORIGINS = 14 * 24  # bound the backtest's cost on a long history
MIN_COVERAGE = 0.5  # an hour with fewer of its expected runs is masked (as Panel.resample)
SPACING_RUNS = 11  # trailing runs whose median gap sets the spacing (`_covered`)

# Idle windows (`idle_section`); the service's defaults of --forecast.idle-windows and
# --forecast.idle-risk are `advisor.settings.IDLE_WINDOWS_H` and `IDLE_RISK`
IDLE_BASELINE = "min_past_w"  # release what stayed free over the past W hours
IDLE_FIRST_H = 48  # idle's per-series rules calibrate from hour 48 on (yesterday's window)
IDLE_MIN_CALIBRATION_H = 24  # calibration origins before the held-back hours
IDLE_MIN_TEST = 24  # held-back origins with an observed outcome needed to show a release
IDLE_TEST_H = 7 * 24  # at most this many origins are held back
IDLE_MAX_H = 16 * 24  # the history idle windows see (cost, and the method the backtest measures)
IDLE_NODE_METHOD = "rules"  # per node: the per-series rules only (no quantile model, no pooled λ)

log = logging.getLogger("advisor.service")


@dataclass(frozen=True)
class RunsPanel(Panel):
    """The service's runs at their own times (one row per run, one column per pool); complete
    hours only. Its `resample` masks a bucket by the service's coverage rule (`_covered`: the
    runs expected from the spacing of the runs up to it) instead of `Panel.resample`'s one
    spacing for the whole input, which would mask the hourly backfill once the live runs
    dominate. Consumers that aggregate the panel they are given by `resample` (the demand
    forecast's `hourly_panel`, `idle_windows` and `idle.backtest` through `hourly_idle` and
    `minute_state`) therefore all see the same observed and masked hours."""

    def resample(self, freq: str, how: str = "mean", min_coverage: float = MIN_COVERAGE) -> Panel:
        every = Panel.resample(self, freq, how, min_coverage=0.0)  # every bucket with a run
        keep = _covered(self.values, every.index, freq, min_coverage)
        return Panel(
            every.values.where(keep),
            every.capacity,
            every.name,
            every.test_from,
            every.test_to,
            dict(every.meta),
            {k: v.where(keep) for k, v in every.within.items()},
        )

    def select(self, series: list[str]) -> RunsPanel:
        return RunsPanel(self.values[series], self.capacity[series], self.name)

    def since(self, start: pd.Timestamp) -> RunsPanel:
        """The runs from `start` on (bounds the history an expensive consumer sees)."""
        keep = self.index >= start
        return RunsPanel(self.values[keep], self.capacity[keep], self.name)


def runs_panel(pool_demand: pd.DataFrame, column: str = "allocated_gpus") -> RunsPanel | None:
    """A pool column of the history (`column`: allocated GPUs for demand, held GPUs for idle
    windows; mean of a run's rows) and capacity (max) per pool at each run's own time, the hour
    still running left out. None when there is no complete hour yet."""
    if pool_demand.empty:
        return None
    time = pd.to_datetime(pool_demand["time"], utc=True).dt.tz_localize(None)
    frame = pool_demand.assign(time=time)
    frame = frame[frame["time"] < time.max().floor("h")]  # the hour still running
    if frame.empty:
        return None
    runs_by_pool = (
        frame.groupby(["time", "pool"])
        .agg(value=(column, "mean"), capacity=("capacity_gpus", "max"))
        .unstack("pool")
    )
    values, capacity = runs_by_pool["value"], runs_by_pool["capacity"]
    values.columns.name = capacity.columns.name = values.index.name = capacity.index.name = None
    return RunsPanel(values.astype(float), capacity.astype(float), "advisor")


def hourly_panel(pool_demand: pd.DataFrame) -> Panel | None:
    """Hourly mean allocated GPUs, the readings inside each hour (`within`) and max capacity per
    pool, by `Panel.resample("h")` of the runs at their own times; the hour still running is
    left out. None when there is no complete hour yet.

    The runs are irregular (an interval plus run time, jitter, a backfill one hour apart before
    the live runs, gaps while the source is down), so `resample`'s own rule, which takes one
    spacing for the whole input, would mask every backfilled hour once the live runs dominate.
    Here an hour is masked when it holds fewer than half the runs expected from the spacing of
    the runs up to it (`RunsPanel`, `_covered`); hours without a run stay masked; capacity (the
    hour's max) is carried over them.
    """
    return hourly_of(runs_panel(pool_demand))


def hourly_of(runs: RunsPanel | None) -> Panel | None:
    """`hourly_panel` from an already built runs panel."""
    if runs is None:
        return None
    hourly = runs.resample("h")
    return Panel(hourly.values, hourly.capacity.ffill(), "advisor", within=hourly.within)


def _covered(
    values: pd.DataFrame,
    hours: pd.DatetimeIndex,
    freq: str = "h",
    min_coverage: float = MIN_COVERAGE,
) -> pd.DataFrame:
    """Per bucket (hour) and pool: True when it holds at least `min_coverage` of the runs
    expected.

    A run's spacing is the median gap between the last `SPACING_RUNS` runs up to it (earlier
    runs only, so an hour's mask never depends on a later hour); an hour expects one hour ÷ the
    median spacing of its runs. A normal hour of runs is kept whatever the interval, a slower
    stretch or a restart; a source outage of more than half an hour masks the hour, and so does
    a lone run inside a long outage (its trailing window still sees the usual spacing).
    """
    seconds = ((values.index - values.index[0]) / pd.Timedelta(seconds=1)).to_numpy(float)
    gaps = pd.Series(np.diff(seconds, prepend=np.nan), index=values.index)
    spacing = gaps.rolling(SPACING_RUNS, min_periods=1).median()
    bucket_s = pd.Timedelta(pd.tseries.frequencies.to_offset(freq)) / pd.Timedelta(seconds=1)
    step = spacing.groupby(values.index.floor(freq)).median().reindex(hours)
    expected = (bucket_s / step).fillna(1.0)
    counts = values.notna().resample(freq).sum().reindex(hours, fill_value=0)
    need = np.maximum(1.0, min_coverage * expected.to_numpy())
    return counts.ge(need, axis=0)


def _pick(mae: dict[str, float], candidates: Sequence[str] = CANDIDATES) -> str:
    """Lowest validation MAE; anything but naive must beat naive by 1 % (noise guard)."""
    best, best_score = "naive", mae.get("naive", np.inf) * 0.99
    for name in candidates:
        score = mae.get(name, np.nan)
        if name != "naive" and np.isfinite(score) and score < best_score:
            best, best_score = name, score
    return best


def _horizon_label(hours: int) -> str:
    return f"{hours}h"


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
        "idle": _idle_or_error(held, windows_h, risk, nodes, max_nodes),
    }


def demand_section(
    panel: Panel | None, horizons_h: Sequence[int], candidates: Sequence[str] = CANDIDATES
) -> dict[str, Any]:
    """The demand part of the document: per series of the hourly panel and horizon, the
    forecast with its interval and held-back backtest (`history_hours`, `quantiles`,
    `baseline`, `candidates`, `origin`, `pools`). `candidates` must hold naive and the
    baseline; the service serves the cheap ones (`bench/service_candidates.py` measures why)."""
    hours = 0 if panel is None else len(panel.index)
    doc: dict[str, Any] = {
        "history_hours": hours,
        "quantiles": list(QUANTILES),
        "baseline": BASELINE,
        "candidates": list(candidates),
        "pools": [],
    }
    if panel is None:
        doc["origin"] = None
        return doc
    y, cap, times = as_arrays(panel.values, panel.capacity)
    within = within_arrays(panel.within, panel.values)  # as rolling_forecasts reads them
    last = len(y) - 1
    doc["origin"] = times[last].isoformat() + "Z"
    by_pool: dict[str, dict[str, Any]] = {
        s: {
            "pool": s,
            "capacity_gpus": _last_finite(cap[:, j]),
            "allocated_gpus": _last_finite(y[:, j]),
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
                        "horizon": _horizon_label(h),
                        "available": False,
                        "reason": f"needs {2 * MIN_HALF + h} complete hours of history, "
                        f"has {hours}",
                    }
                )
            continue
        half = len(origins) // 2
        fc = rolling_forecasts(panel, candidates, [h], QUANTILES, origins)
        fc["err"] = (fc["point"] - fc["actual"]).abs()
        select_until = times[origins[half]]
        # the pick is scored on the earlier half's origins whose target is observed at the first
        # held-back origin: a later target would let the hours after held-back origins choose
        # the model the held-back half scores at them (none: naive, the selection's default)
        scored = times[origins[:half][origins[:half] + h <= origins[half]]]
        for j, series in enumerate(panel.series):
            mine = fc[fc["series"] == series]
            early, late = mine[mine["origin"].isin(scored)], mine[mine["origin"] >= select_until]
            pick = _pick(early.groupby("model")["err"].mean().to_dict(), candidates)
            # scored, never chosen, on the held-back half: the pick, the baseline and naive
            shown = [(name, g) for name, g in late.groupby("model") if name in _scored(pick)]
            wape = {
                name: _ratio(M.wape(g["actual"].to_numpy(), g["point"].to_numpy()))
                for name, g in shown
            }
            covered = {name: _coverage(g) for name, g in shown}
            model = make(pick, QUANTILES).fit(y, cap, times, last, [h], within)
            at = np.array([last])
            point = model.predict(y, cap, times, at, h, within)[0, j]
            qs = model.predict_quantiles(y, cap, times, at, h, QUANTILES, within)
            errors = int(model.known_errors(h, y.shape[1])[j])
            by_pool[series]["horizons"].append(
                {
                    "horizon": _horizon_label(h),
                    "available": True,
                    "target": (times[last] + pd.Timedelta(hours=h)).isoformat() + "Z",
                    "model": pick,
                    "point_gpus": float(point),
                    "quantiles": {f"{q:g}": _finite(qs[q][0, j]) for q in QUANTILES},
                    "interval_reason": _interval_reason(errors),
                    "backtest": {
                        "selection_origins": len(scored),
                        "test_origins": int(len(origins) - half),
                        "wape_ratio": wape,
                        "coverage_ratio": {name: c[0] for name, c in covered.items()},
                        "coverage_origins": {name: c[1] for name, c in covered.items()},
                    },
                }
            )
    doc["pools"] = list(by_pool.values())
    return doc


def _scored(pick: str) -> tuple[str, ...]:
    """The models whose held-back WAPE and coverage are served: the pick, the baseline and
    naive (the pick must beat naive on the earlier half only, so the held-back half may show it
    losing to naive). Served, never used to choose: the pick stays the earlier half's."""
    return (pick, BASELINE, NAIVE)


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


def _finite(value: float) -> float | None:
    """A served number: None where it is NaN (e.g. an interval quantile without an interval)."""
    return float(value) if np.isfinite(value) else None


def _interval_reason(errors: int) -> str | None:
    """Why the served interval quantiles are null (None: they are not)."""
    if errors >= MIN_INTERVAL_ERRORS:
        return None
    return (
        f"no interval: the model has {errors} known errors at this horizon, an interval needs "
        f"{MIN_INTERVAL_ERRORS}; the median is the forecast plus the median of those it has"
    )


def _last_finite(column: np.ndarray) -> float | None:
    finite = column[np.isfinite(column)]
    return float(finite[-1]) if len(finite) else None


def _ratio(percent: float) -> float | None:
    """metrics.wape is in percent; the contract's unit is a ratio. NaN (no actuals) -> None."""
    return float(percent) / 100.0 if np.isfinite(percent) else None


# --------------------------------------------------------------------------- idle windows


def _label(ts: pd.Timestamp) -> str:
    return ts.isoformat() + "Z"


def idle_needs(window_h: int) -> int:
    """Complete hours of history a window needs: the rules' first `IDLE_FIRST_H` hours, a day of
    calibration origins, `IDLE_MIN_TEST` held-back origins, and W hours after each of both for
    their outcome."""
    return IDLE_FIRST_H + IDLE_MIN_CALIBRATION_H + IDLE_MIN_TEST + 2 * window_h


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
        head["error"] = _message(error)
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


def _idle_or_error(
    runs: RunsPanel | None,
    windows_h: Sequence[int],
    risk: float,
    nodes: Panel | None = None,
    max_nodes: int = IDLE_MAX_NODES,
) -> dict:
    """`idle_section`; a failure there is logged and reported in the section, so it does not
    take the demand forecast down with it."""
    try:
        return idle_section(runs, windows_h, risk, nodes, max_nodes)
    except Exception as error:
        log.exception("idle-window forecast failed")
        return {**_idle_head(windows_h, risk, max_nodes), "error": _message(error)}


def _message(error: BaseException) -> str:
    return one_line(error)


def _idle_head(
    windows_h: Sequence[int], risk: float, max_nodes: int = IDLE_MAX_NODES
) -> dict[str, Any]:
    return {
        "risk": float(risk),
        "windows": [_horizon_label(w) for w in sorted(set(windows_h))],
        "baseline": IDLE_BASELINE,
        "max_history_hours": IDLE_MAX_H,
        "history_hours": 0,
        "origin": None,
        "valid_from": None,
        "error": None,
        "pools": [],
        "node_history_hours": 0,
        "nodes_total": 0,
        "max_nodes": int(max_nodes),
        "node_error": None,
        "nodes": [],
    }


def node_panel(record: NodeHours | None) -> Panel | None:
    """Hourly panel of the history's per-node record (`History.node_hours()`): one column per node,
    values = the hour's peak held GPUs (`NodeRows`), capacity = its largest usable GPUs; complete
    hours only (the latest run's hour is left out), on a full hourly grid (hours without a run are
    NaN). A node's hour is masked (NaN value) when the hour is thin for the whole fleet, by the
    service's coverage rule on the hour's run times (`_covered`, as the pools' `RunsPanel`: a
    backfilled hour of one run is observed), or when fewer than `MIN_COVERAGE` of the hour's runs
    saw the node; its capacity stays wherever a run saw it (as for pools). Nodes no complete hour
    saw are left out. `meta["pools"]`: each node's pool. None: no complete hour."""
    if record is None or len(record.hours) < 2:
        return None
    done = len(record.hours) - 1  # the last hour is the latest run's: still running
    seen_any = record.seen[:done].sum(axis=0) > 0
    if not seen_any.any():
        return None
    hours = record.hours[:done]
    grid = np.arange(hours[0], hours[-1] + 1)
    index = pd.DatetimeIndex(pd.to_datetime(grid * 3600, unit="s"))
    run_times = record.run_times[: int(record.runs[:done].sum())]
    runs_at = pd.DatetimeIndex(pd.to_datetime(run_times, unit="s"))
    fleet = _covered(pd.DataFrame({"runs": 1.0}, index=runs_at), index)["runs"].to_numpy()
    rows = (hours - grid[0]).astype(int)
    columns = np.flatnonzero(seen_any)
    seen = np.zeros((len(grid), len(columns)), dtype=np.int64)
    held = np.full(seen.shape, np.nan)
    capacity = np.full(seen.shape, np.nan)
    seen[rows] = record.seen[:done][:, columns]
    held[rows] = np.round(record.peak_held[:done][:, columns].astype(float), 3)
    capacity[rows] = record.capacity[:done][:, columns]
    runs = np.zeros(len(grid), dtype=np.int64)
    runs[rows] = record.runs[:done]
    kept = fleet[:, None] & (seen > 0) & (seen >= MIN_COVERAGE * runs[:, None])
    names = [record.names[j] for j in columns.tolist()]
    return Panel(
        pd.DataFrame(np.where(kept, held, np.nan), index=index, columns=names),
        pd.DataFrame(np.where(seen > 0, capacity, np.nan), index=index, columns=names),
        "advisor-nodes",
        meta={"pools": {record.names[j]: record.pools[j] for j in columns.tolist()}},
    )


def idle_section(
    runs: RunsPanel | None,
    windows_h: Sequence[int],
    risk: float,
    nodes: Panel | None = None,
    max_nodes: int = IDLE_MAX_NODES,
) -> dict[str, Any]:
    """Per pool and window W: the GPUs `advisor.forecast.idle_windows` releases as free for the
    whole next W hours at `risk` (idle in an hour = capacity − the hour's peak held GPUs: a GPU
    with any share handed out is not idle), and how that release did on the history's own
    held-back hours (`advisor.forecast.idle.backtest`, the same method calibrated on the hours
    before them: its violation and capture ratios and those of `IDLE_BASELINE`).

    Both see the runs panel of the last `IDLE_MAX_H` complete hours, aggregated by its own
    coverage rule (`RunsPanel`). The release is decided at the end of the last complete hour
    (`origin`) and covers the W hours from `valid_from`. A window without `idle_needs(W)` hours,
    a pool whose last complete hour is masked (no release from older hours) and a pool with
    fewer than `IDLE_MIN_TEST` scored held-back hours get no release, with the reason.

    The same per node (`nodes`, `node_panel`; `_idle_series` serves both), with the per-series
    rules only (`IDLE_NODE_METHOD`) and for at most `max_nodes` nodes: those with the most GPUs
    idle in the last complete hour; the others are listed with the reason. A failure of the
    node part is reported in `node_error` and leaves the pools as they are.
    """
    doc = _idle_head(windows_h, risk, max_nodes)
    windows = sorted(set(int(w) for w in windows_h))
    if runs is not None:
        last_hour = runs.index[-1].floor("h")
        hours, times, doc["pools"] = _idle_series(
            runs.since(last_hour - pd.Timedelta(hours=IDLE_MAX_H - 1)), windows, risk, "pool"
        )
        doc.update(
            history_hours=hours,
            origin=_label(times[-1]),
            valid_from=_label(times[-1] + pd.Timedelta(hours=1)),
        )
    if nodes is not None:
        try:
            _node_idle(doc, nodes, windows, risk, max_nodes)
        except Exception as error:
            log.exception("per-node idle-window forecast failed")
            doc["nodes"], doc["node_error"] = [], _message(error)
    return doc


def _node_idle(
    doc: dict[str, Any], nodes: Panel, windows: list[int], risk: float, max_nodes: int
) -> None:
    """`idle_section`'s per-node part, into `doc`."""
    start = nodes.index[-1] - pd.Timedelta(hours=IDLE_MAX_H - 1)
    keep = nodes.index >= start
    nodes = Panel(nodes.values[keep], nodes.capacity[keep], nodes.name, meta=dict(nodes.meta))
    pools = nodes.meta.get("pools", {})
    times = nodes.index  # a full hourly grid already: its last row is the last complete hour
    now = np.maximum(nodes.capacity.to_numpy(float)[-1] - nodes.values.to_numpy(float)[-1], 0.0)
    names = nodes.series  # a new list per access: read once (1,000s of nodes)
    # the most GPUs idle now first (masked last), then by name: deterministic
    order = sorted(
        range(len(names)),
        key=lambda j: (not np.isfinite(now[j]), -np.nan_to_num(now[j]), names[j]),
    )
    chosen = sorted(order[: max(0, int(max_nodes))])
    entries: list[dict[str, Any]] = []
    if chosen:
        served = [names[j] for j in chosen]
        pool = _pool_nodes(nodes, _held_back_start(len(times), windows), int(max_nodes))
        computed = set(served) | set(pool)
        hours, _, entries = _idle_series(
            nodes.select([name for name in names if name in computed]),
            windows,
            risk,
            "node",
            IDLE_NODE_METHOD,
            pooled_over=pool,
            serve=served,
        )
    else:
        hours = len(times)
    left = sorted(set(range(len(names))) - set(chosen))
    reason = (
        f"not among the {int(max_nodes)} nodes with the most GPUs idle in the last complete "
        "hour (the per-node limit)"
    )
    cap = nodes.capacity.to_numpy(float)
    for j in left:
        entries.append(
            {
                "node": names[j],
                "capacity_gpus": _last_finite(cap[:, j]),
                "current_idle_gpus": _finite(now[j]),
                "windows": [
                    {"window": _horizon_label(w), "available": False, "reason": reason}
                    for w in windows
                ],
            }
        )
    rank = {name: i for i, name in enumerate(names[j] for j in order)}
    doc["nodes"] = [
        {"node": e["node"], "pool": str(pools.get(e["node"], "")), **e}
        for e in sorted(entries, key=lambda e: rank[e["node"]])
    ]
    doc.update(node_history_hours=hours, nodes_total=len(names))
    if doc["origin"] is None:
        doc.update(origin=_label(times[-1]), valid_from=_label(times[-1] + pd.Timedelta(hours=1)))


def _held_back_start(hours: int, windows: Sequence[int]) -> int:
    """The first held-back origin of `_idle_series`' backtest on `hours` complete hours (`hours`
    where no window has enough of them: nothing is held back)."""
    ready = [w for w in windows if hours >= idle_needs(w)]
    if not ready:
        return hours
    widest = max(ready)
    return max(IDLE_FIRST_H + IDLE_MIN_CALIBRATION_H + widest, hours - widest - IDLE_TEST_H)


def _pool_nodes(nodes: Panel, before: int, limit: int) -> list[str]:
    """The nodes the per-node rules' pooled model and margin learn from: those with a reading
    in the first `before` hours (before the held-back part), at most `limit` of them, picked by
    a hash of the name. Neither depends on an hour after a held-back origin, as the served nodes
    (the most idle now) do; on a fleet of at most `limit` nodes that all have such a reading they
    are the served nodes, and the releases are those of a pool of all nodes."""
    seen = np.isfinite(nodes.values.to_numpy(float)[:before]).any(axis=0)
    names = [name for name, s in zip(nodes.series, seen, strict=True) if s]
    if len(names) <= limit:
        return names

    def by_hash(name: str) -> tuple[bytes, str]:
        return hashlib.blake2b(name.encode(), digest_size=8).digest(), name

    return sorted(names, key=by_hash)[:limit]


def _idle_series(
    panel: Panel,
    windows: list[int],
    risk: float,
    kind: str,
    method: str = "auto",
    pooled_over: Sequence[str] | None = None,
    serve: Sequence[str] | None = None,
) -> tuple[int, pd.DatetimeIndex, list[dict[str, Any]]]:
    """Per series (a pool or a node: `kind`) of an idle panel and window: the release and its
    held-back backtest, as `idle_section` serves them. `method` and `pooled_over`:
    `idle_windows`' and `backtest`'s ("auto": theirs; "rules": the per-series rules only).
    `serve`: the series to return (None: all); the others only feed the pooled model. Returns
    (complete hours seen, their times, one entry per served series)."""
    idle, cap, times = I.hourly_idle(panel)
    hours, last = len(times), len(times) - 1
    ready = [w for w in windows if hours >= idle_needs(w)]
    released: dict[tuple[str, int], dict[str, Any]] = {}
    scores: dict[tuple[str, int, str], dict[str, float]] = {}
    counts: dict[tuple[str, int], int] = {}
    test_from = None
    if ready:
        for row in idle_windows(panel, ready, risk, method, pooled_over).to_dict("records"):
            released[(row["series"], int(row["window_h"]))] = row
        start = _held_back_start(hours, windows)
        test_from = times[start]
        decisions: dict[int, pd.DataFrame] = {}
        table = I.backtest(
            panel,
            ready,
            risk,
            test_from=test_from,
            test_to=times[last] + pd.Timedelta(hours=1),
            releases=decisions,
            method=method,
            pooled_over=pooled_over,
        )
        for row in table.to_dict("records"):
            if row["model"] in ("advisor", IDLE_BASELINE):
                scores[(row["series"], int(row["window_h"]), row["model"])] = row
        for w, frame in decisions.items():
            # a series without capacity is left out of the backtest: it releases 0
            frame = frame.reindex(columns=panel.series, fill_value=0.0)
            truth = I.window_min(idle, w)[times.get_indexer(frame.index)]
            scored = np.isfinite(truth) & np.isfinite(frame.to_numpy(float))
            for j, series in enumerate(frame.columns):
                counts[(str(series), int(w))] = int(scored[:, j].sum())
    entries = []
    wanted = None if serve is None else set(serve)
    for j, series in enumerate(panel.series):
        if wanted is not None and series not in wanted:
            continue
        entry: dict[str, Any] = {
            kind: series,
            "capacity_gpus": _last_finite(cap[:, j]),
            "current_idle_gpus": _finite(idle[last, j]),
            "windows": [],
        }
        for w in windows:
            entry["windows"].append(
                {
                    "window": _horizon_label(w),
                    **_idle_window(
                        series,
                        w,
                        hours,
                        idle[last, j],
                        released,
                        scores,
                        counts,
                        test_from,
                        kind,
                    ),
                }
            )
        entries.append(entry)
    return hours, times, entries


def _idle_window(
    series, w, hours, idle_now, released, scores, counts, test_from, kind="pool"
) -> dict[str, Any]:
    def absent(reason: str) -> dict[str, Any]:
        return {"available": False, "reason": reason}

    if hours < idle_needs(w):
        return absent(f"needs {idle_needs(w)} complete hours of history, has {hours}")
    if not np.isfinite(idle_now):
        return absent(
            f"the last complete hour has too few runs for this {kind} (source gap or new "
            f"{kind}): no release from older hours"
        )
    n = counts.get((series, w), 0)
    if n < IDLE_MIN_TEST:
        return absent(f"{n} held-back hours with an observed outcome, needs {IDLE_MIN_TEST}")
    row = released.get((series, w))
    if row is None or not np.isfinite(row["release"]):
        return absent(f"no release: the {kind}'s capacity or allocation is unknown")
    models = ("advisor", IDLE_BASELINE)
    if row["rule"] == "no_capacity":  # no usable GPU in the history: releases 0, never wrong
        method = "no_capacity"
        violation: dict[str, float | None] = dict.fromkeys(models, 0.0)
        capture: dict[str, float | None] = dict.fromkeys(models)
    else:
        mine = {m: scores.get((series, w, m), {}) for m in models}
        method = str(mine["advisor"].get("params", ""))
        violation = {m: _ratio(r.get("violation_rate", np.nan)) for m, r in mine.items()}
        capture = {m: _ratio(r.get("capture", np.nan)) for m, r in mine.items()}
    return {
        "available": True,
        "until": _label(pd.Timestamp(row["as_of"]) + pd.Timedelta(hours=1 + w)),
        "release_gpus": float(row["release"]),
        "rule": str(row["rule"]),
        "backtest": {
            "test_from": _label(test_from),
            "test_origins": n,
            "method": method,
            "violation_ratio": violation,
            "capture_ratio": capture,
        },
    }
