"""Alertmanager receivers people use (PagerDuty, e-mail, Slack, a webhook) on the routes of the
example config, in both forms an Alertmanager is configured in:

- `alerts/alertmanager-receivers.yml`: a whole Alertmanager config (a dedicated Alertmanager);
- `deploy/components/alertmanager-receivers/alertmanagerconfig.yaml`: a Prometheus Operator
  `AlertmanagerConfig` (monitoring.coreos.com/v1alpha1), merged into kube-prometheus-stack's
  Alertmanager.

Routes, grouping and inhibitions are read from `alerts/alertmanager.yml`, the one hand-written
config (compose.yaml runs it with webhooks): only the receivers differ, one kind per receiver
(`EXAMPLES`). `python -m alerts.generate` writes both files; tests/ops/test_alertmanager.py runs
`amtool check-config` and `amtool config routes test` on each.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
SOURCE_FILE = ROOT / "alerts" / "alertmanager.yml"
NAMESPACE = "gpu-defrag"
NAME = "gpu-defrag"
# The Secret the AlertmanagerConfig's receivers read (its namespace's), and where the Operator
# mounts an Alertmanager's `secrets:` (the raw config's *_file paths follow that layout).
SECRET = "gpu-defrag-alertmanager-receivers"
SECRET_DIR = f"/etc/alertmanager/secrets/{SECRET}"
# Only gpu-defrag's alerts, in an Alertmanager that other teams' alerts reach too (every alert
# here is named Gpu<Something>: tests/ops/test_rules.py).
OWN_ALERTS = 'alertname=~"Gpu.+"'

SLACK_TEXT = (
    "{{ range .Alerts }}*{{ .Labels.alertname }}* {{ .Annotations.summary }}\n"
    "{{ .Annotations.description }}\n<{{ .Annotations.runbook_url }}|Runbook>\n{{ end }}"
)

# receiver name -> (kind, the raw Alertmanager config of that kind, the AlertmanagerConfig's)
EXAMPLES: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "gpu-oncall-pager": (
        "pagerduty",
        {
            "routing_key_file": f"{SECRET_DIR}/pagerduty-routing-key",
            "severity": "{{ .CommonLabels.severity }}",
            "send_resolved": True,
        },
        {
            "routingKey": {"name": SECRET, "key": "pagerduty-routing-key"},
            "severity": "{{ .CommonLabels.severity }}",
            "sendResolved": True,
        },
    ),
    "gpu-team-queue": (
        "webhook",
        {"url": "http://alert-gateway.example:9095/tickets", "send_resolved": True},
        {"url": "http://alert-gateway.example:9095/tickets", "sendResolved": True},
    ),
    "capacity-planning": (
        "email",
        {
            "to": "capacity-planning@example.com",
            "from": "gpu-alerts@example.com",
            "smarthost": "smtp.example.com:587",
            "auth_username": "gpu-alerts@example.com",
            "auth_password_file": f"{SECRET_DIR}/smtp-password",
            "send_resolved": False,
        },
        {
            "to": "capacity-planning@example.com",
            "from": "gpu-alerts@example.com",
            "smarthost": "smtp.example.com:587",
            "authUsername": "gpu-alerts@example.com",
            "authPassword": {"name": SECRET, "key": "smtp-password"},
            "sendResolved": False,
        },
    ),
    "gpu-team-chat": (
        "slack",
        {
            "api_url_file": f"{SECRET_DIR}/slack-api-url",
            "channel": "#gpu-alerts",
            "title": "{{ .CommonLabels.alertname }} ({{ .Status }})",
            "text": SLACK_TEXT,
            "send_resolved": False,
        },
        {
            "apiURL": {"name": SECRET, "key": "slack-api-url"},
            "channel": "#gpu-alerts",
            "title": "{{ .CommonLabels.alertname }} ({{ .Status }})",
            "text": SLACK_TEXT,
            "sendResolved": False,
        },
    ),
}
RAW_KEY = {"pagerduty": "pagerduty_configs", "webhook": "webhook_configs", "email": "email_configs"}
RAW_KEY["slack"] = "slack_configs"
CRD_KEY = {"pagerduty": "pagerdutyConfigs", "webhook": "webhookConfigs", "email": "emailConfigs"}
CRD_KEY["slack"] = "slackConfigs"
# The secret keys the examples read, for the Secret the AlertmanagerConfig needs.
SECRET_KEYS = ("pagerduty-routing-key", "slack-api-url", "smtp-password")

_MATCHER = re.compile(r'^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*$')
# route keys of the raw config -> the AlertmanagerConfig's (matchers are converted on their own)
_ROUTE_KEYS = {
    "receiver": "receiver",
    "group_by": "groupBy",
    "group_wait": "groupWait",
    "group_interval": "groupInterval",
    "repeat_interval": "repeatInterval",
    "continue": "continue",
}


def load_source(path: Path = SOURCE_FILE) -> dict:
    return yaml.safe_load(path.read_text())


def _example(name: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
    try:
        return EXAMPLES[name]
    except KeyError:
        raise ValueError(
            f"alerts/alertmanager.yml: receiver {name!r} has no example in alerts/receivers.py"
        ) from None


def raw_config(source: dict) -> dict:
    """The source config with each receiver replaced by its example of another kind."""
    config = copy.deepcopy(source)
    config["receivers"] = []
    for receiver in source["receivers"]:
        kind, raw, _ = _example(receiver["name"])
        config["receivers"].append({"name": receiver["name"], RAW_KEY[kind]: [dict(raw)]})
    return config


def matcher(text: str) -> dict[str, str]:
    """`severity="critical"` -> the AlertmanagerConfig's {name, value, matchType}."""
    found = _MATCHER.match(text)
    if found is None:
        raise ValueError(f'alerts/alertmanager.yml: matcher {text!r} is not name<op>"value"')
    name, operator, value = found.groups()
    return {"name": name, "value": value.replace('\\"', '"'), "matchType": operator}


