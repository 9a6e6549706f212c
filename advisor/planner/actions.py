"""What a plan is made of: actions with their cost and benefit, and their JSON form.

Stable API (other recommendation kinds build on it):

- `KINDS` — migrate, reserve, reclaim, share, borrow, rebalance.
- `GpuSet(node, gpus, milli, mig_profile=None, limit_milli=None)` — device indices on one
  node, `milli` per GPU guaranteed (1000 = whole); a share target may name the MIG profile
  (`mig_profiles`) of the instance the task runs in on each GPU, `milli` then being that
  profile's share (see `check`: the first such step onto a plain, idle GPU switches it to MIG
  mode), or, on a plain GPU, the limit it may use when the GPU has room (`limit_milli`).
- `Action(kind, alloc, job, tenant, src, dst, ...)` — one step. Its effect on the model is
  uniform for every kind, which is what lets one checker replay them all:
  `src` (if set) is given back by allocation `alloc`, then `dst` (if set) is taken by it.
  * migrate / share / rebalance: an existing allocation leaves `src` for `dst` (share = a
    fractional `dst.milli`, or a MIG instance of `dst.mig_profile`; rebalance = `dst` on
    another GPU model, allowed by `gpu_spec`);
  * reclaim: an existing allocation gives back `src` (stopped or preempted), no `dst`;
  * reserve: a new holder `alloc` (not in the model; `num_gpu`/`priority` in the action)
    takes `dst`; several reserve actions with one `job` form a multi-node job;
  * borrow: no GPUs change hands; `quota` lists (tenant, gpu_model, delta GPUs) changes to
    quota limits (the lender's limit goes down by what the borrower's goes up).
- `mig_switch_steps(actions)` — per GPU a share names a MIG profile on, the first such step.
- `Cost` — restarts, restart seconds, GPU-hours lost, jobs and tenants touched; `+` adds.
- `Benefit` — job shapes schedulable and fragmentation before → after.
- `Plan` — goal text, feasibility, ordered actions, before/after measures; `to_dict()` is the
  `gpu-defrag plan --json` document `{goal, feasible, actions: [{kind, job, from, to, cost,
  ...}], before, after, ...}`.
- `move_cost(model, row, policy_default_s)` — the cost of restarting allocation row `row` once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from advisor.model import MILLI, ClusterModel

KINDS: tuple[str, ...] = ("migrate", "reserve", "reclaim", "share", "borrow", "rebalance")
MOVING_KINDS: frozenset[str] = frozenset({"migrate", "share", "rebalance"})
DEFAULT_RESTART_S = 300.0  # checkpoint + restart time assumed where the source does not know


@dataclass(frozen=True)
class GpuSet:
    """GPUs `gpus` (device indices) of node `node`, `milli` (1..1000) of each guaranteed;
    `mig_profile` (a share target only) the MIG instance the task gets on each, None: a plain
    GPU share; `limit_milli` (a plain share target only) what the task may use of each when the
    GPU has room (fractional sharing's limit, `milli`..1000), None: held to `milli`."""

    node: str
    gpus: tuple[int, ...]
    milli: int = MILLI
    mig_profile: str | None = None
    limit_milli: int | None = None

    def __post_init__(self) -> None:
        if not self.gpus:
            raise ValueError(f"GpuSet on {self.node!r} names no GPU")
        if len(set(self.gpus)) != len(self.gpus):
            raise ValueError(f"GpuSet on {self.node!r} names a GPU twice: {self.gpus}")
        if not 0 < self.milli <= MILLI:
            raise ValueError(f"GpuSet milli must be within 1..1000, got {self.milli}")
        if self.limit_milli is not None and (
            self.mig_profile is not None or not self.milli <= self.limit_milli <= MILLI
        ):
            raise ValueError(
                f"GpuSet limit_milli must be within milli ({self.milli})..1000 on a plain "
                f"share, got {self.limit_milli}"
            )

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"node": self.node, "gpus": list(self.gpus), "milli": self.milli}
        if self.mig_profile is not None:  # absent otherwise: plain targets keep their form
            doc["mig_profile"] = self.mig_profile
        if self.limit_milli is not None:
            doc["limit_milli"] = self.limit_milli
        return doc

    @staticmethod
    def from_dict(doc: dict[str, Any]) -> GpuSet:
        profile = doc.get("mig_profile")
        limit = doc.get("limit_milli")
        return GpuSet(
            str(doc["node"]),
            tuple(int(g) for g in doc["gpus"]),
            int(doc["milli"]),
            None if profile is None else str(profile),
            None if limit is None else int(limit),
        )

    def __str__(self) -> str:
        share = "" if self.milli == MILLI else f"@{self.milli / MILLI:g}"
        if self.limit_milli is not None and self.limit_milli > self.milli:
            share += f" (limit {self.limit_milli / MILLI:g})"
        if self.mig_profile is not None:
            share = f"@MIG {self.mig_profile}"
        return f"{self.node}[{','.join(str(g) for g in self.gpus)}]{share}"


