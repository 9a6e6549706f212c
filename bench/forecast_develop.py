"""How the advisor's rule (`advisor.forecast.selection.Rule`) was chosen: on training parts only.

The development procedure, run before any test part was scored with the rule:

1. Per data set, every candidate is forecast over its training part (rolling origin, one origin
   an hour from day 8, refit daily, every target before the published test split).
2. Pseudo-test weeks slide over that part: 7-day windows ending at the test split, then every
   2 days earlier while at least 5 days of validation origins lie before the window. For each
   week and each rule of the grid, the rule picks on the (≤ 21) days before the week, exactly as
   the backtest picks before its test part, and the advisor is scored on the week.
3. Point rule (windows × margin × combine): fewest series-weeks worse than naive by more than
   5 % MAE at h = 24 plus by more than 2 % at h = 1 (the issue's guards), then the lowest
   geometric mean of the MAE ratio to naive over both horizons (ratios clipped to [0.1, 10]).
4. Calibration window (days of the advisor's own errors behind its quantiles), for the chosen
   point rule: the most series-weeks whose P90 covers 0.85–0.95 of the week's hours at h = 1
   and h = 24 together; a tie goes to the longer window (more errors, a steadier quantile).

The product's `RULE` is what this prints for Philly, Helios Earth and Alibaba together;
bench/forecast_robustness.py runs the same procedure on half of the Earth VCs and scores the
other half's test week.

Usage: python bench/forecast_develop.py [--data philly,earth,alibaba] [--philly PATH] [--earth DIR]
       [--alibaba PATH] [--weeks N] [--quick]
(`--weeks` keeps the latest N pseudo-test weeks per data set; `--quick` scores two point rules and
one calibration window: a smoke run, not the procedure)
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from advisor.forecast import io, rolling, selection
from advisor.forecast import metrics as M
from advisor.forecast.panel import Panel
from advisor.forecast.selection import Rule
from bench.machine import describe

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
INPUTS = {
    "philly": SHARED / "forecast" / "philly" / "philly_node_sequence.csv",
    "earth": SHARED / "forecast" / "helios-earth",
    "alibaba": SHARED / "openb" / "openb_pod_list_default.csv",
}
HORIZONS = (1, 24)
QUANTILES = (0.5, 0.9)
WEEK_DAYS, STEP_DAYS, MIN_VAL_DAYS, VAL_DAYS = 7, 2, 5, 21
GUARDS = {1: 1.02, 24: 1.05}  # worse than naive by more than this share counts against a rule
BAND = (0.85, 0.95)
POINT_GRID = tuple(
    Rule(windows=w, margin=m, combine=c)
    for w, m, c in itertools.product((3, 1), (0.0, 0.02, 0.05), ("median", "best"))
)
CALIBRATION_DAYS = (7, 14, 28)
MAX_WEEKS = 0  # 0: every pseudo-test week (`--weeks`)


@dataclass(frozen=True)
class Training:
    """A data set's training part: its candidates' rolling forecasts and the test split."""

    name: str
    panel: Panel
    forecasts: pd.DataFrame
    test_start: pd.Timestamp


def training(name: str, panel: Panel) -> Training:
    """Every candidate's forecasts over the training part (targets before the test split)."""
    start, _ = rolling.test_bounds(panel)
    test_start = int(np.searchsorted(panel.index, start))
    origins = np.arange(24 * 8, test_start)
    fc = rolling.rolling_forecasts(
        panel, selection.CANDIDATES, HORIZONS, QUANTILES, origins, 24, max_target=test_start - 1
    )
    return Training(name, panel, fc, pd.Timestamp(start))


def weeks(data: Training) -> list[pd.Timestamp]:
    """The pseudo-test weeks' first days, latest first."""
    first = data.forecasts["origin"].min()
    out, start = [], data.test_start - pd.Timedelta(days=WEEK_DAYS)
    while start - first >= pd.Timedelta(days=MIN_VAL_DAYS):
        out.append(start)
        start -= pd.Timedelta(days=STEP_DAYS)
    return out[:MAX_WEEKS] if MAX_WEEKS else out


