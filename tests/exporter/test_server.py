"""The exporter's HTTP server (stdlib http.server, gpu_defrag_common.server): what only it does.
What it shares with the advisor's server (/metrics gzipped by the Accept-Encoding q values,
request bodies never taken for the next request) is tested on both in
tests/test_http_contract.py."""

import logging
import re
import socket
import struct
import time

import bcrypt
import pytest
import requests

from gpu_defrag_common.server import ExporterServer, Response, parse_listen_address
from gpu_defrag_common.webconfig import WebConfigError, load_web_config
from tests.exporter.conftest import exporter_loop, serve_exporter


@pytest.fixture
def loop():
    return exporter_loop()


def test_metrics_health_and_landing(loop):
    server = serve_exporter(loop, load_web_config(None))
    base = f"http://127.0.0.1:{server.port}"
    try:
        assert "gpu_utilization_ratio" in requests.get(f"{base}/metrics", timeout=5).text
        assert requests.get(f"{base}/health", timeout=5).status_code == 200
        assert requests.get(f"{base}/-/healthy", timeout=5).status_code == 200
        landing = requests.get(f"{base}/", timeout=5)
        assert 'href="/metrics"' in landing.text and "healthy" in landing.text
        assert requests.get(f"{base}/nope", timeout=5).status_code == 404
    finally:
        server.close()


def test_health_is_503_when_collection_is_stale(loop):
    loop.clock = lambda: loop.last_success_ts + 10 * loop.interval_s
    server = serve_exporter(loop, load_web_config(None))
    try:
        response = requests.get(f"http://127.0.0.1:{server.port}/health", timeout=5)
        assert response.status_code == 503
        assert "ago" in response.text
    finally:
        server.close()


def test_tls_with_basic_auth(loop, tls_files, tmp_path):
    cert, key = tls_files
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    config = tmp_path / "web.yml"
    config.write_text(
        f"tls_server_config:\n  cert_file: {cert.name}\n  key_file: {key.name}\n"
        f"basic_auth_users:\n  prometheus: '{hashed}'\n"
        "http_server_config:\n  headers:\n    X-Frame-Options: deny\n"
    )
    server = serve_exporter(loop, load_web_config(config))
    url = f"https://127.0.0.1:{server.port}/metrics"
    assert server.url() == url
    try:
        ok = requests.get(url, auth=("prometheus", "s3cret"), verify=str(cert), timeout=5)
        assert ok.status_code == 200 and "gpu_info" in ok.text
        assert ok.headers["X-Frame-Options"] == "deny"
        again = requests.get(url, auth=("prometheus", "s3cret"), verify=str(cert), timeout=5)
        assert again.status_code == 200  # served from the verified-credentials cache
        wrong = requests.get(url, auth=("prometheus", "wrong"), verify=str(cert), timeout=5)
        assert wrong.status_code == 401
        assert wrong.headers["WWW-Authenticate"].startswith("Basic")
        assert requests.get(url, verify=str(cert), timeout=5).status_code == 401
        assert (
            requests.get(url, auth=("nobody", "s3cret"), verify=str(cert), timeout=5).status_code
            == 401
        )
        with pytest.raises(requests.exceptions.ConnectionError):
            requests.get(url.replace("https", "http"), timeout=5)  # plain HTTP is refused
    finally:
        server.close()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("tls_server_config:\n  cert_file: c.pem\n", "key_file is required"),
        ("basic_auth_users:\n  admin: plaintext\n", "not a bcrypt hash"),
        ("bogus: 1\n", "unknown key 'bogus'"),
        ("tls_server_config:\n  cert_file: missing.pem\n  key_file: missing.key\n", "cannot load"),
        ("http_server_config:\n  headers:\n    Authorization: x\n", "cannot be overridden"),
        ('http_server_config:\n  http2: "yes"\n', "http2 must be true or false, got 'yes'"),
        ("basic_auth_users: [\n", "not valid YAML"),
    ],
)
def test_bad_web_config_is_one_clear_line(tmp_path, content, message):
    config = tmp_path / "web.yml"
    config.write_text(content)
    with pytest.raises(WebConfigError) as error:
        load_web_config(config)
    assert message in str(error.value)
    assert "\n" not in str(error.value)
    assert str(config) in str(error.value)


def test_listen_address_forms():
    assert parse_listen_address(":9835") == ("", 9835)
    assert parse_listen_address("[::1]:9835") == ("::1", 9835)
    with pytest.raises(ValueError, match="expected"):
        parse_listen_address("9835")


