"""One entry point for every recommendation kind, for the pipeline (service and app) and the CLI.

`recommend(model, policy, forecast, settings, goals)` runs, in this order, and returns their
plans (each one already replayed by `check_plan`; plans without actions are left out, except
infeasible consolidation, reservation and loan plans, which say why a goal or a waiting job
cannot be helped):

0. consolidation for each of `goals` (`job=KxG`, `job=G@MODEL`, `free-nodes=K`: the
   migrations and reservations that let such a job start, `advisor.planner.solve`; the exact
   solver too with `settings.exact`); the pipeline passes the shapes of which no job fits now;
1. reservations for waiting jobs of at least 8 GPUs that cannot start now, plus the
   forecast's expected jobs (`reserve.plan_reservations`);
2. quota loans for waiting jobs blocked only by their tenant's quota (`borrow.plan_borrow`);
3. reclaim of long-idle allocations (`reclaim.plan_reclaim`);
4. sharing of GPUs by tasks that use a fraction of one (`share.plan_share`);
5. type rebalancing from scarce to idle GPU models (`rebalance.plan_rebalance`).

Kinds 1-5 run unless `settings.others` is off (the app's Actions page, planning one goal).

Plans of different kinds are alternatives computed on the same model, not one sequence: apply
one, then ask again. `recommend_with_notes` also returns, for each kind that recommends nothing,
why (`KIND: note`); `gpu-defrag plan --goal recommend` prints them on one line
(`nothing_recommended`) when there is no plan at all. `forecast` is a `reserve.Outlook` or a mapping with the same keys
(`job_end`: {allocation id or job: end time}, `demand`: [Request or its keyword mapping]).

`plan_for_goal(model, policy, goal, forecast)` is what `gpu-defrag plan --goal` calls for these
kinds: `recommend`, `reclaim`, `share`, `rebalance`, `reserve` (every waiting job) or
`reserve=JOB`, and `borrow=JOB`, `borrow=TENANT:GPUS[:PRIORITY]` or `borrow=JOB:TENANT:GPUS`
(GPUS `KxG` or a count, `_borrow_request`; a job that is not in the model). It returns None for
other goals (consolidation handles those).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from advisor.model import ClusterModel
from advisor.planner.actions import Plan
from advisor.planner.borrow import blocked_by_quota, plan_borrow, request_for_job, split_gpus
from advisor.planner.consolidate import Goal, parse_goal
from advisor.planner.constraints import Policy
from advisor.planner.observed import HISTORY_HINT
from advisor.planner.rebalance import RebalanceSettings, plan_rebalance
from advisor.planner.reclaim import ReclaimSettings, plan_reclaim
from advisor.planner.reserve import Outlook, Request, ReserveSettings, plan_reservations
from advisor.planner.share import ShareSettings, plan_share
from advisor.planner.solve import EXACT_MAX_NODES, solve

GOALS = ("recommend", "reclaim", "share", "rebalance", "reserve", "borrow")


@dataclass(frozen=True)
class RecommendSettings:
    reserve: ReserveSettings = field(default_factory=ReserveSettings)
    reclaim: ReclaimSettings = field(default_factory=ReclaimSettings)
    share: ShareSettings = field(default_factory=ShareSettings)
    rebalance: RebalanceSettings = field(default_factory=RebalanceSettings)
    exact: bool = False  # consolidation: the exact solver too, the cheaper checked plan kept
    exact_time_limit_s: float = 5.0  # CP-SAT's limit per goal (a page waits for it)
    exact_max_nodes: int = EXACT_MAX_NODES
    others: bool = True  # kinds 1-5 beside the goals' consolidation


def as_outlook(forecast: Outlook | Mapping[str, Any] | None) -> Outlook:
    """An `Outlook` from None, an Outlook, or a mapping {job_end, demand}."""
    if forecast is None:
        return Outlook()
    if isinstance(forecast, Outlook):
        return forecast
    demand = tuple(
        d if isinstance(d, Request) else Request(**dict(d)) for d in forecast.get("demand", ())
    )
    return Outlook(dict(forecast.get("job_end", {}) or {}), demand)


def recommend(
    model: ClusterModel,
    policy: Policy | None = None,
    forecast: Outlook | Mapping[str, Any] | None = None,
    settings: RecommendSettings | None = None,
    goals: Sequence[Goal | str] = (),
) -> list[Plan]:
    """Every recommendation kind's checked plans (module docstring)."""
    return recommend_with_notes(model, policy, forecast, settings, goals)[0]


