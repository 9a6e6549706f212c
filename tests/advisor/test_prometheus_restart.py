"""A restarted Prometheus answers for the lookback with series its previous process wrote and
never marked stale: the advisor reads the latest scrape of each target, and a source that
still overlaps itself (two holders of one whole GPU) is read with a warning, never refused."""

from __future__ import annotations

import logging
import time

import pytest

from advisor.ingest import prometheus
from advisor.ingest.readings import from_readings
from exporter.readings import Allocation
from tests.advisor.test_ingest import prometheus_api, server  # noqa: F401 (fixture)
from tests.exporter import readings_factory

AT = 1_700_000_000.0
TARGET = {"instance": "node-0:9835", "job": "gpu-exporter"}
PAGE_GPU = {"node": "n1", **TARGET}


def samples(*pods: str) -> list[tuple[str, dict[str, str], float]]:
    """Two A100s on n1, GPU 0 held whole by each of `pods` (as an exporter reports it)."""
    out = [
        ("gpu_info", {"gpu": str(i), "uuid": f"GPU-{i}", "model": "A100", **PAGE_GPU}, 1.0)
        for i in (0, 1)
    ]
    # GPU 1 idles: busy without an owner it would be "in use, owner unknown", not free
    out += [
        ("gpu_utilization_ratio", {"gpu": str(i), **PAGE_GPU}, u) for i, u in ((0, 0.5), (1, 0))
    ]
    out += [
        (
            "gpu_allocation_info",
            {"gpu": "0", "pod": pod, "namespace": "ml", "gpu_milli": "1000", **PAGE_GPU},
            1.0,
        )
        for pod in pods
    ]
    return out


def key(name: str, labels: dict[str, str]) -> tuple[str, tuple]:
    return name, tuple(sorted(labels.items()))


def test_after_a_restart_a_series_not_in_its_targets_last_scrape_is_not_read(server, caplog):  # noqa: F811
    """The old pod's allocation was last scraped before the outage, everything else a second
    ago: was 'oversubscribed: 2000 milli-GPU allocated > 1000', the whole reading refused."""
    base, routes = server
    state = samples("old", "new")
    stamps = {key(n, labels): AT - 1.0 for n, labels, _ in state}
    stamps[key(*state[-2][:2])] = AT - 180.0  # pod "old": before Prometheus went down
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(AT - 60))
    routes.update(prometheus_api(state, {}, started=started, stamps=stamps))
    with caplog.at_level(logging.WARNING):
        model = prometheus.load(base, at=AT, history_s=0)
    assert model.allocations.id.tolist() == ["ml/new"]
    assert model.gpu_milli_allocated.tolist() == [1000, 0]
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "1 series not in their target's latest scrape" in warning
    assert 'pod="old"' in warning


def test_long_after_a_start_no_leftovers_are_asked_for(server):  # noqa: F811
    base, routes = server
    asked = []
    api = prometheus_api(samples("new"), {})
    instant = api["/api/v1/query"]
    api["/api/v1/query"] = lambda query: asked.append(query["query"]) or instant(query)
    routes.update(api)
    prometheus.load(base, at=AT, history_s=0)
    assert not [q for q in asked if "timestamp(" in q]  # one extra tiny request: runtimeinfo


def test_a_prometheus_that_does_not_say_when_it_started_is_always_asked(server):  # noqa: F811
    base, routes = server
    state = samples("old", "new")
    stamps = {key(n, labels): AT - 1.0 for n, labels, _ in state}
    stamps[key(*state[-2][:2])] = AT - 180.0
    routes.update(prometheus_api(state, {}, stamps=stamps))
    del routes["/api/v1/status/runtimeinfo"]  # Thanos, Mimir, an old release: 404
    model = prometheus.load(base, at=AT, history_s=0)
    assert model.allocations.id.tolist() == ["ml/new"]


def test_holders_whose_shares_exceed_the_gpu_share_it_evenly_with_one_warning(caplog):
    """Without timestamps to tell them apart (a direct scrape that lists both), the reading is
    not refused: the GPU is allocated, its two holders half each."""
    node = readings_factory.node("n1", gpus=2)
    for gpu in node.gpus:
        gpu.processes = []
    node.gpus[1] = readings_factory.gpu(1, utilization=0.0, used_gib=0.0)  # idle: free
    node.allocations = [
        Allocation(gpu=0, pod=pod, namespace="ml", gpu_milli=1000) for pod in ("a", "b")
    ]
    with caplog.at_level(logging.WARNING):
        model = from_readings([node], source="http://n1:9835/metrics")
    assert sorted(model.allocations.id.tolist()) == ["ml/a", "ml/b"]
    assert model.gpu_milli_allocated[0] == 1000
    assert model.placements.milli.tolist() == [500, 500]
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning.startswith("http://n1:9835/metrics: 1 GPU(s) whose holders' shares add up")
    assert "n1/gpu0 (2000 milli-GPU)" in warning


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-28T19:21:19.803198777Z", 1795893679.803198),
        ("2026-11-28T19:21:19Z", 1795893679.0),
        ("2026-11-28T20:21:19.5+01:00", 1795893679.5),
    ],
)
def test_runtimeinfo_start_times_parse_to_the_microsecond(text, expected):
    assert prometheus._rfc3339(text) == pytest.approx(expected, abs=1e-6)
