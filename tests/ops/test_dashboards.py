"""Dashboards without Grafana: the Grafana 11.6 JSON schemas plus the dashboard-linter's rules.

grafana/dashboard-linter cannot be installed here (Go 1.26 module), so its rules are
re-implemented below, one test per rule, with the same names. PromQL syntax is checked by
promtool (every panel query in a throwaway rule file); the integration test
tests/integration/test_prometheus_queries.py runs every query against a live Prometheus.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import jsonschema
import numpy as np
import pandas as pd
import pytest
import yaml

from advisor.forecast.live import forecast_pools
from alerts.config import load_config
from dashboards import fleet_overview, fragmentation_advisor, generate
from tests.ops.promql import (
    contract_names,
    label_values_parts,
    metric_names,
    panel_queries,
    panels,
    recorded_labels,
    recorded_metric,
    substitute,
    unknown_matcher_labels,
    variable_queries,
)

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT.parent / "shared" / "data" / "grafana"
DASHBOARD_DIR = ROOT / "dashboards" / "json"
PROVISIONING = ROOT / "dashboards" / "provisioning"
PANEL_SCHEMAS = {
    "timeseries": "timeseries",
    "heatmap": "heatmap",
    "table": "table",
    "stat": "stat",
    "state-timeline": "statetimeline",
    "bargauge": "bargauge",
    "gauge": "gauge",
}
# Grafana unit ids used by GPU dashboards (grafana-data valueFormats/categories.ts).
UNITS = {
    "none",
    "short",
    "percent",
    "percentunit",
    "bytes",
    "decbytes",
    "Bps",
    "binBps",
    "celsius",
    "watt",
    "kwatt",
    "joule",
    "watth",
    "kwatth",
    "hertz",
    "s",
    "ms",
}
UNIT_BY_SUFFIX = {
    "_ratio": "percentunit",
    "_celsius": "celsius",
    "_watts": "watt",
    "_bytes_per_second": "Bps",
    "_bytes": "bytes",
    "_hertz": "hertz",
    "_seconds": "s",
}
DASHBOARD_VARIABLES = {"job": ".+", "node": "a100-node-01", "gpu": ".+", "advisor": ".+"}


def load(name: str) -> dict:
    return json.loads((DASHBOARD_DIR / name).read_text())


ALL = sorted(generate.DASHBOARDS)


def schema(name: str) -> dict:
    path = SCHEMAS / f"{name}.jsonschema.json"
    if not path.exists():
        pytest.fail(f"Grafana JSON schema {path} is missing (shared/data/grafana)")
    return json.loads(path.read_text())


def test_committed_dashboards_match_the_generator():
    for name, document in generate.render_all().items():
        assert (DASHBOARD_DIR / name).read_text() == generate.dumps(document), (
            f"{name} is stale: run `python -m dashboards.generate`"
        )
    assert sorted(p.name for p in DASHBOARD_DIR.glob("*.json")) == ALL


@pytest.mark.parametrize("name", ALL)
def test_dashboard_validates_against_the_grafana_11_6_schema(name):
    document = load(name)
    validator = jsonschema.Draft7Validator(schema("dashboard"))
    errors = [
        f"{list(e.absolute_path)}: {jsonschema.exceptions.best_match([e]).message}"
        for e in validator.iter_errors(document)
    ]
    assert errors == []
    assert document["schemaVersion"] == 41


@pytest.mark.parametrize("name", ALL)
def test_panel_options_and_field_config_validate_against_their_panel_schema(name):
    errors = []
    for panel in panels(load(name)):
        assert panel["type"] in PANEL_SCHEMAS, panel["type"]
        definitions = schema(PANEL_SCHEMAS[panel["type"]])["definitions"]
        custom = panel["fieldConfig"]["defaults"].get("custom", {})
        checks = [("Options", panel["options"])]
        if "FieldConfig" in definitions:
            checks.append(("FieldConfig", custom))
        else:
            assert custom == {}, f"{panel['title']}: {panel['type']} takes no custom field config"
        for definition, instance in checks:
            validator = jsonschema.Draft7Validator(
                {"$ref": f"#/definitions/{definition}", "definitions": definitions}
            )
            errors += [
                f"{panel['title']} {definition} {list(e.absolute_path)}: {e.message}"
                for e in validator.iter_errors(instance)
            ]
    assert errors == []


def test_schema_validation_rejects_a_broken_panel():
    document = load("gpu-fleet-overview.json")
    document["panels"][1]["gridPos"]["w"] = 30
    assert list(jsonschema.Draft7Validator(schema("dashboard")).iter_errors(document))


@pytest.mark.parametrize("name", ALL)
def test_template_datasource_rule(name):
    variables = load(name)["templating"]["list"]
    sources = [v for v in variables if v["type"] == "datasource"]
    assert len(sources) == 1
    assert sources[0]["name"] == "datasource" and sources[0]["query"] == "prometheus"


@pytest.mark.parametrize("name", ALL)
def test_template_job_rule_and_reload_on_time_change(name):
    variables = {v["name"]: v for v in load(name)["templating"]["list"]}
    jobs = [variables[n] for n in ("job", "advisor") if n in variables]
    assert jobs, "a job variable selects the scrape job"
    for job in jobs:
        assert job["multi"] and job["includeAll"] and job["allValue"] == ".+"
    for variable in variables.values():
        if variable["type"] == "query":
            assert variable["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert variable["refresh"] == 2, f"{variable['name']} must reload on time change"
            label_values_parts(variable["query"])


@pytest.mark.parametrize("name", ALL)
def test_panel_datasource_title_description_and_targets_rules(name):
    for panel in panels(load(name)):
        title = panel.get("title", "")
        assert title.strip(), panel["id"]
        assert len(panel.get("description", "")) >= 20, f"{title}: needs a description"
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, title
        assert panel["targets"], f"{title}: no targets"
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), f"{title}: duplicate refIds"
        for query in panel["targets"]:
            assert query["datasource"] == panel["datasource"], title
            assert query["expr"].strip(), title


_RANGE_FUNCTION = re.compile(r"\b(rate|irate|increase)\((?:[^()\[\]]|\{[^}]*\})*\[([^\]]+)\]")
_COUNTER = re.compile(r"(\w+)\(\s*(\w+_total)\{")
_SELECTOR = re.compile(r"(?<![\w$.])([a-zA-Z_:][\w:]*)(\s*\(|\s*\{[^}]*\})?")


def lint_units(document: dict) -> list[str]:
    """panel-units-rule, plus: the unit matches the metric's unit suffix where it is plain."""
    problems = []
    for panel in panels(document):
        unit = panel["fieldConfig"]["defaults"].get("unit")
        if not (unit in UNITS or (unit or "").startswith("suffix:")):
            problems.append(f"{panel['title']}: unit {unit!r} is not a Grafana unit")
            continue
        exprs = [t["expr"] for t in panel["targets"]]
        # a recorded series (level:metric:operations) has the unit of its metric
        names = {recorded_metric(n) or n for e in exprs for n in metric_names(e)}
        if any("/" in e or "count(" in e or "*" in e for e in exprs) or not names:
            continue
        suffixes = {
            next((s for s in UNIT_BY_SUFFIX if n.removesuffix("_total").endswith(s)), None)
            for n in names
        }
        if len(suffixes) == 1 and None not in suffixes:
            expected = UNIT_BY_SUFFIX[suffixes.pop()]
            if unit != expected:
                problems.append(f"{panel['title']}: unit {unit}, expected {expected} for {names}")
    return problems


