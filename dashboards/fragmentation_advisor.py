"""GPU fragmentation and advisor (gpu-fragmentation-advisor.json): the advisor's measures,
forecasts against what happened, and its recommendations.
"""

from __future__ import annotations

from advisor.contract import GPU_STATE_CODES
from dashboards.grafana import (
    BLUE,
    GREEN,
    ORANGE,
    RED,
    YELLOW,
    Panel,
    Row,
    bargauge,
    dashboard,
    dashboard_links,
    heatmap_rows,
    matrix,
    organize,
    query_variable,
    stat,
    state_timeline,
    steps,
    table,
    target,
    targets,
    timeseries,
    value_mappings,
)
from dashboards.selectors import (
    ADV,
    ADV_POOL,
    HIDE,
    TAG,
    advisor_variable,
)

STATE_COLORS = {
    "free": GREEN,
    "busy": BLUE,
    "allocated_idle": ORANGE,
    "unhealthy": RED,
    "mig_free": "light-green",  # room for MIG instances only, not a free whole GPU
    "owner_unknown": "#808080",  # grey: in use, nobody known to hold it
}
STATE_TEXT = {
    "free": "free",
    "busy": "busy",
    "allocated_idle": "allocated, idle",
    "unhealthy": "unhealthy",
    "mig_free": "MIG, free instances",
    "owner_unknown": "in use, owner unknown",
}


def wape_bargauge(title: str, description: str, selector: str, series: str, w: int) -> Panel:
    """Held-back WAPE per series (`series` label), horizon and model at $horizon; `selector`
    is the metric and its matchers up to the horizon's. Pools and tenants share the colours."""
    return bargauge(
        title,
        description,
        [
            target(
                selector + ', horizon=~"$horizon"}',
                f"{{{{{series}}}}} {{{{horizon}}}} {{{{model}}}}",
                instant=True,
            )
        ],
        "percentunit",
        thresholds=steps((0.2, YELLOW), (0.4, RED)),
        min=0,
        w=w,
        h=9,
    )


# Forecast vs actual: the horizons drawn (hours; the advisor's --forecast.horizons default is
# 1h,6h,24h) and the quantiles of each (lower, median, upper of the served interval).
FORECAST_VS_ACTUAL_HORIZONS = (1, 24)
FORECAST_QUANTILES = (("0.1", "q0.1"), ("0.5", "median"), ("0.9", "q0.9"))


def forecast_offset_hours(horizon_h: int) -> int:
    """How far back a forecast at `horizon_h` was served when the hour it forecasts is running.

    The advisor recomputes its forecasts once an hour, at its first run after an hour completes:
    the origin is that last complete hour [t, t+1h) (hours labelled by their start) and the
    forecast at horizon h is the mean allocated GPUs of the hour starting at t + h. It is served
    from t+1h until the next hour completes, so the value served during an hour is for the hour
    starting h - 1 hours later (h = 1: the hour now running). `offset (h - 1)h` draws it there.
    """
    return horizon_h - 1


def forecast_at_target(horizon_h: int, quantile: str) -> str:
    """The selected pools' forecast at a horizon and quantile, drawn in the hour it is for."""
    shift = forecast_offset_hours(horizon_h)
    return (
        f'gpu_advisor_forecast_demand_gpus{{{ADV_POOL}, horizon="{horizon_h}h", '
        f'forecast_quantile="{quantile}"}}' + (f" offset {shift}h" if shift else "")
    )


def allocated_gpus_now() -> str:
    """Per advisor job and pool, as the forecasts: the allocated GPU share the forecast is of
    (a GPU count would be higher on shared GPUs: on the mixed sim, 7 MIG GPUs hold 5.14)."""
    return f"sum by (job, pool) (gpu_advisor_allocated_gpus{{{ADV_POOL}}})"


