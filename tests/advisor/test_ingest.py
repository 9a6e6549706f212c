"""Ingest: our exporter's and dcgm-exporter's pages and Prometheus' API served from a local
http.server, plus sim, openb and snapshot sources, all into the same model."""

from __future__ import annotations

import gzip
import json
import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from advisor import snapshot
from advisor.cli import main
from advisor.ingest import exporter_scrape, prometheus
from advisor.ingest.readings import from_readings
from advisor.ingest.sources import SourceError, load_source, prometheus_spec
from exporter.readings import Collection
from exporter.render import SelfState, render_page
from tests.exporter import readings_factory
from tests.fakes.page_server import (
    Route,
    Routes,
    endless,
    fixed,
    head,
    serve,
    serve_raw,
    trickle,
)
from tests.ports import free_port

DCGM_FIXTURES = Path(__file__).parent.parent / "fixtures" / "dcgm_exporter"
STATE = SelfState("0.1.0", "test", True, 0.01, 1.7e9, 1, {})


@pytest.fixture
def server() -> Iterator[tuple[str, Routes]]:
    routes = Routes()
    with serve(routes) as base:
        yield base, routes


def our_page(nodes: int = 2) -> tuple[str, list]:
    readings = [readings_factory.node(f"node-{i}") for i in range(nodes)]
    page = render_page(Collection(readings, 1.7e9), [], STATE)
    return page.body.decode(), readings


def same_state(a, b) -> bool:
    da, db = snapshot.to_dict(a), snapshot.to_dict(b)
    for doc in (da, db):
        doc.pop("timestamp"), doc.pop("source"), doc.pop("usage")
    return da == db


# --------------------------------------------------------------------------- exporter pages


def test_scraping_our_page_gives_the_model_of_the_readings(server) -> None:
    base, routes = server
    text, readings = our_page()
    routes.text("/metrics", text)
    model = load_source(f"{base}/metrics", timeout=2)
    assert same_state(model, from_readings(readings))
    assert model.nodes.name.tolist() == ["node-0", "node-1"]
    assert model.nodes.pool.tolist() == ["h100", "h100"] and model.nodes.rack[0] == "rack-1"
    ids = model.allocations.id.tolist()
    # GPU 6 is busy with no allocation: in use, owner unknown (a holder nobody names)
    assert ids[:4] == ["rnd/train-0", "product/idle-1", "unattributed@node-0/gpu6", "product/infer"]
    assert model.gpu_owner_unknown[:8].tolist() == [False] * 6 + [True, False]
    # the MIG GPU is carved into 7 x 1g.10gb; one slice held = 1/7 of the GPU
    assert model.allocations.gpu_milli[3] == 143
    assert model.gpus.nvlink_island[:8].tolist() == [0] * 8
    assert model.gpus.utilization_ratio[0] == 0.5


def test_dcgm_exporter_page_pod_labels_become_allocations(server) -> None:
    base, routes = server
    routes.text("/dcgm", (DCGM_FIXTURES / "a100_k8s.prom").read_text())
    model = load_source(f"{base}/dcgm", timeout=2)
    assert model.nodes.name.tolist() == ["dgx-a100-07"]
    assert len(model.gpus) == 8
    rows = dict(zip(model.allocations.id.tolist(), model.allocations.num_gpu.tolist(), strict=True))
    assert rows == {"ml-train/llm-pretrain-worker-0": 4, "inference/bert-serve-7d9f8b6c5-x2k4q": 1}
    assert model.allocations.tenant.tolist() == ["ml-train", "inference"]
    assert not model.gpus.healthy[4]  # row-remap failure in the fixture
    assert not model.gpu_is_free[4]


def test_comma_separated_urls_mix_our_pages_and_dcgm_pages(server) -> None:
    base, routes = server
    routes.text("/ours", our_page(1)[0])
    routes.text("/dcgm", (DCGM_FIXTURES / "a100_k8s.prom").read_text())
    model = load_source(f"{base}/ours,{base}/dcgm", timeout=2)
    assert sorted(model.nodes.name.tolist()) == ["dgx-a100-07", "node-0"]


def test_nonsense_values_and_labels_are_skipped_not_fatal(server) -> None:
    base, routes = server
    text, readings = our_page(1)
    text += 'gpu_nvlink_island{gpu="1",node="node-0"} +Inf\n'  # not an island number
    text += 'gpu_nvlink_links{gpu="0",node="node-0",peer_gpu="1"} +Inf\n'
    text += 'gpu_power_watts{gpu="-1",node="node-0"} 100.0\n'  # no GPU has a negative index
    routes.text("/metrics", text)
    model = load_source(f"{base}/metrics", timeout=2)
    assert same_state(model, from_readings(readings))
    assert model.gpus.index.min() == 0


def test_unreachable_and_bad_pages_are_one_line_errors(server) -> None:
    base, routes = server
    port = free_port()
    with pytest.raises(SourceError, match=rf"http://127.0.0.1:{port}/metrics: unreachable"):
        load_source(f"http://127.0.0.1:{port}/metrics", timeout=1)
    with pytest.raises(SourceError, match=r"/missing: HTTP 404"):
        load_source(f"{base}/missing", timeout=2)
    routes.text("/garbage", (DCGM_FIXTURES / "garbage.prom").read_text())
    with pytest.raises(SourceError, match=r"/garbage: malformed exposition text at line 1: "):
        load_source(f"{base}/garbage", timeout=2)


# --------------------------------------------------------------------------- Prometheus API


def _series(text: str, extra: dict[str, str]) -> list[tuple[str, dict[str, str], float]]:
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.append((s.name, {**s.labels, **extra}, s.value))
    return out


LONG_AGO = "2020-01-01T00:00:00Z"  # a Prometheus started long before the tests' instants


