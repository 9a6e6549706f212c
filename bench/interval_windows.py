"""How much does one test window's P90 coverage and pinball gain vary? Sliding windows over the
training part only.

Issue #4 asks the h = 24 P90 for coverage within 0.88–0.92 and a pinball loss ≥ 10 % below naive
plus empirical quantile, on one test fortnight (Philly) or week (Earth). This runs the backtest
protocol with the test part moved inside the training part (selection still on the days before
it), slides a window of the test part's length over it day by day, and prints per window the
coverage and pinball of naive + empirical quantile and of the advisor: the spread a single window
allows, measured on data no test figure comes from.

Usage: python bench/interval_windows.py [--philly PATH] [--earth DIR] [--horizon 24]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from advisor.forecast import io, rolling
from advisor.forecast import metrics as M
from bench.machine import describe

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "forecast"
# (name, input, first test origin, end of the origins, window days): every target lies before the
# published test split (Philly Dec 1 2017, Earth May 25 2020); selection uses the days before.
CASES = (
    ("philly", DATA / "philly" / "philly_node_sequence.csv", "2017-10-24", "2017-11-30", 14),
    ("earth", DATA / "helios-earth", "2020-05-10", "2020-05-24", 7),
)
BAND = (0.88, 0.92)
GAIN = -10.0  # pinball difference vs naive, in %, that the target asks for


def windows(fc: pd.DataFrame, horizon: int, days: int, q: float = 0.9) -> pd.DataFrame:
    """Per series and window start: coverage and pinball of naive and the advisor at level q."""
    col = f"q{q:g}"
    rows = []
    for series, g in fc[fc["horizon"] == horizon].groupby("series"):
        wide = g.pivot_table(index="origin", columns="model", values=col, aggfunc="first")
        actual = g.drop_duplicates("origin").set_index("origin")["actual"].reindex(wide.index)
        first, last = wide.index.min().normalize(), wide.index.max().normalize()
        for start in pd.date_range(first, last - pd.Timedelta(days=days - 1), freq="D"):
            sel = (wide.index >= start) & (wide.index < start + pd.Timedelta(days=days))
            y = actual[sel].to_numpy(float)
            rec = {"series": series, "start": start.date()}
            for model in ("naive", "advisor"):
                f = wide.loc[sel, model].to_numpy(float)
                rec[f"coverage_{model}"] = M.coverage(y, f)
                rec[f"pinball_{model}"] = M.pinball(y, f, q)
            rec["diff_pct"] = 100 * (rec["pinball_advisor"] / rec["pinball_naive"] - 1)
            rows.append(rec)
    return pd.DataFrame(rows)


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per series: the range of each window's coverage, and how many windows meet each part."""

    def in_band(c):
        return (c >= BAND[0]) & (c <= BAND[1])

    out = table.assign(
        naive_in_band=in_band(table["coverage_naive"]),
        advisor_in_band=in_band(table["coverage_advisor"]),
        advisor_gain=table["diff_pct"] <= GAIN,
    )
    out["advisor_meets_both"] = out["advisor_in_band"] & out["advisor_gain"]
    return out.groupby("series").agg(
        windows=("start", "size"),
        naive_cov_min=("coverage_naive", "min"),
        naive_cov_max=("coverage_naive", "max"),
        naive_in_band=("naive_in_band", "sum"),
        advisor_cov_min=("coverage_advisor", "min"),
        advisor_cov_max=("coverage_advisor", "max"),
        advisor_in_band=("advisor_in_band", "sum"),
        advisor_diff_min=("diff_pct", "min"),
        advisor_diff_max=("diff_pct", "max"),
        advisor_gain=("advisor_gain", "sum"),
        advisor_meets_both=("advisor_meets_both", "sum"),
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--horizon", type=int, default=24)
    ap.add_argument("--cases", default="philly,earth")
    ap.add_argument("--philly", help="the Philly node file (default: ../shared's)")
    ap.add_argument("--earth", help="a Helios Earth folder of VCs (default: ../shared's)")
    args = ap.parse_args()
    print(describe())
    wanted = set(args.cases.split(","))
    for name, path, start, end, days in CASES:
        if name not in wanted:
            continue
        path = getattr(args, name) or path
        t0 = time.perf_counter()
        panel = io.hourly(io.load(str(path)), str(path))
        _, fc, picks = rolling.run(panel, (args.horizon,), (0.5, 0.9), start, end)
        table = windows(fc, args.horizon, days)
        elapsed = time.perf_counter() - t0
        with pd.option_context("display.width", 200, "display.max_rows", 200):
            print(
                f"\n{name}: {days}-day windows of origins {start} … {end} (training part), "
                f"h = {args.horizon}, {elapsed:.1f} s"
            )
            print(table.round(3).to_string(index=False))
            print(summary(table).round(3).to_string())
            # where the days before the window are too few to validate, the advisor is naive
            print(picks[["series", "pick", "windows", "validated"]].to_string(index=False))
        if name == "earth":
            vcs = table[~table["series"].str.endswith("/total")]
            med = vcs.groupby("start")[["coverage_advisor", "diff_pct"]].median()
            hits = ((med["coverage_advisor"].between(*BAND)) & (med["diff_pct"] <= GAIN)).sum()
            print(
                f"median over the VCs: coverage {med['coverage_advisor'].min():.3f}–"
                f"{med['coverage_advisor'].max():.3f}, pinball diff {med['diff_pct'].min():.1f}–"
                f"{med['diff_pct'].max():.1f} %; windows meeting both parts: {hits} of {len(med)}"
            )


if __name__ == "__main__":
    main()
