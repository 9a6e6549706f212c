"""The forecast document with idle windows, per pool and per node, validates against
/api/openapi.json's schema, and the schema rejects a negative release."""

from __future__ import annotations

from dataclasses import replace

import jsonschema
import pytest

from advisor.documents import as_json, build_forecast
from advisor.forecast.live import forecast_pools
from advisor.service.api import openapi_document
from advisor.service.loop import AdvisorLoop, Config
from tests.service.test_idle_windows import pools_history


@pytest.fixture(scope="module")
def doc() -> dict:
    return forecast_pools(pools_history(6 * 24, backfill_h=72), [1])


def test_the_document_validates_against_the_openapi_schema(islands, scripted, doc):
    state = AdvisorLoop("snap", scripted(islands), Config()).run_once()
    state = replace(state, results=replace(state.results, forecast={**doc, "stale": False}))
    body = as_json(build_forecast(state))
    spec = openapi_document()
    schema = {**spec["components"]["schemas"]["Forecast"], "components": spec["components"]}
    jsonschema.validate(body, schema)  # its $refs resolve inside `components`
    windows = body["idle"]["pools"][0]["windows"]
    windows[0]["release_gpus"] = -1.0
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(body, schema)


def test_the_per_node_section_validates_and_a_negative_node_release_is_rejected(islands, scripted):
    from tests.service.test_node_idle_windows import doc_of, hourly_runs, recorded

    doc = doc_of(recorded(hourly_runs(100)), max_nodes=3)  # 8 h windows short, 2 nodes capped
    state = AdvisorLoop("snap", scripted(islands), Config()).run_once()
    state = replace(state, results=replace(state.results, forecast={**doc, "stale": False}))
    body = as_json(build_forecast(state))
    spec = openapi_document()
    schema = {**spec["components"]["schemas"]["Forecast"], "components": spec["components"]}
    jsonschema.validate(body, schema)
    idle = body["idle"]
    assert idle["nodes_total"] == len(idle["nodes"]) == 5 and idle["max_nodes"] == 3
    reasons = {w.get("reason", "")[:16] for n in idle["nodes"] for w in n["windows"]}
    assert {"needs 112 comple", "not among the 3 "} <= reasons
    idle["nodes"][0]["windows"][0]["release_gpus"] = -1.0
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(body, schema)
    del idle["nodes"][0]["pool"]
    idle["nodes"][0]["windows"][0]["release_gpus"] = 1.0
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(body, schema)
