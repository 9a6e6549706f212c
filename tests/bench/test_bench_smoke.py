"""Smoke runs of every benchmark under bench/, at the smallest size that still goes through its
main code paths: the benches are not part of any other test, so without these they rot
unnoticed (bench/service_idle.py --nodes once crashed on a renamed attribute).

Each bench runs as `make bench` runs it (a subprocess, repo root as the working directory) with
OMP_NUM_THREADS=1, TMPDIR in the test's tmp_path and no bytecode written, and must exit 0, print
its machine line (bench/machine.py `describe`) and the figure lines of each path it went
through. The figures themselves are not checked: at these sizes they mean nothing.

Inputs come from ../shared/data (as the benches read them by default); a missing input or tool
fails, it never skips. Where a bench has no small size of its own, the test cuts its input into
tmp_path (forecast: 13 days of Philly; replay: the first 450 GPU nodes of openb). Measured
on the 2-core machine these were written on: about 30 s for the whole file.

bench/app.py runs with --no-browser: the browser part starts two Streamlit servers and a
headless chromium even at 16 nodes (12.8 s measured, a third of this file's budget); the app
in a real browser is tested by tests/integration/test_app_browser.py.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.machine import describe
from tests.fakes.waiting import CAP_S
from tests.integration import stack

pytestmark = pytest.mark.slow  # every bench in a process of its own

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data"
PHILLY = SHARED / "forecast" / "philly" / "philly_node_sequence.csv"
EARTH = SHARED / "forecast" / "helios-earth"
OPENB = SHARED / "openb"
TAIL = 3000  # characters of stderr / stdout shown when a bench fails


def philly_13_days(tmp: Path) -> list[str]:
    """Nov 20 to Dec 2 of Philly: the published test split (from Dec 1) still has origins, so the
    backtest runs in ~1 s instead of ~8 s on the whole trace."""
    lines = PHILLY.read_text().splitlines(keepends=True)
    keep = [line for line in lines[1:] if "2017-11-20" <= line[:10] < "2017-12-03"]
    path = tmp / "philly_node_sequence.csv"
    path.write_text(lines[0] + "".join(keep))
    return ["--philly", str(path)]


def openb_450_nodes(tmp: Path) -> list[str]:
    """The first 450 GPU nodes and the whole default pod list: a replay is ~5x faster, and the
    130 % arrival order still holds more than the 3,000 pods the scoring part fills first."""
    data = tmp / "openb"
    data.mkdir()
    nodes = (OPENB / "openb_node_list_gpu_node.csv").read_text().splitlines(keepends=True)
    (data / "openb_node_list_gpu_node.csv").write_text("".join(nodes[:451]))
    shutil.copy(OPENB / "openb_pod_list_default.csv", data)
    return ["--data", str(data)]


def earth_two_vcs(tmp: Path) -> list[str]:
    """Two of the eight Earth VCs: the same protocol on a quarter of the series."""
    folder = tmp / "helios-earth"
    for vc in ("vc3sl", "vc8Sj"):
        shutil.copytree(EARTH / vc, folder / vc)
    return ["--earth", str(folder)]


def peers_env(tmp: Path) -> list[str]:
    """statsforecast's own environment (`make peers-venv`), and Philly cut to 13 days."""
    python = ROOT / ".venv-peers" / "bin" / "python"
    if not python.exists():
        pytest.fail(f"bench/forecast_peers.py needs {python}: make peers-venv")
    return ["--peers-python", str(python), *philly_13_days(tmp)]


@dataclass(frozen=True)
class Case:
    """One bench run: its script, smallest arguments, and the figure lines it must print."""

    script: str
    args: tuple[str, ...]
    figures: tuple[str, ...]  # regexes, each matching some line of stdout
    inputs: tuple[Path, ...] = ()  # shared data it reads
    tools: tuple[str, ...] = ()  # binaries it starts
    prepare: Callable[[Path], list[str]] | None = None  # cuts inputs into tmp_path: more args
    timeout_s: float = CAP_S  # the net for a bench that hangs (tests/fakes/waiting.py)
    marks: tuple[pytest.MarkDecorator, ...] = ()


