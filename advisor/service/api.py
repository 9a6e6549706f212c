"""The advisor's read-only JSON API and its OpenAPI 3.1 description.

Routes (all GET, all JSON, all carrying a `meta` freshness block):
`/api/snapshot` (the cluster model, in the snapshot file format), `/api/fragmentation`
(`?nodes=true` adds the per-node table), `/api/recommendations` (`?limit=N` bounds the ranked
actions), `/api/forecast`, and `/api/openapi.json` (this description). Before the first good
run every data route answers 503 with the reason; afterwards the last good results are served
with `meta.stale` true while the source fails.

The handlers are pure functions of the loop's `RunState` and the query string (see `routes`);
`exporter.server.ExporterServer` serves them beside /metrics, TLS and basic auth included.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from advisor import snapshot
from advisor.service import results as R
from advisor.service.loop import RunState, describe
from exporter import __version__
from exporter.server import Response, Route

JSON = "application/json"
MAX_LIMIT = 10_000
SNAPSHOT_SCHEMA = Path(snapshot.__file__).with_name("snapshot.schema.json")


class BadRequest(ValueError):
    """A query parameter with a value the route does not accept (answered 400)."""


def _encode(doc: Any) -> bytes:
    return json.dumps(R.jsonable(doc), allow_nan=False, separators=(",", ":")).encode()


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


def _limit(text: str) -> int:
    if not text.strip().isdigit() or int(text) > MAX_LIMIT:
        raise BadRequest(f"limit={text!r}: expected a whole number 0..{MAX_LIMIT}")
    return int(text)


# --------------------------------------------------------------------------- documents


def snapshot_doc(state: RunState) -> dict[str, Any]:
    assert state.results is not None
    return {"meta": describe(state), "snapshot": snapshot.to_dict(state.results.model)}


def fragmentation_doc(state: RunState, nodes: bool = False) -> dict[str, Any]:
    results = state.results
    assert results is not None
    analysis = {k: v for k, v in results.analysis.items() if k != "nodes"}
    doc = {
        "meta": describe(state),
        **analysis,
        "pools": results.pools,
        "shapes": results.shapes,
        "gpu_models": results.gpu_models,
    }
    if nodes:
        doc["nodes"] = R.node_rows(results.model, results.analysis)
    return doc


def recommendations_doc(state: RunState, limit: int | None = None) -> dict[str, Any]:
    assert state.results is not None
    recs = state.results.recommendations
    actions = recs.get("actions", [])
    return {
        "meta": describe(state),
        "method": recs.get("method", ""),
        "stale": bool(recs.get("stale", False)),
        "error": recs.get("error") or None,
        "goals": recs.get("goals", []),
        "by_kind": recs.get("by_kind", {}),
        "total_actions": len(actions),
        "actions": actions if limit is None else actions[:limit],
        "plans": recs.get("plans", []),
        "job_ends": recs.get("job_ends"),
    }


def forecast_doc(state: RunState) -> dict[str, Any]:
    assert state.results is not None
    forecast = dict(state.results.forecast)
    forecast["error"] = forecast.get("error") or None
    forecast.setdefault("stale", False)
    return {"meta": describe(state), **forecast}


# --------------------------------------------------------------------------- routes


class Api:
    """Route handlers over a state getter; answers are encoded once per run and route."""

    def __init__(self, state: Callable[[], RunState]) -> None:
        self._state = state
        self._lock = threading.Lock()
        self._cache_key: RunState | None = None
        self._cache: dict[tuple[str, Any], bytes] = {}
        self._openapi = _encode(openapi_document())

    def _cached(self, state: RunState, key: tuple[str, Any], build: Callable[[], Any]) -> bytes:
        with self._lock:
            if self._cache_key is not state:
                self._cache_key, self._cache = state, {}
            body = self._cache.get(key)
        if body is None:
            body = _encode(build())
            with self._lock:
                if self._cache_key is state:
                    self._cache[key] = body
        return body

    def _serve(
        self,
        name: str,
        query: str,
        allowed: dict[str, Callable[[str], Any]],
        build: Callable[..., dict[str, Any]],
    ) -> Response:
        try:
            params = _params(query, allowed)
        except BadRequest as error:
            return _error(HTTPStatus.BAD_REQUEST, str(error), None)
        state = self._state()
        if state.results is None:
            reason = state.last_error or "the first advisor run has not finished yet"
            return _error(HTTPStatus.SERVICE_UNAVAILABLE, f"no results yet: {reason}", state)
        key = (name, tuple(sorted(params.items())))
        body = self._cached(state, key, lambda: build(state, **params))
        return Response(HTTPStatus.OK, body, JSON)

    def snapshot(self, query: str) -> Response:
        return self._serve("snapshot", query, {}, snapshot_doc)

    def fragmentation(self, query: str) -> Response:
        return self._serve("fragmentation", query, {"nodes": _boolean("nodes")}, fragmentation_doc)

    def recommendations(self, query: str) -> Response:
        return self._serve("recommendations", query, {"limit": _limit}, recommendations_doc)

    def forecast(self, query: str) -> Response:
        return self._serve("forecast", query, {}, forecast_doc)

    def openapi(self, query: str) -> Response:
        return Response(HTTPStatus.OK, self._openapi, JSON)

    def routes(self) -> dict[str, Route]:
        return {
            "/api/snapshot": self.snapshot,
            "/api/fragmentation": self.fragmentation,
            "/api/recommendations": self.recommendations,
            "/api/forecast": self.forecast,
            "/api/openapi.json": self.openapi,
        }


def _error(status: HTTPStatus, message: str, state: RunState | None) -> Response:
    doc: dict[str, Any] = {"error": message}
    if state is not None:
        doc["meta"] = describe(state)
    return Response(status, _encode(doc), JSON)


# --------------------------------------------------------------------------- OpenAPI

_NUM_OR_NULL = {"type": ["number", "null"]}
_STR_OR_NULL = {"type": ["string", "null"]}


def _obj(properties: dict[str, Any], required: list[str] | None = None, **extra: Any) -> dict:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else required,
        **extra,
    }


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _snapshot_schemas() -> dict[str, Any]:
    """The snapshot file's JSON Schema (draft 2020-12, which OpenAPI 3.1 uses) as components."""
    doc = json.loads(SNAPSHOT_SCHEMA.read_text())
    defs = doc.pop("$defs", {})

    def rewrite(node: Any) -> Any:
        if isinstance(node, dict):
            return {
                k: (
                    v.replace("#/$defs/", "#/components/schemas/Snapshot_")
                    if k == "$ref" and isinstance(v, str)
                    else rewrite(v)
                )
                for k, v in node.items()
                if k not in ("$schema", "$id")
            }
        if isinstance(node, list):
            return [rewrite(v) for v in node]
        return node

    out = {"Snapshot": rewrite(doc)}
    out.update({f"Snapshot_{name}": rewrite(schema) for name, schema in defs.items()})
    return out