def score_rules(data: Training, rules: Sequence[Rule]) -> pd.DataFrame:
    """Per pseudo-test week × rule × series × horizon: the advisor's MAE, naive's, and the
    advisor's P90 coverage on the week."""
    fc = data.forecasts
    step = rolling.step_of(data.panel)
    rows = []
    for start in weeks(data):
        end = start + pd.Timedelta(days=WEEK_DAYS)
        target = fc["origin"] + pd.to_timedelta(fc["horizon"], unit="h")
        val = fc[(fc["origin"] >= start - pd.Timedelta(days=VAL_DAYS)) & (target < start)]
        before = fc[fc["origin"] < start]
        week = fc[(fc["origin"] >= start) & (fc["origin"] < end)]
        naive = week[week["model"] == selection.NAIVE]
        for rule in rules:
            picks = selection.complete(selection.choose(val, rule), data.panel.series, HORIZONS)
            adv = rolling.advisor_rows(week, picks, QUANTILES, step, rule, known=before)
            pick = picks.set_index(["series", "horizon"])["pick"]
            for (series, h), g in adv.groupby(["series", "horizon"]):
                ref = naive[(naive["series"] == series) & (naive["horizon"] == h)]
                rows.append(
                    {
                        "data": data.name,
                        "week": start,
                        "rule": rule,
                        "series": series,
                        "horizon": h,
                        "mae": M.mae(g["actual"], g["point"]),
                        "naive": M.mae(ref["actual"], ref["point"]),
                        "coverage": M.coverage(g["actual"], g["q0.9"]),
                        "pick": pick[(series, h)],
                    }
                )
    return pd.DataFrame(rows)


