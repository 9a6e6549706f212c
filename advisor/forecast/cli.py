"""`gpu-defrag backtest` and `gpu-defrag forecast`: thin argument handling over the pure API."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from gpu_defrag_common.messages import say_error
from gpu_defrag_common.progress import Progress, add_quiet_flag
from gpu_defrag_common.units import fraction

if TYPE_CHECKING:
    import pandas as pd

    from advisor.forecast.panel import Panel

METRIC_COLUMNS = [
    "series",
    "horizon",
    "model",
    "mae",
    "rmse",
    "wape",
    "smape",
    "mase",
    "pinball_q90",
    "coverage_q90",
]


PAIRED_COLUMNS = [
    "series",
    "horizon",
    "baseline",
    "best_baseline",
    "diff_pct",
    "p_value",
    "boot_lo_pct",
    "boot_hi_pct",
]


INTERVAL_COLUMNS = [
    "series",
    "horizon",
    "level",
    "coverage",
    "coverage_lo",
    "coverage_hi",
    "coverage_baseline",
    "diff_pct",
    "boot_lo_pct",
    "boot_hi_pct",
]


MAX_HORIZON = 168  # hours: up to 7 days ahead, for capacity reviews (docs/forecasting.md)
IDLE_RISK = 0.05  # `forecast --idle`'s default risk, as `idle_windows`' and the service's


class OutputError(Exception):
    """The results could not be written to --out (a full disk, a path changed since the start)."""


def _parts(text: str, what: str) -> list[str]:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"no {what} given")
    return parts


def _quantiles(text: str) -> tuple[float, ...]:
    """'0.5,0.9': quantile levels, each strictly between 0 and 1. Two levels that print alike
    (0.5 and 0.50000000001: both columns would be q0.5) are refused, not merged."""
    levels = sorted({fraction(part) for part in _parts(text, "quantile")})
    names: dict[str, float] = {}
    for level in levels:
        if f"{level:g}" in names:
            raise argparse.ArgumentTypeError(
                f"{level!r} and {names[f'{level:g}']!r} are both column q{level:g}; "
                "give levels that differ in their first 6 digits"
            )
        names[f"{level:g}"] = level
    return tuple(levels)


REPLAYS = ("idle", "power", "reservation")


def _replays(text: str) -> frozenset[str]:
    """'idle,power': the decision replays to run ('' for none); an unknown name is refused
    (a typo such as 'powr' ran nothing and said so nowhere)."""
    names = {part.strip() for part in text.split(",") if part.strip()}
    unknown = sorted(names - set(REPLAYS))
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown replay {', '.join(map(repr, unknown))}; choose from {','.join(REPLAYS)}"
        )
    return frozenset(names)


def _hours(text: str) -> tuple[int, ...]:
    """'1,24': whole hours from 1 to MAX_HORIZON (0 or -1 would score the past as a forecast)."""
    out = set()
    for part in _parts(text, "hours"):
        if not part.isdecimal() or not 1 <= int(part) <= MAX_HORIZON:
            raise argparse.ArgumentTypeError(
                f"{part!r} is not a whole number of hours from 1 to {MAX_HORIZON}"
            )
        out.add(int(part))
    return tuple(sorted(out))


def _model(text: str) -> str:
    """'advisor' or a model of the backtest's candidates (the names in metrics.csv)."""
    from advisor.forecast.selection import CANDIDATES

    known = ("advisor", *CANDIDATES)
    if text not in known:
        raise argparse.ArgumentTypeError(f"unknown model {text!r}; known: {', '.join(known)}")
    return text


def _instant(text: str) -> pd.Timestamp:
    """A --test-from/--test-to date as naive UTC, the data's grid; an offset is converted."""
    import pandas as pd

    try:
        at = pd.Timestamp(text)
    except (ValueError, TypeError, OverflowError):
        at = pd.NaT
    if at is pd.NaT:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a date like 2024-05-01 or 2024-05-01T12:00"
        )
    return at.tz_convert(None) if at.tzinfo else at