def _schemas() -> dict[str, Any]:
    count = {"type": "integer", "minimum": 0}
    gpus = {"type": "number", "minimum": 0}
    meta = _obj(
        {
            "source": {"type": "string"},
            "stale": {"type": "boolean", "description": "true while the last run failed"},
            "source_up": {"type": "boolean"},
            "source_error": _STR_OR_NULL,
            "last_error": _STR_OR_NULL,
            "observed_at": _NUM_OR_NULL,
            "last_success_timestamp": _NUM_OR_NULL,
            "runs": count,
        }
    )
    pool = _obj(
        {
            "pool": {"type": "string"},
            "nodes": count,
            "gpus": count,
            "healthy_gpus": count,
            "free_gpus": count,
            "free_capacity_gpus": gpus,
            "allocated_gpus": gpus,
            "fragmented_gpus": gpus,
            "fragmentation_ratio": {"type": "number", "minimum": 0},
            "allocated_idle_gpus": count,
            "stranded_memory_bytes": gpus,
        }
    )
    shape = _obj(
        {
            "shape": {"type": "string"},
            "gpus_per_job": gpus,
            "schedulable_jobs": count,
            "stranded_gpus": {"type": ["integer", "null"]},
        }
    )
    gpu_model = _obj(
        {
            "gpu_model": {"type": "string"},
            "gpus": count,
            "free_capacity_gpus": gpus,
            "allocated_idle_gpus": count,
            "idle_capacity_gpus": gpus,
            "allocated_gpus": gpus,
            "pending_gpus": gpus,
            "demand_gpus": gpus,
        }
    )
    node = _obj(
        {
            "node": {"type": "string"},
            "pool": {"type": "string"},
            "rack": {"type": "string"},
            "gpu_model": {"type": "string"},
            "gpus": count,
            "free_gpus": count,
            "allocated_idle_gpus": count,
            "fgd_fragment_gpus": gpus,
            "score": {"type": "number", "minimum": 0, "maximum": 1},
            "stranded_memory_bytes": gpus,
        }
    )
    fragmentation = _obj(
        {
            "meta": _ref("Meta"),
            "source": {"type": "string"},
            "timestamp": _NUM_OR_NULL,
            "cluster": {"type": "object"},
            "spatial": {"type": "object"},
            "temporal": {"type": "object"},
            "type": {"type": "object"},
            "memory": {"type": "object"},
            "fgd": _obj(
                {
                    "workload": {"type": "string"},
                    "task_types": count,
                    "fragment_gpus": gpus,
                    "fragment_pct_of_capacity": {"type": "number", "minimum": 0},
                    "fragment_rate": {"type": "number", "minimum": 0},
                }
            ),
            "pools": {"type": "array", "items": _ref("Pool")},
            "shapes": {"type": "array", "items": _ref("Shape")},
            "gpu_models": {"type": "array", "items": _ref("GpuModel")},
            "nodes": {"type": "array", "items": _ref("Node")},
        },
        required=["meta", "cluster", "spatial", "temporal", "type", "memory", "fgd", "pools"],
    )
    action = _obj(
        {
            "rank": {"type": "integer", "minimum": 1},
            "goal": {"type": "string"},
            "kind": {
                "type": "string",
                "enum": ["migrate", "reserve", "reclaim", "share", "borrow", "rebalance"],
            },
            "alloc": {"type": "string"},
            "job": {"type": "string"},
            "tenant": {"type": "string"},
            "source": {"type": "string"},
            "target": {"type": "string"},
            "summary": {"type": "string"},
            "cost_gpu_hours": gpus,
            "restarts": count,
            "benefit_gpus": gpus,
        }
    )
    recommendations = _obj(
        {
            "meta": _ref("Meta"),
            "method": {"type": "string"},
            "stale": {"type": "boolean"},
            "error": _STR_OR_NULL,
            "goals": {"type": "array", "items": {"type": "string"}},
            "by_kind": {"type": "object", "additionalProperties": count},
            "total_actions": count,
            "actions": {"type": "array", "items": _ref("Action")},
            "plans": {
                "type": "array",
                "items": {"type": "object", "required": ["goal", "feasible", "actions"]},
            },
            "job_ends": {"oneOf": [_ref("JobEnds"), {"type": "null"}]},
        }
    )
    job_ends = _obj(
        {
            "source": {"type": "string"},
            "finished_jobs": count,
            "min_finished": count,
            "quantile": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
            "by": {"type": "array", "items": {"type": "string"}},
            "running_jobs": count,
            "unknown_start_jobs": count,
            "predicted_jobs": count,
            "by_group": count,
            "predicted_allocations": count,
            "median_duration_h": _NUM_OR_NULL,
            "median_censor_s": _NUM_OR_NULL,
            "reason": {"type": "string"},
        },
        description="Where the plans' job ends came from: `source` as the reservations' "
        "reasons name it, the finished jobs learned from, and the running jobs given a "
        "learned end (docs/recommendations.md).",
    )
    ratio = {"type": ["number", "null"], "minimum": 0, "maximum": 1}
    horizon = {
        "oneOf": [
            _obj(
                {
                    "horizon": {"type": "string"},
                    "available": {"const": True},
                    "target": {"type": "string"},
                    "model": {"type": "string"},
                    "point_gpus": gpus,
                    "quantiles": {"type": "object", "additionalProperties": gpus},
                    "backtest": _obj(
                        {
                            "selection_origins": count,
                            "test_origins": count,
                            "wape_ratio": {"type": "object", "additionalProperties": _NUM_OR_NULL},
                            "coverage_ratio": {
                                "type": "object",
                                "description": "per model, per interval quantile: the share "
                                "of held-back hours at or below it (nominal: the quantile)",
                                "additionalProperties": {
                                    "type": "object",
                                    "additionalProperties": ratio,
                                },
                            },
                        }
                    ),
                }
            ),
            _obj(
                {
                    "horizon": {"type": "string"},
                    "available": {"const": False},
                    "reason": {"type": "string"},
                }
            ),
        ]
    }
    idle_window = {
        "oneOf": [
            _obj(
                {
                    "window": {"type": "string"},
                    "available": {"const": True},
                    "until": {"type": "string"},
                    "release_gpus": gpus,
                    "rule": {"type": "string"},
                    "backtest": _obj(
                        {
                            "test_from": {"type": "string"},
                            "test_origins": count,
                            "method": {"type": "string"},
                            "violation_ratio": {"type": "object", "additionalProperties": ratio},
                            "capture_ratio": {"type": "object", "additionalProperties": ratio},
                        }
                    ),
                }
            ),
            _obj(
                {
                    "window": {"type": "string"},
                    "available": {"const": False},
                    "reason": {"type": "string"},
                }
            ),
        ]
    }
    idle = _obj(
        {
            "risk": {"type": "number", "minimum": 0, "maximum": 1},
            "windows": {"type": "array", "items": {"type": "string"}},
            "baseline": {"type": "string"},
            "max_history_hours": count,
            "history_hours": count,
            "origin": _STR_OR_NULL,
            "valid_from": _STR_OR_NULL,
            "error": _STR_OR_NULL,
            "pools": {
                "type": "array",
                "items": _obj(
                    {
                        "pool": {"type": "string"},
                        "capacity_gpus": _NUM_OR_NULL,
                        "current_idle_gpus": _NUM_OR_NULL,
                        "windows": {"type": "array", "items": idle_window},
                    }
                ),
            },
            "node_history_hours": count,
            "nodes_total": count,
            "max_nodes": count,
            "node_error": _STR_OR_NULL,
            "nodes": {
                "type": "array",
                "description": "the same per node (per-series rules only), the most GPUs idle "
                "in the last complete hour first; nodes beyond max_nodes carry a reason",
                "items": _obj(
                    {
                        "node": {"type": "string"},
                        "pool": {"type": "string"},
                        "capacity_gpus": _NUM_OR_NULL,
                        "current_idle_gpus": _NUM_OR_NULL,
                        "windows": {"type": "array", "items": idle_window},
                    }
                ),
            },
        },
        description="Per pool and per node and window W: GPUs forecast to stay free for the "
        "whole next W hours (from valid_from) at the risk, with their held-back backtest "
        "(docs/service.md).",
    )
    demand_head = {  # what `demand_section` puts beside the series, for pools and tenants
        "history_hours": count,
        "origin": _STR_OR_NULL,
        "quantiles": {"type": "array", "items": {"type": "number"}},
        "baseline": {"type": "string"},
        "candidates": {"type": "array", "items": {"type": "string"}},
    }
    tenants = _obj(
        {
            "max_tenants": count,
            "tenants_total": count,
            "error": _STR_OR_NULL,
            **demand_head,
            "tenants": {
                "type": "array",
                "items": _obj(
                    {
                        "tenant": {"type": "string"},
                        "allocated_gpus": _NUM_OR_NULL,
                        "quota_gpus": _NUM_OR_NULL,
                        "horizons": {"type": "array", "items": horizon},
                    }
                ),
            },
        },
        description="Per tenant (the max_tenants holding the most GPUs at the latest run, of "
        "tenants_total): the GPUs its running allocations hold, forecast and backtested as a "
        "pool's demand, next to its quota over all GPU models (policy; null without one); no "
        "capacity, no idle windows.",
    )
    forecast = _obj(
        {
            "meta": _ref("Meta"),
            "stale": {"type": "boolean"},
            "error": _STR_OR_NULL,
            **demand_head,
            "pools": {
                "type": "array",
                "items": _obj(
                    {
                        "pool": {"type": "string"},
                        "capacity_gpus": _NUM_OR_NULL,
                        "allocated_gpus": _NUM_OR_NULL,
                        "horizons": {"type": "array", "items": horizon},
                    }
                ),
            },
            "idle": _ref("IdleWindows"),
            "tenants": _ref("TenantDemand"),
        },
        required=["meta", "stale", "error"],
    )
    error = _obj({"error": {"type": "string"}, "meta": _ref("Meta")}, required=["error"])
    return {
        "Meta": meta,
        "Pool": pool,
        "Shape": shape,
        "GpuModel": gpu_model,
        "Node": node,
        "Fragmentation": fragmentation,
        "Action": action,
        "Recommendations": recommendations,
        "JobEnds": job_ends,
        "Forecast": forecast,
        "IdleWindows": idle,
        "TenantDemand": tenants,
        "SnapshotResponse": _obj({"meta": _ref("Meta"), "snapshot": _ref("Snapshot")}),
        "Error": error,
        **_snapshot_schemas(),
    }


