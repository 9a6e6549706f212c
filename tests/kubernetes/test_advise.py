"""`gpu-defrag advise` on a Kubernetes source joined with exporters: the queue, why the biggest
job waits, a plan for it, and the gpu_advisor_* series the alert rules read."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from advisor import snapshot
from advisor.ingest.kubernetes.manifests import objects_from_model
from advisor.ingest.live import make_ingest
from advisor.planner.constraints import load_policy
from advisor.service.api import Api
from advisor.service.loop import AdvisorLoop, Config
from advisor.service.metrics import families
from tests.fakes.cli_process import cli_process
from tests.fakes.page_server import Routes, serve
from tests.kubernetes.pages import exporter_page, readings_from_model
from tests.kubernetes.seeds import seed_16x8
from tests.service.conftest import strict_schema

EXAMPLES = Path(__file__).parents[2] / "examples"


def seed_objects(rack_label: str | None = None):
    return seed_16x8(**({"rack_label": rack_label} if rack_label else {}))


def series(page: str) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(page)
        for s in family.samples
    }


def run(spec: str):
    loop = AdvisorLoop(spec, make_ingest(spec, 5.0), Config())
    try:
        state = loop.run_once()
    finally:
        loop.stop()
    return state


@pytest.fixture
def exporters():
    seed = snapshot.load(EXAMPLES / "seed-16x8-a100.json")
    routes = Routes()
    routes.text("/metrics", exporter_page(readings_from_model(seed)))
    with serve(routes) as url:
        yield f"{url}/metrics"


def test_queue_cause_plan_and_series(kube, exporters):
    _, objects = seed_objects()
    kube(objects)
    state = run(f"k8s:+{exporters}")
    doc = state.results.scheduler
    (job,) = doc["pending_jobs"]
    assert (job["job"], job["shape"], job["gang_size"], job["blocked_by"]) == (
        "rnd/pretrain",
        "8x8",
        8,
        "scattered",
    )
    blocked = doc["blocked_plan"]
    assert blocked["job"] == "rnd/pretrain" and blocked["plan"]["feasible"]
    migrations = [a for a in blocked["plan"]["actions"] if a["kind"] == "migrate"]
    assert len(migrations) == 6  # the seed case's minimum
    assert blocked["plan"]["goal_priority"] == 500  # nothing above the job's own priority moves
    page = series(families(state).text())
    assert page[("gpu_advisor_pending_jobs", (("tenant", "rnd"),))] == 1
    assert page[("gpu_advisor_pending_gpus", (("tenant", "rnd"),))] == 64
    assert (
        page[("gpu_advisor_shape_unschedulable", (("cause", "scattered"), ("shape", "8x8")))] == 88
    )
    assert page[("gpu_advisor_scheduler_stale", (("source", state.source),))] == 0
    body = Api(lambda: state).pending("").body
    answer = json.loads(body)
    jsonschema.validate(answer, strict_schema("Pending"))
    assert answer["total_jobs"] == 1 and answer["scheduler"] == "kubernetes"


def test_without_rack_labels_the_cause_is_rack_unknown(kube, exporters):
    _, objects = seed_objects(rack_label="example.com/unused")
    for node in objects["nodes"]:
        node["metadata"]["labels"].pop("example.com/unused", None)
    kube(objects)
    state = run(f"k8s:+{exporters}")
    doc = state.results.scheduler
    assert doc["racks_from"] is None and sum(doc["nodes_rack_unknown"].values()) == 16
    (job,) = doc["pending_jobs"]
    # 8 x 8 needs 8 whole free nodes; 4 exist: scattered whatever the racks (honest either way)
    assert job["blocked_by"] == "scattered" and job["jobs_if_racks_allow"] is None
    # but the plan cannot be checked for rack locality: it says so, never "proved"
    plan = doc["blocked_plan"]["plan"]
    assert not plan["feasible"] and "rack unknown" in plan["reason"]
    assert "proved" not in plan["reason"]
    # 2 x 8 and 4 x 8 would fit 4 free nodes if they shared a rack: rack unknown, not scattered
    page = series(families(state).text())
    causes = {
        dict(labels)["shape"]: dict(labels)["cause"]
        for (name, labels), value in page.items()
        if name == "gpu_advisor_shape_unschedulable" and value > 0
    }
    assert causes == {"2x8": "rack_unknown", "4x8": "rack_unknown", "8x8": "scattered"}
    rows = {r["shape"]: r for r in doc["if_racks_allow"]}
    assert rows["2x8"]["jobs_that_fit"] == 0 and rows["2x8"]["jobs_if_racks_allow"] == 2


def test_quota_is_the_cause_when_only_quota_stops_a_job(kube):
    seed = snapshot.load(EXAMPLES / "seed-quota-borrow.json")
    policy = load_policy(EXAMPLES / "policy-borrow.yaml")
    kube(objects_from_model(seed, policy=policy))
    state = run("k8s:")
    doc = state.results.scheduler
    (job,) = doc["pending_jobs"]
    assert job["job"] == "rnd/rnd-pretrain" and job["blocked_by"] == "quota"
    assert doc["blocked_plan"]["blocked_by"] == "quota"
    # ResourceQuotas carry no loan rules: no loan is proposed, and the plan says why
    assert "no borrowing rules" in doc["blocked_plan"]["plan"]["reason"]
    page = series(families(state).text())
    assert page[("gpu_advisor_shape_unschedulable", (("cause", "quota"), ("shape", "4x8")))] > 0
    assert any("ResourceQuota rnd/gpu" in line for line in doc["quotas"])


def test_advise_process_with_repeated_sources(kube, exporters):
    _, objects = seed_objects()
    kube(objects)
    with cli_process(
        "advise",
        "--source",
        "k8s:",
        "--source",
        exporters,
        "--advise.interval",
        "2s",
        "--history.backfill",
        "0",
        ready="/health",
        timeout_s=90,
    ) as (base, _process):
        doc = requests.get(f"{base}/api/pending", timeout=10).json()
        assert doc["meta"]["source"] == f"k8s:+{exporters}"
        assert [j["job"] for j in doc["pending_jobs"]] == ["rnd/pretrain"]
        assert doc["blocked_plan"]["plan"]["feasible"]
        page = requests.get(f"{base}/metrics", timeout=10).text
        assert 'gpu_advisor_shape_unschedulable{cause="scattered",shape="8x8"}' in page
        index = requests.get(f"{base}/api/", timeout=10).json()
        assert "/api/pending" in index["routes"]


def test_backfill_reads_the_usage_past_grouped_by_the_schedulers_pools(monkeypatch):
    """k8s:+prometheus+...: the week Prometheus recorded, each hour grouped by the pools the
    scheduler names now (a scheduler records no past of its own)."""
    from advisor.ingest import backfill
    from advisor.model import ModelBuilder
    from advisor.scheduler_view import SchedNode, SchedulerView

    def past_hour(at: float):
        b = ModelBuilder()
        b.add_node("n1")  # the exporters' past knows no pool
        b.add_gpu("n1", 0)
        return b.build(timestamp=at)

    seen = []

    def fake_past(spec, span_s, **_):
        seen.append(spec)
        return backfill.Backfill(spec, span_s, [past_hour(0.0), past_hour(3600.0)])

    monkeypatch.setattr(backfill, "past", fake_past)

    class Reader:  # the service's CombinedReader, as far as the backfill asks it
        def view(self):
            return SchedulerView("kubernetes", "k8s:", (SchedNode("n1", pool="a100", rack="r1"),))

    spec = "k8s:+prometheus+http://prometheus:9090"
    assert backfill.default_span_s(spec) == backfill.RECORDED_SPAN_S
    assert backfill.default_span_s("k8s:") == 0.0
    result = backfill.backfill(spec, Reader(), 7200.0)
    assert seen == ["prometheus+http://prometheus:9090"]
    assert [m.nodes.pool.tolist() for m in result.models] == [["a100"], ["a100"]]
    assert result.source == spec


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ("k8s:?tenant=team", "expected namespace, queue or label:KEY"),
        ("k8s:+prometheus+http://p:9090?histroy=1h", "unknown option 'histroy'"),
        ("slurm:?colour=red+http://node1:9835/metrics", "colour"),
        ("k8s:+k8s:", "one scheduler per source"),
    ],
)
def test_a_bad_scheduler_source_is_refused_at_start(source, problem):
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "advisor.cli", "advise", "--source", source],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert problem in result.stderr.strip().splitlines()[-1] and "Traceback" not in result.stderr
