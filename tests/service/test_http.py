"""The advisor's HTTP server (FastAPI on uvicorn) keeps the exporter server's rules: /metrics with
gzip by the Accept-Encoding q values, /health, /-/healthy and the landing page; TLS and basic auth
from the web config, its headers on every answer; bodies never read nor taken for the next
request (413 over 1 MiB, a chunked one closes the connection); HEAD without a body; SIGTERM
stops the process at once, with no run waited for."""

from __future__ import annotations

import gzip
import signal
import subprocess
import sys
import time
import urllib.request

import bcrypt
import pytest
import requests

from advisor.service.api import Api
from advisor.service.http import AdvisorServer, build_app
from advisor.service.loop import AdvisorLoop, Config
from gpu_defrag_common.connections import Limits
from gpu_defrag_common.webconfig import load_web_config
from tests.exporter.test_server import (
    LAST,
    SMUGGLED,
    _exchange,
    _request,
    _statuses,
    tls_files,  # noqa: F401 (a fixture)
)
from tests.fakes.cli_process import cli_process
from tests.service.conftest import ScriptedSource


@pytest.fixture
def loop(islands):
    advisor = AdvisorLoop("snap", ScriptedSource(islands), Config())
    advisor.run_once()
    return advisor


def serve(loop, web):
    app = build_app(loop, Api(loop.state).routes(), web, "gpu-defrag advisor")
    return AdvisorServer("127.0.0.1:0", app, web).start()


def test_metrics_health_landing_and_head(loop):
    server = serve(loop, load_web_config(None))
    base = f"http://127.0.0.1:{server.port}"
    try:
        response = requests.get(
            f"{base}/metrics", headers={"Accept-Encoding": "identity"}, timeout=5
        )
        assert response.status_code == 200
        assert response.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        assert response.content == loop.current_page().body
        raw = urllib.request.urlopen(
            urllib.request.Request(f"{base}/metrics", headers={"Accept-Encoding": "gzip"}),
            timeout=5,
        )
        assert raw.headers["Content-Encoding"] == "gzip"
        assert gzip.decompress(raw.read()) == loop.current_page().body
        assert requests.get(f"{base}/health", timeout=5).text == "ok\n"
        assert requests.get(f"{base}/-/healthy", timeout=5).text == "ok\n"
        landing = requests.get(f"{base}/", timeout=5).text
        assert 'href="/metrics"' in landing and 'href="/api/"' in landing  # the API's index
        head = requests.head(f"{base}/api/fragmentation", timeout=5)
        full = requests.get(f"{base}/api/fragmentation", timeout=5)
        assert head.status_code == 200 and head.content == b""
        assert head.headers["Content-Length"] == full.headers["Content-Length"]
        missing = requests.get(f"{base}/nope", timeout=5)
        assert missing.status_code == 404 and missing.text == "not found\n"
    finally:
        server.close()


@pytest.mark.parametrize(
    ("accept", "gzipped"),
    [
        ("gzip", True),
        ("GZIP;Q=1.0", True),
        ("deflate, gzip;q=0.5", True),
        ("*", True),
        ("gzip;q=0", False),
        ("gzip;q=0.000, *", False),
        ("identity, *;q=0", False),
        ("", False),
    ],
)
def test_gzip_follows_the_accept_encoding_q_values(loop, accept, gzipped):
    server = serve(loop, load_web_config(None))
    try:
        answer = requests.get(
            f"http://127.0.0.1:{server.port}/metrics",
            headers={"Accept-Encoding": accept},
            stream=True,
            timeout=5,
        )
        raw = answer.raw.read(decode_content=False)
    finally:
        server.close()
    assert answer.headers["Vary"] == "Accept-Encoding"
    assert (answer.headers.get("Content-Encoding") == "gzip") is gzipped
    assert (gzip.decompress(raw) if gzipped else raw) == loop.current_page().body


def test_tls_basic_auth_and_headers_cover_the_api_and_metrics(loop, tls_files, tmp_path):  # noqa: F811
    cert, key = tls_files
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    config = tmp_path / "web.yml"
    config.write_text(
        f"tls_server_config:\n  cert_file: {cert.name}\n  key_file: {key.name}\n"
        f"basic_auth_users:\n  prometheus: '{hashed}'\n"
        "http_server_config:\n  headers:\n    X-Frame-Options: deny\n"
    )
    server = serve(loop, load_web_config(config))
    base = f"https://127.0.0.1:{server.port}"
    assert server.url() == f"{base}/metrics"
    try:
        for path in ("/metrics", "/api/forecast"):
            ok = requests.get(
                base + path, auth=("prometheus", "s3cret"), verify=str(cert), timeout=5
            )
            assert ok.status_code == 200 and ok.headers["X-Frame-Options"] == "deny"
            wrong = requests.get(
                base + path, auth=("prometheus", "no"), verify=str(cert), timeout=5
            )
            assert wrong.status_code == 401 and wrong.headers["WWW-Authenticate"].startswith(
                "Basic"
            )
            assert wrong.headers["X-Frame-Options"] == "deny"
            assert requests.get(base + path, verify=str(cert), timeout=5).status_code == 401
        with pytest.raises(requests.exceptions.ConnectionError):
            requests.get(f"http://127.0.0.1:{server.port}/metrics", timeout=5)  # plain HTTP
    finally:
        server.close()


