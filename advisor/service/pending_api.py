"""`/api/pending`: the scheduler's queue, why each waiting job cannot start, unknown racks, and
a checked plan for the biggest blocked job (`advisor.service.scheduler`), with its OpenAPI
description. `advisor.service.api` serves it beside the other routes."""

from __future__ import annotations

from typing import Any

from advisor.service.loop import RunState, describe

_COUNT = {"type": "integer", "minimum": 0}
_GPUS = {"type": "number", "minimum": 0}
_STR_OR_NULL = {"type": ["string", "null"]}
_CAUSE = {"enum": ["rack_unknown", "scattered", "quota", None]}


def _obj(properties: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties), **extra}


def pending_doc(
    state: RunState, tenant: str | None = None, limit: int | None = None
) -> dict[str, Any]:
    """The queue (biggest first), `tenant`'s only when given, at most `limit` jobs."""
    assert state.results is not None
    doc = state.results.scheduler or {}
    jobs = [r for r in doc.get("pending_jobs", []) if tenant is None or r["tenant"] == tenant]
    return {
        "meta": describe(state),
        "scheduler": doc.get("kind"),
        "scheduler_stale": doc.get("stale"),
        "racks_from": doc.get("racks_from"),
        "notes": doc.get("notes", []),
        "nodes_rack_unknown": doc.get("nodes_rack_unknown", {}),
        "if_racks_allow": doc.get("if_racks_allow", []),
        "unschedulable": doc.get("unschedulable", []),
        "quotas": doc.get("quotas", []),
        "total_jobs": len(jobs),
        "pending_jobs": jobs if limit is None else jobs[:limit],
        "blocked_plan": doc.get("blocked_plan"),
        "blocked_plan_error": doc.get("blocked_plan_error"),
    }


def schemas() -> dict[str, Any]:
    """The route's components (the plan is the Plan schema `/api/recommendations` uses)."""
    job = _obj(
        {
            "job": {"type": "string", "description": "the gang: every task of one job"},
            "tenant": {"type": "string"},
            "priority": {"type": "integer"},
            "tasks": {**_COUNT, "description": "tasks the job needs (the gang size if declared)"},
            "tasks_seen": {**_COUNT, "description": "waiting tasks the scheduler lists now"},
            "gang_size": {
                "type": ["integer", "null"],
                "description": "the size the scheduler declares (PodGroup minMember, a Kueue "
                "workload's pods); null where none is declared",
            },
            "gpus_per_task": _GPUS,
            "gpus": _GPUS,
            "shape": {"type": "string"},
            "gpu_spec": {"type": "string"},
            "created": {"type": ["number", "null"]},
            "waiting_reason": {**_STR_OR_NULL, "description": "the scheduler's own reason"},
            "jobs_of_shape_that_fit": {
                **_COUNT,
                "description": "jobs of its shape that could start now on known racks",
            },
            "jobs_if_racks_allow": {"type": ["integer", "null"], "minimum": 0},
            "blocked_by": {
                **_CAUSE,
                "description": "why it cannot start although GPUs are free: its tenant's quota, "
                "unknown racks, or free GPUs scattered; null when its shape fits (or too few "
                "GPUs are free)",
            },
        }
    )
    unschedulable = _obj(
        {
            "shape": {"type": "string"},
            "cause": {"enum": ["rack_unknown", "scattered", "quota"]},
            "free_gpus": _COUNT,
            "jobs": {"type": "array", "items": {"type": "string"}},
        }
    )
    rack_row = _obj(
        {
            "pool": {"type": "string"},
            "shape": {"type": "string"},
            "jobs_that_fit": _COUNT,
            "jobs_if_racks_allow": _COUNT,
        }
    )
    blocked = _obj(
        {
            "job": {"type": "string"},
            "tenant": {"type": "string"},
            "shape": {"type": "string"},
            "gpus": _GPUS,
            "blocked_by": {"enum": ["rack_unknown", "scattered", "quota"]},
            "plan": {"$ref": "#/components/schemas/Plan"},
        }
    )
    return {
        "PendingJob": job,
        "Pending": _obj(
            {
                "meta": {"$ref": "#/components/schemas/Meta"},
                "scheduler": {
                    **_STR_OR_NULL,
                    "description": "the scheduler source (kubernetes, slurm, "
                    "kube-state-metrics); null for usage-only sources, which have no queue",
                },
                "scheduler_stale": {
                    **_STR_OR_NULL,
                    "description": "why the scheduler's view is an older one (a watch that "
                    "dropped); null when current",
                },
                "racks_from": _STR_OR_NULL,
                "notes": {"type": "array", "items": {"type": "string"}},
                "nodes_rack_unknown": {"type": "object", "additionalProperties": _COUNT},
                "if_racks_allow": {"type": "array", "items": rack_row},
                "unschedulable": {"type": "array", "items": unschedulable},
                "quotas": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "the quotas the plans use and where each came from",
                },
                "total_jobs": _COUNT,
                "pending_jobs": {
                    "type": "array",
                    "items": {"$ref": "#/components/schemas/PendingJob"},
                },
                "blocked_plan": {"oneOf": [blocked, {"type": "null"}]},
                "blocked_plan_error": _STR_OR_NULL,
            }
        ),
    }


def operation(operation_of: Any, limit_schema: dict[str, Any]) -> dict[str, Any]:
    """The path item, built with the API module's own `_operation`."""
    return operation_of(
        "The scheduler's queue biggest first, why each waiting job cannot start (quota, rack "
        "unknown, scattered), and a checked plan for the biggest blocked one",
        "Pending",
        [
            {
                "name": "tenant",
                "in": "query",
                "required": False,
                "description": "only this tenant's jobs",
                "schema": {"type": "string"},
            },
            {
                "name": "limit",
                "in": "query",
                "required": False,
                "description": "return at most this many jobs (the biggest)",
                "schema": limit_schema,
            },
        ],
    )
