"""Run state → the advisor contract's metric families (`advisor.contract.ADVISOR_METRICS`).

Pure: `families(state, top_actions)` builds the samples and `render_page` the text with the
exporter's renderer, so the page is byte-identical to what prometheus_client would write.
Series that cannot be known are left out, never written as zero: without a good run there
are no fragmentation series, a pool/horizon (or idle window) without a backtested forecast has no
forecast series (nor an interval quantile without an interval, nor a coverage over too few
held-back hours), and idle power is absent for a pool whose idle GPUs have no power reading.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from advisor.contract import ADVISOR_BY_NAME
from advisor.results import STAGES, pool_names
from gpu_defrag_common import __version__
from gpu_defrag_common.exposition import Families

if TYPE_CHECKING:
    from advisor.pipeline import RunState
    from advisor.service.loop import Config


def _add(families: Families, name: str, labels: tuple[str, ...], value: float | None) -> None:
    """One sample; none where the value is unknown (None or NaN: e.g. an interval quantile
    without an interval, a coverage over too few held-back hours)."""
    if value is not None and not math.isnan(float(value)):
        families.add_spec(ADVISOR_BY_NAME[name], labels, float(value))


def _fragmentation(families: Families, state: RunState) -> None:
    results = state.results
    if results is None:
        return
    for row in results.pools:
        pool = (row["pool"],)
        _add(families, "gpu_advisor_fragmentation_ratio", pool, row["fragmentation_ratio"])
        _add(families, "gpu_advisor_fragmented_gpus", pool, row["fragmented_gpus"])
        _add(families, "gpu_advisor_free_gpus", pool, row["free_gpus"])
        _add(families, "gpu_advisor_gpus", pool, row["healthy_gpus"])
        _add(families, "gpu_advisor_allocated_gpus", pool, row["allocated_gpus"])
    for row in results.shapes:
        _add(families, "gpu_advisor_shape_gpus", (row["shape"],), row["gpus_per_job"])
    for row in results.pool_shapes:
        labels = (row["pool"], row["shape"])
        _add(families, "gpu_advisor_schedulable_jobs", labels, row["schedulable_jobs"])
        _add(families, "gpu_advisor_stranded_gpus", labels, row["stranded_gpus"])
    largest = results.analysis["spatial"]["largest_job"]["single_node_gpus"]
    _add(families, "gpu_advisor_largest_schedulable_job_gpus", (), largest)
    model = results.model
    nodes = results.analysis["nodes"]
    pools = [str(p) for p in pool_names(model).tolist()]
    names = model.nodes.name.tolist()
    for i, (node, pool) in enumerate(zip(names, pools, strict=True)):
        _add(
            families,
            "gpu_advisor_node_fragmented_gpus",
            (node, pool),
            nodes["fgd_fragment_gpus"][i],
        )
    spec = ADVISOR_BY_NAME["gpu_advisor_gpu_state"]
    for node_row, index, code in zip(
        model.gpus.node.tolist(),
        model.gpus.index.tolist(),
        results.gpu_states.tolist(),
        strict=True,
    ):
        families.add_spec(spec, (names[node_row], str(index), pools[node_row]), code)
    for row in results.pools:
        pool = (row["pool"],)
        _add(families, "gpu_advisor_allocated_idle_gpus", pool, row["allocated_idle_gpus"])
        _add(families, "gpu_advisor_owner_unknown_gpus", pool, row["owner_unknown_gpus"])
        _add(
            families,
            "gpu_advisor_allocated_idle_power_watts",
            pool,
            row["allocated_idle_power_watts"],
        )
    for row in results.gpu_models:
        _add(
            families,
            "gpu_advisor_idle_capacity_gpus",
            (row["gpu_model"],),
            row["idle_capacity_gpus"],
        )
        _add(families, "gpu_advisor_demand_gpus", (row["gpu_model"],), row["demand_gpus"])
    for row in results.pools:
        _add(
            families,
            "gpu_advisor_stranded_memory_bytes",
            (row["pool"],),
            row["stranded_memory_bytes"],
        )


def _forecast(families: Families, state: RunState) -> None:
    results = state.results
    if results is None:
        return
    pools = results.forecast.get("pools", [])
    shown = [(pool["pool"], h) for pool in pools for h in pool["horizons"] if h.get("available")]
    _quantiles(families, "gpu_advisor_forecast_demand_gpus", shown)
    for entry in pools:
        _add(
            families, "gpu_advisor_forecast_capacity_gpus", (entry["pool"],), entry["capacity_gpus"]
        )
    for pool, h in shown:
        _add(families, "gpu_advisor_forecast_model_info", (pool, h["horizon"], h["model"]), 1.0)
    for pool, h in shown:
        _add(
            families,
            "gpu_advisor_forecast_backtest_origins",
            (pool, h["horizon"]),
            h["backtest"]["test_origins"],
        )
    _wapes(families, "gpu_advisor_forecast_backtest_wape_ratio", shown)
    _coverages(families, "gpu_advisor_forecast_backtest_coverage", shown)
    _tenants(families, results.forecast.get("tenants") or {})
    _idle(families, results.forecast.get("idle") or {})


def _tenants(families: Families, section: dict) -> None:
    """Per-tenant demand forecasts and their held-back WAPE; only backtested horizons."""
    shown = [
        (entry["tenant"], h)
        for entry in section.get("tenants", [])
        for h in entry["horizons"]
        if h.get("available")
    ]
    _quantiles(families, "gpu_advisor_forecast_tenant_demand_gpus", shown)
    for entry in section.get("tenants", []):
        if any(h.get("available") for h in entry["horizons"]):
            _add(
                families,
                "gpu_advisor_forecast_tenant_quota_gpus",
                (entry["tenant"],),
                entry.get("quota_gpus"),
            )
    _wapes(families, "gpu_advisor_forecast_tenant_backtest_wape_ratio", shown)
    _coverages(families, "gpu_advisor_forecast_tenant_backtest_coverage", shown)


def _quantiles(families: Families, name: str, shown: list[tuple[str, dict]]) -> None:
    """Each (series, available horizon)'s forecast per quantile."""
    for series, h in shown:
        for quantile, value in h["quantiles"].items():
            _add(families, name, (series, h["horizon"], quantile), value)


