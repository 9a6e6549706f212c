"""GPU fleet for dcgm-exporter names (gpu-fleet-dcgm-exporter.json): the fleet overview on
NVIDIA dcgm-exporter's DCGM_FI_* series (or `gpu-defrag exporter --compat.dcgm-names`).
"""

from __future__ import annotations

from dashboards.grafana import (
    GREEN,
    ORANGE,
    RED,
    YELLOW,
    Row,
    dashboard,
    dashboard_links,
    heatmap_rows,
    query_variable,
    stat,
    steps,
    target,
    targets,
    timeseries,
)
from dashboards.selectors import (
    DCGM,
    TAG,
    job_variable,
)


def build(config: dict) -> dict:
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
            job_variable("DCGM_FI_DEV_GPU_TEMP"),
            query_variable(
                "Hostname", "Hostname", 'label_values(DCGM_FI_DEV_GPU_TEMP{job=~"$job"}, Hostname)'
            ),
        ],
        rows,
        refresh=d["refresh"],
        time_from=d["time_from"],
        links=dashboard_links(TAG),
    )
