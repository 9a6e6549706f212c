"""Idle windows from the advisor's own history: the GPUs that stay wholly free for the whole
next W hours, per pool (from the runs panel of held GPUs) and per node (from the history's
per-node hours), each with its held-back backtest (`idle_section`).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from advisor.forecast import idle as I
from advisor.forecast import idle_windows
from advisor.forecast.panel import Panel
from advisor.forecast.runs import RunsPanel
from advisor.forecast.served import finite, horizon_label, label, last_finite, message, ratio
from advisor.settings import IDLE_MAX_NODES

# Idle windows (`idle_section`); the defaults of --forecast.idle-windows, --forecast.idle-risk
# and --forecast.idle-max-nodes are `advisor.settings`' IDLE_WINDOWS_H, IDLE_RISK, IDLE_MAX_NODES
IDLE_BASELINE = "min_past_w"  # release what stayed free over the past W hours
IDLE_FIRST_H = 48  # idle's per-series rules calibrate from hour 48 on (yesterday's window)
IDLE_MIN_CALIBRATION_H = 24  # calibration origins before the held-back hours
IDLE_MIN_TEST = 24  # held-back origins with an observed outcome needed to show a release
IDLE_TEST_H = 7 * 24  # at most this many origins are held back
IDLE_MAX_H = 16 * 24  # the history idle windows see (cost, and the method the backtest measures)
IDLE_NODE_METHOD = "rules"  # per node: the per-series rules only (no quantile model, no pooled λ)

log = logging.getLogger(__name__)


def idle_needs(window_h: int) -> int:
    """Complete hours of history a window needs: the rules' first `IDLE_FIRST_H` hours, a day of
    calibration origins, `IDLE_MIN_TEST` held-back origins, and W hours after each of both for
    their outcome."""
    return IDLE_FIRST_H + IDLE_MIN_CALIBRATION_H + IDLE_MIN_TEST + 2 * window_h


def idle_or_error(
    runs: RunsPanel | None,
    windows_h: Sequence[int],
    risk: float,
    nodes: Panel | None = None,
    max_nodes: int = IDLE_MAX_NODES,
) -> dict:
    """`idle_section`; a failure there is logged and reported in the section, so it does not
    take the demand forecast down with it."""
    try:
        return idle_section(runs, windows_h, risk, nodes, max_nodes)
    except Exception as error:
        log.exception("idle-window forecast failed")
        return {**_idle_head(windows_h, risk, max_nodes), "error": message(error)}


def _idle_head(
    windows_h: Sequence[int], risk: float, max_nodes: int = IDLE_MAX_NODES
) -> dict[str, Any]:
    return {
        "risk": float(risk),
        "windows": [horizon_label(w) for w in sorted(set(windows_h))],
        "baseline": IDLE_BASELINE,
        "max_history_hours": IDLE_MAX_H,
        "history_hours": 0,
        "origin": None,
        "valid_from": None,
        "error": None,
        "pools": [],
        "node_history_hours": 0,
        "nodes_total": 0,
        "max_nodes": int(max_nodes),
        "node_error": None,
        "nodes": [],
    }


def idle_section(
    runs: RunsPanel | None,
    windows_h: Sequence[int],
    risk: float,
    nodes: Panel | None = None,
    max_nodes: int = IDLE_MAX_NODES,
) -> dict[str, Any]:
    """Per pool and window W: the GPUs `advisor.forecast.idle_windows` releases as free for the
    whole next W hours at `risk` (idle in an hour = capacity − the hour's peak held GPUs: a GPU
    with any share handed out is not idle), and how that release did on the history's own
    held-back hours (`advisor.forecast.idle.backtest`, the same method calibrated on the hours
    before them: its violation and capture ratios and those of `IDLE_BASELINE`).

    Both see the runs panel of the last `IDLE_MAX_H` complete hours, aggregated by its own
    coverage rule (`RunsPanel`). The release is decided at the end of the last complete hour
    (`origin`) and covers the W hours from `valid_from`. A window without `idle_needs(W)` hours,
    a pool whose last complete hour is masked (no release from older hours) and a pool with
    fewer than `IDLE_MIN_TEST` scored held-back hours get no release, with the reason.

    The same per node (`nodes`, `node_panel`; `_idle_series` serves both), with the per-series
    rules only (`IDLE_NODE_METHOD`) and for at most `max_nodes` nodes: those with the most GPUs
    idle in the last complete hour; the others are listed with the reason. A failure of the
    node part is reported in `node_error` and leaves the pools as they are.
    """
    doc = _idle_head(windows_h, risk, max_nodes)
    windows = sorted(set(int(w) for w in windows_h))
    if runs is not None:
        last_hour = runs.index[-1].floor("h")
        hours, times, doc["pools"] = _idle_series(
            runs.since(last_hour - pd.Timedelta(hours=IDLE_MAX_H - 1)), windows, risk, "pool"
        )
        doc.update(
            history_hours=hours,
            origin=label(times[-1]),
            valid_from=label(times[-1] + pd.Timedelta(hours=1)),
        )
    if nodes is not None:
        try:
            _node_idle(doc, nodes, windows, risk, max_nodes)
        except Exception as error:
            log.exception("per-node idle-window forecast failed")
            doc["nodes"], doc["node_error"] = [], message(error)
    return doc


def _node_idle(
    doc: dict[str, Any], nodes: Panel, windows: list[int], risk: float, max_nodes: int
) -> None:
    """`idle_section`'s per-node part, into `doc`."""
    start = nodes.index[-1] - pd.Timedelta(hours=IDLE_MAX_H - 1)
    keep = nodes.index >= start
    nodes = Panel(nodes.values[keep], nodes.capacity[keep], nodes.name, meta=dict(nodes.meta))
    pools = nodes.meta.get("pools", {})
    times = nodes.index  # a full hourly grid already: its last row is the last complete hour
    now = np.maximum(nodes.capacity.to_numpy(float)[-1] - nodes.values.to_numpy(float)[-1], 0.0)
    names = nodes.series  # a new list per access: read once (1,000s of nodes)
    # the most GPUs idle now first (masked last), then by name: deterministic
    order = sorted(
        range(len(names)),
        key=lambda j: (not np.isfinite(now[j]), -np.nan_to_num(now[j]), names[j]),
    )
    chosen = sorted(order[: max(0, int(max_nodes))])
    entries: list[dict[str, Any]] = []
    if chosen:
        served = [names[j] for j in chosen]
        pool = _pool_nodes(nodes, _held_back_start(len(times), windows), int(max_nodes))
        computed = set(served) | set(pool)
        hours, _, entries = _idle_series(
            nodes.select([name for name in names if name in computed]),
            windows,
            risk,
            "node",
            IDLE_NODE_METHOD,
            pooled_over=pool,
            serve=served,
        )
    else:
        hours = len(times)
    left = sorted(set(range(len(names))) - set(chosen))
    reason = (
        f"not among the {int(max_nodes)} nodes with the most GPUs idle in the last complete "
        "hour (the per-node limit)"
    )
    cap = nodes.capacity.to_numpy(float)
    for j in left:
        entries.append(
            {
                "node": names[j],
                "capacity_gpus": last_finite(cap[:, j]),
                "current_idle_gpus": finite(now[j]),
                "windows": [
                    {"window": horizon_label(w), "available": False, "reason": reason}
                    for w in windows
                ],
            }
        )
    rank = {name: i for i, name in enumerate(names[j] for j in order)}
    doc["nodes"] = [
        {"node": e["node"], "pool": str(pools.get(e["node"], "")), **e}
        for e in sorted(entries, key=lambda e: rank[e["node"]])
    ]
    doc.update(node_history_hours=hours, nodes_total=len(names))
    if doc["origin"] is None:
        doc.update(origin=label(times[-1]), valid_from=label(times[-1] + pd.Timedelta(hours=1)))