def _wapes(families: Families, name: str, shown: list[tuple[str, dict]]) -> None:
    """Each (series, available horizon)'s held-back WAPE per model (pick, baseline, naive)."""
    for series, h in shown:
        for model_name, wape in h["backtest"]["wape_ratio"].items():
            _add(families, name, (series, h["horizon"], model_name), wape)


def _coverages(families: Families, prefix: str, shown: list[tuple[str, dict]]) -> None:
    """Each (series, available horizon)'s held-back interval coverage per model and quantile
    (`prefix`_ratio) and the hours it was measured on (`prefix`_origins): an alert on the
    ratio needs the count of hours that had an interval, not of all held-back hours."""
    for series, h in shown:
        backtest = h["backtest"]
        for model_name, shares in backtest.get("coverage_ratio", {}).items():
            for quantile, share in shares.items():
                _add(
                    families, f"{prefix}_ratio", (series, h["horizon"], model_name, quantile), share
                )
        for model_name, count in backtest.get("coverage_origins", {}).items():
            _add(families, f"{prefix}_origins", (series, h["horizon"], model_name), count)


def _idle(families: Families, idle: dict) -> None:
    """Idle-window releases and their held-back scores; only windows with a backtest."""
    shown = [
        (pool["pool"], w)
        for pool in idle.get("pools", [])
        for w in pool["windows"]
        if w.get("available")
    ]
    for pool, w in shown:
        _add(families, "gpu_advisor_forecast_idle_gpus", (pool, w["window"]), w["release_gpus"])
    for name, key in (
        ("gpu_advisor_forecast_idle_backtest_violation_ratio", "violation_ratio"),
        ("gpu_advisor_forecast_idle_backtest_capture_ratio", "capture_ratio"),
    ):
        for pool, w in shown:
            for model_name, value in w["backtest"][key].items():
                _add(families, name, (pool, w["window"], model_name), value)


