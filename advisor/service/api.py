"""The advisor's read-only JSON API and its OpenAPI 3.1 description.

Routes (all GET, all JSON, all carrying a `meta` freshness block):
`/api/snapshot` (the cluster model, in the snapshot file format), `/api/fragmentation`
(`?nodes=true` adds the per-node table), `/api/recommendations` (`?limit=N` bounds the ranked
actions), `/api/forecast`, `/api/job-ends` (per running job its expected end, learned or the
planner's fallback; `?tenant=`, `?node=`, `?limit=N`), `/api/pending` (the scheduler's queue,
why each waiting job cannot start, the plan for the biggest blocked one; `?tenant=`,
`?limit=N`), `/api/openapi.json` (this description),
and `/api/` (an index of these routes, also at `/api`, so the address the demo prints answers).
Before the first good run every data route answers 503 with the reason; afterwards the last good
results are served with `meta.stale` true while the source fails.

The handlers are pure functions of the loop's `RunState` and the query string (see `routes`);
`gpu_defrag_common.server.ExporterServer` serves them beside /metrics, TLS and basic auth included.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from advisor import snapshot
from advisor.forecast.job_ends import LISTED_QUANTILES
from advisor.forecast.live import MIN_COVERAGE_ORIGINS
from advisor.forecast.models import MIN_INTERVAL_ERRORS
from advisor.planner.actions import KINDS
from advisor.service import pending_api
from advisor.service import results as R
from advisor.service.loop import RunState, describe
from gpu_defrag_common import __version__
from gpu_defrag_common.server import Response, Route

JSON = "application/json"
MAX_LIMIT = 10_000
MAX_CACHED = 32  # answers kept per run and route; further distinct queries are built each time
_DIGITS = re.compile(r"[0-9]{1,6}")  # ASCII only: str.isdigit() also takes '²' and '５'
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


def _node(text: str) -> str:
    if not text:
        raise BadRequest("node='': expected a node name")
    return text


def _limit(text: str) -> int:
    if not _DIGITS.fullmatch(text.strip()) or int(text) > MAX_LIMIT:
        shown = text if len(text) <= 20 else f"{text[:20]}…"
        raise BadRequest(f"limit={shown!r}: expected a whole number 0..{MAX_LIMIT}")
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
        "pool_shapes": results.pool_shapes,
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
        "notes": recs.get("notes", []),
        "by_kind": recs.get("by_kind", {}),
        "total_actions": len(actions),
        "actions": actions if limit is None else actions[:limit],
        "plans": recs.get("plans", []),
        "job_ends": _job_ends_summary(recs.get("job_ends")),
    }


def _job_ends_summary(doc: dict[str, Any] | None) -> dict[str, Any] | None:
    """The plans' job-end document without its per-job list (`/api/job-ends` serves that)."""
    return None if doc is None else {k: v for k, v in doc.items() if k != "jobs"}


