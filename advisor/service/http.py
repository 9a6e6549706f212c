"""HTTP front of the advisor: FastAPI routes on uvicorn, with the exporter's HTTP rules.

`build_app` serves the API's routes (`advisor.service.api.Api.routes()`) beside `/metrics`
(the page the loop rendered, gzip when the client allows it), `/health`, `/-/healthy` and a
landing page; `AdvisorServer` runs it on uvicorn in a thread. `describe_operations` is where the
OpenAPI document comes from: FastAPI generates it from the routes' typed documents.

The rules the stdlib server (`gpu_defrag_common.server`, which the exporter keeps) follows hold
here too, in `Gate` (an ASGI middleware around the app) and `_Protocol` (uvicorn's h11 protocol):
TLS and bcrypt basic auth from the exporter-toolkit web config cover every route; every route is
read-only, so another known method answers 405 with `Allow: GET, HEAD` and an unknown one 501;
a body is never read: one declared over 1 MiB answers 413 and a chunked one is answered with
the connection closed, so keep-alive never takes a body for the next request; a request line or
header block over 64 KiB answers 414 or 431. Under /api/ every error is JSON with the OpenAPI
Error schema, elsewhere one line of text.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from http import HTTPStatus
from typing import Any

import h11
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response as HttpResponse
from starlette.datastructures import Headers, MutableHeaders
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from advisor import documents as D
from gpu_defrag_common.connections import Limits
from gpu_defrag_common.server import (
    CONTENT_TYPE,
    MAX_BODY,
    TEXT,
    PageSource,
    Route,
    accepts_gzip,
    landing_page,
    listening_socket,
)
from gpu_defrag_common.webconfig import WebConfig

log = logging.getLogger("advisor.service")

JSON = "application/json"
MAX_HEAD = 64 * 1024  # request line, or a header line: larger answers 414 / 431
MAX_HEADERS = 100  # more answers 431
READ_ONLY = {"GET", "HEAD"}
OTHER_METHODS = {"POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "QUERY"}  # 405
ALLOW = {"Allow": "GET, HEAD"}
SHUTDOWN_S = 1.0  # open connections get this long to finish at shutdown


def is_api(target: str | bytes) -> bool:
    """Whether a request target names a path under /api/ (its errors are JSON)."""
    text = target.decode("latin-1") if isinstance(target, bytes) else target
    return text == "/api" or text.startswith(("/api/", "/api?"))


def error_answer(status: int, message: str, api: bool) -> tuple[bytes, str]:
    """(body, content type) of an error: the Error document under /api/, else one line."""
    if api:
        return D.encode(D.Error(error=message)), JSON
    return f"{message}\n".encode(), TEXT


async def _answer(
    send: Send, status: int, body: bytes, kind: str, headers: Mapping[str, str] = {}
) -> None:
    raw = [(b"content-type", kind.encode()), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


def _too_large(scope: Scope) -> HTTPStatus | None:
    """414 for a request target over `MAX_HEAD`, 431 for a header line over it or more than
    `MAX_HEADERS` headers (the stdlib server's limits), for a request h11 parsed whole; one
    that arrives in parts is refused by `_Protocol` before it is parsed."""
    target = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"") + 1
    if target > MAX_HEAD:
        return HTTPStatus.REQUEST_URI_TOO_LONG
    headers = scope["headers"]
    if len(headers) > MAX_HEADERS or any(len(k) + len(v) + 2 > MAX_HEAD for k, v in headers):
        return HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE
    return None


class Gate:
    """What every request passes before the routes: unknown methods (501, closing the
    connection as the standard library's server does), bounded bodies (413, a chunked one
    closes the connection), basic auth (401), read-only methods (405), HEAD served as GET
    (uvicorn sends no body for it); the web config's headers on every answer; a route that
    failed is logged here (the app answered it 500)."""

    def __init__(self, app: ASGIApp, web: WebConfig) -> None:
        self.app = app
        self.web = web

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        close = "transfer-encoding" in headers  # a chunked body is never read: close after
        extra = {**self.web.headers, **({"Connection": "close"} if close else {})}

        async def send_with(message: Message) -> None:
            if message["type"] == "http.response.start" and extra:
                mutable = MutableHeaders(scope=message)
                for name, value in extra.items():
                    mutable[name] = value
            await send(message)

        api = is_api(scope.get("raw_path") or scope["path"].encode())
        method = scope["method"]

        async def refuse(status: int, message: str, more: Mapping[str, str] = {}) -> None:
            body, kind = error_answer(status, message, api)
            await _answer(send_with, status, body, kind, more)

        too_large = _too_large(scope)
        if too_large is not None:
            extra["Connection"] = "close"
            await refuse(too_large, too_large.phrase)
            return
        if method not in READ_ONLY | OTHER_METHODS:  # its body's framing is unknown: close
            extra["Connection"] = "close"
            await refuse(HTTPStatus.NOT_IMPLEMENTED, f"Unsupported method ({method!r})")
            return
        if not close:
            lengths = headers.getlist("content-length")
            length = int(lengths[0]) if lengths and lengths[0].strip().isdigit() else 0
            if length > MAX_BODY:
                extra["Connection"] = "close"
                await refuse(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body over {MAX_BODY} bytes")
                return
        if self.web.auth_required and not await self._authorized(headers):
            await _answer(
                send_with,
                HTTPStatus.UNAUTHORIZED,
                b"Unauthorized\n",
                TEXT,
                {"WWW-Authenticate": 'Basic realm="gpu-defrag"'},
            )
            return
        if method not in READ_ONLY:
            await refuse(HTTPStatus.METHOD_NOT_ALLOWED, "method not allowed", ALLOW)
            return
        if method == "HEAD":
            scope = {**scope, "method": "GET"}
        try:
            await self.app(scope, receive, send_with)
        except Exception:  # answered 500 by the app's handler; the server and routes live on
            log.exception("handler for %s failed", scope["path"])

    async def _authorized(self, headers: Headers) -> bool:
        scheme, _, encoded = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, _, password = base64.b64decode(encoded, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        if not user:
            return False
        # bcrypt takes ~100 ms on a miss: off the event loop
        check = self.web.check_password
        return await asyncio.get_running_loop().run_in_executor(None, check, user, password)


def _served(route: Route) -> Callable[[Request], HttpResponse]:
    def handle(request: Request) -> HttpResponse:
        answer = route(request.url.query)
        return HttpResponse(
            answer.body, answer.status, dict(answer.headers), media_type=answer.content_type
        )

    return handle


def build_app(
    source: PageSource, routes: Mapping[str, Route], web: WebConfig, title: str
) -> ASGIApp:
    """The advisor's HTTP application: `routes` (path -> handler of the query string) beside
    /metrics, /health, /-/healthy and the landing page, behind the `Gate`."""
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None, redirect_slashes=False)
    for path, route in routes.items():
        app.add_api_route(path, _served(route), methods=["GET"], include_in_schema=False)

    @app.get("/metrics", include_in_schema=False)
    def metrics(request: Request) -> HttpResponse:
        page = source.current_page()
        vary = {"Vary": "Accept-Encoding"}
        if accepts_gzip(", ".join(request.headers.getlist("accept-encoding"))):
            headers = {**vary, "Content-Encoding": "gzip"}
            return HttpResponse(page.gzipped, 200, headers, media_type=CONTENT_TYPE)
        return HttpResponse(page.body, 200, vary, media_type=CONTENT_TYPE)

    @app.get("/health", include_in_schema=False)
    def health() -> HttpResponse:
        state = source.health()
        status = HTTPStatus.OK if state.healthy else HTTPStatus.SERVICE_UNAVAILABLE
        return HttpResponse(f"{state.reason}\n", status, media_type=TEXT)

    @app.get("/-/healthy", include_in_schema=False)
    def healthy() -> HttpResponse:
        return HttpResponse("ok\n", media_type=TEXT)

    @app.get("/", include_in_schema=False)
    def landing() -> HttpResponse:
        page = landing_page(title, source.health(), routes)
        return HttpResponse(page, media_type="text/html; charset=utf-8")

    def failed(request: Request, error: Exception) -> HttpResponse:
        body, kind = error_answer(500, "internal error", is_api(request.url.path))
        return HttpResponse(body, HTTPStatus.INTERNAL_SERVER_ERROR, media_type=kind)

    def not_found(request: Request, error: HTTPException) -> HttpResponse:
        message = "not found" if error.status_code == 404 else str(error.detail)
        body, kind = error_answer(error.status_code, message, is_api(request.url.path))
        return HttpResponse(body, error.status_code, media_type=kind)

    app.add_exception_handler(Exception, failed)
    app.add_exception_handler(HTTPException, not_found)  # type: ignore[arg-type]
    return Gate(app, web)


# --------------------------------------------------------------------------- uvicorn


def _declared_over_bound(head: bytes) -> bool:
    """Whether the request head declares a Content-Length of digits over `MAX_BODY`."""
    for line in head.split(b"\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            digits = value.strip()
            return digits.isdigit() and (len(digits) > 12 or int(digits) > MAX_BODY)
    return False


class _Protocol(H11Protocol):
    """uvicorn's h11 protocol with the stdlib server's answers to a request it cannot parse: 414
    for a request line over `MAX_HEAD`, 431 for headers over it, else 400; JSON under /api/.

    And the exporter's request deadline (`Limits.request_timeout_s`), which uvicorn lacks: a
    connection gets that long from its opening, or from a request's first byte, to send the
    whole request; a client that drips its headers (or sends nothing) is closed then, so slow
    clients cannot hold the connections `--web.max-connections` allows."""

    request_timeout_s = Limits().request_timeout_s  # the server's own (`AdvisorServer`)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head = bytearray()  # the start of the request being parsed (bounded)
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_deadline()
        super().connection_lost(exc)

    def _start_deadline(self) -> None:
        if self._deadline is None:
            self._deadline = self.loop.call_later(self.request_timeout_s, self._too_slow)

    def _stop_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if self.conn.their_state is not h11.DONE and not self.transport.is_closing():
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE:
            self._start_deadline()  # a new request's first byte (no-op while one runs)
            room = MAX_HEAD + 1 - len(self._head)
            if room > 0:
                self._head += data[:room]
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._head.clear()
        if self.conn.their_state is h11.DONE:  # the whole request is in: the app answers it
            self._stop_deadline()

    def send_400_response(self, msg: str) -> None:
        head = bytes(self._head)
        status = HTTPStatus.BAD_REQUEST
        if len(head) > MAX_HEAD:
            line_ends = b"\r\n" in head[:MAX_HEAD] or b"\n" in head[:MAX_HEAD]
            status = (
                HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE
                if line_ends
                else HTTPStatus.REQUEST_URI_TOO_LONG
            )
        elif _declared_over_bound(head):  # h11 refuses a length too long for int()
            status = HTTPStatus.REQUEST_ENTITY_TOO_LARGE
        parts = head.split(b"\n", 1)[0].split()
        message = status.phrase if status != HTTPStatus.BAD_REQUEST else "Bad request"
        body, kind = error_answer(status, message, len(parts) > 1 and is_api(parts[1]))
        headers = [(b"content-type", kind.encode()), (b"connection", b"close")]
        for event in (
            h11.Response(status_code=int(status), headers=headers, reason=status.phrase),
            h11.Data(data=body),
            h11.EndOfMessage(),
        ):
            self.transport.write(self.conn.send(event))
        self.transport.close()


class AdvisorServer:
    """Owns the listening socket and uvicorn's thread; `close()` stops both within about a
    second (open connections get `SHUTDOWN_S` to finish)."""

    def __init__(
        self, address: str, app: ASGIApp, web: WebConfig, limits: Limits | None = None
    ) -> None:
        """`limits.max_connections` (`--web.max-connections`) bounds the connections served
        at once: a request on one more is answered 503 (uvicorn's `limit_concurrency`)."""
        limits = limits or Limits()
        self._socket, self._host = listening_socket(address, backlog=64)
        self._tls = web.tls is not None
        tls = web.tls
        bounded = type("_Bounded", (_Protocol,), {"request_timeout_s": limits.request_timeout_s})
        config = uvicorn.Config(
            app,
            http=bounded,
            ws="none",
            lifespan="off",
            log_config=None,
            log_level="error",
            access_log=False,
            server_header=False,
            h11_max_incomplete_event_size=MAX_HEAD,
            timeout_graceful_shutdown=SHUTDOWN_S,
            limit_concurrency=limits.max_connections + 1,  # uvicorn counts the one it answers
            ssl_context_factory=None if tls is None else lambda config, default: tls,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, name="http", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._socket.getsockname()[1])

    def url(self, path: str = "/metrics") -> str:
        """Where the server answers `path` (as `gpu_defrag_common.server.ExporterServer.url`)."""
        scheme = "https" if self._tls else "http"
        host = self._host or "0.0.0.0"
        shown = f"[{host}]" if ":" in host else host
        every = " (all interfaces)" if host in ("0.0.0.0", "::") else ""
        return f"{scheme}://{shown}:{self.port}{path}{every}"

    def start(self, timeout_s: float = 10.0) -> AdvisorServer:
        """Start serving; returns once uvicorn accepts connections (those made before wait in
        the socket's backlog anyway)."""
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started and self._thread.is_alive():
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)
        return self

    def close(self) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=SHUTDOWN_S + 2.0)
        self._socket.close()


