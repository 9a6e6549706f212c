"""The rules every plan must keep, and the policy file that sets them.

Stable API:

- `Policy` — tenant quotas (GPUs, per tenant and optionally per GPU model), the restart time
  assumed where a source does not know it, and which locality rules apply.
- `load_policy(path)` / `policy_from_dict(doc)` — read a small YAML or JSON file::

      default_restart_s: 300       # checkpoint/restart seconds when unknown
      island_locality: true        # a task that fits in one NVLink island stays in one
      rack_locality: true          # a multi-node job in one rack stays in one rack
      allow_model_change: false    # migrate/share keep the GPU model; rebalance may change it
      quotas:                      # GPUs; a number caps the tenant, a mapping caps per model
        rnd: 64
        product: {A100: 32, H100: 16}
      borrowing:                   # optional; absent = no quota loans are ever proposed
        max_borrow_ratio: 0.5      # a tenant borrows at most this fraction of its own quota
        priority_threshold: 50     # only jobs of at least this priority may borrow
        auto_return_s: 86400       # a loan goes back when the job ends or after this long
        grace_s: 600               # then the borrower has this long to checkpoint
        preemption: true           # false: only jobs expected to end before the auto-return
        lend: true                 # the tenant lends its unused quota to others
        tenants:                   # per-tenant overrides of any field above
          product: {lend: false}

  Errors are `PolicyError` naming the field (`quotas.product.A100: expected a number >= 0`).
- `BorrowRules` / `Policy.borrow_rules(tenant)` — the borrowing rules that apply to a tenant
  (None when the file has no `borrowing` section). Quota nobody holds (usable GPUs beyond the
  sum of quotas) is the pseudo-tenant `UNASSIGNED`, which lends like any tenant.
- Rule helpers shared by the checker and the planners (so they can never disagree):
  `spec_allows`, `island_size_per_node`, `islands_ok`, `node_islands`.

The priority rule (never move work of higher priority than the goal's) and the migratable flag
come from the model and the goal, not from the policy file.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from advisor.model import MILLI, UNKNOWN_ISLAND, ClusterModel
from advisor.planner.actions import DEFAULT_RESTART_S
from gpu_defrag_common.config_text import load_json, load_yaml, parse_problem

ANY_MODEL = ""  # quota key for "all GPU models together"
UNASSIGNED = "(unassigned)"  # lender of the usable GPUs no tenant's quota covers


class PolicyError(ValueError):
    """The policy file is invalid; `field` names where."""

    def __init__(self, field_name: str, problem: str) -> None:
        super().__init__(f"{field_name}: {problem}")
        self.field = field_name
        self.problem = problem


@dataclass(frozen=True)
class BorrowRules:
    """When a tenant may borrow unused quota of others, and how the loan goes back."""

    max_borrow_ratio: float = 0.5  # loan <= ratio x the borrower's own quota
    priority_threshold: int = 0  # the borrowing job's priority must be >= this
    auto_return_s: float = 86400.0  # loan returns at job end or after this long, whichever first
    grace_s: float = 600.0  # time to checkpoint after the return is due
    preemption: bool = True  # borrowed work may be preempted at return
    lend: bool = True  # this tenant lends its unused quota


@dataclass(frozen=True)
class Policy:
    """Rules for plans. `quotas[(tenant, model)]` caps GPUs; model "" means all models.
    `borrowing[tenant]` overrides `borrowing[""]` (the default); empty = no loans at all."""

    quotas: dict[tuple[str, str], float] = field(default_factory=dict)
    default_restart_s: float = DEFAULT_RESTART_S
    island_locality: bool = True
    rack_locality: bool = True
    allow_model_change: bool = False
    borrowing: dict[str, BorrowRules] = field(default_factory=dict)

    def borrow_rules(self, tenant: str) -> BorrowRules | None:
        """The rules for `tenant`, or None when the policy has no borrowing section."""
        return self.borrowing.get(tenant, self.borrowing.get("")) if self.borrowing else None


_KEYS = {
    "quotas",
    "default_restart_s",
    "island_locality",
    "rack_locality",
    "allow_model_change",
    "borrowing",
}
_BORROW_KEYS = {
    "max_borrow_ratio",
    "priority_threshold",
    "auto_return_s",
    "grace_s",
    "preemption",
    "lend",
}


def _number(value: Any, where: str) -> float:
    """A finite number >= 0: YAML's `.inf` (JSON's `Infinity`) is no quota, cost or ratio a plan
    can add up or print; leave a key out for no limit."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        raise PolicyError(where, f"expected a finite number >= 0, got {value!r}")
    return float(value)