def job_ends_doc(
    state: RunState, tenant: str | None = None, node: str | None = None, limit: int | None = None
) -> dict[str, Any]:
    """Per running job its expected end as the plan stage predicted it (`job_ends.predict`'s
    `jobs`), sorted by that end; the summary fields are its document's."""
    assert state.results is not None
    recs = state.results.recommendations
    ends = recs.get("job_ends") or {}
    rows = R.job_end_rows(state.results.model, ends.get("jobs", []), tenant, node)
    by_source = {source: 0 for source in R.JOB_END_SOURCES}
    for row in rows:
        by_source[row["source"]] += 1
    return {
        "meta": describe(state),
        "stale": bool(recs.get("stale", False)),
        "error": recs.get("error") or None,
        "as_of": ends.get("as_of"),
        "source": ends.get("source"),
        "quantile": ends.get("quantile"),
        "listed_quantiles": list(LISTED_QUANTILES),
        "finished_jobs": ends.get("finished_jobs", 0),
        "min_finished": ends.get("min_finished"),
        "by": ends.get("by", []),
        "running_jobs": len(ends.get("jobs", [])),
        "total_jobs": len(rows),
        "by_source": by_source,
        "jobs": rows if limit is None else rows[:limit],
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
        document = openapi_document()
        self._openapi = _encode(document)
        self._index = _encode(index_doc(document))

    def _cached(self, state: RunState, key: tuple[str, Any], build: Callable[[], Any]) -> bytes:
        with self._lock:
            if self._cache_key is not state:
                self._cache_key, self._cache = state, {}
            body = self._cache.get(key)
        if body is None:
            body = _encode(build())
            with self._lock:
                if self._cache_key is state and len(self._cache) < MAX_CACHED:
                    self._cache[key] = body
        return body

    def _serve(
        self,
        name: str,
        query: str,
        allowed: dict[str, Callable[[str], Any]],
        build: Callable[..., dict[str, Any]],
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
        return self._serve("snapshot", query, {}, snapshot_doc)

    def fragmentation(self, query: str) -> Response:
        return self._serve("fragmentation", query, {"nodes": _boolean("nodes")}, fragmentation_doc)

    def recommendations(self, query: str) -> Response:
        return self._serve(
            "recommendations", query, {"limit": _limit}, recommendations_doc, _whole_limit
        )

    def forecast(self, query: str) -> Response:
        return self._serve("forecast", query, {}, forecast_doc)

    def job_ends(self, query: str) -> Response:
        allowed = {"tenant": str, "node": _node, "limit": _limit}
        return self._serve("job_ends", query, allowed, job_ends_doc)

    def pending(self, query: str) -> Response:
        allowed = {"tenant": str, "limit": _limit}
        return self._serve("pending", query, allowed, pending_api.pending_doc)

    def openapi(self, query: str) -> Response:
        return Response(HTTPStatus.OK, self._openapi, JSON)

    def index(self, query: str) -> Response:
        return Response(HTTPStatus.OK, self._index, JSON)

    def routes(self) -> dict[str, Route]:
        return {
            "/api": self.index,
            "/api/": self.index,
            "/api/snapshot": self.snapshot,
            "/api/fragmentation": self.fragmentation,
            "/api/recommendations": self.recommendations,
            "/api/forecast": self.forecast,
            "/api/job-ends": self.job_ends,
            "/api/pending": self.pending,
            "/api/openapi.json": self.openapi,
        }


def _whole_limit(state: RunState, params: dict[str, Any]) -> dict[str, Any]:
    """A `limit` at or above the number of actions limits nothing: dropped, so that every such
    query shares the one cached answer instead of adding its own."""
    assert state.results is not None
    total = len(state.results.recommendations.get("actions", []))
    if params.get("limit", -1) >= total:
        return {k: v for k, v in params.items() if k != "limit"}
    return params


def _error(status: HTTPStatus, message: str, state: RunState | None) -> Response:
    doc: dict[str, Any] = {"error": message}
    if state is not None:
        doc["meta"] = describe(state)
    return Response(status, _encode(doc), JSON)


# --------------------------------------------------------------------------- OpenAPI

_META_STALE = (
    "true when the whole answer is from an earlier good run: the latest run's ingest or "
    "analysis failed (source down or unreadable: source_up, source_error, last_error), or no "
    "run has succeeded yet; false when the latest run succeeded"
)
_SECTION_STALE = (
    "true when the latest good run's {stage} stage failed, so this section (and error, which "
    "says why) is the one from an earlier run while the rest of the answer is current; it "
    "says nothing about the source: while meta.stale is true the whole answer, this flag "
    "included, is the last good run's"
)
_POINT = (
    "the picked model's forecast at the horizon: the value its held-back WAPE "
    "(backtest.wape_ratio) scores; not the interval's median (quantiles['0.5'], which "
    "/metrics exports)"
)
_QUANTILES = (
    "the interval, per quantile (0.1, 0.5, 0.9; the median included): the model's forecast "
    "plus that quantile of its own recent errors at this horizon, clipped to the capacity "
    "and sorted; /metrics exports these as gpu_advisor_forecast_demand_gpus "
    "(forecast_quantile), so the dashboard's median can differ from point_gpus by the "
    "median error. The quantiles other than the median are null (and absent from /metrics) "
    f"while the model has fewer than {MIN_INTERVAL_ERRORS} known errors at the horizon: no "
    "interval (interval_reason says so)"
)
_INTERVAL_REASON = (
    "why the interval quantiles are null (too few known errors of the model at this horizon); "
    "null when the interval is served"
)
_WAPE = (
    "per model: held-back WAPE (sum of absolute errors / sum of actuals) of the picked model, "
    "of the seasonal-naive baseline and of naive; null without an observed actual. Served, not "
    "used to pick: the pick comes from the earlier origins only, so it may lose to naive here"
)
_COVERAGE = (
    "per model (the same three), per interval quantile: the share of held-back hours at or "
    "below it (nominal: the quantile), over the held-back hours with an observed actual and a "
    f"real interval (coverage_origins); null while fewer than {MIN_COVERAGE_ORIGINS} such "
    "hours remain"
)
_COVERAGE_ORIGINS = (
    "per model: the held-back hours behind coverage_ratio (an observed actual and an interval: "
    f"origins whose model had fewer than {MIN_INTERVAL_ERRORS} known errors have none)"
)
_ALLOCATED_HOURLY = (
    "mean allocated GPUs over the last complete hour (the latest observed one where it is "
    "masked): the forecast's input, not the latest run's value (/api/fragmentation has that)"
)
_CURRENT_IDLE = (
    "GPUs wholly free throughout the last complete hour: capacity minus the hour's peak of "
    "GPUs with any share allocated (the hour's low of free GPUs), not the latest run's free "
    "GPUs; null when that hour is masked"
)
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


_COUNT = {"type": "integer", "minimum": 0}
_GPUS = {"type": "number", "minimum": 0}
_STRINGS = {"type": "array", "items": {"type": "string"}}


def _by(values: dict[str, Any]) -> dict[str, Any]:
    """An object keyed by names (tenants, shapes) with one kind of value."""
    return {"type": "object", "additionalProperties": values}


def _rows(row: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": row}


def _analysis_schemas() -> dict[str, Any]:
    """The measures `/api/fragmentation` serves beside its tables (`measures.analyze`)."""
    return {
        "Cluster": _obj(
            {
                "nodes": _COUNT,
                "gpus": _COUNT,
                "allocations": _COUNT,
                "placed_allocations": _COUNT,
                "usage_samples": _COUNT,
                "usable_gpus": _COUNT,
                "unhealthy_gpus": _COUNT,
                "allocated_gpus": _GPUS,
                "owner_unknown_gpus": _COUNT,
                "pending_tasks": _COUNT,
                "nodes_rack_unknown": {
                    **_COUNT,
                    "description": "nodes whose rack no source knows (multi-node shapes count "
                    "known racks only; see jobs_if_racks_allow)",
                },
                "racks_from": {
                    **_STR_OR_NULL,
                    "description": "where the racks came from (a node label, Slurm's topology); "
                    "null: no rack is known",
                },
            }
        ),
        "Spatial": _obj(
            {
                "free_gpus": _COUNT,
                "free_capacity_gpus": _GPUS,
                "partial_free_gpus": _GPUS,
                "stranded_gpus_by_host": _COUNT,
                "host_need_per_gpu": _obj({"cpu_milli": _GPUS, "memory_mib": _GPUS}),
                "shapes": _rows(
                    _obj(
                        {
                            "shape": {"type": "string"},
                            "gpus_per_job": _GPUS,
                            "jobs_that_fit": {
                                **_COUNT,
                                "description": "jobs that surely fit now; a multi-node shape "
                                "counts nodes of known racks only",
                            },
                            "jobs_if_racks_allow": {
                                "type": ["integer", "null"],
                                "minimum": 0,
                                "description": "jobs that would fit if the nodes of unknown "
                                "rack shared a rack; null where no unknown rack decides it",
                            },
                            "blocked_by": {
                                "enum": ["rack_unknown", "scattered", None],
                                "description": "why no job of the shape can start although a "
                                "pool has enough free GPUs; null when one can, or too few are "
                                "free",
                            },
                            "stranded_gpus": {"type": ["integer", "null"]},
                            "crosses_nvlink_islands": {
                                "type": "array",
                                "description": "per GPU model on whose nodes a job of the "
                                "shape that fits spans NVLink islands: the estimate of the "
                                "slowdown and its source (advisor.fragmentation.nvlink)",
                                "items": {"type": "object"},
                            },
                        }
                    )
                ),
                "largest_job": _obj(
                    {
                        "single_node_gpus": _COUNT,
                        "nvlink_group_gpus": {"type": ["integer", "null"], "minimum": 0},
                        "multi_node_gpus_in_rack": {"type": ["integer", "null"], "minimum": 0},
                        "fraction_gpu": _GPUS,
                    }
                ),
            }
        ),
        "Temporal": _obj(
            {
                "threshold": {"type": "number", "minimum": 0, "maximum": 1},
                "window_s": _GPUS,
                "allocated_idle_gpus": _COUNT,
                "allocated_gpus": _COUNT,
                "idle_gpus_by_tenant": _by(_GPUS),
            }
        ),
        "TypeFragmentation": _obj(
            {
                "capacity": _rows(
                    _obj(
                        {
                            "gpu_model": {"type": "string"},
                            "gpus": _COUNT,
                            "usable_gpus": _COUNT,
                            "free_gpus": _COUNT,
                            "free_capacity_gpus": _GPUS,
                            "allocated_gpus": _GPUS,
                        }
                    )
                ),
                "demand": _rows(
                    _obj(
                        {
                            "gpu_spec": {"type": "string"},
                            "pending_tasks": _COUNT,
                            "pending_gpus": _GPUS,
                            "free_capacity_gpus": _GPUS,
                            "shortfall_gpus": _GPUS,
                        }
                    )
                ),
            }
        ),
        "Memory": _obj(
            {
                "min_request_bytes": _GPUS,
                "stranded_memory_bytes": _GPUS,
                "gpus_with_stranded_memory": _COUNT,
            }
        ),
    }


def _plan_schemas() -> dict[str, Any]:
    """A plan in the `gpu-defrag plan --json` form (`advisor.planner.actions.Plan.to_dict`)."""
    gpu_set = _obj(
        {
            "node": {"type": "string"},
            "gpus": {"type": "array", "items": _COUNT},
            "milli": {"type": "integer", "minimum": 1, "maximum": 1000},
            "mig_profile": {
                "type": "string",
                "description": "a share target's MIG instance profile (e.g. 1g.10gb); absent "
                "for a plain GPU share",
            },
            "limit_milli": {
                "type": "integer",
                "minimum": 1,
                "maximum": 1000,
                "description": "a plain share target's limit: milli-GPU the task may use when "
                "the GPU has room (milli is what it is guaranteed); absent: held to milli",
            },
        },
        required=["node", "gpus", "milli"],
    )
    measures = _obj(
        {
            "free_gpus": _COUNT,
            "free_nodes": _COUNT,
            "largest_free_nvlink_group": {
                "type": ["integer", "null"],
                "minimum": 0,
                "description": "most free GPUs in one NVLink island; null: no node's islands "
                "are known",
            },
            "fgd_fragment_gpus": _GPUS,
            "fgd_fragment_rate": _GPUS,
            "jobs_that_fit": _by(_COUNT),
        },
        required=[],
        description="fragmentation measures of the model before or after the plan (empty "
        "for some infeasible plans)",
    )
    action = _obj(
        {
            "kind": {"type": "string", "enum": list(KINDS)},
            "alloc": {"type": "string"},
            "job": {"type": "string"},
            "tenant": {"type": "string"},
            "from": {"oneOf": [_ref("GpuSet"), {"type": "null"}]},
            "to": {"oneOf": [_ref("GpuSet"), {"type": "null"}]},
            "priority": {"type": ["integer", "null"]},
            "rack_local": {"type": "boolean"},
            "quota": _rows(
                {
                    "type": "array",
                    "description": '[tenant, GPU model or "", change in GPUs]',
                    "prefixItems": [{"type": "string"}, {"type": "string"}, {"type": "number"}],
                    "items": False,
                    "minItems": 3,
                }
            ),
            "reason": {"type": "string"},
            "cost": _ref("Cost"),
        }
    )
    plan = _obj(
        {
            "goal": {"type": "string"},
            "feasible": {"type": "boolean"},
            "reason": {"type": "string"},
            "method": {"type": "string"},
            "actions": _rows(_ref("PlanAction")),
            "cost": _ref("Cost"),
            "before": _ref("PlanMeasures"),
            "after": _ref("PlanMeasures"),
            "benefit": {"oneOf": [_ref("Benefit"), {"type": "null"}]},
            "goal_priority": {"type": ["integer", "null"]},
            "elapsed_s": _GPUS,
            "checked": {"type": "boolean"},
            "waiting_job": {
                "type": "string",
                "description": 'the waiting job the plan would start ("" none)',
            },
            "window": _ref("Window"),
        },
        required=[
            "goal",
            "feasible",
            "reason",
            "method",
            "actions",
            "cost",
            "before",
            "after",
            "benefit",
        ],
        additionalProperties=True,
        description="Besides these, each kind adds its own details (reserve: start_at, "
        "schedule, release, ends_from, ...; borrow: return; reclaim: waste, protected; "
        "docs/recommendations.md).",
    )
    pair = {"type": ["array", "null"], "items": _NUM_OR_NULL, "minItems": 2, "maxItems": 2}
    window = _obj(
        {
            "when": {"type": "string", "enum": ["now", "window"]},
            "at": {"type": "number", "description": "unix time to act"},
            "reason": {"type": "string"},
            "forecast": {"type": "boolean", "description": "a served demand forecast said so"},
            "demand_gpus": _NUM_OR_NULL,
            "demand_interval": {**pair, "description": "forecast P10, P90 at the window"},
            "capacity_gpus": _NUM_OR_NULL,
            "saving_gpu_hours": {"type": "number"},
            "saving_interval": {**pair, "description": "saving at the P90 and P10 demand"},
        },
        description="When to act on a plan: now, or at the forecast's low-demand hour where "
        'its moves and holds cost least (docs/recommendations.md, "When to act").',
    )
    return {
        "Plan": plan,
        "Window": window,
        "PlanAction": action,
        "PlanMeasures": measures,
        "GpuSet": gpu_set,
        "Cost": _obj(
            {
                "restarts": _COUNT,
                "restart_s": _GPUS,
                "gpu_hours": _GPUS,
                "idle_gpu_hours": _GPUS,
                "jobs": _STRINGS,
                "tenants": _STRINGS,
            }
        ),
        "Benefit": _obj(
            {
                "shapes_before": _by(_COUNT),
                "shapes_after": _by(_COUNT),
                "newly_schedulable": _STRINGS,
                "more_jobs_fit": _STRINGS,
                "fragmentation_before": _by({"type": "number"}),
                "fragmentation_after": _by({"type": "number"}),
            }
        ),
    }


def _schemas() -> dict[str, Any]:
    count = _COUNT
    gpus = _GPUS
    meta = _obj(
        {
            "source": {"type": "string"},
            "stale": {"type": "boolean", "description": _META_STALE},
            "source_up": {"type": "boolean"},
            "source_error": _STR_OR_NULL,
            "last_error": _STR_OR_NULL,
            "observed_at": _NUM_OR_NULL,
            "last_success_timestamp": _NUM_OR_NULL,
            "runs": count,
            "source_left_out": {
                "type": "array",
                "items": {"type": "string"},
                "description": "GPU exporters the source knows but could not read when the "
                "served fleet was read (a Prometheus target down, or its GPU backend down): "
                "their nodes are not in any figure. Empty for a whole fleet.",
            },
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
            "owner_unknown_gpus": {
                **count,
                "description": "GPUs in use (busy or holding memory) that no allocation names: "
                "allocated, their owner unknown",
            },
            "allocated_idle_power_watts": {
                "type": ["number", "null"],
                "minimum": 0,
                "description": "power drawn by the pool's allocated-but-idle GPUs; null where "
                "none of them has a power reading",
            },
            "stranded_memory_bytes": gpus,
        }
    )
    shape = _obj(
        {
            "shape": {"type": "string"},
            "gpus_per_job": gpus,
            "schedulable_jobs": count,
            "stranded_gpus": {"type": ["integer", "null"]},
            "crosses_nvlink_islands": {
                "type": "array",
                "items": {"type": "object"},
                "description": "per GPU model on whose nodes a job of the shape that fits "
                "spans NVLink islands (larger than an island): the estimated slowdown and where "
                "it comes from; empty when every such job fits in one island",
            },
        }
    )
    pool_shape = _obj(
        {
            "pool": {"type": "string"},
            "shape": {"type": "string"},
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
            "cluster": _ref("Cluster"),
            "spatial": _ref("Spatial"),
            "temporal": _ref("Temporal"),
            "type": _ref("TypeFragmentation"),
            "memory": _ref("Memory"),
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
            "pool_shapes": {"type": "array", "items": _ref("PoolShape")},
            "gpu_models": {"type": "array", "items": _ref("GpuModel")},
            "nodes": {"type": "array", "items": _ref("Node")},
        },
        required=[
            "meta",
            "source",
            "timestamp",
            "cluster",
            "spatial",
            "temporal",
            "type",
            "memory",
            "fgd",
            "pools",
            "shapes",
            "pool_shapes",
            "gpu_models",
        ],
    )
    action = _obj(
        {
            "rank": {"type": "integer", "minimum": 1},
            "goal": {"type": "string"},
            "kind": {"type": "string", "enum": list(KINDS)},
            "alloc": {"type": "string"},
            "job": {"type": "string"},
            "tenant": {"type": "string"},
            "source": {"type": "string"},
            "target": {"type": "string"},
            "summary": {"type": "string"},
            "cost_gpu_hours": gpus,
            "cost_idle_gpu_hours": gpus,
            "restarts": count,
            "benefit_gpus": gpus,
        }
    )
    recommendations = _obj(
        {
            "meta": _ref("Meta"),
            "method": {"type": "string"},
            "stale": {"type": "boolean", "description": _SECTION_STALE.format(stage="plan")},
            "error": _STR_OR_NULL,
            "goals": {"type": "array", "items": {"type": "string"}},
            "notes": {
                "type": "array",
                "items": {"type": "string"},
                "description": "per recommendation kind with nothing to recommend, why "
                "(`KIND: reason`, with the numbers)",
            },
            "by_kind": {"type": "object", "additionalProperties": count},
            "total_actions": count,
            "actions": {"type": "array", "items": _ref("Action")},
            "plans": _rows(_ref("Plan")),
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
            "as_of": {**_NUM_OR_NULL, "description": "the model's time the ends are from"},
        },
        description="Where the plans' job ends came from: `source` as the reservations' "
        "reasons name it, the finished jobs learned from, and the running jobs given a "
        "learned end (docs/recommendations.md); /api/job-ends lists the jobs one by one.",
    )
    running_job_end = _obj(
        {
            "job": {"type": "string"},
            "tenant": {"type": "string"},
            "gpus": {**gpus, "description": "the GPU share its placed tasks hold, summed"},
            "nodes": {
                "type": "array",
                "description": "per node it runs on, the device indices of the GPUs its tasks "
                "hold there",
                "items": _obj({"node": {"type": "string"}, "gpus": _rows(count)}),
            },
            "allocations": {**_STRINGS, "description": "its tasks (pods): the planner's unit"},
            "start": {
                **_NUM_OR_NULL,
                "description": "Unix seconds: the earliest start the source gives, or the one "
                "the service observed (it appeared between two looks); null when unknown",
            },
            "elapsed_h": {**_NUM_OR_NULL, "description": "hours from start to as_of"},
            "source": {
                "type": "string",
                "enum": list(R.JOB_END_SOURCES),
                "description": "learned: from similar_jobs finished jobs that outlived its "
                "elapsed time (end is their P50, end_p90 their P90); prior: the duration prior's "
                "mean remaining time, one value; known: the source's deletion time, one value; "
                "none: nothing to predict from (no known start), end null",
            },
            "end": {
                **_NUM_OR_NULL,
                "description": "Unix seconds, at or after as_of: the expected end, the median "
                "(P50) where learned, else the one value the prior or the source gives; null "
                "for source none (reason says why)",
            },
            "end_p90": {
                **_NUM_OR_NULL,
                "description": "Unix seconds: the learned P90, at or after end; null where the "
                "source gives one value (prior, known) or none",
            },
            "planned_end": {
                **_NUM_OR_NULL,
                "description": "Unix seconds: the end the reservations plan on (the learned "
                "`quantile` of the remaining time, else the planner's fallback, which for a job "
                "without a known start is the prior's mean from as_of)",
            },
            "similar_jobs": {
                "type": ["integer", "null"],
                "minimum": 0,
                "description": "finished jobs the learned end comes from (those that ran "
                "longer than its elapsed time); null unless learned",
            },
            "basis": {
                "type": ["string", "null"],
                "enum": ["group", "all", None],
                "description": "group: finished jobs of its own tenant and GPU count (by); "
                "all: all finished jobs; null unless learned",
            },
            "reason": {
                **_STR_OR_NULL,
                "description": "why the end is not learned and what it is instead; null when "
                "learned",
            },
        },
        description="One running job (tasks grouped by tenant and job) and when it is likely "
        "to end.",
    )
    job_end_list = _obj(
        {
            "meta": _ref("Meta"),
            "stale": {"type": "boolean", "description": _SECTION_STALE.format(stage="plan")},
            "error": _STR_OR_NULL,
            "as_of": {
                **_NUM_OR_NULL,
                "description": "Unix seconds: the model's time the ends were predicted at; "
                "null when the plan stage has not run",
            },
            "source": {
                **_STR_OR_NULL,
                "description": "the job-end source the reservations' reasons name",
            },
            "quantile": {
                "type": ["number", "null"],
                "description": "the quantile of the remaining time planned_end is, where learned",
            },
            "listed_quantiles": {
                "type": "array",
                "items": {"type": "number"},
                "description": "the quantiles end and end_p90 are, where learned",
            },
            "finished_jobs": {**count, "description": "finished jobs seen, learned from"},
            "min_finished": {
                "type": ["integer", "null"],
                "description": "finished jobs needed before any end is learned",
            },
            "by": {**_STRINGS, "description": "what similar means: the same values of these"},
            "running_jobs": {**count, "description": "running jobs, before the filters"},
            "total_jobs": {**count, "description": "jobs matching the filters, before limit"},
            "by_source": {
                **_obj({source: count for source in R.JOB_END_SOURCES}),
                "description": "the matching jobs per end source",
            },
            "jobs": {
                **_rows(_ref("RunningJobEnd")),
                "description": "sorted by end (jobs without one last), then planned_end",
            },
        },
        description="Per running job, when it is likely to end: learned from the jobs the "
        "service saw finish, else the planner's fallback (docs/recommendations.md, \"Job ends "
        'in the service"). Its measured error is offline: python bench/job_ends.py '
        "(docs/service.md).",
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
                    "point_gpus": {**gpus, "description": _POINT},
                    "quantiles": {
                        **_by({"type": ["number", "null"], "minimum": 0}),
                        "description": _QUANTILES,
                    },
                    "interval_reason": {**_STR_OR_NULL, "description": _INTERVAL_REASON},
                    "backtest": _obj(
                        {
                            "selection_origins": count,
                            "test_origins": count,
                            "wape_ratio": {
                                "type": "object",
                                "description": _WAPE,
                                "additionalProperties": _NUM_OR_NULL,
                            },
                            "coverage_ratio": {
                                "type": "object",
                                "description": _COVERAGE,
                                "additionalProperties": {
                                    "type": "object",
                                    "additionalProperties": ratio,
                                },
                            },
                            "coverage_origins": {
                                "type": "object",
                                "description": _COVERAGE_ORIGINS,
                                "additionalProperties": count,
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
                        "current_idle_gpus": {**_NUM_OR_NULL, "description": _CURRENT_IDLE},
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
                        "current_idle_gpus": {**_NUM_OR_NULL, "description": _CURRENT_IDLE},
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
                        "allocated_gpus": {**_NUM_OR_NULL, "description": _ALLOCATED_HOURLY},
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
            "stale": {"type": "boolean", "description": _SECTION_STALE.format(stage="forecast")},
            "error": _STR_OR_NULL,
            **demand_head,
            "pools": {
                "type": "array",
                "items": _obj(
                    {
                        "pool": {"type": "string"},
                        "capacity_gpus": _NUM_OR_NULL,
                        "allocated_gpus": {**_NUM_OR_NULL, "description": _ALLOCATED_HOURLY},
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
        "PoolShape": pool_shape,
        "GpuModel": gpu_model,
        "Node": node,
        "Fragmentation": fragmentation,
        "Action": action,
        "Recommendations": recommendations,
        "JobEnds": job_ends,
        "JobEndList": job_end_list,
        "RunningJobEnd": running_job_end,
        "Forecast": forecast,
        "IdleWindows": idle,
        "TenantDemand": tenants,
        "SnapshotResponse": _obj({"meta": _ref("Meta"), "snapshot": _ref("Snapshot")}),
        "Error": error,
        "Index": _obj(
            {
                "title": {"type": "string"},
                "version": {"type": "string"},
                "openapi": {"type": "string"},
                "routes": {"type": "object", "additionalProperties": {"type": "string"}},
            },
            additionalProperties=False,
        ),
        **_analysis_schemas(),
        **_plan_schemas(),
        **pending_api.schemas(),
        **_snapshot_schemas(),
    }


def _body(name: str, description: str) -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": _ref(name)}}}


def _error_responses() -> dict[str, Any]:
    """What gpu_defrag_common.server answers under /api/ besides the routes' own answers, all with the
    Error schema: 404 for a path not listed here, 405 for a method other than GET and HEAD,
    500 for a route that failed."""
    not_allowed = _body("Error", "a method other than GET or HEAD")
    not_allowed["headers"] = {
        "Allow": {"description": "always `GET, HEAD`", "schema": {"const": "GET, HEAD"}}
    }
    return {
        "NotFound": _body("Error", "no such path under /api/"),
        "MethodNotAllowed": not_allowed,
        "InternalError": _body("Error", "the route failed (logged by the service)"),
    }


def _operation(summary: str, schema: str, parameters: list[dict] | None = None) -> dict:
    responses = {
        "200": _body(schema, "the latest results (meta.stale says whether they are current)"),
        "503": _body("Error", "no successful advisor run yet"),
        "500": {"$ref": "#/components/responses/InternalError"},
    }
    if parameters:
        responses["400"] = _body("Error", "a query parameter has a value the route rejects")
    return {"get": {"summary": summary, "parameters": parameters or [], "responses": responses}}


def index_doc(document: dict[str, Any]) -> dict[str, Any]:
    """What `/api/` answers: every route with its summary, from the OpenAPI document."""
    return {
        "title": document["info"]["title"],
        "version": document["info"]["version"],
        "openapi": "/api/openapi.json",
        "routes": {path: item["get"]["summary"] for path, item in document["paths"].items()},
    }


def openapi_document() -> dict[str, Any]:
    """OpenAPI 3.1 (its schemas are JSON Schema 2020-12, like the snapshot schema)."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "gpu-defrag advisor API",
            "version": __version__,
            "description": "Read-only results of the advisor's latest run (docs/service.md). "
            "A path under /api/ not listed here answers 404, a method other than GET and HEAD "
            "405 with `Allow: GET, HEAD`, a failing route 500; all three with the Error schema "
            "(components.responses).",
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
            "/api/job-ends": _operation(
                "Per running job: expected end (P50, P90 where learned), planned end and "
                "where it comes from, soonest first",
                "JobEndList",
                [
                    {
                        "name": "tenant",
                        "in": "query",
                        "required": False,
                        "description": "only this tenant's jobs",
                        "schema": {"type": "string"},
                    },
                    {
                        "name": "node",
                        "in": "query",
                        "required": False,
                        "description": "only the jobs with a task on this node",
                        "schema": {"type": "string", "minLength": 1},
                    },
                    {
                        "name": "limit",
                        "in": "query",
                        "required": False,
                        "description": "return at most this many jobs (the soonest ends)",
                        "schema": {"type": "integer", "minimum": 0, "maximum": MAX_LIMIT},
                    },
                ],
            ),
            "/api/pending": pending_api.operation(
                _operation, {"type": "integer", "minimum": 0, "maximum": MAX_LIMIT}
            ),
            "/api/": {
                "get": {
                    "summary": "This index: every route with its summary (also at /api)",
                    "responses": {
                        "200": {
                            "description": "the routes",
                            "content": {JSON: {"schema": _ref("Index")}},
                        },
                        "500": {"$ref": "#/components/responses/InternalError"},
                    },
                }
            },
            "/api/openapi.json": {
                "get": {
                    "summary": "This document",
                    "responses": {
                        "200": {
                            "description": "OpenAPI 3.1 description",
                            "content": {JSON: {"schema": {"type": "object"}}},
                        },
                        "500": {"$ref": "#/components/responses/InternalError"},
                    },
                }
            },
        },
        "components": {"schemas": _schemas(), "responses": _error_responses()},
    }
