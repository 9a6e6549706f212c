"""Generate the Grafana dashboards from code (plain dicts, see grafana.py).

    python -m dashboards.generate           # writes dashboards/json/*.json that changed, one line
    python -m dashboards.generate --check   # exit 1 if a committed dashboard is out of date

Thresholds come from alerts/config.yaml, the same config the alert rules use, so a panel turns
red where the alert fires. Metric names come from exporter/contract.py and advisor/contract.py
(tests/ops/test_dashboards.py checks every name).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from advisor.contract import GPU_STATE_CODES
from alerts.config import load_config
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
from gpu_defrag_common.files import sync_generated

OUT_DIR = Path(__file__).resolve().parent / "json"
TAG = "gpu-defrag"

# Exporter and advisor selectors inside the dashboards (the variables replace the config's
# fixed job selectors so one Grafana can show several clusters' jobs).
FLEET = 'job=~"$job", node=~"$node"'
NODE = 'job=~"$job", node="$node", gpu=~"$gpu"'
NODE_ALL = 'job=~"$job", node="$node"'
ADV = 'job=~"$advisor"'
ADV_POOL = 'job=~"$advisor", pool=~"$pool"'
DCGM = 'job=~"$job", Hostname=~"$Hostname"'

# Recording rules (alerts/generate.py `record_definitions`, in alerts/prometheus_rules.yaml): the
# per-GPU series aggregated per node without the gpu label (job, instance and node stay). Panels
# that add those series up per node or over the fleet read the recorded series instead: one series
# per node rather than one per GPU, the same numbers (a sum of per-node sums is the sum).
NODE_POWER = "node:gpu_power_watts:sum"
NODE_ALLOCATED = "node:gpu_allocated:count"  # GPUs with an allocation (MIG instances: one GPU)
_RECORDED = "from the recording rule {} (alerts/prometheus_rules.yaml)"

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

_HIDE = ["Time", "__name__", "job", "instance"]


def _job_variable(metric: str) -> dict:
    return query_variable(
        "job", "Exporter job", f"label_values({metric}, job)", description="Exporter scrape job"
    )


def _advisor_variable() -> dict:
    return query_variable(
        "advisor",
        "Advisor job",
        "label_values(gpu_advisor_build_info, job)",
        description="Advisor scrape job",
    )


def fleet_overview(config: dict) -> dict:
    d, t = config["dashboards"], config["thresholds"]
    idle = t["idle_window"]
    temperature = steps((d["temperature_warning_celsius"], ORANGE), (t["temperature_celsius"], RED))
    busy_ratio = steps(
        (t["idle_utilization_ratio"], YELLOW), (d["utilization_busy_ratio"], GREEN), base=RED
    )
    allocated = f"sum({NODE_ALLOCATED}{{{FLEET}}})"
    idle_gpus = f"sum(gpu_node_allocated_idle_gpus{{{FLEET}}})"
    unhealthy = f"sum(1 - gpu_healthy{{{FLEET}}})"
    state_queries = [
        (f"sum(gpu_node_free_gpus{{{FLEET}}})", "free"),
        (f"{allocated} - {idle_gpus}", "busy"),
        (idle_gpus, "allocated, idle"),
        (f"sum(gpu_node_owner_unknown_gpus{{{FLEET}}})", "in use, owner unknown"),
        (unhealthy, "unhealthy"),
    ]
    rows = [
        Row(
            "Fleet",
            [
                stat(
                    "GPUs",
                    "GPUs the exporters report (one gpu_info series per GPU).",
                    [target(f"count(gpu_info{{{FLEET}}})", "GPUs")],
                    "none",
                ),
                stat(
                    "Fleet utilization",
                    "Mean kernel-active fraction over all selected GPUs.",
                    [target(f"avg(gpu_utilization_ratio{{{FLEET}}})", "utilization")],
                    "percentunit",
                    thresholds=busy_ratio,
                    min=0,
                    max=1,
                ),
                stat(
                    "Allocated but idle",
                    f"Allocated GPUs under the idle threshold for the exporter's idle window "
                    f"(alert GpuAllocatedIdle uses {idle}).",
                    [target(idle_gpus, "allocated, idle")],
                    "none",
                    thresholds=steps((1, ORANGE)),
                ),
                stat(
                    "Unhealthy GPUs",
                    "GPUs that are lost or unusable (fatal XID, row-remap failure).",
                    [target(unhealthy, "unhealthy")],
                    "none",
                    thresholds=steps((1, RED)),
                ),
                stat(
                    "Power draw",
                    f"Current power of the selected GPUs, {_RECORDED.format(NODE_POWER)}.",
                    [target(f"sum({NODE_POWER}{{{FLEET}}})", "power")],
                    "watt",
                ),
                stat(
                    "Energy in range",
                    "Energy the selected GPUs consumed over the dashboard's time range.",
                    [
                        target(
                            f"sum(increase(gpu_energy_joules_total{{{FLEET}}}[$__range]))", "energy"
                        )
                    ],
                    "joule",
                    graph=False,
                ),
                bargauge(
                    "GPUs by state",
                    "Free, allocated and busy, allocated but idle, in use with no allocation "
                    "naming them (owner unknown), and unhealthy GPUs now "
                    f"(allocated GPUs {_RECORDED.format(NODE_ALLOCATED)}).",
                    targets(*state_queries, instant=True),
                    "none",
                    w=8,
                    h=8,
                    thresholds=steps(),
                ),
                timeseries(
                    "GPUs by state over time",
                    "The same states over time, stacked.",
                    targets(*state_queries),
                    "none",
                    stack=True,
                    w=16,
                    h=8,
                ),
            ],
        ),
        Row(
            "Utilization and memory (node × GPU)",
            [
                heatmap_rows(
                    "GPU utilization heatmap",
                    "One row per GPU (node / gpu), coloured by the fraction of time a kernel ran.",
                    [target(f"gpu_utilization_ratio{{{FLEET}}}", "{{node}} / {{gpu}}")],
                    "percentunit",
                    scheme="Greens",
                    h=12,
                ),
                heatmap_rows(
                    "GPU memory heatmap",
                    "One row per GPU, coloured by used over total framebuffer memory.",
                    [
                        target(
                            f"gpu_memory_used_bytes{{{FLEET}}} / gpu_memory_total_bytes{{{FLEET}}}",
                            "{{node}} / {{gpu}}",
                        )
                    ],
                    "percentunit",
                    scheme="Blues",
                    h=12,
                ),
                table(
                    "Utilization now (node × GPU)",
                    "Current utilization as a grid: one row per node, one column per GPU index.",
                    [target(f"gpu_utilization_ratio{{{FLEET}}}", instant=True, table=True)],
                    "percentunit",
                    transformations=[matrix("node", "gpu")],
                    cell="color-background",
                    thresholds=busy_ratio,
                    w=24,
                    h=10,
                ),
            ],
        ),
        Row(
            "Power and temperature",
            [
                timeseries(
                    "Power by node",
                    f"Sum of GPU power draw per node, {_RECORDED.format(NODE_POWER)}.",
                    [target(f"sum by (node) ({NODE_POWER}{{{FLEET}}})", "{{node}}")],
                    "watt",
                    stack=True,
                    w=8,
                ),
                timeseries(
                    "Power against the limit",
                    "Fleet power draw over the sum of enforced power limits (the draw "
                    f"{_RECORDED.format(NODE_POWER)}).",
                    [
                        target(
                            f"sum({NODE_POWER}{{{FLEET}}}) / sum(gpu_power_limit_watts{{{FLEET}}})",
                            "draw / limit",
                        )
                    ],
                    "percentunit",
                    min=0,
                    max=1,
                    w=8,
                ),
                timeseries(
                    "Energy use by node",
                    "Energy counter rate per node: average power over each interval.",
                    [
                        target(
                            "sum by (node) (rate(gpu_energy_joules_total{"
                            + FLEET
                            + "}[$__rate_interval]))",
                            "{{node}}",
                        )
                    ],
                    "watt",
                    w=8,
                ),
                timeseries(
                    "Hottest GPU per node",
                    f"Highest die temperature per node; dashed lines at "
                    f"{d['temperature_warning_celsius']} °C and the alert threshold "
                    f"{t['temperature_celsius']} °C.",
                    [target(f"max by (node) (gpu_temperature_celsius{{{FLEET}}})", "{{node}}")],
                    "celsius",
                    thresholds=temperature,
                    show_thresholds=True,
                    w=12,
                ),
                timeseries(
                    "Memory temperature per node",
                    "Highest HBM temperature per node, where the GPU reports it.",
                    [
                        target(
                            f"max by (node) (gpu_memory_temperature_celsius{{{FLEET}}})", "{{node}}"
                        )
                    ],
                    "celsius",
                    thresholds=temperature,
                    w=12,
                ),
            ],
        ),
        Row(
            "Health",
            [
                timeseries(
                    "XID errors by code",
                    "XID events per interval by node, GPU and code (see the runbook's XID classes).",
                    [
                        target(
                            "sum by (node, gpu, xid) (increase(gpu_xid_errors_total{"
                            + FLEET
                            + "}[$__rate_interval]))",
                            "{{node}} / {{gpu}} XID {{xid}}",
                        )
                    ],
                    "none",
                    bars=True,
                    w=8,
                ),
                timeseries(
                    "ECC errors",
                    "Corrected and uncorrected ECC errors per interval.",
                    [
                        target(
                            "sum by (node, gpu, error_type) (increase(gpu_ecc_errors_total{"
                            + FLEET
                            + "}[$__rate_interval]))",
                            "{{node}} / {{gpu}} {{error_type}}",
                        )
                    ],
                    "none",
                    bars=True,
                    w=8,
                ),
                timeseries(
                    "Throttled GPUs by reason",
                    "How many GPUs have each clock-event (throttle) reason active.",
                    [
                        target(
                            "sum by (reason) (gpu_clock_event_active{"
                            + FLEET
                            + ', reason!="gpu_idle"})',
                            "{{reason}}",
                        )
                    ],
                    "none",
                    stack=True,
                    w=8,
                ),
                stat(
                    "Lost GPUs",
                    "GPUs that fell off the bus (alert GpuLost).",
                    [target(f"sum(gpu_lost{{{FLEET}}})", "lost")],
                    "none",
                    thresholds=steps((1, RED)),
                    w=6,
                ),
                stat(
                    "GPUs waiting for a reset",
                    "Pending row remaps or page retirements (alert GpuResetRequired).",
                    [
                        target(
                            f"count((gpu_remapped_rows_pending{{{FLEET}}} == 1) or "
                            f"(gpu_retired_pages_pending{{{FLEET}}} == 1)) or vector(0)",
                            "pending reset",
                        )
                    ],
                    "none",
                    thresholds=steps((1, ORANGE)),
                    w=6,
                ),
                stat(
                    "PCIe replays in range",
                    "PCIe link retries over the time range; a rising count points at a bad riser.",
                    [
                        target(
                            f"sum(increase(gpu_pcie_replay_errors_total{{{FLEET}}}[$__range]))",
                            "replays",
                        )
                    ],
                    "none",
                    thresholds=steps((100, ORANGE)),
                    graph=False,
                    w=6,
                ),
                stat(
                    "Exporter backends down",
                    "Exporter targets whose backend (NVML, DCGM, dcgm-exporter) is unreachable.",
                    [target('sum(1 - gpu_exporter_backend_up{job=~"$job"})', "backends down")],
                    "none",
                    thresholds=steps((1, RED)),
                    w=6,
                ),
            ],
        ),
        Row(
            "Idle allocations",
            [
                table(
                    "Top idle-but-allocated GPUs",
                    f"Allocated GPUs with the lowest peak utilization over {idle}, with who holds "
                    "them (alert GpuAllocatedIdle).",
                    [
                        target(
                            f"bottomk({d['top_idle']}, "
                            f"max by (job, instance, node, gpu) "
                            f"(max_over_time(gpu_utilization_ratio{{{FLEET}}}[{idle}])) "
                            f"* on (job, instance, node, gpu) group_right () "
                            f"gpu_allocation_info{{{FLEET}}})",
                            instant=True,
                            table=True,
                        )
                    ],
                    "percentunit",
                    transformations=[
                        organize(
                            _HIDE,
                            {"Value": f"peak utilization ({idle})", "workload": "workload"},
                        )
                    ],
                    thresholds=busy_ratio,
                    cell="color-background",
                    w=14,
                    h=9,
                ),
                timeseries(
                    "Allocated-but-idle GPUs by node",
                    "Exporter's count of allocated GPUs idle for its whole idle window.",
                    [
                        target(
                            f"sum by (node) (gpu_node_allocated_idle_gpus{{{FLEET}}})", "{{node}}"
                        )
                    ],
                    "none",
                    stack=True,
                    w=10,
                    h=9,
                ),
            ],
        ),
    ]
    return dashboard(
        "gpu-defrag-fleet",
        "GPU fleet overview",
        "Every GPU of the fleet: states, utilization and memory per node × GPU, power, "
        "temperature, health and idle allocations. Data: gpu-defrag exporter.",
        [TAG, "gpu"],
        [
            _job_variable("gpu_exporter_build_info"),
            query_variable("node", "Node", 'label_values(gpu_info{job=~"$job"}, node)'),
        ],
        rows,
        refresh=d["refresh"],
        time_from=d["time_from"],
        links=dashboard_links(TAG),
    )


def node_detail(config: dict) -> dict:
    d, t = config["dashboards"], config["thresholds"]
    temperature = steps((d["temperature_warning_celsius"], ORANGE), (t["temperature_celsius"], RED))
    legend = "GPU {{gpu}}"

    def per_gpu(title, description, metric, unit, **kw) -> Panel:
        return timeseries(title, description, [target(f"{metric}{{{NODE}}}", legend)], unit, **kw)

    rows = [
        Row(
            "GPUs of $node",
            [
                table(
                    "GPU inventory",
                    "Model, UUID, PCI bus id, driver and VBIOS of each GPU on the node.",
                    [target(f"gpu_info{{{NODE}}}", instant=True, table=True)],
                    "none",
                    transformations=[organize([*_HIDE, "node", "Value"])],
                    w=24,
                    h=6,
                ),
                per_gpu(
                    "Utilization",
                    "Fraction of time a kernel ran.",
                    "gpu_utilization_ratio",
                    "percentunit",
                    min=0,
                    max=1,
                    w=8,
                ),
                per_gpu(
                    "SM activity",
                    "SM active fraction (GPM on Hopper and later, or DCGM profiling).",
                    "gpu_sm_active_ratio",
                    "percentunit",
                    min=0,
                    max=1,
                    w=8,
                ),
                per_gpu(
                    "Tensor pipe activity",
                    "Fraction of cycles the tensor cores were busy (GPM or DCGM).",
                    "gpu_tensor_active_ratio",
                    "percentunit",
                    min=0,
                    max=1,
                    w=8,
                ),
                per_gpu(
                    "Memory used",
                    "Framebuffer memory in use per GPU.",
                    "gpu_memory_used_bytes",
                    "bytes",
                    w=8,
                ),
                per_gpu(
                    "Memory bandwidth utilization",
                    "Fraction of time device memory was read or written.",
                    "gpu_memory_utilization_ratio",
                    "percentunit",
                    min=0,
                    max=1,
                    w=8,
                ),
                per_gpu(
                    "Temperature",
                    "Die temperature; dashed lines at the warning and alert thresholds.",
                    "gpu_temperature_celsius",
                    "celsius",
                    thresholds=temperature,
                    show_thresholds=True,
                    w=8,
                ),
                timeseries(
                    "Power and limit",
                    "Power draw per GPU and the enforced limit.",
                    targets(
                        (f"gpu_power_watts{{{NODE}}}", "GPU {{gpu}}"),
                        (f"max(gpu_power_limit_watts{{{NODE}}})", "limit"),
                    ),
                    "watt",
                    w=8,
                ),
                per_gpu(
                    "SM clock",
                    "Current SM clock; drops under load point at throttling.",
                    "gpu_sm_clock_hertz",
                    "hertz",
                    w=8,
                ),
                timeseries(
                    "PCIe throughput",
                    "PCIe transmit (up) and receive (down, negative) per GPU.",
                    targets(
                        (f"gpu_pcie_tx_bytes_per_second{{{NODE}}}", "GPU {{gpu}} tx"),
                        (f"-gpu_pcie_rx_bytes_per_second{{{NODE}}}", "GPU {{gpu}} rx"),
                    ),
                    "Bps",
                    w=8,
                ),
                state_timeline(
                    "Clock events (throttling)",
                    "Which clock-event reasons were active on each GPU (1 = active).",
                    [
                        target(
                            f'gpu_clock_event_active{{{NODE}, reason!="gpu_idle"}}',
                            "GPU {{gpu}} {{reason}}",
                        )
                    ],
                    "none",
                    mappings=value_mappings({0: ("off", GREEN), 1: ("active", ORANGE)}),
                    thresholds=steps((1, ORANGE)),
                    w=12,
                ),
                timeseries(
                    "Errors per interval",
                    "XID events, ECC errors and PCIe replays per interval.",
                    targets(
                        (
                            "sum by (gpu, xid) (increase(gpu_xid_errors_total{"
                            + NODE
                            + "}[$__rate_interval]))",
                            "GPU {{gpu}} XID {{xid}}",
                        ),
                        (
                            "sum by (gpu, error_type) (increase(gpu_ecc_errors_total{"
                            + NODE
                            + "}[$__rate_interval]))",
                            "GPU {{gpu}} ECC {{error_type}}",
                        ),
                        (
                            "increase(gpu_pcie_replay_errors_total{"
                            + NODE
                            + "}[$__rate_interval])",
                            "GPU {{gpu}} PCIe replays",
                        ),
                    ),
                    "none",
                    bars=True,
                    w=12,
                ),
            ],
        ),
        Row(
            "Topology",
            [
                table(
                    "GPU-to-GPU links",
                    "How each pair of GPUs is connected (NVLink, PCIe switch, host bridge, "
                    "NUMA node, cross-socket).",
                    [target(f"gpu_topology_link_info{{{NODE_ALL}}}", instant=True, table=True)],
                    "none",
                    transformations=[matrix("gpu", "peer_gpu", "link_type")],
                    w=12,
                    h=9,
                ),
                table(
                    "NVLinks between GPUs",
                    "Active NVLinks per GPU pair.",
                    [target(f"gpu_nvlink_links{{{NODE_ALL}}}", instant=True, table=True)],
                    "none",
                    transformations=[matrix("gpu", "peer_gpu")],
                    w=12,
                    h=9,
                ),
                table(
                    "NVLink islands and NUMA affinity",
                    "NVLink island id of each GPU, with its NUMA node and CPU affinity.",
                    targets(
                        (f"gpu_nvlink_island{{{NODE_ALL}}}", "island"),
                        (f"gpu_numa_info{{{NODE_ALL}}}", "numa"),
                        instant=True,
                        table=True,
                    ),
                    "none",
                    transformations=[
                        {"id": "merge", "options": {}},
                        organize([*_HIDE, "node", "Value #B"], {"Value #A": "NVLink island"}),
                    ],
                    w=24,
                    h=7,
                ),
            ],
        ),
        Row(
            "MIG, processes and pods",
            [
                table(
                    "MIG instances",
                    "MIG GPU/compute instances with their profile and memory in use.",
                    targets(
                        (f"gpu_mig_instance_info{{{NODE}}}", "instance"),
                        (f"gpu_mig_memory_used_bytes{{{NODE}}}", "used"),
                        instant=True,
                        table=True,
                    ),
                    "bytes",
                    transformations=[
                        {"id": "merge", "options": {}},
                        organize([*_HIDE, "node", "Value #A"], {"Value #B": "memory used"}),
                    ],
                    w=12,
                    h=8,
                ),
                per_gpu(
                    "MIG memory used",
                    "Memory in use per MIG GPU instance.",
                    "gpu_mig_memory_used_bytes",
                    "bytes",
                    w=12,
                    h=8,
                ),
                table(
                    "Processes and pods on each GPU",
                    "Every process holding GPU memory, with its MIG instance, pod, namespace, "
                    "container or Slurm job.",
                    [target(f"gpu_process_memory_used_bytes{{{NODE}}}", instant=True, table=True)],
                    "bytes",
                    transformations=[organize([*_HIDE, "node"], {"Value": "memory used"})],
                    sort_by="memory used",
                    w=14,
                    h=9,
                ),
                table(
                    "Allocations",
                    "Who holds each GPU or MIG instance (kubelet pod-resources or Slurm).",
                    [target(f"gpu_allocation_info{{{NODE}}}", instant=True, table=True)],
                    "none",
                    transformations=[organize([*_HIDE, "node", "Value"], {"workload": "workload"})],
                    w=10,
                    h=9,
                ),
            ],
        ),
    ]
    return dashboard(
        "gpu-defrag-node",
        "GPU node detail",
        "One node: per-GPU time series, throttling, errors, NVLink/PCIe topology, MIG "
        "instances, and the processes and pods on each GPU.",
        [TAG, "gpu"],
        [
            _job_variable("gpu_exporter_build_info"),
            query_variable(
                "node",
                "Node",
                'label_values(gpu_info{job=~"$job"}, node)',
                multi=False,
                include_all=False,
            ),
            query_variable("gpu", "GPU", 'label_values(gpu_info{job=~"$job", node="$node"}, gpu)'),
        ],
        rows,
        refresh=d["refresh"],
        time_from=d["time_from"],
        links=dashboard_links(TAG),
    )


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


def fragmentation_advisor(config: dict) -> dict:
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
                            [*_HIDE, "Value #A"],
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
            _advisor_variable(),
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


def dcgm_fleet(config: dict) -> dict:
    """The fleet view over NVIDIA dcgm-exporter names (or our exporter's --compat.dcgm-names)."""
    d, t = config["dashboards"], config["thresholds"]
    temperature = steps((d["temperature_warning_celsius"], ORANGE), (t["temperature_celsius"], RED))
    legend = "{{Hostname}} / {{gpu}}"
    rows = [
        Row(
            "Fleet (dcgm-exporter metric names)",
            [
                stat(
                    "GPUs",
                    "GPUs reporting a temperature.",
                    [target(f"count(DCGM_FI_DEV_GPU_TEMP{{{DCGM}}})", "GPUs")],
                    "none",
                ),
                stat(
                    "Fleet utilization",
                    "Mean GPU utilization (DCGM_FI_DEV_GPU_UTIL is in percent).",
                    [target(f"avg(DCGM_FI_DEV_GPU_UTIL{{{DCGM}}}) / 100", "utilization")],
                    "percentunit",
                    thresholds=steps(
                        (t["idle_utilization_ratio"], YELLOW),
                        (d["utilization_busy_ratio"], GREEN),
                        base=RED,
                    ),
                ),
                stat(
                    "Power draw",
                    "Current power of all GPUs.",
                    [target(f"sum(DCGM_FI_DEV_POWER_USAGE{{{DCGM}}})", "power")],
                    "watt",
                ),
                stat(
                    "Framebuffer used",
                    "Used over used plus free framebuffer memory (MiB counters).",
                    [
                        target(
                            f"sum(DCGM_FI_DEV_FB_USED{{{DCGM}}}) / "
                            f"(sum(DCGM_FI_DEV_FB_USED{{{DCGM}}}) + sum(DCGM_FI_DEV_FB_FREE{{{DCGM}}}))",
                            "used",
                        )
                    ],
                    "percentunit",
                    thresholds=steps((d["memory_high_ratio"], ORANGE)),
                    w=8,
                ),
                stat(
                    "Hottest GPU",
                    "Highest GPU temperature in the fleet.",
                    [target(f"max(DCGM_FI_DEV_GPU_TEMP{{{DCGM}}})", "max")],
                    "celsius",
                    thresholds=temperature,
                ),
                heatmap_rows(
                    "GPU utilization heatmap",
                    "One row per GPU (Hostname / gpu), coloured by utilization.",
                    [target(f"DCGM_FI_DEV_GPU_UTIL{{{DCGM}}} / 100", legend)],
                    "percentunit",
                    scheme="Greens",
                    h=12,
                ),
                heatmap_rows(
                    "GPU memory heatmap",
                    "One row per GPU, coloured by used framebuffer share.",
                    [
                        target(
                            f"DCGM_FI_DEV_FB_USED{{{DCGM}}} / "
                            f"(DCGM_FI_DEV_FB_USED{{{DCGM}}} + DCGM_FI_DEV_FB_FREE{{{DCGM}}})",
                            legend,
                        )
                    ],
                    "percentunit",
                    scheme="Blues",
                    h=12,
                ),
                timeseries(
                    "GPU temperature",
                    "Die temperature per GPU.",
                    [target(f"DCGM_FI_DEV_GPU_TEMP{{{DCGM}}}", legend)],
                    "celsius",
                    thresholds=temperature,
                    show_thresholds=True,
                    w=8,
                ),
                timeseries(
                    "Power and energy",
                    "Power per node, and the energy counter's rate (mJ -> W).",
                    targets(
                        (f"sum by (Hostname) (DCGM_FI_DEV_POWER_USAGE{{{DCGM}}})", "{{Hostname}}"),
                        (
                            "sum(rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{"
                            + DCGM
                            + "}[$__rate_interval])) / 1000",
                            "fleet, from energy counter",
                        ),
                    ),
                    "watt",
                    w=8,
                ),
                timeseries(
                    "SM clock",
                    "SM clock per GPU (MHz converted to Hz).",
                    [target(f"DCGM_FI_DEV_SM_CLOCK{{{DCGM}}} * 1000000", legend)],
                    "hertz",
                    w=8,
                ),
                timeseries(
                    "Tensor and DRAM activity",
                    "DCGM profiling ratios, where the exporter collects them.",
                    targets(
                        (
                            f"avg by (Hostname) (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{DCGM}}})",
                            "{{Hostname}} tensor",
                        ),
                        (
                            f"avg by (Hostname) (DCGM_FI_PROF_DRAM_ACTIVE{{{DCGM}}})",
                            "{{Hostname}} DRAM",
                        ),
                    ),
                    "percentunit",
                    w=12,
                ),
                timeseries(
                    "PCIe replays",
                    "PCIe replay counter increase per interval.",
                    [
                        target(
                            "sum by (Hostname, gpu) (increase(DCGM_FI_DEV_PCIE_REPLAY_COUNTER{"
                            + DCGM
                            + "}[$__rate_interval]))",
                            legend,
                        )
                    ],
                    "none",
                    bars=True,
                    w=12,
                ),
            ],
        )
    ]
    return dashboard(
        "gpu-defrag-dcgm",
        "GPU fleet (dcgm-exporter names)",
        "The fleet overview for NVIDIA dcgm-exporter users: DCGM_FI_* names and units "
        "(percent, MiB, MHz, mJ), node label Hostname. Also works on `gpu-defrag exporter "
        "--compat.dcgm-names`. For fragmentation and advisor panels see the other dashboards.",
        [TAG, "gpu", "dcgm"],
        [
            _job_variable("DCGM_FI_DEV_GPU_TEMP"),
            query_variable(
                "Hostname", "Hostname", 'label_values(DCGM_FI_DEV_GPU_TEMP{job=~"$job"}, Hostname)'
            ),
        ],
        rows,
        refresh=d["refresh"],
        time_from=d["time_from"],
        links=dashboard_links(TAG),
    )


DASHBOARDS = {
    "gpu-fleet-overview.json": fleet_overview,
    "gpu-node-detail.json": node_detail,
    "gpu-fragmentation-advisor.json": fragmentation_advisor,
    "gpu-fleet-dcgm-exporter.json": dcgm_fleet,
}


def render_all(config: dict | None = None) -> dict[str, dict]:
    config = config or load_config()
    return {name: build(config) for name, build in DASHBOARDS.items()}


def dumps(document: dict) -> str:
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if outputs are out of date")
    args = parser.parse_args(argv)
    files = {name: (OUT_DIR / name, dumps(doc)) for name, doc in render_all().items()}
    label = f"{OUT_DIR.parent.name}/{OUT_DIR.name}"
    return sync_generated(files, label, "python -m dashboards.generate", args.check)


if __name__ == "__main__":
    sys.exit(main())
