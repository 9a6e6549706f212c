"""Schemathesis against the running advisor: every request generated from the OpenAPI document
gets a documented status and content type, and a body that validates against its schema.

The document is built by the same function the service serves at /api/openapi.json (the API
test checks the two are equal), so it loads at import time without a running process, and
the requests go to the session's real `gpu-defrag advise` process. The examples are drawn
from a fixed seed (`derandomize`), so every run sends the same requests, and no per-example
deadline applies: a real process on a loaded 2-core machine may take longer than any fixed one
(the request's own 10 s timeout still bounds it).
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from advisor.service.api import openapi_document

pytestmark = pytest.mark.slow  # the session's real advisor process

schema = schemathesis.openapi.from_dict(openapi_document())


@schema.parametrize()
@settings(
    max_examples=15,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
    database=None,
)
def test_api_conforms_to_its_openapi_document(case, service):
    case.call_and_validate(base_url=service, timeout=10)
