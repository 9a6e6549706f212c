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


# --------------------------------------------------------------------------- receiver examples

RECEIVERS = ROOT / "alerts" / "alertmanager-receivers.yml"
OPERATOR_CONFIG = (
    ROOT / "deploy" / "components" / "alertmanager-receivers" / "alertmanagerconfig.yaml"
)
EXPECTED_KINDS = {
    "gpu-oncall-pager": "pagerduty_configs",
    "capacity-planning": "email_configs",
    "gpu-team-queue": "webhook_configs",
    "gpu-team-chat": "slack_configs",
}


def expected_receiver(labels: dict[str, str]) -> str:
    expected = {"critical": "gpu-oncall-pager", "info": "gpu-team-chat"}
    receiver = expected.get(labels["severity"])
    if receiver is None:
        receiver = "capacity-planning" if labels["component"] == "advisor" else "gpu-team-queue"
    return receiver


def routes_test(config: Path, receiver: str, labels: dict[str, str]) -> None:
    pairs = [f"{k}={v}" for k, v in labels.items()]
    result = amtool(
        "config",
        "routes",
        "test",
        f"--config.file={config}",
        f"--verify.receivers={receiver}",
        *pairs,
    )
    assert result.returncode == 0, (labels, result.stdout + result.stderr)


def test_the_receiver_examples_pass_amtool_and_route_every_alert_by_severity():
    result = amtool("check-config", str(RECEIVERS))
    assert result.returncode == 0, result.stdout + result.stderr
    config = yaml.safe_load(RECEIVERS.read_text())
    kinds = {r["name"]: next(k for k in r if k.endswith("_configs")) for r in config["receivers"]}
    assert kinds == EXPECTED_KINDS
    source = yaml.safe_load(CONFIG.read_text())
    assert config["route"] == source["route"] and config["inhibit_rules"] == source["inhibit_rules"]
    for labels in alert_labels():
        routes_test(RECEIVERS, expected_receiver(labels), labels)


def _matcher(m: dict[str, str]) -> str:
    value = m["value"].replace("\\", "\\\\").replace('"', '\\"')
    return f'{m["name"]}{m.get("matchType", "=")}"{value}"'


def _raw_route(route: dict) -> dict:
    """An AlertmanagerConfig route as the Alertmanager config the Operator makes of it."""
    keys = {"groupBy": "group_by", "groupWait": "group_wait", "groupInterval": "group_interval"}
    keys |= {"repeatInterval": "repeat_interval", "receiver": "receiver", "continue": "continue"}
    out = {keys[k]: v for k, v in route.items() if k in keys}
    if "matchers" in route:
        out["matchers"] = [_matcher(m) for m in route["matchers"]]
    if "routes" in route:
        out["routes"] = [_raw_route(r) for r in route["routes"]]
    return out


def test_the_alertmanager_config_routes_our_alerts_as_the_raw_config_and_no_others(tmp_path):
    """The AlertmanagerConfig nested under another team's top route, as the Operator merges it
    into kube-prometheus-stack's Alertmanager: amtool checks it and routes every shipped alert
    to the receiver of its severity, and another team's alert to that team's receiver."""
    document = yaml.safe_load(OPERATOR_CONFIG.read_text())
    assert document["apiVersion"] == "monitoring.coreos.com/v1alpha1"
    assert document["kind"] == "AlertmanagerConfig"
    spec = document["spec"]
    raw = yaml.safe_load(RECEIVERS.read_text())
    crd_kinds = {r["name"]: next(k for k in r if k != "name") for r in spec["receivers"]}
    assert {name: kind.replace("Configs", "_configs") for name, kind in crd_kinds.items()} == (
        EXPECTED_KINDS
    )
    merged = {
        "route": {
            "receiver": "other-team",
            "routes": [{**_raw_route(spec["route"]), "continue": False}],
        },
        "receivers": [{"name": "other-team"}, *raw["receivers"]],
        "inhibit_rules": [
            {
                "source_matchers": [_matcher(m) for m in rule["sourceMatch"]],
                "target_matchers": [_matcher(m) for m in rule["targetMatch"]],
                "equal": rule["equal"],
            }
            for rule in spec["inhibitRules"]
        ],
    }
    config = tmp_path / "alertmanager.yml"
    config.write_text(yaml.safe_dump(merged, sort_keys=False))
    result = amtool("check-config", str(config))
    assert result.returncode == 0, result.stdout + result.stderr
    for labels in alert_labels():
        routes_test(config, expected_receiver(labels), labels)
    routes_test(config, "other-team", {"alertname": "KubePodCrashLooping", "severity": "critical"})
    assert len(spec["inhibitRules"]) == len(raw["inhibit_rules"])
    for rule in spec["inhibitRules"]:  # an inhibition never silences another team's alert
        assert {"name": "alertname", "value": "Gpu.+", "matchType": "=~"} in rule["targetMatch"]


def test_a_source_the_conversion_does_not_know_is_refused_by_its_path():
    from alerts import receivers

    source = yaml.safe_load(CONFIG.read_text())
    source["route"]["routes"][0]["mute_time_intervals"] = ["weekends"]
    with pytest.raises(
        ValueError, match=r"route\.routes\[0\]\.mute_time_intervals: this key is not converted"
    ):
        receivers.alertmanager_config(source)
    source = yaml.safe_load(CONFIG.read_text())
    source["receivers"].append({"name": "ops-sms"})
    with pytest.raises(ValueError, match="receiver 'ops-sms' has no example"):
        receivers.raw_config(source)
    with pytest.raises(ValueError, match="is not name<op>"):
        receivers.matcher("severity=critical")
