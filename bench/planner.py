"""Planner benchmark: plan time and cost for 100, 1,000 and 10,000 nodes, and the heuristic's cost
over the exact optimum where the exact solver finishes.

    .venv/bin/python bench/planner.py                 # 100 and 1,000 nodes, exact on 100
    .venv/bin/python bench/planner.py --sizes 100 1000 10000 --exact-max 1000

Clusters: the simulated fleets (`sim:a100-16x8` tiled, `sim:mixed-h100-a100-v100` warm) and a
synthetic one (8-GPU nodes with two NVLink islands, racks of 16, ~75 % load of 1/2/4/8-GPU and
fractional tasks, 5 % not migratable, mixed priorities and restart costs), three seeds each.
Targets from the issue: heuristic/exact <= 1.1 on 100-node cases, 1,000-node plan under 10 s.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from advisor.model import ClusterModel, ModelBuilder
from advisor.planner.consolidate import parse_goal, plan_heuristic
from bench.machine import describe


def synthetic(nodes: int, seed: int, load: float = 0.75) -> ClusterModel:
    rng = np.random.default_rng(seed)
    b = ModelBuilder()
    sizes, weights = [0.5, 1, 2, 4, 8], [0.15, 0.35, 0.25, 0.17, 0.08]
    for n in range(nodes):
        name = f"node-{n:05d}"
        b.add_node(name, rack=f"rack-{n // 16:04d}", gpu_model="A100")
        for i in range(8):
            b.add_gpu(name, i, nvlink_island=i // 4)
        free = list(range(8))
        half: list[int] = []
        t = 0
        while (8 - len(free)) / 8 < load + rng.normal(0, 0.15):
            size = float(rng.choice(sizes, p=weights))
            common = {
                "tenant": f"t{int(rng.integers(4))}",
                "priority": int(rng.choice([10, 50, 100])),
                "migratable": bool(rng.random() > 0.05),
                "restart_cost_s": float(rng.choice([60.0, 300.0, 900.0, 1800.0])),
            }
            if size < 1:
                if half:
                    g = half.pop()
                elif free:
                    g = free.pop(int(rng.integers(len(free))))
                    half.append(g)
                else:
                    break
                b.add_allocation(
                    f"{name}-t{t}", num_gpu=1, gpu_milli=500, node=name, gpus=[g], **common
                )
            else:
                k = int(size)
                island = int(rng.integers(2))
                pick = [g for g in free if g // 4 == island][:k] if k <= 4 else free[:k]
                if len(pick) < k:
                    pick = [g for g in free if g // 4 == 1 - island][:k] if k <= 4 else []
                if len(pick) < k:
                    break
                for g in pick:
                    free.remove(g)
                b.add_allocation(f"{name}-t{t}", num_gpu=k, node=name, gpus=pick, **common)
            t += 1
    return b.build(source=f"synthetic:{nodes}:{seed}")


def sim(preset: str, nodes: int, seed: int) -> ClusterModel:
    from advisor.ingest.sources import load_source

    t = "0" if preset == "a100-16x8" else "3600"
    return load_source(f"sim:{preset}?nodes={nodes}&seed={seed}&t={t}")


def goals_for(nodes: int) -> list[str]:
    return ["job=8x8", f"free-nodes={max(2, nodes // 20)}", "job=4x8", "job=4"]


def run_case(model: ClusterModel, goal_text: str, exact: bool, limit: float) -> dict:
    goal = parse_goal(goal_text)
    started = time.perf_counter()
    heuristic = plan_heuristic(model, goal)
    h_time = time.perf_counter() - started
    row = {
        "h_ok": heuristic.feasible,
        "h_moves": heuristic.migrations,
        "h_cost": heuristic.cost.score() if heuristic.feasible else math.nan,
        "h_s": h_time,
    }
    if exact:
        from advisor.planner.exact import plan_exact

        started = time.perf_counter()
        plan = plan_exact(model, goal, time_limit_s=limit, hint=heuristic)
        row.update(
            x_status=plan.extra.get("status", "?"),
            x_ok=plan.feasible,
            x_moves=plan.migrations,
            x_cost=plan.cost.score() if plan.feasible else math.nan,
            x_bound=plan.extra.get("bound"),
            x_s=time.perf_counter() - started,
        )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--exact-max", type=int, default=100, help="largest size solved exactly")
    parser.add_argument("--time-limit", type=float, default=30.0)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    import ortools

    print(
        describe(
            f"ortools {ortools.__version__} (CP-SAT with 1 worker, limit {args.time_limit:g} s)"
        )
    )
    header = (
        f"{'cluster':34} {'goal':14} {'heur':>5} {'moves':>5} {'cost':>8} {'time s':>7} | "
        f"{'exact':>10} {'moves':>5} {'cost':>8} {'time s':>7} {'h/x':>6}"
    )
    print(header)
    ratios: dict[int, list[float]] = {}
    for size in args.sizes:
        clusters = []
        for seed in range(args.seeds):
            clusters.append(
                (f"synthetic n={size} seed={seed}", lambda s=seed, n=size: synthetic(n, s))
            )
        clusters.append((f"sim:a100-16x8 n={size}", lambda n=size: sim("a100-16x8", n, 42)))
        clusters.append((f"sim:mixed n={size}", lambda n=size: sim("mixed-h100-a100-v100", n, 42)))
        for name, make in clusters:
            model = make()
            for goal in goals_for(size):
                row = run_case(model, goal, size <= args.exact_max, args.time_limit)
                line = (
                    f"{name:34} {goal:14} {row['h_ok']!s:>5} {row['h_moves']:>5} "
                    f"{row['h_cost']:>8.3f} {row['h_s']:>7.3f} |"
                )
                if "x_status" in row:
                    ratio = math.nan
                    if row["x_status"] == "optimal" and row["h_ok"] and row["x_cost"] > 0:
                        ratio = row["h_cost"] / row["x_cost"]
                        ratios.setdefault(size, []).append(ratio)
                    elif row["x_status"] == "optimal" and row["h_ok"]:
                        ratio = 1.0  # nothing to move: both found the empty plan
                    line += (
                        f" {row['x_status']:>10} {row['x_moves']:>5} {row['x_cost']:>8.3f} "
                        f"{row['x_s']:>7.3f} {ratio:>6.3f}"
                    )
                print(line, flush=True)
    for size, values in ratios.items():
        print(
            f"n={size}: heuristic/exact over {len(values)} cases that need migrations, where "
            f"both found a plan and the optimum is proved: mean {statistics.mean(values):.3f}, "
            f"max {max(values):.3f}"
        )


if __name__ == "__main__":
    main()