def lint_rate_interval(document: dict) -> list[str]:
    """target-rate-interval-rule ($__range allowed for "in range" totals)."""
    problems = []
    for title, ref, expr in panel_queries(document):
        for match in _RANGE_FUNCTION.finditer(expr):
            window = match.group(2)
            if window == "$__range" and "in range" in title:
                continue
            if window != "$__rate_interval":
                problems.append(f"{title}/{ref}: {match.group(0)}")
    return problems


def lint_counter_agg(document: dict) -> list[str]:
    """target-counter-agg-rule: `*_total` only inside rate/irate/increase."""
    problems = []
    for title, ref, expr in panel_queries(document):
        counters = {n for n in metric_names(expr) if n.endswith("_total")}
        wrapped = {
            m.group(2)
            for m in _COUNTER.finditer(expr)
            if m.group(1) in {"rate", "irate", "increase"}
        }
        if counters - wrapped:
            problems.append(f"{title}/{ref}: {counters - wrapped} without rate/increase")
    return problems


def lint_job(document: dict) -> list[str]:
    """target-job-rule: every selector filters on the dashboard's job variable."""
    known = contract_names() | set(recorded_labels())
    problems = []
    for title, ref, expr in panel_queries(document):
        for match in _SELECTOR.finditer(re.sub(r'"[^"]*"', '""', expr)):
            if match.group(1) not in known or (match.group(2) or "").strip().startswith("("):
                continue
            if "job=~" not in (match.group(2) or ""):
                problems.append(f"{title}/{ref}: {match.group(1)} without a job matcher")
        if not re.search(r'job=~"\$(job|advisor)"', expr):
            problems.append(f"{title}/{ref}: no job variable")
    return problems


def lint_contract(document: dict) -> list[str]:
    """Every metric name in panels and variables exists in the exporter/advisor contract or is
    recorded by a rule of alerts/prometheus_rules.yaml."""
    known = contract_names() | set(recorded_labels())
    exprs = [e for _, _, e in panel_queries(document)]
    exprs += [label_values_parts(q)[0] or "" for _, q in variable_queries(document)]
    return [
        f"{expr!r} uses metrics outside the contracts: {metric_names(expr) - known}"
        for expr in exprs
        if metric_names(expr) - known
    ]


def lint_labels(document: dict) -> list[str]:
    """Every label matcher names a label the metric carries (contract labels, target labels)."""
    return [
        f"{title}/{ref}: {problem}"
        for title, ref, expr in panel_queries(document)
        for problem in unknown_matcher_labels(expr)
    ]


LINTERS = [lint_units, lint_rate_interval, lint_counter_agg, lint_job, lint_contract, lint_labels]


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("lint", LINTERS, ids=lambda f: f.__name__)
def test_dashboard_linter_rule(name, lint):
    assert lint(load(name)) == []


def test_linter_rules_flag_a_bad_panel():
    bad = {
        "panels": [
            {
                "type": "timeseries",
                "title": "bad",
                "fieldConfig": {"defaults": {"unit": "percentunit"}},
                "targets": [
                    {"refId": "A", "expr": "sum(rate(gpu_energy_joules_total[5m])) + gpu_bogus"},
                    {"refId": "B", "expr": 'gpu_xid_errors_total{job=~"$job", xid_code="79"}'},
                ],
            },
            {
                "type": "timeseries",
                "title": "temperature in percent",
                "fieldConfig": {"defaults": {"unit": "percentunit"}},
                "targets": [{"refId": "A", "expr": 'gpu_temperature_celsius{job=~"$job"}'}],
            },
        ],
        "templating": {"list": []},
    }
    for lint in LINTERS:
        assert lint(bad), f"{lint.__name__} found nothing wrong"


