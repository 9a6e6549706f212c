"""Benchmark the trace replay: one full FGD replay, the six-policy x ten-seed sweep, and the
vectorised FGD score against a straightforward per-node Python loop (same pods, same state).

    .venv/bin/python bench/replay.py [--data ../shared/data/openb] [--jobs 2] [--no-sweep]

Prints figures, the machine, and ratios measured in this run. Target: one replay < 20 s.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from advisor.fragmentation.fgd import Workload, spec_allows
from advisor.ingest.openb import read_nodes, read_pods
from advisor.placement import PAPER_POLICIES, make_policy
from advisor.placement.state import ClusterState, PodSpec
from advisor.replay.protocol import (
    Replay,
    arrival_order,
    pod_specs,
    run_replay,
    trace_workload,
)
from advisor.replay.sweep import Task, run_tasks
from bench.machine import describe

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "openb"


def naive_node_frag(gpus: list[int], cpu: int, model: str, w: Workload) -> float:
    """F_n(M) for one node with plain Python loops (the reference implementation)."""
    idle = sum(gpus)
    total = 0.0
    for c, d, k, spec, p in zip(
        w.cpu_milli, w.gpu_milli, w.num_gpu, w.gpu_spec, w.popularity, strict=True
    ):
        if d == 0:
            total += p * idle
            continue
        fits = sum(1 for g in gpus if g >= d)
        if spec_allows(spec, model) and fits >= k and cpu >= c:
            total += p * sum(g for g in gpus if g < d)
        else:
            total += p * idle
    return total


def naive_fgd_choice(state: ClusterState, pod: PodSpec, w: Workload) -> tuple[int, int]:
    """Best (score, node) by FGD with per-node, per-GPU Python loops."""
    best = (-1, -1)
    for n in state.feasible(pod).tolist():
        gpus = state.gpu_free[n, : state.n_gpu[n]].tolist()
        cpu = int(state.cpu_free[n])
        model = state.models[state.model[n]]
        before = naive_node_frag(gpus, cpu, model, w)
        options = []
        if pod.is_share:
            for i, g in enumerate(gpus):
                if g >= pod.gpu_milli:
                    after = list(gpus)
                    after[i] -= pod.gpu_milli
                    options.append(after)
        else:
            after = list(gpus)
            for _ in range(pod.num_gpu):
                after[after.index(1000)] = 0
            options.append(after)
        for after in options:
            f = naive_node_frag(after, cpu - pod.cpu_milli, model, w)
            score = int(100.0 / (1.0 + math.exp((f - before) / 1000.0)))
            if score > best[0]:
                best = (score, n)
    return best


def bench_scoring(nodes, pods, w: Workload, n_pods: int) -> tuple[float, float]:
    """Seconds per pod to score all nodes: vectorised FGD vs the Python loop."""
    policy = make_policy("fgd", w)
    replay = Replay(nodes, policy, w, seed=42)
    order = arrival_order(pods, replay.capacity, 42, 1.3)
    specs = pod_specs(pods, order)
    for i, p in enumerate(specs[:3000]):  # a partly filled cluster is the realistic case
        replay.step(i, p)
    sample = specs[3000 : 3000 + n_pods]
    t0 = time.perf_counter()
    for p in sample:
        cand = replay.state.feasible(p)
        policy.score(p, cand)
    vec = (time.perf_counter() - t0) / len(sample)
    t0 = time.perf_counter()
    for p in sample:
        naive_fgd_choice(replay.state, p, w)
    loop = (time.perf_counter() - t0) / len(sample)
    return vec, loop


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--seeds", default="42-51")
    ap.add_argument("--no-sweep", action="store_true", help="skip the 6 x 10 sweep")
    ap.add_argument("--score-pods", type=int, default=40)
    args = ap.parse_args()
    nodes_csv = args.data / "openb_node_list_gpu_node.csv"
    pods_csv = args.data / "openb_pod_list_default.csv"
    if not nodes_csv.exists() or not pods_csv.exists():
        print(f"bench/replay.py: trace not found under {args.data}", file=sys.stderr)
        return 2
    lo, hi = (int(x) for x in args.seeds.split("-"))
    seeds = list(range(lo, hi + 1))

    print(describe())
    print(f"load average at start: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    nodes, pods = read_nodes(nodes_csv), read_pods(pods_csv)
    w = trace_workload(pods)

    t0 = time.perf_counter()
    r = run_replay(nodes, pods, make_policy("fgd", w), 42, workload=w)
    one = time.perf_counter() - t0
    n = r.placed + r.failed
    print(
        f"one replay (default trace, 130%, FGD, seed 42): {one:.2f} s wall, {n} pods "
        f"({1e3 * one / n:.2f} ms/pod); unallocated {r.unalloc_100:.2f}% at 100%  "
        f"[target < 20 s: {'met' if one < 20 else 'MISSED'}]"
    )
    t0 = time.perf_counter()
    rr = run_replay(nodes, pods, make_policy("random", w), 42, workload=w)
    rnd = time.perf_counter() - t0
    print(f"baseline in this run, Random replay: {rnd:.2f} s -> FGD/Random = {one / rnd:.1f}x")

    vec, loop = bench_scoring(nodes, pods, w, args.score_pods)
    print(
        f"FGD scoring of one pod over all nodes: vectorised {1e3 * vec:.2f} ms, "
        f"per-node Python loop {1e3 * loop:.1f} ms -> {loop / vec:.0f}x faster "
        f"(a loop replay would take ~{loop * n / 60:.0f} min)"
    )
    del rr

    if not args.no_sweep:
        tasks = [Task(str(nodes_csv), str(pods_csv), p, s) for p in PAPER_POLICIES for s in seeds]
        t0 = time.perf_counter()
        summaries, _ = run_tasks(tasks, processes=args.jobs)
        sweep = time.perf_counter() - t0
        cpu_sum = sum(s["wall_s"] for s in summaries)
        print(
            f"sweep: {len(PAPER_POLICIES)} policies x {len(seeds)} seeds = {len(tasks)} replays "
            f"in {sweep:.1f} s wall with {args.jobs} processes (sum of per-replay walls "
            f"{cpu_sum:.1f} s -> parallel speed-up {cpu_sum / sweep:.2f}x)"
        )
        for p in PAPER_POLICIES:
            vals = [s["unalloc_100"] for s in summaries if s["policy"] == p]
            print(f"  {p:>10}: unallocated at 100% mean {np.mean(vals):.2f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
