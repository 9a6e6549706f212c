"""HTTP front of the exporter: `/metrics` copies the pre-rendered page, nothing more.

Routes: `/` landing page, `/metrics`, `/health` (readiness: fresh data), `/-/healthy`
(liveness: the process answers), plus any extra read-only routes the caller passes (the
advisor's JSON API). TLS and basic auth come from the web-config file and cover every route.
Errors under /api/ are JSON (`{"error": ...}`, the API's Error schema), elsewhere one text line;
a request body is read and dropped (bounded), so keep-alive never parses it as a request.
"""

from __future__ import annotations

import base64
import binascii
import html
import json
import logging
import re
import socket
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Protocol

from gpu_defrag_common.exposition import Page
from gpu_defrag_common.messages import one_line
from gpu_defrag_common.webconfig import WebConfig

log = logging.getLogger(__name__)

# The classic text format that generate_latest() writes; every Prometheus 2.x and 3.x parses it.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
CLIENT_GONE = (ConnectionResetError, BrokenPipeError, TimeoutError)  # not the server's fault
TEXT = "text/plain; charset=utf-8"
MAX_BODY = 1 << 20  # every route is read-only: a body is read and dropped, up to this size
_QVALUE = re.compile(r"0(\.[0-9]{0,3})?|1(\.0{0,3})?")  # RFC 9110 12.4.2


@dataclass(frozen=True, slots=True)
class Health:
    """Readiness of a server's data: fresh enough to serve, and why not."""

    healthy: bool
    reason: str
    last_success_ts: float | None
    age_s: float | None


@dataclass(frozen=True, slots=True)
class Response:
    """What an extra route answers; sent in one write like every other response."""

    status: int
    body: bytes
    content_type: str
    headers: dict[str, str] = field(default_factory=dict)


Route = Callable[[str], Response]  # query string (without '?') -> response


class PageSource(Protocol):
    def current_page(self) -> Page: ...

    def health(self) -> Health: ...


