"""Schemathesis against the running advisor: every request generated from the OpenAPI document
gets a documented status and content type, and a body that validates against its schema.

The document is built by the same function the service serves at /api/openapi.json (the API
test checks the two are equal), so it loads at import time without a running process, and
the requests go to the session's real `gpu-defrag advise` process.
"""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, settings

from advisor.service.api import openapi_document

schema = schemathesis.openapi.from_dict(openapi_document())


@schema.parametrize()
@settings(max_examples=15, deadline=5000, suppress_health_check=list(HealthCheck), database=None)
def test_api_conforms_to_its_openapi_document(case, service):
    case.call_and_validate(base_url=service, timeout=10)
