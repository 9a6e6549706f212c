"""`gpu-defrag advise` as an operator runs it: a real process on 127.0.0.1, read over HTTP."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import jsonschema
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from advisor.fragmentation.measures import parse_shape
from advisor.service.api import SNAPSHOT_SCHEMA
from tests.fakes.waiting import reap, wait_until
from tests.ports import free_port
from tests.service.conftest import ISLANDS, advisor_process, follow, strict_schema

pytestmark = pytest.mark.slow  # a real advisor process per test or session


def get_json(url: str) -> tuple[int, dict]:
    response = requests.get(url, timeout=10)
    assert response.headers["Content-Type"] == "application/json"
    return response.status_code, response.json()


def wait_for(check, process):
    """`check()`'s first truthy value, as long as the advisor runs (a request that fails or
    times out on a busy machine is asked again)."""

    def asked():
        try:
            return check()
        except requests.RequestException:
            return None

    return wait_until(asked, "the advisor's answer", process)


def test_fragmentation_route_matches_the_metrics(service):
    status, doc = get_json(f"{service}/api/fragmentation")
    assert status == 200
    meta = doc["meta"]
    assert meta["source"] == "sim:a100-16x8" and meta["stale"] is False and meta["source_up"]
    assert doc["cluster"]["gpus"] == 128 and "nodes" not in doc
    (pool,) = doc["pools"]
    assert pool["pool"] == "a100" and pool["gpus"] == 128
    assert {row["shape"] for row in doc["shapes"]} >= {"fractional", "1", "8", "2x8", "8x8"}
    _, with_nodes = get_json(f"{service}/api/fragmentation?nodes=true")
    assert len(with_nodes["nodes"]) == 16
    assert sum(n["free_gpus"] for n in with_nodes["nodes"]) == with_nodes["spatial"]["free_gpus"]
    page = requests.get(f"{service}/metrics", timeout=10).text
    names = {f.name for f in text_string_to_metric_families(page)}
    assert {"gpu_advisor_fragmentation_ratio", "gpu_advisor_gpu_state", "gpu_advisor_runs"} <= names


def test_recommendations_plan_the_jobs_that_cannot_start(service):
    status, doc = get_json(f"{service}/api/recommendations")
    assert status == 200
    _, frag = get_json(f"{service}/api/fragmentation")
    blocked = {f"job={row['shape']}" for row in frag["shapes"] if row["schedulable_jobs"] == 0}
    assert {g for g in doc["goals"] if g.startswith("job=")} == blocked - {"job=fractional"}
    assert doc["method"] == "consolidation+recommend"
    feasible = [p for p in doc["plans"] if p["feasible"] and p["goal"].startswith("job=")]
    assert feasible  # after 48 simulated hours a 2x8 job waits for a consolidation
    assert all(p["checked"] for p in feasible)  # every shown plan was replayed by the checker
    assert doc["total_actions"] == len(doc["actions"]) == sum(doc["by_kind"].values())
    assert [a["rank"] for a in doc["actions"]] == list(range(1, len(doc["actions"]) + 1))
    for plan in feasible:
        mine = [a for a in doc["actions"] if a["goal"] == plan["goal"]]
        assert sum(a["benefit_gpus"] for a in mine) == pytest.approx(
            parse_shape(plan["goal"].removeprefix("job=")).gpus
        )
    _, one = get_json(f"{service}/api/recommendations?limit=1")
    assert len(one["actions"]) == 1 and one["total_actions"] == doc["total_actions"]
    page = requests.get(f"{service}/metrics", timeout=10).text
    info = [
        s
        for f in text_string_to_metric_families(page)
        for s in f.samples
        if s.name == "gpu_advisor_action_info"
    ]
    assert 0 < len(info) <= 10


def test_forecast_route_has_backtested_intervals(service):
    status, doc = get_json(f"{service}/api/forecast")
    assert status == 200 and doc["stale"] is False and doc["error"] is None
    assert doc["history_hours"] >= 47
    (pool,) = doc["pools"]
    for horizon in pool["horizons"]:
        assert horizon["available"], horizon
        assert doc["baseline"] in horizon["backtest"]["wape_ratio"]
        q = horizon["quantiles"]
        assert 0 <= q["0.1"] <= q["0.5"] <= q["0.9"] <= pool["capacity_gpus"]


def test_snapshot_route_is_a_valid_snapshot(service):
    status, doc = get_json(f"{service}/api/snapshot")
    assert status == 200
    jsonschema.validate(doc["snapshot"], json.loads(SNAPSHOT_SCHEMA.read_text()))
    assert len(doc["snapshot"]["nodes"]) == 16


def test_bad_query_is_a_400_with_a_reason(service):
    status, doc = get_json(f"{service}/api/recommendations?limit=-1")
    assert status == 400 and "limit" in doc["error"]
    status, doc = get_json(f"{service}/api/fragmentation?nodes=maybe")
    assert status == 400 and "nodes" in doc["error"]
    status, doc = get_json(f"{service}/api/job-ends?limit=x")
    assert status == 400 and "limit" in doc["error"]


def test_openapi_document_lists_every_route(service):
    status, doc = get_json(f"{service}/api/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.1")
    assert set(doc["paths"]) == {
        "/api/",
        "/api/snapshot",
        "/api/fragmentation",
        "/api/recommendations",
        "/api/forecast",
        "/api/job-ends",
        "/api/history",
        "/api/pending",
        "/api/openapi.json",
    }


def test_unreachable_source_is_a_metric_a_log_line_and_503s():
    port = free_port()  # nothing listens there
    url = f"http://127.0.0.1:{port}/metrics"
    with advisor_process("--source", url, "--advise.interval", "1s") as (base, process):

        def counted():  # the first run has failed its ingest (the counter starts at 0.0)
            page = requests.get(f"{base}/metrics", timeout=5).text
            failed = 'gpu_advisor_run_errors_total{stage="ingest"} 0.0' not in page
            return 'gpu_advisor_run_errors_total{stage="ingest"}' in page and failed and page

        page = wait_for(
            lambda: "gpu_advisor_runs_total 1.0" not in (counted() or "") and counted(), process
        )
        assert f'gpu_advisor_source_up{{source="{url}"}} 0.0' in page
        assert "gpu_advisor_fragmentation_ratio" not in page
        status, doc = get_json(f"{base}/api/fragmentation")
        assert status == 503 and str(port) in doc["error"] and doc["meta"]["stale"] is True
        assert requests.get(f"{base}/health", timeout=5).status_code == 503
        process.send_signal(2)
        reap(process)
        stderr = process.stderr.read()
    warnings = [line for line in stderr.splitlines() if "level=WARNING" in line]
    assert warnings and all(url in line for line in warnings)
    assert f"every 1s; serving /metrics and /api/ at {base}" in stderr  # the URL it answers on
    assert "Traceback" not in stderr


def test_source_failing_later_serves_last_results_marked_stale(tmp_path):
    path = tmp_path / "cluster.json"
    shutil.copy(ISLANDS, path)
    with advisor_process("--source", str(path), "--advise.interval", "1s", ready="/health") as (
        base,
        process,
    ):
        _, fresh = get_json(f"{base}/api/fragmentation")
        assert fresh["meta"]["stale"] is False
        path.write_text("{not json")
        stale = wait_for(
            lambda: (doc := get_json(f"{base}/api/fragmentation")[1])["meta"]["stale"] and doc,
            process,
        )
        assert stale["meta"]["source_up"] is False and str(path) in stale["meta"]["source_error"]
        assert stale["pools"] == fresh["pools"]  # the last good picture, still served
        page = requests.get(f"{base}/metrics", timeout=5).text
        assert 'gpu_advisor_source_up{source="' + str(path) + '"} 0.0' in page
        assert "gpu_advisor_fragmentation_ratio" in page
        assert requests.get(f"{base}/health", timeout=5).status_code == 503


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--source", "sim:a100-16x8", "--forecast.horizons", "90m"], "whole hours"),
        (["--source", "sim:nope"], "unknown preset 'nope'"),
        (["--source", "sim:a100-16x8", "--policy", "/nonexistent/policy.yaml"], "policy"),
        (["--source", "sim:a100-16x8", "--web.listen-address", "nonsense"], "expected [host]:port"),
        (["--source", "sim:a100-16x8", "--advise.interval", "0"], "not a positive duration"),
        (["--source", "sim:a100-16x8", "--source.timeout", "0s"], "not a positive duration"),
        (["--source", "sim:a100-16x8", "--forecast.idle-max-nodes", "-1"], "whole number"),
        (["--source", "nope:x"], "'nope:x' is not a source"),
        (["--source", "promethues+http://127.0.0.1:9090"], "is not a source"),
        (["--source", "sim:a100-16x8", "--health.stale-intervals", "0"], "number > 0"),
        (["--source", "sim:a100-16x8", "--health.stale-intervals", "-1"], "number > 0"),
    ],
)
def test_bad_configuration_is_one_line_and_exit_2(args, message):
    result = subprocess.run(
        [sys.executable, "-m", "advisor.cli", "advise", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    # flag errors come from argparse (usage, then one error line); the rest is one line
    assert message in result.stderr.strip().splitlines()[-1]
    assert "Traceback" not in result.stderr


def test_the_per_node_idle_limit_comes_from_the_command_line(service):
    _, doc = get_json(f"{service}/api/forecast")
    idle = doc["idle"]
    assert idle["max_nodes"] == 4 and idle["nodes_total"] == len(idle["nodes"]) == 16
    limited = [
        n
        for n in idle["nodes"]
        if any("per-node limit" in w.get("reason", "") for w in n["windows"])
    ]
    assert len(limited) == 12  # all but the 4 with the most GPUs idle


def test_served_openapi_document_is_the_one_the_fuzz_test_uses(service):
    from advisor.service.api import openapi_document

    _, served = get_json(f"{service}/api/openapi.json")
    assert served == json.loads(json.dumps(openapi_document()))


@pytest.mark.parametrize(
    ("route", "schema"),
    [
        ("/api/fragmentation?nodes=true", "Fragmentation"),
        ("/api/recommendations", "Recommendations"),
        ("/api/forecast", "Forecast"),
        ("/api/snapshot", "SnapshotResponse"),
        ("/api/job-ends", "JobEndList"),
    ],
)
def test_live_answers_serve_only_declared_properties(service, route, schema):
    _, doc = get_json(f"{service}{route}")
    jsonschema.validate(doc, strict_schema(schema))
    if schema == "Fragmentation":
        assert "allocated_idle_power_watts" in doc["pools"][0]
        for always in ("shapes", "gpu_models"):
            with pytest.raises(jsonschema.ValidationError):
                jsonschema.validate(
                    {k: v for k, v in doc.items() if k != always}, strict_schema(schema)
                )
    if schema == "Recommendations":
        assert doc["plans"] and any(p["actions"] for p in doc["plans"])
    if schema == "JobEndList":  # the live sim's running jobs, learned ends among them
        assert doc["jobs"] and doc["by_source"]["learned"] > 0


def test_the_two_stale_flags_and_point_vs_median_are_documented(islands):
    """meta.stale (the whole answer is an earlier run's) and a section's own stale (its stage
    failed) are different facts, as are point_gpus and quantiles['0.5']: the schema says so."""
    from advisor.documents import as_json, build_recommendations
    from advisor.service.api import openapi_document
    from advisor.service.loop import AdvisorLoop, Config
    from tests.service.conftest import ScriptedSource

    schemas = openapi_document()["components"]["schemas"]
    assert "ingest or analysis failed" in schemas["Meta"]["properties"]["stale"]["description"]
    for name, stage in (("Recommendations", "plan"), ("Forecast", "forecast")):
        text = schemas[name]["properties"]["stale"]["description"]
        assert f"{stage} stage failed" in text and "meta.stale" in text
    pool = follow(schemas, schemas["Forecast"]["properties"]["pools"]["items"])
    (available, _) = (
        follow(schemas, one) for one in pool["properties"]["horizons"]["items"]["oneOf"]
    )
    point = available["properties"]["point_gpus"]["description"]
    quantiles = available["properties"]["quantiles"]["description"]
    assert "WAPE" in point and "quantiles['0.5']" in point
    assert "median" in quantiles and "recent errors" in quantiles
    loop = AdvisorLoop("snap", ScriptedSource(islands, "source down"), Config())
    loop.run_once()
    doc = as_json(build_recommendations(loop.run_once()))
    assert doc["meta"]["stale"] is True and doc["stale"] is False  # as described, unchanged


def test_a_password_in_the_source_is_not_published():
    port = free_port()  # nothing listens there
    secret = f"prometheus+http://admin:s3cret@127.0.0.1:{port}"
    with advisor_process("--source", secret, "--advise.interval", "1s") as (base, process):
        page = wait_for(
            lambda: (
                (text := requests.get(f"{base}/metrics", timeout=5).text).count(
                    'gpu_advisor_run_errors_total{stage="ingest"} 0.0'
                )
                == 0
                and text
            ),
            process,
        )
        _, doc = get_json(f"{base}/api/fragmentation")
        process.send_signal(2)
        reap(process)
        stderr = process.stderr.read()
    shown = secret.replace("s3cret", "***")
    assert f'gpu_advisor_source_up{{source="{shown}"}} 0.0' in page
    assert doc["meta"]["source"] == shown and "admin:***@" in doc["meta"]["source_error"]
    assert "s3cret" not in page + json.dumps(doc) + stderr
    assert "admin:***@" in stderr