def _check_out(path: str | None, directory: bool, source: str | None = None) -> None:
    """Checked before any work, so a bad --out is not found only after the whole run
    (`gpu_defrag_common.files.check_directory_target` / `check_file_target` say what is checked). An
    --out that is the INPUT `source` or one of the files it reads (the same file through a
    link, too) is refused: writing the results would destroy the trace."""
    from advisor.forecast.errors import InputError
    from gpu_defrag_common.files import check_directory_target, check_file_target

    if path is None:
        return
    for read in _read_by(source) if source else []:
        if _same(path, read):
            what = f"the INPUT {source}" if read == source else f"{read}, which the INPUT reads"
            raise InputError(f"--out {path}: is {what}; the results would overwrite it")
    try:
        if directory:
            check_directory_target(path, BACKTEST_FILES, writer="backtest")
        else:
            check_file_target(path)
    except OSError as error:
        raise InputError(f"--out {path}: {error.strerror or error}") from None


def _read_by(source: str) -> list[str]:
    """The paths an INPUT reads: the file, or a Helios folder and its VC files."""
    if source.startswith(("prometheus+http://", "prometheus+https://")):
        return []
    if os.path.isdir(source):
        from advisor.forecast.readers.helios import helios_files

        return [source, *map(str, helios_files(source))]
    return [source]


