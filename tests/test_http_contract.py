"""The HTTP contract both servers keep, the exporter's (stdlib http.server,
gpu_defrag_common.server) and the advisor's (FastAPI on uvicorn): /metrics is the page, gzipped
when the Accept-Encoding q values allow gzip; a request body is never taken for the next
request; a body not read in full is answered and the connection closed.

Every case runs on both servers, each started as its own tests start it
(tests/exporter/conftest.py, tests/service/conftest.py); what only one server does is tested
in tests/exporter/test_server.py and tests/service/test_http.py."""

from __future__ import annotations

import gzip
import re
import socket
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import requests

from advisor.ingest.sources import load_source
from gpu_defrag_common.webconfig import load_web_config
from tests.exporter.conftest import exporter_loop, serve_exporter
from tests.service.conftest import ISLANDS, advisor_loop, serve_advisor


@dataclass(frozen=True)
class Served:
    """A server running with the default web config: its port and the page its source holds."""

    port: int
    page: bytes  # the /metrics body, uncompressed


@pytest.fixture(params=["exporter", "advisor"])
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    web = load_web_config(None)
    if request.param == "exporter":
        loop = exporter_loop()
        server = serve_exporter(loop, web)
    else:
        loop = advisor_loop(load_source(str(ISLANDS)))
        server = serve_advisor(loop, web)
    try:
        yield Served(server.port, loop.current_page().body)
    finally:
        server.close()


def test_metrics_is_the_page_as_is_or_gzipped(served):
    url = f"http://127.0.0.1:{served.port}/metrics"
    response = requests.get(url, headers={"Accept-Encoding": "identity"}, timeout=5)
    assert response.status_code == 200
    assert response.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert response.content == served.page
    raw = urllib.request.urlopen(
        urllib.request.Request(url, headers={"Accept-Encoding": "gzip"}), timeout=5
    )
    assert raw.headers["Content-Encoding"] == "gzip"
    assert gzip.decompress(raw.read()) == served.page


@pytest.mark.parametrize(
    ("accept", "gzipped"),
    [
        ("gzip", True),
        ("GZIP;Q=1.0", True),
        ("deflate, gzip;q=0.5", True),
        ("*", True),
        ("x-gzip", True),
        ("gzip;q=0", False),
        ("gzip;q=0.000, *", False),  # refused by name: the wildcard does not bring it back
        ("identity, *;q=0", False),
        ("gzip;q=abc", False),
        ("identity", False),
        ("", False),
    ],
)
def test_gzip_follows_the_accept_encoding_q_values(served, accept, gzipped):
    answer = requests.get(
        f"http://127.0.0.1:{served.port}/metrics",
        headers={"Accept-Encoding": accept},
        stream=True,
        timeout=5,
    )
    raw = answer.raw.read(decode_content=False)
    assert answer.headers["Vary"] == "Accept-Encoding"
    assert (answer.headers.get("Content-Encoding") == "gzip") is gzipped
    assert (gzip.decompress(raw) if gzipped else raw) == served.page


def _exchange(port: int, raw: bytes) -> bytes:
    """Send `raw` on one connection and read until the server closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(raw)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def _statuses(answer: bytes) -> list[int]:
    return [int(code) for code in re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)]


def _request(method: str, path: str, body: bytes = b"", **headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: x", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


SMUGGLED = b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n"
LAST = _request("GET", "/-/healthy", Connection="close")


@pytest.mark.parametrize("method", ["POST", "GET"])
def test_a_request_body_is_never_taken_for_the_next_request(served, method):
    first = _request(method, "/metrics", SMUGGLED, **{"Content-Length": str(len(SMUGGLED))})
    answer = _exchange(served.port, first + LAST)
    assert _statuses(answer) == [405 if method == "POST" else 200, 200]  # no 404 in between


@pytest.mark.parametrize(
    ("path", "headers", "status"),
    [
        pytest.param("/metrics", {"Content-Length": str(2 << 20)}, 413, id="metrics-over-1MiB"),
        pytest.param("/metrics", {"Content-Length": "9" * 5000}, 413, id="metrics-5000-digits"),
        pytest.param("/api/forecast", {"Content-Length": "9" * 5000}, 413, id="api-5000-digits"),
        pytest.param("/metrics", {"Content-Length": "12abc"}, 400, id="metrics-not-a-number"),
        pytest.param("/metrics", {"Content-Length": "²"}, 400, id="metrics-unicode-digit"),
        pytest.param("/api/forecast", {"Content-Length": "²"}, 400, id="api-unicode-digit"),
        pytest.param("/metrics", {"Transfer-Encoding": "chunked"}, 405, id="metrics-chunked"),
    ],
)
def test_a_body_not_read_in_full_closes_the_connection(served, path, headers, status):
    """Over the bound or unparsable: refused unread, then closed; chunked: not read, answered,
    then closed. Either way the rest of the connection is never parsed as a request."""
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(SMUGGLED), SMUGGLED)
    answer = _exchange(served.port, _request("POST", path, chunked, **headers) + LAST)
    assert _statuses(answer) == [status]
    assert b"\r\nconnection: close\r\n" in answer.lower()
    kind = b"application/json" if path.startswith("/api/") else b"text/plain"
    assert b"content-type: " + kind in answer.lower()