def _held_back_start(hours: int, windows: Sequence[int]) -> int:
    """The first held-back origin of `_idle_series`' backtest on `hours` complete hours (`hours`
    where no window has enough of them: nothing is held back)."""
    ready = [w for w in windows if hours >= idle_needs(w)]
    if not ready:
        return hours
    widest = max(ready)
    return max(IDLE_FIRST_H + IDLE_MIN_CALIBRATION_H + widest, hours - widest - IDLE_TEST_H)


def _pool_nodes(nodes: Panel, before: int, limit: int) -> list[str]:
    """The nodes the per-node rules' pooled model and margin learn from: those with a reading
    in the first `before` hours (before the held-back part), at most `limit` of them, picked by
    a hash of the name. Neither depends on an hour after a held-back origin, as the served nodes
    (the most idle now) do; on a fleet of at most `limit` nodes that all have such a reading they
    are the served nodes, and the releases are those of a pool of all nodes."""
    seen = np.isfinite(nodes.values.to_numpy(float)[:before]).any(axis=0)
    names = [name for name, s in zip(nodes.series, seen, strict=True) if s]
    if len(names) <= limit:
        return names

    def by_hash(name: str) -> tuple[bytes, str]:
        return hashlib.blake2b(name.encode(), digest_size=8).digest(), name

    return sorted(names, key=by_hash)[:limit]


