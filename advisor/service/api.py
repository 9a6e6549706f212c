"""The advisor's read-only JSON API: its routes, their answers, and the OpenAPI 3.1 document
generated from the typed results (`advisor.documents`).

Routes (all GET, all JSON, all but the index carrying a `meta` freshness block):
`/api/snapshot` (the cluster model, in the snapshot file format), `/api/fragmentation`
(`?nodes=true` adds the per-node table), `/api/recommendations` (`?limit=N` bounds the ranked
actions), `/api/forecast`, `/api/job-ends` (per running job its expected end, learned or the
planner's fallback; `?tenant=`, `?node=`, `?limit=N`), `/api/pending` (the scheduler's queue,
why each waiting job cannot start, the plan for the biggest blocked one; `?tenant=`,
`?limit=N`), `/api/history` (the trend and the hourly
demand behind the forecast; `?hours=N`), `/api/openapi.json` (this description), and `/api/`
(an index of these routes, also at `/api`, so the address the demo prints answers). Before the
first good run every data route answers 503 with the reason; afterwards the last good results
are served with `meta.stale` true while the source fails.

`Api` holds the handlers: pure functions of the pipeline's `RunState` and the query string,
answers encoded once per run and route. `OPERATIONS` declares each route's summary, document and
parameters; `advisor.service.http` serves them with FastAPI on uvicorn, and `openapi_document`
is what FastAPI generates from them.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs

from advisor import documents as D
from advisor.pipeline import RunState
from gpu_defrag_common import __version__
from gpu_defrag_common.server import Response, Route

JSON = "application/json"
MAX_LIMIT = 10_000
MAX_HOURS = 16 * 24  # the history kept for the idle windows: /api/history's widest span
DEFAULT_HOURS = 7 * 24
MAX_CACHED = 32  # answers kept per run and route; further distinct queries are built each time
_DIGITS = re.compile(r"[0-9]{1,6}")  # ASCII only: str.isdigit() also takes '²' and '５'
SNAPSHOT_SCHEMA = D.SNAPSHOT_SCHEMA
TITLE = "gpu-defrag advisor API"


class BadRequest(ValueError):
    """A query parameter with a value the route does not accept (answered 400)."""


def _params(query: str, allowed: dict[str, Callable[[str], Any]]) -> dict[str, Any]:
    """Known parameters parsed; unknown ones are ignored (as HTTP APIs usually do)."""
    out: dict[str, Any] = {}
    for key, values in parse_qs(query, keep_blank_values=True).items():
        if key in allowed:
            out[key] = allowed[key](values[-1])
    return out


def _boolean(name: str) -> Callable[[str], bool]:
    def parse(text: str) -> bool:
        if text.lower() in ("true", "1"):
            return True
        if text.lower() in ("false", "0"):
            return False
        raise BadRequest(f"{name}={text!r}: expected true or false")

    return parse


def _node(text: str) -> str:
    if not text:
        raise BadRequest("node='': expected a node name")
    return text


def _whole(name: str, most: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        if not _DIGITS.fullmatch(text.strip()) or int(text) > most:
            shown = text if len(text) <= 20 else f"{text[:20]}…"
            raise BadRequest(f"{name}={shown!r}: expected a whole number 0..{most}")
        return int(text)

    return parse


_limit = _whole("limit", MAX_LIMIT)
_hours = _whole("hours", MAX_HOURS)


# --------------------------------------------------------------------------- the routes


@dataclass(frozen=True)
class Operation:
    """One GET route: its handler's name on `Api`, the document it answers with, its summary
    and its query parameters (OpenAPI parameter objects)."""

    path: str
    handler: str
    summary: str
    document: type[D.Document] | None  # None: a plain JSON object (the OpenAPI document)
    parameters: list[dict[str, Any]] = field(default_factory=list)
    data: bool = True  # answers 503 before the first good run


def _query(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": schema,
    }


def _whole_number(most: int, **extra: Any) -> dict[str, Any]:
    return {"type": "integer", "minimum": 0, "maximum": most, **extra}


OPERATIONS: tuple[Operation, ...] = (
    Operation(
        "/api/snapshot",
        "snapshot",
        "The cluster model of the latest good run, in the snapshot file format",
        D.SnapshotResponse,
    ),
    Operation(
        "/api/fragmentation",
        "fragmentation",
        "Fragmentation measures: cluster, per pool, per shape, per GPU model",
        D.Fragmentation,
        [_query("nodes", "include the per-node table", {"type": "boolean", "default": False})],
    ),
    Operation(
        "/api/recommendations",
        "recommendations",
        "Checked plans and ranked actions (cheapest plan first)",
        D.Recommendations,
        [_query("limit", "return at most this many ranked actions", _whole_number(MAX_LIMIT))],
    ),
    Operation(
        "/api/forecast",
        "forecast",
        "Per-pool and per-tenant demand forecasts with intervals, idle windows, and their "
        "backtests",
        D.Forecast,
    ),
    Operation(
        "/api/job-ends",
        "job_ends",
        "Per running job: expected end (P50, P90 where learned), planned end and where it "
        "comes from, soonest first",
        D.JobEndList,
        [
            _query("tenant", "only this tenant's jobs", {"type": "string"}),
            _query(
                "node",
                "only the jobs with a task on this node",
                {"type": "string", "minLength": 1},
            ),
            _query(
                "limit",
                "return at most this many jobs (the soonest ends)",
                _whole_number(MAX_LIMIT),
            ),
        ],
    ),
    Operation(
        "/api/pending",
        "pending",
        "The scheduler's queue biggest first, why each waiting job cannot start (quota, rack "
        "unknown, scattered), and a checked plan for the biggest blocked one",
        D.Pending,
        [
            _query("tenant", "only this tenant's jobs", {"type": "string"}),
            _query(
                "limit", "return at most this many jobs (the biggest)", _whole_number(MAX_LIMIT)
            ),
        ],
    ),
    Operation(
        "/api/history",
        "history",
        "The trend of the headline measures and the hourly demand the forecast learned from",
        D.History,
        [
            _query(
                "hours",
                f"the span, by the model's time (default {DEFAULT_HOURS})",
                _whole_number(MAX_HOURS, default=DEFAULT_HOURS),
            )
        ],
    ),
    Operation(
        "/api/",
        "index",
        "This index: every route with its summary (also at /api)",
        D.Index,
        data=False,
    ),
    Operation("/api/openapi.json", "openapi", "This document", None, data=False),
)


class Api:
    """Route handlers over a state getter; answers are encoded once per run and route."""

    def __init__(self, state: Callable[[], RunState]) -> None:
        self._state = state
        self._lock = threading.Lock()
        self._cache_key: RunState | None = None
        self._cache: dict[tuple[str, Any], bytes] = {}
        document = openapi_document()
        self._openapi = json.dumps(document, separators=(",", ":")).encode()
        self._index = D.encode(index_doc(document))

    def _cached(self, state: RunState, key: tuple[str, Any], build: Callable[[], Any]) -> bytes:
        with self._lock:
            if self._cache_key is not state:
                self._cache_key, self._cache = state, {}
            body = self._cache.get(key)
        if body is None:
            body = D.encode(build())
            with self._lock:
                if self._cache_key is state and len(self._cache) < MAX_CACHED:
                    self._cache[key] = body
        return body

    def _serve(
        self,
        name: str,
        query: str,
        allowed: dict[str, Callable[[str], Any]],
        build: Callable[..., D.Document],
        canonical: Callable[[RunState, dict[str, Any]], dict[str, Any]] | None = None,
    ) -> Response:
        try:
            params = _params(query, allowed)
        except BadRequest as error:
            return _error(HTTPStatus.BAD_REQUEST, str(error), None)
        state = self._state()
        if state.results is None:
            reason = state.last_error or "the first advisor run has not finished yet"
            return _error(HTTPStatus.SERVICE_UNAVAILABLE, f"no results yet: {reason}", state)
        if canonical is not None:
            params = canonical(state, params)
        key = (name, tuple(sorted(params.items())))
        body = self._cached(state, key, lambda: build(state, **params))
        return Response(HTTPStatus.OK, body, JSON)

    def snapshot(self, query: str) -> Response:
        return self._serve("snapshot", query, {}, D.build_snapshot)

    def fragmentation(self, query: str) -> Response:
        return self._serve(
            "fragmentation", query, {"nodes": _boolean("nodes")}, D.build_fragmentation
        )

    def recommendations(self, query: str) -> Response:
        return self._serve(
            "recommendations", query, {"limit": _limit}, D.build_recommendations, _whole_limit
        )

    def forecast(self, query: str) -> Response:
        return self._serve("forecast", query, {}, D.build_forecast)

    def job_ends(self, query: str) -> Response:
        allowed = {"tenant": str, "node": _node, "limit": _limit}
        return self._serve("job_ends", query, allowed, D.build_job_ends)

    def pending(self, query: str) -> Response:
        allowed = {"tenant": str, "limit": _limit}
        return self._serve("pending", query, allowed, D.build_pending)

    def history(self, query: str) -> Response:
        return self._serve("history", query, {"hours": _hours}, D.build_history)

    def openapi(self, query: str) -> Response:
        return Response(HTTPStatus.OK, self._openapi, JSON)

    def index(self, query: str) -> Response:
        return Response(HTTPStatus.OK, self._index, JSON)

    def routes(self) -> dict[str, Route]:
        """Path -> handler, `/api` (the index without its slash) included."""
        out: dict[str, Route] = {op.path: getattr(self, op.handler) for op in OPERATIONS}
        return {"/api": self.index, **out}


def _whole_limit(state: RunState, params: dict[str, Any]) -> dict[str, Any]:
    """A `limit` at or above the number of actions limits nothing: dropped, so that every such
    query shares the one cached answer instead of adding its own."""
    assert state.results is not None
    total = len(state.results.recommendations.get("actions", []))
    if params.get("limit", -1) >= total:
        return {k: v for k, v in params.items() if k != "limit"}
    return params


def _error(status: HTTPStatus, message: str, state: RunState | None) -> Response:
    error = (
        D.Error(error=message) if state is None else D.Error(error=message, meta=D.describe(state))
    )
    return Response(status, D.encode(error), JSON)


def error_body(message: str) -> bytes:
    """The Error document of an answer the HTTP layer makes itself (404, 405, 413, …)."""
    return D.encode(D.Error(error=message))


def index_doc(document: dict[str, Any]) -> D.Index:
    """What `/api/` answers: every route with its summary, from the OpenAPI document."""
    return D.Index(
        title=document["info"]["title"],
        version=document["info"]["version"],
        openapi="/api/openapi.json",
        routes={path: item["get"]["summary"] for path, item in document["paths"].items()},
    )


# --------------------------------------------------------------------------- OpenAPI

DESCRIPTION = (
    "Read-only results of the advisor's latest run (docs/service.md). A path under /api/ not "
    "listed here answers 404, a method other than GET and HEAD 405 with `Allow: GET, HEAD`, a "
    "failing route 500; all three with the Error schema (components.responses)."
)


def openapi_document() -> dict[str, Any]:
    """OpenAPI 3.1 (its schemas are JSON Schema 2020-12, like the snapshot schema), generated
    by FastAPI from `OPERATIONS` and the documents' models (a fresh copy on every call)."""
    return copy.deepcopy(_generated())


@functools.cache
def _generated() -> dict[str, Any]:
    from advisor.service.http import describe_operations

    return describe_operations(OPERATIONS, TITLE, __version__, DESCRIPTION)
