"""Service idle-window cost: the runs panel, the idle section (release + held-back backtest) and
the demand forecast on a synthetic history of D days × P pools × a run every S seconds, and what
`idle_windows` alone costs on the uncapped history (the pooled quantile model beyond ~17 days).

Usage: python bench/service_idle.py [--days 14] [--pools 20] [--every 30] [--uncapped-days 21]
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np
import pandas as pd

from advisor.forecast import idle_windows
from advisor.service import forecast as F


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


def timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--days", type=int, default=14)
    ap.add_argument("--pools", type=int, default=20)
    ap.add_argument("--every", type=float, default=30.0)
    ap.add_argument("--uncapped-days", type=int, default=21)
    args = ap.parse_args()
    print(
        f"machine: {platform.platform()}, python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}"
    )
    frame = history(args.days, args.pools, args.every)
    print(
        f"history: {args.days} days x {args.pools} pools x a run every {args.every:g} s "
        f"= {len(frame)} rows"
    )
    t_runs, runs = timed(F.runs_panel, frame)
    t_hourly, hourly = timed(F.hourly_of, runs)
    t_idle, idle = timed(F.idle_section, runs, F.IDLE_WINDOWS_H, F.IDLE_RISK)
    t_demand, _ = timed(F.forecast_panel, hourly, (1, 6, 24), None)
    print(f"  runs_panel {t_runs:.2f} s, hourly_of {t_hourly:.2f} s")
    print(
        f"  idle_section (release + backtest, windows {F.IDLE_WINDOWS_H}, "
        f"{idle['history_hours']} h seen) {t_idle:.2f} s"
    )
    print(f"  demand forecast (horizons 1, 6, 24 h; idle section excluded) {t_demand:.2f} s")
    rows = [(p["pool"], w) for p in idle["pools"] for w in p["windows"] if w["available"]]
    for window in idle["windows"]:
        mine = [w for _, w in rows if w["window"] == window]
        if mine:
            v = np.mean([w["backtest"]["violation_ratio"]["advisor"] for w in mine])
            c = np.mean([w["backtest"]["capture_ratio"]["advisor"] for w in mine])
            vb = np.mean([w["backtest"]["violation_ratio"][F.IDLE_BASELINE] for w in mine])
            print(
                f"  {window}: pool-mean held-back violations {v:.3f} (baseline {vb:.3f}), "
                f"capture {c:.3f}, over {mine[0]['backtest']['test_origins']} origins"
            )
    if args.uncapped_days:
        big = F.runs_panel(history(args.uncapped_days, args.pools, 60.0))
        t_big, out = timed(idle_windows, big, F.IDLE_WINDOWS_H, F.IDLE_RISK)
        print(
            f"uncapped idle_windows on {args.uncapped_days} days x {args.pools} pools at 60 s: "
            f"{t_big:.1f} s (rule: {out['rule'].iloc[0].split(':')[0]})"
        )


if __name__ == "__main__":
    main()