@dataclass(frozen=True)
class Cost:
    """What an action (or a plan) costs the people whose work it touches."""

    restarts: int = 0
    restart_s: float = 0.0  # checkpoint/restart seconds, summed over restarted tasks
    gpu_hours: float = 0.0  # GPU-hours of work lost to restarts (GPUs held x restart time)
    jobs: tuple[str, ...] = ()
    tenants: tuple[str, ...] = ()
    # GPU-hours of capacity held idle: free GPUs a reservation holds until its job starts. No
    # work is lost, but nobody else runs there meanwhile; kept apart from `gpu_hours` so a
    # plan's "GPU-hours lost" means lost work only.
    idle_gpu_hours: float = 0.0

    def __add__(self, other: Cost) -> Cost:
        return Cost(
            self.restarts + other.restarts,
            self.restart_s + other.restart_s,
            self.gpu_hours + other.gpu_hours,
            _union(self.jobs, other.jobs),
            _union(self.tenants, other.tenants),
            self.idle_gpu_hours + other.idle_gpu_hours,
        )

    def score(self, weights: CostWeights | None = None) -> float:
        """One number to minimise (see `CostWeights`)."""
        w = weights or CostWeights()
        return (
            w.migration * self.restarts
            + w.restart_hour * self.restart_s / 3600.0
            + w.gpu_hour * (self.gpu_hours + self.idle_gpu_hours)  # a GPU-hour either way
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "restarts": self.restarts,
            "restart_s": self.restart_s,
            "gpu_hours": self.gpu_hours,
            "idle_gpu_hours": self.idle_gpu_hours,
            "jobs": list(self.jobs),
            "tenants": list(self.tenants),
        }

    @staticmethod
    def total(costs: Iterable[Cost]) -> Cost:
        out = Cost()
        for cost in costs:
            out = out + cost
        return out


@dataclass(frozen=True)
class CostWeights:
    """Weights of the plan objective. Defaults: each restart counts 1, each GPU-hour lost 0.1,
    so fewer migrations win first and, among equals, the one losing fewer GPU-hours."""

    migration: float = 1.0
    restart_hour: float = 0.0
    gpu_hour: float = 0.1


def mig_switch_steps(actions: Sequence[Action]) -> dict[tuple[str, int], int]:
    """Per (node, GPU index) that a share step names a MIG profile on, the first such step
    (1-based): on a plain GPU, the step that switches it to MIG mode (the checker's rule), the
    later ones carving instances beside it. What the service's benefits and the app's
    command exports read; the checker replays the same rule itself."""
    first: dict[tuple[str, int], int] = {}
    for step, action in enumerate(actions, start=1):
        if action.kind == "share" and action.dst is not None and action.dst.mig_profile:
            for gpu in action.dst.gpus:
                first.setdefault((action.dst.node, gpu), step)
    return first


def _union(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(sorted(set(a) | set(b)))


@dataclass(frozen=True)
class Benefit:
    """What a plan buys: jobs of each shape that could start, and fragmentation, before/after."""

    shapes_before: dict[str, int] = field(default_factory=dict)
    shapes_after: dict[str, int] = field(default_factory=dict)
    fragmentation_before: dict[str, float] = field(default_factory=dict)
    fragmentation_after: dict[str, float] = field(default_factory=dict)

    def newly_schedulable(self) -> list[str]:
        """Shapes no job of which could start before and at least one can after."""
        return [
            shape
            for shape, after in self.shapes_after.items()
            if after > 0 and self.shapes_before.get(shape, 0) == 0
        ]

    def more_jobs_fit(self) -> list[str]:
        """Shapes of which more jobs could start after than before."""
        return [
            shape
            for shape, after in self.shapes_after.items()
            if after > self.shapes_before.get(shape, 0)
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "shapes_before": dict(self.shapes_before),
            "shapes_after": dict(self.shapes_after),
            "newly_schedulable": self.newly_schedulable(),
            "more_jobs_fit": self.more_jobs_fit(),
            "fragmentation_before": dict(self.fragmentation_before),
            "fragmentation_after": dict(self.fragmentation_after),
        }


@dataclass(frozen=True)
class Action:
    """One step of a plan; see the module docstring for what each kind does to the model."""

    kind: str
    alloc: str = ""  # allocation (task) id; a new holder's id for `reserve`
    job: str = ""
    tenant: str = ""
    src: GpuSet | None = None  # given back first
    dst: GpuSet | None = None  # then taken
    priority: int | None = None  # for new holders (reserve); existing ones use the model's
    rack_local: bool = False  # reserve: all reserve actions of `job` must share one rack
    quota: tuple[tuple[str, str, float], ...] = ()  # borrow: (tenant, gpu_model or "", delta)
    reason: str = ""
    cost: Cost = Cost()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown action kind {self.kind!r}; one of {', '.join(KINDS)}")
        if self.kind in MOVING_KINDS and (self.src is None or self.dst is None):
            raise ValueError(f"{self.kind} needs both a source and a target")
        if self.kind == "reclaim" and (self.src is None or self.dst is not None):
            raise ValueError("reclaim gives back a source and takes nothing")
        if self.kind == "reserve" and (self.dst is None or self.src is not None):
            raise ValueError("reserve takes a target and gives back nothing")
        if self.kind == "borrow" and (self.src or self.dst or not self.quota):
            raise ValueError("borrow moves quota, not GPUs: give `quota` only")
        if self.kind != "borrow" and not self.alloc:
            raise ValueError(f"{self.kind} needs the allocation id it acts on")

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "alloc": self.alloc,
            "job": self.job,
            "tenant": self.tenant,
            "from": self.src.to_dict() if self.src else None,
            "to": self.dst.to_dict() if self.dst else None,
            "priority": self.priority,
            "rack_local": self.rack_local,
            "quota": [list(q) for q in self.quota],
            "reason": self.reason,
            "cost": self.cost.to_dict(),
        }

    @staticmethod
    def from_dict(doc: dict[str, Any]) -> Action:
        cost = doc.get("cost") or {}
        return Action(
            kind=doc["kind"],
            alloc=doc.get("alloc", ""),
            job=doc.get("job", ""),
            tenant=doc.get("tenant", ""),
            src=GpuSet.from_dict(doc["from"]) if doc.get("from") else None,
            dst=GpuSet.from_dict(doc["to"]) if doc.get("to") else None,
            priority=doc.get("priority"),
            rack_local=bool(doc.get("rack_local", False)),
            quota=tuple((str(t), str(m), float(d)) for t, m, d in doc.get("quota", [])),
            reason=doc.get("reason", ""),
            cost=Cost(
                int(cost.get("restarts", 0)),
                float(cost.get("restart_s", 0.0)),
                float(cost.get("gpu_hours", 0.0)),
                tuple(cost.get("jobs", ())),
                tuple(cost.get("tenants", ())),
                float(cost.get("idle_gpu_hours", 0.0)),
            ),
        )


