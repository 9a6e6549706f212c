"""Benchmark the dynamic replay: one 1,213-node replay of a full pod list with the advisor in
the loop, against the same replay with the advisor off (measured in the same run), and the
advisor step's cost per call.

    .venv/bin/python bench/simulate.py [--data ../shared/data/openb] [--pods default]
        [--policy fgd] [--load 1.2] [--every 60]

Prints the machine, wall and CPU seconds of both replays, the advisor's calls with their mean,
median and largest cost, and the share of the replay they take. Target: the replay with the
advisor on in under 120 s.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from advisor.ingest.openb import read_nodes
from advisor.simulate.jobs import compress
from advisor.simulate.run import Settings, load_jobs, replay
from bench.machine import describe

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "openb"
TARGET_S = 120.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--pods", default="default", help="pod list: openb_pod_list_NAME.csv")
    parser.add_argument("--policy", default="fgd")
    parser.add_argument("--load", type=float, default=1.2)
    parser.add_argument("--every", type=float, default=60.0, help="advisor period, seconds")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)

    print(describe(), flush=True)
    nodes = read_nodes(args.data / "openb_node_list_gpu_node.csv")
    pods = args.data / f"openb_pod_list_{args.pods}.csv"
    jobs, _, copies = compress(load_jobs(str(pods), "pods"), args.load, nodes.total_gpus)
    span = float(jobs.submit_s.max() - jobs.submit_s.min())
    print(
        f"{pods.name}: {len(jobs)} jobs ({copies} cop{'y' if copies == 1 else 'ies'}), "
        f"submissions over {span / 60:.1f} min at load {args.load:g}, {len(nodes)} nodes, "
        f"{nodes.total_gpus} GPUs, scheduler {args.policy}, advisor every {args.every:g} s"
    )
    settings = Settings(load=args.load, every_s=args.every)
    results = {}
    for mode in ("off", "on"):
        cpu = time.process_time()
        outcome = replay(nodes, jobs, args.policy, mode, args.seed, settings)
        cpu = time.process_time() - cpu
        results[mode] = (outcome, cpu)
        s = outcome.summary
        print(
            f"advisor {mode:>3}: {outcome.wall_s:6.1f} s wall, {cpu:6.1f} s CPU; p90 wait "
            f"{s['wait_p90_s']:g} s, >=8 GPUs {s['wait_p90_s_big']:g} s, "
            f"{s['migrations']} moves, {s['held_gpu_hours']:g} GPU-h held",
            flush=True,
        )
    on, on_cpu = results["on"]
    off, off_cpu = results["off"]
    calls, cpu_calls = np.array(on.advisor_s), np.array(on.advisor_cpu_s)
    if calls.size:
        print(
            f"advisor step: {calls.size} calls, wall mean {calls.mean():.3f} s, median "
            f"{np.median(calls):.3f} s, max {calls.max():.3f} s; CPU mean {cpu_calls.mean():.3f} s, "
            f"max {cpu_calls.max():.3f} s; {calls.sum():.1f} s wall in all = "
            f"{100 * calls.sum() / on.wall_s:.0f} % of the replay's wall time"
        )
    print(
        f"replay with the advisor on / off: {on.wall_s / off.wall_s:.1f}x wall, "
        f"{on_cpu / off_cpu:.1f}x CPU"
    )
    met = "met" if on.wall_s < TARGET_S else "MISSED"
    print(
        f"target: replay with the advisor on < {TARGET_S:g} s: {on.wall_s:.1f} s wall [{met}] "
        f"({on_cpu:.1f} s CPU; the wall time counts the machine's other load)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
