"""The servers' connection loop under clients that misbehave: slow header drippers, requests
cut short, more connections than allowed, methods and versions it does not serve."""

from __future__ import annotations

import contextlib
import gzip
import re
import socket
import threading
import time

import pytest
import requests

from gpu_defrag_common.connections import Body, Limits, frame
from gpu_defrag_common.exposition import Page
from gpu_defrag_common.server import ExporterServer, Health
from gpu_defrag_common.webconfig import load_web_config

LIMITS = Limits()


class CountingPage:
    """A page source that counts how often its page was served."""

    def __init__(self) -> None:
        self.served = 0
        self._lock = threading.Lock()
        body = b"# a page\ngpu_up 1\n" * 2000
        self.page = Page(body=body, gzipped=gzip.compress(body))

    def current_page(self) -> Page:
        with self._lock:
            self.served += 1
        return self.page

    def health(self) -> Health:
        return Health(True, "ok", 0.0, 0.0)


def serve(limits: Limits = LIMITS, source: CountingPage | None = None) -> ExporterServer:
    return ExporterServer(
        "127.0.0.1:0", source or CountingPage(), load_web_config(None), limits=limits
    ).start()


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    return b"".join(chunks)


def scrape_seconds(port: int) -> float:
    started = time.monotonic()
    response = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert response.status_code == 200 and response.text.startswith("# a page")
    return time.monotonic() - started


# --- framing, byte by byte ---


@pytest.mark.parametrize(
    ("raw", "head_length", "body", "body_length"),
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\nrest", 27, Body.NONE, 0),
        (b"GET / HTTP/1.1\nHost: x\n\n", 24, Body.NONE, 0),  # bare LF, as http.client reads
        (b"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", 38, Body.READ, 5),
        (b"POST / HTTP/1.1\r\ncontent-length:  0\r\n\r\n", 39, Body.NONE, 0),
        (
            b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            57,
            Body.BAD_LENGTH,
            0,
        ),
        (b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n", 57, Body.READ, 5),
        (b"POST / HTTP/1.1\r\nContent-Length: \xc2\xb2\r\n\r\n", 39, Body.BAD_LENGTH, 0),
        (b"POST / HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n", 45, Body.TOO_LARGE, 0),
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 47, Body.CHUNKED, 0),
    ],
)
def test_a_head_ends_at_its_empty_line_and_declares_its_body(raw, head_length, body, body_length):
    framed = frame(raw, LIMITS)
    assert framed is not None and not framed.head_too_large
    assert len(framed.head) == head_length
    assert (framed.body, framed.body_length) == (body, body_length)


@pytest.mark.parametrize(
    "raw",
    [b"GET / HTTP/1.1\r\nHost: x\r\n", b"GET / HTTP/1.1\r\nHost: x\r\n\r", b"GET / HTTP/1.1", b""],
)
def test_a_head_without_its_empty_line_is_not_a_request(raw):
    assert frame(raw, LIMITS) is None


def test_a_head_over_the_bound_is_flagged_not_waited_for():
    small = Limits(max_head_bytes=64)
    framed = frame(b"GET /" + b"x" * 100 + b" HTTP/1.1\r\n\r\n", small)
    assert framed is not None and framed.head_too_large and len(framed.head) == 64
    assert frame(b"GET / HTTP/1.1\r\nX: " + b"y" * 30, small) is None  # under the bound: wait


# --- the loop, over loopback ---


def test_slow_header_drippers_are_closed_at_the_deadline_and_never_hold_up_a_scrape():
    """300 clients dripping one header line every 0.3 s: each was held by its own thread for
    as long as it dripped (300 held 72 s). They get `request_timeout_s` for the whole request
    and no answer, and scrapes are answered meanwhile."""
    source = CountingPage()
    server = serve(Limits(request_timeout_s=1.5), source)
    drippers = []
    try:
        for _ in range(300):
            sock = connect(server.port)
            sock.sendall(b"GET /metrics HTTP/1.1\r\n")
            drippers.append(sock)
        started = time.monotonic()
        latencies = []
        while time.monotonic() - started < 1.0:
            for n, sock in enumerate(drippers):
                with contextlib.suppress(OSError):
                    sock.sendall(b"X-%d: a\r\n" % n)
            latencies.append(scrape_seconds(server.port))
            time.sleep(0.3)
        assert max(latencies) < 2.0, latencies
        time.sleep(2.0)  # past the deadline
        for sock in drippers:
            sock.settimeout(2)
            assert read_all(sock) == b""  # closed, never answered
        assert server.open_connections <= 1
        assert source.served == len(latencies)
    finally:
        for sock in drippers:
            sock.close()
        server.close()


