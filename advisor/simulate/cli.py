"""`gpu-defrag simulate` (the dynamic replay) and `gpu-defrag export-jobs` (the simulated
fleet's workload as a node list and a job CSV for it)."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_defrag_common.files import check_directory_target, staged_directory
from gpu_defrag_common.messages import say_error
from gpu_defrag_common.progress import Progress, add_quiet_flag
from gpu_defrag_common.units import duration, number

if TYPE_CHECKING:
    from advisor.simulate.run import Outcome

MAX_LOAD = 100.0
MAX_WORKERS = 64
MAX_EVERY_S = 7 * 86400.0


def parse_list(choices: tuple[str, ...], what: str):  # type: ignore[no-untyped-def]
    def parse(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",") if n.strip()]
        if names == ["all"]:
            return list(choices)
        unknown = [n for n in names if n not in choices]
        if unknown or not names:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {', '.join(unknown) or '(none)'}; choose from "
                f"{', '.join(choices)} or all"
            )
        return list(dict.fromkeys(names))

    return parse


def _every(text: str) -> float:
    value = duration(text)
    if not 0 < value <= MAX_EVERY_S:
        raise argparse.ArgumentTypeError(f"{text!r}: a period above 0 and at most 7d")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    from advisor.replay.cli import out_folder, parse_seeds
    from advisor.simulate import ADVISOR_MODES
    from advisor.simulate.schedulers import KNOWN, SCHEDULERS

    p = subparsers.add_parser(
        "simulate",
        description=(
            "Replay jobs (an openb pod list or the generic job CSV) on a node list with "
            "arrivals, departures and a priority FIFO queue with Kubernetes-style backfill, "
            "for each scheduler x advisor mode x seed; write DIR/summary.csv, DIR/by_size.csv, "
            "DIR/runs.csv, DIR/targets.csv (each mode against the advisor off: the big jobs' "
            "P90 wait halved, moves within the budget, cost below the waiting saved), "
            "DIR/wait_cdf.png and DIR/allocation.png (docs/simulate.md)."
        ),
    )
    p.add_argument("--nodes", required=True, type=Path, help="node list CSV (openb columns)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--pods", type=Path, help="openb pod list CSV (with its times)")
    source.add_argument("--jobs", type=Path, help="generic job CSV (docs/simulate.md)")
    p.add_argument(
        "--load",
        type=number(0, MAX_LOAD, above=True),
        default=1.2,
        help="offered GPU demand as a multiple of capacity; arrival times are scaled to it "
        f"(docs/simulate.md, Load), above 0 and at most {MAX_LOAD:g} (default 1.2)",
    )
    p.add_argument(
        "--policies",
        type=parse_list(KNOWN, "scheduler"),
        default=list(SCHEDULERS),
        help=f"comma list of {', '.join(KNOWN)}, or all (default: {','.join(SCHEDULERS)})",
    )
    p.add_argument(
        "--advisor",
        type=parse_list(ADVISOR_MODES, "advisor mode"),
        default=["off", "on"],
        help="comma list of off, on (the advisor in the loop), descheduler (HighNodeUtilization) "
        "and consolidate (KAI-style, when a job is blocked), or all (default: off,on)",
    )
    p.add_argument(
        "--seeds", type=parse_seeds, default=parse_seeds("42"), help="seeds, 42 or 42-51"
    )
    p.add_argument(
        "--every",
        type=_every,
        default=60.0,
        help="period of the advisor and the defragmenters in simulated time (default 60s, "
        "the advisor service's --interval)",
    )
    p.add_argument(
        "--migration-budget",
        type=number(0, 1),
        default=0.01,
        help="moved tasks per simulated day, as a share of tasks placed that day (default 0.01)",
    )
    p.add_argument(
        "--restart",
        type=duration,
        default=300.0,
        help="a job's checkpoint/restart time where the jobs give none (default 300s)",
    )
    p.add_argument(
        "--workers",
        type=number(1, MAX_WORKERS, kind=int),
        default=2,
        help=f"worker processes, 1 to {MAX_WORKERS} (default 2)",
    )
    p.add_argument("--out", required=True, type=out_folder, help="output directory")
    p.add_argument(
        "--json",
        action="store_true",
        help="print summary.csv's, by_size.csv's and targets.csv's rows as one JSON document "
        "instead of lines",
    )
    add_quiet_flag(p)
    p.set_defaults(func=run)

    e = subparsers.add_parser(
        "export-jobs",
        description=(
            "Draw the jobs that arrive at a sim:PRESET[?seed=&nodes=] fleet over its first "
            "--days and write DIR/nodes.csv and DIR/jobs.csv (docs/simulate.md)."
        ),
    )
    e.add_argument("source", help="sim:PRESET[?seed=N&nodes=N]")
    e.add_argument("--days", type=number(0, 365, above=True), default=14.0, help="days of arrivals")
    e.add_argument("--out", required=True, type=out_folder, help="output directory")
    e.set_defaults(func=run_export)


def _fail(command: str, message: str, status: int = 2) -> int:
    """One line; exit 2 for bad input or flags, 1 for results that could not be written."""
    say_error(command, message)
    return status


def json_document(
    outcomes: list[Outcome],
    scaling: dict[str, float],
    targets: list[dict[str, Any]],
    wrote: list[Path],
) -> str:
    """`simulate --json`: how the submissions were scaled, summary.csv's, by_size.csv's and
    targets.csv's rows, and the files written."""
    from advisor.json_output import dumps
    from advisor.simulate.metrics import BY_SIZE_COLUMNS, SUMMARY_COLUMNS
    from advisor.simulate.targets import TARGET_COLUMNS

    return dumps(
        {
            "scaling": scaling,
            "summary": [{k: o.summary.get(k) for k in SUMMARY_COLUMNS} for o in outcomes],
            "by_size": [
                {k: r.get(k) for k in BY_SIZE_COLUMNS} for o in outcomes for r in o.by_size
            ],
            "targets": [{k: r.get(k) for k in TARGET_COLUMNS} for r in targets],
            "wrote": [str(path) for path in wrote],
        }
    )


