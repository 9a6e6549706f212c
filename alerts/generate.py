"""Render the alerting and recording rules from `config.yaml` (monitoring-mixin style).

    python -m alerts.generate           # writes the committed outputs that changed, one line
    python -m alerts.generate --check   # exit 1 if a committed output is out of date

Outputs: `alerts/prometheus_alerts.yaml`, `alerts/prometheus_rules.yaml` and the Prometheus
Operator `deploy/overlays/kube-prometheus-stack/prometheusrule.yaml`; and the receiver examples
of `alerts/receivers.py` on the routes of `alerts/alertmanager.yml`:
`alerts/alertmanager-receivers.yml` and the AlertmanagerConfig
`deploy/components/alertmanager-receivers/alertmanagerconfig.yaml`. Tests call `render_alerts(load_config({...}))`
to get a fast variant (short windows) of exactly the same rules.

Every alert is a `signal` PromQL plus a condition. The signal is what the integration test
evaluates against a live Prometheus: it must return series whenever its metrics have data, so a
typo in a selector cannot hide behind an alert that never fires.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from alerts import receivers
from alerts.config import load_config, seconds
from gpu_defrag_common.files import sync_generated

ROOT = Path(__file__).resolve().parent.parent
ALERTS_FILE = ROOT / "alerts" / "prometheus_alerts.yaml"
RULES_FILE = ROOT / "alerts" / "prometheus_rules.yaml"
OPERATOR_FILE = ROOT / "deploy" / "overlays" / "kube-prometheus-stack" / "prometheusrule.yaml"
RECEIVERS_FILE = ROOT / "alerts" / "alertmanager-receivers.yml"
ALERTMANAGER_CONFIG_FILE = (
    ROOT / "deploy" / "components" / "alertmanager-receivers" / "alertmanagerconfig.yaml"
)

GPU_LABELS = "job, instance, node, gpu"
# Operators that bind looser than (or as loose as) a comparison's operands would: wrap the signal.
_TOP_LEVEL_OPERATOR = re.compile(r"\s(?:and|or|unless|[-+*/%^]|[<>]=?|[=!]=)\s")


@dataclass(frozen=True, slots=True)
class Alert:
    name: str
    group: str
    severity: str
    for_: str  # key into config["for"], a literal duration, or "0m"
    signal: str  # PromQL whose series the condition filters; %(…)s placeholders
    condition: str  # appended to the signal, e.g. "== 0"; "" when `expr` is given
    summary: str
    description: str
    # "gpu" (node-level, inhibited when the exporter is down), "exporter", "advisor" (capacity
    # findings, for the planners) or "advisor-service" (the advisor's own health, for the SREs)
    component: str
    expr: str = ""  # full expression when it is not `(signal) condition`
    labels: dict[str, str] = field(default_factory=dict)
    absent: bool = False  # an absent() alert: its expression must be empty while data exists


def params(config: dict) -> dict[str, object]:
    """Values the PromQL and annotation templates may use as %(name)s."""
    t = config["thresholds"]
    values: dict[str, object] = {
        "E": config["selectors"]["exporter"],
        "A": config["selectors"]["advisor"],
        **{f"for_{k}": v for k, v in config["for"].items()},
        **t,
        "collection_stale_s": int(seconds(t["collection_stale"])),
        "xid_window_s": int(seconds(t["xid_window"])),
        "advisor_stale_s": int(seconds(t["advisor_stale"])),
    }
    return values


def _wrap(signal: str) -> str:
    """Parenthesise a signal whose top level has operators a condition would bind into."""
    body = signal.strip()
    if not _TOP_LEVEL_OPERATOR.search(body):
        return body
    if "\n" in body:
        return "(\n" + "\n".join(f"  {line}" for line in body.splitlines()) + "\n)"
    return f"({body})"


def _xid_alerts(config: dict) -> list[Alert]:
    classes = config["xid_classes"]
    listed = sorted({code for c in classes for code in c["codes"]})
    alerts = []
    for xid_class in classes:
        codes = xid_class["codes"]
        matcher = (
            f'xid=~"{"|".join(map(str, codes))}"'
            if codes
            else f'xid!~"{"|".join(map(str, listed))}"'
        )
        series = f"gpu_xid_errors_total{{%(E)s, {matcher}}}"
        # increase() misses the first sample of a new series (an XID code seen for the first
        # time), so a series that did not exist one window ago counts too, when the GPU's last
        # XID timestamp is inside the window (not an old one seen after a Prometheus restart).
        expr = (
            f"(increase({series}[%(xid_window)s]) > 0)\n"
            f"or\n"
            f"(\n  {series}\n  unless {series} offset %(xid_window)s\n)\n"
            f"and on ({GPU_LABELS})\n"
            f"(time() - gpu_xid_last_timestamp_seconds{{%(E)s}} < %(xid_window_s)s)"
        )
        alerts.append(
            Alert(
                name=xid_class["alert"],
                group="gpu-defrag-health",
                severity=xid_class["severity"],
                for_="0m",
                signal=f"increase({series}[%(xid_window)s])",
                condition="",
                expr=expr,
                summary=f"GPU reported {xid_class['name']}-class XID errors.",
                description=(
                    "GPU {{ $labels.gpu }} on node {{ $labels.node }} reported XID "
                    '{{ $labels.xid }} ({{ $value | printf "%%.0f" }} in the last %(xid_window)s): '
                    + xid_class["meaning"]
                    + "."
                ),
                component="gpu",
                labels={"xid_class": xid_class["name"]},
            )
        )
    return alerts


def alert_definitions(config: dict) -> list[Alert]:
    """Every alert, in file order. Thresholds and durations come from `config`."""
    idle_severity = config["severity"]["allocated_idle"]
    exporter = [
        Alert(
            "GpuExporterDown",
            "gpu-defrag-exporter",
            "critical",
            "exporter_down",
            "up{%(E)s}",
            "== 0",
            "GPU exporter is down.",
            "Prometheus cannot scrape the GPU exporter {{ $labels.instance }}: its GPUs are "
            "unobserved, and their node-level GPU alerts are inhibited until it is back.",
            "exporter",
        ),
        Alert(
            "GpuExporterAbsent",
            "gpu-defrag-exporter",
            "critical",
            "exporter_absent",
            "up{%(E)s}",
            "",
            "No GPU exporter target is known to Prometheus.",
            "No target of the GPU exporter scrape job {{ $labels.job }} has existed for "
            "%(for_exporter_absent)s: "
            "check the DaemonSet and the ServiceMonitor (or the static scrape config).",
            "exporter",
            expr="absent(up{%(E)s})",
            absent=True,
        ),
        Alert(
            "GpuExporterBackendDown",
            "gpu-defrag-exporter",
            "critical",
            "backend_down",
            "gpu_exporter_backend_up{%(E)s}",
            "== 0",
            "GPU exporter cannot reach its backend.",
            "The exporter {{ $labels.instance }} fails to read its {{ $labels.backend }} "
            "backend (driver, DCGM or dcgm-exporter); GPU series from it are missing.",
            "exporter",
        ),
        Alert(
            "GpuExporterCollectionStale",
            "gpu-defrag-exporter",
            "warning",
            "collection_stale",
            "time() - gpu_exporter_last_success_timestamp_seconds{%(E)s}",
            "> %(collection_stale_s)s",
            "GPU exporter serves stale data.",
            "The last complete collection of {{ $labels.instance }} ({{ $labels.backend }}) "
            "was {{ $value | humanizeDuration }} ago.",
            "exporter",
        ),
        Alert(
            "GpuExporterCollectionSlow",
            "gpu-defrag-exporter",
            "warning",
            "collection_slow",
            "gpu_exporter_collection_duration_seconds{%(E)s}\n"
            "/ on (job, instance, backend)\n"
            "gpu_exporter_collection_interval_seconds{%(E)s}",
            "> 1",
            "GPU exporter collections take longer than their interval.",
            "Collections of {{ $labels.instance }} ({{ $labels.backend }}) take "
            '{{ $value | printf "%%.1f" }} times the collection interval: every page is older '
            "than the interval promises, and a slower cycle is abandoned at --collect.timeout.",
            "exporter",
        ),
    ]
    health = [
        Alert(
            "GpuLost",
            "gpu-defrag-health",
            "critical",
            "gpu_lost",
            "gpu_lost{%(E)s}",
            "== 1",
            "GPU fell off the bus.",
            "GPU {{ $labels.gpu }} on node {{ $labels.node }} is lost (NVML reports it gone); "
            "drain the node and reset or replace the GPU.",
            "gpu",
        ),
        Alert(
            "GpuUnhealthy",
            "gpu-defrag-health",
            "warning",
            "gpu_unhealthy",
            "gpu_healthy{%(E)s} unless on (" + GPU_LABELS + ") gpu_lost{%(E)s} == 1",
            "== 0",
            "GPU is unhealthy.",
            "GPU {{ $labels.gpu }} on node {{ $labels.node }} is not usable (fatal XID or "
            "row-remap failure); jobs placed on it will fail.",
            "gpu",
        ),
        Alert(
            "GpuRecoveryActionRequired",
            "gpu-defrag-health",
            "critical",
            "recovery_action",
            "gpu_recovery_action{%(E)s}",
            "> 0",
            "The driver asks for a GPU reset, a reboot or a drain.",
            "The driver recommends {{ if eq $value 1.0 }}a GPU reset{{ else if eq $value 2.0 }}"
            "a node reboot{{ else if eq $value 3.0 }}draining peer-to-peer traffic{{ else if eq "
            "$value 4.0 }}a drain and a GPU reset{{ else }}recovery action {{ $value }}{{ end }} "
            "for GPU {{ $labels.gpu }} on node {{ $labels.node }} (NVML's GPU recovery action): "
            "until then its jobs may fail or run degraded.",
            "gpu",
        ),
        Alert(
            "GpuMissing",
            "gpu-defrag-health",
            "warning",
            "gpu_missing",
            # `max by`: a series of the node that changed a label in the lookback (the exporter
            # pod's `pod` under a ServiceMonitor that keeps it, after a restart) still counts
            "max by (job, instance, node) "
            "(max_over_time(gpu_node_gpus{%(E)s}[%(gpu_missing_lookback)s]))\n"
            "- max by (job, instance, node) (gpu_node_gpus{%(E)s})",
            "> 0",
            "A node shows fewer GPUs than before.",
            "Node {{ $labels.node }} shows {{ $value }} GPU(s) fewer than within the last "
            "%(gpu_missing_lookback)s: a GPU is no longer enumerated by the driver.",
            "gpu",
        ),
        *_xid_alerts(config),
        Alert(
            "GpuEccUncorrectableErrors",
            "gpu-defrag-health",
            "critical",
            "0m",
            'increase(gpu_ecc_errors_total{%(E)s, error_type="uncorrected"}[%(ecc_window)s])',
            "> 0",
            "GPU memory has uncorrectable ECC errors.",
            'GPU {{ $labels.gpu }} on node {{ $labels.node }} counted {{ $value | printf "%%.0f" }} '
            "uncorrectable ECC error(s) in %(ecc_window)s; the running job's data may be corrupt.",
            "gpu",
        ),
        Alert(
            "GpuRowRemapFailure",
            "gpu-defrag-health",
            "critical",
            "0m",
            "gpu_remapped_rows_failure{%(E)s}",
            "== 1",
            "GPU row remapping failed.",
            "GPU {{ $labels.gpu }} on node {{ $labels.node }} could not remap a failing memory "
            "row; the GPU should be replaced.",
            "gpu",
        ),
        Alert(
            "GpuResetRequired",
            "gpu-defrag-health",
            "warning",
            "reset_required",
            "gpu_remapped_rows_pending{%(E)s} or gpu_retired_pages_pending{%(E)s}",
            "",
            "GPU waits for a reset to retire memory.",
            "GPU {{ $labels.gpu }} on node {{ $labels.node }} has a pending row remap or page "
            "retirement; reset it when its job ends.",
            "gpu",
            expr="(gpu_remapped_rows_pending{%(E)s} == 1)\nor\n(gpu_retired_pages_pending{%(E)s} == 1)",
        ),
        Alert(
            "GpuThermalThrottling",
            "gpu-defrag-health",
            "warning",
            "thermal_throttling",
            "max by (" + GPU_LABELS + ") (\n  gpu_clock_event_active{%(E)s, "
            'reason=~"hw_thermal_slowdown|sw_thermal_slowdown"}\n)',
            "== 1",
            "GPU clocks are held down by temperature.",
            "GPU {{ $labels.gpu }} on node {{ $labels.node }} has been thermally throttled for "
            "%(for_thermal_throttling)s; check cooling and airflow.",
            "gpu",
        ),
        Alert(
            "GpuPowerBrake",
            "gpu-defrag-health",
            "warning",
            "power_brake",
            "max by (" + GPU_LABELS + ") (\n  gpu_clock_event_active{%(E)s, "
            'reason=~"hw_power_brake_slowdown|hw_slowdown"}\n)',
            "",  # the condition is in `expr`, which leaves heat to GpuThermalThrottling
            "GPU clocks are held down by a hardware power brake.",
            "GPU {{ $labels.gpu }} on node {{ $labels.node }} has had a hardware slowdown or "
            "power brake for %(for_power_brake)s (power supply or board limit, not the software "
            "power cap).",
            "gpu",
            # the hw_slowdown bit is also set by heat: while a thermal reason is active it is
            # GpuThermalThrottling's, so a hot GPU does not page as a power problem too
            expr="max by (" + GPU_LABELS + ") (\n"
            '  gpu_clock_event_active{%(E)s, reason="hw_power_brake_slowdown"}\n'
            ") == 1\n"
            "or\n"
            "(\n"
            "  max by (" + GPU_LABELS + ") (\n"
            '    gpu_clock_event_active{%(E)s, reason="hw_slowdown"}\n'
            "  ) == 1\n"
            "  unless on (" + GPU_LABELS + ")\n"
            "  max by (" + GPU_LABELS + ") (\n"
            '    gpu_clock_event_active{%(E)s, reason=~"hw_thermal_slowdown|sw_thermal_slowdown"}\n'
            "  ) == 1\n"
            ")",
        ),
        Alert(
            "GpuTemperatureHigh",
            "gpu-defrag-health",
            "warning",
            "temperature_high",
            "gpu_temperature_celsius{%(E)s}",
            "> %(temperature_celsius)s",
            "GPU runs hot.",
            "GPU {{ $labels.gpu }} on node {{ $labels.node }} is at {{ $value }} °C "
            "(threshold %(temperature_celsius)s °C).",
            "gpu",
        ),
    ]
    # each GPU's peak utilization over the idle window; `max by`: a series of the GPU that
    # changed a label within it (the exporter pod's `pod` after a restart) joins as one
    held_peak = (
        "max by (" + GPU_LABELS + ") "
        "(max_over_time(gpu_utilization_ratio{%(E)s}[%(idle_window)s]))\n"
    )
    capacity = [
        Alert(
            "GpuAllocatedIdle",
            "gpu-defrag-capacity",
            idle_severity,
            "%(idle_window)s",
            # One series per allocation: the GPU's peak utilization over the window, with the
            # holder's labels. The `for` equal to the window means allocated for the window too.
            held_peak + "* on (" + GPU_LABELS + ") group_right ()\ngpu_allocation_info{%(E)s}",
            "",  # the condition is in `expr`, which adds the MIG instances
            "GPU is allocated but idle.",
            "GPU {{ $labels.gpu }} on node {{ $labels.node }} is held by "
            "{{ $labels.namespace }}/{{ $labels.pod }} (tenant {{ $labels.tenant }}) but its "
            "utilization (a MIG instance's: its engine, else SM activity) stayed at or below "
            "{{ $value | humanizePercentage }} for about 2 × %(idle_window)s (a window under the "
            "threshold, held for a window); reclaim it or ask the owner.",
            "gpu",
            # a MIG GPU has no utilization of its own: an allocation of a GPU instance is idle
            # by that instance's engine activity (dcgm-exporter's default counters, GPM), else
            # its SM activity, joined on gpu_instance_id
            expr="(\n"
            "  " + held_peak + "  * on (" + GPU_LABELS + ") group_right ()\n"
            '  gpu_allocation_info{%(E)s, gpu_instance_id=""}\n'
            ") < %(idle_utilization_ratio)s\n"
            "or\n"
            "(\n"
            "  (\n"
            "    max by (" + GPU_LABELS + ", gpu_instance_id) "
            "(max_over_time(gpu_mig_graphics_engine_active_ratio{%(E)s}[%(idle_window)s]))\n"
            "    or\n"
            "    max by (" + GPU_LABELS + ", gpu_instance_id) "
            "(max_over_time(gpu_mig_sm_active_ratio{%(E)s}[%(idle_window)s]))\n"
            "  )\n"
            "  * on (" + GPU_LABELS + ", gpu_instance_id) group_right ()\n"
            '  gpu_allocation_info{%(E)s, gpu_instance_id!=""}\n'
            ") < %(idle_utilization_ratio)s",
        ),
        Alert(
            "GpuFragmentationHigh",
            "gpu-defrag-capacity",
            "warning",
            "fragmentation_high",
            "gpu_advisor_fragmentation_ratio{%(A)s}",
            "",
            "GPU pool is fragmented.",
            "{{ $value | humanizePercentage }} of the free GPUs in pool {{ $labels.pool }} cannot "
            "be used by the arriving workload (FGD fragmentation rate); see the advisor's "
            "recommended migrations.",
            "advisor",
            expr="gpu_advisor_fragmentation_ratio{%(A)s} > %(fragmentation_ratio)s\n"
            "and on (job, instance, pool)\n"
            "gpu_advisor_free_gpus{%(A)s} >= %(fragmentation_min_free_gpus)s",
        ),
        Alert(
            "GpuJobShapeUnschedulable",
            "gpu-defrag-capacity",
            "warning",
            "shape_unschedulable",
            # the advisor names the cause per shape (advisor.pipeline.scheduler): a job never
            # spans pools, so the value is the free GPUs of the pool with the most
            "max by (job, instance, shape, cause) (gpu_advisor_shape_unschedulable{%(A)s})",
            "> 0",
            "A job shape cannot start although enough GPUs are free.",
            '{{ if eq $labels.cause "quota" }}Jobs of shape {{ $labels.shape }} wait although '
            "one pool has {{ $value }} GPUs free that would hold them: their tenant's quota is "
            "used up. See the advisor's borrow plan for them (/api/pending) or raise the quota."
            '{{ else if eq $labels.cause "rack_unknown" }}No job of shape {{ $labels.shape }} '
            "can start on known racks, although one pool has {{ $value }} GPUs free: no source "
            "knows the racks of the nodes they are on, so whether a multi-node job fits there "
            "is unknown, not scattered. Give the rack label (k8s:?rack-label=KEY) or Slurm's "
            "topology.conf so the advisor can count and plan it.{{ else }}No job of shape "
            "{{ $labels.shape }} can start without moving work, although one pool has "
            "{{ $value }} GPUs free: they are scattered across its nodes. Apply the advisor's "
            "top-ranked actions for this shape.{{ end }}",
            "advisor",
        ),
        *(
            Alert(
                "GpuForecastDemandExceedsCapacity",
                "gpu-defrag-capacity",
                severity,
                "forecast_exceeds_capacity",
                f'gpu_advisor_forecast_demand_gpus{{%(A)s, forecast_quantile="%({key})s"}}',
                "",
                "Forecast GPU demand reaches capacity.",
                "The %(" + key + ")s quantile of forecast demand in pool {{ $labels.pool }} at "
                "horizon {{ $labels.horizon }} is {{ $value }} GPUs, the pool's whole capacity: "
                "allocations cannot exceed it, so demand is forecast at or above it.",
                "advisor",
                # `>=`: the forecast of allocated GPUs is clipped to capacity, never above it
                expr=f'gpu_advisor_forecast_demand_gpus{{%(A)s, forecast_quantile="%({key})s"}}\n'
                ">= on (job, instance, pool) group_left ()\n"
                "gpu_advisor_forecast_capacity_gpus{%(A)s}",
            )
            for severity, key in (
                ("warning", "forecast_warning_quantile"),
                ("critical", "forecast_critical_quantile"),
            )
        ),
        Alert(
            "GpuForecastIntervalMiscalibrated",
            "gpu-defrag-capacity",
            "info",
            "forecast_miscalibrated",
            'gpu_advisor_forecast_backtest_coverage_ratio{%(A)s, forecast_quantile="'
            '%(forecast_warning_quantile)s"}\n'
            "* on (job, instance, pool, horizon, model) group_left ()\n"
            "gpu_advisor_forecast_model_info{%(A)s}",
            "",
            "Forecast interval under-covers its held-back hours.",
            "Only {{ $value | humanizePercentage }} of the held-back hours of pool "
            "{{ $labels.pool }} fell at or below the served model's %(forecast_warning_quantile)s "
            "quantile at horizon {{ $labels.horizon }} (nominal %(forecast_warning_quantile)s): "
            "GpuForecastDemandExceedsCapacity's warning for this pool may come late.",
            "advisor",
            expr='gpu_advisor_forecast_backtest_coverage_ratio{%(A)s, forecast_quantile="'
            '%(forecast_warning_quantile)s"}\n'
            "* on (job, instance, pool, horizon, model) group_left ()\n"
            "gpu_advisor_forecast_model_info{%(A)s}\n"
            "< %(forecast_coverage_min_ratio)s\n"
            # the hours that had an interval, not all held-back hours: a model without enough
            # errors at first serves no interval, and its coverage is measured on fewer hours
            "and on (job, instance, pool, horizon, model)\n"
            "gpu_advisor_forecast_backtest_coverage_origins{%(A)s}\n"
            ">= %(forecast_coverage_min_origins)s",
        ),
    ]
    advisor = [
        Alert(
            "GpuAdvisorDown",
            "gpu-defrag-advisor",
            "warning",
            "advisor_down",
            "up{%(A)s}",
            "== 0",
            "GPU defrag advisor is down.",
            "Prometheus cannot scrape the advisor {{ $labels.instance }}: fragmentation, "
            "forecast and recommendation panels and alerts have no data.",
            "advisor-service",
        ),
        Alert(
            "GpuAdvisorSourceDown",
            "gpu-defrag-advisor",
            "warning",
            "advisor_source_down",
            "gpu_advisor_source_up{%(A)s}",
            "== 0",
            "GPU defrag advisor cannot read a source.",
            "The advisor {{ $labels.instance }} fails to ingest from {{ $labels.source }}; its "
            "recommendations are based on old data.",
            "advisor-service",
        ),
        Alert(
            "GpuAdvisorStale",
            "gpu-defrag-advisor",
            "warning",
            "advisor_stale",
            # ingest or analysis failing (each run keeps the last good results): the source's own
            # alert says why when it is the ingest; an analysis failure has no other alert
            "time() - gpu_advisor_last_success_timestamp_seconds{%(A)s}",
            "> %(advisor_stale_s)s",
            "GPU defrag advisor serves old results.",
            "The last successful run of the advisor {{ $labels.instance }} was "
            "{{ $value | humanizeDuration }} ago: its fragmentation, forecast and recommendations "
            "are from then (GET /health says why).",
            "advisor-service",
        ),
        Alert(
            "GpuAdvisorStageFailing",
            "gpu-defrag-advisor",
            "warning",
            "advisor_stage_failing",
            # the forecast or plan stage keeps its previous answer marked stale while the run
            # itself succeeds, so only the stage's error count shows it
            'increase(gpu_advisor_run_errors_total{%(A)s, stage=~"forecast|plan"}'
            "[%(advisor_stage_window)s])",
            "> 0",
            "A GPU defrag advisor stage keeps failing.",
            "The {{ $labels.stage }} stage of the advisor {{ $labels.instance }} failed "
            '{{ $value | printf "%%.0f" }} time(s) in the last %(advisor_stage_window)s: it '
            "serves that stage's previous answer, marked stale, with the error (the advisor's "
            "log and its /api answer's `error` say what).",
            "advisor-service",
        ),
    ]
    return [*exporter, *health, *capacity, *advisor]


@dataclass(frozen=True, slots=True)
class Record:
    record: str
    expr: str


def record_definitions() -> list[Record]:
    """Recording rules (level:metric:operation), aggregating per node without the gpu label."""
    return [
        Record(
            "node:gpu_utilization_ratio:avg", "avg without (gpu) (gpu_utilization_ratio{%(E)s})"
        ),
        Record(
            "node:gpu_memory_used_bytes:sum", "sum without (gpu) (gpu_memory_used_bytes{%(E)s})"
        ),
        Record(
            "node:gpu_memory_total_bytes:sum", "sum without (gpu) (gpu_memory_total_bytes{%(E)s})"
        ),
        Record("node:gpu_power_watts:sum", "sum without (gpu) (gpu_power_watts{%(E)s})"),
        Record(
            "node:gpu_energy_joules:rate5m",
            "sum without (gpu) (rate(gpu_energy_joules_total{%(E)s}[5m]))",
        ),
        Record(
            "node:gpu_allocated:count",
            "count by (job, instance, node) (\n"
            "  count by (job, instance, node, gpu) (gpu_allocation_info{%(E)s})\n)",
        ),
    ]


def for_duration(alert: Alert, config: dict, values: dict) -> str:
    if alert.for_ in config["for"]:
        return str(config["for"][alert.for_])
    return alert.for_ % values


def alert_expr(alert: Alert, values: dict) -> str:
    if alert.expr:
        return alert.expr % values
    return f"{_wrap(alert.signal % values)} {alert.condition % values}"


def runbook_base(config: dict) -> str:
    """Where the runbook's pages are: `runbook_base`, else the advisor's external URL's
    /runbooks, which the advisor serves (one page per alert, from runbook.md)."""
    base = config.get("runbook_base") or f"{config['advisor_external_url'].rstrip('/')}/runbooks"
    return base.rstrip("/")


def runbook_url(config: dict, alert: str) -> str:
    return f"{runbook_base(config)}/{alert}"


def render_alerts(config: dict) -> dict:
    """The alerting rule file as a dict (Prometheus rule-file format)."""
    values = params(config)
    groups: dict[str, list[dict]] = {}
    for alert in alert_definitions(config):
        rule: dict = {"alert": alert.name, "expr": alert_expr(alert, values)}
        duration = for_duration(alert, config, values)
        if seconds(duration) > 0:
            rule["for"] = duration
        rule["labels"] = {"severity": alert.severity, "component": alert.component, **alert.labels}
        rule["annotations"] = {
            "summary": alert.summary % values,
            "description": alert.description % values,
            "runbook_url": runbook_url(config, alert.name),
        }
        groups.setdefault(alert.group, []).append(rule)
    return {"groups": [{"name": name, "rules": rules} for name, rules in groups.items()]}


def render_records(config: dict) -> dict:
    values = params(config)
    rules = [{"record": r.record, "expr": r.expr % values} for r in record_definitions()]
    return {"groups": [{"name": "gpu-defrag.rules", "rules": rules}]}


def signals(config: dict) -> list[tuple[str, str, bool]]:
    """(alert name, signal PromQL, absent) for every alert, for the live-Prometheus check."""
    values = params(config)
    return [(a.name, a.signal % values, a.absent) for a in alert_definitions(config)]


def prometheus_rule(config: dict) -> dict:
    """The same groups as a Prometheus Operator PrometheusRule. The overlay adds the label the
    Prometheus selects rules by (`release`) and sets the runbook URLs' base to the advisor's
    external URL of the cluster (deploy/overlays/kube-prometheus-stack/kustomization.yaml)."""
    groups = render_records(config)["groups"] + render_alerts(config)["groups"]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "gpu-defrag",
            "namespace": "gpu-defrag",
            "labels": {"app.kubernetes.io/name": "gpu-defrag"},
        },
        "spec": {"groups": groups},
    }


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str)

HEADER = "# Generated by `python -m alerts.generate` from alerts/config.yaml; do not edit.\n"
_RECEIVERS = (
    "# Generated by `python -m alerts.generate` from alerts/alertmanager.yml (routes, grouping,\n"
    "# inhibitions) and alerts/receivers.py (the receivers); do not edit.\n"
)
RECEIVERS_HEADER = _RECEIVERS + (
    "# The example config with receivers people use: PagerDuty pages (critical), e-mail to the\n"
    "# capacity planners (the advisor's warnings), a webhook for the team's ticket queue (other\n"
    "# warnings), Slack for context (info). Secrets are read from files (*_file), laid out as the\n"
    f"# Prometheus Operator mounts a Secret: {receivers.SECRET_DIR}/KEY.\n"
    "# Check: amtool check-config alerts/alertmanager-receivers.yml\n"
)
ALERTMANAGER_CONFIG_HEADER = _RECEIVERS + (
    "# The same routes and receivers for kube-prometheus-stack's Alertmanager, limited to\n"
    f"# gpu-defrag's alerts ({receivers.OWN_ALERTS}). The receivers read the Secret\n"
    f"# {receivers.SECRET} of this namespace (keys: {', '.join(receivers.SECRET_KEYS)}).\n"
    '# The Operator adds namespace="gpu-defrag" to the top route and to every inhibition unless\n'
    "# the Alertmanager's alertmanagerConfigMatcherStrategy is None; most GPU alerts carry no\n"
    "# namespace (or the namespace of the pod holding the GPU), so set it (docs/operations.md).\n"
)


def dump(document: dict, header: str = HEADER) -> str:
    return header + yaml.dump(
        document, Dumper=_Dumper, sort_keys=False, width=1_000_000, allow_unicode=True
    )


def outputs(config: dict) -> dict[Path, str]:
    source = receivers.load_source()
    return {
        ALERTS_FILE: dump(render_alerts(config)),
        RULES_FILE: dump(render_records(config)),
        OPERATOR_FILE: dump(prometheus_rule(config)),
        RECEIVERS_FILE: dump(receivers.raw_config(source), RECEIVERS_HEADER),
        ALERTMANAGER_CONFIG_FILE: dump(
            receivers.alertmanager_config(source), ALERTMANAGER_CONFIG_HEADER
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if outputs are out of date")
    args = parser.parse_args(argv)
    files = {
        str(path.relative_to(ROOT)): (path, text) for path, text in outputs(load_config()).items()
    }
    return sync_generated(files, "alerts", "python -m alerts.generate", args.check)


if __name__ == "__main__":
    sys.exit(main())
