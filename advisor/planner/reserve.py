"""Reservations: hold GPUs for a large job from the time they become free, so it starts early.

Every GPU gets a ready time: now if free, else the predicted end of the last task on it
(`observed.expected_end`: a forecast where given, known end times, else a duration prior, and
each plan says which), infinity if unusable. A node is ready for one task of the job once
enough of its GPUs are and, where the job asks for CPU and memory, once enough of those are
free too (its tasks ending in predicted order; a node smaller than the task never is). For a job of K tasks x k GPUs, each node offers
its k earliest-ready GPUs (inside one NVLink island when k fits one); a multi-node job needs K
nodes of one rack and one GPU model (`rack_locality`), a single-node job one node. The
earliest start T is the K-th smallest node time in the best group; among the nodes ready by T
the K that leave the fewest GPU-hours idle waiting (each node holds its latest-ready k GPUs
that are ready by T) are chosen, and between groups with the same T the one with less idle
time wins: the job starts as early as possible, then as little as possible sits idle.

The plan: `reserve` actions for the chosen GPUs that are free now (held from now; checked by
`check_plan`, quotas included), and `extra["schedule"]` for the GPUs that become free later
(hold from their ready time, after the listed tasks end; a job the forecast expects later is
held from its expected arrival, minus `hold_lead_s`, and placed on the GPUs that free up
closest to it). `extra` also says the idle GPU-hours
while waiting, the backfill window (jobs predicted to end before T may use the held GPUs
meanwhile), and when to release the reservation if the job has not started
(`release_after_s` after T).

A standing reservation (its placeholders: allocations of qos `RESERVATION_QOS` on the GPUs it
holds) is the job's own: its next plan counts those GPUs ready now and the rest of the nodes
cordoned for it ready as their tasks end (`own_view`), so a reservation whose planned start
passed (tasks that outlived their forecast) is renewed from what it gathered, not started
again elsewhere; no other job counts held GPUs as ever ready.

`plan_reservations(model, policy, requests, outlook)` plans several jobs in priority order;
each later one sees the earlier holds (held until start + expected duration), reports the
delay they cause (`conflicts`), and a quota conflict (the tenant's GPUs at T, after its own
predicted ends, plus the job, above its quota) makes that plan infeasible with the numbers.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from advisor.fragmentation.measures import Shape
from advisor.fragmentation.nvlink import crossing_note
from advisor.model import MILLI, RESERVATION_QOS, ClusterModel, spec_allows
from advisor.planner.actions import Action, Cost, GpuSet, Plan
from advisor.planner.check import check_plan
from advisor.planner.consolidate import summary
from advisor.planner.constraints import (
    ANY_MODEL,
    Policy,
    island_size_per_node,
    needs_one_island,
)
from advisor.planner.observed import DurationPrior, end_source, expected_end, now_of
from advisor.planner.outcome import outcome, shapes_with


@dataclass(frozen=True)
class Request:
    """A job to reserve for: `tasks` x `num_gpu` whole GPUs of a model `gpu_spec` allows."""

    job: str
    tenant: str = ""
    priority: int | None = None
    tasks: int = 1
    num_gpu: int = 8
    gpu_spec: str = ""
    duration_s: float | None = None  # expected run time (None: the duration prior's mean)
    expected_at: float | None = None  # forecast arrival (None: it is waiting now)
    cpu_milli: float = 0.0  # per task; a node must also have this much CPU for it
    memory_mib: float = 0.0  # per task

    @property
    def gpus(self) -> int:
        return self.tasks * self.num_gpu

    @property
    def shape(self) -> Shape:
        return Shape(self.num_gpu, MILLI, self.tasks, gpu_spec=self.gpu_spec)


@dataclass(frozen=True)
class Outlook:
    """What forecasts add: predicted ends (time by allocation id or job) and expected jobs."""

    job_end: Mapping[str, float] = field(default_factory=dict)
    demand: tuple[Request, ...] = ()


@dataclass(frozen=True)
class ReserveSettings:
    release_after_s: float = 1800.0  # release if the job has not started this long after T
    prior: DurationPrior = field(default_factory=DurationPrior)
    min_gpus: int = 8  # pending jobs at least this large get reservations
    hold_lead_s: float = 0.0  # forecast jobs: hold this long before the expected arrival


@dataclass(frozen=True)
class Slot:
    start: float
    nodes: tuple[tuple[int, tuple[int, ...]], ...]  # (node row, GPU rows)
    idle_gpu_s: float


# --------------------------------------------------------------------------- slots


def gpu_ready_times(
    model: ClusterModel,
    ends: np.ndarray,
    cordoned_too: bool = False,
    holds: Mapping[str, np.ndarray] | None = None,
) -> np.ndarray:
    """float64 (G): when each GPU is wholly free (now, a predicted end, or inf if unusable, or
    in MIG mode: its instances ending leave a MIG GPU, not a whole one). GPUs a standing
    reservation holds are never ready (for another job; `own_view` gives them to theirs);
    `cordoned_too`: GPUs of cordoned nodes are ready as their tasks end, as for the job a
    reservation cordoned them for. `holds`: `standing_holds(model)` when the caller has it."""
    now = now_of(model)
    places = model.placements
    ready = np.full(len(model.gpus), now, dtype=np.float64)
    if len(places):
        np.maximum.at(ready, places.gpu, np.maximum(ends[places.alloc], now))
    gpus = model.gpus
    usable = gpus.healthy & ~gpus.lost if cordoned_too else model.gpu_usable
    ready[~usable | gpus.mig_enabled] = np.inf
    for rows in (standing_holds(model) if holds is None else holds).values():
        ready[rows] = np.inf
    return ready


def standing_holds(model: ClusterModel) -> dict[str, np.ndarray]:
    """GPU rows each job's standing reservation holds (placed allocations of qos
    `RESERVATION_QOS`, a reservation's placeholders), by job."""
    allocs, places = model.allocations, model.placements
    rows = np.flatnonzero((allocs.qos == RESERVATION_QOS) & (allocs.node >= 0))
    if not rows.size:
        return {}
    out: dict[str, np.ndarray] = {}
    for job in sorted(set(allocs.job[rows].tolist())):
        mine = rows[allocs.job[rows] == job]
        out[str(job)] = np.unique(places.gpu[np.isin(places.alloc, mine)])
    return out


