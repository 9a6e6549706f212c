"""The service's hourly demand forecast under the backtest's rule: what it costs and how its
held-back WAPE compares with naive's.

The service (`advisor.forecast.live.demand_section`) redoes, once an hour, a rolling-origin
backtest over the last 14 days of origins for every pool and horizon (1, 6, 24 h) with every
candidate of the backtest (`selection.CANDIDATES`), picks by the backtest's rule on the earlier
half and scores the advisor on the later half. Here it runs on the hourly panels of the public
traces, cut to the `--days` days before each of `--ends` "now" instants (2 days apart, the
latest at the end of the data). Per panel: the wall time of one hourly forecast, how many pool ×
horizon picks are not naive alone, the median held-back WAPE of the advisor and of naive, and on
how many pool × horizon the advisor's held-back WAPE is better or worse than naive's.

    OMP_NUM_THREADS=1 python bench/service_forecast.py
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from advisor.forecast.io import load
from advisor.forecast.live import NAIVE, demand_section
from advisor.forecast.panel import Panel
from bench.machine import describe

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "forecast"
INPUTS = {
    "philly": DATA / "philly" / "philly_node_sequence.csv",
    "earth": DATA / "helios-earth",
}
HORIZONS = (1, 6, 24)


def cut(panel: Panel, end: pd.Timestamp, days: int) -> Panel:
    """The `days` days of hours before `end`, as the service's history would hold them."""
    keep = (panel.index >= end - pd.Timedelta(days=days)) & (panel.index < end)
    return Panel(
        panel.values[keep],
        panel.capacity[keep],
        panel.name,
        meta=dict(panel.meta),
        within={k: v[keep] for k, v in panel.within.items()},
    )


def scores(doc: dict) -> list[tuple[str, float, float]]:
    """(pick, its held-back WAPE, naive's) per available pool × horizon with both served."""
    out = []
    for pool in doc["pools"]:
        for entry in pool["horizons"]:
            wape = entry.get("backtest", {}).get("wape_ratio", {})
            mine, naive = wape.get(entry.get("model")), wape.get(NAIVE)
            if entry.get("available") and mine is not None and naive is not None:
                out.append((entry["model"], mine, naive))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=21, help="history before each end (21)")
    parser.add_argument("--ends", type=int, default=2, help="'now' instants, 2 days apart (2)")
    parser.add_argument("--inputs", default="philly,earth", help="philly,earth")
    args = parser.parse_args()
    print(describe(f"horizons {HORIZONS}, {args.days} days of history"))
    print(
        f"{'input':<8} {'end':<17} {'pools':>5} {'seconds':>8} {'not naive':>10} "
        f"{'median WAPE advisor / naive':>28} {'better/worse than naive':>24}"
    )
    total, better, worse = 0.0, 0, 0
    for key in args.inputs.split(","):
        hourly = load(str(INPUTS[key])).resample("h")
        last = hourly.index[-1] + pd.Timedelta(hours=1)
        for k in range(args.ends):
            end = last - pd.Timedelta(days=2 * k)
            panel = cut(hourly, end, args.days)
            started = time.perf_counter()
            doc = demand_section(panel, HORIZONS)
            seconds = time.perf_counter() - started
            mine = scores(doc)
            up = sum(m < n for _, m, n in mine)
            down = sum(m > n for _, m, n in mine)
            combined = sum(pick != NAIVE for pick, _, _ in mine)
            med = [np.median([s[i] for s in mine]) if mine else np.nan for i in (1, 2)]
            total, better, worse = total + seconds, better + up, worse + down
            print(
                f"{key:<8} {end:%Y-%m-%d %H:%M} {len(panel.series):>5} {seconds:>8.1f} "
                f"{combined:>4} of {len(mine):<3} {100 * med[0]:>12.2f}% / {100 * med[1]:.2f}% "
                f"{up:>14} / {down:<8}"
            )
    print(
        f"all: {total:.1f} s; held-back WAPE of the advisor better than naive's on {better}, "
        f"worse on {worse} pool-horizons"
    )


if __name__ == "__main__":
    main()