def prometheus_api(
    samples,
    history: dict[str, list[tuple[dict, list[tuple[float, float]]]]],
    down=(),
    *,
    started: str = LONG_AGO,
    stamps: dict[tuple[str, tuple], float] | None = None,
) -> dict[str, Route]:
    """A tiny Prometheus: the state query returns `samples`, the query for down targets `down`;
    range queries return `history`; runtimeinfo says it `started`, and the timestamps query
    answers `stamps` ((name, sorted label items) -> sample time; the query's time without)."""

    def ok(data) -> tuple[int, str, str]:
        return 200, "application/json", json.dumps({"status": "success", "data": data})

    def instant(query: dict[str, str]) -> tuple[int, str, str]:
        if query.get("query") == prometheus.DOWN_QUERY:
            answer = down
        elif query.get("query") == prometheus.STATE_QUERY:
            answer = samples
        elif "timestamp(" in query.get("query", ""):
            at = float(query["time"])
            result = [
                {
                    "metric": {prometheus.NAME_LABEL: name, **labels},
                    "value": [
                        at,
                        str((stamps or {}).get((name, tuple(sorted(labels.items()))), at)),
                    ],
                }
                for name, labels, _ in samples
                if f'"{name}"' in query["query"]
            ]
            return ok({"resultType": "vector", "result": result})
        else:
            return (
                400,
                "application/json",
                json.dumps({"status": "error", "errorType": "bad_data", "error": "unexpected"}),
            )
        result = [
            {"metric": {"__name__": name, **labels}, "value": [float(query["time"]), str(value)]}
            for name, labels, value in answer
        ]
        return ok({"resultType": "vector", "result": result})

    def range_(query: dict[str, str]) -> tuple[int, str, str]:
        start, end, step = (float(query[k]) for k in ("start", "end", "step"))
        if (end - start) / step > 11_000:  # as Prometheus refuses it
            error = "exceeded maximum resolution of 11,000 points per timeseries"
            body = {"status": "error", "errorType": "bad_data", "error": error}
            return 400, "application/json", json.dumps(body)
        result = [
            {
                "metric": {"__name__": query["query"], **labels},
                "values": [[t, str(v)] for t, v in points if start <= t <= end],
            }
            for labels, points in history.get(query["query"], [])
        ]
        return ok({"resultType": "matrix", "result": [r for r in result if r["values"]]})

    return {
        "/api/v1/query": instant,
        "/api/v1/query_range": range_,
        "/api/v1/status/runtimeinfo": lambda _query: ok({"startTime": started}),
    }


def test_prometheus_instant_and_range_with_our_names(server) -> None:
    base, routes = server
    text, readings = our_page()
    samples = _series(text, {"instance": "node-0:9400", "job": "gpu-exporter"})
    at = 1_700_000_000.0
    util = [
        (
            {"node": "node-1", "gpu": "3", "instance": "x:1", "job": "gpu-exporter"},
            [(at - 120, 0.25), (at, 0.75)],
        )
    ]
    routes.update(prometheus_api(samples, {"gpu_utilization_ratio": util}))
    model = load_source(f"prometheus+{base}?at={at}&history=5m&step=1m", timeout=2)
    assert same_state(model, from_readings(readings))
    assert model.timestamp == at
    assert model.usage.times.tolist() == [at - 300 + 60 * k for k in range(6)]
    column = model.usage.utilization_ratio[:, model.gpu_row(1, 3)]
    assert (
        np.isnan(column[:3]).all()
        and column[3] == 0.25
        and np.isnan(column[4])
        and column[5] == 0.75
    )
    assert np.isnan(model.usage.memory_used_bytes).all()
    # GPU 6 of each node is busy with no allocation: in use, its owner unknown
    unknown = {f"unattributed@node-{n}/gpu6" for n in (0, 1)}
    assert set(model.allocations.job.tolist()) == {
        "rnd/train-0",
        "product/idle-1",
        "product/infer",
        *unknown,
    }


def test_a_history_longer_than_prometheus_allows_in_one_query_is_read_in_pieces(server) -> None:
    """Two weeks at 1 min are 20,161 steps, which Prometheus refuses in one range query."""
    base, routes = server
    text, _ = our_page()
    samples = _series(text, {"instance": "node-0:9400", "job": "gpu-exporter"})
    at = 1_700_000_000.0
    steps = 14 * 24 * 60 + 1
    times = at - 60 * np.arange(steps)[::-1]
    util = [({"node": "node-1", "gpu": "3"}, [(t, (k % 100) / 100) for k, t in enumerate(times)])]
    routes.update(prometheus_api(samples, {"gpu_utilization_ratio": util}))
    sent = []
    client = prometheus.PrometheusClient(base, 2)
    original = client._results
    client._results = lambda path, params, parse: (
        sent.append(params) or original(path, params, parse)
    )
    model = prometheus.load(base, at=at, history_s=14 * 86400, step_s=60, client=client)
    assert model.usage.times.tolist() == times.tolist()
    column = model.usage.utilization_ratio[:, model.gpu_row(1, 3)]
    assert column.tolist() == [np.float32((k % 100) / 100) for k in range(steps)]
    ranges = [p for p in sent if "step" in p]
    assert len(ranges) == 2 * 3  # utilization and memory, three pieces each
    assert all((p["end"] - p["start"]) / p["step"] < prometheus.MAX_STEPS for p in ranges)


@pytest.mark.parametrize(
    ("spec", "samples", "cap"),
    [
        ("prometheus+http://127.0.0.1:1?history=32d&step=1m", "46,080", "44,640 (a month"),
        ("sim:a100-16x8?t=8d&history=8d&step=1m", "11,520", "10,080 (a week"),
    ],
)
def test_a_usage_history_of_too_many_samples_is_one_line(spec, samples, cap) -> None:
    history = spec.split("history=")[1].split("&")[0]
    with pytest.raises(SourceError) as error:
        load_source(spec, timeout=1)
    assert str(error.value) == (
        f"{spec}: history={history} every step=1m is {samples} usage samples; at most {cap} at "
        "one a minute): use a longer step"
    )


def test_a_prometheus_history_of_a_month_of_minutes_is_read() -> None:
    spec = "prometheus+http://127.0.0.1:1?history=31d&step=1m"
    assert prometheus_spec(spec).history_s == 31 * 86400


