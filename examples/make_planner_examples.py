"""Write the recommendation seed-case snapshots (run from the repository root):

    .venv/bin/python examples/make_planner_examples.py

`seed-quota-borrow.json` + `policy-borrow.yaml` (rules per lender -> borrower pair;
                        `policy-borrow-per-tenant.yaml`: the older per-tenant form;
                        `policy-quotas.yaml`: the same quotas, no borrowing rules)  13 nodes x 8 A100 in one rack; tenants rnd (quota 40,
                        using 35), algorithms (30, using 20), product (20, using 15); rnd's
                        pending job `rnd-pretrain` wants 4 x 8 = 32 GPUs. Four nodes are free,
                        so only the quota stops it: 27 GPUs must be borrowed (10 from
                        algorithms, 5 from product, 12 nobody's quota covers).
`seed-mixed-fleet.json`   32 H100, 64 A100, 32 V100 (4/8/4 nodes); H100 and A100 full with
                        queues (H100: 8 and 2 GPUs, A100: 8, 8 and 4 GPUs), V100 idle. Running jobs: light ones that would
                        run on a V100 without slowdown (moved), and ones that may not or should
                        not move: busy, too much memory, pinned to their model, not migratable.
`seed-share-16gb.json`    8 GPUs of 16 GB, each held whole by one job: four need ~12 GB, four
                        ~3 GB; four more 1-GPU jobs wait. 4.5 GB of each 12 GB job's GPU can
                        never be used by another 12 GB job; packing a small job beside each
                        large one frees four GPUs for the waiting jobs.
`seed-share-l4.json`      one node of 8 NVIDIA L4 (24 GB, no MIG): four inference tasks hold a
                        GPU each at a steady 40, 30, 30 and 20 % (the exact steps a share is
                        sized in; the history is float32, as every snapshot's usage). Three
                        notebooks share GPUs Run:ai-style: two at 0.25 guaranteed / 0.8 limit
                        on GPU 4, idle for the whole history (reclaimed: their GPU is asked
                        1.6 GPU under contention), one at 0.5 / 1.0 on GPU 5, busy.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))

from advisor import snapshot  # noqa: E402
from advisor.model import ClusterModel, ModelBuilder  # noqa: E402

GIB = 2**30
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
STEP = 600.0
SAMPLES = 13  # two hours of 10-minute samples, the last one at T0

A100 = "NVIDIA A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"
V100 = "Tesla V100-SXM2-32GB"
V100_16 = "Tesla V100-SXM2-16GB"


def _history(util: np.ndarray, memory: np.ndarray) -> tuple[list[float], np.ndarray, np.ndarray]:
    """SAMPLES rows ending at T0: each GPU's level with a small deterministic wobble."""
    times = [T0 - STEP * (SAMPLES - 1 - t) for t in range(SAMPLES)]
    wobble = 1.0 + 0.08 * np.sin(np.arange(SAMPLES) * 1.3)[:, None]
    u = np.clip(util[None, :] * wobble, 0.0, 1.0)
    m = (
        np.broadcast_to(memory[None, :], u.shape)
        * np.where(np.arange(SAMPLES) % 4 == 0, 1.0, 0.96)[:, None]
    )
    return times, u.astype(np.float32), m.astype(np.float32)


# --------------------------------------------------------------------------- borrow