def ratios(table: pd.DataFrame) -> pd.Series:
    """MAE over naive's; 1 where both are exact, 10 (the clip) where only naive is."""
    both_exact = (table["naive"] == 0) & (table["mae"] == 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = table["mae"] / table["naive"]
    return r.where(~both_exact, 1.0).fillna(10.0).clip(0.1, 10.0)


def point_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per rule: the guards' shares, the geometric mean ratio, and the per-horizon medians."""
    table = table.assign(ratio=ratios(table))
    out = {}
    for rule, g in table.groupby("rule", sort=False):
        rec = {}
        for h, limit in GUARDS.items():
            mine = g[g["horizon"] == h]["ratio"]
            rec[f"over_h{h}"] = float((mine > limit).mean())
            rec[f"median_h{h}"] = float(mine.median())
            rec[f"max_h{h}"] = float(mine.max())
        rec["guards"] = rec["over_h1"] + rec["over_h24"]
        rec["gmean"] = float(np.exp(np.log(g["ratio"]).mean()))
        rec["cases"] = len(g)
        out[rule] = rec
    return pd.DataFrame.from_dict(out, orient="index")


def coverage_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per rule: the share of series-weeks whose P90 covers within `BAND`, per horizon."""
    inside = table["coverage"].between(*BAND)
    out = table.assign(inside=inside).groupby(["rule", "horizon"], sort=False)["inside"]
    wide = out.mean().unstack("horizon")
    wide.columns = [f"in_band_h{h}" for h in wide.columns]
    wide["in_band"] = table.assign(inside=inside).groupby("rule", sort=False)["inside"].mean()
    median = table.groupby(["rule", "horizon"], sort=False)["coverage"].median().unstack()
    median.columns = [f"median_cov_h{h}" for h in median.columns]
    return wide.join(median)


def members_share(table: pd.DataFrame) -> pd.DataFrame:
    """Per model × horizon: the share of series-weeks whose pick has it as a member."""
    models = [
        (h, m)
        for p, h in zip(table["pick"], table["horizon"], strict=True)
        for m in selection.members_of(p)
    ]
    counts = pd.DataFrame(models, columns=["horizon", "model"]).value_counts().unstack("horizon")
    weeks_per_h = table.groupby("horizon").size()
    return (counts.fillna(0) / weeks_per_h).sort_values(list(counts.columns), ascending=False)


def best_point(table: pd.DataFrame) -> tuple[Rule, pd.DataFrame]:
    """Step 3's choice among the rules scored in `table`, and the summary it was made on."""
    summary = point_summary(table)
    order = sorted(summary.index, key=lambda r: (summary.loc[r, "guards"], summary.loc[r, "gmean"]))
    return order[0], summary.loc[order]


def best_calibration(table: pd.DataFrame) -> tuple[Rule, pd.DataFrame]:
    """Step 4's choice among the rules scored in `table`, and the summary it was made on."""
    cover = coverage_summary(table)
    best = max(cover.index, key=lambda r: (cover.loc[r, "in_band"], r.calibration_days))
    return best, cover


def with_calibrations(rule: Rule, days: tuple[int, ...] = CALIBRATION_DAYS) -> list[Rule]:
    """`rule` with each calibration window of the grid."""
    return [Rule(rule.windows, rule.margin, rule.combine, d) for d in days]


def develop(
    sets: Iterable[Training],
    show: bool = True,
    grid: Sequence[Rule] = POINT_GRID,
    days: tuple[int, ...] = CALIBRATION_DAYS,
) -> Rule:
    """The procedure of the module docstring on `sets`: the point rule, then its calibration
    (`grid` and `days`: smaller grids for a smoke run)."""
    sets = list(sets)
    points = pd.concat([score_rules(d, grid) for d in sets], ignore_index=True)
    chosen, summary = best_point(points)
    covered = pd.concat(
        [score_rules(d, with_calibrations(chosen, days)) for d in sets], ignore_index=True
    )
    best, cover = best_calibration(covered)
    if show:
        with pd.option_context("display.width", 200, "display.max_columns", 20):
            print(
                "\npoint rules (guards = share of series-weeks over the h = 1 and h = 24 guards):"
            )
            print(summary.round(3).to_string())
            print("\ncalibration windows for the chosen point rule:")
            print(cover.round(3).to_string())
            print(f"\nshare of series-weeks whose advisor has each model as a member ({chosen}):")
            print(members_share(points[points["rule"] == chosen]).round(3).to_string())
    return best


QUICK_GRID = (Rule(), Rule(windows=1, combine="best"))  # `--quick`: two rules, 7 days


def load(name: str, series: Sequence[str] | None = None, path: str | None = None) -> Panel:
    """A data set's hourly panel (from `path`, default the shared copy; only `series`, if given)."""
    source = path or str(INPUTS[name])
    panel = io.hourly(io.load(source), source)
    return panel.select(list(series)) if series else panel


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="philly,earth,alibaba")
    for name in INPUTS:
        ap.add_argument(f"--{name}", help=f"the {name} input (default: ../shared's)")
    ap.add_argument("--weeks", type=int, default=0, help="latest pseudo-test weeks (0: all)")
    ap.add_argument("--quick", action="store_true", help="two point rules, 7 days: a smoke run")
    args = ap.parse_args()
    global MAX_WEEKS
    MAX_WEEKS = args.weeks
    print(describe())
    t0 = time.perf_counter()
    sets = []
    for name in args.data.split(","):
        data = training(name, load(name, path=getattr(args, name)))
        print(
            f"{name}: training origins {data.forecasts['origin'].min()} … "
            f"{data.forecasts['origin'].max()}, {len(weeks(data))} pseudo-test weeks, "
            f"{len(data.panel.series)} series"
        )
        sets.append(data)
    rule = develop(sets, grid=QUICK_GRID, days=(7,)) if args.quick else develop(sets)
    print(f"\nchosen: {rule} ({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