def _flag(doc: dict[str, Any], key: str, default: bool) -> bool:
    value = doc.get(key, default)
    if not isinstance(value, bool):
        raise PolicyError(key, f"expected true or false, got {value!r}")
    return value


def policy_from_dict(doc: Any) -> Policy:
    """A Policy from parsed YAML/JSON; PolicyError names the first bad field."""
    if doc is None:
        return Policy()
    if not isinstance(doc, dict):
        raise PolicyError("(top level)", f"expected a mapping, got {type(doc).__name__}")
    unknown = sorted(set(doc) - _KEYS)
    if unknown:
        raise PolicyError(unknown[0], f"unknown key; known keys: {', '.join(sorted(_KEYS))}")
    quotas: dict[tuple[str, str], float] = {}
    raw = doc.get("quotas", {}) or {}
    if not isinstance(raw, dict):
        raise PolicyError("quotas", f"expected a mapping of tenant to GPUs, got {raw!r}")
    for tenant, limit in raw.items():
        if isinstance(limit, dict):
            for gpu_model, value in limit.items():
                quotas[(str(tenant), str(gpu_model))] = _number(
                    value, f"quotas.{tenant}.{gpu_model}"
                )
        else:
            quotas[(str(tenant), ANY_MODEL)] = _number(limit, f"quotas.{tenant}")
    restart = _number(doc.get("default_restart_s", DEFAULT_RESTART_S), "default_restart_s")
    return Policy(
        quotas=quotas,
        default_restart_s=restart,
        island_locality=_flag(doc, "island_locality", True),
        rack_locality=_flag(doc, "rack_locality", True),
        allow_model_change=_flag(doc, "allow_model_change", False),
        borrowing=_borrowing(doc.get("borrowing")),
    )


def _rules(doc: Any, where: str, base: BorrowRules, extra: frozenset[str]) -> BorrowRules:
    if not isinstance(doc, dict):
        raise PolicyError(where, f"expected a mapping, got {doc!r}")
    unknown = sorted(set(doc) - _BORROW_KEYS - extra)
    if unknown:
        raise PolicyError(
            f"{where}.{unknown[0]}", f"unknown key; known keys: {', '.join(sorted(_BORROW_KEYS))}"
        )
    values: dict[str, Any] = {}
    for key in ("max_borrow_ratio", "auto_return_s", "grace_s"):
        if key in doc:
            values[key] = _number(doc[key], f"{where}.{key}")
    if "priority_threshold" in doc:
        value = doc["priority_threshold"]
        if isinstance(value, bool) or not isinstance(value, int):
            raise PolicyError(f"{where}.priority_threshold", f"expected an integer, got {value!r}")
        values["priority_threshold"] = value
    for key in ("preemption", "lend"):
        if key in doc:
            if not isinstance(doc[key], bool):
                raise PolicyError(f"{where}.{key}", f"expected true or false, got {doc[key]!r}")
            values[key] = doc[key]
    return replace(base, **values)


def _borrowing(doc: Any) -> dict[str, BorrowRules]:
    """`borrowing:` section -> {"" : default rules, tenant: overridden rules}."""
    if doc is None:
        return {}
    default = _rules(doc, "borrowing", BorrowRules(), frozenset({"tenants"}))
    out = {"": default}
    tenants = doc.get("tenants", {}) or {}
    if not isinstance(tenants, dict):
        raise PolicyError(
            "borrowing.tenants", f"expected a mapping of tenant to rules, got {tenants!r}"
        )
    for tenant, rules in tenants.items():
        out[str(tenant)] = _rules(rules, f"borrowing.tenants.{tenant}", default, frozenset())
    return out


