"""`/api/job-ends`: per running job its expected end as the plan stage predicted it
(`advisor.forecast.job_ends.predict`), with its uncertainty and source, on a simulated fleet run
in-process by the advisor loop (the same handlers the service serves)."""

from __future__ import annotations

import json
import math

import jsonschema
import pytest

from advisor.forecast.job_ends import JobEndSettings, predict
from advisor.history import running_jobs
from advisor.ingest.live import LiveSim
from advisor.planner.observed import DurationPrior, expected_end
from advisor.service.api import Api, openapi_document
from advisor.service.loop import AdvisorLoop, Config
from advisor.settings import Settings
from tests.conftest import add_nodes
from tests.service.conftest import ScriptedSource, strict_schema

H = 3600.0


def get(api: Api, query: str = "") -> tuple[int, dict]:
    answer = api.job_ends(query)
    assert answer.content_type == "application/json"
    return int(answer.status), json.loads(answer.body)


@pytest.fixture(scope="module")
def fleet() -> AdvisorLoop:
    """The 16 x 8 A100 sim after two simulated days: some running jobs have learned ends,
    some (older than all but a few finished jobs) keep the prior."""
    source = LiveSim("sim:a100-16x8", clock=lambda: 0.0)
    loop = AdvisorLoop("sim:a100-16x8", source, Config(settings=Settings(horizons_h=(1,))))
    loop.seed_history(source.backfill(48 * H))
    loop.run_once()
    return loop


@pytest.fixture(scope="module")
def answer(fleet) -> dict:
    status, doc = get(Api(fleet.state))
    assert status == 200
    return doc


def direct(loop: AdvisorLoop, quantile: float = 0.5) -> tuple[dict[str, float], dict]:
    """The predictor called as the plan stage calls it, on the same model and history."""
    model = loop.state().results.model
    return predict(
        model,
        loop.history.finished_jobs(),
        JobEndSettings(quantile=quantile),
        running=loop.history.jobs.running(model.timestamp),
    )


def test_every_running_job_is_listed_once_with_the_gpus_it_holds(fleet, answer) -> None:
    model = fleet.state().results.model
    jobs = running_jobs(model)
    listed = [(row["tenant"], row["job"]) for row in answer["jobs"]]
    assert len(listed) == len(set(listed)) == len(jobs) > 0
    assert set(listed) == {(j.tenant, j.job) for j in jobs}
    assert answer["running_jobs"] == answer["total_jobs"] == len(jobs)
    assert sum(answer["by_source"].values()) == len(jobs)
    # every placed task exactly once, on the GPUs the model places it on
    allocs = model.allocations
    placed = {str(a) for a, n in zip(allocs.id, allocs.node, strict=True) if n >= 0}
    tasks = [a for row in answer["jobs"] for a in row["allocations"]]
    assert sorted(tasks) == sorted(placed)
    held: dict[tuple[str, str], set[tuple[str, int]]] = {}
    places = model.placements
    for row, gpu in zip(places.alloc.tolist(), places.gpu.tolist(), strict=True):
        key = (str(allocs.tenant[row]), str(allocs.job[row]) or str(allocs.id[row]))
        node = str(model.nodes.name[model.gpus.node[gpu]])
        held.setdefault(key, set()).add((node, int(model.gpus.index[gpu])))
    for row in answer["jobs"]:
        served = {(n["node"], g) for n in row["nodes"] for g in n["gpus"]}
        assert served == held[(row["tenant"], row["job"])]


def test_ends_are_after_as_of_p90_after_p50_and_sorted(fleet, answer) -> None:
    as_of = answer["as_of"]
    assert as_of == fleet.state().results.model.timestamp
    assert answer["meta"]["observed_at"] == as_of and answer["meta"]["stale"] is False
    assert answer["stale"] is False and answer["error"] is None
    rows = answer["jobs"]
    assert answer["by_source"]["learned"] > 0 and answer["by_source"]["prior"] > 0
    for row in rows:
        assert row["end"] is not None and row["end"] >= as_of  # every start is known here
        assert row["planned_end"] >= as_of
        assert row["elapsed_h"] == pytest.approx((as_of - row["start"]) / H)
        if row["source"] == "learned":
            assert row["end_p90"] >= row["end"] and row["reason"] is None
        else:
            assert row["end_p90"] is None and "one value" in row["reason"]
    ends = [row["end"] for row in rows]
    assert ends == sorted(ends)


def test_the_source_is_the_predictors_own(fleet, answer) -> None:
    ends, doc = direct(fleet)
    late, _ = direct(fleet, quantile=0.9)
    model = fleet.state().results.model
    fallback = expected_end(model, DurationPrior(), ends)
    row_of = {a: i for i, a in enumerate(model.allocations.id.tolist())}
    learned = 0
    for row in answer["jobs"]:
        tasks = row["allocations"]
        if row["source"] == "learned":
            learned += 1
            assert all(a in ends for a in tasks)
            assert row["planned_end"] == row["end"] == pytest.approx(ends[tasks[0]])
            assert row["end_p90"] == pytest.approx(late[tasks[0]])
            assert row["similar_jobs"] >= JobEndSettings().min_similar
            assert row["basis"] in ("group", "all")
        else:
            assert row["source"] == "prior" and not any(a in ends for a in tasks)
            assert "fewer than 5" in row["reason"] and "duration prior" in row["reason"]
            assert row["similar_jobs"] is None and row["basis"] is None
            # the planner's fallback: what its reservations plan on
            assert row["end"] == pytest.approx(max(fallback[row_of[a]] for a in tasks))
    assert learned == doc["predicted_jobs"] == answer["by_source"]["learned"]
    assert answer["source"] == doc["source"] == "forecast job ends"
    assert answer["finished_jobs"] == doc["finished_jobs"]
    # /api/recommendations keeps its summary, without the per-job list
    recs = json.loads(Api(fleet.state).recommendations("").body)
    assert "jobs" not in recs["job_ends"] and recs["job_ends"]["predicted_jobs"] == learned
    jsonschema.validate(recs, strict_schema("Recommendations"))