@pytest.mark.parametrize(
    ("span", "step"), [(0, 60), (59, 60), (9_999 * 60, 60), (10_000 * 60, 60), (3e7, 7), (1e5, 1)]
)
def test_range_pieces_cover_the_grid_once(span, step) -> None:
    start = 1_700_000_000.0
    pieces = prometheus.range_pieces(start, start + span, step)
    grid = [start + k * step for k in range(int(span // step) + 1)]
    covered = [t for first, last in pieces for t in np.arange(first, last + step / 2, step)]
    assert covered == pytest.approx(grid)
    assert all(round((last - first) / step) + 1 <= prometheus.MAX_STEPS for first, last in pieces)


def test_prometheus_with_dcgm_names_and_history_in_percent(server) -> None:
    base, routes = server
    samples = _series(
        (DCGM_FIXTURES / "a100_k8s.prom").read_text(), {"instance": "10.0.0.7:9400", "job": "dcgm"}
    )
    at = 1_700_000_000.0
    util = [({"gpu": "2", "Hostname": "dgx-a100-07", "instance": "10.0.0.7:9400"}, [(at, 40.0)])]
    routes.update(prometheus_api(samples, {"DCGM_FI_DEV_GPU_UTIL": util}))
    model = load_source(f"prometheus+{base}?at={at}&history=60&step=60", timeout=2)
    assert model.nodes.name.tolist() == ["dgx-a100-07"]
    assert model.allocations.num_gpu.tolist() == [4, 1]
    assert model.usage.utilization_ratio[-1, 2] == pytest.approx(0.4)


def test_prometheus_errors_name_the_server(server) -> None:
    base, routes = server
    port = free_port()
    with pytest.raises(SourceError, match=rf"^Prometheus at http://127.0.0.1:{port} unreachable: "):
        load_source(f"prometheus+http://127.0.0.1:{port}", timeout=1)
    routes["/api/v1/query"] = lambda q: (
        422,
        "application/json",
        json.dumps({"status": "error", "errorType": "execution", "error": "too many samples"}),
    )
    with pytest.raises(SourceError, match=r"query failed \(execution: too many samples\)"):
        load_source(f"prometheus+{base}", timeout=2)
    routes.update(prometheus_api([], {}))
    with pytest.raises(SourceError, match=r"no gpu_\* .* or DCGM_\* .* series"):
        load_source(f"prometheus+{base}", timeout=2)
    with pytest.raises(SourceError, match="unknown option 'foo'"):
        load_source(f"prometheus+{base}?foo=1")
    with pytest.raises(SourceError, match=r"\?at=abc: at='abc': expected a Unix time"):
        load_source(f"prometheus+{base}?at=abc")


def _raw_reply(body: bytes, **headers: str) -> bytes:
    return head(Content_Type="application/json", Content_Length=str(len(body)), **headers) + body


INSTANT = json.dumps(
    {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [{"metric": {"__name__": "up", "job": "gpu"}, "value": [1.7e9, "1"]}],
        },
    }
).encode()


def test_a_prometheus_reply_that_trickles_ends_at_the_timeout_in_one_line() -> None:
    reply = _raw_reply(INSTANT)
    with serve_raw(trickle(reply, 0.1, start=len(reply) - 40)) as base:
        started = time.monotonic()
        with pytest.raises(SourceError) as error:
            load_source(f"prometheus+{base}", timeout=1)
        took = time.monotonic() - started
    assert (
        str(error.value) == f"Prometheus at {base}: no complete reply to /api/v1/query within 1 s"
    )
    assert 0.9 < took < 2.0


def test_a_prometheus_reply_over_the_cap_is_refused(monkeypatch) -> None:
    monkeypatch.setattr(prometheus, "MAX_REPLY_BYTES", 2**20)
    with (
        serve_raw(endless(head(Transfer_Encoding="chunked"))) as base,
        pytest.raises(SourceError) as error,
    ):
        load_source(f"prometheus+{base}", timeout=10)
    assert str(error.value) == f"Prometheus at {base}: reply to /api/v1/query larger than 1MiB"


def test_a_prometheus_content_length_over_the_cap_is_refused_without_reading() -> None:
    declared = head(Content_Length=str(prometheus.MAX_REPLY_BYTES + 1))
    with serve_raw(lambda conn, stop: (conn.sendall(declared), stop.wait(10))) as base:
        started = time.monotonic()
        with pytest.raises(prometheus.SourceUnavailable) as error:
            prometheus.PrometheusClient(base, 5).instant("up")
        assert time.monotonic() - started < 1
    assert str(error.value) == f"Prometheus at {base}: reply to /api/v1/query larger than 512MiB"


def test_a_gzip_prometheus_reply_is_read_as_the_plain_one() -> None:
    zipped = _raw_reply(gzip.compress(INSTANT), Content_Encoding="gzip")
    with serve_raw(fixed(zipped)) as base:
        samples = prometheus.PrometheusClient(base, 2).instant("up")
    assert samples == [("up", {"job": "gpu"}, 1.0)]


def _reply(body) -> Route:
    return lambda _query: (200, "application/json", json.dumps(body))


def _instant(value: list) -> dict:
    metric = {"__name__": "gpu_info", "node": "n", "gpu": "0"}
    return {"status": "success", "data": {"result": [{"metric": metric, "value": value}]}}


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (_instant([1.7e9, "abc"]), "could not convert string to float: 'abc'"),
        (_instant([1.7e9]), "list index out of range"),
        ({"status": "success"}, "no data object"),
        ([1, 2], "HTTP 200, no API status"),
        ({"status": "success", "data": {"result": [{"value": [0, "1"]}]}}, "missing 'metric'"),
        ({"status": "success", "data": {"result": {"a": 1}}}, "result is dict, not a list"),
    ],
)
def test_malformed_instant_replies_are_one_line_source_errors(server, body, why) -> None:
    base, routes = server
    routes["/api/v1/query"] = _reply(body)
    with pytest.raises(SourceError) as error:
        load_source(f"prometheus+{base}", timeout=2)
    message = str(error.value)
    assert message.startswith(f"Prometheus at {base}: malformed reply to {{__name__=~")
    assert message.endswith(f"({why})") and "\n" not in message