def own_view(
    model: ClusterModel, ready: np.ndarray, open_ready: np.ndarray, held: np.ndarray
) -> np.ndarray:
    """`ready` as seen by the job whose reservation holds GPU rows `held`: those are its own,
    ready now, and the other GPUs of the nodes it holds (cordoned for it) are ready when their
    tasks end (`open_ready`). So a renewed plan keeps what the reservation has gathered rather
    than starting again elsewhere."""
    out = ready.copy()
    on = np.isin(model.gpus.node, np.unique(model.gpus.node[held]))
    opened = on & np.isinf(out)
    out[opened] = open_ready[opened]
    out[held] = now_of(model)
    return out


def _node_choice(
    model: ClusterModel, ready: np.ndarray, node: int, k: int, island: int, at: float | None
) -> tuple[float, list[int]] | None:
    """(time k GPUs are ready, the GPU rows) on `node`; with `at`, the k latest ready by `at`
    (least idle); islands honoured when k fits one (`island` = largest island size)."""
    start, stop = model.nodes.gpu_offset[node], model.nodes.gpu_offset[node + 1]
    rows = np.arange(start, stop)
    groups = [rows]
    if needs_one_island(k, island):
        ids = model.gpus.nvlink_island[rows]
        groups = [rows[ids == i] for i in np.unique(ids)]
    best: tuple[float, float, list[int]] | None = None
    for group in groups:
        if len(group) < k:
            continue
        times = ready[group]
        if at is None:
            pick = group[np.argsort(times, kind="stable")[:k]]
        else:
            ok = group[times <= at]
            if len(ok) < k:
                continue
            pick = ok[np.argsort(-ready[ok], kind="stable")[:k]]
        when = float(ready[pick].max())
        if not math.isfinite(when):
            continue
        idle = float((max(when, at or when) - ready[pick]).sum())
        if best is None or (when, idle) < (best[0], best[1]):
            best = (when, idle, sorted(pick.tolist()))
    return None if best is None else (best[0], best[2])


