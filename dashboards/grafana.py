"""Plain-dict builders for Grafana 11.6 dashboards (schemaVersion 41).

Small on purpose: each helper returns exactly the JSON Grafana stores, so the output validates
against the Grafana 11.6 JSON schemas in shared/data/grafana/ (tests/ops/test_dashboards.py) and
reads like a dashboard exported from Grafana. Every panel queries the `$datasource` variable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 41
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

# Grafana always treats the first threshold step as the base (-Infinity) and stores `null`;
# the JSON schema wants a number, so the base step carries the bottom of the value's domain.
BASE = 0

GREEN, BLUE, YELLOW, ORANGE, RED, GREY = "green", "blue", "yellow", "orange", "red", "text"


def steps(*pairs: tuple[float, str], base: str = GREEN) -> dict:
    """Absolute thresholds: a base colour, then (value, colour) steps in ascending order."""
    return {
        "mode": "absolute",
        "steps": [{"color": base, "value": BASE}]
        + [{"color": color, "value": value} for value, color in pairs],
    }


def value_mappings(states: dict[int, tuple[str, str]]) -> list[dict]:
    """One value mapping: code -> (text, colour)."""
    return [
        {
            "type": "value",
            "options": {
                str(code): {"text": text, "color": color, "index": index}
                for index, (code, (text, color)) in enumerate(sorted(states.items()))
            },
        }
    ]


def target(
    expr: str,
    legend: str = "__auto",
    ref: str = "A",
    *,
    instant: bool = False,
    table: bool = False,
) -> dict:
    return {
        "datasource": DATASOURCE,
        "refId": ref,
        "expr": expr,
        "legendFormat": legend,
        "range": not instant,
        "instant": instant,
        "format": "table" if table else "time_series",
        "editorMode": "code",
    }


def targets(*queries: tuple[str, str], instant: bool = False, table: bool = False) -> list[dict]:
    """Several (expr, legend) queries with refIds A, B, C..."""
    return [
        target(expr, legend, chr(ord("A") + i), instant=instant, table=table)
        for i, (expr, legend) in enumerate(queries)
    ]


def _legend(calcs: list[str] | None = None, table: bool = False) -> dict:
    return {
        "displayMode": "table" if table else "list",
        "placement": "right" if table else "bottom",
        "showLegend": True,
        "calcs": calcs or [],
    }


_TOOLTIP = {"mode": "multi", "sort": "desc"}
_REDUCE_LAST = {"calcs": ["lastNotNull"], "fields": "", "values": False}


@dataclass
class Panel:
    """A panel before layout: type, text, queries and field/display options."""

    type: str
    title: str
    description: str
    targets: list[dict]
    unit: str
    w: int = 12
    h: int = 8
    thresholds: dict | None = None
    mappings: list[dict] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    custom: dict[str, Any] = field(default_factory=dict)
    transformations: list[dict] = field(default_factory=list)
    min: float | None = None
    max: float | None = None
    decimals: int | None = None
    color: dict | None = None

    def to_json(self, panel_id: int, x: int, y: int) -> dict:
        defaults: dict[str, Any] = {
            "unit": self.unit,
            "thresholds": self.thresholds or steps(),
            "mappings": self.mappings,
            "custom": self.custom,
        }
        if self.color:
            defaults["color"] = self.color
        for key in ("min", "max", "decimals"):
            if getattr(self, key) is not None:
                defaults[key] = getattr(self, key)
        panel = {
            "type": self.type,
            "id": panel_id,
            "title": self.title,
            "description": self.description,
            "datasource": DATASOURCE,
            "gridPos": {"h": self.h, "w": self.w, "x": x, "y": y},
            "targets": self.targets,
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": self.options,
        }
        if self.transformations:
            panel["transformations"] = self.transformations
        return panel


def timeseries(
    title: str,
    description: str,
    queries: list[dict],
    unit: str,
    *,
    stack: bool = False,
    bars: bool = False,
    fill: int = 10,
    thresholds: dict | None = None,
    show_thresholds: bool = False,
    legend_calcs: list[str] | None = None,
    **kw: Any,
) -> Panel:
    custom = {
        "drawStyle": "bars" if bars else "line",
        "lineWidth": 1,
        "fillOpacity": 80 if bars else fill,
        "showPoints": "never",
        "spanNulls": False,
        "stacking": {"mode": "normal" if stack else "none", "group": "A"},
        "thresholdsStyle": {"mode": "dashed" if show_thresholds else "off"},
    }
    options = {"legend": _legend(legend_calcs, table=bool(legend_calcs)), "tooltip": _TOOLTIP}
    return Panel(
        "timeseries",
        title,
        description,
        queries,
        unit,
        thresholds=thresholds,
        options=options,
        custom=custom,
        **kw,
    )


def stat(
    title: str,
    description: str,
    queries: list[dict],
    unit: str,
    *,
    thresholds: dict | None = None,
    w: int = 4,
    h: int = 4,
    color_mode: str = "value",
    graph: bool = True,
    **kw: Any,
) -> Panel:
    options = {
        "graphMode": "area" if graph else "none",
        "colorMode": color_mode,
        "justifyMode": "auto",
        "textMode": "auto",
        "wideLayout": True,
        "showPercentChange": False,
        "percentChangeColorMode": "standard",
        "orientation": "auto",
        "reduceOptions": _REDUCE_LAST,
    }
    return Panel(
        "stat",
        title,
        description,
        queries,
        unit,
        w=w,
        h=h,
        thresholds=thresholds,
        options=options,
        **kw,
    )


def bargauge(title: str, description: str, queries: list[dict], unit: str, **kw: Any) -> Panel:
    options = {
        "displayMode": "gradient",
        "valueMode": "color",
        "namePlacement": "auto",
        "showUnfilled": True,
        "sizing": "auto",
        "minVizWidth": 8,
        "minVizHeight": 16,
        "maxVizHeight": 300,
        "legend": {**_legend(), "showLegend": False},
        "reduceOptions": _REDUCE_LAST,
        "orientation": "horizontal",
    }
    return Panel("bargauge", title, description, queries, unit, options=options, **kw)


def heatmap_rows(
    title: str, description: str, queries: list[dict], unit: str, *, scheme: str, **kw: Any
) -> Panel:
    """A heatmap with one row per series (node × GPU over time), not a histogram."""
    options = {
        "calculate": False,
        "rowsFrame": {"layout": "unknown"},
        "color": {
            "mode": "scheme",
            "scheme": scheme,
            "fill": "dark-orange",
            "scale": "linear",
            "exponent": 0.5,
            "steps": 64,
            "reverse": False,
        },
        "showValue": "never",
        "cellGap": 1,
        "yAxis": {"axisPlacement": "left", "unit": "none"},
        "legend": {"show": True},
        "tooltip": {"mode": "single", "yHistogram": False, "showColorScale": True},
        "exemplars": {"color": "rgba(255,0,255,0.7)"},
        "cellValues": {"unit": unit},
    }
    custom = {"hideFrom": {"legend": False, "tooltip": False, "viz": False}}
    return Panel("heatmap", title, description, queries, unit, options=options, custom=custom, **kw)


def state_timeline(
    title: str, description: str, queries: list[dict], unit: str, **kw: Any
) -> Panel:
    options = {
        "showValue": "never",
        "rowHeight": 0.9,
        "mergeValues": True,
        "alignValue": "left",
        "legend": _legend(),
        "tooltip": {"mode": "single", "sort": "none"},
    }
    custom = {"fillOpacity": 80, "lineWidth": 0}
    return Panel(
        "state-timeline", title, description, queries, unit, options=options, custom=custom, **kw
    )


def table(
    title: str,
    description: str,
    queries: list[dict],
    unit: str,
    *,
    transformations: list[dict] | None = None,
    cell: str = "auto",
    sort_by: str | None = None,
    **kw: Any,
) -> Panel:
    options: dict[str, Any] = {
        "frameIndex": 0,
        "showHeader": True,
        "cellHeight": "sm",
        "footer": {"show": False, "reducer": ["sum"], "fields": [], "countRows": False},
    }
    if sort_by:
        options["sortBy"] = [{"displayName": sort_by, "desc": True}]
    custom: dict[str, Any] = {"align": "auto", "inspect": False, "filterable": True}
    if cell == "color-background":
        # `applyToRow` makes the cell options match exactly one branch of the schema's oneOf
        custom["cellOptions"] = {"type": cell, "mode": "gradient", "applyToRow": False}
    elif cell != "auto":
        raise ValueError(f"unsupported table cell type {cell!r}")
    return Panel(
        "table",
        title,
        description,
        queries,
        unit,
        options=options,
        custom=custom,
        transformations=transformations or [],
        **kw,
    )


def organize(exclude: list[str], rename: dict[str, str] | None = None) -> dict:
    """Hide and rename table columns."""
    return {
        "id": "organize",
        "options": {
            "excludeByName": dict.fromkeys(exclude, True),
            "renameByName": rename or {},
            "indexByName": {},
        },
    }


def matrix(row: str, column: str, value: str = "Value") -> dict:
    """Rows × columns grid from label columns (e.g. node × GPU)."""
    return {
        "id": "groupingToMatrix",
        "options": {"rowField": row, "columnField": column, "valueField": value},
    }


# --- variables -----------------------------------------------------------------------------


def datasource_variable() -> dict:
    return {
        "type": "datasource",
        "name": "datasource",
        "label": "Data source",
        "query": "prometheus",
        "regex": "",
        "hide": 0,
        "refresh": 1,
        "options": [],
        "includeAll": False,
        "multi": False,
    }


def query_variable(
    name: str,
    label: str,
    query: str,
    *,
    multi: bool = True,
    include_all: bool = True,
    description: str = "",
) -> dict:
    variable = {
        "type": "query",
        "name": name,
        "label": label,
        "description": description or label,
        "datasource": DATASOURCE,
        "query": query,
        "refresh": 2,
        "sort": 7,
        "regex": "",
        "hide": 0,
        "multi": multi,
        "includeAll": include_all,
        "options": [],
    }
    if include_all:
        variable["allValue"] = ".+"
    return variable


# --- layout and dashboard ------------------------------------------------------------------


@dataclass
class Row:
    title: str
    panels: list[Panel]


def layout(rows: list[Row]) -> list[dict]:
    """Flow panels left to right in rows of 24 columns; a row header above each section."""
    out: list[dict] = []
    next_id = 1
    y = 0
    for row in rows:
        out.append(
            {
                "type": "row",
                "id": next_id,
                "title": row.title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        next_id += 1
        y += 1
        x, line_height = 0, 0
        for panel in row.panels:
            if x + panel.w > 24:
                x, y, line_height = 0, y + line_height, 0
            out.append(panel.to_json(next_id, x, y))
            next_id += 1
            x += panel.w
            line_height = max(line_height, panel.h)
        y += line_height
    return out


def dashboard(
    uid: str,
    title: str,
    description: str,
    tags: list[str],
    variables: list[dict],
    rows: list[Row],
    *,
    refresh: str,
    time_from: str,
    links: list[dict] | None = None,
) -> dict:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": tags,
        "timezone": "browser",
        "editable": False,  # provisioned from code: edit dashboards/generate.py instead
        "graphTooltip": 1,
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "refresh": refresh,
        "time": {"from": time_from, "to": "now"},
        "timepicker": {},
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "links": links or [],
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "templating": {"list": [datasource_variable(), *variables]},
        "panels": layout(rows),
    }


def dashboard_links(tag: str) -> list[dict]:
    """A drop-down of the other dashboards with the same tag, keeping time and variables."""
    return [
        {
            "title": "GPU dashboards",
            "type": "dashboards",
            "tags": [tag],
            "asDropdown": True,
            "includeVars": True,
            "keepTime": True,
            "targetBlank": False,
            "icon": "external link",
            "tooltip": "",
            "url": "",
        }
    ]
