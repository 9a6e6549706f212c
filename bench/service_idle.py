"""Service idle-window cost: the runs panel, the idle section (release + held-back backtest) and
the demand forecast on a synthetic history of D days × P pools × a run every S seconds, and what
`idle_windows` alone costs on the uncapped history (the pooled quantile model beyond ~17 days).

`--nodes N` times the per-node part instead: N nodes of 8 GPUs × `--node-days` (16) days of
hourly runs through the history's per-node record (`NodeRecord.observe`, and its cost per run
at N nodes), `node_panel`, and the per-node idle windows (release + backtest, per-series rules)
for every node, for the service's default limit (`IDLE_MAX_NODES`; above it the rules also
learn from up to that many nodes picked by name, `_pool_nodes`) and for none (0: what listing
the nodes with their reasons costs alone).

Usage: python bench/service_idle.py [--days 14] [--pools 20] [--every 30] [--uncapped-days 21]
       python bench/service_idle.py --nodes 1000 [--node-days 16]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo's exporter, not bench/'s

from advisor.forecast import idle_windows, live, live_idle
from advisor.forecast.runs import hourly_of, node_panel, runs_panel
from advisor.history import NodeRecord
from advisor.settings import HORIZONS_H, IDLE_RISK, IDLE_WINDOWS_H
from bench.machine import describe


def history(days: int, pools: int, every: float, seed: int = 0) -> pd.DataFrame:
    """`History.pool_demand()`-shaped: per pool a piecewise-constant job process (arrivals with
    a daily cycle, sizes 1–8 GPUs scaled to the pool, ~3 h mean duration), read at every run."""
    rng = np.random.default_rng(seed)
    total = days * 86400.0
    t = np.arange(0, total, every)
    t = t + rng.uniform(0, 3, len(t))
    frames = []
    for j in range(pools):
        cap = float(rng.choice([64, 128, 256]))
        arr = np.sort(rng.uniform(0, total, days * 24 * 6))
        arr = arr[
            rng.uniform(size=len(arr)) < 0.5 + 0.4 * np.sin(2 * np.pi * (arr / 3600 % 24) / 24)
        ]
        size = rng.choice([1, 2, 4, 8], size=len(arr)) * cap / 64
        when = np.concatenate([arr, arr + rng.exponential(3 * 3600, len(arr))])
        order = np.argsort(when)
        level = np.cumsum(np.concatenate([size, -size])[order])
        at = np.searchsorted(when[order], t, side="right") - 1
        alloc = np.minimum(np.where(at >= 0, level[np.maximum(at, 0)], 0.0), cap)
        frames.append(
            pd.DataFrame(
                {"time": t, "pool": f"pool{j:02d}", "allocated_gpus": alloc, "capacity_gpus": cap}
            )
        )
    frame = pd.concat(frames).sort_values("time", kind="stable", ignore_index=True)
    frame["time"] = pd.Timestamp("2026-01-05", tz="UTC") + pd.to_timedelta(frame["time"], "s")
    return frame


def timed(fn, *args, **kwargs):
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return time.perf_counter() - t0, out


def node_levels(days: int, nodes: int, seed: int = 0) -> np.ndarray:
    """(hours, nodes) allocated GPUs of 8-GPU nodes at each hourly run: per node a job process
    with a daily cycle (sizes 1, 2, 4, 8 GPUs, ~3 h mean duration, ~0.4 arrivals an hour)."""
    rng = np.random.default_rng(seed)
    total = days * 86400.0
    t = np.arange(days * 24) * 3600.0 + 60.0
    out = np.empty((len(t), nodes))
    for j in range(nodes):
        arr = np.sort(rng.uniform(0, total, days * 24 // 2))
        arr = arr[
            rng.uniform(size=len(arr)) < 0.5 + 0.4 * np.sin(2 * np.pi * (arr / 3600 % 24) / 24)
        ]
        size = rng.choice([1, 2, 4, 8], size=len(arr)).astype(float)
        when = np.concatenate([arr, arr + rng.exponential(3 * 3600, len(arr))])
        order = np.argsort(when)
        level = np.cumsum(np.concatenate([size, -size])[order])
        at = np.searchsorted(when[order], t, side="right") - 1
        out[:, j] = np.minimum(np.where(at >= 0, level[np.maximum(at, 0)], 0.0), 8.0)
    return out


def bench_nodes(days: int, nodes: int) -> None:
    levels = node_levels(days, nodes)
    names = np.array([f"node{j:04d}" for j in range(nodes)], dtype=object)
    pools = np.array([f"pool{j % 20:02d}" for j in range(nodes)], dtype=object)
    capacity = np.full(nodes, 8.0)
    start = pd.Timestamp("2026-01-05", tz="UTC").timestamp()
    record = NodeRecord(live_idle.IDLE_MAX_H)
    t0 = time.perf_counter()
    for h, row in enumerate(levels):  # a new model's arrays each run, as from a source
        record.observe(start + h * 3600.0 + 60.0, names.copy(), pools.copy(), row, capacity)
    record.observe(start + len(levels) * 3600.0 + 60.0, names, pools, levels[-1], capacity)
    t_record = time.perf_counter() - t0
    snap = record.snapshot()
    size = sum(a.nbytes for a in (snap.peak_held, snap.capacity, snap.seen))
    print(
        f"nodes: {nodes} x {days} days of hourly runs: NodeRecord.observe "
        f"{1e3 * t_record / (len(levels) + 1):.2f} ms per run, record {size / 2**20:.1f} MiB"
    )
    t_panel, panel = timed(node_panel, snap)
    print(f"  node_panel {t_panel:.2f} s ({len(panel.index)} h x {len(panel.series)} nodes)")
    for limit in sorted({nodes, live_idle.IDLE_MAX_NODES, 0}, reverse=True):  # 0: the listing alone
        t_idle, doc = timed(
            live_idle.idle_section,
            None,
            IDLE_WINDOWS_H,
            IDLE_RISK,
            panel,
            limit,
        )
        computed = [n for n in doc["nodes"] if any(w["available"] for w in n["windows"])]
        print(
            f"  per-node idle windows, {min(limit, nodes)} of {nodes} nodes served "
            f"(release + backtest, windows {IDLE_WINDOWS_H}, {doc['node_history_hours']} h): "
            f"{t_idle:.2f} s"
        )
        for window in doc["windows"]:
            mine = [
                w
                for n in computed
                for w in n["windows"]
                if w["window"] == window and w["available"]
            ]
            if mine:
                v = np.mean([w["backtest"]["violation_ratio"]["advisor"] for w in mine])
                vmax = np.max([w["backtest"]["violation_ratio"]["advisor"] for w in mine])
                vb = np.mean(
                    [w["backtest"]["violation_ratio"][live_idle.IDLE_BASELINE] for w in mine]
                )
                c = np.nanmean(
                    [
                        np.nan if (x := w["backtest"]["capture_ratio"]["advisor"]) is None else x
                        for w in mine
                    ]
                )
                print(
                    f"    {window}: node-mean held-back violations {v:.3f} (max {vmax:.3f}; "
                    f"baseline {vb:.3f}), capture {c:.3f}"
                )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--days", type=int, default=14)
    ap.add_argument("--pools", type=int, default=20)
    ap.add_argument("--every", type=float, default=30.0)
    ap.add_argument("--uncapped-days", type=int, default=21)
    ap.add_argument("--nodes", type=int, default=0, help="time the per-node part on N nodes")
    ap.add_argument("--node-days", type=int, default=live_idle.IDLE_MAX_H // 24)
    args = ap.parse_args()
    print(describe())
    if args.nodes:
        bench_nodes(args.node_days, args.nodes)
        return
    frame = history(args.days, args.pools, args.every)
    print(
        f"history: {args.days} days x {args.pools} pools x a run every {args.every:g} s "
        f"= {len(frame)} rows"
    )
    t_runs, runs = timed(runs_panel, frame)
    t_hourly, hourly = timed(hourly_of, runs)
    t_idle, idle = timed(live_idle.idle_section, runs, IDLE_WINDOWS_H, IDLE_RISK)
    t_demand, _ = timed(live.forecast_panel, hourly, HORIZONS_H, None)
    print(f"  runs_panel {t_runs:.2f} s, hourly_of {t_hourly:.2f} s")
    print(
        f"  idle_section (release + backtest, windows {IDLE_WINDOWS_H}, "
        f"{idle['history_hours']} h seen) {t_idle:.2f} s"
    )
    print(f"  demand forecast (horizons 1, 6, 24 h; idle section excluded) {t_demand:.2f} s")
    rows = [(p["pool"], w) for p in idle["pools"] for w in p["windows"] if w["available"]]
    for window in idle["windows"]:
        mine = [w for _, w in rows if w["window"] == window]
        if mine:
            v = np.mean([w["backtest"]["violation_ratio"]["advisor"] for w in mine])
            c = np.mean([w["backtest"]["capture_ratio"]["advisor"] for w in mine])
            vb = np.mean([w["backtest"]["violation_ratio"][live_idle.IDLE_BASELINE] for w in mine])
            print(
                f"  {window}: pool-mean held-back violations {v:.3f} (baseline {vb:.3f}), "
                f"capture {c:.3f}, over {mine[0]['backtest']['test_origins']} origins"
            )
    if args.uncapped_days:
        big = runs_panel(history(args.uncapped_days, args.pools, 60.0))
        t_big, out = timed(idle_windows, big, IDLE_WINDOWS_H, IDLE_RISK)
        print(
            f"uncapped idle_windows on {args.uncapped_days} days x {args.pools} pools at 60 s: "
            f"{t_big:.1f} s (rule: {out['rule'].iloc[0].split(':')[0]})"
        )


if __name__ == "__main__":
    main()
