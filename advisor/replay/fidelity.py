"""Compare replay results with the FGD paper's published figures (its table of unallocated GPU %
at 100 % arrival, mean over seeds 42-51; fragmentation-anchors.md §4.3).

    python -m advisor.replay.fidelity OUT_DIR [OUT_DIR ...]

reads each `OUT_DIR/summary.csv` and prints a markdown table: ours vs the paper per trace and
policy, with the difference and whether it is within tolerance (0.5 pp, 1.0 pp for Random).
"""

from __future__ import annotations

import csv
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

POLICIES = ("random", "dotprod", "clustering", "packing", "bestfit", "fgd")
TOLERANCE = {"random": 1.0}
DEFAULT_TOLERANCE = 0.5

# Unallocated GPU % at arrived = 100 %, mean over 10 seeds, per trace (columns as POLICIES).
PAPER = {
    "default": (13.70, 9.38, 8.35, 8.22, 7.14, 4.77),
    "cpu050": (10.98, 6.97, 6.48, 6.54, 6.44, 5.00),
    "cpu100": (12.56, 8.27, 7.58, 7.50, 6.74, 4.79),
    "cpu200": (16.97, 12.55, 10.33, 10.02, 7.85, 5.18),
    "cpu250": (20.00, 16.43, 12.25, 11.95, 8.79, 6.80),
    "gpushare40": (15.14, 10.70, 10.24, 10.23, 8.56, 6.04),
    "gpushare60": (17.19, 13.18, 13.10, 12.85, 10.94, 8.75),
    "gpushare80": (19.38, 15.86, 15.50, 15.35, 13.34, 10.92),
    "gpushare100": (21.10, 18.02, 17.78, 17.87, 15.38, 13.36),
    "gpuspec10": (13.74, 9.83, 8.04, 7.76, 6.90, 5.34),
    "gpuspec20": (14.10, 11.71, 10.89, 10.72, 11.54, 5.34),
    "gpuspec25": (14.58, 14.56, 13.59, 13.23, 14.33, 6.09),
    "gpuspec33": (16.13, 20.18, 18.91, 17.78, 19.61, 12.16),
    "multigpu20": (13.08, 8.15, 6.66, 6.50, 6.27, 4.47),
    "multigpu30": (13.37, 6.89, 5.45, 5.30, 5.43, 3.64),
    "multigpu40": (14.62, 5.96, 4.65, 4.41, 4.90, 3.09),
    "multigpu50": (18.72, 5.27, 4.31, 3.94, 4.38, 2.91),
}


def trace_key(name: str) -> str:
    """`openb_pod_list_gpuspec25.csv` -> `gpuspec25`."""
    return Path(name).stem.removeprefix("openb_pod_list_")


def read_summaries(dirs: list[Path]) -> dict[str, dict[str, list[dict]]]:
    """trace -> policy -> summary rows (migration-free rows only)."""
    out: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for d in dirs:
        with (d / "summary.csv").open() as fh:
            for row in csv.DictReader(fh):
                if float(row["migration_budget"]) == 0:
                    out[trace_key(row["trace"])][row["policy"]].append(row)
    return out


def fidelity_rows(summaries: dict[str, dict[str, list[dict]]]) -> list[dict]:
    rows = []
    for trace in sorted(summaries, key=lambda t: list(PAPER).index(t) if t in PAPER else 99):
        for i, policy in enumerate(POLICIES):
            runs = summaries[trace].get(policy, [])
            if not runs:
                continue
            vals = np.array([float(r["unalloc_100"]) for r in runs])
            paper = PAPER.get(trace, (None,) * 6)[i]
            diff = None if paper is None else float(vals.mean()) - paper
            tol = TOLERANCE.get(policy, DEFAULT_TOLERANCE)
            rows.append(
                {
                    "trace": trace,
                    "policy": policy,
                    "seeds": len(vals),
                    "ours": float(vals.mean()),
                    "sd": float(vals.std(ddof=1)) if len(vals) > 1 else 0.0,
                    "paper": paper,
                    "diff": diff,
                    "ok": None if diff is None else abs(diff) <= tol,
                }
            )
    return rows


def markdown(rows: list[dict]) -> str:
    lines = [
        "| trace | policy | seeds | ours (mean ± sd) | paper | diff (pp) | within tolerance |",
        "|---|---|---:|---:|---:|---:|:---:|",
    ]
    for r in rows:
        paper = "—" if r["paper"] is None else f"{r['paper']:.2f}"
        diff = "—" if r["diff"] is None else f"{r['diff']:+.2f}"
        ok = "—" if r["ok"] is None else ("yes" if r["ok"] else "**no**")
        lines.append(
            f"| {r['trace']} | {r['policy']} | {r['seeds']} | {r['ours']:.2f} ± {r['sd']:.2f} "
            f"| {paper} | {diff} | {ok} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    dirs = [Path(a) for a in (argv if argv is not None else sys.argv[1:])]
    if not dirs:
        print(__doc__)
        return 2
    print(markdown(fidelity_rows(read_summaries(dirs))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
