"""Plotly figures for the app, built from plain frames so they can be checked without a browser.

The fleet heatmap is the one that must scale (1,000 nodes x 8 GPUs): one `go.Heatmap` trace
with a pre-formatted hover text per cell, one line trace for every NVLink-island boundary and
one for the group separators, so the figure stays a handful of traces whatever the fleet size.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from advisor.app.data import STATE_LABELS
from advisor.contract import GPU_STATE_CODES

STATE_COLORS: dict[str, str] = {
    "free": "#2ca02c",
    "busy": "#1f77b4",
    "allocated_idle": "#ff7f0e",
    "unhealthy": "#d62728",
    "mig_free": "#98df8a",  # light green: room, but only for MIG instances
    "owner_unknown": "#7f7f7f",  # grey: in use, nobody known to hold it
    "reserved": "#9467bd",  # planned states only (Actions page): held for a goal job
}
COLOR_BY: dict[str, str] = {
    "state": "State",
    "utilization": "Utilization",
    "memory_ratio": "Memory used",
    "node_score": "Node fragmentation",
}
ROW_PX = 16  # pixel height per node row when names are shown
MAX_LABELLED_ROWS = 80
# Colour legend under the grid, so the right margin is free for the group names.
COLORBAR = {
    "orientation": "h",
    "x": 0,
    "xanchor": "left",
    "y": 0,
    "yanchor": "top",
    "ypad": 4,
    "len": 0.95,
    "thickness": 14,
}


@dataclass(frozen=True)
class Grid:
    """The heatmap's cells: rows = nodes in group order, columns = GPU index."""

    nodes: list[str]
    groups: list[str]  # "pool · model · rack" per row
    width: int
    cell: np.ndarray  # int64 (rows, width): row in the frame, -1 = no such GPU
    blocks: list[str]  # "pool · model" per row: the coarser grouping of large fleets


_DIGITS = re.compile(r"(\d+)")


def natural_key(text: str) -> tuple:
    """'rack-9' before 'rack-10': digit runs compare as numbers."""
    return tuple(int(part) if part.isdigit() else part for part in _DIGITS.split(text))


def grid_of(frame: pd.DataFrame) -> Grid:
    """Rows grouped by pool, GPU model and rack (then node name); columns by GPU index."""
    if frame.empty:
        return Grid([], [], 0, np.zeros((0, 0), dtype=np.int64), [])
    per_node = frame.drop_duplicates("node")[["node", "pool", "gpu_model", "rack"]]
    columns = [per_node[k].astype(str).tolist() for k in ("pool", "gpu_model", "rack", "node")]
    sort_keys = [tuple(natural_key(v) for v in row) for row in zip(*columns, strict=True)]
    order = sorted(range(len(per_node)), key=sort_keys.__getitem__)
    per_node = per_node.iloc[order]
    nodes = per_node["node"].tolist()
    columns = zip(per_node["pool"], per_node["gpu_model"], per_node["rack"], strict=True)
    parts = [(pool, model, rack) for pool, model, rack in columns]
    groups = [" · ".join(p for p in part if p) or "(ungrouped)" for part in parts]
    blocks = [" · ".join(p for p in part[:2] if p) or "(ungrouped)" for part in parts]
    row_of = {node: i for i, node in enumerate(nodes)}
    width = int(frame["gpu"].max()) + 1
    cell = np.full((len(nodes), width), -1, dtype=np.int64)
    rows = frame["node"].map(row_of).to_numpy()
    cell[rows, frame["gpu"].to_numpy()] = np.arange(len(frame))
    return Grid(nodes, groups, width, cell, blocks)


def _fmt(value: float, pattern: str) -> str:
    return (
        "n/a"
        if value is None or (isinstance(value, float) and math.isnan(value))
        else pattern.format(value)
    )