def run(args: argparse.Namespace) -> int:
    from advisor.ingest.openb import OpenbFormatError, read_nodes
    from advisor.simulate.jobs import JobFormatError, compress
    from advisor.simulate.outputs import FILES, write_all
    from advisor.simulate.run import Settings, Task, load_jobs, run_tasks
    from advisor.simulate.targets import target_rows, verdict_line

    fmt, path = ("pods", args.pods) if args.pods is not None else ("jobs", args.jobs)
    try:  # every input checked before any replay: one line, not a worker's traceback
        nodes = read_nodes(args.nodes)
        jobs = load_jobs(str(path), fmt)
    except (OpenbFormatError, JobFormatError) as error:
        return _fail("simulate", str(error))
    if nodes.total_gpus == 0:
        return _fail("simulate", f"{args.nodes}: no GPUs in the node list")
    try:
        compressed, factor, copies = compress(jobs, args.load, nodes.total_gpus)
    except ValueError as error:
        return _fail("simulate", f"{path}: {error}")
    try:
        check_directory_target(args.out, FILES, writer="simulate")
    except OSError as error:
        return _fail("simulate", f"--out {args.out}: {error.strerror or error}")
    settings = Settings(
        load=args.load,
        every_s=args.every,
        migration_budget=args.migration_budget,
        default_restart_s=args.restart,
    )
    tasks = [
        Task(str(args.nodes), str(path), fmt, policy, advisor, seed, settings)
        for policy in args.policies
        for advisor in args.advisor
        for seed in args.seeds
    ]
    span_h = float(compressed.submit_s.max() - compressed.submit_s.min()) / 3600.0
    if not args.json:
        print(
            f"{len(jobs)} jobs x {copies} cop{'y' if copies == 1 else 'ies'}, submissions scaled "
            f"by {factor:.3g} to {span_h:.2f} h for load {args.load:g} on {nodes.total_gpus} "
            f"GPUs; {len(tasks)} replay(s)",
            flush=True,
        )
    with Progress("simulate", "replays", len(tasks), quiet=args.quiet) as progress:

        def finished(outcome: Outcome) -> None:
            progress.advance()
            if not args.json:
                _report(outcome)

        outcomes = run_tasks(tasks, processes=min(args.workers, len(tasks)), done=finished)
        title = f"{path.name} on {args.nodes.name}, load {args.load:g}"
        budget_pct = 100.0 * args.migration_budget
        targets = target_rows([o.summary for o in outcomes], budget_pct)
        try:
            with staged_directory(args.out, writer="simulate") as stage:
                written = write_all(stage, outcomes, title, targets)
        except OSError as error:
            progress.done("")  # the error line says what happened
            return _fail("simulate", f"cannot write {args.out}: {error.strerror or error}", 1)
    wrote = [args.out / name for name in written]
    if args.json:
        scaling = {"jobs": len(jobs), "copies": copies, "factor": factor, "span_h": span_h}
        sys.stdout.write(json_document(outcomes, scaling, targets, wrote))
    else:
        for row in targets:
            print(verdict_line(row, budget_pct))
        print(f"wrote {', '.join(str(w) for w in wrote)}")
    return 0


def _report(o: Outcome) -> None:
    """One line per replay as it finishes."""
    s = o.summary
    calls = o.advisor_calls
    per_call = f", advisor {sum(o.advisor_s) / calls:.2f} s/call x {calls}" if calls else ""
    print(
        f"{s['policy']:>14} advisor {s['advisor']:<11} seed {s['seed']}: p90 wait "
        f"{_s(s['wait_p90_s'])}, >=8 GPUs {_s(s['wait_p90_s_big'])}"
        f"{_capacity(s['big_wait_capacity_pct'])}, waiting "
        f"{s['wait_gpu_hours']:g} GPU-h, moved {s['moved_pct_per_day']:g} %/day, restarts "
        f"{s['restart_gpu_hours']:g} + held {s['held_gpu_hours']:g} GPU-h "
        f"({o.wall_s:.1f} s{per_call})",
        flush=True,
    )


def _capacity(pct: float) -> str:
    """The share of big jobs' waiting in which the GPUs were missing altogether."""
    return "" if math.isnan(pct) else f" ({pct:g} % of it short of GPUs in all)"


def _s(value: float) -> str:
    return "n/a" if isinstance(value, float) and math.isnan(value) else f"{value:g} s"


def run_export(args: argparse.Namespace) -> int:
    from advisor.ingest.sources import SourceError
    from advisor.simulate.jobs import job_csv_text
    from advisor.simulate.sim_export import export

    if not args.source.startswith("sim:"):
        return _fail("export-jobs", f"{args.source}: expected sim:PRESET[?seed=N&nodes=N]")
    try:
        nodes_csv, jobs = export(args.source, args.days)
    except (SourceError, ValueError) as error:
        return _fail("export-jobs", str(error))
    files = ("nodes.csv", "jobs.csv")
    try:
        check_directory_target(args.out, files, writer="export-jobs")
        with staged_directory(args.out, writer="export-jobs") as stage:
            (stage / "nodes.csv").write_text(nodes_csv, encoding="utf-8")
            (stage / "jobs.csv").write_text(job_csv_text(jobs), encoding="utf-8")
    except OSError as error:
        return _fail("export-jobs", f"cannot write {args.out}: {error.strerror or error}", 1)
    multi = int((jobs.num_nodes > 1).sum())
    print(
        f"{len(jobs)} jobs ({multi} multi-node) over {args.days:g} days on "
        f"{nodes_csv.count(chr(10)) - 1} nodes: wrote {args.out / 'nodes.csv'}, "
        f"{args.out / 'jobs.csv'}"
    )
    return 0
