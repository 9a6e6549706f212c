"""The one `gpu-defrag` command. Each subcommand lives in its own module and registers itself.

`COMMANDS` is the only place that knows every subcommand: its module and its one-line help. A
module exposes `register(subparsers)`, which adds its parsers (without `help=`: the line comes
from `COMMANDS`) and sets `func(args) -> int`. Only the module of the command being run is
imported (`build_parser(argv)`): `gpu-defrag --help` and `gpu-defrag exporter` never load the
analysis stack, which a node with `pip install gpu-defrag` alone does not have. A command whose
optional extra is missing says in one line which to install (`advisor.extras`).

Standard output is handled here for every command (`main`), its `--help` included: what a
command prints is flushed before `main` returns, and a write to it that fails is one line and
exit 1 (`> /dev/full`, a full disk, an I/O error) instead of a traceback. A closed standard
output (`>&-`, where Python has no `sys.stdout` and `print` would drop everything) is such a
write: `gpu-defrag COMMAND: error: cannot write to standard output: standard output is closed`, exit 1,
for a command that writes there; one that never does (a server: `exporter`, `advise`) runs as
usual, so nothing is refused up front. A reader that stopped reading (`| head`) is no error and
prints nothing: the exit status is the command's own when it had finished and only its output
was cut short, and 141 (128 + SIGPIPE, what a shell reports for `seq 1000000 | head -1`) when
the closed pipe stopped it part way, so `set -o pipefail` never takes an unfinished command for
a success.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import io
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, TextIO

from advisor.extras import missing_extra
from advisor.logs import redact_last_resort
from gpu_defrag_common import __version__
from gpu_defrag_common.messages import error_line
from gpu_defrag_common.units import DefaultsFormatter


@dataclass(frozen=True)
class Command:
    module: str  # imported only when this command runs (or every command is built)
    summary: str  # its line in `gpu-defrag --help`


COMMANDS: dict[str, Command] = {
    "exporter": Command("exporter.cli", "serve per-GPU metrics to Prometheus"),
    "analyze": Command("advisor.analyze", "fragmentation measures of a cluster (table or JSON)"),
    "snapshot": Command("advisor.analyze", "write a source's cluster model as one JSON snapshot"),
    "app": Command("advisor.app.cli", "the Streamlit capacity-review app"),
    "demo": Command(
        "advisor.app.cli",
        "sim exporter + advisor + app on 127.0.0.1 (no GPU, no external server)",
    ),
    "plan": Command(
        "advisor.planner.cli",
        "checked migration plan for a goal (job=8x8, job=4, free-nodes=8, forecast=6h)",
    ),
    "advise": Command(
        "advisor.service.cli", "run the advisor as a service (/metrics and a JSON API)"
    ),
    "backtest": Command(
        "advisor.forecast.cli",
        "rolling-origin backtest of the demand forecast, idle windows and power-down replay",
    ),
    "forecast": Command(
        "advisor.forecast.cli",
        "forecast demand per series with quantiles, or (--idle) the idle windows",
    ),
    "replay": Command(
        "advisor.replay.cli",
        "replay a node list + pod list with placement policies (FGD paper protocol)",
    ),
    "simulate": Command(
        "advisor.simulate.cli",
        "discrete-event replay with departures, a queue and the advisor in the loop",
    ),
    "export-jobs": Command(
        "advisor.simulate.cli",
        "the simulated fleet's workload as a node list and a job CSV for `simulate`",
    ),
}


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line on stderr (exit 2), not the usage block first: the
    line names the flag and the problem and points to --help. Subcommands inherit the class."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class Registrar:
    """The subparsers action as a command module sees it: each parser it adds gets its one-line
    help from `COMMANDS` (the only copy, read without importing any module)."""

    def __init__(self, subparsers: argparse._SubParsersAction) -> None:
        self.subparsers = subparsers

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        if name not in COMMANDS:
            raise KeyError(f"command {name!r} is not in advisor.cli.COMMANDS")
        if "help" in kwargs:
            raise TypeError(f"command {name!r}: its one-line help lives in advisor.cli.COMMANDS")
        return self.subparsers.add_parser(name, help=COMMANDS[name].summary, **kwargs)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser for `argv`: the module of the command it names is imported and registers it,
    every other command is only listed by its line in `COMMANDS`. Without `argv` every module
    is imported and every command is complete (tests, documentation)."""
    chosen = None if argv is None else next((a for a in argv if not a.startswith("-")), "")
    parser = OneLineParser(
        prog="gpu-defrag",
        description="GPU observability and defragmentation advisor.",
    )
    parser.add_argument("--version", action="version", version=f"gpu-defrag {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    if chosen == "completion":
        chosen = None  # the completion script lists every command's flags
    wanted = {c.module for n, c in COMMANDS.items() if chosen is None or n == chosen}
    for name, command in COMMANDS.items():
        if name in subparsers.choices:
            continue  # registered by its module together with an earlier command
        if command.module in wanted:
            importlib.import_module(command.module).register(Registrar(subparsers))
        else:
            subparsers.add_parser(name, help=command.summary, add_help=False)
    completion = subparsers.add_parser(
        "completion",
        help="print a shell completion script (bash, zsh or tcsh)",
        description="Print the completion script of gpu-defrag for SHELL, e.g.\n"
        "  gpu-defrag completion bash > ~/.local/share/bash-completion/completions/gpu-defrag\n"
        "  gpu-defrag completion zsh > ~/.zfunc/_gpu-defrag",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    completion.add_argument(
        "shell", choices=("bash", "zsh", "tcsh"), help="the shell to complete in"
    )
    completion.set_defaults(func=lambda args: _print_completion(parser, args.shell))
    for command in subparsers.choices.values():  # every command's help shows its defaults
        command.formatter_class = _with_defaults(command.formatter_class)
    return parser


def _with_defaults(formatter: type[argparse.HelpFormatter]) -> type[argparse.HelpFormatter]:
    """The command's own formatter (raw descriptions kept) that also shows each default."""
    if issubclass(formatter, DefaultsFormatter):
        return formatter
    return type(f"Defaults{formatter.__name__}", (DefaultsFormatter, formatter), {})


def _print_completion(parser: argparse.ArgumentParser, shell: str) -> int:
    """shtab's script for `shell`, from this very parser: every subcommand and flag."""
    import shtab

    print(shtab.complete(parser, shell=shell))
    return 0


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """`parse_args`, but a flag the subcommand does not know is that subcommand's error
    (`gpu-defrag replay: error: unrecognized arguments: --sed 1 (see gpu-defrag replay --help)`),
    not the top level's, whose --help lists no subcommand's flags."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        command = _subcommands(parser)[args.command]
        command.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return action.choices


SIGPIPE_EXIT = 141  # 128 + SIGPIPE: a command stopped part way by a reader that went away


class WatchedStdout:
    """Standard output while a command runs: remembers the error of a write or flush that
    failed, so `main` tells a full or closed standard output from any other OSError."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.error: OSError | None = None

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except OSError as error:
            self.error = error
            raise

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except OSError as error:
            self.error = error
            raise

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding, buffer, ...
        return getattr(self.stream, name)


class ClosedStdout:
    """Standard output when the process has none (`>&-`): a write fails as one to a closed
    descriptor does (EBADF), so `main` reports it as any other; writing nothing is no error."""

    encoding = "utf-8"
    errors = "strict"

    def write(self, text: str) -> int:
        if not text:
            return 0
        raise OSError(errno.EBADF, "standard output is closed")

    def flush(self) -> None:
        pass  # nothing was ever written

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        raise io.UnsupportedOperation("standard output is closed")


def discard_stdout() -> None:
    """Point standard output's descriptor at the null device, so the interpreter's own flush at
    exit does not fail a second time with a message of its own."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return  # not a real file (a test's capture): nothing is flushed at exit
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, fd)
    os.close(null)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    redact_last_resort()  # a one-shot command's warnings name the URL it read, password included
    # who speaks, already for a `--help` that cannot be written (no args to name it yet)
    name = f"gpu-defrag {argv[0]}" if argv and not argv[0].startswith("-") else "gpu-defrag"
    try:
        parser = build_parser(argv)
    except ModuleNotFoundError as error:
        return _report_missing_extra(name, error)
    original, errors = sys.stdout, sys.stderr
    watched = WatchedStdout(ClosedStdout() if original is None else original)
    sys.stdout = watched  # type: ignore[assignment]
    dropped = original is None and errors is None  # `>&- 2>&-`: print(file=None) goes to stdout,
    if dropped:  # so a command's own message would fail there: dropped instead, as before
        sys.stderr = io.StringIO()
    code, finished = 0, False
    stop: SystemExit | None = None
    try:
        try:
            args = parse(parser, argv)
            name = f"gpu-defrag {args.command}"
            code = int(args.func(args) or 0)
        except SystemExit as exiting:  # --help, a usage error: after what argparse printed
            stop = exiting
        finished = True
        if watched.error is not None:
            raise watched.error  # a failed write caught on the way (argparse ignores its own)
        watched.flush()  # what the command printed reaches its reader here, not at exit
    except KeyboardInterrupt:
        return 130
    except ModuleNotFoundError as error:  # a package imported only once the command runs
        return _report_missing_extra(name, error)
    except OSError as error:
        if error is not watched.error:
            raise  # not standard output's: the command's own failure
        discard_stdout()
        if not isinstance(error, BrokenPipeError):
            if sys.stderr is not None:  # else print would fall back to the stdout that failed
                print(
                    f"{name}: error: cannot write to standard output: {error.strerror or error}",
                    file=sys.stderr,
                )
            return 1
        if not finished:
            return SIGPIPE_EXIT
    finally:
        if sys.stdout is watched:
            sys.stdout = original
        if dropped:
            sys.stderr = errors
    if stop is not None:
        raise stop
    return code


def _report_missing_extra(name: str, error: ModuleNotFoundError) -> int:
    """One line naming the extra to install (exit 1); any other missing module is a bug and
    keeps its traceback."""
    line = missing_extra(error)
    if line is None:
        raise error
    print(error_line(name.removeprefix("gpu-defrag").strip(), line), file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
