"""Per-pool shape counts (`gpu_advisor_schedulable_jobs{pool, shape}`): each pool is a
scheduling domain, so a job never counts as fitting across two pools."""

from __future__ import annotations

from advisor.fragmentation.measures import parse_shape
from advisor.model import ModelBuilder
from advisor.results import pool_shape_table
from tests.conftest import GIB, add_nodes


def fleet():
    """One rack of A100 nodes: x1, x2 in pool `train` with 4 free GPUs each, y1 in pool
    `serve` with 4 free; 4 GPUs of each node are held."""
    b = ModelBuilder()
    for name, pool in (("x1", "train"), ("x2", "train"), ("y1", "serve")):
        add_nodes(
            [name], builder=b, pool=pool, rack="r1", gpu_model="A100", memory_total_bytes=80 * GIB
        )
        b.add_allocation(f"job-{name}", num_gpu=4, node=name, gpus=[0, 1, 2, 3])
    return b.build()


def test_each_pool_counts_its_own_jobs_and_stranded_gpus():
    shapes = tuple(parse_shape(s) for s in ("4", "8", "2x4", "3x4"))
    rows = {(r["pool"], r["shape"]): r for r in pool_shape_table(fleet(), shapes)}
    fit = {key: row["schedulable_jobs"] for key, row in rows.items()}
    stranded = {key: row["stranded_gpus"] for key, row in rows.items()}
    assert fit[("train", "4")] == 2 and fit[("serve", "4")] == 1
    assert fit[("train", "8")] == 0 and stranded[("train", "8")] == 8
    # two 4-GPU tasks: in train's two nodes, not from train's x2 and serve's y1 together
    assert fit[("train", "2x4")] == 1 and fit[("serve", "2x4")] == 0
    assert stranded[("train", "2x4")] == 0 and stranded[("serve", "2x4")] == 4
    # the fleet's one rack holds three 4-GPU tasks, but no pool does
    assert fit[("train", "3x4")] == 0 and fit[("serve", "3x4")] == 0


def test_a_fractional_shape_has_no_stranded_count():
    rows = pool_shape_table(fleet(), (parse_shape("0.5"),))
    assert {r["pool"]: r["schedulable_jobs"] for r in rows} == {"serve": 8, "train": 16}
    assert all(r["stranded_gpus"] is None for r in rows)
