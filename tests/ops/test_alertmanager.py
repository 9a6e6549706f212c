"""The example Alertmanager config: amtool check-config, the routing tree, the inhibitions."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "alerts" / "alertmanager.yml"


def amtool(*args: str) -> subprocess.CompletedProcess:
    path = shutil.which("amtool")
    if path is None:
        pytest.fail(
            "amtool is missing: apt-get install --no-install-recommends prometheus-alertmanager"
        )
    return subprocess.run([path, *args], capture_output=True, text=True, timeout=60)


def alert_labels() -> list[dict[str, str]]:
    rules = yaml.safe_load((ROOT / "alerts" / "prometheus_alerts.yaml").read_text())
    return [
        {"alertname": r["alert"], **r["labels"]}
        for g in rules["groups"]
        for r in g["rules"]
        if "alert" in r
    ]


def test_amtool_check_config_passes():
    result = amtool("check-config", str(CONFIG))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        ({"alertname": "GpuLost", "severity": "critical", "component": "gpu"}, "gpu-oncall-pager"),
        (
            {"alertname": "GpuForecastDemandExceedsCapacity", "severity": "critical"},
            "gpu-oncall-pager",
        ),
        (
            {
                "alertname": "GpuJobShapeUnschedulable",
                "severity": "warning",
                "component": "advisor",
            },
            "capacity-planning",
        ),
        (
            {"alertname": "GpuAllocatedIdle", "severity": "warning", "component": "gpu"},
            "gpu-team-queue",
        ),
        (
            {"alertname": "GpuAdvisorStale", "severity": "warning", "component": "advisor-service"},
            "gpu-team-queue",
        ),
        ({"alertname": "GpuXidApplicationError", "severity": "info"}, "gpu-team-chat"),
        ({"alertname": "SomethingElse"}, "gpu-team-queue"),
    ],
)
def test_routes_by_severity_and_component(labels, receiver):
    pairs = [f"{k}={v}" for k, v in labels.items()]
    result = amtool(
        "config",
        "routes",
        "test",
        f"--config.file={CONFIG}",
        f"--verify.receivers={receiver}",
        *pairs,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_routes_test_fails_on_a_wrong_receiver():
    result = amtool(
        "config",
        "routes",
        "test",
        f"--config.file={CONFIG}",
        "--verify.receivers=gpu-team-chat",
        "severity=critical",
    )
    assert result.returncode != 0


def test_every_shipped_alert_reaches_the_receiver_of_its_severity():
    expected = {"critical": "gpu-oncall-pager", "info": "gpu-team-chat"}
    for labels in alert_labels():
        receiver = expected.get(labels["severity"])
        if receiver is None:
            receiver = "capacity-planning" if labels["component"] == "advisor" else "gpu-team-queue"
        pairs = [f"{k}={v}" for k, v in labels.items()]
        result = amtool(
            "config",
            "routes",
            "test",
            f"--config.file={CONFIG}",
            f"--verify.receivers={receiver}",
            *pairs,
        )
        assert result.returncode == 0, (labels, result.stdout + result.stderr)


def test_groups_by_cluster_and_node_and_inhibits_node_alerts_when_the_exporter_is_down():
    config = yaml.safe_load(CONFIG.read_text())
    assert {"cluster", "node"} <= set(config["route"]["group_by"])
    inhibit = config["inhibit_rules"]
    exporter_down = next(
        r for r in inhibit if r["source_matchers"] == ['alertname="GpuExporterDown"']
    )
    assert exporter_down["target_matchers"] == ['component="gpu"']
    assert set(exporter_down["equal"]) == {"cluster", "instance"}
    # the inhibited alerts really carry that label, and the source alert does not
    components = {labels["alertname"]: labels["component"] for labels in alert_labels()}
    assert components["GpuExporterDown"] != "gpu"
    node_level = {name for name, component in components.items() if component == "gpu"}
    assert {
        "GpuLost",
        "GpuAllocatedIdle",
        "GpuXidHardwareError",
        "GpuTemperatureHigh",
    } <= node_level
