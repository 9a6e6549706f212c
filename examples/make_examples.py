"""Write the planner's seed-case snapshots (run from the repository root):

    .venv/bin/python examples/make_examples.py

`seed-16x8-a100.json`   16 nodes x 8 A100 in two racks of 8: nodes 1-8 run 2-3 small jobs each,
                        9-12 are empty, 13-16 run 1-2 small jobs: freeing 8 whole nodes (or a
                        rack for an 8x8 job) takes exactly 6 migrations.
`seed-nvlink-islands.json`  two 8-GPU nodes with NVLink islands 0-3 and 4-7: 9 GPUs free, but
                        no island has 4 free, so a 4-GPU job needs one migration.
`sim-a100-16x8.json`    the simulated fleet `sim:a100-16x8` at t=0 (68 GPUs busy: 8 free nodes
                        are impossible by counting, 7 are not).
`sim-nvlink-islands.json`  the simulated fleet `sim:nvlink-islands` at t=0.
`arrivals.csv`          three weeks of hourly job arrivals per shape (`time,series,value`:
                        8-GPU jobs by day, one 2x8 job every 6 h), a demand history for
                        `--goal forecast=6h --demand`.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))

from advisor import snapshot  # noqa: E402
from advisor.model import ClusterModel, ModelBuilder  # noqa: E402

GIB = 2**30

# Per node (1-based): jobs as (GPU indices, tenant, priority, restart seconds or NaN).
SEED_16X8: dict[int, list[tuple[tuple[int, ...], str, int, float]]] = {
    1: [((0, 1), "rnd", 100, 600.0), ((2, 3), "algo", 50, math.nan)],
    2: [((0,), "rnd", 100, 300.0), ((2, 3), "prod", 1000, math.nan), ((5,), "algo", 50, 120.0)],
    3: [((0, 1), "algo", 50, 900.0), ((4,), "rnd", 10, math.nan), ((6, 7), "prod", 50, 300.0)],
    4: [((1, 2), "rnd", 100, 1200.0), ((5,), "algo", 10, 60.0)],
    5: [((0,), "prod", 50, math.nan), ((3, 4), "rnd", 100, 600.0), ((7,), "algo", 10, 60.0)],
    6: [((0, 1), "algo", 50, 300.0), ((4, 5), "rnd", 100, math.nan)],
    7: [((2,), "rnd", 10, 60.0), ((4, 5), "algo", 100, 900.0), ((7,), "prod", 50, 300.0)],
    8: [((0, 1), "prod", 50, 300.0), ((6,), "rnd", 10, math.nan)],
    13: [((0, 1), "rnd", 100, 1800.0)],
    14: [((2,), "algo", 50, 300.0), ((5, 6), "rnd", 100, 600.0)],
    15: [((4,), "prod", 50, math.nan)],
    16: [((0, 1), "algo", 100, 900.0), ((3,), "rnd", 10, 60.0)],
}
NOT_MIGRATABLE = {(2, 1)}  # node 2's second job (prod serving) must not move


def seed_16x8() -> ClusterModel:
    b = ModelBuilder()
    for n in range(1, 17):
        name = f"a100-node-{n:02d}"
        rack = "rack-01" if n <= 8 else "rack-02"
        b.add_node(name, pool="a100", rack=rack, gpu_model="NVIDIA A100-SXM4-80GB")
        for i in range(8):
            b.add_gpu(name, i, memory_total_bytes=80 * GIB, nvlink_island=0)  # NVSwitch: one
        for j, (gpus, tenant, priority, restart) in enumerate(SEED_16X8.get(n, [])):
            b.add_allocation(
                f"{name}-job{j + 1}",
                num_gpu=len(gpus),
                node=name,
                gpus=list(gpus),
                tenant=tenant,
                priority=priority,
                restart_cost_s=restart,
                migratable=(n, j) not in NOT_MIGRATABLE,
            )
    return b.build(source="examples/seed-16x8-a100")


def seed_nvlink_islands() -> ClusterModel:
    b = ModelBuilder()
    layout = {"island-node-01": [(0,), (1,), (6,), (7,)], "island-node-02": [(1, 2), (5,)]}
    for rack, (name, jobs) in enumerate(layout.items(), start=1):
        b.add_node(name, pool="a100-40", rack=f"rack-{rack:02d}", gpu_model="NVIDIA A100-PCIE-40GB")
        for i in range(8):
            b.add_gpu(name, i, memory_total_bytes=40 * GIB, nvlink_island=0 if i < 4 else 1)
        for j, gpus in enumerate(jobs):
            b.add_allocation(
                f"{name}-job{j + 1}", num_gpu=len(gpus), node=name, gpus=list(gpus), tenant="rnd"
            )
    return b.build(source="examples/seed-nvlink-islands")


def sim(preset: str) -> ClusterModel:
    from advisor.ingest.sources import load_source

    return load_source(f"sim:{preset}?t=0")


def arrivals_csv() -> str:
    """Arrivals per hour, 2026-01-05 to 2026-01-25: 8-GPU jobs follow the working day (one an
    hour from 08:00 to 18:00 on weekdays, none otherwise), a 2x8 job comes every 6 hours."""
    rows = ["time,series,value"]
    for day in range(21):
        for hour in range(24):
            time = f"2026-01-{5 + day:02d}T{hour:02d}:00:00Z"
            working = day % 7 < 5 and 8 <= hour < 18
            rows.append(f"{time},8,{1 if working else 0}")
            rows.append(f"{time},2x8,{1 if hour % 6 == 0 else 0}")
    return "\n".join(rows) + "\n"


def main() -> None:
    (ROOT / "arrivals.csv").write_text(arrivals_csv())
    snapshot.save(seed_16x8(), ROOT / "seed-16x8-a100.json")
    snapshot.save(seed_nvlink_islands(), ROOT / "seed-nvlink-islands.json")
    for preset in ("a100-16x8", "nvlink-islands"):
        snapshot.save(sim(preset), ROOT / f"sim-{preset}.json")
    print(f"wrote snapshots to {ROOT}")


if __name__ == "__main__":
    main()
