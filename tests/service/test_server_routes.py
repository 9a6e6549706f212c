"""The exporter server's extra routes, which carry the advisor API: answered in one response,
guarded by the same basic auth, a broken handler is a 500 (the server lives on), and
methods other than GET/HEAD get 405 with `Allow`."""

from __future__ import annotations

import bcrypt
import pytest
import requests

from advisor.service.api import Api
from advisor.service.loop import AdvisorLoop, Config
from exporter.server import ExporterServer, Response
from exporter.webconfig import load_web_config
from tests.service.conftest import ScriptedSource


@pytest.fixture
def advisor(islands):
    loop = AdvisorLoop("snap", ScriptedSource(islands), Config())
    loop.run_once()
    return loop


def start(loop, web, routes):
    return ExporterServer("127.0.0.1:0", loop, web, "advisor", routes).start()


def test_routes_answer_beside_metrics_and_a_broken_one_is_500(advisor):
    def broken(query: str) -> Response:
        raise RuntimeError("boom")

    def echo(query: str) -> Response:
        return Response(200, query.encode(), "text/plain", {"X-Echo": "1"})

    server = start(advisor, load_web_config(None), {"/broken": broken, "/echo": echo})
    base = f"http://127.0.0.1:{server.port}"
    try:
        assert requests.get(f"{base}/broken", timeout=5).status_code == 500
        echoed = requests.get(f"{base}/echo?a=1&b=2", timeout=5)
        assert echoed.text == "a=1&b=2" and echoed.headers["X-Echo"] == "1"
        assert requests.get(f"{base}/metrics", timeout=5).status_code == 200  # still serving
        landing = requests.get(f"{base}/", timeout=5).text
        assert '<a href="/echo">' in landing
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