def _same(a: str, b: str) -> bool:
    """`a` and `b` name one file (links followed, hard links too); False when either is missing."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


@contextmanager
def _writing(path: str) -> Iterator[None]:
    """An OSError while writing the results is one line (exit 1); the writes are whole-or-nothing,
    so the previous results stay as they were."""
    try:
        yield
    except OSError as error:
        raise OutputError(f"--out {path}: cannot write: {error.strerror or error}") from None


HORIZONS_HELP = f"comma list of whole hours ahead, 1 to {MAX_HORIZON}"
QUANTILES_HELP = "comma list of quantile levels strictly between 0 and 1"


INPUT_FORMS = (
    "INPUT: a Philly node CSV, a Helios dir/VC file, a long CSV/Parquet "
    "(time, series, value[, capacity]) or prometheus+http://HOST:PORT/?query=…"
)


def register(subparsers: argparse._SubParsersAction) -> None:
    bt = subparsers.add_parser(
        "backtest",
        description=INPUT_FORMS,
    )
    bt.add_argument("input", metavar="INPUT", help="the series to backtest (forms above)")
    bt.add_argument("--horizons", type=_hours, default=(1, 24), help=HORIZONS_HELP)
    bt.add_argument("--quantiles", type=_quantiles, default=(0.5, 0.9), help=QUANTILES_HELP)
    bt.add_argument(
        "--test-from",
        type=_instant,
        default=None,
        help="first origin of the test part (default: the data set's split or the last 7 days)",
    )
    bt.add_argument(
        "--test-to", type=_instant, default=None, help="end of the test part (exclusive)"
    )
    bt.add_argument("--windows", type=_hours, default=(1, 4), help="idle-window lengths W in hours")
    bt.add_argument(
        "--risk", type=fraction, default=0.05, help="violation budget for idle-window release"
    )
    bt.add_argument(
        "--replays",
        type=_replays,
        default="idle,power,reservation",
        help="comma list from idle,power,reservation (power: single node-count series only; "
        "reservation: the highest quantile above 0.5); '' for none",
    )
    bt.add_argument(
        "--out",
        default=None,
        help="write metrics.csv, decisions.csv, picks.csv, forecasts.csv, significance.csv, "
        "interval_significance.csv, forecast.png here",
    )
    bt.add_argument(
        "--json",
        action="store_true",
        help="print the tables as one JSON document (each a list of rows) instead of text",
    )
    add_quiet_flag(bt)
    bt.set_defaults(func=run_backtest)

    fc = subparsers.add_parser(
        "forecast",
        description=INPUT_FORMS,
    )
    fc.add_argument("input", metavar="INPUT", help="the series to forecast (forms above)")
    fc.add_argument("--horizons", type=_hours, default=tuple(range(1, 25)), help=HORIZONS_HELP)
    fc.add_argument("--quantiles", type=_quantiles, default=(0.1, 0.5, 0.9), help=QUANTILES_HELP)
    fc.add_argument("--model", type=_model, default="advisor", help="advisor or one candidate")
    fc.add_argument(
        "--idle",
        type=_hours,
        default=None,
        metavar="WINDOWS",
        help=f"write the idle-window table instead of the demand forecast: per series and "
        f"window W (comma list of whole hours, 1 to {MAX_HORIZON}), the units that stay free "
        "for the whole next W hours at --risk (needs a capacity: idle = capacity - use; "
        "--horizons, --quantiles and --model are not used)",
    )
    fc.add_argument(
        "--risk",
        type=fraction,
        default=None,
        help="with --idle: the risk of being wrong, the share of hours in which the release may "
        f"exceed what stays free, strictly between 0 and 1 (default {IDLE_RISK:g})",
    )
    fc.add_argument("--out", default=None, help="CSV file (default or `-`: stdout)")
    fc.add_argument(
        "--json",
        action="store_true",
        help='JSON instead of CSV: {"rows": [one object per CSV row]}, to stdout or --out',
    )
    add_quiet_flag(fc)
    fc.set_defaults(func=run_forecast)


def summarise(metrics: pd.DataFrame) -> pd.DataFrame:
    """One line per model × horizon: mean MAE, median WAPE, median pinball/coverage over series."""
    g = metrics.groupby(["horizon", "model"])
    return (
        g.agg(
            mae_mean=("mae", "mean"),
            wape_median=("wape", "median"),
            smape_median=("smape", "median"),
            pinball_q90_median=("pinball_q90", "median"),
            coverage_q90_median=("coverage_q90", "median"),
            headroom_q90_median=("headroom_q90", "median"),
        )
        .reset_index()
        .round(4)
    )


def print_decisions(decisions: pd.DataFrame) -> None:
    """The replays in short: idle windows and power-down policies row by row (the power-down
    buffer sweep is only in decisions.csv and powerdown.png), reservations for naive and the
    advisor."""
    if not len(decisions):
        return
    policy = decisions.get("policy")
    shown = decisions[decisions["replay"] != "reservation"]
    if policy is not None:
        shown = shown[shown["policy"].fillna("") != "sweep"]
    for replay, g in shown.groupby("replay", sort=False):
        print(f"\ndecision replay {replay}:")
        print(g.dropna(axis=1, how="all").drop(columns="replay").round(2).to_string(index=False))
    res = decisions[decisions["replay"] == "reservation"]
    res = res[res["model"].isin(["naive", "advisor"])]
    if not len(res):
        return
    res = res.astype({"horizon": int, "hours": int})
    cols = ["reserved_idle_unit_hours", "short_hours", "short_unit_hours"]
    q = res["quantile"].iloc[0]
    n = res["series"].nunique()
    print(
        f"\nreservation cost at q = {q:g} (units held above use; hours and units short"
        + ("" if n <= 4 else f"; summed over the {n} series")
        + "; every model and series in decisions.csv):"
    )
    if n <= 4:
        table = res.sort_values(["series", "horizon", "model"])[
            ["series", "horizon", "model", "hours", *cols]
        ]
    else:
        table = res.groupby(["horizon", "model"])[["hours", *cols]].sum().reset_index()
    print(table.round(1).to_string(index=False))


def _one_line(command: str, run: Callable[[], int]) -> int:
    """Run a subcommand; an unreadable INPUT or an unusable option is one line on stderr, exit 2;
    results that could not be written, one line, exit 1. The line shows a `prometheus+http://`
    INPUT's password as `redact` does."""
    from advisor.forecast.errors import InputError
    from advisor.logs import redact

    try:
        return run()
    except InputError as error:
        say_error(command, redact(str(error)))
        return 2
    except OutputError as error:
        say_error(command, redact(str(error)))
        return 1