@pytest.mark.parametrize(
    ("values", "why"),
    [
        ([[1.7e9, "0.5", "extra"]], "a point is not [time, value]"),
        ([[1.7e9, "abc"]], "could not convert string to float: 'abc'"),
    ],
)
def test_malformed_range_replies_name_the_query(server, values, why) -> None:
    base, routes = server
    text, _ = our_page(1)
    routes.update(prometheus_api(_series(text, {}), {}))
    metric = {"__name__": "gpu_utilization_ratio", "node": "node-0", "gpu": "0"}
    body = {"status": "success", "data": {"result": [{"metric": metric, "values": values}]}}
    routes["/api/v1/query_range"] = _reply(body)
    with pytest.raises(SourceError) as error:
        load_source(f"prometheus+{base}?at=1700000000&history=5m", timeout=2)
    assert str(error.value) == (
        f"Prometheus at {base}: malformed reply to gpu_utilization_ratio ({why})"
    )


def _warnings(caplog, logger: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger and r.levelno >= 30]


def test_impossible_history_points_are_gaps_for_analyze_and_snapshot_alike(
    server, tmp_path, caplog
) -> None:
    """The history is held to the bounds of a scraped page: a utilization outside 0-1, a byte
    count below 0 or beyond 2^53, an infinity is a gap with one warning per metric; NaN is a
    gap as before, the possible points and the rest of the model are read."""
    base, routes = server
    text, readings = our_page(1)
    at = 1_700_000_000.0
    gpu0 = {"node": "node-0", "gpu": "0", "instance": "x:1", "job": "gpu-exporter"}
    gpu1 = {**gpu0, "gpu": "1"}
    inf = float("inf")
    util = [
        (gpu0, [(at - 300, -0.5), (at - 240, 5.0), (at - 180, inf), (at - 120, float("nan"))]),
        (gpu0, [(at - 60, 1e300), (at, 0.75)]),
        (gpu1, [(at - 60, 0.0), (at, 1.0)]),  # the bounds themselves are possible
    ]
    memory = [(gpu0, [(at - 300, -1.0), (at - 240, 2.0**53 + 2**11), (at - 180, -inf), (at, 8e9)])]
    history = {"gpu_utilization_ratio": util, "gpu_memory_used_bytes": memory}
    routes.update(prometheus_api(_series(text, {}), history))
    source = f"prometheus+{base}?at={at}&history=5m&step=1m"
    out = tmp_path / "s.json"
    with caplog.at_level(logging.WARNING):
        assert main(["analyze", source, "--json"]) == 0
        assert main(["snapshot", source, "-o", str(out)]) == 0
        model = load_source(source, timeout=2)
    assert same_state(model, from_readings(readings))
    usage = model.usage
    util0 = usage.utilization_ratio[:, model.gpu_row(0, 0)]
    assert np.isnan(util0[:5]).all() and util0[5] == 0.75
    assert usage.utilization_ratio[-2:, model.gpu_row(0, 1)].tolist() == [0.0, 1.0]
    memory0 = usage.memory_used_bytes[:, model.gpu_row(0, 0)]
    assert np.isnan(memory0[:5]).all() and memory0[5] == 8e9
    back = snapshot.load(out)  # the snapshot holds the same gaps and loads back
    assert np.array_equal(back.usage.utilization_ratio, usage.utilization_ratio, equal_nan=True)
    notes = _warnings(caplog, prometheus.__name__)
    assert len(notes) == 6  # per read: one for utilization, one for memory
    assert notes[0] == (
        f"Prometheus at {base}: 4 impossible value(s) in the gpu_utilization_ratio history read "
        "as unknown: node-0/gpu0=-0.5 at 1699999700; node-0/gpu0=5 at 1699999760; "
        "node-0/gpu0=inf at 1699999820; ..."
    )
    assert notes[1].startswith(
        f"Prometheus at {base}: 3 impossible value(s) in the gpu_memory_used_bytes history"
    )


def test_impossible_dcgm_history_points_are_checked_in_the_model_units(server, caplog) -> None:
    base, routes = server
    samples = _series((DCGM_FIXTURES / "a100_k8s.prom").read_text(), {"instance": "10.0.0.7:9400"})
    at = 1_700_000_000.0
    gpu2 = {"gpu": "2", "Hostname": "dgx-a100-07", "instance": "10.0.0.7:9400"}
    util = [(gpu2, [(at - 120, 100.0), (at - 60, 500.0), (at, -5.0)])]  # percent
    memory = [(gpu2, [(at - 60, 81920.0), (at, 2.0**40)])]  # MiB: 80 GiB, then 2^60 bytes
    routes.update(
        prometheus_api(samples, {"DCGM_FI_DEV_GPU_UTIL": util, "DCGM_FI_DEV_FB_USED": memory})
    )
    with caplog.at_level(logging.WARNING):
        model = load_source(f"prometheus+{base}?at={at}&history=2m&step=1m", timeout=2)
    row = model.gpu_row(0, 2)
    assert model.usage.utilization_ratio[0, row] == 1.0
    assert np.isnan(model.usage.utilization_ratio[1:, row]).all()
    assert model.usage.memory_used_bytes[1, row] == 80 * 2**30
    assert np.isnan(model.usage.memory_used_bytes[2, row])
    notes = _warnings(caplog, prometheus.__name__)
    assert len(notes) == 2 and "DCGM_FI_DEV_GPU_UTIL history" in notes[0]
    assert "dgx-a100-07/gpu2=500 at 1699999940; dgx-a100-07/gpu2=-5 at 1700000000" in notes[0]
    assert notes[1].endswith(
        f"DCGM_FI_DEV_FB_USED history read as unknown: dgx-a100-07/gpu2={2.0**40:g} at 1700000000"
    )


def test_impossible_instant_values_from_prometheus_are_unknown_as_on_a_page(server, caplog) -> None:
    """The instant vector goes through the scraped page's check (exporter_scrape)."""
    base, routes = server
    text, _ = our_page(1)
    samples = [
        (name, labels, 5.0 if name == "gpu_utilization_ratio" and labels["gpu"] == "0" else value)
        for name, labels, value in _series(text, {})
    ]
    routes.update(prometheus_api(samples, {}))
    with caplog.at_level(logging.WARNING):
        model = load_source(f"prometheus+{base}?at=1700000000&history=0", timeout=2)
    assert np.isnan(model.gpus.utilization_ratio[model.gpu_row(0, 0)])
    assert model.gpus.utilization_ratio[model.gpu_row(0, 1)] == 0.5
    (note,) = _warnings(caplog, exporter_scrape.__name__)
    assert "node-0/gpu0 utilization_ratio=5" in note


