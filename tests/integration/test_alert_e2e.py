"""End to end: sim exporter -> real Prometheus -> real Alertmanager -> webhook receiver.

The sim preset a100-16x8 starts with allocated-but-idle GPUs (notebooks and a stuck batch job)
and with 60 free GPUs of which only 4 nodes are whole. The real advisor (`gpu-defrag advise`)
reads the exporter's page and measures job shapes including 5x8 (40 GPUs on 5 whole nodes of a
rack), which cannot start although its pool has 60 GPUs free. The rules are the shipped ones rendered
with a short idle window and `for` (alerts/config.yaml overrides); the Alertmanager config is
the shipped example with its receivers pointed at this test's webhook and short group waits.
GpuAllocatedIdle must arrive at the GPU team's queue and GpuJobShapeUnschedulable at the
capacity planners', each with its labels and annotations, within a bound.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler

import pytest
import yaml

from alerts import generate
from alerts.config import load_config
from tests.integration import stack

pytestmark = pytest.mark.integration

IDLE_WINDOW = "4s"
# Alerts come ~15-20 s after the start on an idle machine (first scrape ~5 s, window + for 8 s,
# group_wait 1 s) and later on a busy one: the waits end when they come (stack.poll).
IDLE_GPU = ("a100-node-02", "3")  # preset a100-16x8: an idle notebook without a process
BUSY_GPU = ("a100-node-01", "0")  # preset a100-16x8: a training job
BIG_SHAPE = "5x8"  # 40 GPUs on 5 whole nodes of one rack: the preset has only 4 whole free nodes


class Webhook:
    """Collects Alertmanager webhook posts: (path, payload)."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, dict]] = []
        self.lock = threading.Lock()

    def handler(self) -> type[BaseHTTPRequestHandler]:
        webhook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with webhook.lock:
                    webhook.posts.append((self.path, json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *_args) -> None:
                pass

        return Handler

    def alerts(self, name: str) -> list[tuple[str, dict]]:
        with self.lock:
            return [
                (path, alert)
                for path, payload in self.posts
                for alert in payload["alerts"]
                if alert["labels"]["alertname"] == name and alert["status"] == "firing"
            ]


def alertmanager_config(webhook: str) -> dict:
    """The shipped example, receivers pointed at the test webhook, groups flushed quickly."""
    config = yaml.safe_load((stack.ROOT / "alerts" / "alertmanager.yml").read_text())
    for receiver in config["receivers"]:
        for hook in receiver["webhook_configs"]:
            hook["url"] = f"http://{webhook}/{receiver['name']}"
    config["route"].update(group_wait="1s", group_interval="2s")
    return config


def test_idle_gpu_and_unschedulable_shape_alerts_reach_their_receivers(tmp_path):
    procs = stack.Processes(tmp_path)
    webhook = Webhook()
    started = time.monotonic()
    try:
        with stack.http_server(webhook.handler()) as hook:
            am_config = tmp_path / "alertmanager.yml"
            am_config.write_text(yaml.safe_dump(alertmanager_config(hook)))
            amtool = stack.binary("amtool")
            checked = subprocess.run(
                [amtool, "check-config", str(am_config)], capture_output=True, text=True, timeout=60
            )
            assert checked.returncode == 0, checked.stdout + checked.stderr
            am_port = stack.free_port()
            procs.start(
                "alertmanager",
                [
                    stack.binary("prometheus-alertmanager"),
                    f"--config.file={am_config}",
                    f"--storage.path={tmp_path / 'am'}",
                    f"--web.listen-address=127.0.0.1:{am_port}",
                    "--cluster.listen-address=",
                ],
            )
            stack.poll(
                lambda: stack.http_get(f"http://127.0.0.1:{am_port}/-/ready"),
                stack.CAP_S,
                "Alertmanager",
                procs=procs,
            )
            rules = tmp_path / "alerts.yaml"
            fast = load_config(
                {"thresholds": {"idle_window": IDLE_WINDOW}, "for": {"shape_unschedulable": "2s"}}
            )
            rules.write_text(generate.dump(generate.render_alerts(fast)))
            exporter = stack.start_exporter(procs, "--idle.window", "2s")
            advisor = stack.start_advisor(
                procs, f"http://{exporter}/metrics", interval="2s", shapes=f"1,2,4,8,{BIG_SHAPE}"
            )
            prometheus = stack.start_prometheus(
                procs,
                {"gpu-exporter": exporter, "gpu-advisor": advisor},
                [rules],
                alertmanager=f"127.0.0.1:{am_port}",
                cluster="e2e",
            )

            def idle_gpu_alerted():
                procs.check_alive()
                seen = {
                    (a["labels"]["node"], a["labels"]["gpu"])
                    for _, a in webhook.alerts("GpuAllocatedIdle")
                }
                return IDLE_GPU in seen

            stack.poll(idle_gpu_alerted, stack.CAP_S, "GpuAllocatedIdle at the webhook")
            elapsed = time.monotonic() - started
            print(f"GpuAllocatedIdle for {IDLE_GPU} reached the webhook {elapsed:.1f}s after start")

            path, alert = next(
                (p, a)
                for p, a in webhook.alerts("GpuAllocatedIdle")
                if (a["labels"]["node"], a["labels"]["gpu"]) == IDLE_GPU
            )
            assert path == "/gpu-team-queue", "warnings on GPUs go to the team queue"
            labels = alert["labels"]
            assert labels["severity"] == "warning" and labels["component"] == "gpu"
            assert labels["cluster"] == "e2e" and labels["job"] == "gpu-exporter"
            assert labels["namespace"] == "rnd-llm" and labels["tenant"] == "rnd"
            assert labels["pod"], labels
            annotations = alert["annotations"]
            assert annotations["summary"] == "GPU is allocated but idle."
            assert (
                f"GPU 3 on node a100-node-02 is held by rnd-llm/{labels['pod']} (tenant rnd)"
                in annotations["description"]
            )
            assert f"for about 2 × {IDLE_WINDOW}" in annotations["description"]
            assert annotations["runbook_url"].endswith("/runbooks/GpuAllocatedIdle")

            # Every alerted GPU is one the exporter counts as allocated and idle; busy ones never.
            alerted = {
                (a["labels"]["node"], a["labels"]["gpu"])
                for _, a in webhook.alerts("GpuAllocatedIdle")
            }
            assert BUSY_GPU not in alerted
            idle_nodes = {
                r["metric"]["node"]
                for r in stack.query(prometheus, "gpu_node_allocated_idle_gpus > 0")
            }
            assert {node for node, _ in alerted} <= idle_nodes
            # Alertmanager grouped by cluster and node: one notification group per node.
            for _, payload in webhook.posts:
                if payload["groupLabels"].get("alertname") == "GpuAllocatedIdle":
                    assert set(payload["groupLabels"]) == {"alertname", "cluster", "node"}

            # The big-job case, from the real advisor's measurement of the same fleet.
            def shape_alerted():
                procs.check_alive()
                return [
                    (p, a)
                    for p, a in webhook.alerts("GpuJobShapeUnschedulable")
                    if a["labels"]["shape"] == BIG_SHAPE
                ]

            path, alert = stack.poll(shape_alerted, stack.CAP_S, "GpuJobShapeUnschedulable")[0]
            elapsed = time.monotonic() - started
            print(f"GpuJobShapeUnschedulable for {BIG_SHAPE} arrived {elapsed:.1f}s after start")
            assert path == "/capacity-planning", "advisor warnings go to the capacity planners"
            labels = alert["labels"]
            assert labels["severity"] == "warning" and labels["component"] == "advisor"
            assert labels["cluster"] == "e2e" and labels["job"] == "gpu-advisor"
            free = stack.query(prometheus, 'max(gpu_advisor_free_gpus{job="gpu-advisor"})')
            free_gpus = int(float(free[0]["value"][1]))
            assert free_gpus >= 40, "one pool's free GPUs would cover a 5x8 job"
            assert (
                f"No job of shape {BIG_SHAPE} can start without moving work, although one pool "
                f"has {free_gpus} GPUs free" in alert["annotations"]["description"]
            )
            assert alert["annotations"]["runbook_url"].endswith(
                "/runbooks/GpuJobShapeUnschedulable"
            )
            # shapes that fit somewhere never alert
            fitting = {a["labels"]["shape"] for _, a in webhook.alerts("GpuJobShapeUnschedulable")}
            assert fitting == {BIG_SHAPE}

            check_inhibitions(f"http://127.0.0.1:{am_port}")
    except BaseException:
        print(procs.logs())
        raise
    finally:
        procs.stop_all()


def check_inhibitions(alertmanager: str) -> None:
    """The shipped inhibit rules, on the real Alertmanager: exporter down silences its node, and
    an advisor whose source is down is not also paged as stale."""
    instance, other, advisor = "10.9.9.1:9835", "10.9.9.2:9835", "10.9.9.3:9836"
    base = {"cluster": "e2e", "job": "gpu-exporter"}
    alerts = [
        {
            "alertname": "GpuExporterDown",
            "severity": "critical",
            "component": "exporter",
            "instance": instance,
        },
        {
            "alertname": "GpuTemperatureHigh",
            "severity": "warning",
            "component": "gpu",
            "instance": instance,
            "node": "n1",
            "gpu": "0",
        },
        {
            "alertname": "GpuTemperatureHigh",
            "severity": "warning",
            "component": "gpu",
            "instance": other,
            "node": "n2",
            "gpu": "0",
        },
        {
            "alertname": "GpuAdvisorSourceDown",
            "severity": "warning",
            "component": "advisor-service",
            "instance": advisor,
            "source": "prometheus",
        },
        {
            "alertname": "GpuAdvisorStale",
            "severity": "warning",
            "component": "advisor-service",
            "instance": advisor,
        },
    ]
    body = json.dumps([{"labels": {**base, **labels}} for labels in alerts]).encode()
    request = urllib.request.Request(
        f"{alertmanager}/api/v2/alerts",
        data=body,
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    urllib.request.urlopen(request, timeout=10).close()

    def states():
        listed = json.loads(
            stack.http_get(f"{alertmanager}/api/v2/alerts?filter=cluster%3D%22e2e%22")
        )
        found = {
            (a["labels"]["alertname"], a["labels"].get("instance")): a["status"]
            for a in listed
            if a["labels"].get("instance") in {instance, other, advisor}
        }
        if len(found) < 5:
            return None
        # The inhibitor learns of source alerts asynchronously: wait until it has applied the
        # rules to the targets, then check that they silenced exactly those.
        targets = (found[("GpuTemperatureHigh", instance)], found[("GpuAdvisorStale", advisor)])
        return found if all(t["state"] == "suppressed" for t in targets) else None

    found = stack.poll(
        states, stack.CAP_S, "the injected alerts in Alertmanager, the target suppressed"
    )
    assert found[("GpuExporterDown", instance)]["inhibitedBy"] == []
    assert found[("GpuTemperatureHigh", instance)]["state"] == "suppressed"
    assert found[("GpuTemperatureHigh", instance)]["inhibitedBy"]
    assert found[("GpuTemperatureHigh", other)]["inhibitedBy"] == [], "other nodes still alert"
    assert found[("GpuAdvisorSourceDown", advisor)]["inhibitedBy"] == []
    assert found[("GpuAdvisorStale", advisor)]["inhibitedBy"]
