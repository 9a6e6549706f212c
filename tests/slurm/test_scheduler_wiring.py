"""The Slurm source on the shared scheduler machinery, against the real test cluster: `slurm:`
alone carries its scheduler facts (the queue with gang sizes and Slurm's reasons, where racks
came from, quotas or the note saying why none), and `slurm:+http://exporter…` joins by node name
with exporter pages (NVLink islands and usage from the pages, jobs from Slurm; an exporter's
cgroup attribution, JOBID@node, is that job's task)."""

from __future__ import annotations

import numpy as np
import pytest

from advisor import scheduler_report
from advisor.ingest.sources import load_source
from exporter.readings import Allocation, GpuReading, NodeReading
from tests.fakes.page_server import Routes, serve
from tests.kubernetes.pages import exporter_page
from tests.slurm.cluster import SlurmCluster

pytestmark = pytest.mark.integration


def spec(cluster: SlurmCluster) -> str:
    return f"slurm:?conf={cluster.conf}"


def test_slurm_alone_carries_its_scheduler_facts(slurm: SlurmCluster) -> None:
    two = slurm.sbatch("--gres=gpu:2", "-A", "rnd")
    slurm.wait_running([two])
    waiting = slurm.sbatch("-N", "16", "--gres=gpu:8", "-A", "rnd")
    assert slurm.wait_pending(waiting) == "Resources"
    model = load_source(spec(slurm))
    facts = model.scheduler
    assert facts.kind == "slurm" and facts.gang_size[waiting] == 16
    assert facts.rack_from == "Slurm's network topology (leaf switches)"
    assert any("quota" in note for note in facts.notes)  # no slurmdbd here: said, not failed
    (job,) = scheduler_report.pending_jobs(model)
    assert (job["job"], job["shape"], job["waiting_reason"]) == (waiting, "16x8", "Resources")


def test_slurm_joined_with_exporter_pages(slurm: SlurmCluster) -> None:
    two = slurm.sbatch("--gres=gpu:2", "-A", "rnd")
    slurm.wait_running([two])
    alone = load_source(spec(slurm))
    row = alone.allocations.id.tolist().index(two)
    node = str(alone.nodes.name[alone.allocations.node[row]])
    held = alone.gpus.index[alone.placements.gpu[alone.placements.alloc == row]].tolist()
    readings = []
    for name in alone.nodes.name.tolist():
        gpus = [
            GpuReading(
                i,
                uuid=f"GPU-{name}-{i}",
                model="NVIDIA A100-SXM4-80GB",
                nvlink_island=i // 4,
                utilization_ratio=0.9 if (name == node and i in held) else 0.0,
            )
            for i in range(8)
        ]
        allocations = [Allocation(gpu=i, job=two) for i in held] if name == node else []
        readings.append(NodeReading(name, gpus=gpus, allocations=allocations))
    routes = Routes()
    routes.text("/metrics", exporter_page(readings))
    with serve(routes) as url:
        joined = load_source(f"{spec(slurm)}+{url}/metrics")
    assert joined.scheduler.kind == "slurm" and joined.scheduler.notes[-1:] != ()  # quota note
    assert not [n for n in joined.scheduler.notes if "usage" in n or "unknown to slurm" in n]
    row = joined.allocations.id.tolist().index(two)
    gpus = joined.placements.gpu[joined.placements.alloc == row]
    assert joined.gpus.index[gpus].tolist() == held  # the exporter's attribution, JOBID@node
    assert np.allclose(joined.gpus.utilization_ratio[gpus], 0.9)
    assert (joined.gpus.nvlink_island >= 0).all()
    assert joined.allocations.tenant[row] == "rnd"
    assert not any(i.startswith(f"{two}@") for i in joined.allocations.id.tolist())
