"""The exporter server's extra routes, which carry the advisor API: answered in one response,
guarded by the same basic auth, a broken handler is a 500 (the server lives on), and
methods other than GET/HEAD get 405 with `Allow`."""

from __future__ import annotations

import json
import socket

import bcrypt
import jsonschema
import pytest
import requests

from advisor.service.api import Api, openapi_document
from advisor.service.http import AdvisorServer, build_app
from advisor.service.loop import AdvisorLoop, Config
from gpu_defrag_common.server import Response
from gpu_defrag_common.webconfig import load_web_config
from tests.service.conftest import ScriptedSource


@pytest.fixture
def advisor(islands):
    loop = AdvisorLoop("snap", ScriptedSource(islands), Config())
    loop.run_once()
    return loop


def start(loop, web, routes):
    return AdvisorServer("127.0.0.1:0", build_app(loop, routes, web, "advisor"), web).start()


def test_routes_answer_beside_metrics_and_a_broken_one_is_500(advisor):
    def broken(query: str) -> Response:
        raise RuntimeError("boom")

    def echo(query: str) -> Response:
        return Response(200, query.encode(), "text/plain", {"X-Echo": "1"})

    routes = {"/broken": broken, "/echo": echo, "/d/": echo, "/d/page": echo}
    server = start(advisor, load_web_config(None), routes)
    base = f"http://127.0.0.1:{server.port}"
    try:
        assert requests.get(f"{base}/broken", timeout=5).status_code == 500
        echoed = requests.get(f"{base}/echo?a=1&b=2", timeout=5)
        assert echoed.text == "a=1&b=2" and echoed.headers["X-Echo"] == "1"
        assert requests.get(f"{base}/metrics", timeout=5).status_code == 200  # still serving
        landing = requests.get(f"{base}/", timeout=5).text
        assert '<a href="/echo">' in landing and '<a href="/d/">' in landing
        assert "/d/page" not in landing  # reached from /d/, its folder's page
        posted = requests.post(f"{base}/echo", timeout=5)
        assert posted.status_code == 405 and posted.headers["Allow"] == "GET, HEAD"
    finally:
        server.close()


def test_basic_auth_guards_the_api_too(advisor, tmp_path):
    hashed = bcrypt.hashpw(b"secret", bcrypt.gensalt(rounds=4)).decode()
    config = tmp_path / "web.yml"
    config.write_text(f"basic_auth_users:\n  ops: {hashed}\n")
    server = start(advisor, load_web_config(str(config)), Api(advisor.state).routes())
    base = f"http://127.0.0.1:{server.port}"
    try:
        assert requests.get(f"{base}/api/fragmentation", timeout=5).status_code == 401
        assert requests.post(f"{base}/api/fragmentation", timeout=5).status_code == 401
        ok = requests.get(f"{base}/api/fragmentation", auth=("ops", "secret"), timeout=5)
        assert ok.status_code == 200 and ok.json()["meta"]["source"] == "snap"
    finally:
        server.close()


def _raw(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """One raw request (lines the standard library refuses); status, headers, body."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status.split()[1]), headers, body


def test_errors_under_api_are_the_error_schema_in_json(advisor):
    def broken(query: str) -> Response:
        raise RuntimeError("boom")

    routes = {**Api(advisor.state).routes(), "/api/broken": broken, "/broken": broken}
    server = start(advisor, load_web_config(None), routes)
    base = f"http://127.0.0.1:{server.port}"
    long_line = b"GET /api/" + b"x" * 70_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    long_header = b"GET /api/forecast HTTP/1.1\r\nX: " + b"y" * 70_000 + b"\r\n\r\n"
    try:
        answers = {
            404: requests.get(f"{base}/api/nope", timeout=5),
            405: requests.post(f"{base}/api/forecast", timeout=5),
            500: requests.get(f"{base}/api/broken", timeout=5),
        }
        raw = {
            414: _raw(server.port, long_line),
            431: _raw(server.port, long_header),
            501: _raw(server.port, b"BREW /api/forecast HTTP/1.1\r\nHost: x\r\n\r\n"),
        }
        plain = [requests.get(f"{base}/nope", timeout=5), requests.get(f"{base}/broken", timeout=5)]
    finally:
        server.close()
    schema = openapi_document()["components"]["schemas"]["Error"]
    for status, answer in answers.items():
        assert answer.status_code == status
        assert answer.headers["Content-Type"] == "application/json"
        jsonschema.validate(answer.json(), schema)
    assert answers[405].headers["Allow"] == "GET, HEAD"
    for status, (code, headers, body) in raw.items():
        assert code == status and headers["content-type"] == "application/json"
        assert headers["connection"] == "close"  # `_raw` reads to the end: no keep-alive wait
        jsonschema.validate(json.loads(body), schema)
    assert [a.headers["Content-Type"] for a in plain] == ["text/plain; charset=utf-8"] * 2


def test_the_api_index_lists_every_route_the_api_serves(advisor):
    """`/api/` (the address the demo prints) and `/api` answer an index of the routes."""
    routes = Api(advisor.state).routes()
    server = start(advisor, load_web_config(None), routes)
    base = f"http://127.0.0.1:{server.port}"
    try:
        answers = [requests.get(f"{base}{path}", timeout=5) for path in ("/api/", "/api")]
        listed = answers[0].json()["routes"]
        served = {p: requests.get(f"{base}{p}", timeout=5).status_code for p in listed}
    finally:
        server.close()
    doc = openapi_document()
    schema = {**doc["components"]["schemas"]["Index"], "components": doc["components"]}
    for answer in answers:
        assert answer.status_code == 200
        jsonschema.validate(answer.json(), schema)
    assert answers[0].json() == answers[1].json()
    assert set(listed) == set(doc["paths"]) == set(routes) - {"/api"}
    assert all(code == 200 for code in served.values()), served


def test_the_openapi_document_declares_the_error_answers():
    doc = openapi_document()
    declared = doc["components"]["responses"]
    error = {"$ref": "#/components/schemas/Error"}
    for name in ("NotFound", "MethodNotAllowed", "InternalError"):
        assert declared[name]["content"]["application/json"]["schema"] == error
    assert "Allow" in declared["MethodNotAllowed"]["headers"]
    for path in doc["paths"].values():
        responses = path["get"]["responses"]
        assert responses["500"] == {"$ref": "#/components/responses/InternalError"}


@pytest.mark.parametrize(
    "value", ["%C2%B2", "%EF%BC%95", "9" * 5000, "1000000", "-1", "1.0", "", "0x1"]
)
def test_limit_is_ascii_digits_or_a_400(advisor, value):
    answer = Api(advisor.state).recommendations(f"limit={value}")
    assert answer.status == 400 and answer.content_type == "application/json"
    error = json.loads(answer.body)["error"]
    assert error.startswith("limit=") and "expected a whole number 0..10000" in error
    assert len(error) < 120  # one short line, however long the value


def test_limits_do_not_grow_the_answer_cache(advisor):
    from advisor.service.api import MAX_CACHED

    api = Api(advisor.state)
    total = len(advisor.state().results.recommendations["actions"])
    whole = api.recommendations("")
    bodies = {limit: api.recommendations(f"limit={limit}").body for limit in range(2000)}
    assert len(api._cache) <= MAX_CACHED
    assert all(bodies[limit] is whole.body for limit in range(total, 2000))  # one shared answer
    assert [len(json.loads(bodies[n])["actions"]) for n in range(total + 1)] == list(
        range(total + 1)
    )