def forecast_vs_actual(**kw) -> Panel:
    horizons = " and ".join(f"{h} h" for h in FORECAST_VS_ACTUAL_HORIZONS)
    return timeseries(
        "Forecast vs actual demand",
        f"Per pool, the allocated GPUs (actual) against the advisor's forecasts for the same "
        f"hour at horizons {horizons}: median and its q0.1 to q0.9 interval, and capacity "
        "(alert GpuForecastDemandExceedsCapacity). The advisor forecasts once an hour, from the "
        "last complete hour, the mean allocated GPUs of the hour starting h hours after that "
        "hour started (h = 1: the hour now running); each forecast is drawn in the hour it is "
        "for (offset h - 1 hours), so the gap to the actual is its error. The 24 h lines need "
        "23 h of advisor data in Prometheus. Forecast and actual are the GPU share allocated "
        "(milli-GPU / 1000 over all the pool's GPUs; the forecast is clipped to capacity), so "
        "a shared GPU counts its allocated part only; the actual is each run's value, the "
        "forecast an hour's mean.",
        targets(
            (allocated_gpus_now(), "{{pool}} allocated (actual)"),
            *(
                (forecast_at_target(h, q), f"{{{{pool}}}} {h}h forecast {name}")
                for h in FORECAST_VS_ACTUAL_HORIZONS
                for q, name in FORECAST_QUANTILES
            ),
            (f"gpu_advisor_forecast_capacity_gpus{{{ADV_POOL}}}", "{{pool}} capacity"),
        ),
        "none",
        fill=0,
        **kw,
    )


