"""Kubernetes through Prometheus: real Prometheus scrapes a recorded kube-state-metrics page and
an exporter page; `prometheus+...?scheduler=kube-state-metrics` reads the same cluster as the
API reader does, and the seed case plans the same."""

from __future__ import annotations

from pathlib import Path

import pytest

from advisor import scheduler_report
from advisor.ingest.sources import SourceError, load_source
from advisor.planner.cli import solve
from advisor.planner.consolidate import parse_goal
from advisor.planner.constraints import Policy
from tests.fakes.page_server import Routes, serve
from tests.integration import stack
from tests.kubernetes.ksm_page import ksm_page
from tests.kubernetes.pages import exporter_page, readings_from_model
from tests.kubernetes.seeds import seed_16x8

pytestmark = pytest.mark.integration
EXAMPLES = Path(__file__).parents[2] / "examples"
RACK = "topology.kubernetes.io/rack"
POD_LABELS = ("scheduling.x-k8s.io/pod-group", "pod-template-hash")
ANNOTATIONS = ("gpu-defrag.io/restart-cost", "gpu-defrag.io/migratable")


def seed_objects():
    return seed_16x8(policy=Policy(quotas={("rnd", ""): 64.0}))


def start_stack(tmp_path, pages: dict[str, str]) -> tuple[str, stack.Processes, object]:
    """Prometheus scraping each page (job -> exposition text) at /<job>/metrics."""
    import yaml

    procs = stack.Processes(tmp_path)
    routes = Routes()
    for job, text in pages.items():
        routes.text(f"/{job}/metrics", text)
    server = serve(routes)
    base = server.__enter__()
    host = base.removeprefix("http://")
    port = stack.free_port()
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [
            {
                "job_name": job,
                "metrics_path": f"/{job}/metrics",
                "static_configs": [{"targets": [host]}],
            }
            for job in pages
        ],
    }
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    procs.start(
        "prometheus",
        [
            stack.binary("prometheus"),
            f"--config.file={path}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
    )
    url = f"http://127.0.0.1:{port}"
    stack.poll(lambda: stack.http_get(f"{url}/-/ready"), 30, "Prometheus to be ready")
    for job in pages:
        stack.poll(
            lambda job=job: stack.query(url, f'up{{job="{job}"}} == 1'), 30, f"{job} scraped"
        )
    stack.poll(lambda: stack.query(url, "kube_pod_info"), 30, "kube-state-metrics series")
    return url, procs, server


def test_ksm_and_exporters_read_like_the_api(tmp_path, kube):
    seed, objects = seed_objects()
    kube(objects)
    api = load_source("k8s:")
    pages = {
        "kube-state-metrics": ksm_page(
            objects,
            (RACK, "nvidia.com/gpu.product", "nvidia.com/gpu.count", "nvidia.com/gpu.memory"),
            POD_LABELS,
            ANNOTATIONS,
        ),
        "gpu-exporter": exporter_page(readings_from_model(seed)),
    }
    url, procs, server = start_stack(tmp_path, pages)
    try:
        ksm = load_source(f"prometheus+{url}?scheduler=kube-state-metrics&history=0")
        assert ksm.scheduler.kind == "kube-state-metrics"
        assert ksm.nodes.name.tolist() == api.nodes.name.tolist()
        assert ksm.nodes.rack.tolist() == api.nodes.rack.tolist()
        assert ksm.scheduler.rack_from == f"node label {RACK}"
        assert sorted(ksm.allocations.id.tolist()) == sorted(api.allocations.id.tolist())
        for column in ("job", "tenant", "num_gpu", "migratable", "restart_cost_s"):
            by_id = dict(
                zip(
                    api.allocations.id.tolist(),
                    getattr(api.allocations, column).tolist(),
                    strict=True,
                )
            )
            for alloc, value in zip(
                ksm.allocations.id.tolist(), getattr(ksm.allocations, column).tolist(), strict=True
            ):
                assert value == by_id[alloc] or (value != value and by_id[alloc] != by_id[alloc]), (
                    column,
                    alloc,
                )
        queue = scheduler_report.pending_jobs(ksm)
        assert [(q["job"], q["shape"]) for q in queue] == [("rnd/pretrain", "8x8")]
        assert {q.tenant: q.gpus for q in ksm.scheduler.quotas} == {"rnd": 64.0}
        assert any("exports no pod priority" in n for n in ksm.scheduler.notes)
        # the exporters' GPUs joined: the seed's own GPU indices, so the seed's own plan
        expected = solve(seed, parse_goal("job=8x8"), Policy(), time_limit_s=30)
        got = solve(ksm, parse_goal("job=8x8"), Policy(), time_limit_s=30)
        assert got.feasible and got.migrations == expected.migrations == 6
        assert [(a.src, a.dst) for a in got.actions] == [(a.src, a.dst) for a in expected.actions]
    except BaseException:
        print(procs.logs())
        raise
    finally:
        procs.stop_all()
        server.__exit__(None, None, None)


def test_ksm_without_the_rack_label_says_rack_unknown(tmp_path):
    _seed, objects = seed_objects()
    url, procs, server = start_stack(tmp_path, {"kube-state-metrics": ksm_page(objects)})
    try:
        ksm = load_source(f"prometheus+{url}?scheduler=kube-state-metrics&history=0")
        assert (ksm.nodes.rack == "").all() and ksm.scheduler.rack_from == ""
        assert any("--metric-labels-allowlist" in n for n in ksm.scheduler.notes)
        assert len(ksm.gpus) == 128  # without exporters: the scheduler's GPUs, usage unknown
    finally:
        procs.stop_all()
        server.__exit__(None, None, None)


def test_bad_ksm_options_are_one_line():
    with pytest.raises(SourceError, match="tenant='x'"):
        load_source("prometheus+http://127.0.0.1:1?scheduler=kube-state-metrics&tenant=x")
