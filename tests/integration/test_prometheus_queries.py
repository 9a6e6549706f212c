"""Every PromQL expression of every dashboard panel and every rule, run on a real Prometheus.

Debian's Prometheus scrapes, on 127.0.0.1 and with the shipped rule files loaded:
- job gpu-exporter: the sim exporter (`gpu-defrag exporter --backend sim`, preset a100-16x8,
  with `--compat.dcgm-names` for the dcgm-exporter dashboard);
- job gpu-advisor: the real advisor (`gpu-defrag advise --source sim:a100-16x8`, which
  backfills a simulated history so its forecasts exist);
- job gpu-advisor-standin: the ADVISOR STAND-IN (tests/integration/advisor_standin.py), a static
  page rendered from advisor/contract.py with every contract metric, so series the real advisor
  emits only in some states (recommended actions with cost and benefit, idle power) are queried
  too. The rules select job="gpu-advisor" only; the dashboards' $advisor variable sees both.

A query
fails the test on any API error, and on an empty result unless one of its selectors has no
data in this fleet (a metric the preset does not produce, or a label value filter such as an
XID class that has not occurred) — and then only if the selector's label names are real — or
reaches back with an `offset` further than this Prometheus has data (the forecast vs actual
panel draws a 24 h forecast `offset 23h`, in the hour it is for).
"""

from __future__ import annotations

import re
import time
import urllib.parse

import pytest
import yaml

from advisor.contract import ADVISOR_BY_NAME
from alerts import generate
from alerts.config import load_config
from dashboards.generate import render_all
from exporter.contract import BY_NAME
from exporter.render import DCGM_LABELS as RENDERED_DCGM_LABELS
from exporter.render import DCGM_SPECS
from tests.integration import stack
from tests.integration.advisor_standin import StandinHandler
from tests.ops.promql import (
    label_values_parts,
    matcher_labels,
    panels,
    selectors,
    substitute,
)

pytestmark = pytest.mark.integration

DCGM_LABELS = set(RENDERED_DCGM_LABELS)
OFFSET = re.compile(r"\boffset\s+(-?\d+[smhdwy])\b")


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("prometheus-queries")
    procs = stack.Processes(workdir)
    config = load_config()
    rules = workdir / "rules.yaml"
    alerts = workdir / "alerts.yaml"
    rules.write_text(generate.dump(generate.render_records(config)))
    alerts.write_text(generate.dump(generate.render_alerts(config)))
    try:
        with stack.http_server(StandinHandler) as standin:
            exporter = stack.start_exporter(procs, "--compat.dcgm-names", "--idle.window", "2s")
            advisor = stack.start_advisor(procs, "sim:a100-16x8")
            url = stack.start_prometheus(
                procs,
                {"gpu-exporter": exporter, "gpu-advisor": advisor, "gpu-advisor-standin": standin},
                [rules, alerts],
            )

            def ready() -> bool:
                procs.check_alive()
                samples = stack.query(
                    url,
                    "min(count_over_time(up[1m])) >= 4 and on () count(up == 1) == 3",
                )
                groups = stack.api(url, "/api/v1/rules")["groups"]
                evaluated = all(r["lastEvaluation"] > "2000" for g in groups for r in g["rules"])
                return bool(samples) and evaluated

            stack.poll(ready, stack.CAP_S, "all targets scraped 4 times and every rule evaluated")
            yield url
    except BaseException:
        print(procs.logs())
        raise
    finally:
        procs.stop_all()


def contract_labels(name: str) -> set[str]:
    spec = BY_NAME.get(name) or ADVISOR_BY_NAME.get(name)
    if spec:
        return set(spec.labels)
    if name in DCGM_SPECS:
        return DCGM_LABELS
    return set()


def explain_empty(url: str, expr: str) -> str | None:
    """Why `expr` may return nothing here (None: explained), or the failure message."""
    for name, selector in selectors(expr):
        if stack.query(url, f"count({selector})"):
            for offset in OFFSET.findall(expr):
                if not stack.query(url, f"count({selector} offset {offset})"):
                    return None  # real labels, data now, none that long ago yet
            continue
        params = urllib.parse.urlencode({"match[]": name, "start": str(time.time() - 300)})
        series = stack.api(url, f"/api/v1/series?{params}")
        known = {label for s in series for label in s} | contract_labels(name)
        unknown = matcher_labels(selector) - known - {"job", "instance", "__name__"}
        if unknown:
            return f"{selector}: label(s) {sorted(unknown)} do not exist on {name}"
        job = re.search(r'job\s*(=~|=)\s*"[^"]*"', selector)
        if series and job and not stack.query(url, f"count({name}{{{job.group(0)}}})"):
            return f"{selector}: the job matcher selects no target that has {name}"
        return None
    return f"{expr!r} returned no series although every selector has data"


def check(url: str, expr: str, *, range_s: float | None = None) -> str:
    """'data', 'explained' or raise with the reason."""
    result = stack.query(url, expr, range_s=range_s)
    if result:
        return "data"
    problem = explain_empty(url, expr)
    assert problem is None, problem
    return "explained"


