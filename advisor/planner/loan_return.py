"""How a quota loan goes back, per trigger, and what that costs (`borrow.plan_borrow`'s
`extra["return"]`).

- `on_timeout` — at the earliest auto-return of the loan's lenders: a job expected to end
  before it gives the loan back at its end; one expected to outlive it is preempted after the
  grace when the return is forced (its cost: checkpoint and restart within the grace, else every
  hour it ran), else it runs on while the lenders wait.
- `on_lender_demand` — per lender wanting its quota back: the borrower's lowest-priority, most
  recently started migratable jobs are preempted (whole jobs) until it is within its quota, or
  without preemption the lender waits for the jobs expected to end first.
- every scenario's steps (the loan, the start, the preemption or the end, the inverse loans) are
  replayed by the checker.

The job's run comes from `observed.py`: the request's duration, a forecast end, else the
duration prior's mean for a job that has not started (`expected_run`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from advisor.model import MILLI, ClusterModel
from advisor.planner.actions import Action, Cost, GpuSet, restart_seconds
from advisor.planner.check import check_plan
from advisor.planner.constraints import UNASSIGNED, Policy, ReturnPolicy
from advisor.planner.observed import DurationPrior, expected_end
from advisor.planner.reserve import Request


@dataclass(frozen=True)
class Loan:
    """One lender's part of a loan: `amount` GPUs of quota in `scope` ("" all models), out of
    its `spare` unused quota, going back at the latest `auto_return_s` after the start."""

    lender: str
    scope: str
    amount: float
    spare: float
    auto_return_s: float
    terms: str = ""  # the rule's limit in words (pair form)


def expected_run(
    request: Request,
    prior: DurationPrior,
    job_end: Mapping[str, float] | None = None,
    now: float = 0.0,
) -> tuple[float, str]:
    """(seconds the request's job is expected to run, where that comes from): the request's
    own duration, a forecast end of its job, else the duration prior's mean for a job that
    has not started (`observed.DurationPrior`, as `expected_end` reads it)."""
    if request.duration_s:
        return float(request.duration_s), "the request's duration"
    end = (job_end or {}).get(request.job)
    if end is not None and math.isfinite(end) and end > now:
        return float(end - now), "forecast job ends"
    mean = float(prior.remaining(np.array([np.nan]))[0])
    return mean, f"a duration prior (Pareto, median {prior.median_s / 3600:g} h), not a forecast"


def _preemption_loss(gpus: float, restart_s: float, grace_s: float, run_s: float) -> tuple:
    """(GPU-hours lost, why) when a task of `gpus` GPUs that ran `run_s` is preempted with
    `grace_s` to checkpoint: its checkpoint + restart time when the grace covers it (as a
    migration costs), else every hour it ran (it cannot checkpoint in time)."""
    if grace_s >= restart_s:
        return gpus * restart_s / 3600.0, (
            f"{gpus:g} GPUs x its {restart_s:g} s checkpoint and restart, within the "
            f"{grace_s / 60:g} min grace"
        )
    return gpus * run_s / 3600.0, (
        f"{gpus:g} GPUs x the {run_s / 3600:.3g} h it ran: the {grace_s / 60:g} min grace is "
        f"shorter than its {restart_s:g} s checkpoint and restart"
    )


class LoanReturn:
    """How a loan goes back, per trigger: the tasks preempted, what that costs, and the
    return steps replayed by the checker after the loan."""

    def __init__(
        self,
        model: ClusterModel,
        policy: Policy,
        parts: Sequence[Request],
        place: list[Action],
        loans: list[Loan],
        actions: list[Action],
        returns: ReturnPolicy,
        run_s: float,
        ends_from: str,
        now: float,
    ) -> None:
        self.model, self.policy, self.parts, self.place = model, policy, parts, place
        self.loans, self.actions, self.returns = loans, actions, returns
        self.run_s, self.ends_from, self.now = run_s, ends_from, now
        self.head = parts[0]
        self.gpus = float(sum(p.gpus for p in parts))

    def document(self, job_end: Mapping[str, float] | None, prior: DurationPrior) -> dict:
        head, returns = self.head, self.returns
        first = min(loan.auto_return_s for loan in self.loans)
        inverse = [self._inverse(a) for a in self.actions]
        return {
            "when": f"when {head.job} ends, at the latest {first / 3600:g} h from now",
            "due_at": self.now + min(self.run_s, first),
            "auto_return_at": self.now + first,
            "grace_s": returns.timeout_grace_s,
            "preemption": returns.timeout_force,
            "then": (
                f"after {returns.timeout_grace_s / 60:g} min grace the borrowed work is preempted"
                if returns.timeout_force
                else "the job is expected to end before the auto-return; it is not preempted"
                if self.run_s <= first
                else "force_return is false: the job runs on past the auto-return, not preempted"
            ),
            "expected_run_s": self.run_s,
            "ends_from": self.ends_from,
            "on_timeout": self._on_timeout(first, inverse),
            "on_lender_demand": [
                self._on_demand(loan, job_end, prior) for loan in self._by_lender()
            ],
            "actions": [a.to_dict() for a in inverse],
        }

    def _inverse(self, loan: Action) -> Action:
        return Action(
            "borrow",
            job=loan.job,
            tenant=loan.tenant,
            quota=tuple((t, s, -d) for t, s, d in loan.quota),
            reason=f"return: {loan.reason.replace(' lends ', ' gets back ', 1)}",
        )

    def _by_lender(self) -> list[Loan]:
        """One loan per lender (its scopes' amounts; the largest names it)."""
        out: dict[str, Loan] = {}
        for loan in self.loans:
            if loan.lender not in out or loan.amount > out[loan.lender].amount:
                out[loan.lender] = loan
        return list(out.values())

    def _restart_s(self) -> float:
        """The loan's job's checkpoint + restart seconds: its pending tasks' where the source
        gives them, else the policy's default."""
        allocs = self.model.allocations
        rows = np.flatnonzero((allocs.job == self.head.job) & (allocs.node < 0))
        known = allocs.restart_cost_s[rows]
        known = known[np.isfinite(known)]
        return float(known.max()) if len(known) else self.policy.default_restart_s

    def _release(self, why: str) -> list[Action]:
        """The loan's job giving its GPUs back (it ended, or was preempted: `why`)."""
        return [
            Action("reclaim", alloc=a.alloc, job=a.job, tenant=a.tenant, src=a.dst, reason=why)
            for a in self.place
        ]

    def _check(self, steps: list[Action]) -> str:
        """The loan, then `steps`, replayed: "ok" or the broken step."""
        result = check_plan(self.model, [*self.actions, *self.place, *steps], self.policy, None)
        return "ok" if result.ok else str(result)

    def _on_timeout(self, first: float, inverse: list[Action]) -> dict[str, Any]:
        """The `timeout` trigger: the job expected to outlive its loan is preempted at the
        auto-return plus grace when `force_return`, else runs on while the lender waits."""
        head, returns, run_s = self.head, self.returns, self.run_s
        doc: dict[str, Any] = {
            "at": self.now + first,
            "force_return": returns.timeout_force,
            "grace_s": returns.timeout_grace_s,
            "outlives_loan": run_s > first,
            "preempted": [],
            "expected_cost": None,
        }
        run_h, loan_h = run_s / 3600, first / 3600
        ended = self._release(f"{head.job} ends: its GPUs and the loan go back")
        if run_s <= first:
            doc["text"] = (
                f"{head.job} is expected to end in {run_h:.1f} h ({self.ends_from}), before the "
                f"loan's {loan_h:g} h auto-return: the loan goes back at its end"
            )
            doc["check"] = self._check([*ended, *inverse])
            return doc
        if not returns.timeout_force:
            doc["text"] = (
                f"{head.job} is expected to run {run_h:.1f} h ({self.ends_from}), "
                f"{run_h - loan_h:.1f} h past the loan's {loan_h:g} h auto-return; force_return "
                "is false: it is not preempted and the lenders wait for their quota until it ends"
            )
            doc["lenders_wait_s"] = run_s - first
            doc["check"] = self._check([*ended, *inverse])
            return doc
        grace, restart = returns.timeout_grace_s, self._restart_s()
        ran = first + grace
        lost, why = _preemption_loss(self.gpus, restart, grace, ran)
        tasks = [a.alloc for a in self.place]
        doc["preempted"] = [{"job": head.job, "tasks": tasks, "gpus": self.gpus}]
        doc["expected_cost"] = {
            "restarts": len(tasks),
            "restart_s": restart * len(tasks),
            "gpu_hours": lost,
            "jobs": (head.job,),
            "tenants": (head.tenant,) if head.tenant else (),
        }
        doc["text"] = (
            f"{head.job} is expected to run {run_h:.1f} h ({self.ends_from}), past the loan's "
            f"{loan_h:g} h auto-return: with force_return it is preempted at {loan_h:g} h + "
            f"{grace / 60:g} min grace, {lost:.2f} GPU-hours lost ({why}), with "
            f"{run_h - ran / 3600:.1f} h of its run left to restart when quota allows"
        )
        preempt = self._release(f"auto-return: {head.job} is preempted after the grace")
        doc["check"] = self._check([*preempt, *inverse])
        return doc

    def _on_demand(
        self, loan: Loan, job_end: Mapping[str, float] | None, prior: DurationPrior
    ) -> dict[str, Any]:
        """The `original_tenant_demand` trigger for one lender: its quota comes back, so the
        borrower must fall back within its own: with preemption its lowest-priority, most
        recently started migratable jobs (the loan's own included) are preempted after the
        grace until that much is freed; without, the lender waits for them to end."""
        head, returns = self.head, self.returns
        amount = loan.amount
        jobs = self._borrower_jobs(loan.scope, job_end, prior)
        doc: dict[str, Any] = {
            "lender": loan.lender,
            "gpus": amount,
            "scope": loan.scope or "all models",
            "grace_s": returns.demand_grace_s,
            "preemption_allowed": returns.demand_preemption,
        }
        if not returns.demand_preemption:
            freed, wait = 0.0, None
            for job in sorted(jobs, key=lambda j: j["end"]):
                freed += job["gpus"]
                if freed >= amount - 1e-9:
                    wait = max(0.0, job["end"] - self.now)
                    break
            doc["preempted"] = []
            doc["lender_waits_s"] = wait
            doc["text"] = (
                f"if {_lender(loan.lender)} wants its {amount:g} GPUs back, preemption is not "
                "allowed: "
                + (
                    f"it waits about {wait / 3600:.1f} h, until the jobs of {head.tenant} "
                    f"expected to end first free them ({self.ends_from} for {head.job})"
                    if wait is not None
                    else f"the jobs of {head.tenant} are not expected to free that much"
                )
            )
            return doc
        chosen = _cover(
            [j for j in jobs if j["migratable"]], amount
        )  # whole jobs: a gang's tasks go together
        grace = returns.demand_grace_s
        total = Cost()
        preempted = []
        for job in chosen:
            lost, _ = _preemption_loss(job["gpus"], job["restart_s"], grace, job["ran_s"])
            total = total + Cost(
                restarts=len(job["tasks"]),
                restart_s=job["restart_s"] * len(job["tasks"]),
                gpu_hours=lost,
                jobs=(job["job"],),
                tenants=(head.tenant,) if head.tenant else (),
            )
            preempted.append(
                {
                    "job": job["job"],
                    "tasks": job["tasks"],
                    "gpus": job["gpus"],
                    "priority": job["priority"],
                }
            )
        freed = sum(j["gpus"] for j in chosen)
        doc["preempted"] = preempted
        doc["cost"] = total.to_dict()
        if freed + 1e-9 < amount:
            doc["text"] = (
                f"if {_lender(loan.lender)} wants its {amount:g} GPUs back, the migratable jobs of "
                f"{head.tenant} free only {freed:g}: the rest is work marked not migratable"
            )
            return doc
        names = ", ".join(
            f"{j['job']} ({j['gpus']:g} GPUs, priority {j['priority']})" for j in chosen
        )
        doc["text"] = (
            f"if {_lender(loan.lender)} wants its {amount:g} GPUs back: after {grace / 60:g} min "
            f"grace the lowest-priority, latest-started jobs of {head.tenant} are preempted until "
            f"it is within its quota: {names}; {total.gpu_hours:.2f} GPU-hours lost, "
            f"{total.restarts} restart(s)"
        )
        reclaims = [
            Action(
                "reclaim",
                alloc=alloc,
                job=job["job"],
                tenant=head.tenant,
                src=src,
                reason=f"{loan.lender} reclaims its quota: preempt {alloc}",
            )
            for job in chosen
            for alloc, src in zip(job["tasks"], job["sources"], strict=True)
        ]
        back = [self._inverse(a) for a in self.actions if a.quota[1][0] == loan.lender]
        doc["check"] = self._check([*reclaims, *back])
        return doc

    def _borrower_jobs(
        self, scope: str, job_end: Mapping[str, float] | None, prior: DurationPrior
    ) -> list[dict[str, Any]]:
        """The borrower's running jobs in `scope` after the loan (its placed tasks and the
        loan's job), with GPUs, priority, start, expected end and restart time."""
        model, head, now = self.model, self.head, self.now
        allocs = model.allocations
        ends = expected_end(model, prior, job_end)
        rows = np.flatnonzero((allocs.node >= 0) & (allocs.tenant == head.tenant))
        jobs: dict[str, dict[str, Any]] = {}
        for row in rows.tolist():
            node = int(allocs.node[row])
            if scope and str(model.nodes.gpu_model[node]) != scope:
                continue
            name = str(allocs.job[row])
            job = jobs.setdefault(
                name,
                {
                    "job": name,
                    "tasks": [],
                    "sources": [],
                    "gpus": 0.0,
                    "priority": int(allocs.priority[row]),
                    "start": float(allocs.start_time[row]),
                    "end": float(ends[row]),
                    "migratable": True,
                    "restart_s": restart_seconds(model, row, self.policy.default_restart_s),
                },
            )
            on = model.placements.alloc == row
            gpus = [int(model.gpus.index[g]) for g in model.placements.gpu[on]]
            job["tasks"].append(str(allocs.id[row]))
            job["sources"].append(
                GpuSet(
                    str(model.nodes.name[node]), tuple(gpus), int(model.placements.milli[on].max())
                )
            )
            job["gpus"] += float(model.placements.milli[on].sum()) / MILLI
            job["priority"] = max(job["priority"], int(allocs.priority[row]))
            job["migratable"] &= bool(allocs.migratable[row])
            job["end"] = max(job["end"], float(ends[row]))
        for job in jobs.values():
            start = job["start"]
            job["ran_s"] = max(0.0, now - start) if math.isfinite(start) else 0.0
        jobs[head.job] = {
            "job": head.job,
            "tasks": [a.alloc for a in self.place],
            "sources": [a.dst for a in self.place],
            "gpus": self.gpus,
            "priority": head.priority if head.priority is not None else 0,
            "start": now,
            "end": now + self.run_s,
            "migratable": True,
            "restart_s": self._restart_s(),
            "ran_s": 0.0,
        }
        return list(jobs.values())


def _lender(tenant: str) -> str:
    """A lender in words: a tenant, or the capacity no quota covers (wanted back by the work
    of tenants without a quota)."""
    return "capacity no quota covers" if tenant == UNASSIGNED else repr(tenant)


def _started(job: dict[str, Any]) -> float:
    start = job["start"]
    return start if math.isfinite(start) else -math.inf  # unknown start: the oldest


def _cover(jobs: list[dict[str, Any]], amount: float) -> list[dict[str, Any]]:
    """Whole jobs freeing at least `amount` GPUs, lowest priority first and, among equals, the
    most recently started (least work lost), as a reclaim preempts: within a priority, one job
    that covers what is left if any does (the smallest such), else the largest and on."""
    chosen: list[dict[str, Any]] = []
    left = amount
    by_priority: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for job in jobs:
        by_priority[job["priority"]].append(job)
    for level in sorted(by_priority):
        pool = sorted(by_priority[level], key=lambda j: (-_started(j), j["job"]))
        while left > 1e-9 and pool:
            fits = [j for j in pool if j["gpus"] >= left - 1e-9]
            pick = (
                min(fits, key=lambda j: j["gpus"]) if fits else max(pool, key=lambda j: j["gpus"])
            )
            pool.remove(pick)
            chosen.append(pick)
            left -= pick["gpus"]
        if left <= 1e-9:
            break
    return chosen