@pytest.mark.parametrize("method", ["POST", "GET"])
def test_a_request_body_is_never_taken_for_the_next_request(loop, method):
    server = serve(loop, load_web_config(None))
    try:
        first = _request(method, "/metrics", SMUGGLED, **{"Content-Length": str(len(SMUGGLED))})
        answer = _exchange(server.port, first + LAST)
    finally:
        server.close()
    assert _statuses(answer) == [405 if method == "POST" else 200, 200]  # no 404 in between


@pytest.mark.parametrize(
    ("path", "headers", "status"),
    [
        ("/metrics", {"Content-Length": str(2 << 20)}, 413),  # over the bound: closed unread
        ("/api/forecast", {"Content-Length": "9" * 5000}, 413),
        ("/metrics", {"Content-Length": "12abc"}, 400),
        ("/api/forecast", {"Content-Length": "²"}, 400),
        ("/metrics", {"Transfer-Encoding": "chunked"}, 405),  # not read: answered, then closed
    ],
)
def test_a_body_not_read_in_full_closes_the_connection(loop, path, headers, status):
    server = serve(loop, load_web_config(None))
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(SMUGGLED), SMUGGLED)
    try:
        answer = _exchange(server.port, _request("POST", path, chunked, **headers) + LAST)
    finally:
        server.close()
    assert _statuses(answer) == [status]
    assert b"\r\nconnection: close\r\n" in answer.lower()
    kind = b"application/json" if path.startswith("/api/") else b"text/plain"
    assert b"content-type: " + kind in answer.lower()


def test_sigterm_stops_the_service_at_once():
    """SIGTERM while the service runs (and while a run may be in progress): exit 0 promptly,
    no run waited for. The bound is the process' own: the signal is handled by setting an
    event; uvicorn gets `SHUTDOWN_S` for open connections, the run loop none."""
    args = ("--source", "sim:a100-16x8", "--advise.interval", "1s", "--history.backfill", "0")
    with cli_process("advise", *args, ready="/health", timeout_s=120.0) as (base, process):
        requests.get(f"{base}/api/forecast", timeout=10)
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=30)
        took = time.monotonic() - started
        _, stderr = process.communicate(timeout=10)
    assert code == 0 and "Traceback" not in stderr
    print(f"SIGTERM to exit: {took:.2f} s")  # the figure docs/service.md states


def test_bad_listen_address_is_one_line_and_exit_2():
    with cli_process("advise", "--source", "sim:a100-16x8", ready="/-/healthy") as (base, _):
        port = base.rsplit(":", 1)[1]
        taken = subprocess.run(
            [
                *(sys.executable, "-m", "advisor.cli", "advise", "--source", "sim:a100-16x8"),
                *("--web.listen-address", f"127.0.0.1:{port}"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert taken.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in taken.stderr.strip().splitlines()[-1]


def test_max_connections_bounds_the_connections_served_at_once(loop):
    """`--web.max-connections 1`: a request on a second connection while the first is held
    open is answered 503; once the first closes, the next one is served."""
    import socket

    app = build_app(loop, Api(loop.state).routes(), load_web_config(None), "gpu-defrag advisor")
    server = AdvisorServer("127.0.0.1:0", app, load_web_config(None), Limits(max_connections=1))
    server.start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        held = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        deadline = time.monotonic() + 5
        status = 0
        while time.monotonic() < deadline:  # the held connection is counted once accepted
            status = requests.get(f"{base}/-/healthy", timeout=5).status_code
            if status == 503:
                break
            time.sleep(0.05)
        assert status == 503
        held.close()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            status = requests.get(f"{base}/-/healthy", timeout=5).status_code
            if status == 200:
                break
            time.sleep(0.05)
        assert status == 200
    finally:
        server.close()


def test_a_client_that_drips_its_request_is_closed_at_the_deadline(loop):
    """uvicorn has no whole-request deadline: a client dripping its headers, or sending
    nothing, held its connection for ever, and `--web.max-connections` of them starved the API.
    Each now gets `request_timeout_s` from its first byte (or from connecting); a whole request
    is still answered once they are gone."""
    import socket

    def closed_by_server(sock: socket.socket) -> bool:
        try:
            return sock.recv(1024) == b""  # blocks until the server closes (or 10 s: fails)
        except ConnectionResetError:
            return True

    web = load_web_config(None)
    app = build_app(loop, Api(loop.state).routes(), web, "gpu-defrag advisor")
    limits = Limits(max_connections=2, request_timeout_s=1.0)
    server = AdvisorServer("127.0.0.1:0", app, web, limits)
    server.start()
    silent = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    drip = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    try:
        started = time.monotonic()
        for part in (b"GET /-/healthy HTTP/1.1\r\n", b"Host: advisor\r\n"):
            drip.sendall(part)
            time.sleep(0.3)
        assert closed_by_server(drip) and closed_by_server(silent)
        assert time.monotonic() - started < 8
        answered = requests.get(f"http://127.0.0.1:{server.port}/-/healthy", timeout=5)
        assert answered.status_code == 200
    finally:
        silent.close()
        drip.close()
        server.close()