@dataclass(frozen=True)
class Plan:
    """An ordered, checked list of actions for one goal."""

    goal: str
    feasible: bool
    actions: tuple[Action, ...] = ()
    before: dict[str, Any] = field(default_factory=dict)
    after: dict[str, Any] = field(default_factory=dict)
    reason: str = ""  # why infeasible, or notes
    method: str = ""  # heuristic, exact (optimal/feasible), ...
    benefit: Benefit | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def cost(self) -> Cost:
        return Cost.total(a.cost for a in self.actions)

    @property
    def migrations(self) -> int:
        return sum(1 for a in self.actions if a.kind in MOVING_KINDS)

    def to_dict(self) -> dict[str, Any]:
        return {
            "goal": self.goal,
            "feasible": self.feasible,
            "reason": self.reason,
            "method": self.method,
            "actions": [a.to_dict() for a in self.actions],
            "cost": self.cost.to_dict(),
            "before": self.before,
            "after": self.after,
            "benefit": self.benefit.to_dict() if self.benefit else None,
            **self.extra,
        }

    @staticmethod
    def from_dict(doc: dict[str, Any]) -> Plan:
        """The plan `to_dict` wrote (the API's and `plan --json`'s form): its cost is its
        actions'; a benefit's derived lists are derived again."""
        known = {"goal", "feasible", "reason", "method", "actions", "cost", "before", "after"}
        benefit = doc.get("benefit")
        return Plan(
            goal=doc["goal"],
            feasible=bool(doc["feasible"]),
            actions=tuple(Action.from_dict(a) for a in doc.get("actions", [])),
            before=dict(doc.get("before") or {}),
            after=dict(doc.get("after") or {}),
            reason=doc.get("reason", ""),
            method=doc.get("method", ""),
            benefit=None
            if benefit is None
            else Benefit(
                dict(benefit.get("shapes_before", {})),
                dict(benefit.get("shapes_after", {})),
                dict(benefit.get("fragmentation_before", {})),
                dict(benefit.get("fragmentation_after", {})),
            ),
            extra={k: v for k, v in doc.items() if k not in known | {"benefit"}},
        )


def restart_seconds(model: ClusterModel, row: int, default_s: float = DEFAULT_RESTART_S) -> float:
    value = float(model.allocations.restart_cost_s[row])
    return default_s if math.isnan(value) else value


def move_cost(model: ClusterModel, row: int, default_s: float = DEFAULT_RESTART_S) -> Cost:
    """Restarting allocation `row` once: its restart time, and that time on the GPU share it
    holds as GPU-hours lost (NaN restart cost → `default_s`)."""
    allocs = model.allocations
    seconds = restart_seconds(model, row, default_s)
    gpus = float(allocs.num_gpu[row]) * float(allocs.gpu_milli[row]) / MILLI
    return Cost(
        restarts=1,
        restart_s=seconds,
        gpu_hours=seconds * gpus / 3600.0,
        jobs=(str(allocs.job[row]),),
        tenants=(str(allocs.tenant[row]),) if allocs.tenant[row] else (),
    )
