"""The advisor's HTTP server (FastAPI on uvicorn): the exporter server's rules beside its API,
/health, /-/healthy and the landing page; TLS and basic auth from the web config, its headers on
every answer; HEAD without a body; SIGTERM stops the process at once, with no run waited for.
What it shares with the exporter's server (/metrics gzipped by the Accept-Encoding q values,
bodies never read nor taken for the next request: 413 over 1 MiB, a chunked one closes the
connection) is tested on both in tests/test_http_contract.py."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import bcrypt
import pytest
import requests

from gpu_defrag_common.connections import Limits
from gpu_defrag_common.webconfig import load_web_config
from tests.fakes.cli_process import cli_process
from tests.service.conftest import advisor_loop, serve_advisor


@pytest.fixture
def loop(islands):
    return advisor_loop(islands)


def test_health_landing_and_head(loop):
    server = serve_advisor(loop, load_web_config(None))
    base = f"http://127.0.0.1:{server.port}"
    try:
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


def test_tls_basic_auth_and_headers_cover_the_api_and_metrics(loop, tls_files, tmp_path):
    cert, key = tls_files
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    config = tmp_path / "web.yml"
    config.write_text(
        f"tls_server_config:\n  cert_file: {cert.name}\n  key_file: {key.name}\n"
        f"basic_auth_users:\n  prometheus: '{hashed}'\n"
        "http_server_config:\n  headers:\n    X-Frame-Options: deny\n"
    )
    server = serve_advisor(loop, load_web_config(config))
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

    server = serve_advisor(loop, load_web_config(None), Limits(max_connections=1))
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

    limits = Limits(max_connections=2, request_timeout_s=1.0)
    server = serve_advisor(loop, load_web_config(None), limits)
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