def node_ready_times(
    model: ClusterModel, ready: np.ndarray, k: int, island: np.ndarray | None
) -> np.ndarray:
    """float64 (N): when k GPUs of each node are ready (k-th smallest ready time, within one
    NVLink island where k fits one, `island` = largest island per node or None); inf if never."""
    gpus = model.gpus
    node = gpus.node.astype(np.int64)
    n = len(model.nodes)
    if not len(gpus):
        return np.full(n, np.inf)
    if island is not None:
        per_island = needs_one_island(k, island[node]) & (gpus.nvlink_island >= 0)
    else:
        per_island = np.zeros(len(gpus), dtype=bool)
    key = node * 65536 + np.where(per_island, gpus.nvlink_island.astype(np.int64) + 1, 0)
    order = np.lexsort((ready, key))
    skey, sready = key[order], ready[order]
    starts = np.flatnonzero(np.r_[True, skey[1:] != skey[:-1]])
    sizes = np.diff(np.r_[starts, len(skey)])
    kth = np.full(len(starts), np.inf)
    ok = sizes >= k
    kth[ok] = sready[starts[ok] + k - 1]
    out = np.full(n, np.inf)
    np.minimum.at(out, skey[starts] // 65536, kth)
    return out


def node_room_times(
    model: ClusterModel, ends: np.ndarray, cpu_milli: float, memory_mib: float
) -> np.ndarray:
    """float64 (N): when each node has `cpu_milli` CPU and `memory_mib` memory free for one more
    task, as its allocations end at `ends` (now if it has them now; inf if its capacity is
    smaller). A capacity the source does not know is no constraint (NaN: unknown)."""
    now = now_of(model)
    out = np.full(len(model.nodes), now, dtype=np.float64)
    allocs = model.allocations
    placed = np.flatnonzero(allocs.node >= 0)
    for need, capacity, free, held in (
        (cpu_milli, model.nodes.cpu_milli, model.node_cpu_free, allocs.cpu_milli),
        (memory_mib, model.nodes.memory_mib, model.node_memory_free, allocs.memory_mib),
    ):
        if not need > 0:
            continue
        out[capacity < need] = np.inf  # NaN capacity compares false: unknown, no constraint
        short = np.flatnonzero((free < need) & (capacity >= need))
        if not short.size:
            continue
        rows = placed[np.isin(allocs.node[placed], short)]
        node = allocs.node[rows].astype(np.int64)
        end = np.maximum(ends[rows], now)
        order = np.lexsort((end, node))
        node, end, amount = node[order], end[order], np.nan_to_num(held[rows][order])
        bounds = np.searchsorted(node, short, side="left"), np.searchsorted(node, short, "right")
        for n, lo, hi in zip(short.tolist(), *bounds, strict=True):
            freed = np.cumsum(amount[lo:hi])
            enough = np.flatnonzero(free[n] + freed >= need - 1e-9)
            out[n] = max(out[n], float(end[lo + enough[0]]) if enough.size else np.inf)
    return out


MAX_TIES = 64  # equally early candidates compared by idle time (the rest are not examined)


def earliest_slot(
    model: ClusterModel,
    ready: np.ndarray,
    request: Request,
    policy: Policy,
    not_before: float | None = None,
    room: np.ndarray | None = None,
) -> Slot | None:
    """The earliest start for `request` given per-GPU ready times (module docstring); with
    `not_before` (a forecast arrival) the start is at least that, and the GPUs are the ones
    that leave the least idle time by then. `room` (N): when each node has the CPU and memory
    a task needs (`node_room_times`; None: not a constraint)."""
    k, tasks = request.num_gpu, request.tasks
    island = island_size_per_node(model) if policy.island_locality else None
    nodes = model.nodes
    times = node_ready_times(model, ready, k, island)
    if room is not None:
        times = np.maximum(times, room)
    models = nodes.gpu_model
    allowed = {m for m in set(models.tolist()) if spec_allows(request.gpu_spec, str(m))}
    usable = np.isfinite(times) & np.isin(models, list(allowed))
    if tasks == 1:  # one node per group: no grouping to do
        candidates = np.flatnonzero(usable)
        return _best_slot(
            model,
            ready,
            request,
            island,
            [(float(times[n]), [n]) for n in candidates.tolist()],
            times,
            not_before,
        )
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for node in np.flatnonzero(usable).tolist():
        if tasks > 1 and policy.rack_locality:
            if not nodes.rack[node]:
                continue  # a rack-local job cannot use a node whose rack is unknown
            key = (str(nodes.rack[node]), str(models[node]))
        elif tasks > 1:
            key = ("", str(models[node]))
        else:
            key = (str(node), "")
        groups[key].append(node)
    starts = []
    for members in groups.values():
        if len(members) >= tasks:
            member_times = np.sort(times[members])
            starts.append((float(member_times[tasks - 1]), members))
    return _best_slot(model, ready, request, island, starts, times, not_before)


def _best_slot(
    model: ClusterModel,
    ready: np.ndarray,
    request: Request,
    island: np.ndarray | None,
    starts: list[tuple[float, list[int]]],
    times: np.ndarray,
    not_before: float | None,
) -> Slot | None:
    """Among groups that can start at the earliest time (`starts`: each group's start and
    nodes), the one leaving the fewest GPU-hours idle."""
    k, tasks = request.num_gpu, request.tasks
    if not starts:
        return None
    first = min(t for t, _ in starts)
    if not_before is not None:
        first = max(first, not_before)
    ready_by = sorted(((t, m) for t, m in starts if t <= first + 1e-6), key=lambda x: -x[0])
    ties = [m for _, m in ready_by[:MAX_TIES]]  # latest-ready groups first: least idle
    best: Slot | None = None
    for members in ties:
        picks = []
        for n in members:
            if times[n] > first + 1e-6:
                continue
            size = int(island[n]) if island is not None else 0
            choice = _node_choice(model, ready, n, k, size, first)
            if choice is not None:
                rows = choice[1]
                picks.append((float((first - ready[rows]).sum()), n, tuple(rows)))
        if len(picks) < tasks:
            continue
        picks.sort()
        chosen = picks[:tasks]
        slot = Slot(first, tuple((n, rows) for _, n, rows in chosen), sum(p[0] for p in chosen))
        if best is None or slot.idle_gpu_s < best.idle_gpu_s:
            best = slot
    return best


# --------------------------------------------------------------------------- requests


def pending_requests(model: ClusterModel, min_gpus: int = 8) -> list[Request]:
    """Pending jobs (unplaced tasks grouped by job) of at least `min_gpus` whole GPUs."""
    allocs = model.allocations
    rows = np.flatnonzero((allocs.node < 0) & (allocs.num_gpu > 0) & (allocs.gpu_milli == MILLI))
    by_job: dict[str, list[int]] = defaultdict(list)
    for row in rows.tolist():
        by_job[str(allocs.job[row])].append(row)
    out = []
    for job, members in by_job.items():
        first = members[0]
        request = Request(
            job=job,
            tenant=str(allocs.tenant[first]),
            priority=int(allocs.priority[members].max()),
            tasks=len(members),
            num_gpu=int(allocs.num_gpu[members].max()),
            gpu_spec=str(allocs.gpu_spec[first]),
            cpu_milli=float(np.nan_to_num(allocs.cpu_milli[members]).max()),
            memory_mib=float(np.nan_to_num(allocs.memory_mib[members]).max()),
        )
        if request.gpus >= min_gpus:
            out.append(request)
    return sorted(out, key=lambda r: (-(r.priority or 0), -r.gpus, r.job))


def tenant_usage_at(
    model: ClusterModel, ends: np.ndarray, tenant: str, at: float
) -> dict[str, float]:
    """GPUs `tenant` still holds at time `at` (allocations predicted to end by then left out),
    per quota scope ("" all models, else the GPU model)."""
    allocs = model.allocations
    placed = (allocs.node >= 0) & (allocs.tenant == tenant) & (ends > at)
    out: dict[str, float] = defaultdict(float)
    share = allocs.num_gpu * allocs.gpu_milli / MILLI
    for node, gpus in zip(allocs.node[placed].tolist(), share[placed].tolist(), strict=True):
        out[ANY_MODEL] += gpus
        out[str(model.nodes.gpu_model[node])] += gpus
    return out


def _quota_problem(
    model: ClusterModel, policy: Policy, ends: np.ndarray, request: Request, slot: Slot, held
) -> str:
    gpu_model = str(model.nodes.gpu_model[slot.nodes[0][0]])
    usage = tenant_usage_at(model, ends, request.tenant, slot.start)
    for scope in (ANY_MODEL, gpu_model):
        limit = policy.quotas.get((request.tenant, scope))
        if limit is None:
            continue
        total = usage.get(scope, 0.0) + held.get((request.tenant, scope), 0.0) + request.gpus
        if total > limit + 1e-9:
            where = f" on {scope}" if scope else ""
            return (
                f"quota: {request.tenant!r} would hold {total:g} GPUs{where} when the job starts "
                f"(quota {limit:g}); a loan (borrow) or a smaller job is needed"
            )
    return ""


def plan_reservations(
    model: ClusterModel,
    policy: Policy | None = None,
    requests: Sequence[Request] | None = None,
    outlook: Outlook | None = None,
    settings: ReserveSettings = ReserveSettings(),
) -> list[Plan]:
    """One checked plan per request that cannot start now (module docstring)."""
    policy = policy or Policy()
    outlook = outlook or Outlook()
    if requests is None:
        requests = pending_requests(model, settings.min_gpus) + list(outlook.demand)
    requests = sorted(requests, key=lambda r: -(r.priority if r.priority is not None else 0))
    now = now_of(model)
    ends = expected_end(model, settings.prior, outlook.job_end)
    holds = standing_holds(model)
    base_ready = gpu_ready_times(model, ends, holds=holds)
    ready = base_ready.copy()
    open_ready = gpu_ready_times(model, ends, True, holds) if holds else base_ready
    owner = np.full(len(model.gpus), "", dtype=object)  # earlier reservation holding the GPU
    source = end_source(model, settings.prior, outlook.job_end)
    accepted: list[Action] = []
    befores: dict[tuple[str, ...], dict[str, Any]] = {}  # before-measures per shape list
    held: dict[tuple[str, str], float] = defaultdict(float)
    plans = []
    rooms: dict[tuple[float, float], np.ndarray] = {}  # jobs of one size share their answer
    for request in requests:
        goal = f"reserve {request.tasks}x{request.num_gpu} GPUs for {request.job}"
        need = (request.cpu_milli, request.memory_mib)
        if need not in rooms:
            rooms[need] = node_room_times(model, ends, *need)
        room = rooms[need]
        alone_ready, seen = base_ready, ready
        if request.job in holds:  # its reservation stands: renew it from what it holds
            alone_ready = own_view(model, base_ready, open_ready, holds[request.job])
            seen = own_view(model, ready, open_ready, holds[request.job])
        alone = earliest_slot(model, alone_ready, request, policy, request.expected_at, room)
        slot = earliest_slot(model, seen, request, policy, request.expected_at, room)
        if slot is None:
            why = "no group of nodes can ever hold this job"
            plans.append(
                Plan(goal, False, reason=why, method="reserve", extra={"job": request.job})
            )
            continue
        if request.expected_at is None and slot.start <= now and alone is not None:
            continue  # it fits now: the scheduler starts it, nothing to hold
        conflicts = []
        if alone is not None and slot.start > alone.start + 1e-6:
            blockers = sorted({str(owner[r]) for _, rows in alone.nodes for r in rows} - {""})
            conflicts.append(
                {
                    "with": blockers,
                    "delay_s": slot.start - alone.start,
                    "why": "GPUs it would use first are held by an earlier reservation",
                }
            )
        problem = _quota_problem(model, policy, ends, request, slot, held)
        plan = _reservation_plan(
            model,
            policy,
            request,
            slot,
            (seen, owner),
            now,
            source,
            goal,
            accepted,
            settings,
            befores,
        )
        plan.extra["conflicts"] = conflicts
        if problem:
            conflicts.append({"with": ["quota"], "why": problem})
            plan = Plan(goal, False, (), reason=problem, method="reserve", extra=plan.extra)
        plans.append(plan)
        if plan.feasible:
            accepted.extend(plan.actions)
            duration = request.duration_s or math.sqrt(2.0) * settings.prior.median_s
            for _, rows in slot.nodes:
                ready[list(rows)] = slot.start + duration
                owner[list(rows)] = request.job
            gpu_model = str(model.nodes.gpu_model[slot.nodes[0][0]])
            held[(request.tenant, ANY_MODEL)] += request.gpus
            held[(request.tenant, gpu_model)] += request.gpus
    return plans


def _reservation_plan(
    model: ClusterModel,
    policy: Policy,
    request: Request,
    slot: Slot,
    state: tuple[np.ndarray, np.ndarray],
    now: float,
    source: str,
    goal: str,
    earlier: list[Action],
    settings: ReserveSettings,
    befores: dict[tuple[str, ...], dict[str, Any]],
) -> Plan:
    start = max(slot.start, request.expected_at or now)
    ready, owner = state  # ready times with earlier reservations' holds, and their jobs
    # a waiting job holds each GPU from when it is free; a forecast one from its arrival
    # (less `hold_lead_s`), so nothing sits idle for a job that has not come yet
    hold_from = np.maximum(ready, now)
    if request.expected_at is not None:
        hold_from = np.maximum(hold_from, start - settings.hold_lead_s)
    actions: list[Action] = []
    schedule = []
    places = model.placements
    idle_s = 0.0
    for node, rows in slot.nodes:
        name = str(model.nodes.name[node])
        idle_s += sum(start - float(hold_from[r]) for r in rows)
        free_now = [r for r in rows if hold_from[r] <= now and model.gpu_is_free[r]]
        later = [r for r in rows if r not in free_now]
        if free_now:
            gpus = tuple(int(model.gpus.index[r]) for r in free_now)
            actions.append(
                Action(
                    "reserve",
                    alloc=f"reserve:{request.job}:{name}",
                    job=request.job,
                    tenant=request.tenant,
                    dst=GpuSet(name, gpus),
                    priority=request.priority,
                    rack_local=request.tasks > 1 and policy.rack_locality,
                    reason=(
                        f"hold {len(gpus)} free GPU(s) of {name} for {request.job} "
                        f"(starts in {(start - now) / 3600:.1f} h by {source})"
                        + crossing_note(model, rows)
                    ),
                    cost=Cost(
                        idle_gpu_hours=len(gpus) * (start - now) / 3600.0,
                        jobs=(request.job,),
                        tenants=(request.tenant,) if request.tenant else (),
                    ),
                )
            )
        for r in later:
            holders = sorted(
                {str(model.allocations.id[a]) for a in places.alloc[places.gpu == r].tolist()}
                | ({f"reservation of {owner[r]}"} if owner[r] else set())
            )
            schedule.append(
                {
                    "node": name,
                    "gpu": int(model.gpus.index[r]),
                    "hold_from": float(hold_from[r]),
                    "after": holders,
                }
            )
    extra = {
        "job": request.job,
        "tenant": request.tenant,
        "start_at": start,
        "starts_in_s": start - now,
        "nodes": [str(model.nodes.name[n]) for n, _ in slot.nodes],
        "schedule": schedule,
        "idle_gpu_hours": idle_s / 3600.0,
        "backfill_until": start,
        "release": {
            "if_not_started_by": start + settings.release_after_s,
            "why": f"release the hold if {request.job} has not started "
            f"{settings.release_after_s / 60:g} min after its planned start",
        },
        "ends_from": source,
        "conflicts": [],
    }
    result = check_plan(model, earlier + actions, policy, request.priority)
    if not result.ok:
        why = f"the free GPUs cannot be held now: {result}"
        return Plan(goal, False, (), reason=why, method="reserve", extra=extra)
    shapes = shapes_with([request.shape])
    key = tuple(s.name for s in shapes)
    if key not in befores:
        befores[key] = summary(model, shapes)
    before, after, benefit = outcome(model, actions, shapes, befores[key])
    return Plan(goal, True, tuple(actions), before, after, "", "reserve", benefit, extra)