def _route(route: dict, path: str, extra_matchers: tuple[str, ...] = ()) -> dict:
    out: dict[str, Any] = {}
    for key, value in route.items():
        if key in _ROUTE_KEYS:
            out[_ROUTE_KEYS[key]] = copy.deepcopy(value)
        elif key not in ("matchers", "routes"):
            raise ValueError(f"alerts/alertmanager.yml: {path}.{key}: this key is not converted")
    matchers = [*extra_matchers, *route.get("matchers", [])]
    if matchers:
        out["matchers"] = [matcher(m) for m in matchers]
    if route.get("routes"):
        out["routes"] = [
            _route(child, f"{path}.routes[{i}]") for i, child in enumerate(route["routes"])
        ]
    return out


def alertmanager_config(source: dict) -> dict:
    """The source's routes, inhibitions and the example receivers as an AlertmanagerConfig. The
    top route and every inhibition are limited to gpu-defrag's alerts (OWN_ALERTS): merged into
    an Alertmanager that other alerts reach, the config takes none of theirs."""
    route = _route(source["route"], "route", (OWN_ALERTS,))
    receivers = []
    for receiver in source["receivers"]:
        kind, _, crd = _example(receiver["name"])
        receivers.append({"name": receiver["name"], CRD_KEY[kind]: [dict(crd)]})
    inhibit = [
        {
            "sourceMatch": [matcher(m) for m in (OWN_ALERTS, *rule["source_matchers"])],
            "targetMatch": [matcher(m) for m in (OWN_ALERTS, *rule["target_matchers"])],
            "equal": list(rule["equal"]),
        }
        for rule in source.get("inhibit_rules", [])
    ]
    return {
        "apiVersion": "monitoring.coreos.com/v1alpha1",
        "kind": "AlertmanagerConfig",
        "metadata": {
            "name": NAME,
            "namespace": NAMESPACE,
            "labels": {"app.kubernetes.io/name": "gpu-defrag"},
        },
        "spec": {"route": route, "receivers": receivers, "inhibitRules": inhibit},
    }
