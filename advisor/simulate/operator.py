"""The advisor in the loop: every `every_s` it reads the simulated cluster, and its plans are
applied as an operator would apply them.

Per advisor run (`AdvisorAdapter.advise`, the service's own run step), in this order:

1. **Jobs waiting on a plan.** For each waiting job the run has plans for (a reservation for it,
   or a consolidation for its shape; `waiting_job` in the served plan), the operator takes the
   cheaper one whose window (`window`, served with the plan) is now: a consolidation costs its
   restart GPU-hours and starts the job at once; a reservation costs the GPU-hours it holds idle
   plus the job's GPUs for the hours until its planned start. A consolidation's moves must fit
   the day's migration budget (all of them, or the plan is not applied), and its nodes must not
   be held for another job (two jobs of one shape are served plans on the same node); its GPUs
   are then held for the job, which starts there. A reservation holds the GPUs free now and
   each other GPU as soon as the tasks on it end; the hold is released by the advisor's own
   rule (if the job has not started by `release.if_not_started_by`), or when the job starts
   anywhere. The advisor sees what a standing reservation holds (`advisor_adapter.model_of`),
   so each run serves the job a renewed plan from those GPUs (a later start, where its tasks
   outlive the forecast): applied, it keeps the GPUs both plans share and moves the release
   time. Waiting jobs are served in queue order, and as in Slurm's EASY backfill one
   reservation stands at a time (`MAX_HOLDS`), the head of the queue's: held GPUs sit idle for
   one job, not for every big job at once (each reservation cordons its nodes). Only a big job's wait (`BIG_GPUS`, the
   size the service plans waiting jobs for) makes moves urgent: a smaller job starts where the
   next tasks to end free room on one node, so its shape's consolidation is treated as in 2.
   While a run starts a job by consolidation and budget is left, the advisor runs again in the
   same tick on the cluster that plan left (up to `RUNS_PER_TICK`): the service plans its
   waiting jobs' goals apart, on one cluster, so jobs of one shape are served the same node
   and at most one of them can start per run. Before it runs again, the scheduler's pass
   starts the job that plan made room for (as it would right after the tick, at the same
   instant), so the next run's goals name the jobs still waiting, not that one again.
2. **Defragmentation nobody waits on** (a consolidation for a shape with no waiting job, or
   whose waiting job is not big): only in a forecast low-demand window (its window is "now"
   and a forecast said so), within the budget.
3. **Reclaims**: idle allocations the run names are ended (the replay's jobs give their
   utilization; with none, the advisor reclaims nothing).

Share, rebalance and borrow plans are not applied: the replay models no MIG, no per-model
speed and no quotas.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from advisor.planner.timing import acts
from advisor.simulate.advisor_adapter import EPOCH, Advice, AdvisorAdapter
from advisor.simulate.engine import DAY, RUNNING, Simulation

NOW = "now"
RUNS_PER_TICK = 8  # runs in one tick while each starts a job by consolidation (KAI tries 8)
MAX_HOLDS = 1  # reservations standing at once: the head of the queue's (Slurm's EASY backfill)


@dataclass
class OperatorStats:
    """What the operator did over one replay."""

    calls: int = 0
    reused: int = 0  # ticks skipped: nothing changed since the last run, in the same hour
    again: int = 0  # runs repeated in a tick whose last run started a job by consolidation
    consolidations: int = 0
    reservations: int = 0
    renewals: int = 0  # a standing reservation's plan served again: its hold renewed
    skipped_holds: int = 0  # reservations not made: `max_holds` stood already
    preemptive: int = 0
    reclaims: int = 0
    skipped_taken: int = 0  # consolidations whose GPUs another job's hold took, or not needed
    skipped_budget: int = 0  # consolidations whose moves did not fit what the day's budget left
    budget_spent: int = 0  # of those, the ones that came when the day's budget was all spent
    skipped_window: int = 0
    small_waiting: int = 0  # consolidations whose waiting job is not big: left to a window
    skipped_fit: int = 0  # a consolidation whose nodes would still lack the job's CPU/memory
    failed: int = 0
    wrong_model: dict[str, int] = field(default_factory=dict)  # plans refused, per method
    errors: list[str] = field(default_factory=list)


class AdvisorOperator:
    """A replay controller: the advisor's run step every `every_s`, its plans applied."""

    name = "on"

    def __init__(
        self,
        every_s: float,
        default_restart_s: float,
        max_holds: int = MAX_HOLDS,
        runs_per_tick: int = RUNS_PER_TICK,
    ) -> None:
        self.every_s = every_s
        self.max_holds = max_holds
        self.runs_per_tick = runs_per_tick
        self.default_restart_s = default_restart_s
        self.adapter: AdvisorAdapter | None = None
        self.stats = OperatorStats()
        self._index: dict[str, int] = {}
        self._tasks: dict[str, tuple[int, int]] = {}
        self._seen: tuple[int, int, int] | None = None

    def tick(self, sim: Simulation, now: float) -> None:
        if self.adapter is None:
            self.adapter = AdvisorAdapter(sim, self.every_s, self.default_restart_s)
            self._index = {str(n): j for j, n in enumerate(sim.jobs.name.tolist())}
        # Nothing arrived, started, ended, moved or was held since the last run, and the
        # hour (the forecast's step) and the budget's day are the same: that run read this
        # cluster and what it served was applied (or could not be), so running again would
        # only repeat it. Its answer stands; the history keeps a reading each hour.
        if self._moment(sim, now) == self._seen:
            self.stats.reused += 1
            return
        for run in range(self.runs_per_tick):  # again while a run starts a job by consolidation
            if run > 0:
                self.stats.again += 1
                # the job the last run made room for starts now (as it would after the tick),
                # so this run plans for the jobs still waiting, not for it again
                sim.schedule()
            before = self.stats.consolidations
            advice = self.adapter.advise(sim, now)
            self.stats.calls += 1
            self._apply(sim, advice)
            if self.stats.consolidations == before or sim.allowance() <= 0:
                break
        self._seen = self._moment(sim, now)  # after the runs: what they changed is seen

    @staticmethod
    def _moment(sim: Simulation, now: float) -> tuple[int, int, int]:
        """What a run's answer depends on besides the cluster's changes: the changes counted so
        far, the hour (the forecast's step) and the budget's day."""
        return sim.changes, int(now // 3600.0), int((now - sim.origin) // DAY)

    def _apply(self, sim: Simulation, advice: Advice) -> None:
        """The run's plans, applied in the order of the module docstring."""
        if advice.error and len(self.stats.errors) < 5:
            self.stats.errors.append(advice.error)
        plans = [p for p in advice.recommendations.get("plans", []) if acts(p)]
        for_job: dict[str, list[dict[str, Any]]] = {}
        preemptive: list[dict[str, Any]] = []
        reclaims: list[dict[str, Any]] = []
        for plan in plans:
            waiting = plan.get("waiting_job", "")
            if plan.get("method") == "reserve" and waiting:
                for_job.setdefault(waiting, []).append(plan)
            elif str(plan.get("goal", "")).startswith("job="):
                if waiting and self._is_big(sim, waiting):
                    for_job.setdefault(waiting, []).append(plan)
                else:
                    self.stats.small_waiting += bool(waiting)
                    preemptive.append(plan)
            elif plan.get("method") == "reclaim" or plan.get("goal") == "reclaim":
                reclaims.append(plan)
        order = {job: k for k, job in enumerate(sim.queue.jobs_waiting())} if for_job else {}
        waiting = sorted(
            (order[job], job, options)
            for name, options in for_job.items()
            if (job := self._index.get(name)) is not None and job in order
        )
        for _, job, options in waiting:
            self._serve(sim, job, options)
        for plan in preemptive:
            window = plan.get("window") or {}
            if window.get("when") != NOW or not window.get("forecast"):
                self.stats.skipped_window += 1
                continue
            if self._consolidate(sim, plan, None):
                self.stats.preemptive += 1
        for plan in reclaims:
            for action in plan["actions"]:
                if action["kind"] == "reclaim":
                    hit = self._task(sim, action["alloc"])
                    if hit is not None and sim.status[hit[0]] == RUNNING:
                        sim.reclaim(hit[0])
                        self.stats.reclaims += 1

    # ------------------------------------------------------------------ one waiting job
    def _serve(self, sim: Simulation, job: int, options: list[dict[str, Any]]) -> None:
        gpus = float(sim.jobs.gpus[job])
        ranked = []
        for plan in options:
            if (plan.get("window") or {}).get("when") != NOW:
                self.stats.skipped_window += 1
                continue
            cost = plan.get("cost") or {}
            if plan.get("method") == "reserve":
                wait_h = max(0.0, float(plan.get("starts_in_s", 0.0))) / 3600.0
                total = float(plan.get("idle_gpu_hours", 0.0)) + gpus * wait_h
            else:
                total = float(cost.get("gpu_hours", 0.0))
            ranked.append((total, plan.get("method") != "reserve", plan))
        for _, _, plan in sorted(ranked, key=lambda r: (r[0], r[1])):
            if plan.get("method") == "reserve":
                renewal = job in sim.reservations
                if not renewal and len(sim.reservations) >= self.max_holds:
                    self.stats.skipped_holds += 1
                    continue
                if self._reserve(sim, job, plan):
                    if renewal:
                        self.stats.renewals += 1
                    else:
                        self.stats.reservations += 1
                    return
            elif self._consolidate(sim, plan, job):
                self.stats.consolidations += 1
                return

    def _reserve(self, sim: Simulation, job: int, plan: dict[str, Any]) -> bool:
        targets = self._reserved(sim, plan)
        for entry in plan.get("schedule", []):
            targets.setdefault(self._node(sim, entry["node"]), []).append(int(entry["gpu"]))
        if len(targets) != int(sim.jobs.num_nodes[job]):
            self.stats.failed += 1
            return False
        if not self._models_allowed(sim, job, targets, plan):
            return False
        release = plan.get("release", {}).get("if_not_started_by")
        release_at = float(release) - EPOCH if release is not None else sim.now + self.every_s
        sim.reserve(job, {n: sorted(set(g)) for n, g in targets.items()}, release_at)
        return True

    def _consolidate(self, sim: Simulation, plan: dict[str, Any], job: int | None) -> bool:
        """Apply a consolidation's moves (all within the budget, or none), then hold its GPUs
        for `job` (None: nobody waits; the freed GPUs are left to the scheduler)."""
        moves = []
        for action in plan["actions"]:
            if action["kind"] != "migrate":
                continue
            hit = self._task(sim, action["alloc"])
            if hit is None:
                self.stats.failed += 1
                return False
            to = action["to"]
            moves.append(
                (hit[0], hit[1], self._node(sim, to["node"]), [int(g) for g in to["gpus"]])
            )
        targets = self._reserved(sim, plan)
        if job is not None and not self._can_hold(sim, job, targets):
            self.stats.skipped_taken += 1
            return False
        allowance = sim.allowance()
        if len(moves) > allowance:
            self.stats.skipped_budget += 1
            self.stats.budget_spent += allowance == 0
            return False
        if job is not None and not self._models_allowed(sim, job, targets, plan):
            return False
        if job is not None and not self._room_after(sim, job, moves, targets):
            self.stats.skipped_fit += 1
            return False
        if moves and not sim.move(moves):
            self.stats.failed += 1
            return False
        if job is None:
            return bool(moves)
        if len(targets) == int(sim.jobs.num_nodes[job]):
            need = int(sim.jobs.num_gpu[job])
            sim.reserve(
                job, {n: sorted(set(g))[:need] for n, g in targets.items()}, sim.now + self.every_s
            )
        return True

    def _reserved(self, sim: Simulation, plan: dict[str, Any]) -> dict[int, list[int]]:
        """The GPUs a plan's `reserve` actions hold, per node."""
        targets: dict[int, list[int]] = {}
        for action in plan["actions"]:
            if action["kind"] == "reserve" and action.get("to"):
                node = self._node(sim, action["to"]["node"])
                targets.setdefault(node, []).extend(int(g) for g in action["to"]["gpus"])
        return targets

    @staticmethod
    def _can_hold(sim: Simulation, job: int, targets: dict[int, list[int]]) -> bool:
        """Whether the plan's GPUs could be held for `job` once its moves are made: none of its
        nodes held for another job (a plan made beside another one that was just applied names
        the same GPUs), and the job not already holding all it needs (it starts at the next
        event). Else its moves would be spent and the job would not start."""
        standing = sim.reservations.get(job)
        if standing is not None and len(standing.held) >= standing.wanted:
            return False
        return not sim.held_for_another(job, targets)

    def _models_allowed(
        self, sim: Simulation, job: int, targets: dict[int, list[int]], plan: dict[str, Any]
    ) -> bool:
        """Whether every target node has a GPU model `job` allows: a plan that puts it on
        another model would be refused by the cluster (the kubelet's node affinity), so the
        operator does not apply it and counts it by the plan's method."""
        allowed = sim.state.access(sim.specs[job].gpu_spec)
        if all(allowed[n] for n in targets):
            return True
        method = str(plan.get("method", ""))
        self.stats.wrong_model[method] = self.stats.wrong_model.get(method, 0) + 1
        return False

    @staticmethod
    def _room_after(
        sim: Simulation,
        job: int,
        moves: list[tuple[int, int, int, list[int]]],
        targets: dict[int, list[int]],
    ) -> bool:
        """Whether `job`'s tasks fit the plan's target nodes by CPU and memory once the moves
        are made (the consolidation goal counts GPUs only; the job needs the rest too)."""
        if len(targets) != int(sim.jobs.num_nodes[job]):
            return False
        spec = sim.specs[job]
        for node in targets:
            cpu, mem = int(sim.state.cpu_free[node]), int(sim.state.mem_free[node])
            for other, task, _, _ in moves:
                placement = sim.placement[other] or []
                if task < len(placement) and placement[task][0] == node:
                    cpu += sim.specs[other].cpu_milli
                    mem += sim.specs[other].memory_mib
            if cpu < spec.cpu_milli or mem < spec.memory_mib:
                return False
        return True

    def _is_big(self, sim: Simulation, name: str) -> bool:
        """Whether the job named is big (`Simulation.big`; `BIG_GPUS` is also the service's
        waiting-job size): only such a job's wait makes moves urgent. A smaller job starts on
        GPUs that churn frees on one node; its shape's consolidation waits for a low-demand
        window like any other defragmentation."""
        job = self._index.get(name)
        return job is not None and bool(sim.big[job])

    # ------------------------------------------------------------------ names
    def _node(self, sim: Simulation, name: str) -> int:
        return sim.node_index[name]

    def _task(self, sim: Simulation, alloc: str) -> tuple[int, int] | None:
        """(job, task index) of an allocation id `NAME#TASK`."""
        name, _, task = alloc.rpartition("#")
        job = self._index.get(name)
        if job is None or not task.isdigit():
            return None
        return job, int(task)
