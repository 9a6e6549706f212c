"""`gpu-defrag replay`: the FGD paper's protocol (and our migration variant) from the CLI."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from advisor.ingest.openb import OpenbFormatError, read_nodes, read_pods
from advisor.placement import ALL_POLICIES
from gpu_defrag_common.files import check_directory_target, staged_directory
from gpu_defrag_common.messages import say_error
from gpu_defrag_common.progress import Progress, add_quiet_flag
from gpu_defrag_common.units import number

# Bounds a study never needs to pass, so a typo is refused at its flag instead of running for
# days or filling memory: the paper replays 10 seeds (42-51) at 1.3 x capacity; past ~1.3 the
# cluster is full and every extra arrival is dropped, so a larger ratio only adds time (and
# arrivals, held in memory, grow with it: 1e6 took 5 GB in 20 s); each worker is a whole Python
# process (~150 MB).
MAX_SEEDS = 1000
MAX_RATIO = 10.0
MAX_JOBS = 64


def parse_seeds(text: str) -> list[int]:
    """`42-51`, `42,43` or a mix such as `1,5-7`; at most `MAX_SEEDS` seeds in all (a range is
    counted before it is expanded)."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            if sep:
                a, b = int(lo), int(hi)
                if b < a:
                    raise ValueError
            else:
                a = b = int(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad seed range {part!r}") from None
        if len(seeds) + (b - a + 1) > MAX_SEEDS:
            raise argparse.ArgumentTypeError(
                f"{text!r}: at most {MAX_SEEDS} seeds (the paper replays 10)"
            )
        seeds.extend(range(a, b + 1))
    if not seeds:
        raise argparse.ArgumentTypeError("no seeds given")
    return seeds


def parse_policies(text: str) -> list[str]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    if names == ["all"]:
        return list(ALL_POLICIES)
    unknown = [n for n in names if n not in ALL_POLICIES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown policy {', '.join(unknown) or '(none)'}; choose from "
            f"{', '.join(ALL_POLICIES)} or all"
        )
    return names


def parse_budgets(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad migration budget {text!r}") from None
    if not values or any(not 0 <= v <= 1 for v in values):
        raise argparse.ArgumentTypeError("migration budgets are fractions between 0 and 1")
    return values


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "replay",
        description=(
            "Shuffle pods by seed, inflate to --ratio x GPU capacity, place arrivals one by one "
            "(a pod that fits nowhere is dropped); write DIR/curve.csv, DIR/summary.csv and "
            "DIR/replay.png, and DIR/migration.png with a migration budget above 0."
        ),
    )
    p.add_argument("--nodes", required=True, type=Path, help="openb node list CSV")
    p.add_argument("--pods", required=True, type=Path, help="openb pod list CSV")
    p.add_argument(
        "--policies",
        type=parse_policies,
        default=list(ALL_POLICIES),
        help=f"comma list of {','.join(ALL_POLICIES)}, or all (default: all)",
    )
    p.add_argument(
        "--seeds",
        type=parse_seeds,
        default=parse_seeds("42-51"),
        help=f"random seeds of the replays, as 42-51 or 1,2,3; at most {MAX_SEEDS} "
        "(default: 42-51)",
    )
    p.add_argument(
        "--migration-budget",
        type=parse_budgets,
        default=[0.0],
        help="fraction(s) of placed pods that may be moved, e.g. 0.02 or 0,0.01,0.02",
    )
    p.add_argument(
        "--ratio",
        type=number(0, MAX_RATIO, above=True),
        default=1.3,
        help=f"workload inflation x GPU capacity, > 0 and at most {MAX_RATIO:g} (past ~1.3 the "
        "cluster is full: more only adds dropped arrivals) (default 1.3)",
    )
    p.add_argument(
        "--jobs",
        type=number(1, MAX_JOBS, kind=int),
        default=2,
        help=f"worker processes, 1 to {MAX_JOBS} (each ~150 MB), never more than the replays "
        "(default 2)",
    )
    p.add_argument("--out", required=True, type=out_folder, help="output directory")
    p.add_argument(
        "--json",
        action="store_true",
        help="print the per-replay results as one JSON document instead of lines",
    )
    add_quiet_flag(p)
    p.set_defaults(func=run)


# The files every replay writes, and the one it adds with a migration budget: a file of these
# names that another command or the user put in --out is refused before the replays.
REPLAY_FILES = ("curve.csv", "summary.csv", "replay.png")
BUDGET_FILE = "migration.png"


def out_folder(text: str) -> Path:
    """--out as a Path, but not from an empty string (Path('') is the current folder, whose
    files of the same names the results would replace)."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path names no folder")
    return Path(text)


def _fail(message: str, status: int = 2) -> int:
    """One line; exit 2 for bad input or flags, 1 for results that could not be written."""
    say_error("replay", message)
    return status


def json_document(summaries: list[dict], bound: float | None, wrote: list[Path]) -> str:
    """`replay --json`: the summary rows (summary.csv's columns), the packing bound at 100 %
    (null below a ratio of 1) and the files written."""
    from advisor.json_output import dumps
    from advisor.replay.output import SUMMARY_COLUMNS

    return dumps(
        {
            "replays": [{key: row.get(key) for key in SUMMARY_COLUMNS} for row in summaries],
            "packing_bound_pct": bound,
            "wrote": [str(path) for path in wrote],
        }
    )


def run(args: argparse.Namespace) -> int:
    from advisor.replay.output import (
        CURVE_COLUMNS,
        SUMMARY_COLUMNS,
        plot,
        plot_budget,
        write_csv,
    )
    from advisor.replay.sweep import Task, run_tasks

    try:  # validate both files up front: one clear line instead of a worker traceback
        nodes = read_nodes(args.nodes)
        pods = read_pods(args.pods)
    except OpenbFormatError as exc:
        return _fail(str(exc))
    if nodes.total_gpus == 0:
        return _fail(f"{args.nodes}: no GPUs in the node list")
    if len(pods) == 0:  # the trace's workload is learnt from its pods
        return _fail(f"{args.pods}: no pods in the pod list")
    if not (pods.num_gpu > 0).any():  # arrivals are drawn until GPU demand reaches --ratio
        return _fail(f"{args.pods}: no pod asks for a GPU: no GPU demand to replay")
    budgeted = any(b > 0 for b in args.migration_budget)
    files = [*REPLAY_FILES, *([BUDGET_FILE] if budgeted else [])]
    try:  # before the replays, not after them
        check_directory_target(args.out, files, writer="replay")
    except OSError as exc:
        return _fail(f"--out {args.out}: {exc.strerror or exc}")
    tasks = [
        Task(str(args.nodes), str(args.pods), policy, seed, budget, args.ratio)
        for budget in args.migration_budget
        for policy in args.policies
        for seed in args.seeds
    ]
    with Progress("replay", "replays", len(tasks), quiet=args.quiet) as progress:
        summaries, curves = run_tasks(
            tasks, processes=min(args.jobs, len(tasks)), done=progress.advance
        )
        bound = None
        if args.ratio >= 1.0:  # the 100 % bin exists: what no placement or migration can beat there
            from advisor.replay.floor import packing_floor_pct

            bound = float(
                np.mean(
                    [
                        packing_floor_pct(pods, nodes.total_gpus, s, ratio=args.ratio)
                        for s in args.seeds
                    ]
                )
            )
        try:
            with staged_directory(args.out, writer="replay") as stage:  # all its files or none
                write_csv(stage / "curve.csv", CURVE_COLUMNS, curves)
                write_csv(stage / "summary.csv", SUMMARY_COLUMNS, summaries)
                plot(curves, stage / "replay.png", title=f"{args.pods.name} on {args.nodes.name}")
                if budgeted:
                    plot_budget(
                        summaries,
                        stage / BUDGET_FILE,
                        title=f"{args.pods.name}: migrations",
                        bound=bound,
                    )
        except OSError as exc:  # staged: the previous run's files stay whole
            progress.done("")  # the error line says what happened
            return _fail(f"cannot write {args.out}: {exc.strerror or exc}", status=1)
        if args.json:
            sys.stdout.write(json_document(summaries, bound, [args.out / name for name in files]))
            return 0
        for row in summaries:
            print(
                f"{row['policy']:>16} seed {row['seed']}: unallocated {row['unalloc_100']:.2f}% "
                f"at 100%, {row['unalloc_130']:.2f}% at {100 * args.ratio:.0f}%"
                + (f", {row['migrated_pods']} pods moved" if row["migration_budget"] else "")
            )
        if bound is not None:
            print(f"packing bound at 100%: no placement, with any moves, below {bound:.2f}% (mean)")
        print(f"wrote {', '.join(str(args.out / name) for name in files)}")
        return 0