CASES: dict[str, Case] = {
    "app": Case(  # ~1.2 s
        "app.py",
        ("--nodes", "16", "--repeat", "1", "--no-browser"),
        (r"^server +\d+\.\d+ s +\(ingest", r"^apptest +\d+\.\d+ s"),
    ),
    "cli_startup": Case(  # ~4 s: each --help once, lazy and eager
        "cli_startup.py",
        ("--repeat", "1"),
        (
            r"^gpu-defrag --help +\d+\.\d\ds +\d+\.\d\ds +\d+\.\d\d",
            r"^gpu-defrag exporter --help +\d+\.\d\ds",
        ),
    ),
    "exporter": Case(  # ~3 s: 200 scrapes of one node, 10 + 5 of the sim case
        "exporter.py",
        ("--quick", "--sim-nodes", "2"),
        (
            r"^## sim: 2 nodes × 8 GPUs: \d+ series",
            r"^\| prometheus_client render-on-scrape \| \d+\.\d+ \|",
            r"^ratio ours/baseline: median \d+\.\d+",
        ),
    ),
    "server_abuse": Case(  # ~8 s: 20 drippers, 50 cut-short requests, 3 wrong-password clients
        "server_abuse.py",
        ("--quick", "--sim-nodes", "2"),
        (
            r"^\| baseline \| 10 \| 0 \| \d+\.\d \|",
            r"^\| drippers \| \d+ \| \d+ \| \d+\.\d \| .* 0 answered \|$",
            r"^\| close wave \| \d+ \| \d+ \| \d+\.\d \| .* 0 answered \|$",
            r"^\| wrong passwords \| \d+ \| \d+ \| \d+\.\d \| \d+\.\d \| \d+\.\d\d \|",
        ),
    ),
    "k8s_source": Case(  # ~5 s: 20 nodes, 300 pods through the fake API server
        "k8s_source.py",
        ("--nodes", "20", "--pods", "300", "--events", "40", "--baseline-pods", "50"),
        (
            r"^list \+ model: \d+\.\d+ s wall, \d+\.\d+ s CPU",
            r"^baseline typed models: \d+\.\d+ s for 50 pods",
            r"^watch: 40 pod events shown in \d+\.\d+ s .*list requests meanwhile 0",
            r"^per advisor run: .*ratio watch/re-list",
        ),
    ),
    "forecast": Case(  # ~8 s, the whole command on 13 days of Philly included
        "forecast.py",
        ("--series", "2", "--days", "7"),
        (
            r"^  gbm +\d+\.\d+ s",
            r"^  full +\d+\.\d+ s",
            r"^  h=24: advisor MAE \d",
            r"^  whole command .*: +\d+\.\d+ s \(ratio \d+\.\d+",
        ),
        (PHILLY,),
        prepare=philly_13_days,
    ),
    "image_size": Case(  # ~0.5 s
        "image_size.py",
        (),
        (
            r"^exporter: \d+ distributions, \d+\.\d MB installed",
            r"^full: \d+ distributions, \d+\.\d MB installed",
            r"^ratio exporter/full: closure \d\.\d+",
        ),
    ),
    "interval_windows": Case(  # ~4 s: Earth's training part with two of its VCs
        "interval_windows.py",
        ("--cases", "earth"),
        (
            r"^earth: 7-day windows of origins 2020-05-10",
            r"^earth/vc3sl +2020-05-17 +\d\.\d+",
            r"^median over the VCs: coverage \d",
        ),
        (EARTH,),
        prepare=earth_two_vcs,
    ),
    # ~20 s of CPU (108 s wall at load 17): the rule's procedure on one week, two rules
    "forecast_develop": Case(
        "forecast_develop.py",
        ("--data", "earth", "--weeks", "1", "--quick"),
        (
            r"^earth: training origins 2020-05-09",
            r"^Rule\(windows=3, margin=0.0, combine='median', calibration_days=7\) +\d",
            r"^share of series-weeks whose advisor has each model as a member",
            r"^naive +1\.0",
            r"^chosen: Rule\(",
        ),
        (EARTH,),
        prepare=earth_two_vcs,
        timeout_s=240.0,
    ),
    # ~73 s of CPU (424 s wall at load 17): one VC per half, the two-rule grid
    "forecast_robustness": Case(
        "forecast_robustness.py",
        ("--quick",),
        (
            r"^half A: earth/vc3sl; half B: earth/vc8Sj",
            r"^developed on half B: Rule\(",
            r"^h24 median ratio +\d",
        ),
        (EARTH,),
        prepare=earth_two_vcs,
        timeout_s=600.0,
        marks=(pytest.mark.slow,),
    ),
    "forecast_peers": Case(  # 13 days of Philly, statsforecast's two naive models
        "forecast_peers.py",
        ("--data", "philly", "--models", "Naive,SeasonalNaive"),
        (
            r"^philly: naive vs statsforecast Naive, largest MAE difference over 2 .*\(agree\)",
            r"^ +24 +sf_SeasonalNaive +\d",
            r"^philly: advisor mae \d",
        ),
        (PHILLY,),
        prepare=peers_env,
        timeout_s=120.0,
    ),
    "idle_tracking": Case(  # ~5.3 s: the Earth week's backtest (all 8 cells: 18.6 s)
        "idle_tracking.py",
        ("--quick",),
        (r"^earth 2020-05-18 W=4h +\d", r"^decision: .*--quick: 2 of 8 cells"),
        (EARTH,),
        marks=(pytest.mark.slow,),
    ),
    "job_ends": Case(  # ~1.2 s: one fleet, seed and origin; 16 nodes with ~70 finished jobs
        "job_ends.py",
        (
            *("--fleets", "a100-16x8", "--seeds", "42", "--from-h", "72", "--to-h", "72"),
            *("--by-origin", "--cost-nodes", "16", "--runs", "1", "--warmup", "1"),
            *("--backfill-h", "24"),
        ),
        (
            r"^    median \|error\| \d+\.\d h learned",
            r"^      72 h \(\d+\): median \|error\|",
            r"^  16 nodes .* [1-9]\d* predicted.*: job ends \d+\.\d ms",
        ),
    ),
    "job_ends_trace": Case(  # ~0.6 s
        "job_ends_trace.py",
        (
            *("--trace", str(OPENB / "openb_pod_list_default.csv"), "--every-h", "48"),
            *("--clipped", "--examples", "2"),
        ),
        (r"^pairs \(task x origin running\): \d+", r"^post hoc: every pair", r"^examples"),
        (OPENB,),
    ),
    "model": Case(  # ~0.2 s
        "model.py",
        ("--nodes", "50", "--repeat", "1"),
        (r"^speed-up +: +\d+\.\d x +\(results equal\)", r"^snapshot save / load"),
    ),
    "planner": Case(  # ~0.8 s: exact and heuristic on 10 nodes
        "planner.py",
        ("--sizes", "10", "--exact-max", "10", "--seeds", "1", "--time-limit", "5"),
        (r"^synthetic n=10 seed=0 +job=4x8 +True +\d+ +\d+\.\d+ .*optimal",),
    ),
    "replay": Case(  # ~3 s: the six-policy sweep on one seed, in a pool of 2
        "replay.py",
        ("--seeds", "42-42", "--jobs", "2", "--score-pods", "2"),
        (
            r"^one replay .*: \d+\.\d+ s wall",
            r"^FGD scoring of one pod over all nodes: vectorised \d",
            r"^sweep: 6 policies x 1 seeds = 6 replays",
            r"^ +fgd: unallocated at 100% mean \d",
        ),
        (OPENB,),
        prepare=openb_450_nodes,
    ),
    "service_backfill": Case(  # ~1.1 s: 1 node, 2 hours into a real Prometheus
        "service_backfill.py",
        ("--nodes", "1", "--hours", "2"),
        (r"^live read \(median of 5\): \d+ ms", r"^backfill per hour: \d+ ms"),
        tools=("prometheus", "promtool"),
        marks=(pytest.mark.integration,),
    ),
    "service_forecast": Case(  # one 'now' on Philly, 6 days (the picks are served)
        "service_forecast.py",
        ("--inputs", "philly", "--ends", "1", "--days", "6"),
        (
            r"^philly +\S+ \S+ +1 +\d+\.\d +\d+ of [1-9]",
            r"^all: \d+\.\d s; held-back WAPE",
        ),
        (PHILLY,),
    ),
    # ~4.7 s: 6 days for a held-back backtest; 18 uncapped days are the fewest on which idle
    # windows use the pooled quantile model the uncapped figure is about (3.7 s of the 4.7)
    "service_idle-pools": Case(
        "service_idle.py",
        ("--days", "6", "--pools", "1", "--every", "600", "--uncapped-days", "18"),
        (
            r"^  idle_section \(release \+ backtest.* \d+\.\d\d s",
            r"^  8h: pool-mean held-back violations \d",
            r"^uncapped idle_windows on 18 days x 1 pools at 60 s: \d+\.\d s \(rule: quantile",
        ),
        marks=(pytest.mark.slow,),
    ),
    "service_idle-nodes": Case(  # ~1.6 s: one node over the served limit, 6 days for a backtest
        "service_idle.py",
        ("--nodes", "1001", "--node-days", "6"),
        (
            r"^  node_panel \d+\.\d\d s \(144 h x 1001 nodes\)",
            r"^  per-node idle windows, 1000 of 1001 nodes served",
            r"^    8h: node-mean held-back violations \d",
        ),
    ),
}