def test_every_rule_is_loaded_and_evaluates_without_error(prometheus):
    groups = stack.api(prometheus, "/api/v1/rules")["groups"]
    loaded = {(r.get("name"), r["type"]) for g in groups for r in g["rules"]}
    config = load_config()
    expected = {
        (r["alert"], "alerting")
        for g in generate.render_alerts(config)["groups"]
        for r in g["rules"]
    }
    expected |= {
        (r["record"], "recording")
        for g in generate.render_records(config)["groups"]
        for r in g["rules"]
    }
    assert loaded == expected
    for group in groups:
        for rule in group["rules"]:
            assert rule["health"] == "ok", (rule["name"], rule.get("lastError"))
    for record, _ in sorted(r for r in expected if r[1] == "recording"):
        assert stack.query(prometheus, record), f"recording rule {record} produced no series"


def test_every_alert_signal_has_data_and_every_alert_expression_runs(prometheus):
    outcomes = {}
    for name, signal, absent in generate.signals(load_config()):
        if absent:
            assert stack.query(prometheus, signal), f"{name}: {signal} should have data"
            outcomes[name] = "data"
            continue
        outcomes[name] = check(prometheus, signal)
    for group in generate.render_alerts(load_config())["groups"]:
        for rule in group["rules"]:
            stack.query(prometheus, rule["expr"])  # no error
    absent = next(
        r
        for g in generate.render_alerts(load_config())["groups"]
        for r in g["rules"]
        if r["alert"] == "GpuExporterAbsent"
    )
    assert stack.query(prometheus, absent["expr"]) == [], (
        "absent() fires although the exporter is up"
    )
    explained = sorted(n for n, o in outcomes.items() if o == "explained")
    print(f"alert signals without data in this fleet: {explained}")
    # only alerts on events the sim has not produced (XID classes, uncorrected ECC) may lack data
    assert set(explained) <= {
        "GpuXidHardwareError",
        "GpuXidMemoryError",
        "GpuXidOtherError",
        "GpuEccUncorrectableErrors",
    }


def resolve_variables(url: str, dashboard: dict) -> dict[str, str]:
    """Values for the dashboard's variables, from its own label_values() queries."""
    values: dict[str, str] = {}
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        expr, label = label_values_parts(variable["query"])
        expr = substitute(expr, values) if expr else None
        if expr:
            params = urllib.parse.urlencode({"match[]": expr, "start": str(time.time() - 300)})
            found = {s[label] for s in stack.api(url, f"/api/v1/series?{params}") if label in s}
        else:
            found = set(stack.api(url, f"/api/v1/label/{label}/values"))
        assert found, f"variable ${variable['name']} ({variable['query']}) has no values"
        values[variable["name"]] = (
            variable.get("allValue", ".+") if variable["includeAll"] else sorted(found)[0]
        )
    return values


@pytest.mark.parametrize("name", sorted(render_all()))
def test_every_dashboard_query_evaluates(prometheus, name):
    dashboard = render_all()[name]
    variables = resolve_variables(prometheus, dashboard)
    outcomes = []
    for panel in panels(dashboard):
        for target in panel["targets"]:
            expr = substitute(target["expr"], variables)
            assert "$" not in expr, f"{panel['title']}: unresolved placeholder in {expr}"
            outcomes.append((panel["title"], check(prometheus, expr)))
            if target["range"]:
                check(prometheus, expr, range_s=10)
    explained = sorted({title for title, outcome in outcomes if outcome == "explained"})
    print(f"{name}: {len(outcomes)} queries, without data in this fleet: {explained}")
    with_data = sum(outcome == "data" for _, outcome in outcomes)
    assert with_data >= 0.8 * len(outcomes), explained


def test_the_check_catches_typos_errors_and_empty_results(prometheus):
    with pytest.raises(AssertionError, match="do not exist"):
        check(prometheus, 'gpu_info{job="gpu-exporter", nodee="a100-node-01"}')
    with pytest.raises(AssertionError, match="job matcher"):
        check(prometheus, 'gpu_temperature_celsius{job="gpu-exporterr"}')
    with pytest.raises(AssertionError, match="bad_data"):
        check(prometheus, 'sum by (node (gpu_info{job="gpu-exporter"})')
    with pytest.raises(AssertionError, match="every selector has data"):
        check(prometheus, 'gpu_temperature_celsius{job="gpu-exporter"} > 1000')
    assert check(prometheus, 'gpu_mig_memory_used_bytes{job="gpu-exporter"}') == "explained"
    assert check(prometheus, 'gpu_info{job="gpu-exporter"} offset 23h') == "explained"
    with pytest.raises(AssertionError, match="every selector has data"):
        check(prometheus, 'gpu_info{job="gpu-exporter"} offset 1s > 1000')


def test_the_rules_see_the_real_advisor_and_the_standin_is_marked(prometheus):
    builds = {
        r["metric"]["job"]: r["metric"]["version"]
        for r in stack.query(prometheus, "gpu_advisor_build_info")
    }
    assert builds["gpu-advisor-standin"].endswith("standin")
    assert not builds["gpu-advisor"].endswith("standin")


def test_compose_prometheus_config_matches_this_setup():
    """The compose config scrapes the same job names this test uses."""
    config = yaml.safe_load((stack.ROOT / "deploy/prometheus/prometheus.yml").read_text())
    assert {"gpu-exporter", "gpu-advisor"} <= {j["job_name"] for j in config["scrape_configs"]}