def hover_texts(frame: pd.DataFrame) -> list[str]:
    """One hover text per frame row: where, state, job, tenant, utilization, memory, island."""
    texts = []
    for node, gpu, state, jobs, tenants, util, used, total, island, pool, model in zip(
        frame["node"].tolist(),
        frame["gpu"].tolist(),
        frame["state"].tolist(),
        frame["jobs"].tolist(),
        frame["tenants"].tolist(),
        frame["utilization"].tolist(),
        frame["memory_used_gib"].tolist(),
        frame["memory_total_gib"].tolist(),
        frame["nvlink_island"].tolist(),
        frame["pool"].tolist(),
        frame["gpu_model"].tolist(),
        strict=True,
    ):
        texts.append(
            f"<b>{node} / GPU {gpu}</b><br>{pool} · {model}<br>state: {STATE_LABELS[state]}"
            f"<br>job: {jobs or '-'}<br>tenant: {tenants or '-'}"
            f"<br>utilization: {_fmt(util * 100 if util == util else util, '{:.0f}%')}"
            f"<br>memory: {_fmt(used, '{:.1f}')} / {_fmt(total, '{:.0f}')} GiB"
            f"<br>NVLink island: {island if island >= 0 else 'unknown'}"
        )
    return texts


def _island_lines(frame: pd.DataFrame, grid: Grid) -> tuple[list[float | None], list[float | None]]:
    """Vertical segments between neighbouring GPUs of one node that sit in different islands."""
    islands = np.full(grid.cell.shape, -2, dtype=np.int64)
    present = grid.cell >= 0
    islands[present] = frame["nvlink_island"].to_numpy()[grid.cell[present]]
    left, right = islands[:, :-1], islands[:, 1:]
    split = (left != right) & (left >= 0) & (right >= 0)
    xs: list[float | None] = []
    ys: list[float | None] = []
    for row, col in zip(*np.nonzero(split), strict=True):
        xs += [col + 0.5, col + 0.5, None]
        ys += [row - 0.5, row + 0.5, None]
    return xs, ys


def _group_lines(
    grid: Grid, labels: list[str], separators: list[str]
) -> tuple[list[float | None], list[float | None], list[tuple[int, str]]]:
    """Horizontal separators where `separators` changes, and (first row, label) where
    `labels` changes."""
    xs: list[float | None] = []
    ys: list[float | None] = []
    starts: list[tuple[int, str]] = []
    for row in range(len(labels)):
        if row == 0 or labels[row] != labels[row - 1]:
            starts.append((row, labels[row]))
        if row and separators[row] != separators[row - 1]:
            xs += [-0.5, grid.width - 0.5, None]
            ys += [row - 0.5, row - 0.5, None]
    return xs, ys, starts


