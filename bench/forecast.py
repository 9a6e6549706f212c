"""Forecasting benchmark: fit + forecast N series × D days hourly, and the full Philly backtest.

Prints wall times, the machine, and ratios against the naive baseline measured in the same run.
Usage: python bench/forecast.py [--series 1000] [--days 30] [--horizons 1,24] [--philly PATH]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from advisor.forecast import api, io, rolling
from advisor.forecast.panel import Panel
from bench.machine import describe

PHILLY = (
    Path(__file__).resolve().parents[1]
    / ".."
    / "shared"
    / "data"
    / "forecast"
    / "philly"
    / "philly_node_sequence.csv"
)


def synthetic(n_series: int, days: int, seed: int = 0) -> Panel:
    rng = np.random.default_rng(seed)
    idx = pd.date_range("2024-01-01", periods=days * 24, freq="h")
    hour = np.asarray(idx.hour)[:, None]
    cap = rng.choice([16, 32, 64, 128], size=n_series).astype(float)
    walk = np.cumsum(rng.normal(0, 0.02, (len(idx), n_series)), axis=0)
    y = cap * np.clip(0.5 + 0.15 * np.sin(2 * np.pi * hour / 24) + walk, 0, 1)
    cols = [f"pool{i:04d}" for i in range(n_series)]
    return Panel(
        pd.DataFrame(np.round(y), index=idx, columns=cols),
        pd.DataFrame(np.broadcast_to(cap, y.shape), index=idx, columns=cols),
        "synthetic",
    )


def timed(fn, *args, **kw) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn(*args, **kw)
    return time.perf_counter() - t0, out


def whole_command(philly: str, horizons, t_demand: float) -> None:
    """The command a user runs, with both decision replays: the idle replay runs in a second
    process beside the demand backtest (`forecast.cli.IdleReplayJob`); the baseline is the two
    run one after the other in this process."""
    import subprocess
    import tempfile

    from advisor.forecast import idle, powerdown

    raw = io.load(philly)
    t_idle, _ = timed(idle.backtest, raw, (1, 4), 0.05, intervals=True)
    t_power, _ = timed(powerdown.replay, raw)
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m", "advisor.cli", "backtest", philly]
        command += ["--horizons", ",".join(map(str, horizons)), "--quantiles", "0.5,0.9"]
        command += ["--out", out]
        t_cli, _ = timed(subprocess.run, command, check=True, capture_output=True)
    print(
        "\nthe whole command (gpu-defrag backtest PHILLY --out DIR, idle, power and reservation replays):"
    )
    one_by_one = t_demand + t_idle + t_power
    print(
        f"  demand {t_demand:.2f} s + idle {t_idle:.2f} s + power-down {t_power:.2f} s, "
        f"one after the other in this process: {one_by_one:7.2f} s"
    )
    print(
        f"  whole command (its own process, start-up and writing included), idle replay beside "
        f"the demand backtest: {t_cli:7.2f} s (ratio {t_cli / one_by_one:.2f}; target < 60 s)"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--series", type=int, default=1000)
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--horizons", default="1,24")
    ap.add_argument("--philly", default=str(PHILLY))
    args = ap.parse_args()
    horizons = tuple(int(h) for h in args.horizons.split(","))
    print(describe())
    panel = synthetic(args.series, args.days)
    print(
        f"\nfit + forecast {args.series} series × {args.days} days hourly, horizons {horizons}, quantiles 0.1/0.5/0.9"
    )
    base, _ = timed(api.forecast, panel, horizons, (0.1, 0.5, 0.9), model="naive")
    print(f"  {'naive':14s} {base:7.2f} s  (ratio 1.00)")
    for model in ("holt_winters", "linear", "gbm"):
        t, out = timed(api.forecast, panel, horizons, (0.1, 0.5, 0.9), model=model)
        assert len(out) == args.series * len(horizons)
        print(f"  {model:14s} {t:7.2f} s  (ratio {t / base:.1f}× naive)")
    if Path(args.philly).exists():
        p = io.load(args.philly).resample("h")
        t_naive, _ = timed(rolling.run, p, horizons, (0.5, 0.9), candidates=("naive",))
        t_full, (metrics, _, _) = timed(rolling.run, p, horizons, (0.5, 0.9))
        print(
            f"\nPhilly rolling-origin backtest (Dec 1–14, {len(rolling.CANDIDATES)} candidates + advisor, selection on training):"
        )
        print(f"  naive only     {t_naive:7.2f} s")
        print(
            f"  full           {t_full:7.2f} s  (ratio {t_full / t_naive:.1f}× naive-only; target < 60 s)"
        )
        mae = metrics.pivot_table(index="horizon", columns="model", values="mae")
        for h in horizons:
            print(
                f"  h={h}: advisor MAE {mae.loc[h, 'advisor']:.2f} vs naive {mae.loc[h, 'naive']:.2f}"
            )
        whole_command(args.philly, horizons, t_full)
    else:
        print(f"\nPhilly file not found at {args.philly}; skipped the backtest timing")


if __name__ == "__main__":
    main()