def _operation(summary: str, schema: str, parameters: list[dict] | None = None) -> dict:
    def body(name: str, description: str) -> dict:
        return {"description": description, "content": {JSON: {"schema": _ref(name)}}}

    responses = {
        "200": body(schema, "the latest results (meta.stale says whether they are current)"),
        "503": body("Error", "no successful advisor run yet"),
    }
    if parameters:
        responses["400"] = body("Error", "a query parameter has a value the route rejects")
    return {"get": {"summary": summary, "parameters": parameters or [], "responses": responses}}


def openapi_document() -> dict[str, Any]:
    """OpenAPI 3.1 (its schemas are JSON Schema 2020-12, like the snapshot schema)."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "gpu-defrag advisor API",
            "version": __version__,
            "description": "Read-only results of the advisor's latest run (docs/service.md).",
        },
        "paths": {
            "/api/snapshot": _operation(
                "The cluster model of the latest good run, in the snapshot file format",
                "SnapshotResponse",
            ),
            "/api/fragmentation": _operation(
                "Fragmentation measures: cluster, per pool, per shape, per GPU model",
                "Fragmentation",
                [
                    {
                        "name": "nodes",
                        "in": "query",
                        "required": False,
                        "description": "include the per-node table",
                        "schema": {"type": "boolean", "default": False},
                    }
                ],
            ),
            "/api/recommendations": _operation(
                "Checked plans and ranked actions (cheapest plan first)",
                "Recommendations",
                [
                    {
                        "name": "limit",
                        "in": "query",
                        "required": False,
                        "description": "return at most this many ranked actions",
                        "schema": {"type": "integer", "minimum": 0, "maximum": MAX_LIMIT},
                    }
                ],
            ),
            "/api/forecast": _operation(
                "Per-pool and per-tenant demand forecasts with intervals, idle windows, and "
                "their backtests",
                "Forecast",
            ),
            "/api/openapi.json": {
                "get": {
                    "summary": "This document",
                    "responses": {
                        "200": {
                            "description": "OpenAPI 3.1 description",
                            "content": {JSON: {"schema": {"type": "object"}}},
                        }
                    },
                }
            },
        },
        "components": {"schemas": _schemas()},
    }