def consolidate(
    model: ClusterModel,
    policy: Policy,
    goals: Sequence[Goal | str],
    settings: RecommendSettings | None = None,
) -> list[Plan]:
    """One checked consolidation plan per goal (infeasible ones say why); a goal given as text
    is `parse_goal`'s (ValueError when malformed)."""
    settings = settings or RecommendSettings()
    solver = "best" if settings.exact else "heuristic"
    return [
        solve(
            model,
            parse_goal(goal) if isinstance(goal, str) else goal,
            policy,
            solver=solver,
            time_limit_s=settings.exact_time_limit_s,
            exact_max_nodes=settings.exact_max_nodes,
        )
        for goal in goals
    ]


def recommend_with_notes(
    model: ClusterModel,
    policy: Policy | None = None,
    forecast: Outlook | Mapping[str, Any] | None = None,
    settings: RecommendSettings | None = None,
    goals: Sequence[Goal | str] = (),
) -> tuple[list[Plan], list[str]]:
    """`recommend`'s plans, and `KIND: why` for each kind that recommends nothing (the note
    its own goal gives)."""
    policy = policy or Policy()
    settings = settings or RecommendSettings()
    plans = consolidate(model, policy, goals, settings)
    if not settings.others:
        return plans, []
    outlook = as_outlook(forecast)
    notes: list[str] = []
    reservations = plan_reservations(model, policy, None, outlook, settings.reserve)
    plans += reservations
    if not reservations:
        notes.append(f"reserve: {_nothing_to_hold(settings.reserve)}")
    blocked = blocked_by_quota(model, policy)
    for request in blocked:
        plans.append(plan_borrow(model, policy, request, settings.reserve.prior, outlook.job_end))
    if not blocked:
        notes.append(
            "borrow: no waiting job is held back only by its tenant's quota"
            if policy.quotas
            else "borrow: the policy sets no quotas"
        )
    for kind, plan in (
        ("reclaim", plan_reclaim(model, policy, settings.reclaim)),
        ("share", plan_share(model, policy, settings.share)),
        ("rebalance", plan_rebalance(model, policy, settings.rebalance)),
    ):
        if plan.actions:
            plans.append(plan)
        else:
            notes.append(f"{kind}: {plan.reason or 'nothing to do'}")
    return plans, notes


def _nothing_to_hold(settings: ReserveSettings) -> str:
    """Why reservations hold nothing: one wording for `recommend`'s note and the reserve goal."""
    return (
        f"no waiting job of {settings.min_gpus}+ GPUs needs a hold: each fits now, or none "
        "waits (smaller jobs are left to the scheduler)"
    )


def nothing_recommended(notes: list[str]) -> str:
    """The one line `gpu-defrag plan --goal recommend` prints when no kind has a plan (how to
    read a source with usage history said once, at the end, for every kind that needs it)."""
    tail = f"; {HISTORY_HINT}"
    short = [n.removesuffix(tail) for n in notes]
    hint = f". {HISTORY_HINT[:1].upper()}{HISTORY_HINT[1:]}" if short != notes else ""
    return "nothing to recommend: " + "; ".join(short) + hint


_SIZE = re.compile(r"^(?:(\d+)x)?(\d+)$")


def _borrow_request(model: ClusterModel, value: str) -> tuple[Request, ...]:
    """`JOB` (pending in the model), `TENANT:GPUS[:PRIORITY]` or `JOB:TENANT:GPUS`; GPUS is
    `KxG` (K tasks of G) or a count: GPUs the tenant wants to run, split as work takes them
    (`borrow.split_gpus`: one task when it fits a node, else whole nodes and a remainder task)."""
    if ":" not in value:
        return (request_for_job(model, value),)
    parts = value.split(":")
    bad = ValueError(
        f"bad borrow goal {value!r}: expected JOB, TENANT:GPUS[:PRIORITY] or JOB:TENANT:GPUS"
    )
    if len(parts) == 2 or (len(parts) == 3 and _SIZE.match(parts[1])):
        job, tenant, size, priority = "", parts[0], parts[1], parts[2] if len(parts) == 3 else ""
    elif len(parts) == 3:
        job, tenant, size, priority = parts[0], parts[1], parts[2], ""
    else:
        raise bad
    match = _SIZE.match(size)
    if not tenant or not match or (priority and not priority.lstrip("-").isdigit()):
        raise bad
    tasks, per = int(match.group(1) or 1), int(match.group(2))
    if tasks < 1 or per < 1:
        raise bad
    level = int(priority) if priority else None
    if match.group(1) is None:
        return split_gpus(model, tenant, per, level, job)
    return (Request(job or f"{tenant}-request", tenant, level, tasks, per),)