def test_requests_cut_short_by_the_client_closing_are_never_answered():
    """A head without its empty line when the client closes was taken as whole and answered
    with the full page: 2,000 such clients closing at once stalled the server for 20 s."""
    source = CountingPage()
    server = serve(source=source)
    try:
        sockets = [connect(server.port) for _ in range(500)]
        for sock in sockets:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        for sock in sockets:
            sock.shutdown(socket.SHUT_WR)  # the client is done: the request stays cut short
        answers = [read_all(sock) for sock in sockets]
        for sock in sockets:
            sock.close()
        assert set(answers) == {b""}
        assert source.served == 0
        assert scrape_seconds(server.port) < 2.0
        assert source.served == 1
    finally:
        server.close()


def test_a_whole_request_sent_before_the_client_half_closes_is_answered():
    server = serve()
    try:
        with connect(server.port) as sock:
            sock.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n")
            sock.shutdown(socket.SHUT_WR)
            answer = read_all(sock)
        assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"ok\n")
    finally:
        server.close()


def test_past_the_connection_bound_the_longest_waiting_connection_goes_first():
    server = serve(Limits(max_connections=40))
    try:
        idle = [connect(server.port) for _ in range(100)]
        time.sleep(0.5)
        assert server.open_connections <= 40
        assert scrape_seconds(server.port) < 2.0  # a new scrape evicts an idle connection
        for sock in idle[:50]:  # the oldest were closed
            sock.settimeout(2)
            assert read_all(sock) == b""
        for sock in idle:
            sock.close()
    finally:
        server.close()


def test_pipelined_requests_are_answered_in_order():
    server = serve()
    try:
        with connect(server.port) as sock:
            sock.sendall(
                b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n"
                b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n"
                b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
            answer = read_all(sock)
        assert re.findall(rb"HTTP/1\.1 (\d{3}) ", answer) == [b"200", b"404", b"200"]
    finally:
        server.close()


@pytest.mark.parametrize(
    ("request_line", "status"),
    [
        (b"BREW /metrics HTTP/1.1", 501),  # a method nobody serves: was the stdlib's HTML page
        (b"PRI * HTTP/2.0", 505),  # HTTP/2 prior knowledge: was HTML without a status line
        (b"GET /metrics HTTP/9", 400),
        (b"GET /metrics HTTP/1.1 extra", 400),
    ],
)
def test_requests_it_cannot_serve_get_one_line_of_plain_text_with_a_status_line(
    request_line, status
):
    server = serve()
    try:
        with connect(server.port) as sock:
            sock.sendall(request_line + b"\r\nHost: x\r\n\r\n")
            answer = read_all(sock)
    finally:
        server.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0].startswith(f"HTTP/1.1 {status} ")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    assert headers["content-type"] == "text/plain; charset=utf-8"
    assert headers["connection"] == "close"
    assert body.count(b"\n") == 1 and b"<" not in body


def test_an_answer_the_client_never_reads_is_dropped_at_the_write_deadline():
    source = CountingPage()
    small = source.page
    big = b"# a page\n" + b"x" * (32 << 20)  # more than the socket buffers hold
    source.page = Page(body=big, gzipped=big)
    server = serve(Limits(write_timeout_s=1.0), source)
    try:
        sock = connect(server.port)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept-Encoding: identity\r\n\r\n")
        time.sleep(2.5)
        assert server.open_connections == 0
        source.page = small
        assert scrape_seconds(server.port) < 5.0
        sock.close()
    finally:
        server.close()


def test_close_returns_within_a_second_with_connections_open():
    server = serve()
    sockets = [connect(server.port) for _ in range(200)]
    try:
        time.sleep(0.3)
        started = time.monotonic()
        server.close()
        assert time.monotonic() - started < 1.5
    finally:
        for sock in sockets:
            sock.close()
