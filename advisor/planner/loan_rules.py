"""Borrowing rules as capacity teams write them, and the checked reading of policy values.

A policy file may give quota loans per lender -> borrower pair, with named priority levels and
return policies (the form capacity teams write; `constraints.policy_from_dict` reads it)::

    priority_levels: {high: 100, medium: 50, low: 0}   # each level's lowest priority
    borrowing_rules:
      - lender: algorithms
        borrower: rnd
        max_borrowable_ratio: 0.5      # rnd holds at most 0.5 x algorithms' quota on loan
        priority_threshold: medium     # a level (or a number): only jobs at or above it
        auto_return_timeout: 2h        # the loan goes back at job end, at the latest then
    return_policies:
      - trigger: original_tenant_demand   # the lender's own work wants its quota back
        grace_period: 10m                 # the borrowed work has this long to checkpoint
        preemption_allowed: true          # then it is preempted (false: the lender waits)
      - trigger: timeout                  # auto_return_timeout passed
        force_return: true                # the borrowed work is preempted after grace_period

Times are seconds or duration text (`90`, `90s`, `10m`, `2h`, `1d`) wherever a policy takes
one. Every key is checked by its path (`borrowing_rules[1].max_borrow_ratio: unknown key (did
you mean 'max_borrowable_ratio'?); ...`), so a typo never drops a rule without a word.

- `LoanRule` — one pair; `ReturnPolicy` — how loans go back (defaults: 10 min grace,
  preemption allowed, timeouts forced).
- `PolicyError` — a bad field, named by its path (`constraints` re-exports it).
- `number`, `seconds`, `flag`, `only` — the checked readers of policy values.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpu_defrag_common.messages import unknown_key
from gpu_defrag_common.units import duration

UNASSIGNED = "(unassigned)"  # lender of the usable GPUs no tenant's quota covers


class PolicyError(ValueError):
    """The policy file is invalid; `field` names where."""

    def __init__(self, field_name: str, problem: str) -> None:
        super().__init__(f"{field_name}: {problem}")
        self.field = field_name
        self.problem = problem


# --------------------------------------------------------------------------- checked values


def number(value: Any, where: str, maximum: float = math.inf) -> float:
    """A finite number >= 0 (at most `maximum`): YAML's `.inf` (JSON's `Infinity`) is no
    quota, cost or ratio a plan can add up or print; leave a key out for no limit."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 <= value <= maximum
    ):
        bound = f" and <= {maximum:g}" if math.isfinite(maximum) else ""
        raise PolicyError(where, f"expected a finite number >= 0{bound}, got {value!r}")
    return float(value)


def seconds(value: Any, where: str) -> float:
    """A time: seconds as a number, or duration text (`90s`, `10m`, `2h`, `1d`)."""
    if isinstance(value, str):
        try:
            return duration(value)
        except argparse.ArgumentTypeError:
            raise PolicyError(
                where,
                f"expected seconds (a finite number >= 0) or a duration like 10m, 2h or 1d, "
                f"got {value!r}",
            ) from None
    try:
        return number(value, where)
    except PolicyError:
        raise PolicyError(
            where,
            f"expected seconds (a finite number >= 0) or a duration like 10m, 2h or 1d, "
            f"got {value!r}",
        ) from None


def flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise PolicyError(where, f"expected true or false, got {value!r}")
    return value


def only(doc: Mapping[str, Any], keys: Iterable[str], where: str, what: str) -> None:
    """Refuse the first key of `doc` not in `keys`, by its path."""
    known = list(keys)
    for key in doc:
        if key not in known:
            path = f"{where}.{key}" if where else str(key)
            raise PolicyError(path, unknown_key(str(key), known, what))