def test_an_inherited_listening_socket_is_served_and_a_bad_one_refused(loop, tmp_path):
    """`fd://N`: a socket the parent listens on, handed down (the demo binds its children's
    ports itself); anything else under that name is one line naming the address."""
    parent = socket.create_server(("127.0.0.1", 0))
    port = parent.getsockname()[1]
    address = f"fd://{parent.detach()}"  # the server owns it now, as a child owns its copy
    assert parse_listen_address(address) == ("127.0.0.1", port)
    server = ExporterServer(address, loop, load_web_config(None)).start()
    try:
        assert server.url() == f"http://127.0.0.1:{port}/metrics"
        assert requests.get(server.url(), timeout=10).status_code == 200
    finally:
        server.close()
    with open(tmp_path / "f", "w") as plain, socket.socket() as unbound:
        for bad, why in (
            ("fd://x", "expected fd://N"),
            ("fd://999999", "no such file descriptor"),
            (f"fd://{plain.fileno()}", "not a socket"),
            (f"fd://{unbound.fileno()}", "not a listening TCP socket"),
        ):
            with pytest.raises(ValueError, match=f"--web.listen-address '{bad}': {why}"):
                ExporterServer(bad, loop, load_web_config(None))


@pytest.mark.parametrize(
    ("address", "shown"),
    [
        (":0", "http://0.0.0.0:{port}/metrics (all interfaces)"),
        ("0.0.0.0:0", "http://0.0.0.0:{port}/metrics (all interfaces)"),
        ("127.0.0.1:0", "http://127.0.0.1:{port}/metrics"),
        ("localhost:0", "http://localhost:{port}/metrics"),
    ],
)
def test_the_url_the_start_up_line_names_can_be_opened(loop, address, shown):
    """`:9835` was logged as `http://:9835/metrics`; the URL names a host and the bound port."""
    server = ExporterServer(address, loop, load_web_config(None)).start()
    try:
        assert server.url() == shown.format(port=server.port)
        assert server.url("") == shown.format(port=server.port).replace("/metrics", "")
        assert requests.get(server.url().split(" ")[0], timeout=5).status_code == 200
    finally:
        server.close()


def _hang_up_after(port: int, path: str, read: int) -> None:
    """GET `path`, read `read` bytes, then reset the connection (as `curl | head -c` does)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        sock.recv(read)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def test_a_client_hanging_up_early_is_a_debug_line_not_a_traceback(loop, caplog, capfd):
    big = Response(200, b"x" * (16 << 20), "text/plain")  # more than the socket buffers hold
    server = ExporterServer(
        "127.0.0.1:0", loop, load_web_config(None), routes={"/big": lambda q: big}
    )
    server.start()
    try:
        with caplog.at_level(logging.DEBUG, logger="gpu_defrag_common.server"):
            _hang_up_after(server.port, "/big", 10)
            deadline = time.monotonic() + 10
            while not any("went away" in r.getMessage() for r in caplog.records):
                assert time.monotonic() < deadline, "the server never noticed the hang-up"
                time.sleep(0.02)
        gone = [r for r in caplog.records if "went away" in r.getMessage()]
        assert gone[0].levelno == logging.DEBUG
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert "Traceback" not in capfd.readouterr().err
        assert requests.get(f"http://127.0.0.1:{server.port}/-/healthy", timeout=5).ok
    finally:
        server.close()


class _BrokenPage:
    """A page source whose page cannot be had: a bug, not a client's doing."""

    def current_page(self):
        raise ValueError("bad thing\nsecond line")

    def health(self):
        raise AssertionError("not asked")


def test_any_other_request_failure_is_one_error_line(caplog, capfd):
    server = ExporterServer("127.0.0.1:0", _BrokenPage(), load_web_config(None)).start()
    try:
        with caplog.at_level(logging.DEBUG, logger="gpu_defrag_common.server"):
            with pytest.raises(requests.ConnectionError):  # closed unanswered
                requests.get(f"http://127.0.0.1:{server.port}/metrics", timeout=5)
            assert requests.get(f"http://127.0.0.1:{server.port}/-/healthy", timeout=5).ok
    finally:
        server.close()
    (record,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    # gpu_defrag_common.messages.one_line: every line of the message, folded onto one, after its type
    assert re.fullmatch(
        r"request from \('127\.0\.0\.1', \d+\) failed: ValueError: bad thing second line",
        record.getMessage(),
    )
    assert "Traceback" not in capfd.readouterr().err
