"""ADVISOR STAND-IN: a static /metrics page rendered from advisor/contract.py.

Scraped beside the real advisor service (job gpu-advisor-standin) so that every contract metric
has a series, including those the real advisor emits only in some states (recommended actions
with cost and benefit, idle power): the dashboards' $advisor variable sees both jobs, the alert
rules select job="gpu-advisor" only. Names, types, help and label names come from the contract;
the label values and numbers below are plausible for the sim preset a100-16x8 (16 nodes × 8
A100, 60 free GPUs, only 4 whole free nodes). Its build_info version ends in "standin".
"""

from __future__ import annotations

import itertools
import time
from http.server import BaseHTTPRequestHandler

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from advisor.contract import ADVISOR_METRICS, GPU_STATE_CODES
from exporter.contract import MetricSpec

POOL = "a100"
NODES = [f"a100-node-{i:02d}" for i in range(1, 17)]
SHAPES = {"1": 1, "2": 2, "4": 4, "8": 8, "2x8": 16}  # shape -> GPUs


def _gpu_state(node: int, gpu: int) -> int:
    if node >= 8 and node < 12:
        return GPU_STATE_CODES["free"]
    if (node, gpu) in {(1, 3), (3, 6), (3, 7), (5, 4), (5, 5)}:
        return GPU_STATE_CODES["allocated_idle"]
    if (node, gpu) == (6, 2):
        return GPU_STATE_CODES["unhealthy"]
    if (node, gpu) == (7, 0):
        return GPU_STATE_CODES["owner_unknown"]
    return GPU_STATE_CODES["busy"] if (node + gpu) % 3 else GPU_STATE_CODES["free"]


ACTIONS = [
    (
        "1",
        "job=8",
        "migrate",
        "train-1a2b",
        "rnd",
        "a100-node-02:0-1",
        "a100-node-01:3-4",
        "free a100-node-02 for an 8-GPU job",
    ),
    (
        "2",
        "reclaim",
        "reclaim_idle",
        "nb-7f9c",
        "rnd",
        "a100-node-04:6-7",
        "",
        "reclaim 2 idle notebook GPUs",
    ),
    ("3", "job=8", "reserve", "", "", "a100-node-09", "", "hold a100-node-09 for shape 8"),
]