def fleet_heatmap(frame: pd.DataFrame, color_by: str = "state") -> go.Figure:
    """Every GPU as a cell. `color_by`: state (discrete), utilization or memory_ratio (0..1)."""
    grid = grid_of(frame)
    rows = len(grid.nodes)
    present = grid.cell >= 0
    z = np.full(grid.cell.shape, np.nan)
    texts = np.full(grid.cell.shape, "", dtype=object)
    texts[present] = np.array(hover_texts(frame), dtype=object)[grid.cell[present]]
    if color_by == "state":
        # the contract's four states always; app-only ones (reserved) only when present
        names = sorted(GPU_STATE_CODES, key=GPU_STATE_CODES.get)
        names += [
            name for name in STATE_COLORS if name not in names and name in set(frame["state"])
        ]
        position = {name: i for i, name in enumerate(names)}
        z[present] = frame["state"].map(position).to_numpy(dtype=float)[grid.cell[present]]
        n = len(names)
        scale = []
        for i, name in enumerate(names):
            scale += [[i / n, STATE_COLORS[name]], [(i + 1) / n, STATE_COLORS[name]]]
        heat = go.Heatmap(
            z=z,
            zmin=-0.5,
            zmax=n - 0.5,
            colorscale=scale,
            colorbar={
                "tickvals": list(range(n)),
                "ticktext": [STATE_LABELS[name] for name in names],
                **COLORBAR,
            },
        )
    else:
        z[present] = frame[color_by].to_numpy(dtype=float)[grid.cell[present]]
        heat = go.Heatmap(
            z=z,
            zmin=0.0,
            zmax=1.0,
            colorscale="Viridis",
            colorbar={
                "title": {"text": COLOR_BY.get(color_by, color_by), "side": "top"},
                "tickformat": ".0%",
                **COLORBAR,
            },
        )
    heat.update(
        text=texts,
        hoverinfo="text",
        hoverongaps=False,
        zsmooth=False,
        xgap=1 if rows <= 200 else 0,
        ygap=1 if rows <= 200 else 0,
        showscale=True,
    )
    fig = go.Figure(heat)
    ix, iy = _island_lines(frame, grid)
    if ix:
        fig.add_trace(
            go.Scatter(
                x=ix,
                y=iy,
                mode="lines",
                line={"color": "black", "width": 3},
                hoverinfo="skip",
                name="NVLink island boundary",
                showlegend=True,
            )
        )
    labelled = rows <= MAX_LABELLED_ROWS
    # Small fleets: a line between racks. Large ones: only between pools/models (a line per
    # rack would hide the cells), racks still named on the right.
    gx, gy, starts = _group_lines(grid, grid.groups, grid.groups if labelled else grid.blocks)
    if gx:
        fig.add_trace(
            go.Scatter(
                x=gx,
                y=gy,
                mode="lines",
                line={"color": "#333333", "width": 2},
                hoverinfo="skip",
                showlegend=False,
            )
        )
    if labelled:
        height = int(np.clip(rows * ROW_PX + 160, 360, 1400))
    else:  # at least 2 px per node, up to 1,000 nodes
        height = int(np.clip(rows * 2 + 160, 1100, 2200))
    if labelled:
        yaxis = {"tickvals": list(range(rows)), "ticktext": grid.nodes}
    else:  # too many rows to name each node
        yaxis = {"showticklabels": False}
    # Group names to the right of the rows they cover (at most ~40, evenly thinned).
    step = max(1, math.ceil(len(starts) / 40))
    ends = [r for r, _ in starts[1:]] + [rows]
    annotations = [  # set once: add_annotation one by one re-validates all (quadratic)
        {
            "x": 1.0,
            "xref": "paper",
            "xanchor": "left",
            "xshift": 6,
            "y": (first + end - 1) / 2,
            "yref": "y",
            "text": group,
            "showarrow": False,
            "font": {"size": 10},
        }
        for (first, group), end in list(zip(starts, ends, strict=True))[::step]
    ]
    fig.update_layout(
        annotations=annotations,
        height=height,
        margin={"l": 10, "r": 230, "t": 30, "b": 90},
        xaxis={
            "title": {"text": "GPU index"},
            "tickvals": list(range(grid.width)),
            "side": "top",
            "range": [-0.5, grid.width - 0.5],
            "showgrid": False,
            "zeroline": False,
        },
        yaxis={
            **yaxis,
            "range": [rows - 0.5, -0.5],  # top row first; no autorange padding from lines
            "showgrid": False,
            "zeroline": False,
            "tickfont": {"size": 10},
        },
        legend={"orientation": "h", "y": 0, "yanchor": "top", "x": 1, "xanchor": "right"},
        plot_bgcolor="#eeeeee",
    )
    return fig


def trend_figure(trend: pd.DataFrame) -> go.Figure:
    """Fragmentation rate (left axis) with free and allocated-idle GPUs (right axis)."""
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=trend["time"],
            y=trend["fragment_rate"],
            name="FGD fragmentation rate",
            mode="lines+markers",
        )
    )
    for column, name in (
        ("free_gpus", "free GPUs"),
        ("allocated_idle_gpus", "allocated idle GPUs"),
    ):
        fig.add_trace(
            go.Scatter(x=trend["time"], y=trend[column], name=name, mode="lines", yaxis="y2")
        )
    fig.update_layout(
        height=320,
        margin={"l": 10, "r": 10, "t": 30, "b": 10},
        yaxis={"title": {"text": "fragmentation rate"}, "tickformat": ".1%", "rangemode": "tozero"},
        yaxis2={
            "title": {"text": "GPUs"},
            "overlaying": "y",
            "side": "right",
            "rangemode": "tozero",
            # its own round ticks, not ones synced to the rate axis' grid (17, 33.9, 50.9, …)
            "tickmode": "auto",
            "showgrid": False,
        },
        legend={"orientation": "h", "y": 1.12},
    )
    return fig


