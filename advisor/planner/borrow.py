"""Quota borrowing: a job blocked only by its tenant's quota borrows unused quota of others.

`plan_borrow(model, policy, request)` for a job (`reserve.Request`, or a pending job in the
model via `request_for_job`), or for GPUs a tenant asks for (`split_gpus`: the parts of one job,
whole nodes and a remainder task on one node):

1. find GPUs free now for it (`reserve.earliest_slot` on free GPUs, each part on GPUs the ones
   before left, all parts in one GPU model and, under rack locality, one rack; none: no loan
   helps now, and the reason gives the free GPUs the job may use against the GPUs it needs);
2. for each quota scope of the borrower (all models, and the slot's model) the shortfall is
   its use + the job - its quota; none: the job needs no loan;
3. the rules must exist (no `borrowing_rules` and no `borrowing` section: no loan is ever
   proposed). Per lender -> borrower pair (`Policy.loan_rules`): each lender whose pair's
   `priority_threshold` the job reaches lends at most its unused quota and
   `max_borrowable_ratio` x its quota. Per borrowing tenant (`Policy.borrow_rules`, the older
   form): the job's priority must reach `priority_threshold`, the loan may not exceed
   `max_borrow_ratio` x the borrower's quota, without `preemption` the job must be expected to
   end before `auto_return_s`, and tenants whose rules allow lending lend their unused quota;
4. lenders with the most to lend go first, then `UNASSIGNED` (usable GPUs no quota covers); if
   they cannot cover it, no loan, and the reason gives each lender's numbers;
5. the plan: one `borrow` action per lender (quota moves, no GPUs), then `reserve` actions
   that place the job on the free GPUs, all replayed by `check_plan` (which refuses the
   reservations without the loans). `extra["return"]` says how the loan goes back, per
   trigger (`loan_return.LoanReturn`: at the auto-return, or when a lender wants its quota
   back: which jobs are preempted, what that costs, each scenario replayed) and holds the
   inverse borrow actions; a job expected to outlive its loan carries the cost of its forced
   return on the first loan's row.

`blocked_by_quota(model, policy)` lists the pending jobs that fit the free GPUs but not their
tenant's quota: the ones to try.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from advisor.fragmentation import measures
from advisor.fragmentation.nvlink import crossing_note
from advisor.model import ClusterModel
from advisor.planner.actions import Action, Cost, GpuSet, Plan
from advisor.planner.check import check_plan
from advisor.planner.constraints import (
    ANY_MODEL,
    UNASSIGNED,
    Policy,
    ReturnPolicy,
    unassigned_quota,
    usage_by_scope,
)
from advisor.planner.loan_return import Loan, LoanReturn, expected_run
from advisor.planner.observed import DurationPrior, now_of
from advisor.planner.outcome import outcome, shapes_with
from advisor.planner.reserve import Request, Slot, earliest_slot, pending_requests
from advisor.planner.why import why_not_now


def request_for_job(model: ClusterModel, job: str) -> Request:
    """The pending job `job` of the model as a request; KeyError if it has no pending task."""
    for request in pending_requests(model, min_gpus=1):
        if request.job == job:
            return request
    raise KeyError(f"no pending job {job!r} in the model")


def split_gpus(
    model: ClusterModel, tenant: str, gpus: int, priority: int | None = None, job: str = ""
) -> tuple[Request, ...]:
    """`gpus` GPUs for `tenant` as real work would take them: one task when they fit a node
    (the largest node's GPU count), else whole-node tasks plus, for what is left, one task on
    one more node (30 on 8-GPU nodes: 3 x 8 and 1 x 6). The parts are one job (`job`, default
    `TENANT-request`) for `plan_borrow`."""
    if gpus < 1:
        raise ValueError(f"a borrow request needs at least 1 GPU, not {gpus}")
    job = job or f"{tenant}-request"
    node_gpus = int(model.nodes.gpu_count.max(initial=0))
    whole, left = divmod(gpus, node_gpus) if node_gpus and gpus > node_gpus else (0, gpus)
    parts = [Request(job, tenant, priority, whole, node_gpus)] if whole else []
    if left:
        parts.append(Request(job, tenant, priority, 1, left))
    return tuple(parts)


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


def _slots(model: ClusterModel, policy: Policy, parts: Sequence[Request]) -> list[Slot] | None:
    """Free GPUs now for every part of one job, or None. One part: `earliest_slot` as for any
    job. Several: one GPU model (and one rack under rack locality) holds them all, each part on
    the GPUs the ones before left (whole nodes first, so the remainder takes what they leave);
    the groups with the fewest free GPUs are tried first (the tightest fit)."""
    ready = _free_now(model)
    if len(parts) == 1:
        slot = earliest_slot(model, ready, parts[0], policy)
        return [slot] if slot is not None and math.isfinite(slot.start) else None
    nodes = model.nodes
    keys = [
        (str(nodes.rack[n]) if policy.rack_locality else "", str(nodes.gpu_model[n]))
        for n in range(len(nodes))
    ]
    names = sorted(set(keys))
    index = {k: i for i, k in enumerate(names)}
    group_of_node = np.array([index[k] for k in keys], dtype=np.int64)
    group_of_gpu = group_of_node[model.gpus.node]
    free = np.bincount(group_of_gpu[np.isfinite(ready)], minlength=len(names))
    need = sum(p.gpus for p in parts)
    order = sorted((int(free[g]), names[g], g) for g in range(len(names)) if free[g] >= need)
    for _free, (rack, _model), group in order:
        if policy.rack_locality and not rack:
            continue  # a multi-node job cannot use nodes whose rack is unknown
        left = np.where(group_of_gpu == group, ready, np.inf)
        slots = []
        for part in parts:
            slot = earliest_slot(model, left, part, policy)
            if slot is None or not math.isfinite(slot.start):
                break
            slots.append(slot)
            for _node, rows in slot.nodes:
                left[list(rows)] = np.inf
        else:
            return slots
    return None


def _shape_text(parts: Sequence[Request]) -> str:
    """How the job takes its GPUs: "3 x 8 + 1 x 6 GPUs, each task on one node"."""
    sizes = " + ".join(f"{p.tasks} x {p.num_gpu}" for p in parts)
    if sum(p.tasks for p in parts) == 1:
        return f"{parts[0].num_gpu} GPUs on one node"
    return f"{sizes} GPUs, each task on one node"


def _no_room(model: ClusterModel, policy: Policy, parts: Sequence[Request]) -> str:
    """Why no free GPUs hold the job now: too few free on the models it may use, or not in a
    shape it can take (the free count and the shape named either way)."""
    spec = parts[0].gpu_spec
    allowed = measures._spec_mask(model, spec)[model.gpus.node]  # per GPU, by its node's model
    free = int((model.gpu_is_free & allowed).sum())
    need = sum(p.gpus for p in parts)
    on = f" on the GPU models {spec!r} allows" if spec else ""
    if free < need:
        return f"not enough free GPUs now: only {free} free{on}, {need} needed"
    if len(parts) == 1:  # one shape: the reason every surface gives for it
        return f"not enough free GPUs now in the job's shape: {why_not_now(model, parts[0].shape)}"
    where = " in one rack and GPU model" if policy.rack_locality else " in one GPU model"
    return (
        f"not enough free GPUs now in the job's shape: {free} free{on}, but not as "
        f"{_shape_text(parts)}{where}"
    )


def plan_borrow(
    model: ClusterModel,
    policy: Policy,
    request: Request | Sequence[Request],
    prior: DurationPrior | None = None,
    job_end: Mapping[str, float] | None = None,
) -> Plan:
    """A checked loan + placement for `request` (a job, or the parts of one from
    `split_gpus`), with how the loan goes back (`extra["return"]`), or an infeasible plan
    saying why. `job_end` ({job or allocation id: end time}) gives expected ends where known
    (the request's job and the borrower's running work); else the duration prior."""
    parts = (request,) if isinstance(request, Request) else tuple(request)
    if not parts:
        raise ValueError("plan_borrow needs a request")
    head = parts[0]
    gpus = sum(p.gpus for p in parts)
    goal = f"borrow quota for {head.job} ({gpus} GPUs of {head.tenant!r})"
    now = now_of(model)
    slots = _slots(model, policy, parts)
    if slots is None:
        return _refused(goal, f"{_no_room(model, policy, parts)}; a loan would not start it")
    gpu_model = str(model.nodes.gpu_model[slots[0].nodes[0][0]])
    usage = usage_by_scope(model)
    shortfall = {}
    for scope in (ANY_MODEL, gpu_model):
        limit = policy.quotas.get((head.tenant, scope))
        if limit is not None:
            short = usage[(head.tenant, scope)] + gpus - limit
            if short > 1e-9:
                shortfall[scope] = short
    place = _placement(model, policy, parts, slots)
    if not shortfall:
        return _finish(model, policy, parts, goal, place, [], {}, "no loan needed: within quota")
    if not policy.lends:
        return _refused(goal, "the policy has no borrowing rules: no loan is proposed")
    prior = prior or DurationPrior()
    run_s, ends_from = expected_run(head, prior, job_end, now)
    if policy.loan_rules:
        terms = _pair_terms(model, policy, head, shortfall, usage)
        returns = policy.returns
    else:
        terms = _tenant_terms(model, policy, head, shortfall, usage, run_s)
        rules = policy.borrow_rules(head.tenant)
        returns = rules.returns() if rules is not None else ReturnPolicy()
    if isinstance(terms, str):
        return _refused(goal, terms)
    loans = [_loan_action(head, loan) for loan in terms]
    context = LoanReturn(model, policy, parts, place, terms, loans, returns, run_s, ends_from, now)
    back = context.document(job_end, prior)
    cost = back["on_timeout"]["expected_cost"]
    if cost is not None:  # the job is expected to outlive the loan and be preempted
        first = loans[0]
        loans[0] = replace(
            first,
            reason=f"{first.reason}; {back['on_timeout']['text']}",
            cost=first.cost + Cost(**cost),
        )
    return _finish(model, policy, parts, goal, place, loans, back, "")


def _lend_order(lenders: list[tuple[float, str, float, float, str]]) -> list:
    """Named tenants with the most to lend first, then `UNASSIGNED` (capacity no quota
    covers: lent last, as before any tenant's)."""
    return sorted(lenders, key=lambda x: (x[1] == UNASSIGNED, -x[0], x[1]))


def _take(
    head: Request,
    scope: str,
    short: float,
    lenders: list[tuple[float, str, float, float, str]],
    auto_return: dict[str, float],
) -> tuple[list[Loan], float]:
    """Loans covering `short` from `lenders` (available, name, available, spare, terms), in
    whole GPUs; what is left uncovered."""
    left = short
    out = []
    for available, tenant, _, spare, terms in _lend_order(lenders):
        if left <= 1e-9:
            break
        amount = float(min(available, math.ceil(left - 1e-9)))
        left -= amount
        out.append(Loan(tenant, scope, amount, spare, auto_return[tenant], terms))
    return out, left


def _spare(
    model: ClusterModel, policy: Policy, tenant: str, scope: str, usage: dict
) -> tuple[float, float] | None:
    """(quota, unused quota) of a lender in `scope`; None where it has no quota there."""
    if tenant == UNASSIGNED:
        limit, used = unassigned_quota(model, policy.quotas, scope, usage)
        return limit, max(0.0, limit - used)
    limit = policy.quotas.get((tenant, scope))
    if limit is None:
        return None
    return limit, limit - usage[(tenant, scope)]


def _tenant_terms(
    model: ClusterModel,
    policy: Policy,
    head: Request,
    shortfall: dict[str, float],
    usage: dict,
    run_s: float,
) -> list[Loan] | str:
    """The loans of the per-tenant `borrowing:` form, or why there is none."""
    rules = policy.borrow_rules(head.tenant)
    assert rules is not None  # policy.lends without loan_rules: a borrowing section
    priority = head.priority if head.priority is not None else 0
    if priority < rules.priority_threshold:
        unset = " (the request gives none: 0 assumed)" if head.priority is None else ""
        return (
            f"priority {priority}{unset} is under the borrowing threshold "
            f"{rules.priority_threshold}"
        )
    if not rules.preemption and run_s > rules.auto_return_s:
        return (
            f"expected run {run_s / 3600:.1f} h exceeds the auto-return "
            f"{rules.auto_return_s / 3600:.1f} h and preemption is not allowed"
        )
    out: list[Loan] = []
    for scope, short in shortfall.items():
        own = policy.quotas[(head.tenant, scope)]
        if short > rules.max_borrow_ratio * own + 1e-9:
            return (
                f"{head.tenant!r} needs {short:g} GPUs more than its quota of {own:g}"
                f"{f' on {scope}' if scope else ''}; it may borrow at most "
                f"{rules.max_borrow_ratio:g} x {own:g} = {rules.max_borrow_ratio * own:g} "
                "(max_borrow_ratio x quota)"
            )
        lenders = []
        for tenant in sorted({t for t, s in policy.quotas if s == scope} | {UNASSIGNED}):
            if tenant == head.tenant:
                continue
            lender_rules = policy.borrow_rules(tenant)
            if tenant == UNASSIGNED:
                # a scheduler lending only within cohorts keeps what no quota covers
                if lender_rules is not None and (not lender_rules.lend or rules.cohort):
                    continue
            elif lender_rules is None or not lender_rules.lend:
                continue
            elif rules.cohort and lender_rules.cohort != rules.cohort:
                continue  # a cohort lends only to its members
            held = _spare(model, policy, tenant, scope, usage)
            if held is None:
                continue
            available = held[1]
            if tenant != UNASSIGNED and lender_rules.max_lend_gpus is not None:
                available = min(available, lender_rules.max_lend_gpus)  # a lending limit
            if available > 1e-9:
                lenders.append((available, tenant, available, held[1], ""))
        taken, left = _take(head, scope, short, lenders, defaultdict(lambda: rules.auto_return_s))
        if left > 1e-9:
            where = f" on {scope}" if scope else ""
            return f"lenders have only {short - left:g} unused GPUs{where}, {short:g} needed"
        out += taken
    return out


def _pair_terms(
    model: ClusterModel,
    policy: Policy,
    head: Request,
    shortfall: dict[str, float],
    usage: dict,
) -> list[Loan] | str:
    """The loans of the per-pair `borrowing_rules:` form, or why there is none: each lender
    lends at most its unused quota and `max_borrowable_ratio` x its quota, to jobs at or
    above the pair's `priority_threshold`."""
    rules = policy.rules_for(head.tenant)
    if not rules:
        pairs = ", ".join(f"{r.lender} -> {r.borrower}" for r in policy.loan_rules)
        return f"no borrowing rule lends to {head.tenant!r} (rules: {pairs})"
    priority = head.priority if head.priority is not None else 0
    unset = " (the request gives none: 0 assumed)" if head.priority is None else ""
    eligible = [r for r in rules if priority >= r.priority_threshold]
    if not eligible:
        thresholds = ", ".join(f"{r.lender} -> {r.borrower} {r.threshold_text()}" for r in rules)
        return f"priority {priority}{unset} is under the threshold of every rule: {thresholds}"
    out: list[Loan] = []
    for scope, short in shortfall.items():
        lenders, limits = [], []
        for rule in eligible:
            held = _spare(model, policy, rule.lender, scope, usage)
            if held is None:
                continue
            quota, spare = held
            cap = rule.max_borrowable_ratio * quota
            available = max(0.0, min(spare, cap))
            terms = (
                f"at most max_borrowable_ratio {rule.max_borrowable_ratio:g} x its quota "
                f"{quota:g} = {cap:g}"
            )
            limits.append(f"{rule.lender} {available:g} ({spare:g} unused, {terms})")
            if available > 1e-9:
                lenders.append((available, rule.lender, available, spare, terms))
        auto_return = {r.lender: r.auto_return_s for r in eligible}
        taken, left = _take(head, scope, short, lenders, auto_return)
        if left > 1e-9:
            where = f" on {scope}" if scope else ""
            skipped = [r for r in rules if r not in eligible]
            under = (
                "; under the priority threshold of "
                + ", ".join(f"{r.lender} ({r.threshold_text()})" for r in skipped)
                if skipped
                else ""
            )
            return (
                f"{head.tenant!r} needs {short:g} GPUs more than its quota{where}; its lenders "
                f"may lend {short - left:g}: {'; '.join(limits) or 'none'}{under}"
            )
        out += taken
    return out


def _loan_action(head: Request, loan: Loan) -> Action:
    where = f" on {loan.scope}" if loan.scope else ""
    who = "capacity no quota covers" if loan.lender == UNASSIGNED else f"{loan.lender!r}"
    terms = f" ({loan.terms})" if loan.terms else ""
    return Action(
        "borrow",
        job=head.job,
        tenant=head.tenant,
        quota=((head.tenant, loan.scope, loan.amount), (loan.lender, loan.scope, -loan.amount)),
        reason=(
            f"{who} lends {loan.amount:g} of {loan.spare:g} unused GPUs{where}{terms} to "
            f"{head.tenant!r} so {head.job} can start; back at its end, at the latest in "
            f"{_hours(loan.auto_return_s)}"
        ),
        cost=Cost(
            jobs=(head.job,),
            tenants=tuple(t for t in (head.tenant, loan.lender) if t != UNASSIGNED),
        ),
    )


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.3g} h"


def _refused(goal: str, reason: str) -> Plan:
    """A borrow plan that cannot be made, and why."""
    return Plan(goal, False, reason=reason, method="borrow")


def _placement(
    model: ClusterModel, policy: Policy, parts: Sequence[Request], slots: Sequence[Slot]
) -> list[Action]:
    request = parts[0]
    rack_local = sum(p.tasks for p in parts) > 1 and policy.rack_locality
    actions = []
    for slot in slots:
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
                    rack_local=rack_local,
                    reason=f"start {request.job} on {name} (free now)"
                    + crossing_note(model, list(rows)),
                    cost=Cost(
                        jobs=(request.job,), tenants=(request.tenant,) if request.tenant else ()
                    ),
                )
            )
    return actions


def _finish(
    model: ClusterModel,
    policy: Policy,
    parts: Sequence[Request],
    goal: str,
    place: list[Action],
    loans: list[Action],
    back: dict[str, Any],
    note: str,
) -> Plan:
    request = parts[0]
    actions = loans + place
    result = check_plan(model, actions, policy, request.priority)
    if not result.ok:
        return _refused(goal, f"replay refused: {result}")
    before, after, benefit = outcome(model, place, shapes_with([p.shape for p in parts]))
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
