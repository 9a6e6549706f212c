"""A closed standard output (`gpu-defrag ... >&-`): Python sets `sys.stdout` to None and `print`
drops everything, so a command that shows its result would exit 0 having shown nothing.
`advisor.cli.main` makes every command that writes there fail in one line, exit 1; a command
that writes nothing there runs as usual. Real processes, with descriptor 1 closed as a shell
closes it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SEED = str(ROOT / "examples" / "seed-16x8-a100.json")
CLOSED = "error: cannot write to standard output: standard output is closed"


def _closed_stdout(*args: str) -> subprocess.CompletedProcess:
    """`gpu-defrag ARGS >&-`."""
    return subprocess.run(
        [sys.executable, "-m", "advisor.cli", *args],
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: os.close(1),  # after the stderr pipe is set up: only stdout closed
        cwd=ROOT,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", SEED, "--goal", "job=8x8", "--solver", "heuristic"],
        ["analyze", SEED],
        ["snapshot", "sim:a100-16x8?nodes=2"],
        ["plan", "--help"],
    ],
    ids=["plan", "analyze", "snapshot", "plan-help"],
)
def test_a_command_that_prints_to_a_closed_stdout_is_one_line_and_exit_1(argv) -> None:
    done = _closed_stdout(*argv)
    assert (done.returncode, done.stderr) == (1, f"gpu-defrag {argv[0]}: {CLOSED}\n")


def test_the_top_level_help_to_a_closed_stdout_is_one_line_and_exit_1() -> None:
    done = _closed_stdout("--help")
    assert (done.returncode, done.stderr) == (1, f"gpu-defrag: {CLOSED}\n")


def test_a_command_that_writes_nothing_to_stdout_is_not_refused(tmp_path: Path) -> None:
    """Nothing is refused up front (a server such as `exporter` or `advise` prints nothing
    there): the result goes to a file, exit 0, and errors are still the command's own."""
    out = tmp_path / "snap.json"
    done = _closed_stdout("snapshot", "sim:a100-16x8?nodes=2", "--output", str(out))
    assert (done.returncode, done.stderr) == (0, "") and out.stat().st_size > 0
    bad = _closed_stdout("plan", SEED, "--goal", "bogus")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and CLOSED not in bad.stderr