BORROW_JOBS: dict[str, list[int]] = {
    "rnd": [8, 8, 8, 8, 2, 1],  # 35
    "algorithms": [8, 8, 4],  # 20
    "product": [8, 4, 2, 1],  # 15
}
BORROW_POLICY = """\
# Quotas of the borrowing seed case, and the rules loans follow as capacity teams write them:
# per lender -> borrower pair, with named priority levels and return policies.
quotas:
  rnd: 40
  algorithms: 30
  product: 20
priority_levels:               # each level's lowest priority
  high: 80
  medium: 50
  low: 0
borrowing_rules:
  - lender: algorithms
    borrower: rnd
    max_borrowable_ratio: 0.5  # rnd holds at most 0.5 x 30 = 15 of algorithms' quota
    priority_threshold: high   # only rnd's jobs of priority >= 80 borrow from algorithms
    auto_return_timeout: 2h    # back at the job's end, at the latest after 2 hours
  - lender: product
    borrower: rnd
    max_borrowable_ratio: 0.25
    priority_threshold: medium
    auto_return_timeout: 2d
  - lender: "(unassigned)"     # usable GPUs no quota covers
    borrower: rnd
    max_borrowable_ratio: 1.0
    priority_threshold: medium
    auto_return_timeout: 2d
  - lender: rnd
    borrower: algorithms
    max_borrowable_ratio: 0.25
    priority_threshold: medium
    auto_return_timeout: 1d
return_policies:
  - trigger: original_tenant_demand   # a lender's own work wants its quota back
    grace_period: 15m                 # the borrower has this long to checkpoint
    preemption_allowed: true          # then its lowest-priority jobs are preempted
  - trigger: timeout                  # auto_return_timeout passed
    force_return: true                # the borrowing job is preempted after grace_period
    grace_period: 15m
"""
BORROW_TENANT_POLICY = """\
# The borrowing seed case's quotas with rules per borrowing tenant (the older form, still read).
quotas:
  rnd: 40
  algorithms: 30
  product: 20
borrowing:
  max_borrow_ratio: 0.75   # rnd may borrow up to 30 GPUs
  priority_threshold: 50   # only jobs of priority >= 50 borrow
  auto_return_s: 2d        # loans go back after two days at the latest (seconds or text)
  grace_s: 15m             # then 15 minutes to checkpoint
  preemption: true         # borrowed work may be preempted when the loan returns
"""
QUOTA_ONLY_POLICY = """\
# The borrowing seed case's quotas without borrowing rules: no loan may be proposed.
quotas:
  rnd: 40
  algorithms: 30
  product: 20
"""


def seed_quota_borrow() -> ClusterModel:
    b = ModelBuilder()
    nodes = [f"a100-node-{n:02d}" for n in range(1, 14)]
    for name in nodes:
        b.add_node(name, pool="a100", rack="rack-01", gpu_model=A100)
        for i in range(8):
            b.add_gpu(name, i, memory_total_bytes=80 * GIB, nvlink_island=0)
    used = [0] * len(nodes)
    for tenant, sizes in BORROW_JOBS.items():
        for j, size in enumerate(sizes):
            n = next(i for i in range(9) if used[i] + size <= 8)  # first fit on nodes 1-9
            b.add_allocation(
                f"{tenant}-job{j + 1}",
                num_gpu=size,
                node=nodes[n],
                gpus=list(range(used[n], used[n] + size)),
                tenant=tenant,
                priority=100 if tenant == "product" else 50,
                start_time=T0 - 3600.0 * (j + 1),
                restart_cost_s=600.0,
            )
            used[n] += size
    for task in range(4):
        b.add_allocation(
            f"rnd-pretrain-{task}",
            num_gpu=8,
            job="rnd-pretrain",
            tenant="rnd",
            priority=80,
            creation_time=T0 - 1800.0,
        )
    return b.build(timestamp=T0, source="examples/seed-quota-borrow")


# --------------------------------------------------------------------------- rebalance

# Per model: jobs as (name, GPUs, p95-ish utilization, memory GiB, gpu_spec, migratable).
# On the A100/H100 pools the first jobs are light enough for a V100 (util x speed ratio <= 1,
# memory < 32 GB); the others are not, or may not move.
MIXED_JOBS: dict[str, list[tuple[str, int, float, float, str, bool]]] = {
    H100: [
        ("h100-light-1", 1, 0.12, 10.0, "", True),  # 0.12 x 5.0 = 0.6 of a V100: moved
        ("h100-light-2", 2, 0.15, 20.0, "", True),  # 0.75 of a V100: moved
        ("h100-busy", 8, 0.85, 60.0, "", True),  # 4.25x slower on a V100
        ("h100-pinned", 1, 0.05, 4.0, H100, True),  # asks for H100 only
        ("h100-bigmem", 4, 0.10, 48.0, "", True),  # 48 GB does not fit 32 GB
        ("h100-serving", 8, 0.10, 12.0, "", False),  # not migratable
        ("h100-train", 8, 0.90, 70.0, "", True),
    ],
    A100: [
        ("a100-light-1", 1, 0.30, 12.0, "", True),  # 0.30 x 2.5 = 0.75: moved
        ("a100-light-2", 2, 0.20, 16.0, "", True),  # 0.5: moved
        ("a100-light-4", 4, 0.35, 24.0, "", True),  # 0.875: moved
        ("a100-mid", 1, 0.60, 20.0, "", True),  # 1.5x slower
        ("a100-bigmem", 1, 0.10, 60.0, "", True),
        ("a100-pinned", 2, 0.10, 8.0, A100, True),
        ("a100-busy-1", 8, 0.95, 70.0, "", True),
        ("a100-busy-2", 8, 0.90, 70.0, "", True),
        ("a100-busy-3", 8, 0.92, 70.0, "", True),
        ("a100-busy-4", 8, 0.88, 70.0, "", True),
        ("a100-busy-5", 8, 0.91, 70.0, "", True),
        ("a100-busy-6", 8, 0.93, 70.0, "", True),
        ("a100-busy-7", 4, 0.80, 60.0, "", True),
        ("a100-busy-8", 1, 0.85, 60.0, "", True),
    ],
}


