"""Why the advisor service forecasts with the cheap candidates only: cost and gain of adding the
learned ones to its hourly forecast.

The service (`advisor.forecast.live.demand_section`) redoes, once an hour, a rolling-origin
backtest over the last 14 days of origins for every pool and horizon (1, 6, 24 h), picks a model
per pool on the earlier half and scores it on the later half. Here it runs on the hourly panels
of the public traces, cut to the `--days` days before each of `--ends` "now" instants (2 days
apart, the latest at the end of the data), with three candidate sets:
- baseline: the service's cheap candidates (`CANDIDATES`: naive, last reading, seasonal naive,
  same-hour mean, Holt-Winters);
- + linear: the ridge model on the backtest's features;
- + learned: linear, gradient boosting and their combination with naive, as in the CLI backtest.
For each: the wall time of one hourly forecast, how often a learned model is picked, the median
held-back WAPE of the picks, and on how many pool × horizon the pick's held-back WAPE is better or
worse than the baseline set's pick (ties, mostly the same pick, are not counted).

    OMP_NUM_THREADS=1 python bench/service_candidates.py
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from advisor.forecast.io import Panel, load
from advisor.forecast.live import CANDIDATES, demand_section
from advisor.settings import HORIZONS_H
from bench.machine import describe

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "forecast"
INPUTS = {
    "philly": DATA / "philly" / "philly_node_sequence.csv",
    "earth": DATA / "helios-earth",
}
SETS = {
    "baseline": CANDIDATES,
    "+ linear": (*CANDIDATES, "linear"),
    "+ learned": (*CANDIDATES, "linear", "gbm", "combo"),
}
HORIZONS = HORIZONS_H  # the service's default horizons


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


def picks(doc: dict) -> dict[tuple[str, int], tuple[str, float]]:
    """(pool, horizon) -> (picked model, its held-back WAPE) where both are served."""
    out = {}
    for pool in doc["pools"]:
        for entry in pool["horizons"]:
            wape = entry.get("backtest", {}).get("wape_ratio", {}).get(entry.get("model"))
            if entry.get("available") and wape is not None:
                out[(pool["pool"], entry["horizon"])] = (entry["model"], wape)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=21, help="history before each end (21)")
    parser.add_argument("--ends", type=int, default=2, help="'now' instants, 2 days apart (2)")
    parser.add_argument("--inputs", default="philly,earth", help="philly,earth")
    args = parser.parse_args()
    print(describe(f"horizons {HORIZONS}, {args.days} days of history"))
    print(
        f"{'input':<8} {'end':<17} {'set':<10} {'pools':>5} {'seconds':>8} {'x base':>7} "
        f"{'learned picks':>13} {'median WAPE':>11} {'better/worse than base':>22}"
    )
    seconds_by_set = dict.fromkeys(SETS, 0.0)
    duels = {name: [0, 0] for name in SETS}  # held-back WAPE better / worse than the baseline's
    for key in args.inputs.split(","):
        hourly = load(str(INPUTS[key])).resample("h")
        last = hourly.index[-1] + pd.Timedelta(hours=1)
        for k in range(args.ends):
            end = last - pd.Timedelta(days=2 * k)
            panel = cut(hourly, end, args.days)
            base: dict = {}
            base_s = 0.0
            for name, candidates in SETS.items():
                started = time.perf_counter()
                doc = demand_section(panel, HORIZONS, candidates)
                seconds = time.perf_counter() - started
                mine = picks(doc)
                base, base_s = (mine, seconds) if name == "baseline" else (base, base_s)
                better = sum(w < base[c][1] for c, (_, w) in mine.items() if c in base)
                worse = sum(w > base[c][1] for c, (_, w) in mine.items() if c in base)
                learned = sum(m not in CANDIDATES for m, _ in mine.values())
                median = np.median([w for _, w in mine.values()]) if mine else np.nan
                seconds_by_set[name] += seconds
                duels[name][0] += better
                duels[name][1] += worse
                print(
                    f"{key:<8} {end:%Y-%m-%d %H:%M} {name:<10} {len(panel.series):>5} "
                    f"{seconds:>8.1f} {seconds / base_s:>6.1f}x {learned:>6} of {len(mine):<5} "
                    f"{100 * median:>10.2f}% {better:>12} / {worse:<8}"
                )
    base_s = seconds_by_set["baseline"]
    for name, seconds in seconds_by_set.items():
        better, worse = duels[name]
        print(
            f"all: {name:<10} {seconds:7.1f} s ({seconds / base_s:.1f}x baseline); held-back "
            f"WAPE of the pick better than the baseline's pick on {better}, worse on {worse} "
            "pool-horizons"
        )


if __name__ == "__main__":
    main()