def parse_listen_address(address: str) -> tuple[str, int]:
    """`:9835`, `0.0.0.0:9835`, `[::1]:9835` -> (host, port); ValueError with one line otherwise."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"--web.listen-address {address!r}: expected [host]:port, e.g. :9835")
    host = host.strip("[]")
    return host, int(port)


def _qvalue(params: list[str]) -> float:
    """The `q` of one Accept-Encoding element (1 without one; 0 when malformed)."""
    for param in params:
        name, _, value = param.partition("=")
        if name.strip().lower() == "q":
            value = value.strip()
            return float(value) if _QVALUE.fullmatch(value) else 0.0
    return 1.0


def accepts_gzip(header: str) -> bool:
    """Whether an Accept-Encoding value allows gzip: `gzip` (or `x-gzip`), else `*`, with a
    q above 0. A substring test would send gzip to `gzip;q=0`, which refuses it."""
    weights: dict[str, float] = {}
    for element in header.split(","):
        coding, *params = element.split(";")
        if coding.strip():
            weights.setdefault(coding.strip().lower(), _qvalue(params))
    for coding in ("gzip", "x-gzip", "*"):
        if coding in weights:
            return weights[coding] > 0
    return False


def landing_page(title: str, health: Health, paths: Iterable[str]) -> str:
    """The HTML a server answers at `/`: its health and links to its pages."""
    age = "never" if health.age_s is None else f"{health.age_s:.1f}s ago"
    title = html.escape(title)
    return (
        f"<!doctype html><html><head><title>{title}</title></head><body>"
        f"<h1>{title}</h1>"
        f"<p>Status: <b>{'healthy' if health.healthy else 'unhealthy'}</b> — "
        f"{html.escape(health.reason)}; last collection {age}.</p>"
        '<ul><li><a href="/metrics">Metrics</a></li>'
        '<li><a href="/health">Health</a> (503 when data is stale)</li>'
        + "".join(f'<li><a href="{html.escape(p)}">{html.escape(p)}</a></li>' for p in paths)
        + "</ul></body></html>"
    )


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64

    def __init__(
        self,
        address: tuple[str, int],
        source: PageSource,
        web: WebConfig,
        title: str,
        routes: Mapping[str, Route] | None = None,
    ):
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, _Handler)
        self.source = source
        self.web = web
        self.title = title
        self.routes: Mapping[str, Route] = routes or {}

    def finish_request(self, request, client_address) -> None:
        """Runs in the connection's own thread, so a slow TLS handshake stalls only itself."""
        if self.web.tls is not None:
            try:
                request.settimeout(10)
                request = self.web.tls.wrap_socket(request, server_side=True)
            except (OSError, ValueError) as error:
                log.debug("TLS handshake with %s failed: %s", client_address, error)
                return
        super().finish_request(request, client_address)

    def handle_error(self, request, client_address) -> None:
        """Replaces socketserver's traceback on stderr: a client that hangs up early (a
        `| head`, a scrape timeout) is routine and logged at debug; anything else is one
        logfmt line at error."""
        error = sys.exception()
        if isinstance(error, CLIENT_GONE):
            log.debug("client %s went away: %s", client_address, type(error).__name__)
            return
        log.error("request from %s failed: %s", client_address, one_line(error, typed=True))


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    timeout = 30
    # Headers and body leave in one write with Nagle off: separate small writes on a
    # keep-alive connection otherwise wait ~40 ms for the client's delayed ACK.
    disable_nagle_algorithm = True
    wbufsize = 64 * 1024

    def log_message(self, format: str, *args: object) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def do_GET(self) -> None:
        if self._read_body() and self._authorized():
            self._get()

    def _get(self) -> None:
        path, _, query = self.path.partition("?")
        route = self.server.routes.get(path)
        if route is not None:
            self._route(route, query)
        elif path == "/metrics":
            self._metrics()
        elif path == "/health":
            health = self.server.source.health()
            status = HTTPStatus.OK if health.healthy else HTTPStatus.SERVICE_UNAVAILABLE
            self._send(status, f"{health.reason}\n".encode(), TEXT)
        elif path == "/-/healthy":
            self._send(HTTPStatus.OK, b"ok\n", TEXT)
        elif path == "/":
            self._send(HTTPStatus.OK, self._landing().encode(), "text/html; charset=utf-8")
        else:
            self._error(HTTPStatus.NOT_FOUND, "not found")

    def do_HEAD(self) -> None:
        self.do_GET()

    def _method_not_allowed(self) -> None:
        """Every route is read-only: other methods get 405 with `Allow` (not the stdlib's 501,
        which claims the server does not know the method at all)."""
        if self._read_body() and self._authorized():
            self._error(HTTPStatus.METHOD_NOT_ALLOWED, "method not allowed", {"Allow": "GET, HEAD"})

    do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_TRACE = do_QUERY = _method_not_allowed

    def _read_body(self) -> bool:
        """Reads and drops a declared body, so that on a keep-alive connection it is never
        taken for the next request. A chunked body is not read: the connection closes after
        the answer. False when the request was answered here (bad or oversized length)."""
        if self.headers.get("Transfer-Encoding") is not None:
            self.close_connection = True
            return True
        lengths = {value.strip() for value in self.headers.get_all("Content-Length") or ()}
        if not lengths:
            return True
        keep_open = not self.close_connection  # as parse_request decided from the headers
        self.close_connection = True  # until the body is read in full
        length = lengths.pop()
        if lengths or not length.isascii() or not length.isdigit():
            self._error(HTTPStatus.BAD_REQUEST, "bad Content-Length")
            return False
        if len(length) > len(str(MAX_BODY)) or int(length) > MAX_BODY:
            self._error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body over {MAX_BODY} bytes")
            return False
        if len(self.rfile.read(int(length))) == int(length):
            self.close_connection = not keep_open
        return True

    def _api_request(self) -> bool:
        """Whether the request line names a path under /api/; read from the raw line, which
        exists even when the line was too long to parse (414)."""
        parts = self.raw_requestline.split(maxsplit=2)
        target = parts[1] if len(parts) > 1 else b""
        return target == b"/api" or target.startswith((b"/api/", b"/api?"))

    def _error(self, status: HTTPStatus, message: str, extra: dict[str, str] | None = None) -> None:
        """Under /api/ the API's Error schema, `{"error": ...}` as JSON; elsewhere one line."""
        if self._api_request():
            body, kind = json.dumps({"error": message}).encode(), "application/json"
        else:
            body, kind = f"{message}\n".encode(), TEXT
        self._send(status, body, kind, extra)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The standard library's own errors (400, 414, 431, 501) as JSON under /api/."""
        if not self._api_request():
            super().send_error(code, message, explain)
            return
        self.log_error("code %d, message %s", code, message)
        self.close_connection = True
        self._error(HTTPStatus(code), message or self.responses.get(code, ("error",))[0])

    def _metrics(self) -> None:
        page = self.server.source.current_page()
        vary = {"Vary": "Accept-Encoding"}
        if accepts_gzip(", ".join(self.headers.get_all("Accept-Encoding") or ())):
            self._send(
                HTTPStatus.OK, page.gzipped, CONTENT_TYPE, {**vary, "Content-Encoding": "gzip"}
            )
        else:
            self._send(HTTPStatus.OK, page.body, CONTENT_TYPE, vary)

    def _route(self, route: Route, query: str) -> None:
        try:
            response = route(query)
        except Exception:  # a broken handler answers 500; the server and other routes live on
            log.exception("handler for %s failed", self.path)
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, "internal error")
            return
        self._send(
            HTTPStatus(response.status), response.body, response.content_type, response.headers
        )

    def _authorized(self) -> bool:
        web = self.server.web
        if not web.auth_required:
            return True
        header = self.headers.get("Authorization", "")
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() == "basic":
            try:
                user, _, password = base64.b64decode(encoded, validate=True).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                user, password = "", ""
            if user and web.check_password(user, password):
                return True
        self._send(
            HTTPStatus.UNAUTHORIZED,
            b"Unauthorized\n",
            TEXT,
            {"WWW-Authenticate": 'Basic realm="gpu-defrag"'},
        )
        return False

    def _send(
        self,
        status: HTTPStatus,
        body: bytes,
        content_type: str,
        extra: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in {**self.server.web.headers, **(extra or {})}.items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _landing(self) -> str:
        return landing_page(self.server.title, self.server.source.health(), self.server.routes)


class ExporterServer:
    """Owns the listening socket and its thread; `close()` stops both."""

    def __init__(
        self,
        address: str,
        source: PageSource,
        web: WebConfig,
        title: str = "gpu-defrag exporter",
        routes: Mapping[str, Route] | None = None,
    ) -> None:
        host, port = parse_listen_address(address)
        self._host = host
        self._httpd = _Server((host, port), source, web, title, routes)
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="http", daemon=True)

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    def url(self, path: str = "/metrics") -> str:
        """Where the server answers `path`, as its start-up log line names it: the scheme (https
        with TLS), the host of the listen address and the port bound. An address without a host
        (`:9835`), 0.0.0.0 or :: listens on every interface: `http://0.0.0.0:9835/metrics (all
        interfaces)`, not `http://:9835/metrics`, which no client can open."""
        scheme = "https" if self._httpd.web.tls else "http"
        host = self._host or "0.0.0.0"
        shown = f"[{host}]" if ":" in host else host
        every = " (all interfaces)" if host in ("0.0.0.0", "::") else ""
        return f"{scheme}://{shown}:{self.port}{path}{every}"

    def start(self) -> ExporterServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