def mapping(value: Any, where: str, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise PolicyError(where, f"expected {what}, got {value!r}")
    return value


def listing(value: Any, where: str, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise PolicyError(where, f"expected a list of {what}, got {value!r}")
    return value


# --------------------------------------------------------------------------- rules


@dataclass(frozen=True)
class LoanRule:
    """One lender -> borrower pair of `borrowing_rules`."""

    lender: str
    borrower: str
    max_borrowable_ratio: float = 1.0  # on loan from the lender <= ratio x the lender's quota
    priority_threshold: int = 0  # the borrowing job's priority must be >= this
    priority_level: str = ""  # the level the threshold was written as ("" for a number)
    auto_return_s: float = 86400.0  # the loan goes back at job end or after this, first of both

    def threshold_text(self) -> str:
        """`medium (50)` or `50`."""
        if self.priority_level:
            return f"{self.priority_level} ({self.priority_threshold})"
        return str(self.priority_threshold)


@dataclass(frozen=True)
class ReturnPolicy:
    """How a loan goes back (`return_policies`), per trigger."""

    demand_grace_s: float = 600.0  # original_tenant_demand: time to checkpoint first
    demand_preemption: bool = True  # ... then the borrowed work is preempted (False: wait)
    timeout_force: bool = True  # timeout: the borrowed work is preempted at the auto-return
    timeout_grace_s: float = 600.0  # ... after this long to checkpoint


RULE_KEYS = (
    "lender",
    "borrower",
    "max_borrowable_ratio",
    "priority_threshold",
    "auto_return_timeout",
)
TRIGGER_KEYS = {
    "original_tenant_demand": ("trigger", "grace_period", "preemption_allowed"),
    "timeout": ("trigger", "force_return", "grace_period"),
}


def priority_levels(doc: Any) -> dict[str, int]:
    """`priority_levels:` -> {name: the lowest priority of the level}."""
    if doc is None:
        return {}
    levels = mapping(doc, "priority_levels", "a mapping of level name to priority")
    out = {}
    for name, value in levels.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise PolicyError(f"priority_levels.{name}", f"expected an integer, got {value!r}")
        out[str(name)] = value
    return out


def priority(value: Any, where: str, levels: Mapping[str, int]) -> tuple[int, str]:
    """(priority, level name or "") of a threshold written as a level name or an integer."""
    if isinstance(value, str):
        if value not in levels:
            named = ", ".join(f"{k} ({v})" for k, v in levels.items()) or "none"
            raise PolicyError(
                where, f"level {value!r} is not one of priority_levels (levels: {named})"
            )
        return levels[value], value
    if isinstance(value, bool) or not isinstance(value, int):
        raise PolicyError(where, f"expected a priority level or an integer, got {value!r}")
    return value, ""


def loan_rules(doc: Any, levels: Mapping[str, int], tenants: set[str]) -> tuple[LoanRule, ...]:
    """`borrowing_rules:` -> the pairs. `tenants` are the quota holders the file names (empty:
    quotas come from elsewhere, names are not checked): a lender or borrower outside them is
    a typo, since only a quota can be lent or stop a job."""
    rules: list[LoanRule] = []
    seen: dict[tuple[str, str], int] = {}
    for i, raw in enumerate(listing(doc, "borrowing_rules", "lender -> borrower rules")):
        where = f"borrowing_rules[{i}]"
        rule = mapping(raw, where, "a mapping (lender, borrower, ...)")
        only(rule, RULE_KEYS, where, "a borrowing rule")
        names = {}
        for key in ("lender", "borrower"):
            if key not in rule:
                raise PolicyError(f"{where}.{key}", "required field is missing")
            value = rule[key]
            if not isinstance(value, str) or not value:
                raise PolicyError(f"{where}.{key}", f"expected a tenant name, got {value!r}")
            allowed = tenants | ({UNASSIGNED} if key == "lender" else set())
            if tenants and value not in allowed:
                raise PolicyError(
                    f"{where}.{key}",
                    f"{value!r} has no quota in quotas (tenants: {', '.join(sorted(allowed))})",
                )
            names[key] = value
        pair = (names["lender"], names["borrower"])
        if pair[0] == pair[1]:
            raise PolicyError(where, f"{pair[0]!r} lends to itself")
        if pair in seen:
            raise PolicyError(
                where, f"the pair {pair[0]} -> {pair[1]} is given twice (first at [{seen[pair]}])"
            )
        seen[pair] = i
        threshold, level = priority(
            rule.get("priority_threshold", 0), f"{where}.priority_threshold", levels
        )
        rules.append(
            LoanRule(
                lender=pair[0],
                borrower=pair[1],
                max_borrowable_ratio=number(
                    rule.get("max_borrowable_ratio", 1.0), f"{where}.max_borrowable_ratio", 1.0
                ),
                priority_threshold=threshold,
                priority_level=level,
                auto_return_s=seconds(
                    rule.get("auto_return_timeout", LoanRule.auto_return_s),
                    f"{where}.auto_return_timeout",
                ),
            )
        )
    return tuple(rules)


def return_policy(doc: Any) -> ReturnPolicy:
    """`return_policies:` -> one ReturnPolicy (each trigger at most once; a trigger left out
    keeps its default)."""
    if doc is None:
        return ReturnPolicy()
    values: dict[str, Any] = {}
    seen: dict[str, int] = {}
    for i, raw in enumerate(listing(doc, "return_policies", "triggers")):
        where = f"return_policies[{i}]"
        entry = mapping(raw, where, "a mapping (trigger, ...)")
        trigger = entry.get("trigger")
        if trigger not in TRIGGER_KEYS:
            raise PolicyError(
                f"{where}.trigger",
                f"expected one of {', '.join(TRIGGER_KEYS)}, got {trigger!r}",
            )
        if trigger in seen:
            raise PolicyError(
                where, f"trigger {trigger} is given twice (first at [{seen[trigger]}])"
            )
        seen[trigger] = i
        only(entry, TRIGGER_KEYS[trigger], where, f"a {trigger} return policy")
        if trigger == "original_tenant_demand":
            if "grace_period" in entry:
                values["demand_grace_s"] = seconds(entry["grace_period"], f"{where}.grace_period")
            if "preemption_allowed" in entry:
                values["demand_preemption"] = flag(
                    entry["preemption_allowed"], f"{where}.preemption_allowed"
                )
        else:
            if "grace_period" in entry:
                values["timeout_grace_s"] = seconds(entry["grace_period"], f"{where}.grace_period")
            if "force_return" in entry:
                values["timeout_force"] = flag(entry["force_return"], f"{where}.force_return")
    return ReturnPolicy(**values)
