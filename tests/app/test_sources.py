"""Sources: a bad one is one clear message (no traceback) and the app keeps working; the
sidebar builds specs; live sources are polled into the history."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from advisor.app import data
from advisor.fragmentation import measures
from advisor.ingest.sources import load_source
from exporter.readings import Collection
from exporter.render import SelfState, render_page
from gpu_defrag_sim.fleet import SimFleet
from tests.app.conftest import metrics, open_app
from tests.fakes.page_server import Routes, serve

PAGES = (None, "views/fragmentation.py")


def _error_page(source: str, page: str | None) -> str:
    at = open_app(source, page)  # asserts: no exception element
    assert len(at.error) == 1
    assert not at.metric  # the page stopped after the message
    assert at.sidebar.selectbox(key="source_kind")  # the sidebar still works
    return at.error[0].value


@pytest.mark.parametrize("page", PAGES)
def test_unreachable_exporter_is_one_message(page: str | None) -> None:
    message = _error_page("http://127.0.0.1:9/metrics", page)
    assert "Cannot read the data source" in message and "unreachable" in message


def test_malformed_snapshot_and_unknown_preset(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": "gpu-defrag.snapshot", "version": 1, "nodes": "x"}))
    assert "snapshot" in _error_page(str(bad), None)
    assert "unknown preset 'nope'" in _error_page("sim:nope", "views/fragmentation.py")


def test_unexpected_errors_are_messages_too(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(spec: str):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(data, "load_model", broken)
    assert "RuntimeError: disk on fire" in _error_page("sim:a100-16x8", None)


def test_the_sidebar_switches_sources() -> None:
    at = open_app("http://127.0.0.1:9/metrics")
    assert at.error
    at.sidebar.selectbox(key="source_kind").set_value("sim").run()
    at.sidebar.button[0].click().run()
    assert not at.exception and not at.error
    assert at.session_state["source"] == "sim:a100-16x8"
    assert metrics(at)["GPUs"] == "128"


def test_spec_builders() -> None:
    assert data.sim_spec("a100-16x8") == "sim:a100-16x8"
    assert data.sim_spec("a100-16x8", 7, 24, 64) == "sim:a100-16x8?seed=7&t=24h&nodes=64"
    assert data.exporters_spec("host-a:9835\nhttp://b:1/metrics") == (
        "http://host-a:9835/metrics,http://b:1/metrics"
    )
    assert data.prometheus_spec("prom:9090") == "prometheus+http://prom:9090"
    assert data.file_spec("snap.json") == "snap.json"
    assert data.file_spec("trace/pods.csv") == "openb:trace/pods.csv"
    for spec in ("sim:x", "http://a/metrics", "prometheus+http://p:9090", "f.json"):
        assert data.kind_of(spec) in data.SOURCE_KINDS
    assert data.initial_source(["--source", "sim:y"], {}) == "sim:y"
    assert data.initial_source([], {data.SOURCE_ENV: "sim:z"}) == "sim:z"
    assert data.initial_source([], {}) == data.DEFAULT_SOURCE
    assert data.same_source("sim:a100-16x8?t=2d", "sim:a100-16x8?t=48h&seed=42")
    assert not data.same_source("sim:a100-16x8?t=2d", "sim:a100-16x8?t=1d")
    assert not data.same_source("sim:a100-16x8?seed=x", "sim:a100-16x8")


def test_a_live_source_keeps_its_history_and_the_last_good_view(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fleet = SimFleet("a100-16x8", 42)
    failing = {"now": False}

    def step(spec: str):
        if failing["now"]:
            raise OSError("connection reset")
        from advisor.ingest.sources import sim_model

        model = sim_model(fleet, spec)
        fleet.advance(600)
        return model

    monkeypatch.setattr(data, "load_model", step)
    advisor = data.LocalAdvisor("http://fake/metrics", refresh_s=3600)
    try:
        assert advisor.wait_settled(120)
        advisor.run_once()
        advisor.run_once()
        shown, error = advisor.latest()
        assert error is None and len(advisor.pipeline.history) == 3
        assert len(shown.model.usage.times) == 3  # idle is judged over the kept samples
        assert data.trend(shown)["free_gpus"].iloc[-1] == shown.result["spatial"]["free_gpus"]
        version = shown.version
        failing["now"] = True
        advisor.run_once()
        assert advisor.latest()[0] is shown and "connection reset" in shown.refresh_error
        assert shown.version != version  # the open page's watch reruns it to say so
        failed = shown.version
        advisor.run_once()
        assert shown.version == failed  # the same failure again: no rerun each refresh
    finally:
        advisor.stop()


def test_a_prometheus_source_starts_with_its_last_week(monkeypatch: pytest.MonkeyPatch) -> None:
    """The app's pipeline reads a Prometheus source's past first (the service's backfill), so
    its forecast page has 24-h forecasts at once; an exporter URL has no past to read."""
    from advisor.ingest import backfill
    from advisor.ingest.live import LiveSim

    sim = LiveSim("sim:a100-16x8?nodes=4&t=72h", clock=lambda: 0.0)
    asked = []

    def past(spec, span_s, **kw):
        asked.append((spec, span_s))
        return backfill.Backfill(spec, span_s, sim.backfill(72 * 3600.0))

    monkeypatch.setattr(backfill, "from_prometheus", past)
    now = "sim:a100-16x8?nodes=4&t=72h"  # a reader of its own: the past is `sim`'s
    monkeypatch.setattr(data, "load_model", lambda spec: LiveSim(now, clock=lambda: 0.0)())
    advisor = data.LocalAdvisor("prometheus+http://prom:9090", refresh_s=15)
    try:
        assert advisor.wait_settled(120)
        assert asked == [("prometheus+http://prom:9090", 7 * 86400.0)]
        assert len(advisor.pipeline.history) == 73
        assert advisor.past.startswith("backfilled 72 past hour(s)")
        shown, _ = advisor.latest()
        doc = shown.forecast
        horizons = {h["horizon"]: h for pool in doc["pools"] for h in pool["horizons"]}
        assert horizons["24h"]["available"]
    finally:
        advisor.stop()
    exporter = data.LocalAdvisor("http://fake/metrics", refresh_s=15)
    exporter.wait_settled(120)
    exporter.stop()
    assert len(asked) == 1 and exporter.past == "" and len(exporter.pipeline.history) == 1


@pytest.fixture
def exporter_page() -> Iterator[str]:
    """A local server whose /metrics is our exporter's page for the a100-16x8 sim at t=0."""
    fleet = SimFleet("a100-16x8", 42)
    body = render_page(
        Collection(fleet.readings(), fleet.unix_time), [], SelfState("0", "t", True, 0, 0, 1, {})
    ).body.decode()
    routes = Routes()
    routes.text("/metrics", body)
    with serve(routes) as base:
        yield f"{base}/metrics"


def test_live_exporter_source(exporter_page: str) -> None:
    at = open_app(exporter_page)
    result = measures.analyze(load_source(exporter_page))
    shown = metrics(at)
    assert shown["Free"] == f"{result['spatial']['free_gpus']:,}"
    assert shown["GPUs"] == "128"
    assert any("Live: refreshed every" in c.value for c in at.sidebar.caption)
    at.switch_page("views/fragmentation.py").run()
    assert not at.exception
    assert any("Collecting history" in info.value for info in at.info)
    at.switch_page("views/forecast.py").run()
    assert not at.exception
    assert any("An exporter keeps no past" in info.value for info in at.info)


def test_a_sim_exporter_with_a_past_has_forecasts_at_the_first_load() -> None:
    """The demo's case: the app reads a sim exporter started a week into its fleet's life, reads
    that week back (the service's backfill) and shows the forecast with its backtest at once."""
    from advisor.settings import HORIZONS_H, OUTLOOK_HORIZONS_H
    from exporter.backends.sim import SimBackend
    from tests.app.conftest import frame_with

    backend = SimBackend(nodes=4, speed=60.0, start_s=7 * 86400.0)
    backend.start()
    body = render_page(backend.collect(), [], SelfState("0", "sim", True, 0, 0, 1, {}))
    routes = Routes()
    routes.text("/metrics", body.body.decode())
    with serve(routes) as base:
        at = open_app(f"{base}/metrics", "views/forecast.py")
    shown = frame_with(at, "backtest WAPE")
    served = (*HORIZONS_H, *OUTLOOK_HORIZONS_H)  # a week of past: every horizon, the outlook's
    assert set(shown["horizon"]) == {f"{h}h" for h in served}
    assert not any("Collecting history" in info.value for info in at.info)


def test_snapshot_file_source(tmp_path: Path) -> None:
    from advisor import snapshot

    path = tmp_path / "cluster.json"
    snapshot.save(load_source("sim:mixed-h100-a100-v100?t=3h"), path)
    at = open_app(str(path))
    result = measures.analyze(load_source(str(path)))
    assert metrics(at)["Free"] == f"{result['spatial']['free_gpus']:,}"
    assert metrics(at)["Allocated, idle"] == f"{result['temporal']['allocated_idle_gpus']:,}"
    read = [c.value for c in at.sidebar.caption if c.value.startswith("Static source")]
    assert len(read) == 1 and read[0].endswith(" UTC (wall clock).")  # not the fleet's own time
    assert at.sidebar.selectbox(key="source_kind").value == "file"


def test_cleared_advisors_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    import streamlit as st

    monkeypatch.setattr(data, "load_model", lambda spec: load_source("sim:nvlink-islands"))
    advisor, error = data.get_advisor("http://fake-a/metrics")
    assert error is None and advisor.live
    assert advisor is data._advisor("http://fake-a/metrics", data.refresh_seconds())
    assert not advisor._stop.is_set()
    st.cache_resource.clear()
    assert advisor._stop.is_set()


@pytest.mark.parametrize("page", PAGES)
def test_a_read_that_left_exporters_out_says_so_on_every_page(
    monkeypatch: pytest.MonkeyPatch, page: str | None
) -> None:
    """A `prometheus+` read that lacks GPU exporters (their targets down) is a part of the
    fleet: each page says which, above figures that still show what was read."""
    from dataclasses import replace

    whole = load_source
    left = tuple(f"node-{i}:9835 (job gpu-exporter: not scraped)" for i in range(7))
    monkeypatch.setattr(data, "load_model", lambda spec: replace(whole(spec), left_out=left))
    at = open_app("sim:a100-16x8", page)
    assert [w.value for w in at.warning] == [
        "7 GPU exporter(s) could not be read, so their nodes are in no figure here: "
        + "; ".join(left[:5])
        + " and 2 more."
    ]
    assert at.metric  # the page goes on with the fleet it has