# metric name -> list of (label values in contract order, value)
SAMPLES: dict[str, list[tuple[tuple[str, ...], float]]] = {
    "gpu_advisor_fragmentation_ratio": [((POOL,), 0.62)],
    "gpu_advisor_fragmented_gpus": [((POOL,), 37.0)],
    "gpu_advisor_free_gpus": [((POOL,), 60.0)],
    "gpu_advisor_gpus": [((POOL,), 127.0)],
    "gpu_advisor_allocated_gpus": [((POOL,), 96.5)],
    "gpu_advisor_shape_gpus": [((s,), float(g)) for s, g in SHAPES.items()],
    "gpu_advisor_schedulable_jobs": [
        ((POOL, "1"), 60.0),
        ((POOL, "2"), 26.0),
        ((POOL, "4"), 8.0),
        ((POOL, "8"), 4.0),
        ((POOL, "2x8"), 0.0),
    ],
    "gpu_advisor_stranded_gpus": [
        ((POOL, "1"), 0.0),
        ((POOL, "2"), 8.0),
        ((POOL, "4"), 28.0),
        ((POOL, "8"), 28.0),
        ((POOL, "2x8"), 60.0),
    ],
    "gpu_advisor_largest_schedulable_job_gpus": [((), 8.0)],
    "gpu_advisor_nodes_rack_unknown": [((POOL,), 0.0)],
    "gpu_advisor_schedulable_jobs_if_racks_allow": [((POOL, "2x8"), 2.0)],
    "gpu_advisor_shape_unschedulable": [(("2x8", "scattered"), 60.0)],
    "gpu_advisor_pending_jobs": [(("rnd",), 2.0)],
    "gpu_advisor_pending_gpus": [(("rnd",), 24.0)],
    "gpu_advisor_scheduler_stale": [(("exporter",), 0.0)],
    "gpu_advisor_node_fragmented_gpus": [
        ((node, POOL), float(i % 4)) for i, node in enumerate(NODES)
    ],
    "gpu_advisor_gpu_state": [
        ((node, str(gpu), POOL), float(_gpu_state(n, gpu)))
        for (n, node), gpu in itertools.product(enumerate(NODES), range(8))
    ],
    "gpu_advisor_allocated_idle_gpus": [((POOL,), 5.0)],
    "gpu_advisor_owner_unknown_gpus": [((POOL,), 1.0)],
    "gpu_advisor_allocated_idle_power_watts": [((POOL,), 310.0)],
    "gpu_advisor_idle_capacity_gpus": [(("A100-SXM4-80GB",), 65.0)],
    "gpu_advisor_demand_gpus": [(("A100-SXM4-80GB",), 84.0)],
    "gpu_advisor_stranded_memory_bytes": [((POOL,), 212.0 * 2**30)],
    "gpu_advisor_forecast_demand_gpus": [
        ((POOL, "24h", "0.1"), 70.0),
        ((POOL, "24h", "0.5"), 88.0),
        ((POOL, "24h", "0.9"), 131.0),
    ],
    "gpu_advisor_forecast_capacity_gpus": [((POOL,), 128.0)],
    "gpu_advisor_forecast_model_info": [((POOL, "24h", "gbm"), 1.0)],
    "gpu_advisor_forecast_backtest_origins": [((POOL, "24h"), 156.0)],
    "gpu_advisor_forecast_backtest_wape_ratio": [
        ((POOL, "24h", "gbm"), 0.11),
        ((POOL, "24h", "seasonal_naive"), 0.19),
    ],
    "gpu_advisor_forecast_backtest_coverage_ratio": [
        ((POOL, "24h", "gbm", "0.1"), 0.12),
        ((POOL, "24h", "gbm", "0.9"), 0.87),
        ((POOL, "24h", "seasonal_naive", "0.9"), 0.93),
    ],
    "gpu_advisor_forecast_backtest_coverage_origins": [
        ((POOL, "24h", "gbm"), 150.0),
        ((POOL, "24h", "seasonal_naive"), 156.0),
    ],
    "gpu_advisor_forecast_tenant_demand_gpus": [
        (("rnd", "24h", "0.1"), 40.0),
        (("rnd", "24h", "0.5"), 52.0),
        (("rnd", "24h", "0.9"), 70.0),
    ],
    "gpu_advisor_forecast_tenant_quota_gpus": [(("rnd",), 64.0)],
    "gpu_advisor_forecast_tenant_backtest_wape_ratio": [
        (("rnd", "24h", "holt_winters"), 0.14),
        (("rnd", "24h", "seasonal_naive_24"), 0.22),
    ],
    "gpu_advisor_forecast_tenant_backtest_coverage_ratio": [
        (("rnd", "24h", "holt_winters", "0.1"), 0.08),
        (("rnd", "24h", "holt_winters", "0.9"), 0.91),
    ],
    "gpu_advisor_forecast_tenant_backtest_coverage_origins": [
        (("rnd", "24h", "holt_winters"), 140.0),
    ],
    "gpu_advisor_forecast_idle_gpus": [((POOL, "1h"), 30.0), ((POOL, "8h"), 12.0)],
    "gpu_advisor_forecast_idle_backtest_violation_ratio": [
        ((POOL, "1h", "advisor"), 0.04),
        ((POOL, "1h", "min_past_w"), 0.35),
    ],
    "gpu_advisor_forecast_idle_backtest_capture_ratio": [
        ((POOL, "1h", "advisor"), 0.62),
        ((POOL, "1h", "min_past_w"), 0.91),
    ],
    "gpu_advisor_recommended_actions": [
        (("migrate",), 3.0),
        (("reclaim_idle",), 2.0),
        (("reserve",), 1.0),
    ],
    "gpu_advisor_action_info": [(row, 1.0) for row in ACTIONS],
    "gpu_advisor_action_cost_gpu_seconds": [(("1",), 1800.0), (("2",), 0.0), (("3",), 28800.0)],
    "gpu_advisor_action_benefit_gpus": [(("1",), 8.0), (("2",), 2.0), (("3",), 8.0)],
    "gpu_advisor_job_end_finished_jobs": [((), 412.0)],
    "gpu_advisor_job_end_running_jobs": [(("learned",), 37.0), (("fallback",), 5.0)],
    "gpu_advisor_build_info": [(("0.1.0-standin",), 1.0)],
    "gpu_advisor_source_up": [(("exporter",), 1.0)],
    "gpu_advisor_source_left_out_targets": [(("exporter",), 1.0)],
    "gpu_advisor_last_success_timestamp_seconds": [((), 0.0)],  # set at render time
    "gpu_advisor_run_duration_seconds": [((), 0.8)],
    "gpu_advisor_runs_total": [((), 42.0)],
    "gpu_advisor_run_errors_total": [(("ingest",), 0.0)],
}


def _family(spec: MetricSpec, rows, now: float):
    if spec.kind == "info":
        family = InfoMetricFamily(spec.family, spec.help, labels=[])
        for labels, _ in rows:
            family.add_metric([], dict(zip(spec.labels, labels, strict=True)))
        return family
    cls = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
    family = cls(spec.family, spec.help, labels=list(spec.labels))
    for labels, value in rows:
        if spec.name == "gpu_advisor_last_success_timestamp_seconds":
            value = now - 5
        family.add_metric(list(labels), value)
    return family


class _Collector:
    def __init__(self, clock) -> None:
        self.clock = clock

    def collect(self):
        missing = {spec.name for spec in ADVISOR_METRICS} - set(SAMPLES)
        assert not missing, f"advisor stand-in lacks rows for contract metrics {missing}"
        now = self.clock()
        return [_family(spec, SAMPLES[spec.name], now) for spec in ADVISOR_METRICS]

    def describe(self):
        return []


def render(now: float) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(lambda: now))
    return generate_latest(registry)


class StandinHandler(BaseHTTPRequestHandler):
    """Serves the stand-in page on /metrics; its build_info version says `standin`."""

    def do_GET(self) -> None:
        if self.path != "/metrics":
            self.send_error(404)
            return
        body = render(time.time())
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE_LATEST)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args) -> None:
        pass