def seed_mixed_fleet() -> ClusterModel:
    b = ModelBuilder()
    layout = ((H100, "h100", 4, 80), (A100, "a100", 8, 80), (V100, "v100", 4, 32))
    nodes: dict[str, list[str]] = {}
    for gpu_model, key, count, gib in layout:
        nodes[gpu_model] = []
        for n in range(1, count + 1):
            name = f"{key}-node-{n:02d}"
            nodes[gpu_model].append(name)
            b.add_node(name, pool=key, rack=f"rack-{key}", gpu_model=gpu_model)
            for i in range(8):
                b.add_gpu(name, i, memory_total_bytes=gib * GIB, nvlink_island=0)
    util: dict[tuple[str, int], tuple[float, float]] = {}
    for gpu_model, jobs in MIXED_JOBS.items():
        used = dict.fromkeys(nodes[gpu_model], 0)
        for name, size, level, mem, spec, migratable in jobs:
            node = next(n for n in nodes[gpu_model] if used[n] + size <= 8)
            gpus = list(range(used[node], used[node] + size))
            used[node] += size
            b.add_allocation(
                name,
                num_gpu=size,
                node=node,
                gpus=gpus,
                tenant="rnd" if "busy" in name or "train" in name else "algorithms",
                priority=50,
                gpu_spec=spec,
                migratable=migratable,
                start_time=T0 - 7200.0,
                restart_cost_s=300.0,
            )
            for g in gpus:
                util[(node, g)] = (level, mem * GIB)
        assert all(v == 8 for v in used.values()), f"{gpu_model} pool must be full"
    queues = [(H100, 8), (H100, 2), (A100, 8), (A100, 8), (A100, 4)]
    for k, (gpu_model, size) in enumerate(queues):
        key = "h100" if gpu_model == H100 else "a100"
        b.add_allocation(
            f"queued-{key}-{k}", num_gpu=size, gpu_spec=gpu_model, tenant="rnd", priority=50
        )
    order = [
        (name, i) for _, key, count, _ in layout for name in _names(key, count) for i in range(8)
    ]
    level = np.array([util.get(k, (0.0, 0.0))[0] for k in order])
    memory = np.array([util.get(k, (0.0, 0.0))[1] for k in order])
    return b.build(timestamp=T0, source="examples/seed-mixed-fleet", usage=_history(level, memory))


def _names(key: str, count: int) -> list[str]:
    return [f"{key}-node-{n:02d}" for n in range(1, count + 1)]


# --------------------------------------------------------------------------- share

# (job, utilization, memory GiB) on gpu 0..7 of one node of 16 GB V100s.
SHARE_JOBS: list[tuple[str, float, float]] = [
    ("train-a", 0.40, 11.5),
    ("train-b", 0.35, 11.5),
    ("train-c", 0.45, 11.5),
    ("train-d", 0.30, 11.5),
    ("notebook-a", 0.20, 3.0),
    ("notebook-b", 0.15, 2.5),
    ("notebook-c", 0.22, 3.0),
    ("notebook-d", 0.10, 2.0),
]