def build(config: dict) -> dict:
    d, t = config["dashboards"], config["thresholds"]
    states = {
        code: (STATE_TEXT[name], STATE_COLORS[name]) for name, code in GPU_STATE_CODES.items()
    }
    state_thresholds = steps(
        *(
            (code, STATE_COLORS[name])
            for name, code in sorted(GPU_STATE_CODES.items(), key=lambda i: i[1])
            if code
        ),
        base=STATE_COLORS["free"],
    )
    frag = steps((t["fragmentation_ratio"], RED))
    rows = [
        Row(
            "Fragmentation now",
            [
                stat(
                    "Fragmentation rate",
                    "FGD fragmentation rate: share of free GPUs the arriving workload cannot use "
                    f"(alert GpuFragmentationHigh above {t['fragmentation_ratio']}).",
                    [target(f"max(gpu_advisor_fragmentation_ratio{{{ADV_POOL}}})", "rate")],
                    "percentunit",
                    thresholds=frag,
                    min=0,
                    max=1,
                ),
                stat(
                    "Fragmented GPUs",
                    "FGD fragment amount: expected free GPUs the arriving workload cannot use.",
                    [target(f"sum(gpu_advisor_fragmented_gpus{{{ADV_POOL}}})", "fragmented")],
                    "none",
                    thresholds=steps((t["fragmentation_min_free_gpus"], ORANGE)),
                ),
                stat(
                    "Free GPUs",
                    "Usable GPUs with no allocation, not in MIG mode: whole GPUs a job can take.",
                    [target(f"sum(gpu_advisor_free_gpus{{{ADV_POOL}}})", "free")],
                    "none",
                ),
                stat(
                    "Largest job that fits",
                    "GPUs of the largest single-node job that can start now without moving work.",
                    [target(f"max(gpu_advisor_largest_schedulable_job_gpus{{{ADV}}})", "GPUs")],
                    "none",
                    thresholds=steps((1, YELLOW), (8, GREEN), base=RED),
                ),
                stat(
                    "Allocated but idle",
                    "Allocated GPUs idle for the whole idle window (temporal fragmentation).",
                    [target(f"sum(gpu_advisor_allocated_idle_gpus{{{ADV_POOL}}})", "idle")],
                    "none",
                    thresholds=steps((1, ORANGE)),
                ),
                stat(
                    "Power of idle allocations",
                    "Power drawn by allocated-but-idle GPUs: the rate of wasted energy.",
                    [
                        target(
                            f"sum(gpu_advisor_allocated_idle_power_watts{{{ADV_POOL}}})", "wasted"
                        )
                    ],
                    "watt",
                ),
                table(
                    "Fragmentation map (node × GPU)",
                    "Every GPU now, one row per node: free, busy, allocated but idle, unhealthy, "
                    "MIG mode with free instances (not a free whole GPU).",
                    [target(f"gpu_advisor_gpu_state{{{ADV_POOL}}}", instant=True, table=True)],
                    "none",
                    transformations=[matrix("node", "gpu")],
                    cell="color-background",
                    mappings=value_mappings(states),
                    thresholds=state_thresholds,
                    w=12,
                    h=14,
                ),
                state_timeline(
                    "GPU states over time (node × GPU)",
                    "The fragmentation map over time: one row per GPU.",
                    [target(f"gpu_advisor_gpu_state{{{ADV_POOL}}}", "{{node}} / {{gpu}}")],
                    "none",
                    mappings=value_mappings(states),
                    thresholds=state_thresholds,
                    w=12,
                    h=14,
                ),
            ],
        ),
        Row(
            "Fragmentation over time and per job shape",
            [
                timeseries(
                    "Fragmentation rate by pool",
                    "FGD fragmentation rate per pool; dashed line at the alert threshold.",
                    [target(f"gpu_advisor_fragmentation_ratio{{{ADV_POOL}}}", "{{pool}}")],
                    "percentunit",
                    thresholds=frag,
                    show_thresholds=True,
                    min=0,
                    max=1,
                    w=12,
                ),
                heatmap_rows(
                    "Fragment amount per node",
                    "Per-node FGD fragment amount in GPUs, one row per node.",
                    [target(f"gpu_advisor_node_fragmented_gpus{{{ADV_POOL}}}", "{{node}}")],
                    "none",
                    scheme="Oranges",
                    w=12,
                ),
                bargauge(
                    "Stranded GPUs per job shape",
                    "Free GPUs of the selected pools no job of the shape can use (on nodes "
                    "with too few free GPUs).",
                    [
                        target(
                            f"sum by (shape) (gpu_advisor_stranded_gpus{{{ADV_POOL}}})",
                            "{{shape}}",
                            instant=True,
                        )
                    ],
                    "none",
                    thresholds=steps((1, ORANGE)),
                    w=8,
                ),
                bargauge(
                    "Schedulable jobs per shape",
                    "How many jobs of each shape could start now in the selected pools without "
                    "moving anything (alert GpuJobShapeUnschedulable at 0 in every pool while "
                    "one pool has enough GPUs free).",
                    [
                        target(
                            f"sum by (shape) (gpu_advisor_schedulable_jobs{{{ADV_POOL}}})",
                            "{{shape}}",
                            instant=True,
                        )
                    ],
                    "none",
                    thresholds=steps((1, GREEN), base=RED),
                    w=8,
                ),
                timeseries(
                    "Schedulable jobs per shape over time",
                    "Jobs of each shape that fit now in the selected pools, over time.",
                    [
                        target(
                            f"sum by (shape) (gpu_advisor_schedulable_jobs{{{ADV_POOL}}})",
                            "{{shape}}",
                        )
                    ],
                    "none",
                    w=8,
                ),
            ],
        ),
        Row(
            "Demand forecast",
            [
                forecast_vs_actual(w=12, h=9),
                wape_bargauge(
                    "Backtest error (WAPE)",
                    "Weighted absolute percentage error of the chosen model, of the "
                    "seasonal-naive baseline and of naive on held-back data; a forecast is only "
                    "shown with this measurement. The model is chosen on earlier hours, so it "
                    "may lose to naive here.",
                    "gpu_advisor_forecast_backtest_wape_ratio{" + ADV_POOL,
                    "pool",
                    w=6,
                ),
                bargauge(
                    "Interval coverage (held back)",
                    "Share of held-back hours at or below each forecast quantile, for the chosen "
                    "model, the seasonal-naive baseline and naive, over the hours that had an "
                    "interval (absent while fewer than 12 did): q0.9 should cover about 0.9 and "
                    "q0.1 about 0.1. Far off, the interval on the left is too narrow or too wide; "
                    "reserving at q0.9 then runs short (or idle) more often than it says "
                    "(alert GpuForecastIntervalMiscalibrated).",
                    [
                        target(
                            "gpu_advisor_forecast_backtest_coverage_ratio{"
                            + ADV_POOL
                            + ', horizon=~"$horizon"}',
                            "{{pool}} {{horizon}} {{model}} q{{forecast_quantile}}",
                            instant=True,
                        )
                    ],
                    "percentunit",
                    min=0,
                    max=1,
                    w=6,
                    h=9,
                ),
                timeseries(
                    "Idle GPUs forecast to stay free",
                    "Per pool and window W: GPUs the advisor releases as free for the whole next "
                    "W hours at its risk (5 % by default: the share of hours a release may exceed "
                    "what stayed free), next to the free GPUs now. Updated once an hour; only "
                    "shown with its held-back backtest.",
                    targets(
                        (
                            f"gpu_advisor_forecast_idle_gpus{{{ADV_POOL}}}",
                            "{{pool}} free for {{window}}",
                        ),
                        (f"gpu_advisor_free_gpus{{{ADV_POOL}}}", "{{pool}} free now"),
                    ),
                    "none",
                    w=16,
                    h=9,
                ),
                bargauge(
                    "Idle-window backtest",
                    "On the advisor's own held-back hours: the share of hours the release "
                    "exceeded the GPUs that stayed free (violations; the budget is the risk) and "
                    "the share of those GPUs it released (capture), for the advisor and for "
                    "releasing the past-W-hour minimum (min_past_w).",
                    targets(
                        (
                            f"gpu_advisor_forecast_idle_backtest_violation_ratio{{{ADV_POOL}}}",
                            "{{pool}} {{window}} {{model}} violations",
                        ),
                        (
                            f"gpu_advisor_forecast_idle_backtest_capture_ratio{{{ADV_POOL}}}",
                            "{{pool}} {{window}} {{model}} capture",
                        ),
                        instant=True,
                    ),
                    "percentunit",
                    min=0,
                    max=1,
                    w=8,
                    h=9,
                ),
                timeseries(
                    "Demand per tenant: forecast",
                    "GPUs held by each tenant's running allocations, forecast at horizon "
                    "$horizon (median and q0.9), for the tenants holding the most GPUs "
                    "(--forecast.max-tenants), next to each tenant's quota (--policy): held GPUs "
                    "forecast at the quota mean the tenant's next jobs will wait or borrow.",
                    targets(
                        *(
                            (
                                "gpu_advisor_forecast_tenant_demand_gpus{"
                                + ADV
                                + f', horizon=~"$horizon", forecast_quantile="{q}"}}',
                                f"{{{{tenant}}}} {name}",
                            )
                            for q, name in (("0.5", "median"), ("0.9", "q0.9"))
                        ),
                        (f"gpu_advisor_forecast_tenant_quota_gpus{{{ADV}}}", "{{tenant}} quota"),
                    ),
                    "none",
                    w=16,
                    h=9,
                ),
                wape_bargauge(
                    "Demand per tenant: backtest error (WAPE)",
                    "Held-back WAPE of each tenant's chosen model, of the seasonal-naive "
                    "baseline and of naive.",
                    "gpu_advisor_forecast_tenant_backtest_wape_ratio{" + ADV,
                    "tenant",
                    w=8,
                ),
                bargauge(
                    "Type fragmentation: idle supply vs demand by GPU model",
                    "Free plus allocated-idle GPUs against requested GPUs, per GPU model.",
                    targets(
                        (f"gpu_advisor_idle_capacity_gpus{{{ADV}}}", "{{model}} idle supply"),
                        (f"gpu_advisor_demand_gpus{{{ADV}}}", "{{model}} demand"),
                        instant=True,
                    ),
                    "none",
                    w=12,
                ),
                timeseries(
                    "Stranded GPU memory",
                    "Free GPU memory that no typical request fits (memory fragmentation).",
                    [target(f"gpu_advisor_stranded_memory_bytes{{{ADV_POOL}}}", "{{pool}}")],
                    "bytes",
                    w=12,
                ),
            ],
        ),
        Row(
            "Recommendations",
            [
                timeseries(
                    "Recommended actions by kind",
                    "How many actions of each kind the planner recommends.",
                    [target(f"gpu_advisor_recommended_actions{{{ADV}}}", "{{kind}}")],
                    "none",
                    stack=True,
                    bars=True,
                    w=8,
                    h=10,
                ),
                table(
                    "Top recommended actions",
                    "The planner's top actions, each replayed on the model before it is shown: "
                    "what moves where, its cost and which GPUs it frees for the target shape.",
                    targets(
                        (f"gpu_advisor_action_info{{{ADV}}}", "action"),
                        # GPU-seconds (Prometheus' base unit) shown as GPU-hours: one panel
                        # unit cannot serve this column and the GPUs beside it
                        (f"gpu_advisor_action_cost_gpu_seconds{{{ADV}}} / 3600", "cost"),
                        (f"gpu_advisor_action_benefit_gpus{{{ADV}}}", "benefit"),
                        instant=True,
                        table=True,
                    ),
                    "none",
                    transformations=[
                        {"id": "merge", "options": {}},
                        organize(
                            [*HIDE, "Value #A"],
                            {
                                "Value #B": "cost (GPU-hours)",
                                "Value #C": "benefit (GPUs)",
                                "workload": "workload",
                            },
                        ),
                        {"id": "sortBy", "options": {"sort": [{"field": "rank", "desc": False}]}},
                        {"id": "limit", "options": {"limitField": d["top_actions"]}},
                    ],
                    w=16,
                    h=10,
                ),
            ],
        ),
        Row(
            "Advisor health",
            [
                stat(
                    "Sources up",
                    "1 per advisor source whose last ingest worked (alert GpuAdvisorSourceDown).",
                    [target(f"gpu_advisor_source_up{{{ADV}}}", "{{source}}")],
                    "none",
                    thresholds=steps((1, GREEN), base=RED),
                    w=4,
                ),
                stat(
                    "Exporters left out",
                    "GPU exporters the advisor's source knows but could not read (a Prometheus "
                    "target down, or its GPU backend down): their nodes are in none of the "
                    "advisor's figures. The advisor's log and /api meta name them.",
                    [target(f"gpu_advisor_source_left_out_targets{{{ADV}}}", "{{source}}")],
                    "none",
                    thresholds=steps((1, ORANGE), base=GREEN),
                    w=4,
                ),
                stat(
                    "Last successful run",
                    "Seconds since the advisor's last complete run.",
                    [
                        target(
                            f"time() - max(gpu_advisor_last_success_timestamp_seconds{{{ADV}}})",
                            "age",
                        )
                    ],
                    "s",
                    thresholds=steps((600, ORANGE), (3600, RED)),
                    w=8,
                ),
                timeseries(
                    "Run duration",
                    "Wall time of each advisor run.",
                    targets((f"gpu_advisor_run_duration_seconds{{{ADV}}}", "run duration")),
                    "s",
                    w=4,
                ),
                timeseries(
                    "Failed runs",
                    "Failed advisor runs per interval, by the stage that failed (a count: one "
                    "panel unit could not serve it and the run time).",
                    targets(
                        (
                            "sum by (stage) (increase(gpu_advisor_run_errors_total{"
                            + ADV
                            + "}[$__rate_interval]))",
                            "{{stage}}",
                        )
                    ),
                    "none",
                    bars=True,
                    w=4,
                ),
            ],
        ),
    ]
    return dashboard(
        "gpu-defrag-fragmentation",
        "GPU fragmentation & advisor",
        "Where the fleet is fragmented (spatial, temporal, type, memory), which job shapes "
        "cannot start, the demand forecast with its interval and backtest, and the advisor's "
        "recommended actions with their cost and benefit. Data: gpu-defrag advise.",
        [TAG, "gpu", "capacity"],
        [
            advisor_variable(),
            query_variable("pool", "Pool", 'label_values(gpu_advisor_gpus{job=~"$advisor"}, pool)'),
            query_variable(
                "horizon",
                "Forecast horizon",
                'label_values(gpu_advisor_forecast_demand_gpus{job=~"$advisor"}, horizon)',
                multi=False,
                include_all=False,
            ),
        ],
        rows,
        refresh=d["refresh"],
        time_from=d["time_from"],
        links=dashboard_links(TAG),
    )
