"""GPU node detail (gpu-node-detail.json): one node's per-GPU series, throttling, errors,
NVLink/PCIe topology, MIG instances, and the processes and pods on each GPU.
"""

from __future__ import annotations

from dashboards.grafana import (
    GREEN,
    ORANGE,
    RED,
    Panel,
    Row,
    dashboard,
    dashboard_links,
    matrix,
    organize,
    query_variable,
    state_timeline,
    steps,
    table,
    target,
    targets,
    timeseries,
    value_mappings,
)
from dashboards.selectors import (
    HIDE,
    NODE,
    NODE_ALL,
    TAG,
    job_variable,
)


def build(config: dict) -> dict:
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
                    transformations=[organize([*HIDE, "node", "Value"])],
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
                        organize([*HIDE, "node", "Value #B"], {"Value #A": "NVLink island"}),
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
                        organize([*HIDE, "node", "Value #A"], {"Value #B": "memory used"}),
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
                    transformations=[organize([*HIDE, "node"], {"Value": "memory used"})],
                    sort_by="memory used",
                    w=14,
                    h=9,
                ),
                table(
                    "Allocations",
                    "Who holds each GPU or MIG instance (kubelet pod-resources or Slurm).",
                    [target(f"gpu_allocation_info{{{NODE}}}", instant=True, table=True)],
                    "none",
                    transformations=[organize([*HIDE, "node", "Value"], {"workload": "workload"})],
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
            job_variable("gpu_exporter_build_info"),
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