def plan_for_goal(
    model: ClusterModel,
    policy: Policy,
    goal: str,
    forecast: Outlook | Mapping[str, Any] | None = None,
) -> list[Plan] | None:
    """Plans for one of `GOALS` (module docstring); None when `goal` is not one of them;
    ValueError for a malformed one."""
    key, _, value = goal.strip().partition("=")
    key, value = key.strip(), value.strip()
    if key not in GOALS:
        return None
    outlook = as_outlook(forecast)
    if key == "recommend":
        return recommend(model, policy, outlook)
    if key == "reclaim":
        return [plan_reclaim(model, policy)]
    if key == "share":
        return [plan_share(model, policy)]
    if key == "rebalance":
        return [plan_rebalance(model, policy)]
    if key == "reserve":
        plans = plan_reservations(model, policy, None, outlook)
        if value:
            plans = [p for p in plans if p.extra.get("job") == value]
            if not plans:
                why = f"{value!r} needs no reservation or is unknown"
                return [Plan(goal, False, reason=why, method="reserve")]
        return plans or [
            Plan(goal, True, reason=_nothing_to_hold(ReserveSettings()), method="reserve")
        ]
    if not value:
        raise ValueError("borrow needs a job: borrow=JOB or borrow=TENANT:GPUS[:PRIORITY]")
    try:
        request = _borrow_request(model, value)
    except KeyError as error:
        raise ValueError(str(error.args[0])) from None
    return [plan_borrow(model, policy, request, job_end=outlook.job_end)]


def render_notes(plan: Plan) -> str:
    """Plain-text lines under a plan's table: why each step, and what the kind adds."""
    lines = [f"  {i}. {a.reason}" for i, a in enumerate(plan.actions, start=1) if a.reason]
    extra = plan.extra
    if plan.reason and plan.feasible:
        lines.append(f"note: {plan.reason}")
    if "waste" in extra:
        w = extra["waste"]
        lines.append(
            f"idle allocations: {w['allocations']}, {w['gpu_hours']:.1f} GPU-hours and "
            f"{w['energy_kwh']:.2f} kWh wasted; protected: {len(extra.get('protected', []))}"
        )
    if "stranded_memory" in extra:
        m = extra["stranded_memory"]
        lines.append(
            f"stranded GPU memory: {m['before_bytes'] / 2**30:.1f} GiB -> "
            f"{m['after_bytes'] / 2**30:.1f} GiB; GPUs freed: {extra.get('gpus_freed', 0)} whole, "
            f"{extra.get('gpu_share_freed', 0.0):.3g} GPU share given back"
        )
    if "freed_gpus" in extra:
        lines.append(f"GPUs freed per model: {extra['freed_gpus'] or '-'}")
    if extra.get("return"):
        back = extra["return"]
        lines.append(f"loan returns {back['when']}; {back['then']}")
        if "on_timeout" in back:
            lines.append(f"at the auto-return: {back['on_timeout']['text']}")
        for demand in back.get("on_lender_demand", []):
            lines.append(f"lender demand: {demand['text']}")
    if "start_at" in extra:
        lines.append(
            f"starts in {extra['starts_in_s'] / 3600:.1f} h on {', '.join(extra['nodes'])} "
            f"({extra['ends_from']}); {extra['idle_gpu_hours']:.1f} GPU-hours idle waiting "
            f"({plan.cost.idle_gpu_hours:.1f} on the GPUs held now, the rest on "
            f"{len(extra['schedule'])} GPU(s) held later as they free up); "
            f"{extra['release']['why']}"
        )
    for conflict in extra.get("conflicts", []):
        lines.append(f"conflict: {conflict['why']} ({', '.join(conflict['with'])})")
    return "\n".join(lines)