def test_memory_history_above_the_gpus_total_is_a_gap_and_the_total_itself_is_kept(
    server, caplog
) -> None:
    """Compared in float64 before the history's float32: a full GPU whose byte count float32
    rounds up is kept; one byte more is a gap in the memory warning. No total, no check."""
    base, routes = server
    text, _ = our_page(1)
    totals, total = "gpu_memory_total_bytes", 2.0**36 * 1.25 - 1  # float32 rounds it up
    samples = [
        (name, labels, total if (name, labels.get("gpu")) == (totals, "1") else value)
        for name, labels, value in _series(text, {})
        if (name, labels.get("gpu")) != (totals, "2")
    ]
    at = 1_700_000_000.0
    gpu = {"node": "node-0", "instance": "x:1", "job": "gpu-exporter"}
    memory = [
        ({**gpu, "gpu": "1"}, [(at - 120, total), (at - 60, total + 1), (at, 8e9)]),
        ({**gpu, "gpu": "2"}, [(at, 1e12)]),  # total unknown: no check
    ]
    routes.update(prometheus_api(samples, {"gpu_memory_used_bytes": memory}))
    with caplog.at_level(logging.WARNING):
        model = load_source(f"prometheus+{base}?at={at}&history=2m&step=1m", timeout=2)
    assert model.gpus.memory_total_bytes[model.gpu_row(0, 1)] == total
    assert np.isnan(model.gpus.memory_total_bytes[model.gpu_row(0, 2)])
    memory1 = model.usage.memory_used_bytes[:, model.gpu_row(0, 1)]
    assert float(memory1[0]) == 2.0**36 * 1.25  # kept: float32 holds it as 80 GiB
    assert np.isnan(memory1[1]) and memory1[2] == 8e9
    assert model.usage.memory_used_bytes[2, model.gpu_row(0, 2)] == 1e12
    assert _warnings(caplog, prometheus.__name__) == [
        f"Prometheus at {base}: 1 impossible value(s) in the gpu_memory_used_bytes history read "
        "as unknown: node-0/gpu1 85899345920 > memory_total_bytes=85899345919 at 1699999940"
    ]


def _two_targets(server, caplog):
    """One exporter scraped by two jobs: instance b comes first in the reply, a first by name;
    a's GPU 0 shows another utilization. The history of GPU 0 comes from a, b and an older
    instance of the exporter (before a existed)."""
    base, routes = server
    text, readings = our_page(1)
    a = {"instance": "a:9835", "job": "gpu-exporter"}
    b = {"instance": "b:9835", "job": "gpu-exporter-2"}
    from_a = [
        (name, labels, 0.9 if name == "gpu_utilization_ratio" and labels["gpu"] == "0" else value)
        for name, labels, value in _series(text, a)
    ]
    at = 1_700_000_000.0
    gpu0 = {"node": "node-0", "gpu": "0"}
    util = [
        ({**gpu0, **a}, [(at - 120, 0.25), (at - 60, 0.5)]),
        ({**gpu0, **b}, [(at - 180, 0.1), (at - 120, 0.1), (at - 60, 0.1), (at, 0.1)]),
        ({**gpu0, "instance": "0-old:9835"}, [(at - 240, 0.3), (at - 180, 0.3), (at - 120, 0.3)]),
    ]
    routes.update(prometheus_api(_series(text, b) + from_a, {"gpu_utilization_ratio": util}))
    with caplog.at_level(logging.WARNING):
        model = load_source(f"prometheus+{base}?at={at}&history=4m&step=1m", timeout=2)
    return model, readings


def test_a_gpu_two_scrape_targets_report_is_read_whole_from_the_first_by_name(
    server, caplog
) -> None:
    """Read from a (its utilization; the identical series once: nothing doubled), one warning
    names both instances."""
    model, readings = _two_targets(server, caplog)
    single = from_readings(readings)
    assert len(model.gpus) == len(single.gpus) == 8
    assert model.gpus.utilization_ratio[model.gpu_row(0, 0)] == pytest.approx(0.9)
    assert model.allocations.id.tolist() == single.allocations.id.tolist()
    assert model.allocations.gpu_milli.tolist() == single.allocations.gpu_milli.tolist()
    (note,) = _warnings(caplog, exporter_scrape.__name__)
    assert note == (
        "8 GPU(s) reported by more than one Prometheus scrape target, each read from the first "
        "Prometheus scrape target (our exporter's targets first, then dcgm-exporter's, each in "
        "name order) that reports it: node-0/gpu0, node-0/gpu1, node-0/gpu2, ... from a:9835 "
        "(also reported by b:9835)"
    )


def test_the_history_of_a_gpu_two_targets_report_is_the_state_targets_point_at_each_step(
    server, caplog
) -> None:
    """a's point wherever a has one (b's never blended in); where it has none, the first other
    target by name that has: the older instance before a existed, then b after a's last."""
    model, _ = _two_targets(server, caplog)
    history = model.usage.utilization_ratio[:, model.gpu_row(0, 0)]
    np.testing.assert_allclose(history, [0.3, 0.3, 0.25, 0.5, 0.1])


class CountingClient(prometheus.PrometheusClient):
    """The real client, recording each query it sends."""

    def __init__(self, base_url: str) -> None:
        super().__init__(base_url, timeout=2)
        self.queries: list[tuple[str, str]] = []

    def instant(self, query, at=None):
        self.queries.append(("instant", query))
        return super().instant(query, at)

    def range(self, query, start, end, step):
        self.queries.append(("range", query))
        return super().range(query, start, end, step)


OURS = {"instance": "node-0:9835", "job": "gpu-exporter"}
DCGM = {"instance": "10.0.0.7:9400", "job": "dcgm"}
AT = 1_700_000_000.0


def _dcgm_samples(extra: dict[str, str]) -> list:
    return _series((DCGM_FIXTURES / "a100_k8s.prom").read_text(), extra)


