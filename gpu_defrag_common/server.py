"""HTTP front of the exporter: `/metrics` copies the pre-rendered page, nothing more.

Routes: `/` landing page, `/metrics`, `/health` (readiness: fresh data), `/-/healthy`
(liveness: the process answers), plus any extra read-only routes the caller passes (the
advisor's JSON API). TLS and basic auth come from the web-config file and cover every route.
Errors under /api/ are JSON (`{"error": ...}`, the API's Error schema), elsewhere one text line
(the standard library's own 400/414/431/501/505 included, never its HTML page). Sockets belong
to `connections.Connections`, which hands over whole requests only (a body read and dropped);
here a request is answered into memory by the standard library's parser and our routes.
"""

from __future__ import annotations

import errno
import html
import io
import json
import logging
import os
import re
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Protocol

from gpu_defrag_common.connections import Body, Connections, Framed, Limits, Reply
from gpu_defrag_common.exposition import Page
from gpu_defrag_common.webconfig import WebConfig

log = logging.getLogger(__name__)

# The classic text format that generate_latest() writes; every Prometheus 2.x and 3.x parses it.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TEXT = "text/plain; charset=utf-8"
MAX_BODY = Limits().max_body_bytes  # every route is read-only: a body is read and dropped
LISTEN_BACKLOG = 1024  # connections the kernel holds before the loop accepts them
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


INHERITED = "fd://"  # a listen address naming a socket the parent process already listens on


def parse_listen_address(address: str) -> tuple[str, int]:
    """`:9835`, `0.0.0.0:9835`, `[::1]:9835` -> (host, port); `fd://N` -> the host and port
    that socket listens on; ValueError with one line otherwise."""
    if address.startswith(INHERITED):
        probe = socket.socket(fileno=os.dup(inherited_fd(address)))
        try:
            host, port = probe.getsockname()[:2]
        finally:
            probe.close()
        return str(host), int(port)
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
        + "".join(
            f'<li><a href="{html.escape(p)}">{html.escape(p)}</a></li>' for p in _listed(paths)
        )
        + "</ul></body></html>"
    )


@dataclass(frozen=True, slots=True)
class _App:
    """What every request of one server reads: `self.server` of its handler."""

    source: PageSource
    web: WebConfig
    title: str
    routes: Mapping[str, Route]


class _Handler(BaseHTTPRequestHandler):
    """One whole request (read by `connections.Connections`) answered into memory: the standard
    library's request-line and header parsing and its status lines, without its socket I/O."""

    server: _App  # type: ignore[assignment]
    protocol_version = "HTTP/1.1"
    # An error found before the version is read (a bad or HTTP/2.0 request line) still gets a
    # status line: the default "HTTP/0.9" sent its body alone.
    default_request_version = "HTTP/1.1"

    def __init__(self, request: Framed, client_address: tuple, app: _App) -> None:
        # not BaseRequestHandler.__init__, which would read and write a socket
        self.request = None
        self.client_address = client_address
        self.server = app
        self.framed = request
        self.rfile = io.BytesIO(request.head)
        self.wfile = io.BytesIO()
        self.close_connection = True
        if request.head_too_large:
            self._head_too_large()
        else:
            self.handle_one_request()

    def reply(self) -> Reply:
        return Reply(self.wfile.getvalue(), self.close_connection)

    def _head_too_large(self) -> None:
        """No end of the head within the bound: 414 while the request line has not ended,
        else 431 (as the standard library answers a line over its own bound)."""
        line, newline, _ = self.framed.head.partition(b"\n")
        self.raw_requestline = line
        self.requestline, self.command = "", ""
        self.request_version = self.default_request_version
        if newline:
            self.send_error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "request headers too large")
        else:
            self.send_error(HTTPStatus.REQUEST_URI_TOO_LONG)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def do_GET(self) -> None:
        if self._body_ok() and self._authorized():
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
        if self._body_ok() and self._authorized():
            self._error(HTTPStatus.METHOD_NOT_ALLOWED, "method not allowed", {"Allow": "GET, HEAD"})

    do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_TRACE = do_QUERY = _method_not_allowed

    def _body_ok(self) -> bool:
        """The body was read and dropped with the request (so on a keep-alive connection it is
        never taken for the next request); a chunked one was not read, and the connection
        closes after the answer. False when the request was answered here."""
        body = self.framed.body
        if body is Body.CHUNKED:
            self.close_connection = True
        elif body is Body.BAD_LENGTH:
            self.close_connection = True
            self._error(HTTPStatus.BAD_REQUEST, "bad Content-Length")
            return False
        elif body is Body.TOO_LARGE:
            self.close_connection = True
            self._error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body over {MAX_BODY} bytes")
            return False
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
        """The standard library's own errors (400, 414, 431, 501 for an unknown method, 505
        for HTTP/2.0) like every other: one line of plain text (JSON under /api/), never
        its HTML page, and the connection closes after them as the library's do."""
        self.log_error("code %d, message %s", code, message)
        self.close_connection = True
        self._error(HTTPStatus(code), message or HTTPStatus(code).phrase)

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
        if not web.auth_required or web.authorized(self.headers.get("Authorization", "")):
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