@contextmanager
def _about(source: str) -> Iterator[None]:
    """An input error raised past the reader names the INPUT too, as the reader's own do."""
    from advisor.forecast.errors import InputError

    try:
        yield
    except InputError as error:
        raise InputError(f"{source}: {error}") from None


def run_backtest(args: argparse.Namespace) -> int:
    from advisor.forecast.threads import bounded

    with bounded(), Progress("backtest", "backtest", quiet=args.quiet) as progress:
        code = _one_line("backtest", lambda: _run_backtest(args, progress))
        progress.done("backtest and its replays" if code == 0 else "")
        return code


def _run_backtest(args: argparse.Namespace, progress: Progress) -> int:
    import pandas as pd

    from advisor.forecast import io, powerdown, reservation, rolling, significance

    _check_out(args.out, directory=True, source=args.input)
    t0 = time.perf_counter()
    progress.describe("reading the input")
    raw = io.load(args.input)
    panel = io.hourly(raw, args.input)
    replays = args.replays
    idle_job = IdleReplayJob(raw, args) if "idle" in replays else None
    progress.describe("rolling-origin backtest of every model")
    try:
        with _about(args.input):  # a test part or horizon the data cannot give
            metrics, fc, picks = rolling.run(
                panel,
                args.horizons,
                args.quantiles,
                args.test_from,
                args.test_to,
            )
        paired = significance.paired_table(fc)
        intervals = significance.interval_table(fc, args.quantiles)
        t_demand = time.perf_counter() - t0
        idle_df = idle_job.result() if idle_job else None
    finally:
        if idle_job:
            idle_job.stop()
    decisions = []
    notes = []  # printed with the tables, once --out is written
    if idle_df is not None:
        if idle_df.empty:
            notes.append("idle-window replay skipped: the input has no capacity column")
        decisions.append(idle_df)
    if "power" in replays and not _power_input(raw):
        unit = raw.meta.get("unit")
        got = f"{len(raw.series)} series " + (f"of {unit}" if unit else "of an unknown unit")
        notes.append(
            f"power-down replay skipped: needs one series of nodes in use (Philly), got {got}"
        )
    elif "power" in replays:
        kw = {}
        if args.test_from:
            kw["test_from"] = args.test_from
        if args.test_to:
            kw["test_to"] = args.test_to
        power = powerdown.replay(raw, **kw)
        if power.empty:
            days = powerdown.FIT_DAYS + 14
            notes.append(
                f"power-down replay skipped: needs {days} days of history before the test part"
            )
        decisions.append(power)
    if "reservation" in replays:
        upper = [q for q in args.quantiles if q > 0.5]
        if upper:
            decisions.append(reservation.replay(fc, max(upper)))
        else:
            notes.append("reservation replay skipped: no quantile above 0.5 was asked for")
    decisions = [d for d in decisions if len(d)]
    decisions_df = pd.concat(decisions, ignore_index=True) if decisions else pd.DataFrame()
    elapsed = time.perf_counter() - t0
    # written first: a stdout that fails (a closed pipe, a full disk) must not lose the run
    if args.out is not None:
        _write_backtest(args.out, metrics, fc, picks, paired, intervals, decisions_df)
    if args.json:
        tables = (metrics, picks, paired, intervals, decisions_df)
        sys.stdout.write(backtest_json(*tables, notes, t_demand, elapsed, args.out))
        return 0
    for note in notes:
        print(note)
    _print_backtest(metrics, picks, paired, intervals, decisions_df)
    print(f"\ndemand backtest {t_demand:.1f} s, total {elapsed:.1f} s")
    if args.out is not None:
        print(f"wrote {args.out}/metrics.csv, decisions.csv, forecast.png")
    return 0