def test_a_fleet_mid_roll_out_reads_each_target_by_its_own_kind(server, caplog) -> None:
    """node-0 runs our exporter, dgx-a100-07 dcgm-exporter only: both nodes are in the model
    with the values each target gives, and each GPU's history comes from its own kind's query
    in that kind's unit (the other kind's series for it are not read)."""
    base, routes = server
    text, readings = our_page(1)
    ours_only = from_readings(readings)
    routes.update(prometheus_api(_dcgm_samples(DCGM), {}))
    dcgm_only = load_source(f"prometheus+{base}?at={AT}&history=0", timeout=2)
    gpu0 = {"node": "node-0", "gpu": "0", **OURS}
    gpu2 = {"gpu": "2", "Hostname": "dgx-a100-07", **DCGM}
    history = {
        "gpu_utilization_ratio": [
            (gpu0, [(AT - 60, 0.25), (AT, 0.75)]),
            ({"node": "dgx-a100-07", "gpu": "2", "instance": "x:1"}, [(AT - 120, 0.9)]),
        ],
        "gpu_memory_used_bytes": [(gpu0, [(AT, 8e9)])],
        "DCGM_FI_DEV_GPU_UTIL": [
            (gpu2, [(AT - 60, 40.0)]),  # percent
            ({**gpu0, "Hostname": "node-0"}, [(AT - 120, 90.0)]),  # our --compat.dcgm-names
        ],
        "DCGM_FI_DEV_FB_USED": [(gpu2, [(AT, 1024.0)])],  # MiB
    }
    routes.update(prometheus_api(_series(text, OURS) + _dcgm_samples(DCGM), history))
    with caplog.at_level(logging.WARNING):
        model = load_source(f"prometheus+{base}?at={AT}&history=2m&step=1m", timeout=2)
    assert model.nodes.name.tolist() == ["node-0", "dgx-a100-07"]
    assert len(model.gpus) == len(ours_only.gpus) + len(dcgm_only.gpus) == 16
    ours_row, dcgm_row = model.gpu_row(0, 0), model.gpu_row(1, 2)
    assert model.gpus.utilization_ratio[ours_row] == ours_only.gpus.utilization_ratio[0]
    assert model.gpus.utilization_ratio[dcgm_row] == dcgm_only.gpus.utilization_ratio[2]
    assert model.gpus.memory_total_bytes[dcgm_row] == dcgm_only.gpus.memory_total_bytes[2]
    assert model.allocations.id.tolist() == (
        ours_only.allocations.id.tolist() + dcgm_only.allocations.id.tolist()
    )
    usage = model.usage
    np.testing.assert_allclose(usage.utilization_ratio[:, ours_row], [np.nan, 0.25, 0.75])
    np.testing.assert_allclose(usage.utilization_ratio[:, dcgm_row], [np.nan, 0.4, np.nan])
    np.testing.assert_array_equal(usage.memory_used_bytes[:, ours_row], [np.nan, np.nan, 8e9])
    np.testing.assert_array_equal(usage.memory_used_bytes[:, dcgm_row], [np.nan, np.nan, 2**30])
    assert _warnings(caplog, exporter_scrape.__name__) == []
    assert _warnings(caplog, prometheus.__name__) == []


def test_impossible_history_points_of_a_mixed_fleet_are_one_warning_per_metric(
    server, caplog
) -> None:
    """Each kind's points are checked in the model's unit (100 % utilization is possible, 150 %
    is not; dcgm-exporter's MiB against the GPU's total in bytes); the utilization warning names
    both queries, the memory one the query whose point is above the GPU's total."""
    base, routes = server
    text, _ = our_page(1)
    gpu0 = {"node": "node-0", "gpu": "0", **OURS}
    gpu2 = {"gpu": "2", "Hostname": "dgx-a100-07", **DCGM}
    history = {
        "gpu_utilization_ratio": [(gpu0, [(AT - 60, 1.5), (AT, 1.0)])],
        "DCGM_FI_DEV_GPU_UTIL": [(gpu2, [(AT - 60, 100.0), (AT, 150.0)])],
        "DCGM_FI_DEV_FB_USED": [(gpu2, [(AT - 60, 81920.0), (AT, 81921.0)])],  # MiB, of 80 GiB
    }
    routes.update(prometheus_api(_series(text, OURS) + _dcgm_samples(DCGM), history))
    with caplog.at_level(logging.WARNING):
        model = load_source(f"prometheus+{base}?at={AT}&history=1m&step=1m", timeout=2)
    usage = model.usage
    np.testing.assert_array_equal(usage.utilization_ratio[:, model.gpu_row(0, 0)], [np.nan, 1.0])
    np.testing.assert_array_equal(usage.utilization_ratio[:, model.gpu_row(1, 2)], [1.0, np.nan])
    memory = usage.memory_used_bytes[:, model.gpu_row(1, 2)]
    assert memory[0] == 80 * 2**30 and np.isnan(memory[1])  # a full GPU kept, one MiB more not
    assert _warnings(caplog, prometheus.__name__) == [
        f"Prometheus at {base}: 2 impossible value(s) in the gpu_utilization_ratio and "
        "DCGM_FI_DEV_GPU_UTIL history read as unknown: dgx-a100-07/gpu2=150 at 1700000000; "
        "node-0/gpu0=1.5 at 1699999940",
        f"Prometheus at {base}: 1 impossible value(s) in the DCGM_FI_DEV_FB_USED history read "
        f"as unknown: dgx-a100-07/gpu2 {81921 * 2**20} > memory_total_bytes={80 * 2**30} at "
        "1700000000",
    ]


def test_our_exporter_wins_a_node_dcgm_exporter_also_reports_whatever_the_names(
    server, caplog
) -> None:
    """Both exporters scraped on node-0: dcgm-exporter's target comes first by name, ours is
    read (allocations, topology, MIG), with one warning naming both; the history is ours."""
    base, routes = server
    text, readings = our_page(1)
    single = from_readings(readings)
    dcgm = {"Hostname": "node-0", "instance": "node-0:9400", "job": "dcgm"}
    gpu0 = {"node": "node-0", "gpu": "0", **OURS}
    history = {
        "gpu_utilization_ratio": [(gpu0, [(AT, 0.75)])],
        "DCGM_FI_DEV_GPU_UTIL": [({"gpu": "0", **dcgm}, [(AT - 60, 10.0), (AT, 10.0)])],
    }
    routes.update(prometheus_api(_dcgm_samples(dcgm) + _series(text, OURS), history))
    with caplog.at_level(logging.WARNING):
        model = load_source(f"prometheus+{base}?at={AT}&history=1m&step=1m", timeout=2)
    assert same_state(model, single)
    np.testing.assert_allclose(
        model.usage.utilization_ratio[:, model.gpu_row(0, 0)], [np.nan, 0.75]
    )
    assert _warnings(caplog, exporter_scrape.__name__) == [
        "8 GPU(s) reported by more than one Prometheus scrape target, each read from the first "
        "Prometheus scrape target (our exporter's targets first, then dcgm-exporter's, each in "
        "name order) that reports it: node-0/gpu0, node-0/gpu1, node-0/gpu2, ... from "
        "node-0:9835 (also reported by node-0:9400)"
    ]


