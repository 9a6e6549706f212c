"""Alerting and recording rules: generated output, promtool checks and unit tests, conventions."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from advisor.service import runbooks
from alerts import generate
from alerts.config import load_config, seconds
from tests.ops.promql import contract_names, metric_names, unknown_matcher_labels

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "alerts"
TESTS = ALERTS / "tests"
SEVERITIES = {"critical", "warning", "info"}


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is missing: apt-get install --no-install-recommends prometheus")
    return path


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=cwd)


def alert_rules(document: dict) -> list[dict]:
    return [r for g in document["groups"] for r in g["rules"] if "alert" in r]


def test_committed_outputs_match_the_config():
    for path, text in generate.outputs(load_config()).items():
        assert path.read_text() == text, f"{path} is stale: run `python -m alerts.generate`"


def test_promtool_check_rules_accepts_every_rule_file(tmp_path):
    operator = yaml.safe_load(
        (ROOT / "deploy/overlays/kube-prometheus-stack/prometheusrule.yaml").read_text()
    )
    spec = tmp_path / "prometheusrule-spec.yaml"
    spec.write_text(yaml.safe_dump(operator["spec"]))
    files = [ALERTS / "prometheus_alerts.yaml", ALERTS / "prometheus_rules.yaml", spec]
    result = run(promtool(), "check", "rules", *map(str, files))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == 3


def test_promtool_unit_tests_pass():
    tests = sorted(TESTS.glob("*_test.yaml"))
    assert len(tests) == 2
    result = run(promtool(), "test", "rules", *map(str, tests))
    assert result.returncode == 0, result.stdout + result.stderr


def test_unit_tests_catch_a_changed_threshold(tmp_path):
    """The promtool tests fail when a rule's threshold moves: they are not vacuous."""
    config = load_config({"thresholds": {"temperature_celsius": 95, "idle_window": "2h"}})
    (tmp_path / "prometheus_alerts.yaml").write_text(generate.dump(generate.render_alerts(config)))
    (tmp_path / "tests").mkdir()
    shutil.copy(TESTS / "alerts_test.yaml", tmp_path / "tests")
    result = run(promtool(), "test", "rules", "tests/alerts_test.yaml", cwd=tmp_path)
    assert result.returncode != 0
    assert "GpuTemperatureHigh" in result.stderr + result.stdout
    assert "GpuAllocatedIdle" in result.stderr + result.stdout


def test_every_alert_and_severity_is_tested_firing_and_quiet():
    rules = alert_rules(yaml.safe_load((ALERTS / "prometheus_alerts.yaml").read_text()))
    tests = yaml.safe_load((TESTS / "alerts_test.yaml").read_text())["tests"]
    firing: set[tuple[str, str]] = set()
    quiet: set[str] = set()
    for group in tests:
        for case in group.get("alert_rule_test", []):
            if case["exp_alerts"]:
                firing |= {
                    (case["alertname"], a["exp_labels"]["severity"]) for a in case["exp_alerts"]
                }
            else:
                quiet.add(case["alertname"])
    expected = {(r["alert"], r["labels"]["severity"]) for r in rules}
    assert expected - firing == set(), "alerts without a firing test"
    assert {r["alert"] for r in rules} - quiet == set(), "alerts without a not-firing test"


def test_alerts_follow_mixin_conventions():
    rules = alert_rules(yaml.safe_load((ALERTS / "prometheus_alerts.yaml").read_text()))
    sections = set(runbooks.sections((ALERTS / "runbook.md").read_text()))
    assert len(rules) >= 20
    for rule in rules:
        name = rule["alert"]
        assert re.fullmatch(r"Gpu[A-Z][A-Za-z]+", name), name
        assert rule["labels"]["severity"] in SEVERITIES, name
        assert rule["labels"]["component"] in {"gpu", "exporter", "advisor", "advisor-service"}, (
            name
        )
        annotations = rule["annotations"]
        assert set(annotations) == {"summary", "description", "runbook_url"}, name
        assert "{{" in annotations["description"], f"{name}: description shows no label or value"
        # the page the advisor serves for this alert (tests/service/test_runbooks.py follows it)
        url = annotations["runbook_url"]
        assert url == f"{load_config()['advisor_external_url']}/runbooks/{name}", name
        assert name in sections, f"{name}: no runbook section"
    assert sections == {r["alert"] for r in rules}, "runbook sections without an alert"


