"""Cluster-model benchmark: analysis of 10,000 nodes x 8 GPUs, vectorised vs a per-GPU loop.

A synthetic fleet (racks of 8 nodes, two NVLink islands per node, a job mix of fractional, 1, 2,
4 and 8 GPU tasks filling about 70% of the GPUs, some lost GPUs, random utilization and memory)
is built through `ModelBuilder`, then timed:
  analyze      `advisor.fragmentation.measures.analyze` (every measure, FGD included)
  spatial      the spatial + temporal + memory measures alone (vectorised)
  baseline     the same spatial + temporal + memory measures as a plain Python loop per node
               and GPU (the obvious implementation), measured in the same run; results are
               checked equal before any time is printed
  snapshot     save + load of the JSON snapshot
Best of --repeat runs each. Prints the machine.

Usage: .venv/bin/python bench/model.py [--nodes 10000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from advisor import snapshot
from advisor.fragmentation import measures as m
from advisor.model import MILLI, ClusterModel, ModelBuilder
from bench.machine import describe

GIB = 2**30
SHAPES = m.DEFAULT_SHAPES


def synthetic(nodes: int, seed: int = 7) -> ClusterModel:
    rng = np.random.default_rng(seed)
    builder = ModelBuilder()
    job = 0
    for n in range(nodes):
        name = f"node-{n:05d}"
        builder.add_node(
            name,
            pool="train",
            rack=f"rack-{n // 8:04d}",
            gpu_model="H100" if n % 3 else "A100",
            cpu_milli=128000,
            memory_mib=1 << 20,
        )
        used = rng.uniform(0, 80 * GIB, 8)
        util = rng.uniform(0, 1, 8)
        for i in range(8):
            builder.add_gpu(
                name,
                i,
                memory_total_bytes=80 * GIB,
                nvlink_island=i // 4,
                lost=bool(rng.random() < 0.002),
                utilization_ratio=float(util[i]) if util[i] > 0.1 else 0.01,
                memory_used_bytes=float(used[i]),
            )
        free = list(range(8))
        cpu = 0.0
        while free and rng.random() < 0.85:
            size = int(rng.choice([0, 1, 1, 2, 4, 8]))
            if size == 0:
                gpu, milli = free.pop(0), int(rng.choice([250, 500, 750]))
                builder.add_allocation(
                    f"j{job}", num_gpu=1, gpu_milli=milli, node=name, gpus=[gpu], cpu_milli=2000
                )
            elif size <= len(free):
                take, free = free[:size], free[size:]
                builder.add_allocation(
                    f"j{job}", num_gpu=size, node=name, gpus=take, cpu_milli=8000.0 * size
                )
                cpu += 8000 * size
            else:
                break
            job += 1
    return builder.build(timestamp=0.0)


def vectorised(model: ClusterModel) -> dict:
    groups = m._rack_groups(model)
    idle = m.allocated_idle(model)
    return {
        "free": int(model.gpu_is_free.sum()),
        "fits": [m.jobs_that_fit(model, shape, groups) for shape in SHAPES],
        "largest": m.largest_fitting(model, groups).single_node_gpus,
        "idle": int(idle.sum()),
        "stranded": float(m.stranded_memory_bytes(model).sum()),
    }


def baseline(model: ClusterModel) -> dict:
    """The same numbers with a Python loop over nodes and GPUs (lists, no numpy in the loop)."""
    nodes, gpus, places = model.nodes, model.gpus, model.placements
    allocated = [0] * len(gpus)
    for gpu, milli in zip(places.gpu.tolist(), places.milli.tolist(), strict=True):
        allocated[gpu] += milli
    healthy, lost = gpus.healthy.tolist(), gpus.lost.tolist()
    util, total, used = (
        gpus.utilization_ratio.tolist(),
        gpus.memory_total_bytes.tolist(),
        gpus.memory_used_bytes.tolist(),
    )
    offset, schedulable = nodes.gpu_offset.tolist(), nodes.schedulable.tolist()
    racks, models = nodes.rack.tolist(), nodes.gpu_model.tolist()
    islands = gpus.nvlink_island.tolist()
    free_total, largest, idle, stranded = 0, 0, 0, 0.0
    fits = [0] * len(SHAPES)
    rack_tasks: list[dict[tuple[str, str], int]] = [{} for _ in SHAPES]
    for n in range(len(nodes)):
        free_whole, slots = (
            0,
            dict.fromkeys((s.gpu_milli for s in SHAPES if s.gpu_milli < MILLI), 0),
        )
        per_island: dict[int, int] = {}  # free whole GPUs per NVLink island
        known = all(islands[g] >= 0 for g in range(offset[n], offset[n + 1]))
        for g in range(offset[n], offset[n + 1]):
            usable = healthy[g] and not lost[g] and schedulable[n]
            left = MILLI - allocated[g] if usable else 0
            per_island.setdefault(islands[g], 0)
            if usable and allocated[g] == 0:
                free_whole += 1
                per_island[islands[g]] += 1
            for share in slots:
                slots[share] += left // share
            if allocated[g] > 0 and healthy[g] and util[g] == util[g] and util[g] < 0.05:
                idle += 1
            if allocated[g] > 0 and usable:
                free_mem = total[g] - used[g]
                if allocated[g] >= MILLI or free_mem < 10 * GIB:
                    stranded += max(free_mem, 0.0)
        free_total += free_whole
        # the island rule: a task that fits in one island of the node sits in one
        size = max(
            (
                sum(1 for h in range(offset[n], offset[n + 1]) if islands[h] == i)
                for i in per_island
            ),
            default=0,
        )
        size = size if known else 0
        local = size >= free_whole and size > 0
        largest = max(largest, max(per_island.values(), default=0) if local else free_whole)
        for k, shape in enumerate(SHAPES):
            if shape.gpu_milli < MILLI:
                tasks = slots[shape.gpu_milli]
            elif 1 < shape.num_gpu <= size:
                tasks = sum(f // shape.num_gpu for f in per_island.values())
            else:
                tasks = free_whole // shape.num_gpu
            if shape.tasks == 1:
                fits[k] += tasks
            else:
                key = (racks[n], models[n])
                rack_tasks[k][key] = rack_tasks[k].get(key, 0) + tasks
    for k, shape in enumerate(SHAPES):
        if shape.tasks > 1:
            fits[k] = sum(t // shape.tasks for t in rack_tasks[k].values())
    return {
        "free": free_total,
        "fits": fits,
        "largest": largest,
        "idle": idle,
        "stranded": stranded,
    }


def best(fn, repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def fresh(model: ClusterModel) -> ClusterModel:
    """The same model with its derived-array cache emptied, so every run pays for them."""
    model._cache.clear()
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(describe(f"numpy {np.__version__}"))
    start = time.perf_counter()
    model = synthetic(args.nodes)
    build_s = time.perf_counter() - start
    print(
        f"fleet: {len(model.nodes):,} nodes, {len(model.gpus):,} GPUs, "
        f"{len(model.allocations):,} allocations; built via ModelBuilder in {build_s:.2f} s"
    )
    vec_s, vec = best(lambda: vectorised(fresh(model)), args.repeat)
    loop_s, loop = best(lambda: baseline(model), args.repeat)
    assert vec["free"] == loop["free"] and vec["fits"] == loop["fits"], (vec, loop)
    assert vec["largest"] == loop["largest"] and vec["idle"] == loop["idle"], (vec, loop)
    assert abs(vec["stranded"] - loop["stranded"]) <= 1e-6 * max(1.0, loop["stranded"])
    full_s, _ = best(lambda: m.analyze(fresh(model)), args.repeat)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "snap.json"
        save_s, _ = best(lambda: snapshot.save(model, path), 1)
        load_s, _ = best(lambda: snapshot.load(path), 1)
        size = path.stat().st_size
    print(f"spatial+temporal+memory, vectorised : {vec_s * 1000:8.1f} ms")
    print(f"same measures, per-GPU Python loop   : {loop_s * 1000:8.1f} ms   (baseline)")
    print(f"speed-up                             : {loop_s / vec_s:8.1f} x   (results equal)")
    print(
        f"full analyze incl. FGD ({len(m.workload_of(model) or [])} types)   : {full_s * 1000:8.1f} ms"
    )
    print(f"snapshot save / load ({size / 2**20:.1f} MiB)     : {save_s:.2f} s / {load_s:.2f} s")


if __name__ == "__main__":
    main()
