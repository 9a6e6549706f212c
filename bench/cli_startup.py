"""CPU time of `gpu-defrag --help` and `gpu-defrag exporter --help` in a fresh interpreter, against
the parser with every command registered (what each `--help` cost before the lazy registration
of issue 27, measured in the same run): CPU (user + system) of the child, median of --repeat.

Usage: .venv/bin/python bench/cli_startup.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.machine import describe

ROOT = Path(__file__).resolve().parents[1]
EAGER = "from advisor.cli import build_parser; build_parser().parse_args({argv!r})"
CASES: dict[str, list[str]] = {
    "gpu-defrag --help": ["--help"],
    "gpu-defrag exporter --help": ["exporter", "--help"],
}


def measure(command: list[str]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one run of `command`."""
    started = time.perf_counter()
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {process.returncode}")
    return usage.ru_utime + usage.ru_stime, time.perf_counter() - started


def median_of(command: list[str], repeat: int) -> tuple[float, float]:
    runs = [measure(command) for _ in range(repeat)]
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per case (median)")
    args = parser.parse_args()
    print(describe())
    print(f"{'case':<28} {'lazy CPU':>9} {'eager CPU':>10} {'ratio':>6} {'lazy wall':>10}")
    for name, argv in CASES.items():
        lazy_cpu, lazy_wall = median_of([sys.executable, "-m", "advisor.cli", *argv], args.repeat)
        eager = [sys.executable, "-c", EAGER.format(argv=argv)]
        eager_cpu, _ = median_of(eager, args.repeat)
        print(
            f"{name:<28} {lazy_cpu:>8.2f}s {eager_cpu:>9.2f}s {lazy_cpu / eager_cpu:>6.2f} "
            f"{lazy_wall:>9.2f}s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
