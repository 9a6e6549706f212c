"""A scriptable HTTP server on 127.0.0.1 for tests that read /metrics pages or the Prometheus
API: a path maps to a handler of the query, or to a fixed text body that tests swap.

`serve_raw` is the server for answers http.server cannot give: bytes written by hand, as slowly
or as long as a test wants (a trickle, an endless page, a Content-Length that lies)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

EXPOSITION = "text/plain; version=0.0.4"
Route = Callable[[dict[str, str]], tuple[int, str, str]]  # query -> (status, content type, body)


class Routes(dict[str, Route]):
    """Path (without query) -> route; unknown paths answer 404."""

    def text(self, path: str, body: str, status: int = 200) -> str:
        """Serve `body` as exposition text at `path`; returns the path."""
        self[path] = lambda _query: (status, EXPOSITION, body)
        return path


@contextmanager
def serve(routes: Routes) -> Iterator[str]:
    """Serve `routes` until the block ends; yields the base URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
            route = routes.get(parts.path)
            status, kind, body = route(query) if route else (404, "text/plain", "not found\n")
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


Answer = Callable[[socket.socket, threading.Event], None]  # (connection, stop) -> writes it


def head(status: str = "200 OK", **headers: str) -> bytes:
    """A status line and headers (`Content_Type="text/plain"`: underscores become dashes)."""
    lines = [f"HTTP/1.1 {status}", *(f"{k.replace('_', '-')}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def trickle(data: bytes, every: float, start: int = 0) -> Answer:
    """Send the first `start` bytes of `data` at once, then one byte every `every` seconds."""

    def answer(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(data[:start])
        for k in range(start, len(data)):
            if stop.wait(every):
                return
            conn.sendall(data[k : k + 1])

    return answer


def endless(first: bytes) -> Answer:
    """Send `first` (a head with `Transfer-Encoding: chunked`), then chunks of a page that never
    ends, as fast as the reader takes them, until the reader goes or the server stops."""
    line = b"# a page that never ends\n" * 2000
    chunk = f"{len(line):x}\r\n".encode() + line + b"\r\n"

    def answer(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(first)
        while not stop.is_set():
            conn.sendall(chunk)

    return answer


def fixed(data: bytes) -> Answer:
    """Send `data` (head and body) at once."""
    return lambda conn, _stop: conn.sendall(data)


@contextmanager
def serve_raw(answer: Answer) -> Iterator[str]:
    """Answer every connection, after reading its request head, with `answer(conn, stop)`; the
    connection is closed when it returns. `stop` is set when the block ends, and an answer still
    writing must return then. Yields the base URL."""
    stop = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.05)
    handlers: list[threading.Thread] = []

    def handle(conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(5)
                request = b""
                while b"\r\n\r\n" not in request:
                    data = conn.recv(4096)
                    if not data:
                        return
                    request += data
                answer(conn, stop)
            except OSError:
                pass  # the reader went away: what the tests want to see it do

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            thread = threading.Thread(target=handle, args=(conn,), daemon=True)
            handlers.append(thread)
            thread.start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        acceptor.join(timeout=5)
        listener.close()
        deadline = time.monotonic() + 5
        for thread in handlers:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
