"""Quota borrowing: a job blocked only by its tenant's quota borrows unused quota of others.

`plan_borrow(model, policy, request)` for a job (`reserve.Request`, or a pending job in the
model via `request_for_job`):

1. find GPUs free now for it (`reserve.earliest_slot` on free GPUs; none: no loan helps now);
2. for each quota scope of the borrower (all models, and the slot's model) the shortfall is
   its use + the job - its quota; none: the job needs no loan;
3. the borrower's rules (`Policy.borrow_rules`) must exist (no `borrowing` section: no loan is
   ever proposed), the job's priority must reach `priority_threshold`, the loan may not exceed
   `max_borrow_ratio` x the borrower's quota, and without `preemption` the job must be expected
   to end before `auto_return_s` (its GPUs could not be taken back);
4. lenders: tenants whose rules allow lending, with unused quota in that scope, most unused
   first, then `UNASSIGNED` (usable GPUs no quota covers); if they cannot cover it, no loan;
5. the plan: one `borrow` action per lender (quota moves, no GPUs), then `reserve` actions
   that place the job on the free GPUs, all replayed by `check_plan` (which refuses the
   reservations without the loans). `extra["return"]` says when the loan goes back (at job end,
   at the latest `auto_return_s` from now, then `grace_s` to checkpoint; preemption or not)
   and holds the inverse borrow actions to apply then.

`blocked_by_quota(model, policy)` lists the pending jobs that fit the free GPUs but not their
tenant's quota: the ones to try.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import numpy as np

from advisor.model import MILLI, ClusterModel
from advisor.planner.actions import Action, Cost, GpuSet, Plan
from advisor.planner.check import check_plan
from advisor.planner.constraints import ANY_MODEL, UNASSIGNED, Policy
from advisor.planner.observed import DurationPrior, now_of
from advisor.planner.outcome import outcome, shapes_with
from advisor.planner.reserve import Request, earliest_slot, pending_requests


def request_for_job(model: ClusterModel, job: str) -> Request:
    """The pending job `job` of the model as a request; KeyError if it has no pending task."""
    for request in pending_requests(model, min_gpus=1):
        if request.job == job:
            return request
    raise KeyError(f"no pending job {job!r} in the model")


def usage_by_scope(model: ClusterModel) -> dict[tuple[str, str], float]:
    """GPUs held per (tenant, scope), scope "" = all models (as the checker counts them)."""
    allocs = model.allocations
    placed = allocs.node >= 0
    share = allocs.num_gpu * allocs.gpu_milli / MILLI
    out: dict[tuple[str, str], float] = defaultdict(float)
    for tenant, node, gpus in zip(
        allocs.tenant[placed].tolist(),
        allocs.node[placed].tolist(),
        share[placed].tolist(),
        strict=True,
    ):
        out[(tenant, ANY_MODEL)] += gpus
        out[(tenant, str(model.nodes.gpu_model[node]))] += gpus
    return out


def unassigned(model: ClusterModel, policy: Policy, scope: str, usage) -> float:
    """Unused GPUs no tenant's quota covers in `scope` (as the checker's UNASSIGNED lends)."""
    if (UNASSIGNED, scope) in policy.quotas:
        limit = policy.quotas[(UNASSIGNED, scope)]
        holders = {t for (t, s) in policy.quotas if s == scope}
    else:
        gpu_model = model.nodes.gpu_model[model.gpus.node]
        on = model.gpu_usable if scope == ANY_MODEL else model.gpu_usable & (gpu_model == scope)
        holders = {t for (t, s) in policy.quotas if s == scope}
        limit = max(
            0.0, float(on.sum()) - sum(v for (t, s), v in policy.quotas.items() if s == scope)
        )
    used = sum(v for (t, s), v in usage.items() if s == scope and t not in holders)
    return max(0.0, limit - used)


def _free_now(model: ClusterModel) -> np.ndarray:
    return np.where(model.gpu_is_free, now_of(model), np.inf)


def blocked_by_quota(model: ClusterModel, policy: Policy) -> list[Request]:
    """Pending jobs that free GPUs could hold now but their tenant's quota does not allow.

    Only a tenant with a quota can be blocked by one: the slot search (the expensive part, tens
    of seconds over a trace's pending pods) runs for those tenants' jobs alone."""
    limited = {tenant for tenant, _scope in policy.quotas}
    if not limited:
        return []
    usage = usage_by_scope(model)
    ready = _free_now(model)
    out = []
    for request in pending_requests(model, min_gpus=1):
        if request.tenant not in limited:
            continue
        slot = earliest_slot(model, ready, request, policy)
        if slot is None or not math.isfinite(slot.start):
            continue
        gpu_model = str(model.nodes.gpu_model[slot.nodes[0][0]])
        for scope in (ANY_MODEL, gpu_model):
            limit = policy.quotas.get((request.tenant, scope))
            if limit is not None and usage[(request.tenant, scope)] + request.gpus > limit + 1e-9:
                out.append(request)
                break
    return out


def plan_borrow(
    model: ClusterModel,
    policy: Policy,
    request: Request,
    prior: DurationPrior | None = None,
) -> Plan:
    """A checked loan + placement for `request`, or an infeasible plan saying why."""
    goal = f"borrow quota for {request.job} ({request.gpus} GPUs of {request.tenant!r})"
    now = now_of(model)
    slot = earliest_slot(model, _free_now(model), request, policy)
    if slot is None or not math.isfinite(slot.start):
        return Plan(goal, False, reason="not enough free GPUs now: a loan would not start it")
    gpu_model = str(model.nodes.gpu_model[slot.nodes[0][0]])
    usage = usage_by_scope(model)
    shortfall = {}
    for scope in (ANY_MODEL, gpu_model):
        limit = policy.quotas.get((request.tenant, scope))
        if limit is not None:
            short = usage[(request.tenant, scope)] + request.gpus - limit
            if short > 1e-9:
                shortfall[scope] = short
    place = _placement(model, policy, request, slot, now)
    if not shortfall:
        return _finish(model, policy, request, goal, place, [], {}, "no loan needed: within quota")
    rules = policy.borrow_rules(request.tenant)
    if rules is None:
        return Plan(goal, False, reason="the policy has no borrowing rules: no loan is proposed")
    priority = request.priority if request.priority is not None else 0
    if priority < rules.priority_threshold:
        return Plan(
            goal,
            False,
            reason=f"priority {priority} is under the borrowing threshold {rules.priority_threshold}",
        )
    duration = request.duration_s or math.sqrt(2.0) * (prior or DurationPrior()).median_s
    if not rules.preemption and duration > rules.auto_return_s:
        return Plan(
            goal,
            False,
            reason=(
                f"expected run {duration / 3600:.1f} h exceeds the auto-return "
                f"{rules.auto_return_s / 3600:.1f} h and preemption is not allowed"
            ),
        )
    loans: list[Action] = []
    for scope, short in shortfall.items():
        own = policy.quotas[(request.tenant, scope)]
        if short > rules.max_borrow_ratio * own + 1e-9:
            return Plan(
                goal,
                False,
                reason=(
                    f"needs {short:g} GPUs more than its quota of {own:g}; it may borrow at most "
                    f"{rules.max_borrow_ratio:g} x {own:g} = {rules.max_borrow_ratio * own:g}"
                ),
            )
        lenders = []
        for (tenant, s), limit in policy.quotas.items():
            if s != scope or tenant in (request.tenant, UNASSIGNED):
                continue
            lender_rules = policy.borrow_rules(tenant)
            spare = limit - usage[(tenant, scope)]
            if spare > 1e-9 and lender_rules is not None and lender_rules.lend:
                lenders.append((-spare, tenant, spare))
        lenders.sort()
        spare_unassigned = unassigned(model, policy, scope, usage)
        if spare_unassigned > 1e-9:
            lenders.append((0.0, UNASSIGNED, spare_unassigned))
        left = short
        for _, tenant, spare in lenders:
            if left <= 1e-9:
                break
            amount = float(min(spare, math.ceil(left - 1e-9)))
            left -= amount
            where = f" on {scope}" if scope else ""
            who = "capacity no quota covers" if tenant == UNASSIGNED else f"{tenant!r}"
            loans.append(
                Action(
                    "borrow",
                    job=request.job,
                    tenant=request.tenant,
                    quota=((request.tenant, scope, amount), (tenant, scope, -amount)),
                    reason=(
                        f"{who} lends {amount:g} of {spare:g} unused GPUs{where} to "
                        f"{request.tenant!r} so {request.job} can start"
                    ),
                    cost=Cost(
                        jobs=(request.job,),
                        tenants=tuple(t for t in (request.tenant, tenant) if t != UNASSIGNED),
                    ),
                )
            )
        if left > 1e-9:
            where = f" on {scope}" if scope else ""
            return Plan(
                goal,
                False,
                reason=f"lenders have only {short - left:g} unused GPUs{where}, {short:g} needed",
            )
    returns = [
        Action(
            "borrow",
            job=a.job,
            tenant=a.tenant,
            quota=tuple((t, s, -d) for t, s, d in a.quota),
            reason=f"return: {a.reason.replace(' lends ', ' gets back ', 1)}",
        ).to_dict()
        for a in loans
    ]
    due = now + min(duration, rules.auto_return_s)
    back = {
        "when": f"when {request.job} ends, at the latest {rules.auto_return_s / 3600:g} h from now",
        "due_at": due,
        "auto_return_at": now + rules.auto_return_s,
        "grace_s": rules.grace_s,
        "preemption": rules.preemption,
        "then": (
            f"after {rules.grace_s / 60:g} min grace the borrowed work is preempted"
            if rules.preemption
            else "the job is expected to end before the auto-return; it is not preempted"
        ),
        "actions": returns,
    }
    return _finish(model, policy, request, goal, place, loans, back, "")


def _placement(
    model: ClusterModel, policy: Policy, request: Request, slot, now: float
) -> list[Action]:
    actions = []
    for node, rows in slot.nodes:
        name = str(model.nodes.name[node])
        actions.append(
            Action(
                "reserve",
                alloc=f"start:{request.job}:{name}",
                job=request.job,
                tenant=request.tenant,
                dst=GpuSet(name, tuple(int(model.gpus.index[r]) for r in rows)),
                priority=request.priority,
                rack_local=request.tasks > 1 and policy.rack_locality,
                reason=f"start {request.job} on {name} (free now)",
                cost=Cost(jobs=(request.job,), tenants=(request.tenant,) if request.tenant else ()),
            )
        )
    return actions


def _finish(
    model: ClusterModel,
    policy: Policy,
    request: Request,
    goal: str,
    place: list[Action],
    loans: list[Action],
    back: dict[str, Any],
    note: str,
) -> Plan:
    actions = loans + place
    result = check_plan(model, actions, policy, request.priority)
    if not result.ok:
        return Plan(goal, False, reason=f"replay refused: {result}", method="borrow")
    before, after, benefit = outcome(model, place, shapes_with([request.shape]))
    extra = {
        "job": request.job,
        "borrower": request.tenant,
        "loans": [
            {"lender": a.quota[1][0], "scope": a.quota[1][1] or "all models", "gpus": a.quota[0][2]}
            for a in loans
        ],
        "return": back,
    }
    return Plan(goal, True, tuple(actions), before, after, note, "borrow", benefit, extra)
