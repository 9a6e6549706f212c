"""GPU fleet overview (gpu-fleet-overview.json): every GPU of the fleet, its states,
utilization and memory per node x GPU, power, temperature, health and idle allocations.
"""

from __future__ import annotations

from dashboards.grafana import (
    GREEN,
    ORANGE,
    RED,
    YELLOW,
    Row,
    bargauge,
    dashboard,
    dashboard_links,
    heatmap_rows,
    matrix,
    organize,
    query_variable,
    stat,
    steps,
    table,
    target,
    targets,
    timeseries,
)
from dashboards.selectors import (
    FLEET,
    HIDE,
    NODE_ALLOCATED,
    NODE_POWER,
    RECORDED,
    TAG,
    job_variable,
)


def build(config: dict) -> dict:
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
                    f"Current power of the selected GPUs, {RECORDED.format(NODE_POWER)}.",
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
                    f"(allocated GPUs {RECORDED.format(NODE_ALLOCATED)}).",
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
                    f"Sum of GPU power draw per node, {RECORDED.format(NODE_POWER)}.",
                    [target(f"sum by (node) ({NODE_POWER}{{{FLEET}}})", "{{node}}")],
                    "watt",
                    stack=True,
                    w=8,
                ),
                timeseries(
                    "Power against the limit",
                    "Fleet power draw over the sum of enforced power limits (the draw "
                    f"{RECORDED.format(NODE_POWER)}).",
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
                            HIDE,
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
            job_variable("gpu_exporter_build_info"),
            query_variable("node", "Node", 'label_values(gpu_info{job=~"$job"}, node)'),
        ],
        rows,
        refresh=d["refresh"],
        time_from=d["time_from"],
        links=dashboard_links(TAG),
    )
