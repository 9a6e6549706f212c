"""The method tested on series it was not developed on: the Earth VCs in two halves.

The 8 Helios Earth VCs in ../shared (sorted by name) are split into half A (the 1st, 3rd, 5th
and 7th) and half B (the 2nd, 4th, 6th and 8th); the Earth total is left out (it sums both).
For each direction (develop on A, report on B, and the reverse):

- develop: bench/forecast_develop.py's procedure on the development half alone (its training
  part's pseudo-test weeks, its own pooled models) gives a rule;
- out of sample: the evaluation half, as its own panel (its pooled models learn from its 4 VCs
  only), is backtested on its test week (May 25–31) with that rule;
- in sample: the rule of the same grid that the same procedure would choose on the evaluation
  half's test week itself: what tuning on the test part would have reported.

Printed per direction and horizon for the evaluation half: the median and the worst per-VC MAE
(= WAPE) ratio to naive, the share of VCs over the issue's guards (h = 1: 2 %, h = 24: 5 %) and
the median P90 coverage, out of sample beside in sample. This tests the method (does what it
learns on some series hold on others?), not a number.

Usage: OMP_NUM_THREADS=1 python bench/forecast_robustness.py [--earth DIR] [--quick]
(`--quick`: bench/forecast_develop.py's two-rule grid and one calibration window, a smoke run)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from advisor.forecast import metrics as M
from advisor.forecast import rolling, selection
from advisor.forecast.selection import Rule
from bench import forecast_develop as dev
from bench.machine import describe


def halves(series: list[str]) -> tuple[list[str], list[str]]:
    """The VCs (not the total), sorted: odd and even positions."""
    vcs = sorted(s for s in series if not s.endswith("/total"))
    return vcs[0::2], vcs[1::2]


def test_scores(panel, rules: list[Rule]) -> pd.DataFrame:
    """Per rule × series × horizon on the panel's test week, in forecast_develop's columns."""
    start, _ = rolling.test_bounds(panel)
    origins = rolling.test_window(panel)
    test_start = int(origins[0])
    _picks, val = rolling.select_full(panel, dev.HORIZONS, dev.QUANTILES, test_start)
    fc = rolling.rolling_forecasts(
        panel, selection.CANDIDATES, dev.HORIZONS, dev.QUANTILES, origins
    )
    naive = fc[fc["model"] == selection.NAIVE]
    step = rolling.step_of(panel)
    rows = []
    for rule in rules:
        picks = selection.complete(selection.choose(val, rule), panel.series, dev.HORIZONS)
        adv = rolling.advisor_rows(fc, picks, dev.QUANTILES, step, rule, known=val)
        for (series, h), g in adv.groupby(["series", "horizon"]):
            ref = naive[(naive["series"] == series) & (naive["horizon"] == h)]
            rows.append(
                {
                    "data": "earth",
                    "week": start,
                    "rule": rule,
                    "series": series,
                    "horizon": h,
                    "mae": M.mae(g["actual"], g["point"]),
                    "naive": M.mae(ref["actual"], ref["point"]),
                    "coverage": M.coverage(g["actual"], g["q0.9"]),
                }
            )
    return pd.DataFrame(rows)


def figures(table: pd.DataFrame) -> dict[str, float]:
    """The evaluation half's figures per horizon."""
    table = table.assign(ratio=dev.ratios(table))
    out = {}
    for h, limit in dev.GUARDS.items():
        mine = table[table["horizon"] == h]
        out[f"h{h} median ratio"] = float(mine["ratio"].median())
        out[f"h{h} worst ratio"] = float(mine["ratio"].max())
        out[f"h{h} VCs over guard"] = float((mine["ratio"] > limit).mean())
        out[f"h{h} median P90 coverage"] = float(mine["coverage"].median())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--earth", help="a Helios Earth folder of VCs (default: ../shared's)")
    ap.add_argument("--quick", action="store_true", help="two rules, 7 days: a smoke run")
    args = ap.parse_args()
    print(describe())
    t0 = time.perf_counter()
    earth = dev.load("earth", path=args.earth)
    a, b = halves(earth.series)
    grid = [*(dev.QUICK_GRID if args.quick else dev.POINT_GRID)]
    days = (7,) if args.quick else dev.CALIBRATION_DAYS
    print(f"half A: {', '.join(a)}; half B: {', '.join(b)}")
    for develop_on, evaluate_on, names in (("A", "B", (a, b)), ("B", "A", (b, a))):
        mine, theirs = names
        rule = dev.develop(
            [dev.training(f"earth {develop_on}", earth.select(mine))],
            show=False,
            grid=grid,
            days=days,
        )
        panel = earth.select(theirs)
        # the in-sample choice: the same procedure on the evaluation half's test week
        points = test_scores(panel, grid)
        chosen, _ = dev.best_point(points)
        calibrated = test_scores(panel, dev.with_calibrations(chosen, days))
        in_sample, _ = dev.best_calibration(calibrated)
        outside = test_scores(panel, [rule])
        inside = calibrated[calibrated["rule"] == in_sample]
        shown = pd.DataFrame(
            {"out of sample": figures(outside), "in sample": figures(inside)}
        ).round(3)
        print(f"\ndeveloped on half {develop_on}: {rule}")
        print(f"chosen on half {evaluate_on}'s test week (in sample): {in_sample}")
        print(f"half {evaluate_on}'s test week, per-VC MAE ratio to naive and P90 coverage:")
        print(shown.to_string())
    print(f"\n{time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