def load_policy(path: str | Path) -> Policy:
    """Read a policy file (.yaml/.yml or .json); errors name the file and the field."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise PolicyError(str(path), f"cannot read: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise PolicyError(str(path), "not UTF-8 text") from None
    try:
        yaml_file = path.suffix.lower() in (".yaml", ".yml")
        doc = load_yaml(text) if yaml_file else load_json(text)
    except Exception as error:  # any parse error becomes one line
        kind = path.suffix.lstrip(".") or "JSON"
        raise PolicyError(str(path), f"not valid {kind}: {parse_problem(error)}") from None
    try:
        return policy_from_dict(doc)
    except PolicyError as error:
        raise PolicyError(f"{path}: {error.field}", error.problem) from None


# --------------------------------------------------------------------------- rule helpers


def usage_by_scope(model: ClusterModel) -> dict[tuple[str, str], float]:
    """GPUs held per (tenant, scope), scope "" = all models: what quotas are checked against
    (the checker's starting use, borrowing's shortfalls, a goal job's quota)."""
    allocs = model.allocations
    placed = allocs.node >= 0
    share = (allocs.num_gpu * allocs.gpu_milli / MILLI)[placed]
    out: dict[tuple[str, str], float] = defaultdict(float)
    if not placed.any():
        return out
    tenants, t = np.unique(allocs.tenant[placed].astype(str), return_inverse=True)
    models, m = np.unique(
        model.nodes.gpu_model[allocs.node[placed]].astype(str), return_inverse=True
    )
    for i, total in enumerate(np.bincount(t, weights=share, minlength=len(tenants)).tolist()):
        out[(str(tenants[i]), ANY_MODEL)] += total
    pair = np.bincount(t * len(models) + m, weights=share, minlength=len(tenants) * len(models))
    for k in np.flatnonzero(np.bincount(t * len(models) + m, minlength=len(pair))).tolist():
        out[(str(tenants[k // len(models)]), str(models[k % len(models)]))] += float(pair[k])
    return out


def unassigned_quota(
    model: ClusterModel,
    quotas: dict[tuple[str, str], float],
    scope: str,
    usage: dict[tuple[str, str], float],
) -> tuple[float, float]:
    """(quota, use) of the pseudo-tenant UNASSIGNED in `scope`: the usable GPUs the tenants'
    quotas leave over (or the policy's own number for it), and what tenants without a quota in
    that scope hold, which comes out of it. The checker lends from it and borrowing offers its
    spare, so both read it here."""
    holders = {t for (t, s) in quotas if s == scope}
    if (UNASSIGNED, scope) in quotas:
        limit = float(quotas[(UNASSIGNED, scope)])
    else:
        gpu_model = model.nodes.gpu_model[model.gpus.node]
        on = model.gpu_usable if scope == ANY_MODEL else model.gpu_usable & (gpu_model == scope)
        assigned = sum(v for (t, s), v in quotas.items() if s == scope)
        limit = max(0.0, float(on.sum()) - assigned)
    used = sum(v for (t, s), v in usage.items() if s == scope and t not in holders)
    return limit, float(used)


def node_islands(model: ClusterModel, node: int) -> np.ndarray:
    """int32 island id per GPU of `node` (in GPU-row order), -1 where unknown."""
    start, stop = model.nodes.gpu_offset[node], model.nodes.gpu_offset[node + 1]
    return model.gpus.nvlink_island[start:stop]


def island_size_per_node(model: ClusterModel) -> np.ndarray:
    """int64 (N): GPUs in the largest NVLink island of each node; 0 where islands are unknown
    on any of its GPUs (then no island rule applies)."""
    gpus = model.gpus
    n = len(model.nodes)
    out = np.zeros(n, dtype=np.int64)
    if not len(gpus):
        return out
    unknown = np.bincount(
        gpus.node, weights=(gpus.nvlink_island == UNKNOWN_ISLAND).astype(float), minlength=n
    )
    known = gpus.nvlink_island != UNKNOWN_ISLAND
    keys = gpus.node[known].astype(np.int64) * 65536 + gpus.nvlink_island[known]
    unique, counts = np.unique(keys, return_counts=True)
    np.maximum.at(out, unique // 65536, counts)
    out[unknown > 0] = 0
    return out


def islands_ok(islands: np.ndarray, island_size: int) -> bool:
    """A task on GPUs with these island ids keeps NVLink locality: if it fits in one island of
    its node (`island_size`, 0 = unknown) it must sit in one island."""
    if len(islands) <= 1 or island_size <= 0 or len(islands) > island_size:
        return True
    return bool(np.all(islands == islands[0]))