def _recommendations(families: Families, state: RunState, top_actions: int) -> None:
    results = state.results
    if results is None or "by_kind" not in results.recommendations:
        return
    recs = results.recommendations
    for kind, count in recs["by_kind"].items():
        _add(families, "gpu_advisor_recommended_actions", (kind,), count)
    top = recs["actions"][: max(0, top_actions)]
    info = ADVISOR_BY_NAME["gpu_advisor_action_info"]
    for row in top:
        labels = (
            str(row["rank"]),
            row["goal"],
            row["kind"],
            row["job"],
            row["tenant"],
            row["source"],
            row["target"],
            row["summary"],
        )
        families.add_spec(info, labels, 1.0)
    for row in top:
        _add(
            families,
            "gpu_advisor_action_cost_gpu_seconds",
            (str(row["rank"]),),
            # work lost plus GPUs held idle (a reservation's cost), in seconds, the base unit
            (row["cost_gpu_hours"] + row["cost_idle_gpu_hours"]) * 3600.0,
        )
    for row in top:
        _add(families, "gpu_advisor_action_benefit_gpus", (str(row["rank"]),), row["benefit_gpus"])
    ends = recs.get("job_ends")
    if ends:
        _add(families, "gpu_advisor_job_end_finished_jobs", (), ends["finished_jobs"])
        learned = ends["predicted_jobs"]
        _add(families, "gpu_advisor_job_end_running_jobs", ("learned",), learned)
        _add(
            families,
            "gpu_advisor_job_end_running_jobs",
            ("fallback",),
            ends["running_jobs"] - learned,
        )


def _self(families: Families, state: RunState) -> None:
    _add(families, "gpu_advisor_build_info", (__version__,), 1.0)
    _add(families, "gpu_advisor_source_up", (state.source,), 1.0 if state.source_up else 0.0)
    if state.results is not None:
        left_out = len(state.results.model.left_out)
        _add(families, "gpu_advisor_source_left_out_targets", (state.source,), left_out)
    _add(families, "gpu_advisor_last_success_timestamp_seconds", (), state.last_success_ts)
    _add(families, "gpu_advisor_run_duration_seconds", (), state.last_duration_s)
    _add(families, "gpu_advisor_runs_total", (), state.runs)
    for stage in STAGES:
        _add(families, "gpu_advisor_run_errors_total", (stage,), state.errors.get(stage, 0))


def _scheduler(families: Families, state: RunState) -> None:
    """Unknown racks, the queue and why shapes cannot start (`advisor.pipeline.scheduler`)."""
    from advisor.pipeline.scheduler import pending_by_tenant, unschedulable_series

    results = state.results
    if results is None or not results.scheduler:
        return
    doc = results.scheduler
    for pool, count in doc["nodes_rack_unknown"].items():
        _add(families, "gpu_advisor_nodes_rack_unknown", (pool,), count)
    for row in doc["if_racks_allow"]:
        _add(
            families,
            "gpu_advisor_schedulable_jobs_if_racks_allow",
            (row["pool"], row["shape"]),
            row["jobs_if_racks_allow"],
        )
    for shape, cause, free in unschedulable_series(doc):
        _add(families, "gpu_advisor_shape_unschedulable", (shape, cause), free)
    if doc["kind"] is not None:
        for tenant, (jobs, gpus) in sorted(pending_by_tenant(doc).items()):
            _add(families, "gpu_advisor_pending_jobs", (tenant,), jobs)
            _add(families, "gpu_advisor_pending_gpus", (tenant,), gpus)
        _add(families, "gpu_advisor_scheduler_stale", (state.source,), 1.0 if doc["stale"] else 0.0)


def families(state: RunState, top_actions: int = 10) -> Families:
    """Every advisor series for one run state, in contract order within each section."""
    out = Families(ADVISOR_BY_NAME)
    _fragmentation(out, state)
    _scheduler(out, state)
    _forecast(out, state)
    _recommendations(out, state, top_actions)
    _self(out, state)
    return out


def render_page(state: RunState, config: Config) -> bytes:
    return families(state, config.top_actions).text().encode()