def backtest_json(
    metrics: pd.DataFrame,
    picks: pd.DataFrame,
    paired: pd.DataFrame,
    intervals: pd.DataFrame,
    decisions_df: pd.DataFrame,
    notes: list[str],
    t_demand: float,
    elapsed: float,
    out: str | None,
) -> str:
    """`backtest --json`: the tables the text shows, whole (the files' rows: metrics.csv,
    summary.csv, picks.csv, significance.csv, interval_significance.csv, decisions.csv), the
    notes of replays skipped, the time taken and the folder written."""
    from advisor.json_output import dumps, records

    return dumps(
        {
            "metrics": records(metrics[METRIC_COLUMNS]),
            "summary": records(summarise(metrics)),
            "picks": records(picks),
            "paired_tests": records(paired),
            "interval_tests": records(intervals),
            "decisions": records(decisions_df),
            "notes": notes,
            "seconds": {"demand_backtest": round(t_demand, 3), "total": round(elapsed, 3)},
            "out": out,
        }
    )


class IdleReplayJob:
    """The idle-window replay, run in a second process while the demand backtest runs here.

    The two share only the input and each runs its fits on one thread (`threads.bounded`), so on
    two cores the command takes about the longer of the two instead of their sum (Philly: 23.4 s
    each, the command 32.3 s against 48.9 s one after the other, `bench/forecast.py`). Both are
    deterministic, so the tables are the ones a sequential run writes. The worker is forked from a forkserver that has the
    forecasting modules imported already: it starts in milliseconds and inherits no thread or
    OpenMP state of this process.
    """

    PRELOAD = ("advisor.forecast.idle", "advisor.forecast.cli")

    def __init__(self, raw: Panel, args: argparse.Namespace) -> None:
        import multiprocessing

        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(list(self.PRELOAD))
        self._pool = context.Pool(1)
        self._job = self._pool.apply_async(
            _idle_replay, (raw, args.windows, args.risk, args.test_from, args.test_to)
        )

    def result(self) -> pd.DataFrame:
        """The replay's table; an error the replay raised (an `InputError`, say) is raised here."""
        table = self._job.get()
        self._pool.close()
        return table

    def stop(self) -> None:
        """End the worker, finished or not (the demand backtest failed, or Ctrl-C)."""
        self._pool.terminate()
        self._pool.join()


def _idle_replay(
    raw: Panel,
    windows: Sequence[int],
    risk: float,
    test_from: object,
    test_to: object,
) -> pd.DataFrame:
    """`idle.backtest` in the worker, on the same bounded threads as here."""
    from advisor.forecast import idle
    from advisor.forecast.threads import bounded

    with bounded():
        return idle.backtest(raw, windows, risk, test_from, test_to, intervals=True)


def _power_input(raw: Panel) -> bool:
    """The power-down replay models whole nodes powered off: one series of nodes in use (the
    Philly reader's); GPUs of a Helios VC or a long-format series (no unit) are not nodes."""
    return len(raw.series) == 1 and raw.meta.get("unit") == "nodes"


def _print_backtest(
    metrics: pd.DataFrame,
    picks: pd.DataFrame,
    paired: pd.DataFrame,
    intervals: pd.DataFrame,
    decisions_df: pd.DataFrame,
) -> None:
    import pandas as pd

    with pd.option_context(
        "display.width", 200, "display.max_columns", 20, "display.max_rows", 500
    ):
        print(metrics[METRIC_COLUMNS].round(3).to_string(index=False))
        print("\nsummary over series:")
        print(summarise(metrics).to_string(index=False))
        print("\npicks (chosen on the training part):")
        print(picks.pivot(index="series", columns="horizon", values="pick").to_string())
        if len(paired):
            shown = paired[(paired["baseline"] == "naive") | paired["best_baseline"]]
            print(
                "\npaired tests of the advisor's MAE (Diebold-Mariano p-value; 95 % day-bootstrap"
                " interval of the difference; best = lowest baseline MAE on the test part):"
            )
            print(shown[PAIRED_COLUMNS].round(3).to_string(index=False))
        if len(intervals):
            print(
                "\nthe advisor's upper quantiles against naive + empirical quantile (coverage with"
                " its 95 % day-bootstrap interval; pinball difference in %, with its interval):"
            )
            print(intervals[INTERVAL_COLUMNS].round(3).to_string(index=False))
        print_decisions(decisions_df)


