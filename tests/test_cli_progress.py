"""Long work shows a progress bar on a terminal (a real pseudo-terminal here), none in a pipe,
a closing line with the elapsed time in both, and nothing with --quiet. Also: --version, the
uniform error wording, and an unknown flag pointing to its own subcommand's --help."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NODES = "sn,cpu_milli,memory_mib,gpu,model\n" + "".join(
    f"n{i},96000,786432,8,A100\n" for i in range(4)
)
PODS = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n" + "".join(
    f"p{i},1000,1024,1,{500 if i % 2 else 1000}\n" for i in range(40)
)
ESCAPE = re.compile(r"\x1b\[")  # a terminal control sequence: the bar's redraws


def replay_args(tmp_path: Path, *extra: str) -> list[str]:
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text(NODES)
    pods.write_text(PODS)
    out = tmp_path / "out"
    return [
        *("replay", "--nodes", str(nodes), "--pods", str(pods), "--policies", "fgd,bestfit"),
        *("--seeds", "1-3", "--jobs", "1", "--out", str(out), *extra),
    ]


def on_a_terminal(args: list[str]) -> tuple[int, str, str]:
    """Run `gpu-defrag ARGS` with standard error on a pseudo-terminal (standard output piped);
    (exit status, what the terminal showed, standard output)."""
    master, slave = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "100"}
    process = subprocess.Popen(
        [sys.executable, "-m", "advisor.cli", *args],
        stdout=subprocess.PIPE,
        stderr=slave,
        cwd=ROOT,
        env=env,
    )
    os.close(slave)
    shown = bytearray()
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    out = process.stdout.read().decode()
    code = process.wait(timeout=120)
    os.close(master)
    return code, shown.decode(errors="replace"), out


def in_a_pipe(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "advisor.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={**os.environ, "TERM": "xterm-256color"},
    )


def test_replay_draws_a_bar_on_a_terminal_and_closes_with_the_elapsed_time(tmp_path):
    code, shown, out = on_a_terminal(replay_args(tmp_path))
    assert code == 0, shown
    assert ESCAPE.search(shown), shown  # the bar was drawn (and cleared)
    assert "replays" in shown
    assert re.search(r"gpu-defrag replay: 6 replays in \d+\.\d s", shown), shown
    assert "wrote " in out and not ESCAPE.search(out)  # results untouched on standard output


def test_replay_in_a_pipe_has_no_bar_only_the_closing_line(tmp_path):
    result = in_a_pipe(replay_args(tmp_path))
    assert result.returncode == 0, result.stderr
    assert not ESCAPE.search(result.stderr) and "\r" not in result.stderr
    assert re.fullmatch(r"gpu-defrag replay: 6 replays in \d+\.\d s\n", result.stderr)


def test_quiet_says_nothing_on_a_terminal_or_in_a_pipe(tmp_path):
    code, shown, _ = on_a_terminal(replay_args(tmp_path, "--quiet"))
    assert code == 0 and shown == "", shown
    result = in_a_pipe(replay_args(tmp_path, "--quiet"))
    assert result.returncode == 0 and result.stderr == ""


def test_a_plan_with_the_exact_solver_closes_with_its_elapsed_time():
    result = in_a_pipe(
        ["plan", "examples/seed-16x8-a100.json", "--goal", "job=8x8", "--solver", "exact"]
    )
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(
        r"gpu-defrag plan: a plan for job=8x8 \(exact solver, 16 nodes\) in \d+\.\d s\n",
        result.stderr,
    )
    heuristic = in_a_pipe(
        ["plan", "examples/seed-16x8-a100.json", "--goal", "job=8x8", "--solver", "heuristic"]
    )
    assert heuristic.stderr == ""  # quick work: no closing line


def test_version():
    result = in_a_pipe(["--version"])
    assert result.returncode == 0 and result.stdout == "gpu-defrag 0.1.0\n"


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["replay", "--nodes", "a", "--pods", "b", "--out", "c", "--sed", "1"],
            "gpu-defrag replay: error: unrecognized arguments: --sed 1 "
            "(see gpu-defrag replay --help)",
        ),
        (
            ["plan", "x.json", "--goal", "job=8", "--jsn"],
            "gpu-defrag plan: error: unrecognized arguments: --jsn (see gpu-defrag plan --help)",
        ),
        (
            ["analyze", "/nonexistent.json"],
            "gpu-defrag analyze: error: ",
        ),
        (
            ["exporter", "--backend", "sim", "--web.config.file", "/nonexistent.yml"],
            "gpu-defrag exporter: error: web config /nonexistent.yml: cannot read",
        ),
    ],
)
def test_errors_read_gpu_defrag_command_error(args, line):
    result = in_a_pipe(args)
    assert result.returncode == 2
    assert result.stderr.startswith(line), result.stderr
    assert result.stderr.count("\n") == 1


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_the_completion_script_names_every_subcommand_and_their_flags(shell):
    result = in_a_pipe(["completion", shell])
    assert result.returncode == 0, result.stderr
    for word in ("replay", "backtest", "advise", "--web.max-connections", "--quiet", "--goal"):
        assert word in result.stdout
    if shell == "bash":  # the script bash will source parses
        check = subprocess.run(["bash", "-n"], input=result.stdout, text=True, timeout=30)
        assert check.returncode == 0