def seed_share_16gb() -> ClusterModel:
    b = ModelBuilder()
    name = "v100-16gb-node-01"
    b.add_node(name, pool="v100-16", rack="rack-01", gpu_model=V100_16)
    for i, (_, level, gib) in enumerate(SHARE_JOBS):
        b.add_gpu(
            name,
            i,
            memory_total_bytes=16 * GIB,
            nvlink_island=0,
            utilization_ratio=level,
            memory_used_bytes=gib * GIB,
        )
    for i, (job, _, _) in enumerate(SHARE_JOBS):
        b.add_allocation(
            job,
            num_gpu=1,
            node=name,
            gpus=[i],
            tenant="rnd" if job.startswith("train") else "algorithms",
            priority=10,
            start_time=T0 - 6 * 3600.0,
            restart_cost_s=120.0,
        )
    for k in range(4):
        b.add_allocation(f"waiting-{k}", num_gpu=1, tenant="rnd", priority=10)
    level = np.array([u for _, u, _ in SHARE_JOBS])
    memory = np.array([m * GIB for _, _, m in SHARE_JOBS])
    return b.build(timestamp=T0, source="examples/seed-share-16gb", usage=_history(level, memory))


# (task, steady utilization, memory GiB) on GPUs 0..3 of one node of L4s: levels on the 0.05
# steps the share sizing rounds to, so a float32 history must not push them a step up.
L4 = "NVIDIA L4"
L4_TASKS: list[tuple[str, float, float]] = [
    ("infer-a", 0.40, 3.0),
    ("infer-b", 0.30, 3.0),
    ("infer-c", 0.30, 2.0),
    ("infer-d", 0.20, 2.0),
]

L4_NOTEBOOKS: list[tuple[str, int, int, int]] = [
    ("notebook-1", 4, 250, 800),
    ("notebook-2", 4, 250, 800),
    ("notebook-3", 5, 500, 1000),
]


def seed_share_l4() -> ClusterModel:
    b = ModelBuilder()
    name = "l4-node-01"
    b.add_node(name, pool="l4", rack="rack-01", gpu_model=L4)
    for i in range(8):
        b.add_gpu(name, i, memory_total_bytes=24 * GIB, nvlink_island=None)
    level = np.zeros(8)
    memory = np.zeros(8)
    for i, (task, util, gib) in enumerate(L4_TASKS):
        b.add_allocation(
            task,
            num_gpu=1,
            node=name,
            gpus=[i],
            tenant="serving",
            priority=10,
            start_time=T0 - 6 * 3600.0,
            restart_cost_s=60.0,
        )
        level[i], memory[i] = util, gib * GIB
    # (task, GPU, guaranteed milli, limit milli): Run:ai-style fractions with a limit
    for task, gpu, milli, limit in L4_NOTEBOOKS:
        b.add_allocation(
            task,
            num_gpu=1,
            gpu_milli=milli,
            gpu_limit_milli=limit,
            node=name,
            gpus=[gpu],
            tenant="research",
            priority=5,
            start_time=T0 - 8 * 3600.0,
            restart_cost_s=30.0,
        )
    level[4], memory[4] = 0.0, 1.5 * GIB  # both notebooks idle, their kernels loaded
    level[5], memory[5] = 0.6, 6.0 * GIB
    times = [T0 - STEP * (SAMPLES - 1 - t) for t in range(SAMPLES)]
    usage = (
        times,
        np.tile(level, (SAMPLES, 1)).astype(np.float32),
        np.tile(memory, (SAMPLES, 1)).astype(np.float32),
    )
    return b.build(timestamp=T0, source="examples/seed-share-l4", usage=usage)


def main() -> None:
    snapshot.save(seed_quota_borrow(), ROOT / "seed-quota-borrow.json")
    (ROOT / "policy-borrow.yaml").write_text(BORROW_POLICY)
    (ROOT / "policy-borrow-per-tenant.yaml").write_text(BORROW_TENANT_POLICY)
    (ROOT / "policy-quotas.yaml").write_text(QUOTA_ONLY_POLICY)
    snapshot.save(seed_mixed_fleet(), ROOT / "seed-mixed-fleet.json")
    snapshot.save(seed_share_16gb(), ROOT / "seed-share-16gb.json")
    snapshot.save(seed_share_l4(), ROOT / "seed-share-l4.json")
    print(f"wrote planner seed snapshots to {ROOT}")


if __name__ == "__main__":
    main()
