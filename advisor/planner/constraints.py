"""The rules every plan must keep, and the policy file that sets them.

Stable API:

- `Policy` — tenant quotas (GPUs, per tenant and optionally per GPU model), the restart time
  assumed where a source does not know it, and which locality rules apply.
- `load_policy(path)` / `policy_from_dict(doc)` — read a small YAML or JSON file::

      default_restart_s: 5m        # checkpoint/restart time when unknown (seconds or text)
      island_locality: true        # a task that fits in one NVLink island stays in one
      rack_locality: true          # a multi-node job in one rack stays in one rack
      allow_model_change: false    # migrate/share keep the GPU model; rebalance may change it
      quotas:                      # GPUs; a number caps the tenant, a mapping caps per model
        rnd: 64
        product: {A100: 32, H100: 16}
      priority_levels: {high: 80, medium: 50, low: 0}   # named levels (lowest priority)
      borrowing_rules:             # loans per lender -> borrower pair (`loan_rules`)
        - {lender: algorithms, borrower: rnd, max_borrowable_ratio: 0.5,
           priority_threshold: high, auto_return_timeout: 2h}
      return_policies:             # how loans go back, per trigger (`loan_rules`)
        - {trigger: original_tenant_demand, grace_period: 15m, preemption_allowed: true}
        - {trigger: timeout, force_return: true}
      borrowing:                   # or, the older form: rules per borrowing tenant
        max_borrow_ratio: 0.5      # a tenant borrows at most this fraction of its own quota
        priority_threshold: 50     # only jobs of at least this priority may borrow
        auto_return_s: 1d          # a loan goes back when the job ends or after this long
        grace_s: 10m               # then the borrower has this long to checkpoint
        preemption: true           # false: only jobs expected to end before the auto-return
        lend: true                 # the tenant lends its unused quota to others
        max_lend_gpus: 16          # optional: lends at most this many GPUs (absent = all unused)
        cohort: research           # optional: borrows from and lends to this cohort only
        tenants:                   # per-tenant overrides of any field above
          product: {lend: false}

  Neither borrowing form: no quota loans are ever proposed. Errors are `PolicyError` naming the
  field by its path, an unknown key with the closest known one
  (`borrowing_rules[0].max_borrow_ratio: unknown key (did you mean 'max_borrowable_ratio'?)`).
- `BorrowRules` / `Policy.borrow_rules(tenant)` — the per-tenant rules that apply to a tenant
  (None when the file has no `borrowing` section); `LoanRule` / `Policy.rules_for(borrower)`
  and `ReturnPolicy` — the per-pair form. Quota nobody holds (usable GPUs beyond the
  sum of quotas) is the pseudo-tenant `UNASSIGNED`, which lends like any tenant.
- Rule helpers shared by the checker and the planners (so they can never disagree):
  `spec_allows`, `node_islands`, and the NVLink-island rule every counter reads too
  (`advisor.fragmentation.nvlink`: `island_size_per_node`, `needs_one_island`, `islands_ok`).

The priority rule (never move work of higher priority than the goal's) and the migratable flag
come from the model and the goal, not from the policy file.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

# the one NVLink-island rule, re-exported for the checker and the planners
from advisor.fragmentation.nvlink import (  # noqa: F401
    island_size_per_node,
    islands_ok,
    needs_one_island,
)
from advisor.model import MILLI, ClusterModel
from advisor.planner.actions import DEFAULT_RESTART_S
from advisor.planner.loan_rules import (
    UNASSIGNED,
    LoanRule,
    PolicyError,
    ReturnPolicy,
    flag,
    loan_rules,
    mapping,
    number,
    only,
    priority,
    priority_levels,
    return_policy,
    seconds,
)
from gpu_defrag_common.config_text import load_json, load_yaml, parse_problem

ANY_MODEL = ""  # quota key for "all GPU models together"


@dataclass(frozen=True)
class BorrowRules:
    """When a tenant may borrow unused quota of others, and how the loan goes back (the
    per-tenant `borrowing:` form; `LoanRule` is the per-pair `borrowing_rules:` form)."""

    max_borrow_ratio: float = 0.5  # loan <= ratio x the borrower's own quota
    priority_threshold: int = 0  # the borrowing job's priority must be >= this
    auto_return_s: float = 86400.0  # loan returns at job end or after this long, whichever first
    grace_s: float = 600.0  # time to checkpoint after the return is due
    preemption: bool = True  # borrowed work may be preempted at return
    lend: bool = True  # this tenant lends its unused quota
    # a scheduler's lending limit (a Kueue ClusterQueue's lendingLimit); None = all unused
    max_lend_gpus: float | None = None
    # tenants lend only within one cohort (Kueue cohorts); "" = to anyone
    cohort: str = ""

    def returns(self) -> ReturnPolicy:
        """The same rules as return policies: `preemption` covers both triggers."""
        return ReturnPolicy(self.grace_s, self.preemption, self.preemption, self.grace_s)


@dataclass(frozen=True)
class Policy:
    """Rules for plans. `quotas[(tenant, model)]` caps GPUs; model "" means all models.
    Loans follow either `borrowing[tenant]` (overriding `borrowing[""]`, the default) or, per
    lender -> borrower pair, `loan_rules` with `returns`; neither = no loans at all."""

    quotas: dict[tuple[str, str], float] = field(default_factory=dict)
    default_restart_s: float = DEFAULT_RESTART_S
    island_locality: bool = True
    rack_locality: bool = True
    allow_model_change: bool = False
    borrowing: dict[str, BorrowRules] = field(default_factory=dict)
    loan_rules: tuple[LoanRule, ...] = ()
    returns: ReturnPolicy = field(default_factory=ReturnPolicy)
    priority_levels: dict[str, int] = field(default_factory=dict)

    def borrow_rules(self, tenant: str) -> BorrowRules | None:
        """The rules for `tenant`, or None when the policy has no borrowing section."""
        return self.borrowing.get(tenant, self.borrowing.get("")) if self.borrowing else None

    def rules_for(self, borrower: str) -> list[LoanRule]:
        """The `loan_rules` pairs that lend to `borrower`."""
        return [rule for rule in self.loan_rules if rule.borrower == borrower]

    @property
    def lends(self) -> bool:
        """Whether any loan may be proposed at all."""
        return bool(self.borrowing or self.loan_rules)


KEYS = (
    "quotas",
    "default_restart_s",
    "island_locality",
    "rack_locality",
    "allow_model_change",
    "priority_levels",
    "borrowing_rules",
    "return_policies",
    "borrowing",
)
BORROW_KEYS = (
    "max_borrow_ratio",
    "priority_threshold",
    "auto_return_s",
    "grace_s",
    "preemption",
    "lend",
    "max_lend_gpus",
    "cohort",
)


def policy_from_dict(doc: Any) -> Policy:
    """A Policy from parsed YAML/JSON; PolicyError names the first bad field by its path."""
    if doc is None:
        return Policy()
    if not isinstance(doc, dict):
        raise PolicyError("(top level)", f"expected a mapping, got {type(doc).__name__}")
    only(doc, KEYS, "", "a policy")
    quotas: dict[tuple[str, str], float] = {}
    raw = doc.get("quotas", {}) or {}
    if not isinstance(raw, dict):
        raise PolicyError("quotas", f"expected a mapping of tenant to GPUs, got {raw!r}")
    for tenant, limit in raw.items():
        if isinstance(limit, dict):
            for gpu_model, value in limit.items():
                quotas[(str(tenant), str(gpu_model))] = number(
                    value, f"quotas.{tenant}.{gpu_model}"
                )
        else:
            quotas[(str(tenant), ANY_MODEL)] = number(limit, f"quotas.{tenant}")
    restart = seconds(doc.get("default_restart_s", DEFAULT_RESTART_S), "default_restart_s")
    levels = priority_levels(doc.get("priority_levels"))
    if "borrowing" in doc and "borrowing_rules" in doc:
        raise PolicyError(
            "borrowing_rules",
            "give borrowing (per tenant) or borrowing_rules (per lender -> borrower), not both",
        )
    if "return_policies" in doc and "borrowing_rules" not in doc:
        raise PolicyError(
            "return_policies",
            "only borrowing_rules loans follow return policies (borrowing: uses grace_s and "
            "preemption)",
        )
    tenants = {tenant for tenant, _ in quotas}
    return Policy(
        quotas=quotas,
        default_restart_s=restart,
        island_locality=_flag(doc, "island_locality", True),
        rack_locality=_flag(doc, "rack_locality", True),
        allow_model_change=_flag(doc, "allow_model_change", False),
        borrowing=_borrowing(doc.get("borrowing"), levels),
        loan_rules=loan_rules(doc["borrowing_rules"], levels, tenants)
        if "borrowing_rules" in doc
        else (),
        returns=return_policy(doc.get("return_policies")),
        priority_levels=levels,
    )


def _flag(doc: dict[str, Any], key: str, default: bool) -> bool:
    return flag(doc.get(key, default), key)


def _rules(
    doc: Any, where: str, base: BorrowRules, extra: tuple[str, ...], levels: dict[str, int]
) -> BorrowRules:
    rules = mapping(doc, where, "a mapping")
    only(rules, BORROW_KEYS + extra, where, "borrowing")
    values: dict[str, Any] = {}
    if "max_borrow_ratio" in rules:
        values["max_borrow_ratio"] = number(rules["max_borrow_ratio"], f"{where}.max_borrow_ratio")
    for key in ("auto_return_s", "grace_s"):
        if key in rules:
            values[key] = seconds(rules[key], f"{where}.{key}")
    if "priority_threshold" in rules:
        values["priority_threshold"], _ = priority(
            rules["priority_threshold"], f"{where}.priority_threshold", levels
        )
    if "max_lend_gpus" in rules:
        values["max_lend_gpus"] = number(rules["max_lend_gpus"], f"{where}.max_lend_gpus")
    if "cohort" in rules:
        if not isinstance(rules["cohort"], str):
            raise PolicyError(f"{where}.cohort", f"expected a name, got {rules['cohort']!r}")
        values["cohort"] = rules["cohort"]
    for key in ("preemption", "lend"):
        if key in rules:
            values[key] = flag(rules[key], f"{where}.{key}")
    return replace(base, **values)


def _borrowing(doc: Any, levels: dict[str, int]) -> dict[str, BorrowRules]:
    """`borrowing:` section -> {"" : default rules, tenant: overridden rules}."""
    if doc is None:
        return {}
    default = _rules(doc, "borrowing", BorrowRules(), ("tenants",), levels)
    out = {"": default}
    tenants = doc.get("tenants", {}) or {}
    if not isinstance(tenants, dict):
        raise PolicyError(
            "borrowing.tenants", f"expected a mapping of tenant to rules, got {tenants!r}"
        )
    for tenant, rules in tenants.items():
        out[str(tenant)] = _rules(rules, f"borrowing.tenants.{tenant}", default, (), levels)
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