def test_rules_reference_only_contract_metrics_and_portable_functions():
    known = contract_names()
    records = yaml.safe_load((ALERTS / "prometheus_rules.yaml").read_text())
    recorded = {r["record"] for g in records["groups"] for r in g["rules"]}
    alerts = yaml.safe_load((ALERTS / "prometheus_alerts.yaml").read_text())
    exprs = [r["expr"] for doc in (records, alerts) for g in doc["groups"] for r in g["rules"]]
    for expr in exprs:
        unknown = metric_names(expr) - known - recorded
        assert not unknown, f"{expr!r} uses metrics outside the contract: {unknown}"
        assert unknown_matcher_labels(expr) == [], "matchers on labels the metric does not have"
        # holt_winters is renamed and experimental in Prometheus 3.x; compose runs 3.x
        assert "holt_winters" not in expr and "double_exponential_smoothing" not in expr
    for record in recorded:
        level, metric, operation = record.split(":")
        assert level and operation and metric in known | {"gpu_energy_joules", "gpu_allocated"}


def test_metric_name_extraction_sees_every_selector():
    expr = (
        'sum by (node) (rate(gpu_energy_joules_total{job="x", reason=~"a|b"}[5m])) '
        "* on (node) group_left (pool) gpu_node_info or up offset 5m > bool 2"
    )
    assert metric_names(expr) == {"gpu_energy_joules_total", "gpu_node_info", "up"}
    assert metric_names('{__name__=~"gpu_lost|gpu_healthy"}') == {"gpu_lost", "gpu_healthy"}


def test_fast_variant_keeps_the_rules_and_shortens_windows(tmp_path):
    fast = load_config(
        {
            "for": {"gpu_lost": "1s"},
            "thresholds": {"idle_window": "5s", "xid_window": "30s"},
        }
    )
    rendered = generate.render_alerts(fast)
    production = generate.render_alerts(load_config())
    assert [r["alert"] for r in alert_rules(rendered)] == [
        r["alert"] for r in alert_rules(production)
    ]
    idle = next(r for r in alert_rules(rendered) if r["alert"] == "GpuAllocatedIdle")
    assert idle["for"] == "5s" and "[5s]" in idle["expr"]
    assert seconds(idle["for"]) == 5
    path = tmp_path / "fast.yaml"
    path.write_text(generate.dump(rendered))
    result = run(promtool(), "check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_generate_says_what_it_did_in_one_line_and_check_keeps_quiet(tmp_path, monkeypatch, capsys):
    """`python -m alerts.generate` printed nothing, whether it wrote or not: one line now;
    a current file is not rewritten; `--check` writes nothing and prints only what is stale."""
    monkeypatch.setattr(generate, "ROOT", tmp_path)
    names = ["alerts/prometheus_alerts.yaml", "alerts/prometheus_rules.yaml", "deploy/rule.yaml"]
    names += ["alerts/receivers.yml", "deploy/amconfig.yaml"]
    attributes = ("ALERTS_FILE", "RULES_FILE", "OPERATOR_FILE", "RECEIVERS_FILE")
    for attribute, name in zip((*attributes, "ALERTMANAGER_CONFIG_FILE"), names, strict=True):
        monkeypatch.setattr(generate, attribute, tmp_path / name)
    assert generate.main([]) == 0
    assert capsys.readouterr().out == f"alerts: wrote {', '.join(names)}\n"
    assert generate.main([]) == 0
    assert capsys.readouterr().out == f"alerts: 5 files up to date ({', '.join(names)})\n"
    (tmp_path / names[1]).write_text("groups: []\n")
    kept = (tmp_path / names[0]).stat().st_mtime_ns
    assert generate.main(["--check"]) == 1
    assert capsys.readouterr() == (
        "",
        f"out of date, run `python -m alerts.generate`: {names[1]}\n",
    )
    assert (tmp_path / names[1]).read_text() == "groups: []\n"
    assert generate.main([]) == 0
    assert capsys.readouterr().out == f"alerts: wrote {names[1]}; 4 files up to date\n"
    assert (tmp_path / names[0]).stat().st_mtime_ns == kept  # up to date: not rewritten
    assert generate.main(["--check"]) == 0 and capsys.readouterr() == ("", "")