def test_each_kinds_history_queries_run_only_where_a_target_of_that_kind_is_read(server) -> None:
    """A pure fleet of either kind asks what it asked before (our exporter's DCGM_* names are
    not read); a mixed one asks both kinds' queries, once each."""
    base, routes = server
    text, readings = our_page(1)
    state = [("instant", prometheus.STATE_QUERY), ("instant", prometheus.DOWN_QUERY)]
    compat = ("DCGM_FI_DEV_GPU_UTIL", {"gpu": "0", "Hostname": "node-0", **OURS}, 50.0)
    gpu0 = {"node": "node-0", "gpu": "0", **OURS}
    gpu2 = {"gpu": "2", "Hostname": "dgx-a100-07", **DCGM}
    history = {
        "gpu_utilization_ratio": [(gpu0, [(AT, 0.75)])],
        "DCGM_FI_DEV_GPU_UTIL": [(gpu2, [(AT, 40.0)]), ({**gpu0, "Hostname": "node-0"}, [(AT, 9)])],
    }
    fleets = {
        "ours": (
            [*_series(text, OURS), compat],
            ["gpu_utilization_ratio", "gpu_memory_used_bytes"],
        ),
        "dcgm": (_dcgm_samples(DCGM), ["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"]),
        "mixed": (
            _series(text, OURS) + _dcgm_samples(DCGM),
            [
                "gpu_utilization_ratio",
                "DCGM_FI_DEV_GPU_UTIL",
                "gpu_memory_used_bytes",
                "DCGM_FI_DEV_FB_USED",
            ],
        ),
    }
    models = {}
    for fleet, (samples, queries) in fleets.items():
        routes.update(prometheus_api(samples, history))
        client = CountingClient(base)
        models[fleet] = prometheus.load(base, at=AT, history_s=60, step_s=60, client=client)
        assert client.queries == state + [("range", query) for query in queries], fleet
    assert same_state(models["ours"], from_readings(readings))
    np.testing.assert_array_equal(models["ours"].usage.utilization_ratio[:, 0], [np.nan, 0.75])
    assert models["dcgm"].nodes.name.tolist() == ["dgx-a100-07"]
    assert models["dcgm"].usage.utilization_ratio[-1, 2] == pytest.approx(0.4)
    mixed = models["mixed"].usage.utilization_ratio
    assert mixed[-1, models["mixed"].gpu_row(0, 0)] == 0.75
    assert mixed[-1, models["mixed"].gpu_row(1, 2)] == pytest.approx(0.4)


# --------------------------------------------------------------------------- files and sim


def test_snapshot_source_and_bad_snapshot_names_the_field(tmp_path) -> None:
    model = from_readings(our_page(1)[1])
    path = tmp_path / "c.json"
    snapshot.save(model, path)
    assert same_state(load_source(str(path)), model)
    doc = json.loads(path.read_text())
    doc["allocations"][0]["num_gpu"] = "two"
    path.write_text(json.dumps(doc))
    with pytest.raises(
        SourceError, match=r'allocations\[0\]\.num_gpu: expected an integer, got "two"'
    ):
        load_source(str(path))


def test_openb_trace_keeps_pods_as_pending_demand_with_times(tmp_path) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(
        "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,T4\nn1,96000,393216,8,G2\nc0,32000,1024,0,\n"
    )
    pods = tmp_path / "pods.csv"
    pods.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
        "p0,4000,1024,1,500,,LS,Running,10,100,12\n"
        "p1,8000,2048,2,1000,G2,BE,Succeeded,20,,21\n"
        "p2,1000,512,0,0,,BE,Running,30,40,30\n"
    )
    model = load_source(f"openb:{nodes},{pods}")
    assert model.nodes.gpu_count.tolist() == [2, 8, 0]
    assert model.nodes.cpu_milli.tolist() == [64000, 96000, 32000]
    allocs = model.allocations
    assert allocs.node.tolist() == [-1, -1, -1]
    assert allocs.gpu_milli.tolist() == [500, 1000, 0]
    assert allocs.gpu_spec.tolist() == ["", "G2", ""]
    assert allocs.creation_time.tolist() == [10, 20, 30]
    assert np.isnan(allocs.deletion_time[1]) and allocs.scheduled_time[0] == 12
    assert allocs.qos.tolist() == ["LS", "BE", "BE"]
    assert int(model.gpu_is_free.sum()) == 10
    with pytest.raises(SourceError, match="line 2, column gpu"):
        nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,x,T4\n")
        load_source(f"openb:{nodes}")


def test_sim_source_carries_job_facts() -> None:
    model = load_source("sim:a100-16x8?seed=3&t=600")
    assert len(model.nodes) == 16 and len(model.gpus) == 128
    placed = model.allocations.node >= 0
    assert placed.any()
    assert not np.isnan(model.allocations.start_time[placed]).any()
    assert model.timestamp > 1e9
    assert same_state(model, load_source("sim:a100-16x8?seed=3&t=600"))  # pure in its inputs
    with pytest.raises(SourceError, match="unknown preset 'nope'"):
        load_source("sim:nope")
    with pytest.raises(
        SourceError, match=r"\?nodes=0: nodes='0': expected a finite whole number >= 1 "
    ):
        load_source("sim:a100-16x8?nodes=0")
    for spec in ("sim:a100-16x8?t=-5", "prometheus+http://127.0.0.1:1?history=-1h"):
        with pytest.raises(SourceError) as bad:  # the spec leads, as for every other option
            load_source(spec)
        assert str(bad.value).startswith(f"{spec}: "), str(bad.value)
        assert str(bad.value).endswith("expected a duration such as 60, 60s, 15m or 1h")
    with pytest.raises(SourceError, match="is not a source"):
        load_source("ftp://x")