def _idle_series(
    panel: Panel,
    windows: list[int],
    risk: float,
    kind: str,
    method: str = "auto",
    pooled_over: Sequence[str] | None = None,
    serve: Sequence[str] | None = None,
) -> tuple[int, pd.DatetimeIndex, list[dict[str, Any]]]:
    """Per series (a pool or a node: `kind`) of an idle panel and window: the release and its
    held-back backtest, as `idle_section` serves them. `method` and `pooled_over`:
    `idle_windows`' and `backtest`'s ("auto": theirs; "rules": the per-series rules only).
    `serve`: the series to return (None: all); the others only feed the pooled model. Returns
    (complete hours seen, their times, one entry per served series)."""
    idle, cap, times = I.hourly_idle(panel)
    hours, last = len(times), len(times) - 1
    ready = [w for w in windows if hours >= idle_needs(w)]
    released: dict[tuple[str, int], dict[str, Any]] = {}
    scores: dict[tuple[str, int, str], dict[str, float]] = {}
    counts: dict[tuple[str, int], int] = {}
    test_from = None
    if ready:
        for row in idle_windows(panel, ready, risk, method, pooled_over).to_dict("records"):
            released[(row["series"], int(row["window_h"]))] = row
        start = _held_back_start(hours, windows)
        test_from = times[start]
        decisions: dict[int, pd.DataFrame] = {}
        table = I.backtest(
            panel,
            ready,
            risk,
            test_from=test_from,
            test_to=times[last] + pd.Timedelta(hours=1),
            releases=decisions,
            method=method,
            pooled_over=pooled_over,
        )
        for row in table.to_dict("records"):
            if row["model"] in ("advisor", IDLE_BASELINE):
                scores[(row["series"], int(row["window_h"]), row["model"])] = row
        for w, frame in decisions.items():
            # a series without capacity is left out of the backtest: it releases 0
            frame = frame.reindex(columns=panel.series, fill_value=0.0)
            truth = I.window_min(idle, w)[times.get_indexer(frame.index)]
            scored = np.isfinite(truth) & np.isfinite(frame.to_numpy(float))
            for j, series in enumerate(frame.columns):
                counts[(str(series), int(w))] = int(scored[:, j].sum())
    entries = []
    wanted = None if serve is None else set(serve)
    for j, series in enumerate(panel.series):
        if wanted is not None and series not in wanted:
            continue
        entry: dict[str, Any] = {
            kind: series,
            "capacity_gpus": last_finite(cap[:, j]),
            "current_idle_gpus": finite(idle[last, j]),
            "windows": [],
        }
        for w in windows:
            entry["windows"].append(
                {
                    "window": horizon_label(w),
                    **_idle_window(
                        series,
                        w,
                        hours,
                        idle[last, j],
                        released,
                        scores,
                        counts,
                        test_from,
                        kind,
                    ),
                }
            )
        entries.append(entry)
    return hours, times, entries


def _idle_window(
    series: str,
    w: int,
    hours: int,
    idle_now: float,
    released: dict[tuple[str, int], dict[str, Any]],
    scores: dict[tuple[str, int, str], dict[str, Any]],
    counts: dict[tuple[str, int], int],
    test_from: pd.Timestamp | None,
    kind: str = "pool",
) -> dict[str, Any]:
    def absent(reason: str) -> dict[str, Any]:
        return {"available": False, "reason": reason}

    if hours < idle_needs(w):
        return absent(f"needs {idle_needs(w)} complete hours of history, has {hours}")
    if not np.isfinite(idle_now):
        return absent(
            f"the last complete hour has too few runs for this {kind} (source gap or new "
            f"{kind}): no release from older hours"
        )
    n = counts.get((series, w), 0)
    if n < IDLE_MIN_TEST:
        return absent(f"{n} held-back hours with an observed outcome, needs {IDLE_MIN_TEST}")
    row = released.get((series, w))
    if row is None or not np.isfinite(row["release"]):
        return absent(f"no release: the {kind}'s capacity or allocation is unknown")
    models = ("advisor", IDLE_BASELINE)
    if row["rule"] == "no_capacity":  # no usable GPU in the history: releases 0, never wrong
        method = "no_capacity"
        violation: dict[str, float | None] = dict.fromkeys(models, 0.0)
        capture: dict[str, float | None] = dict.fromkeys(models)
    else:
        mine = {m: scores.get((series, w, m), {}) for m in models}
        method = str(mine["advisor"].get("params", ""))
        violation = {m: ratio(r.get("violation_rate", np.nan)) for m, r in mine.items()}
        capture = {m: ratio(r.get("capture", np.nan)) for m, r in mine.items()}
    return {
        "available": True,
        "until": label(pd.Timestamp(row["as_of"]) + pd.Timedelta(hours=1 + w)),
        "release_gpus": float(row["release"]),
        "rule": str(row["rule"]),
        "backtest": {
            "test_from": label(test_from),
            "test_origins": n,
            "method": method,
            "violation_ratio": violation,
            "capture_ratio": capture,
        },
    }
