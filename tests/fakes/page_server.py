"""A scriptable HTTP server on 127.0.0.1 for tests that read /metrics pages or the Prometheus
API: a path maps to a handler of the query, or to a fixed text body that tests swap."""

from __future__ import annotations

import threading
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