def test_sim_history_fills_the_usage_matrix_up_to_now() -> None:
    model = load_source("sim:a100-16x8?seed=3&t=2h&history=30m&step=10m")
    assert model.usage.times.tolist() == [model.timestamp - 1800 + 600 * k for k in range(4)]
    assert model.usage.utilization_ratio.shape == (4, 128)
    assert not np.isnan(model.usage.utilization_ratio).any()
    latest = load_source("sim:a100-16x8?seed=3&t=2h")
    np.testing.assert_allclose(
        model.usage.utilization_ratio[-1], latest.gpus.utilization_ratio.astype(np.float32)
    )


@pytest.mark.parametrize(
    ("spec", "got"),
    [
        ("sim:a100-16x8?history=24h&step=1h", "none of it exists"),
        ("sim:a100-16x8?t=6h&history=24h&step=1h", "only 6h of it exists"),
    ],
)
def test_a_sim_history_reaching_before_the_start_is_one_warning(spec, got, caplog) -> None:
    """The simulation has no past before t=0 (t's default): the history is cut at t, and the
    reader says so instead of the planners later finding no (or too little) history."""
    from advisor.ingest import sources

    with caplog.at_level(logging.WARNING):
        model = load_source(spec)
    assert _warnings(caplog, sources.__name__) == [
        f"{spec}: history=24h reaches before the simulation's start (t=0): {got}; use t=1d or later"
    ]
    assert len(model.usage.times) == (7 if "t=6h" in spec else 0)


@pytest.mark.parametrize("spec", ["sim:a100-16x8?t=1d&history=24h&step=1h", "sim:a100-16x8?t=1h"])
def test_a_sim_history_within_t_reads_without_a_warning(spec, caplog) -> None:
    from advisor.ingest import sources

    with caplog.at_level(logging.WARNING):
        load_source(spec)
    assert _warnings(caplog, sources.__name__) == []


def test_an_exporter_whose_backend_is_down_is_a_source_error_not_an_empty_node(server) -> None:
    base, routes = server
    down = SelfState("0.1.0", "nvml", False, 0.01, 1.7e9, 3, {"collect": 2})
    routes.text("/down", render_page(None, [], down).body.decode())
    routes.text("/ours", our_page(1)[0])
    with pytest.raises(SourceError, match=r"/down: the exporter's nvml backend is down \("):
        load_source(f"{base}/ours,{base}/down", timeout=2)
    # within its grace the exporter still serves the last good GPU series: they are read
    readings = [readings_factory.node("node-0")]
    routes.text("/grace", render_page(Collection(readings, 1.7e9), [], down).body.decode())
    assert same_state(load_source(f"{base}/grace", timeout=2), from_readings(readings))


def test_a_page_without_gpu_series_is_a_source_error_and_a_bad_gpu_label_a_note(
    server, caplog
) -> None:
    base, routes = server
    routes.text("/node-exporter", "up 1\nnode_load1 0.5\n")
    with pytest.raises(SourceError, match=r"/node-exporter: no GPU series \(gpu_\* of"):
        load_source(f"{base}/node-exporter", timeout=2)
    text, _readings = our_page(1)
    routes.text("/no-node", text.replace('node="node-0"', 'node=""'))
    with pytest.raises(SourceError, match=r"/no-node: no GPU series"):
        load_source(f"{base}/no-node", timeout=2)
    # GPU 3's series with a label that is no index: the GPU is left out, with one note
    routes.text("/bad-index", re.sub(r'(?<![_a-z])gpu="3"', 'gpu="abc"', text))
    with caplog.at_level(logging.WARNING):
        model = load_source(f"{base}/bad-index", timeout=2)
    assert sorted(model.gpus.index.tolist()) == [0, 1, 2, 4, 5, 6, 7]
    assert "node-0/gpu 'abc' (not a GPU index: left out)" in caplog.text


def test_gpu_exporters_prometheus_cannot_read_are_named_once(server, caplog) -> None:
    """node-0's exporter is read; of the down targets, one of its job (not scraped) and one
    whose backend is down and serves no GPU are named in one warning, while a down target of
    another job (node_exporter) and node-0's own backend flag (its kept series are read) are
    not. The fleet read is node-0's."""
    base, routes = server
    text, readings = our_page(1)
    down = [
        ("up", {"instance": "node-9:9835", "job": "gpu-exporter"}, 0.0),
        ("up", {"instance": "node-9:9100", "job": "node"}, 0.0),
        (
            "gpu_exporter_backend_up",
            {"instance": "node-4:9835", "job": "gpu-exporter", "backend": "nvml"},
            0.0,
        ),
        ("gpu_exporter_backend_up", {**OURS, "backend": "nvml"}, 0.0),
    ]
    routes.update(prometheus_api(_series(text, OURS), {}, down))
    with caplog.at_level(logging.WARNING):
        model = load_source(f"prometheus+{base}?at={AT}&history=0", timeout=2)
    assert same_state(model, from_readings(readings))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"Prometheus at {base}: 2 GPU exporter target(s) down, their nodes are not in this "
        "read: node-4:9835 (nvml backend down); node-9:9835 (job gpu-exporter: not scraped)"
    ]


def test_a_prometheus_that_cannot_answer_the_down_query_still_gives_the_fleet(
    server, caplog
) -> None:
    base, routes = server
    text, readings = our_page(1)
    routes.update(prometheus_api(_series(text, OURS), {}))
    state = routes["/api/v1/query"]
    routes["/api/v1/query"] = lambda query: (
        (503, "text/plain", "overloaded")
        if query.get("query") == prometheus.DOWN_QUERY
        else state(query)
    )
    with caplog.at_level(logging.INFO):
        model = load_source(f"prometheus+{base}?at={AT}&history=0", timeout=2)
    assert same_state(model, from_readings(readings))
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("cannot tell which GPU exporters are down" in r.getMessage() for r in caplog.records)