def type_figure(capacity: pd.DataFrame, demand: pd.DataFrame) -> go.Figure:
    """Free capacity per GPU model next to the pending demand per allowed-model spec."""
    fig = go.Figure()
    if not capacity.empty:
        fig.add_trace(
            go.Bar(
                x=capacity["gpu_model"],
                y=capacity["free_capacity_gpus"],
                name="free capacity (GPUs)",
            )
        )
    if not demand.empty:
        fig.add_trace(
            go.Bar(x=demand["gpu_spec"], y=demand["pending_gpus"], name="pending demand (GPUs)")
        )
    fig.update_layout(height=300, margin={"l": 10, "r": 10, "t": 30, "b": 10}, barmode="group")
    return fig


FAN_PAST_H = 72  # hours of observed demand drawn before the fan


def fan_chart(hourly: pd.DataFrame, fan: pd.DataFrame, pool: str) -> go.Figure:
    """One pool's allocated GPUs: the complete hours the forecast learned from (the last
    `FAN_PAST_H`), then from the last complete hour a fan over the coming hours and days: the
    q0.1–q0.9 band, the median and the point forecast at each horizon, and the capacity. A
    horizon without an interval (too few known errors) leaves a gap in the band, never a
    zero-width band."""
    fig = go.Figure()
    past = hourly[hourly["pool"] == pool].sort_values("hour")
    if len(past):
        past = past[past["hour"] > past["hour"].max() - pd.Timedelta(hours=FAN_PAST_H)]
    fig.add_trace(
        go.Scatter(
            x=past["hour"],
            y=past["allocated_gpus"],
            name="allocated (hourly mean)",
            mode="lines",
            line={"color": "#1f77b4"},
            connectgaps=False,
        )
    )
    if len(fan) > 1:
        fig.add_trace(
            go.Scatter(
                x=fan["time"],
                y=fan["q0.9"],
                mode="lines",
                line={"width": 0, "color": "#ff7f0e"},
                showlegend=False,
                hoverinfo="skip",
                connectgaps=False,
            )
        )
        fig.add_trace(
            go.Scatter(
                x=fan["time"],
                y=fan["q0.1"],
                name="forecast 10–90 %",
                mode="lines",
                line={"width": 0, "color": "#ff7f0e"},
                fill="tonexty",
                fillcolor="rgba(255,127,14,0.25)",
                hoverinfo="skip",
                connectgaps=False,
            )
        )
        fig.add_trace(
            go.Scatter(
                x=fan["time"],
                y=fan["q0.5"],
                name="forecast median",
                mode="lines",
                line={"color": "#ff7f0e", "dash": "dot"},
            )
        )
        ahead = fan.iloc[1:]
        fig.add_trace(
            go.Scatter(
                x=ahead["time"],
                y=ahead["point"],
                name="forecast",
                mode="markers",
                marker={"color": "#d62728", "size": 7},
                text=ahead["horizon"],
                customdata=ahead[["q0.1", "q0.9"]].to_numpy(),
                hovertemplate="+%{text}: %{y:.1f} GPUs (10–90 %: %{customdata[0]:.1f}–"
                "%{customdata[1]:.1f})<extra></extra>",
            )
        )
    capacity = past["capacity_gpus"].dropna()
    if len(capacity):
        end = fan["time"].max() if len(fan) else past["hour"].max()
        fig.add_trace(
            go.Scatter(
                x=[past["hour"].min(), end],
                y=[capacity.iloc[-1]] * 2,
                name="capacity",
                mode="lines",
                line={"color": "#7f7f7f", "dash": "dash", "width": 1},
            )
        )
    fig.update_layout(
        height=360,
        margin={"l": 10, "r": 10, "t": 30, "b": 10},
        yaxis={"title": {"text": "GPUs allocated"}, "rangemode": "tozero"},
        legend={"orientation": "h", "y": 1.15},
        hovermode="x unified",
    )
    return fig