def test_filters_and_limit(fleet, answer) -> None:
    api = Api(fleet.state)
    tenant = answer["jobs"][-1]["tenant"]
    _, mine = get(api, f"tenant={tenant}")
    assert mine["jobs"] == [row for row in answer["jobs"] if row["tenant"] == tenant]
    assert mine["total_jobs"] == len(mine["jobs"]) < answer["total_jobs"]
    assert mine["running_jobs"] == answer["running_jobs"]
    node = answer["jobs"][0]["nodes"][0]["node"]
    _, on = get(api, f"node={node}")
    assert on["jobs"] == [r for r in answer["jobs"] if node in {n["node"] for n in r["nodes"]}]
    assert on["jobs"]
    _, first = get(api, "limit=2")
    assert first["jobs"] == answer["jobs"][:2] and first["total_jobs"] == answer["total_jobs"]
    _, none = get(api, "tenant=nobody")
    assert none["jobs"] == [] and none["total_jobs"] == 0


@pytest.mark.parametrize(("query", "word"), [("limit=-1", "limit"), ("node=", "node")])
def test_a_bad_query_is_the_same_400_as_elsewhere(fleet, query, word) -> None:
    api = Api(fleet.state)
    status, doc = get(api, query)
    other = api.recommendations("limit=-1")
    assert status == 400 == int(other.status) and word in doc["error"]
    assert set(doc) == set(json.loads(other.body)) == {"error"}
    schemas = openapi_document()["components"]["schemas"]
    jsonschema.validate(doc, {**schemas["Error"], "components": {"schemas": schemas}})


def test_the_route_is_documented_listed_and_answers_its_schema(fleet, answer) -> None:
    document = openapi_document()
    operation = document["paths"]["/api/job-ends"]["get"]
    assert operation["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/JobEndList"
    }
    assert {p["name"] for p in operation["parameters"]} == {"tenant", "node", "limit"}
    assert "400" in operation["responses"] and "503" in operation["responses"]
    stale = document["components"]["schemas"]["JobEndList"]["properties"]["stale"]
    assert "plan stage failed" in stale["description"]
    api = Api(fleet.state)
    assert "/api/job-ends" in api.routes()
    assert "/api/job-ends" in json.loads(api.index("").body)["routes"]
    jsonschema.validate(answer, strict_schema("JobEndList"))


def test_before_the_first_run_it_is_a_503(scripted) -> None:
    loop = AdvisorLoop("down", scripted("unreachable"), Config())
    loop.run_once()
    status, doc = get(Api(loop.state))
    assert status == 503 and "unreachable" in doc["error"] and doc["meta"]["stale"] is True


def test_jobs_without_a_known_start_are_listed_with_no_end_and_a_reason() -> None:
    """A job already running when the service started, on a source without start times, has
    nothing to predict from: listed, with null ends and the reason; one with a known deletion
    time gets that one value; the rest the prior, while too few jobs have finished."""
    t = 1_000_000.0
    b = add_nodes(["n0"], 4)
    b.add_allocation("a-0", num_gpu=1, node="n0", gpus=[0], job="a", tenant="x")
    b.add_allocation("a-1", num_gpu=1, node="n0", gpus=[1], job="a", tenant="x")
    b.add_allocation("b", num_gpu=1, node="n0", gpus=[2], job="b", tenant="y", start_time=t - H)
    b.add_allocation("c", num_gpu=1, node="n0", gpus=[3], job="c", tenant="y", deletion_time=t + H)
    loop = AdvisorLoop("scripted", ScriptedSource(b.build(timestamp=t)), Config())
    loop.run_once()
    status, doc = get(Api(loop.state))
    assert status == 200 and doc["as_of"] == t
    jsonschema.validate(doc, strict_schema("JobEndList"))
    rows = {row["job"]: row for row in doc["jobs"]}
    assert [row["job"] for row in doc["jobs"]] == ["c", "b", "a"]  # no end: last
    assert rows["a"]["source"] == "none" and rows["a"]["end"] is None
    assert rows["a"]["end_p90"] is None and rows["a"]["start"] is None
    assert "no known start" in rows["a"]["reason"]
    assert rows["a"]["nodes"] == [{"node": "n0", "gpus": [0, 1]}]
    prior = DurationPrior()
    assert rows["a"]["planned_end"] == pytest.approx(t + math.sqrt(2) * prior.median_s)
    assert rows["b"]["source"] == "prior" and rows["b"]["end"] == rows["b"]["planned_end"]
    assert rows["b"]["end"] == pytest.approx(t + math.sqrt(2) * prior.median_s - H)
    assert "fewer than 30" in rows["b"]["reason"] and rows["b"]["end_p90"] is None
    assert rows["c"]["source"] == "known" and rows["c"]["end"] == t + H
    assert doc["by_source"] == {"learned": 0, "prior": 1, "known": 1, "none": 1}
