"""The advisor service's metric-name contract (`gpu-defrag advise` serves these on /metrics).

Same shape as the exporter's contract, so dashboards and alert rules are linted against
both tables. Shapes are named `fractional`, `1`, `2`, `4`, `8` (GPUs on one node) and `KxG`
(K nodes × G GPUs within one rack, e.g. `8x8`).
"""

from __future__ import annotations

from exporter.contract import MetricSpec


def _g(name: str, help_: str, labels: tuple[str, ...] = ()) -> MetricSpec:
    return MetricSpec(name, "gauge", help_, labels)


def _c(name: str, help_: str, labels: tuple[str, ...] = ()) -> MetricSpec:
    return MetricSpec(name, "counter", help_, labels)


def _i(name: str, help_: str, labels: tuple[str, ...]) -> MetricSpec:
    return MetricSpec(name, "info", help_, labels)


ADVISOR_METRICS: tuple[MetricSpec, ...] = (
    # --- fragmentation (spatial) ---
    _g(
        "gpu_advisor_fragmentation_ratio",
        "FGD fragmentation rate: share of free GPU capacity the arriving workload cannot use.",
        ("pool",),
    ),
    _g(
        "gpu_advisor_fragmented_gpus",
        "FGD fragment amount: expected free GPUs the arriving workload cannot use.",
        ("pool",),
    ),
    _g(
        "gpu_advisor_free_gpus",
        "Usable GPUs with no allocation, not in MIG mode: whole GPUs a job can take.",
        ("pool",),
    ),
    _g("gpu_advisor_gpus", "Healthy GPUs.", ("pool",)),
    _g(
        "gpu_advisor_allocated_gpus",
        "GPU share allocated in the pool (milli-GPU handed out / 1000 over every GPU of the "
        "pool): the quantity the demand forecast forecasts.",
        ("pool",),
    ),
    _g("gpu_advisor_shape_gpus", "GPUs one job of this shape needs.", ("shape",)),
    _g(
        "gpu_advisor_schedulable_jobs",
        "How many jobs of this shape could start now in this pool without moving anything "
        "(sum by shape: the fleet).",
        ("pool", "shape"),
    ),
    _g(
        "gpu_advisor_stranded_gpus",
        "Free GPUs of the pool that no job of this shape can use (on nodes with too few free "
        "GPUs).",
        ("pool", "shape"),
    ),
    _g("gpu_advisor_largest_schedulable_job_gpus", "Largest single-node job that fits now."),
    # --- what a scheduler source adds: unknown racks, the queue, why shapes cannot start ---
    _g(
        "gpu_advisor_nodes_rack_unknown",
        "Nodes of the pool whose rack no source knows: multi-node shapes count only known racks "
        "there (gpu_advisor_schedulable_jobs), and their count is unknown, not 0.",
        ("pool",),
    ),
    _g(
        "gpu_advisor_schedulable_jobs_if_racks_allow",
        "Jobs of this multi-node shape that could start now in the pool if its nodes of unknown "
        "rack shared a rack: the most the unknown racks could allow (present only where they "
        "decide the count).",
        ("pool", "shape"),
    ),
    _g(
        "gpu_advisor_shape_unschedulable",
        "Free GPUs of the pool with the most, when no job of this shape can start although they "
        "are enough for one, by cause: rack_unknown (no source knows the racks of the nodes "
        "with free GPUs), scattered (no node or rack has room), quota (waiting jobs of this "
        "shape fit the free GPUs but not their tenant's quota); 0 where that cause does not "
        "block the shape.",
        ("shape", "cause"),
    ),
    _g(
        "gpu_advisor_pending_jobs",
        "Jobs waiting in the scheduler's queue (pending pods, waiting Kueue workloads, pending "
        "Slurm jobs) that ask for GPUs, by tenant.",
        ("tenant",),
    ),
    _g("gpu_advisor_pending_gpus", "GPUs the waiting jobs ask for, by tenant.", ("tenant",)),
    _g(
        "gpu_advisor_scheduler_stale",
        "1 while the scheduler's view is the last good one because its watch is down (the "
        "figures are from before it dropped), else 0.",
        ("source",),
    ),
    _g(
        "gpu_advisor_node_fragmented_gpus",
        "Per-node FGD fragment amount: free GPUs the arriving workload cannot use (heatmaps).",
        ("node", "pool"),
    ),
    _g(
        "gpu_advisor_gpu_state",
        "GPU state for heatmaps: 0 free, 1 allocated and busy, 2 allocated but idle, 3 unhealthy, "
        "4 MIG mode with nothing allocated (room for MIG instances, not a free whole GPU), "
        "5 in use with its owner unknown (busy or holding memory, no allocation names it).",
        ("node", "gpu", "pool"),
    ),
    # --- temporal, type and memory fragmentation ---
    _g(
        "gpu_advisor_allocated_idle_gpus",
        "Allocated GPUs idle for the whole idle window.",
        ("pool",),
    ),
    _g(
        "gpu_advisor_owner_unknown_gpus",
        "GPUs in use (busy, holding memory or running processes) that no allocation or process "
        "owner names: allocated capacity, never free, its owner unknown.",
        ("pool",),
    ),
    _g(
        "gpu_advisor_allocated_idle_power_watts",
        "Power drawn by allocated-but-idle GPUs (wasted energy rate).",
        ("pool",),
    ),
    _g(
        "gpu_advisor_idle_capacity_gpus",
        "Free GPU capacity plus the share held on allocated-idle GPUs, by GPU model (type "
        "fragmentation: idle supply).",
        ("model",),
    ),
    _g(
        "gpu_advisor_demand_gpus",
        "GPUs requested by running and queued work by GPU model (type fragmentation: demand).",
        ("model",),
    ),
    _g(
        "gpu_advisor_stranded_memory_bytes",
        "Free GPU memory that no typical request fits (memory fragmentation).",
        ("pool",),
    ),
    # --- forecast ---
    _g(
        "gpu_advisor_forecast_demand_gpus",
        "Forecast allocated GPUs at the horizon, per quantile.",
        ("pool", "horizon", "forecast_quantile"),
    ),
    _g(
        "gpu_advisor_forecast_capacity_gpus",
        "Known GPU capacity of the pool (a MIG GPU counts the share its instances carve).",
        ("pool",),
    ),
    _i(
        "gpu_advisor_forecast_model_info",
        "The model serving the pool's forecast at the horizon (picked on the earlier half of "
        "the backtest); value is always 1.",
        ("pool", "horizon", "model"),
    ),
    _g(
        "gpu_advisor_forecast_backtest_origins",
        "Held-back hourly origins behind the backtest ratios of the pool and horizon (their "
        "sample size).",
        ("pool", "horizon"),
    ),
    _g(
        "gpu_advisor_forecast_backtest_wape_ratio",
        "Backtest WAPE of the chosen model, of the seasonal-naive baseline and of naive.",
        ("pool", "horizon", "model"),
    ),
    _g(
        "gpu_advisor_forecast_backtest_coverage_ratio",
        "Share of held-back hours at or below the forecast quantile (nominal: the quantile), "
        "for the chosen model, the seasonal-naive baseline and naive (absent over too few "
        "held-back hours with an interval).",
        ("pool", "horizon", "model", "forecast_quantile"),
    ),
    _g(
        "gpu_advisor_forecast_backtest_coverage_origins",
        "Held-back hours with an observed actual and a real interval behind the model's coverage "
        "ratio (its sample size; can be fewer than the backtest origins).",
        ("pool", "horizon", "model"),
    ),
    _g(
        "gpu_advisor_forecast_tenant_demand_gpus",
        "Forecast GPUs held by the tenant's running allocations at the horizon, per quantile "
        "(the tenants holding the most GPUs, --forecast.max-tenants).",
        ("tenant", "horizon", "forecast_quantile"),
    ),
    _g(
        "gpu_advisor_forecast_tenant_quota_gpus",
        "The tenant's GPU quota over all models (--policy), beside its demand forecast.",
        ("tenant",),
    ),
    _g(
        "gpu_advisor_forecast_tenant_backtest_wape_ratio",
        "Backtest WAPE of the tenant's chosen model, of the seasonal-naive baseline and of naive.",
        ("tenant", "horizon", "model"),
    ),
    _g(
        "gpu_advisor_forecast_tenant_backtest_coverage_ratio",
        "Share of the tenant's held-back hours at or below the forecast quantile (nominal: the "
        "quantile), for the chosen model, the seasonal-naive baseline and naive (absent over too "
        "few held-back hours with an interval).",
        ("tenant", "horizon", "model", "forecast_quantile"),
    ),
    _g(
        "gpu_advisor_forecast_tenant_backtest_coverage_origins",
        "Held-back hours with an observed actual and a real interval behind the tenant model's "
        "coverage ratio.",
        ("tenant", "horizon", "model"),
    ),
    _g(
        "gpu_advisor_forecast_idle_gpus",
        "GPUs forecast to stay wholly free (nothing allocated on them) for the whole next "
        "window, released at the service's risk (risk in /api/forecast); shown only with its "
        "backtest.",
        ("pool", "window"),
    ),
    _g(
        "gpu_advisor_forecast_idle_backtest_violation_ratio",
        "Held-back share of hours in which the idle-window release exceeded the GPUs that "
        "stayed free, for the advisor and the past-window-minimum baseline.",
        ("pool", "window", "model"),
    ),
    _g(
        "gpu_advisor_forecast_idle_backtest_capture_ratio",
        "Held-back share of the GPUs that stayed free that the idle-window release captured, "
        "for the advisor and the past-window-minimum baseline.",
        ("pool", "window", "model"),
    ),
    # --- recommendations ---
    _g("gpu_advisor_recommended_actions", "Recommended actions by kind.", ("kind",)),
    _i(
        "gpu_advisor_action_info",
        "Top recommended actions (bounded to the top N); `goal` names the plan an action belongs "
        "to (actions of different goals are alternatives, not steps of one plan); value is "
        "always 1.",
        ("rank", "goal", "kind", "workload", "tenant", "source", "target", "summary"),
    ),
    _g(
        "gpu_advisor_action_cost_gpu_seconds",
        "GPU-seconds an action costs: work lost to restarts plus GPUs a reservation holds idle.",
        ("rank",),
    ),
    _g(
        "gpu_advisor_action_benefit_gpus",
        "GPU share an action makes usable (its plan's actions add up to the plan's benefit).",
        ("rank",),
    ),
    _g(
        "gpu_advisor_job_end_finished_jobs",
        "Finished jobs the advisor has seen and learned durations from (bounded record).",
        (),
    ),
    _g(
        "gpu_advisor_job_end_running_jobs",
        "Running jobs by where the planner's expected end comes from: learned (from finished "
        "jobs like it) or fallback (known end times or the duration prior).",
        ("basis",),
    ),
    # --- advisor self-metrics ---
    _i("gpu_advisor_build_info", "Advisor build; value is always 1.", ("version",)),
    _g("gpu_advisor_source_up", "1 if the last ingest from the source worked.", ("source",)),
    _g(
        "gpu_advisor_source_left_out_targets",
        "GPU exporters the source knows but could not read (down, or their backend down) when "
        "the served fleet was read: their nodes are in no figure. 0 for a whole fleet.",
        ("source",),
    ),
    _g(
        "gpu_advisor_last_success_timestamp_seconds",
        "Unix time of the last complete advisor run.",
    ),
    _g("gpu_advisor_run_duration_seconds", "Wall time of the last advisor run."),
    _c("gpu_advisor_runs_total", "Advisor runs."),
    _c("gpu_advisor_run_errors_total", "Failed advisor runs, by stage.", ("stage",)),
)

ADVISOR_BY_NAME: dict[str, MetricSpec] = {spec.name: spec for spec in ADVISOR_METRICS}

# 4: a usable MIG-mode GPU with nothing allocated: room for MIG instances, not a free whole GPU
# 5: in use (busy, holding memory or running processes) by a holder no source names
GPU_STATE_CODES: dict[str, int] = {
    "free": 0,
    "busy": 1,
    "allocated_idle": 2,
    "unhealthy": 3,
    "mig_free": 4,
    "owner_unknown": 5,
}
