"""What every dashboard selects by, in one place (the monitoring-mixin layout: one config of
selectors, one module per dashboard): the label selectors of exporter, advisor and dcgm-exporter
series (the variables replace the config's fixed job selectors so one Grafana can show several
clusters' jobs), the recording rules panels read, and the template variables they share.
"""

from __future__ import annotations

from dashboards.grafana import query_variable

TAG = "gpu-defrag"

# Exporter, advisor and dcgm-exporter series of the selected jobs (and nodes, GPUs, pools).
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
RECORDED = "from the recording rule {} (alerts/prometheus_rules.yaml)"

HIDE = ["Time", "__name__", "job", "instance"]  # columns a table leaves out


def job_variable(metric: str) -> dict:
    return query_variable(
        "job", "Exporter job", f"label_values({metric}, job)", description="Exporter scrape job"
    )


def advisor_variable() -> dict:
    return query_variable(
        "advisor",
        "Advisor job",
        "label_values(gpu_advisor_build_info, job)",
        description="Advisor scrape job",
    )
