"""Progress of a command's long work, for a person at a terminal, and one closing line.

A bar (rich) on standard error only when standard error is a terminal: piped or redirected
output (a CI log, `2> file`) never fills with redraws. `--quiet` silences both the bar and the
closing line `gpu-defrag COMMAND: DONE in 12.3 s`, which is said wherever standard error goes,
so a log records how long the work took. Results stay on standard output, untouched.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from types import TracebackType
from typing import Any, TextIO


def interactive(stream: TextIO | None = None) -> bool:
    """Whether `stream` (default standard error) is a terminal a person watches."""
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty()) and os.environ.get("TERM", "") != "dumb"
    except (AttributeError, ValueError):  # closed or not a real file
        return False


class Progress:
    """`with Progress("replay", "replays", total=60, quiet=args.quiet) as bar: bar.advance()`.

    `total` None draws a spinner with the elapsed time (work whose length is unknown: a
    solver). The closing line says what `done()` was given (default: `total` `unit`), or
    nothing when the block ended by an exception (the error says enough)."""

    def __init__(
        self,
        command: str,
        unit: str,
        total: int | None = None,
        *,
        quiet: bool = False,
        stream: TextIO | None = None,
    ) -> None:
        self.command, self.unit, self.total, self.quiet = command, unit, total, quiet
        self.stream = sys.stderr if stream is None else stream
        self.completed = 0
        self.summary: str | None = None
        self._bar: Any = None
        self._task: Any = None
        self._started = 0.0

    def __enter__(self) -> Progress:
        self._started = time.perf_counter()
        if not self.quiet and interactive(self.stream):
            from rich import progress as rich
            from rich.console import Console

            text = rich.TextColumn("{task.description}")
            columns = (
                [rich.SpinnerColumn(), text, rich.TimeElapsedColumn()]
                if self.total is None
                else [
                    text,
                    rich.BarColumn(),
                    rich.MofNCompleteColumn(),
                    rich.TimeElapsedColumn(),
                    rich.TimeRemainingColumn(),
                ]
            )
            self._bar = rich.Progress(
                *columns,
                console=Console(file=self.stream),
                transient=True,
                redirect_stdout=False,  # results stay on standard output, whatever it is
                redirect_stderr=False,
            )
            self._bar.start()
            self._task = self._bar.add_task(
                f"gpu-defrag {self.command}: {self.unit}", total=self.total
            )
        return self

    def advance(self, steps: int = 1) -> None:
        self.completed += steps
        if self._bar is not None:
            self._bar.update(self._task, completed=self.completed)

    def describe(self, text: str) -> None:
        """What is being done now (shown beside the bar)."""
        if self._bar is not None:
            self._bar.update(self._task, description=f"gpu-defrag {self.command}: {text}")

    def done(self, summary: str) -> None:
        """What the closing line says was done (before `in N s`); "" says nothing (the work
        failed, and its error line is what a person needs)."""
        self.summary = summary

    @property
    def elapsed_s(self) -> float:
        return time.perf_counter() - self._started

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._bar is not None:
            self._bar.stop()
        if kind is not None or self.quiet or self.summary == "":
            return
        what = self.summary
        if what is None:
            count = self.completed if self.total is None else self.total
            unit = self.unit[:-1] if count == 1 and self.unit.endswith("s") else self.unit
            what = f"{count} {unit}"
        with contextlib.suppress(OSError, ValueError):  # standard error gone: nothing to tell
            print(f"gpu-defrag {self.command}: {what} in {self.elapsed_s:.1f} s", file=self.stream)


def add_quiet_flag(parser: Any) -> None:
    """`--quiet`: no progress bar and no closing line (results and errors still print)."""
    parser.add_argument(
        "--quiet",
        "-q",
        action="store_true",
        help="no progress bar on a terminal and no closing line with the elapsed time",
    )