# --------------------------------------------------------------------------- OpenAPI


def _undescribed() -> HttpResponse:  # the described app serves nothing
    raise NotImplementedError


def describe_operations(
    operations: Iterable[Any], title: str, version: str, description: str
) -> dict[str, Any]:
    """The OpenAPI 3.1 document FastAPI generates for `operations` (`api.Operation`): each
    route's 200 with its document's schema, 503 and 400 with the Error schema where they
    apply; then the answers the HTTP layer gives every route (404, 405, 500) as shared
    responses, and the snapshot file's own JSON Schema as the `Snapshot` components."""
    app = FastAPI(
        title=title,
        version=version,
        description=description,
        separate_input_output_schemas=False,
    )
    error = {"model": D.Error}
    for op in operations:
        if op.document is None:
            ok: dict[str, Any] = {
                "description": "OpenAPI 3.1 description",
                "content": {JSON: {"schema": {"type": "object"}}},
            }
        elif op.data:
            ok = {
                "model": op.document,
                "description": "the latest results (meta.stale says whether they are current)",
            }
        else:
            ok = {"model": op.document, "description": "the routes"}
        responses: dict[int | str, dict[str, Any]] = {200: ok}
        if op.data:
            responses[503] = {**error, "description": "no successful advisor run yet"}
        if op.parameters:
            responses[400] = {
                **error,
                "description": "a query parameter has a value the route rejects",
            }
        app.add_api_route(
            op.path,
            _undescribed,
            methods=["GET"],
            summary=op.summary,
            operation_id=op.handler,
            responses=responses,
            response_class=HttpResponse,
            openapi_extra={"parameters": op.parameters} if op.parameters else None,
        )
    doc = _with_snapshot(app.openapi())
    doc["components"]["schemas"].update(D.snapshot_schemas())
    not_allowed = _error_response("a method other than GET or HEAD")
    not_allowed["headers"] = {
        "Allow": {"description": "always `GET, HEAD`", "schema": {"const": "GET, HEAD"}}
    }
    doc["components"]["responses"] = {
        "NotFound": _error_response("no such path under /api/"),
        "MethodNotAllowed": not_allowed,
        "InternalError": _error_response("the route failed (logged by the service)"),
    }
    for item in doc["paths"].values():
        operation = item["get"]
        operation.setdefault("parameters", [])
        operation["responses"]["500"] = {"$ref": "#/components/responses/InternalError"}
        for answer in operation["responses"].values():
            _plain_json(answer)
    return doc


def _with_snapshot(node: Any) -> Any:
    """The document with every schema marked `documents.SNAPSHOT_MARK` a reference to the
    snapshot file's schema (pydantic cannot point at a schema it did not generate)."""
    if isinstance(node, dict):
        if node.get(D.SNAPSHOT_MARK):
            return {"$ref": "#/components/schemas/Snapshot"}
        return {k: _with_snapshot(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_with_snapshot(v) for v in node]
    return node


def _error_response(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {JSON: {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


def _plain_json(answer: dict[str, Any]) -> None:
    """FastAPI may list a route's default media type beside the declared JSON: JSON only."""
    content = answer.get("content")
    if content and JSON in content:
        answer["content"] = {JSON: content[JSON]}