# The files every backtest writes (powerdown.png only with the power-down replay): a file of
# these names that another command or the user put in --out is refused before the run.
BACKTEST_FILES = (
    "metrics.csv",
    "metrics_full.csv",
    "summary.csv",
    "picks.csv",
    "forecasts.csv",
    "decisions.csv",
    "significance.csv",
    "interval_significance.csv",
    "forecast.png",
)


def _write_backtest(
    out: str,
    metrics: pd.DataFrame,
    fc: pd.DataFrame,
    picks: pd.DataFrame,
    paired: pd.DataFrame,
    intervals: pd.DataFrame,
    decisions_df: pd.DataFrame,
) -> None:
    """Every result file of a backtest into the folder `out`, or none of them."""
    from advisor.forecast.plot import plot_backtest, plot_power_pareto
    from gpu_defrag_common.files import staged_directory

    with _writing(out), staged_directory(out, writer="backtest") as stage:  # every file or none
        metrics[METRIC_COLUMNS].to_csv(stage / "metrics.csv", index=False)
        metrics.to_csv(stage / "metrics_full.csv", index=False)
        summarise(metrics).to_csv(stage / "summary.csv", index=False)
        picks.to_csv(stage / "picks.csv", index=False)
        fc.to_csv(stage / "forecasts.csv", index=False)
        decisions_df.to_csv(stage / "decisions.csv", index=False)
        paired.to_csv(stage / "significance.csv", index=False)
        intervals.to_csv(stage / "interval_significance.csv", index=False)
        plot_backtest(fc, stage / "forecast.png")
        if len(decisions_df) and (decisions_df["replay"] == "power_down").any():
            plot_power_pareto(decisions_df, stage / "powerdown.png")


def run_forecast(args: argparse.Namespace) -> int:
    with Progress("forecast", "forecast", quiet=args.quiet) as progress:
        code = _one_line("forecast", lambda: _run_forecast(args))
        progress.done(("idle windows" if args.idle else "forecast") if code == 0 else "")
        return code


def _run_forecast(args: argparse.Namespace) -> int:
    from advisor.forecast import api, io
    from advisor.forecast.errors import InputError
    from gpu_defrag_common.files import write_text_atomic

    if args.risk is not None and args.idle is None:  # it would change nothing: said, not ignored
        raise InputError("--risk is the idle windows' risk: it needs --idle")
    if args.out == "-":  # standard output, as without --out (not a file named "-")
        args.out = None
    _check_out(args.out, directory=False, source=args.input)
    if args.idle is not None:
        frame = _idle_table(args.input, args.idle, IDLE_RISK if args.risk is None else args.risk)
    else:
        panel = io.hourly(io.load(args.input), args.input)
        frame = api.forecast(panel, args.horizons, args.quantiles, model=args.model)
    if args.json:
        from advisor.json_output import dumps, records

        text = dumps({"rows": records(frame)})
    else:
        text = frame.to_csv(index=False)
    if args.out is not None:
        with _writing(args.out):
            write_text_atomic(args.out, text)
    else:
        sys.stdout.write(text)
    return 0


def _idle_table(source: str, windows: tuple[int, ...], risk: float) -> pd.DataFrame:
    """`api.idle_windows` on the INPUT at its own resolution (idle is measured against each
    hour's peak), on bounded threads as the backtest's idle replay. An input without a usable
    hour, or without any capacity to measure idle against, is an `InputError`."""
    from advisor.forecast import api, io
    from advisor.forecast.errors import InputError
    from advisor.forecast.idle import with_capacity
    from advisor.forecast.threads import bounded

    raw = io.load(source)
    io.hourly(raw, source)  # no hour holds enough readings: one line, as for the demand forecast
    if not with_capacity(raw):
        raise InputError(
            f"{source}: no capacity (a capacity column with a value above 0): the idle windows "
            "need one, idle = capacity - use"
        )
    with bounded(), _about(source):
        return api.idle_windows(raw, windows, risk)