def tail(text: str | None) -> str:
    return (text or "")[-TAIL:]


def run(
    command: list[str], env: dict[str, str], timeout_s: float
) -> subprocess.CompletedProcess[str]:
    """`command` in its own process group; past `timeout_s` the group gets SIGINT, so the bench's
    `finally` stops what it started in sessions of their own (Prometheus), then SIGKILL."""
    with subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as process:
        try:
            out, err = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGINT)
            try:
                out, err = process.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                out, err = process.communicate()
            pytest.fail(
                f"{' '.join(command[1:])} ran past {timeout_s:g} s\n"
                f"--- stderr tail:\n{tail(err)}\n--- stdout tail:\n{tail(out)}"
            )
    return subprocess.CompletedProcess(command, process.returncode, out, err)


@pytest.mark.parametrize(
    "case", [pytest.param(c, id=name, marks=c.marks) for name, c in CASES.items()]
)
def test_bench_runs_and_prints_figures(case: Case, tmp_path: Path) -> None:
    """The bench exits 0 and prints its machine line and its figures, at its smallest size."""
    for path in case.inputs:
        if not path.exists():
            pytest.fail(f"bench/{case.script} reads {path}, which is missing (../shared/data)")
    for tool in case.tools:
        stack.binary(tool)  # fails with the package to install
    args = [*case.args, *(case.prepare(tmp_path) if case.prepare else [])]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TMPDIR": str(tmp_path),  # tempfile's: model.py's snapshot, Prometheus' TSDB
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    command = [sys.executable, f"bench/{case.script}", *args]
    done = run(command, env, case.timeout_s)
    shown = f"{' '.join(command[1:])}\n--- stderr tail:\n{tail(done.stderr)}"
    assert done.returncode == 0, f"exit {done.returncode}: {shown}"
    shown += f"\n--- stdout tail:\n{tail(done.stdout)}"
    lines = done.stdout.splitlines()
    # the same machine and Python as this process; load differs, OMP_NUM_THREADS is ours
    machine = describe().split(", load ")[0]
    assert any(machine in line and "OMP_NUM_THREADS=1" in line for line in lines), (
        f"no machine line ({machine}, …, OMP_NUM_THREADS=1): {shown}"
    )
    for figure in case.figures:
        assert any(re.search(figure, line) for line in lines), f"no line /{figure}/: {shown}"
