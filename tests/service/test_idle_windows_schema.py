"""The forecast document with idle windows validates against /api/openapi.json's schema, and
the schema rejects a negative release."""

from __future__ import annotations

import json
from dataclasses import replace

import jsonschema
import pytest

from advisor.service.api import forecast_doc, openapi_document
from advisor.service.forecast import forecast_pools
from advisor.service.loop import AdvisorLoop, Config
from tests.service.test_idle_windows import pools_history


@pytest.fixture(scope="module")
def doc() -> dict:
    return forecast_pools(pools_history(6 * 24, backfill_h=72), [1])


def test_the_document_validates_against_the_openapi_schema(islands, scripted, doc):
    state = AdvisorLoop("snap", scripted(islands), Config()).run_once()
    state = replace(state, results=replace(state.results, forecast={**doc, "stale": False}))
    body = json.loads(json.dumps(forecast_doc(state)))
    spec = openapi_document()
    schema = {**spec["components"]["schemas"]["Forecast"], "components": spec["components"]}
    jsonschema.validate(body, schema)  # its $refs resolve inside `components`
    windows = body["idle"]["pools"][0]["windows"]
    windows[0]["release_gpus"] = -1.0
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(body, schema)
