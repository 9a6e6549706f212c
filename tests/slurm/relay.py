"""slurmrestd's JWT front door for the tests: an HTTP server on 127.0.0.1 that answers as a
slurmrestd with `rest_auth/jwt` does - 401 "Authentication failure" without the user and token
headers or with a wrong token - and otherwise relays the GET, unchanged, to the real slurmrestd
on its unix socket. Debian's 22.05 ships no auth/jwt plugin for slurmctld, so a real slurmrestd
cannot check tokens here; the answers are still the real slurmrestd's.
"""

from __future__ import annotations

import http.client
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=30)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path)


@contextmanager
def jwt_front(socket_path: str, user: str, token: str) -> Iterator[tuple[str, list[dict]]]:
    """(base URL, the headers of every request seen) while the server runs."""
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            headers = {key.lower(): value for key, value in self.headers.items()}
            seen.append(headers)
            if (
                headers.get("x-slurm-user-name") != user
                or headers.get("x-slurm-user-token") != token
            ):
                self._answer(401, b"Authentication failure", "text/plain")
                return
            connection = _UnixConnection(socket_path)
            try:
                connection.request("GET", self.path)
                response = connection.getresponse()
                self._answer(response.status, response.read(), response.getheader("Content-Type"))
            finally:
                connection.close()

        def _answer(self, status: int, body: bytes, kind: str | None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind or "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