def _listed(paths: Iterable[str]) -> list[str]:
    """The routes the landing page links: a page under a folder that has a route of its own
    (`/runbooks/GpuLost` beside `/runbooks/`) is reached from that folder's page."""
    paths = list(paths)
    folders = {p for p in paths if p.endswith("/") and p != "/"}
    return [p for p in paths if not any(p != f and p.startswith(f) for f in folders)]


class ExporterServer:
    """Owns the listening socket, the connection loop's thread and its workers; `close()`
    stops them all within about a second."""

    def __init__(
        self,
        address: str,
        source: PageSource,
        web: WebConfig,
        title: str = "gpu-defrag exporter",
        routes: Mapping[str, Route] | None = None,
        limits: Limits | None = None,
    ) -> None:
        self._listener, self._host = listening_socket(address)
        self._web = web
        self._app = _App(source, web, title, routes or {})
        self._connections = Connections(
            self._listener,
            self._respond,
            limits=limits or Limits(),
            tls=web.tls,
            needs_auth_check=web.needs_check,
            busy_reply=self._busy,
        )
        self._thread = threading.Thread(
            target=self._connections.serve_forever, name="http", daemon=True
        )

    def _respond(self, request: Framed, client_address: tuple) -> Reply:
        return _Handler(request, client_address, self._app).reply()

    def _busy(self) -> bytes:
        """The answer when the queue of bcrypt checks is full: try again, not a wrong password."""
        body = b"too many authentication checks waiting; try again\n"
        status = HTTPStatus.SERVICE_UNAVAILABLE
        headers = {
            "Content-Type": TEXT,
            "Content-Length": str(len(body)),
            **self._web.headers,
            "Retry-After": "1",
            "Connection": "close",
        }
        lines = [f"HTTP/1.1 {status.value} {status.phrase}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body

    @property
    def port(self) -> int:
        return self._listener.getsockname()[1]

    @property
    def open_connections(self) -> int:
        return self._connections.open_connections

    def url(self, path: str = "/metrics") -> str:
        """Where the server answers `path`, as its start-up log line names it: the scheme (https
        with TLS), the host of the listen address and the port bound. An address without a host
        (`:9835`), 0.0.0.0 or :: listens on every interface: `http://0.0.0.0:9835/metrics (all
        interfaces)`, not `http://:9835/metrics`, which no client can open."""
        scheme = "https" if self._web.tls else "http"
        host = self._host or "0.0.0.0"
        shown = f"[{host}]" if ":" in host else host
        every = " (all interfaces)" if host in ("0.0.0.0", "::") else ""
        return f"{scheme}://{shown}:{self.port}{path}{every}"

    def start(self) -> ExporterServer:
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread.is_alive():
            self._connections.close()
            self._thread.join(timeout=2.0)
        else:
            self._listener.close()


def inherited_fd(address: str) -> int:
    """N of `fd://N`, checked to be a TCP socket that listens; ValueError with one line."""
    number = address.removeprefix(INHERITED)
    if not number.isdigit():
        raise ValueError(f"--web.listen-address {address!r}: expected fd://N, N a file descriptor")
    try:
        probe = socket.socket(fileno=os.dup(int(number)))
    except OSError as error:
        why = "no such file descriptor" if error.errno == errno.EBADF else "not a socket"
        raise ValueError(f"--web.listen-address {address!r}: {why}") from None
    try:
        listens = probe.type == socket.SOCK_STREAM and probe.getsockopt(
            socket.SOL_SOCKET, socket.SO_ACCEPTCONN
        )
    except OSError:
        listens = False
    finally:
        probe.close()
    if not listens:
        raise ValueError(f"--web.listen-address {address!r}: not a listening TCP socket")
    return int(number)


def listening_socket(address: str, backlog: int = LISTEN_BACKLOG) -> tuple[socket.socket, str]:
    """The socket `--web.listen-address` names and the host for the server's URL. `[host]:port`
    is bound here; `fd://N` is a socket the parent process already listens on, handed down as
    file descriptor N (systemd's socket activation, gunicorn's `--bind fd://N`): a parent that
    picked the port (the demo) cannot lose it to another process before this one starts."""
    if address.startswith(INHERITED):
        sock = socket.socket(fileno=inherited_fd(address))
        return sock, str(sock.getsockname()[0])
    host, port = parse_listen_address(address)
    return _listen(host, port, backlog), host


def _listen(host: str, port: int, backlog: int = LISTEN_BACKLOG) -> socket.socket:
    """A listening socket as `socketserver` made it (address reuse, IPv6 for a host with a
    colon), with a backlog for a burst of connections."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock
