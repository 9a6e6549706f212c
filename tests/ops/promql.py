"""Small PromQL helpers for the ops tests: metric names in an expression, Grafana placeholders.

Not a parser: strings, label matchers, grouping label lists and range/offset durations are
stripped, and what is left that is an identifier but neither a function call nor a keyword is
a metric name. Good enough for the expressions we write; the real parser (promtool, Prometheus)
checks syntax separately.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import yaml

from advisor.contract import ADVISOR_METRICS
from exporter.contract import METRICS
from exporter.render import DCGM_LABELS as RENDERED_DCGM_LABELS
from exporter.render import DCGM_SPECS

RULES_FILE = Path(__file__).resolve().parents[2] / "alerts" / "prometheus_rules.yaml"

KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "offset",
    "bool",
    "atan2",
    "inf",
    "nan",
}

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_OFFSET = re.compile(r"\boffset\s+-?[0-9a-z]+")
_NAME_MATCHER = re.compile(r'__name__\s*=~?\s*"([^"]*)"')
_IDENT = re.compile(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?")

# Values for Grafana's built-in and our dashboard variables when an expression is sent to a
# real Prometheus (the dashboards' own variables are filled in by the callers).
GRAFANA_BUILTINS = {
    "$__rate_interval": "1m",
    "$__interval": "15s",
    "$__range": "5m",
}


def metric_names(expr: str) -> set[str]:
    """Metric names an expression selects (including names in `__name__` matchers)."""
    names = {n for m in _NAME_MATCHER.finditer(expr) for n in m.group(1).split("|")}
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub("", text)
    text = _GROUPING.sub("", text)
    text = _RANGE.sub("", text)
    text = _OFFSET.sub("", text)
    for match in _IDENT.finditer(text):
        name, call = match.group(1), match.group(2)
        if call or name in KEYWORDS:
            continue
        names.add(name)
    return names


def contract_names() -> set[str]:
    """Every metric name the exporter and the advisor may expose, plus Prometheus' `up`."""
    return (
        {spec.name for spec in METRICS}
        | {spec.name for spec in ADVISOR_METRICS}
        | set(DCGM_SPECS)
        | {"up"}
    )


_AGGREGATION = re.compile(r"^\s*\w+\s+(by|without)\s*\(([^()]*)\)")


@cache
def recorded_labels() -> dict[str, frozenset[str]]:
    """Recording rule name -> the label names of its series after scraping, from the rule file
    Prometheus loads (alerts/prometheus_rules.yaml): `op by (labels)` keeps those labels,
    `op without (labels)` keeps the source metric's contract and target labels but those."""
    rules = yaml.safe_load(RULES_FILE.read_text())
    out: dict[str, frozenset[str]] = {}
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "record" not in rule:
                continue
            match = _AGGREGATION.match(rule["expr"])
            if match is None:
                raise ValueError(f"{rule['record']}: not an aggregation: {rule['expr']!r}")
            grouping = {label.strip() for label in match.group(2).split(",") if label.strip()}
            if match.group(1) == "by":
                out[rule["record"]] = frozenset(grouping)
                continue
            (source,) = metric_names(rule["expr"])
            out[rule["record"]] = frozenset((contract_labels(source) or set()) - grouping)
    return out


def recorded_metric(name: str) -> str | None:
    """The metric part of a recording rule name (`level:metric:operations`), None otherwise."""
    parts = name.split(":")
    return parts[1] if len(parts) == 3 and name in recorded_labels() else None


def substitute(expr: str, variables: dict[str, str]) -> str:
    """Replace `$name`, `${name}` and `[[name]]` Grafana placeholders, longest name first."""
    values = {**GRAFANA_BUILTINS, **{f"${k}": v for k, v in variables.items()}}
    for key in sorted(values, key=len, reverse=True):
        bare = key[1:]
        expr = expr.replace("${" + bare + "}", values[key]).replace(key, values[key])
        expr = expr.replace(f"[[{bare}]]", values[key])
    return expr


def panels(dashboard: dict) -> list[dict]:
    """Every non-row panel, including panels nested in collapsed rows."""
    out = []
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            out.extend(panel.get("panels", []))
        else:
            out.append(panel)
    return out


def panel_queries(dashboard: dict) -> list[tuple[str, str, str]]:
    """(panel title, refId, expr) for every query of every panel."""
    return [
        (panel["title"], query["refId"], query["expr"])
        for panel in panels(dashboard)
        for query in panel.get("targets", [])
    ]


def variable_queries(dashboard: dict) -> list[tuple[str, str]]:
    """(variable name, label_values(...) query) of every query variable."""
    return [
        (v["name"], v["query"]) for v in dashboard["templating"]["list"] if v["type"] == "query"
    ]


_LABEL_VALUES = re.compile(r"^label_values\((?:(.*),\s*)?(\w+)\)$")


def label_values_parts(query: str) -> tuple[str | None, str]:
    """`label_values(expr, label)` -> (expr or None, label)."""
    match = _LABEL_VALUES.match(query.strip())
    if not match:
        raise ValueError(f"not a label_values() query: {query!r}")
    return match.group(1), match.group(2)


_SELECTOR_TEXT = re.compile(
    r'(?<![\w$.:])([a-zA-Z_:][\w:]*)\s*(\{(?:[^{}"]|"(?:[^"\\]|\\.)*")*\})?(\s*\()?'
)
_MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')


def selectors(expr: str) -> list[tuple[str, str]]:
    """(metric name, `name{matchers}`) for every vector selector of an expression."""
    text = _GROUPING.sub("", expr)
    text = _OFFSET.sub("", text)
    text = re.sub(r"\[[^\[\]{}\"]*\]", "", text)
    out = []
    for match in _SELECTOR_TEXT.finditer(text):
        name, matchers, call = match.groups()
        if call or name in KEYWORDS:
            continue
        out.append((name, name + (matchers or "")))
    return out


def matcher_labels(selector: str) -> set[str]:
    """Label names a selector matches on."""
    return {m.group(1) for m in _MATCHER.finditer(selector)}


# Labels of the dcgm-exporter compatible series (exporter/render.py `add_dcgm_compat`).
DCGM_LABELS = set(RENDERED_DCGM_LABELS)
# Labels Prometheus adds to every scraped series (no contract metric uses these names).
TARGET_LABELS = {"job", "instance", "cluster"}


def contract_labels(name: str) -> set[str] | None:
    """Label names a contract metric can carry after scraping (None: not a contract metric)."""
    from advisor.contract import ADVISOR_BY_NAME
    from exporter.contract import BY_NAME

    spec = BY_NAME.get(name) or ADVISOR_BY_NAME.get(name)
    if spec:
        return set(spec.labels) | TARGET_LABELS
    if name in DCGM_SPECS:
        return DCGM_LABELS | TARGET_LABELS
    if name == "up":
        return set(TARGET_LABELS)
    return None


def unknown_matcher_labels(expr: str) -> list[str]:
    """`selector: labels` for every selector that matches on a label its metric does not have."""
    problems = []
    for name, selector in selectors(expr):
        labels = contract_labels(name)
        if labels is None and name in recorded_labels():
            labels = set(recorded_labels()[name])
        if labels is None:
            continue
        unknown = matcher_labels(selector) - labels - {"__name__"}
        if unknown:
            problems.append(f"{selector}: {sorted(unknown)}")
    return problems