@pytest.mark.parametrize("name", ALL)
def test_panel_ids_unique_and_grid_without_overlaps(name):
    document = load(name)
    ids = [p["id"] for p in document["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in document["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        area = {(pos["x"] + dx, pos["y"] + dy) for dx in range(pos["w"]) for dy in range(pos["h"])}
        assert not area & cells, f"{panel['title']} overlaps another panel"
        cells |= area


def test_dashboards_have_unique_uids_titles_and_link_each_other():
    documents = [load(n) for n in ALL]
    # uneditable-dashboard rule: they are generated, edits in Grafana would be lost
    assert all(d["editable"] is False for d in documents)
    assert len({d["uid"] for d in documents}) == len(documents)
    assert len({d["title"] for d in documents}) == len(documents)
    for document in documents:
        assert document["links"][0]["tags"] == ["gpu-defrag"]
        assert "gpu-defrag" in document["tags"]


def test_every_panel_query_is_valid_promql(tmp_path):
    """promtool parses each query (placeholders filled in) as a recording rule."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing: apt-get install --no-install-recommends prometheus")
    rules = []
    for name in ALL:
        document = load(name)
        for i, (_title, _ref, expr) in enumerate(panel_queries(document)):
            variables = {**DASHBOARD_VARIABLES, "pool": ".+", "horizon": "24h", "Hostname": ".+"}
            rules.append(
                {
                    "record": f"check:{Path(name).stem.replace('-', '_')}:{i}",
                    "expr": substitute(expr, variables),
                }
            )
    path = tmp_path / "panel-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    result = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(rules) >= 80


def test_thresholds_come_from_the_shared_config():
    config = load_config()
    overview = load("gpu-fleet-overview.json")
    hottest = next(p for p in panels(overview) if p["title"] == "Hottest GPU per node")
    values = [s["value"] for s in hottest["fieldConfig"]["defaults"]["thresholds"]["steps"]]
    assert config["thresholds"]["temperature_celsius"] in values
    hotter = fleet_overview.build(load_config({"thresholds": {"temperature_celsius": 91}}))
    hottest = next(p for p in panels(hotter) if p["title"] == "Hottest GPU per node")
    assert 91 in [s["value"] for s in hottest["fieldConfig"]["defaults"]["thresholds"]["steps"]]


def test_the_dashboards_cover_the_required_views():
    titles = {name: {p["title"] for p in panels(load(name))} for name in ALL}
    types = {name: {p["type"] for p in panels(load(name))} for name in ALL}
    assert {
        "GPUs by state",
        "GPU utilization heatmap",
        "GPU memory heatmap",
        "Power by node",
        "Energy in range",
        "Hottest GPU per node",
        "XID errors by code",
        "ECC errors",
        "Throttled GPUs by reason",
        "Top idle-but-allocated GPUs",
    } <= titles["gpu-fleet-overview.json"]
    assert {"MIG instances", "GPU-to-GPU links", "Processes and pods on each GPU"} <= titles[
        "gpu-node-detail.json"
    ]
    assert {
        "Fragmentation map (node × GPU)",
        "Fragmentation rate by pool",
        "Stranded GPUs per job shape",
        "Schedulable jobs per shape",
        "Forecast vs actual demand",
        "Recommended actions by kind",
        "Top recommended actions",
    } <= titles["gpu-fragmentation-advisor.json"]
    assert "heatmap" in types["gpu-fleet-dcgm-exporter.json"]
    node = {v["name"]: v for v in load("gpu-node-detail.json")["templating"]["list"]}
    assert node["node"]["multi"] is False, "node detail is templated by one node"


def test_provisioning_points_grafana_at_prometheus_and_the_dashboards():
    datasources = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yaml").read_text())
    (source,) = datasources["datasources"]
    assert source["type"] == "prometheus" and source["isDefault"] is True
    assert source["url"].startswith("http://prometheus:9090")
    providers = yaml.safe_load((PROVISIONING / "dashboards" / "gpu-defrag.yaml").read_text())
    (provider,) = providers["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards/gpu-defrag"


def test_the_action_cost_column_is_gpu_hours_from_the_gpu_seconds_gauge():
    """The advisor exports GPU-seconds (promtool: base unit); the table beside GPUs shows
    them as GPU-hours, its column name's unit."""
    document = load("gpu-fragmentation-advisor.json")
    (panel,) = [p for p in panels(document) if p["title"] == "Top recommended actions"]
    (query,) = [t for t in panel["targets"] if "gpu_advisor_action_cost" in t["expr"]]
    assert metric_names(query["expr"]) == {"gpu_advisor_action_cost_gpu_seconds"}
    assert query["expr"].endswith("} / 3600")
    renames = next(t for t in panel["transformations"] if t["id"] == "organize")["options"]
    assert renames["renameByName"][f"Value #{query['refId']}"] == "cost (GPU-hours)"


def _panel(document: dict, title: str) -> dict:
    (panel,) = [p for p in panels(document) if p["title"] == title]
    return panel


_HORIZON = re.compile(r'\bhorizon="(\d+)h"')
_QUANTILE = re.compile(r'\bforecast_quantile="([^"]+)"')
_OFFSET_HOURS = re.compile(r"\boffset\s+(\d+)h\b")


def test_forecast_vs_actual_draws_each_forecast_in_the_hour_it_forecasts():
    """Each forecast query names one horizon h and carries `offset (h - 1)h`, and the advisor
    does serve, during an hour, its forecast for the hour starting h - 1 hours later: it
    forecasts from the last complete hour (origin) the hour origin + h. Drawn so, a forecast sits
    beside the actual of the hour it is for. The old panel drew `horizon=~"$horizon"` with no
    offset: a 24 h forecast 23 hours before its hour."""
    panel = _panel(load("gpu-fragmentation-advisor.json"), "Forecast vs actual demand")
    quantiles_by_horizon: dict[int, set[str]] = {}
    for query in panel["targets"]:
        expr = query["expr"]
        if "gpu_advisor_forecast_demand_gpus" not in expr:
            continue
        horizon = _HORIZON.search(expr)
        assert horizon, f"{expr}: one fixed horizon per query (an offset cannot follow $horizon)"
        h = int(horizon.group(1))
        offsets = [int(o) for o in _OFFSET_HOURS.findall(expr)] or [0]
        assert offsets == [h - 1], f"{expr}: a {h}h forecast is drawn offset {h - 1}h"
        assert "offset" not in _OFFSET_HOURS.sub("", expr), f"{expr}: offset not in whole hours"
        quantiles_by_horizon.setdefault(h, set()).add(_QUANTILE.search(expr).group(1))
    assert sorted(quantiles_by_horizon) == sorted(fragmentation_advisor.FORECAST_VS_ACTUAL_HORIZONS)
    assert 1 in quantiles_by_horizon
    for quantiles in quantiles_by_horizon.values():
        assert quantiles == {"0.1", "0.5", "0.9"}, "the interval and the median"

    # what the advisor serves: a history of runs every 5 minutes up to 16:15 on day 2
    start = pd.Timestamp("2024-01-01T00:00:00Z")
    times = start + pd.to_timedelta(np.arange(0, 40 * 60 + 17, 5), unit="min")
    history = pd.DataFrame(
        {
            "time": times,
            "pool": "a",
            "allocated_gpus": 40 + 8 * np.sin(np.arange(len(times)) / 20.0),
            "held_gpus": 48.0,
            "capacity_gpus": 64.0,
            "pending_gpus": 0.0,
        }
    )
    doc = forecast_pools(history, sorted(quantiles_by_horizon), windows_h=())
    served_from = times[-1].floor("h").tz_localize(None)  # the hour the latest run is in
    (pool,) = doc["pools"]
    served = {h["horizon"]: h for h in pool["horizons"] if h["available"]}
    assert set(served) == {f"{h}h" for h in quantiles_by_horizon}, "the horizon label's format"
    for h in quantiles_by_horizon:
        target = pd.Timestamp(served[f"{h}h"]["target"]).tz_localize(None)
        assert target - served_from == pd.Timedelta(
            hours=fragmentation_advisor.forecast_offset_hours(h)
        )
        assert set(served[f"{h}h"]["quantiles"]) == {"0.1", "0.5", "0.9"}


def test_forecast_vs_actual_compares_the_same_pools():
    """The actual and capacity are per pool of the $pool selection, as the forecasts are, and
    per advisor job (two advisors watching one pool are two lines, not their sum)."""
    panel = _panel(load("gpu-fragmentation-advisor.json"), "Forecast vs actual demand")
    (actual,) = [t["expr"] for t in panel["targets"] if "actual" in t["legendFormat"]]
    assert actual.startswith("sum by (job, pool) ("), "per advisor and pool, as the forecasts"
    for query in panel["targets"]:
        assert 'pool=~"$pool"' in query["expr"], query["expr"]
        assert query["legendFormat"].startswith("{{pool}} "), query["legendFormat"]


def test_forecast_vs_actual_draws_the_forecasts_own_quantity():
    """The forecast is of the pool's allocated GPU share (milli-GPU / 1000 over the pool's GPUs,
    the advisor history's `allocated_gpus`); the actual must be that same number, which differs
    from a GPU count on shared (fractional, MIG) GPUs."""
    panel = _panel(load("gpu-fragmentation-advisor.json"), "Forecast vs actual demand")
    (actual,) = [t["expr"] for t in panel["targets"] if "actual" in t["legendFormat"]]
    assert metric_names(actual) == {"gpu_advisor_allocated_gpus"}


# A recording rule's aggregation written by hand in a panel: the same sum per node, or its sum
# over nodes (by no label or by labels the rule keeps), of the per-GPU series it records.
_KEPT = r"(?:by\s*\((?:\s*(?:node|job|instance|cluster)\s*,?)*\)\s*)?"
HAND_MADE = {
    "node:gpu_power_watts:sum": rf"\bsum\s*{_KEPT}\(\s*gpu_power_watts\{{",
    "node:gpu_memory_used_bytes:sum": rf"\bsum\s*{_KEPT}\(\s*gpu_memory_used_bytes\{{",
    "node:gpu_memory_total_bytes:sum": rf"\bsum\s*{_KEPT}\(\s*gpu_memory_total_bytes\{{",
    "node:gpu_allocated:count": (
        rf"\b(?:count|sum)\s*{_KEPT}\(\s*count\s+by\s*\([^()]*\)\s*\(\s*gpu_allocation_info\{{"
    ),
}


@pytest.mark.parametrize("name", ALL)
def test_panels_read_the_recording_rules_instead_of_aggregating_per_gpu_series(name):
    """What a recording rule sums per node is not summed again per GPU in a panel (cheaper on a
    big fleet, the same numbers). Not covered: node:gpu_utilization_ratio:avg (an average of node
    averages is not the fleet's per-GPU average) and node:gpu_energy_joules:rate5m (panels take
    rates over $__rate_interval, which a fixed 5m window would not cover at wide steps)."""
    assert set(HAND_MADE) <= set(recorded_labels())
    problems = [
        f"{title}/{ref}: {expr} (use {record})"
        for title, ref, expr in panel_queries(load(name))
        for record, pattern in HAND_MADE.items()
        if re.search(pattern, expr)
    ]
    assert problems == []


def test_the_fleet_overview_reads_the_node_recording_rules():
    overview = load("gpu-fleet-overview.json")
    exprs = {title: [] for title in ("Power draw", "Power by node", "Power against the limit")}
    exprs["GPUs by state"] = []
    for title, _ref, expr in panel_queries(overview):
        if title in exprs:
            exprs[title].append(expr)
    for title in ("Power draw", "Power by node", "Power against the limit"):
        assert any("node:gpu_power_watts:sum{" in e for e in exprs[title]), title
    assert any("sum(node:gpu_allocated:count{" in e for e in exprs["GPUs by state"])


def test_generate_says_what_it_did_in_one_line_and_check_keeps_quiet(tmp_path, monkeypatch, capsys):
    """`python -m dashboards.generate` printed nothing, whether it wrote or not: one line now;
    a current file is not rewritten; `--check` writes nothing and prints only what is stale."""
    out = tmp_path / "dashboards" / "json"
    out.parent.mkdir()
    monkeypatch.setattr(generate, "OUT_DIR", out)
    names = [f"dashboards/json/{name}" for name in generate.DASHBOARDS]
    names.append("deploy/overlays/kube-prometheus-stack/dashboards.yaml")  # the ConfigMaps
    assert generate.main([]) == 0
    assert capsys.readouterr().out == f"dashboards: wrote {', '.join(names)}\n"
    assert generate.main([]) == 0
    assert capsys.readouterr().out == f"dashboards: 5 files up to date ({', '.join(names)})\n"
    (tmp_path / names[1]).write_text("{}")
    kept = (tmp_path / names[0]).stat().st_mtime_ns
    assert generate.main(["--check"]) == 1
    assert capsys.readouterr() == (
        "",
        f"out of date, run `python -m dashboards.generate`: {names[1]}\n",
    )
    assert (tmp_path / names[1]).read_text() == "{}"
    assert generate.main([]) == 0
    assert capsys.readouterr().out == f"dashboards: wrote {names[1]}; 4 files up to date\n"
    assert (tmp_path / names[0]).stat().st_mtime_ns == kept  # up to date: not rewritten
    assert generate.main(["--check"]) == 0 and capsys.readouterr() == ("", "")
