import gzip
import shutil
import subprocess
import urllib.request

import bcrypt
import pytest
import requests

from exporter.collector import CollectorLoop
from exporter.server import ExporterServer, parse_listen_address
from exporter.webconfig import WebConfigError, load_web_config
from tests.exporter.scripted_backend import ScriptedBackend


@pytest.fixture
def loop():
    backend = ScriptedBackend(["ok"])
    collector = CollectorLoop(backend, interval_s=10, clock=lambda: backend.now)
    collector.run_once()
    return collector


def serve(loop, web):
    return ExporterServer("127.0.0.1:0", loop, web).start()


@pytest.fixture
def tls_files(tmp_path):
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


def test_metrics_health_landing_and_gzip(loop):
    server = serve(loop, load_web_config(None))
    base = f"http://127.0.0.1:{server.port}"
    try:
        response = requests.get(
            f"{base}/metrics", headers={"Accept-Encoding": "identity"}, timeout=5
        )
        assert response.status_code == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert "gpu_utilization_ratio" in response.text
        raw = urllib.request.urlopen(
            urllib.request.Request(f"{base}/metrics", headers={"Accept-Encoding": "gzip"}),
            timeout=5,
        )
        assert raw.headers["Content-Encoding"] == "gzip"
        assert gzip.decompress(raw.read()) == loop.current_page().body
        assert requests.get(f"{base}/health", timeout=5).status_code == 200
        assert requests.get(f"{base}/-/healthy", timeout=5).status_code == 200
        landing = requests.get(f"{base}/", timeout=5)
        assert 'href="/metrics"' in landing.text and "healthy" in landing.text
        assert requests.get(f"{base}/nope", timeout=5).status_code == 404
    finally:
        server.close()


def test_health_is_503_when_collection_is_stale(loop):
    loop.clock = lambda: loop.last_success_ts + 10 * loop.interval_s
    server = serve(loop, load_web_config(None))
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
    server = serve(loop, load_web_config(config))
    url = f"https://127.0.0.1:{server.port}/metrics"
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
