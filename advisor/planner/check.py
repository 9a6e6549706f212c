"""Replay a plan step by step on a copy of the model and stop at the first broken rule.

Stable API:

- `check_plan(model, actions, policy=None, goal_priority=None) -> CheckResult` — `ok`, or
  the first `violation` (1-based `step`, the action, a one-line `reason`). `goal_priority`
  is the priority of the work the plan makes room for; None means the highest priority in the
  model (only the migratable flag then protects work).
- `apply_plan(model, actions) -> ClusterModel` — the model after a (checked) plan: moved
  allocations on their new GPUs (a share with the limit its target names), reclaimed ones
  unplaced, reservations as new allocations (qos "reservation", not migratable).

Rules, per step, in this order (see `advisor.planner.actions` for what each kind does):
known allocation and kind; not marked non-migratable; priority not above the goal's; `src`
is exactly what the allocation holds now; `dst` GPUs exist, are usable and have `milli` free
at this step (after `src` was given back; a MIG GPU gives what its instances carve) and are
in MIG mode exactly when the task runs in MIG instances (whole-GPU work and reservations never
take a MIG GPU); a share step that names a MIG profile (`dst.mig_profile`, a profile of the
target's model whose share `milli_of` is `dst.milli`) takes a MIG instance: onto a plain GPU
only when that GPU holds nothing else at this step (after `src` was given back), which switches
it to MIG mode from this step on (its room then being only the instances the plan carves:
later MIG-profile steps enter it while the compute and memory slices of its instances fit the
GPU's, plain work never does), and onto a GPU in MIG mode in the model where its carved room
has the profile's milli free; as many GPUs as the task needs at its share; GPU
model allowed by `gpu_spec` (and unchanged unless rebalance or policy allows); NVLink island
locality; rack locality of multi-node jobs and rack-local reservations; CPU and memory of the
target node where known (checked for what the step requests, so a node the source reports as
over-committed still takes work that requests none); tenant quotas (a step may not raise a
tenant above its quota, nor above what it held before the step when it is over already: a
tenant over quota may still move what it holds);
borrowing conserves quota per GPU model and leaves the lender within its own use (usable GPUs
beyond the sum of quotas are lent by the pseudo-tenant `UNASSIGNED`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from advisor.model import (
    ALLOCATION_COLUMNS,
    MILLI,
    NO_LIMIT,
    RESERVATION_QOS,
    Allocations,
    ClusterModel,
    Gpus,
    Placements,
    allocations_from_columns,
    spec_allows,
)
from advisor.planner.actions import MOVING_KINDS, Action
from advisor.planner.constraints import (
    ANY_MODEL,
    UNASSIGNED,
    Policy,
    island_size_per_node,
    islands_ok,
    unassigned_quota,
    usage_by_scope,
)
from advisor.planner.mig_profiles import MigProfile, milli_of, profile_named


@dataclass(frozen=True)
class Violation:
    step: int  # 1-based
    action: Action
    reason: str

    def __str__(self) -> str:
        return f"step {self.step} ({self.action.kind} {self.action.alloc}): {self.reason}"


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    violation: Violation | None = None
    steps: int = 0  # steps replayed successfully
    free_milli: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def __str__(self) -> str:
        return "OK" if self.ok else str(self.violation)


@dataclass
class _Holder:
    row: int  # allocation row, -1 for a new holder (reservation)
    node: int
    gpus: list[int]  # GPU rows
    milli: list[int]
    num_gpu: int
    priority: int
    tenant: str
    job: str
    migratable: bool
    spec: str
    cpu: float
    memory: float
    mig: bool = False  # runs in MIG instances (held MIG GPUs in the model): MIG GPUs only
    limit: int | None = None  # a share target's limit (GpuSet.limit_milli); None: unchanged


class _Replay:
    """Mutable state of one replay: free milli per GPU, holdings, node CPU/memory, quotas."""

    def __init__(
        self, model: ClusterModel, policy: Policy, goal_priority: int | None, enforce: bool = True
    ) -> None:
        self.model = model
        self.policy = policy
        self.enforce = enforce  # False: only GPU capacity is checked (apply_plan)
        allocs = model.allocations
        if goal_priority is None:
            goal_priority = int(allocs.priority.max()) if len(allocs) else 0
        self.goal_priority = goal_priority
        self.free = model.gpu_free_milli.astype(np.int64).copy()
        self.usable = model.gpu_usable
        self.cpu_free = model.node_cpu_free.copy()
        self.mem_free = model.node_memory_free.copy()
        self.island_size = island_size_per_node(model)
        self.row_of = {str(a): i for i, a in enumerate(allocs.id.tolist())}
        places = model.placements
        self._order = np.argsort(places.alloc, kind="stable")
        self._bounds = np.searchsorted(places.alloc[self._order], np.arange(len(allocs) + 1))
        self.holders: dict[str, _Holder | None] = {}  # None = reclaimed
        self.quota = dict(policy.quotas)
        self.usage = usage_by_scope(model)
        self.step_usage: dict[tuple[str, str], float] = {}  # usage before the current step
        self._unassigned_quota(model)
        self.reserve_racks: dict[str, tuple[str, str]] = {}
        self._job_rows: dict[str, np.ndarray] = {}
        # MIG mode per GPU as the plan goes: GPUs a MIG-profile share switches (row -> step)
        # hold only the instances the plan carves (row -> alloc -> profile); their free milli
        # stays 0, as an instance is carved for the task that takes it and goes with it
        self.mig = model.gpus.mig_enabled.copy()
        self.switched: dict[int, int] = {}
        self.instances: dict[int, dict[str, MigProfile]] = {}
        self.step_no = 0  # 1-based number of the step being replayed (messages)

    def _unassigned_quota(self, model: ClusterModel) -> None:
        """The pseudo-tenant UNASSIGNED holds, per quota scope (all models, or one model), the
        usable GPUs that the tenants' quotas leave over, and uses what tenants without a quota
        in that scope hold; it lends like a tenant (borrow), so loans out of spare capacity
        keep total quota conserved too."""
        scopes = {scope for (tenant, scope) in self.quota if tenant != UNASSIGNED}
        quotas = dict(self.quota)  # the policy's, before UNASSIGNED's scopes are added
        for scope in scopes:
            limit, used = unassigned_quota(model, quotas, scope, self.usage)
            self.quota[(UNASSIGNED, scope)] = limit
            self.usage[(UNASSIGNED, scope)] = used

    # ---- state lookups
    def holder(self, alloc: str) -> _Holder | None:
        if alloc in self.holders:
            return self.holders[alloc]
        row = self.row_of.get(alloc)
        if row is None:
            return None
        allocs, places = self.model.allocations, self.model.placements
        take = self._order[self._bounds[row] : self._bounds[row + 1]]
        holder = _Holder(
            row=row,
            node=int(allocs.node[row]),
            gpus=places.gpu[take].astype(int).tolist(),
            milli=places.milli[take].astype(int).tolist(),
            num_gpu=int(allocs.num_gpu[row]),
            priority=int(allocs.priority[row]),
            tenant=str(allocs.tenant[row]),
            job=str(allocs.job[row]),
            migratable=bool(allocs.migratable[row]),
            spec=str(allocs.gpu_spec[row]),
            cpu=float(allocs.cpu_milli[row]),
            memory=float(allocs.memory_mib[row]),
        )
        holder.mig = bool(self.model.gpus.mig_enabled[holder.gpus].any())
        self.holders[alloc] = holder
        return holder

    def gpu_rows(self, node: int, indices: Sequence[int]) -> list[int] | str:
        rows = []
        for index in indices:
            try:
                rows.append(self.model.gpu_row(node, int(index)))
            except KeyError as error:
                return str(error.args[0])
        return rows

    def job_rows(self, job: str) -> np.ndarray:
        if job not in self._job_rows:
            self._job_rows[job] = np.flatnonzero(self.model.allocations.job == job)
        return self._job_rows[job]

    def job_racks(self, job: str) -> set[str]:
        racks = set()
        rack = self.model.nodes.rack
        for row in self.job_rows(job).tolist():
            holder = self.holder(str(self.model.allocations.id[row]))
            if holder is not None and holder.node >= 0:
                racks.add(str(rack[holder.node]))
        return racks

    # ---- one step
    def step(self, action: Action) -> str | None:
        """Apply `action`; return why it is not allowed (state is then undefined)."""
        self.step_usage = dict(self.usage)  # a step may not raise a tenant above its quota
        if action.kind == "borrow":
            return self._borrow(action)
        if action.kind == "reserve":
            if action.alloc in self.row_of or action.alloc in self.holders:
                return f"reservation id {action.alloc!r} is already in use"
            holder = _Holder(
                row=-1,
                node=-1,
                gpus=[],
                milli=[],
                num_gpu=len(action.dst.gpus) if action.dst else 0,
                priority=self.goal_priority if action.priority is None else action.priority,
                tenant=action.tenant,
                job=action.job or action.alloc,
                migratable=False,
                spec="",
                cpu=math.nan,
                memory=math.nan,
            )
            self.holders[action.alloc] = holder
            return self._take(action, holder, None)
        holder = self.holder(action.alloc)
        if holder is None:
            if action.alloc in self.holders:
                return f"{action.alloc!r} was already reclaimed earlier in the plan"
            return f"no allocation {action.alloc!r} in the model"
        if self.enforce and holder.row >= 0 and not holder.migratable:
            return f"{action.alloc!r} is marked not migratable"
        if holder.row < 0 and action.kind in MOVING_KINDS:
            return f"{action.alloc!r} is a reservation; reservations are not moved"
        if self.enforce and holder.priority > self.goal_priority:
            return (
                f"{action.alloc!r} has priority {holder.priority}, above the goal's "
                f"{self.goal_priority}: never move higher-priority work for lower"
            )
        src = action.src
        assert src is not None  # every non-reserve, non-borrow kind has a source
        if holder.node < 0:
            return f"{action.alloc!r} holds no GPUs to give back"
        if str(self.model.nodes.name[holder.node]) != src.node:
            return (
                f"{action.alloc!r} is on {self.model.nodes.name[holder.node]}, "
                f"not on {src.node} as the step says"
            )
        rows = self.gpu_rows(holder.node, src.gpus)
        if isinstance(rows, str):
            return rows
        if sorted(rows) != sorted(holder.gpus):
            return f"{action.alloc!r} does not hold exactly GPUs {list(src.gpus)} of {src.node}"
        old_node = holder.node
        for row, milli in zip(holder.gpus, holder.milli, strict=True):
            if self.instances.get(row, {}).pop(action.alloc, None) is not None:
                continue  # its instance on a GPU switched by the plan goes with it
            self.free[row] += milli if self.usable[row] else 0
        old_model = str(self.model.nodes.gpu_model[old_node])
        old_share = sum(holder.milli) / MILLI
        self._charge(holder.tenant, old_model, -old_share)
        holder.gpus, holder.milli = [], []
        if action.kind == "reclaim":
            holder.node = -1
            self._node_resources(old_node, holder, +1)
            self.holders[action.alloc] = None
            return None
        return self._take(action, holder, old_node)

    def _take(self, action: Action, holder: _Holder, old_node: int | None) -> str | None:
        dst = action.dst
        assert dst is not None
        model = self.model
        try:
            node = model.node_index(dst.node)
        except KeyError:
            return f"no node {dst.node!r} in the model"
        rows = self.gpu_rows(node, dst.gpus)
        if isinstance(rows, str):
            return rows
        if action.kind in ("migrate", "rebalance"):
            if len(rows) != holder.num_gpu:
                return f"target has {len(rows)} GPUs, {action.alloc!r} needs {holder.num_gpu}"
            if holder.row >= 0 and dst.milli != int(model.allocations.gpu_milli[holder.row]):
                return (
                    f"target share {dst.milli} milli differs from the task's "
                    f"{int(model.allocations.gpu_milli[holder.row])} (use share for that)"
                )
        if action.kind == "share" and len(rows) != holder.num_gpu:
            return f"target has {len(rows)} GPUs, {action.alloc!r} needs {holder.num_gpu}"
        if dst.mig_profile is not None and action.kind != "share":
            return f"only a share step may name a MIG profile, not a {action.kind}"
        for row, index in zip(rows, dst.gpus, strict=True):
            if not self.usable[row]:
                return f"{dst.node}/gpu{index} is not usable (unhealthy, lost or cordoned)"
            if dst.mig_profile is not None:
                why = self._mig_rule(action, row, f"{dst.node}/gpu{index}")
                if why:
                    return why
                continue
            if bool(self.mig[row]) != holder.mig:
                switched = (
                    f" (switched at step {self.switched[row]})" if row in self.switched else ""
                )
                return (
                    f"{dst.node}/gpu{index} is in MIG mode{switched}; {action.alloc!r} takes "
                    + ("whole GPUs" if dst.milli == MILLI else "a plain GPU share, no MIG profile")
                    if not holder.mig
                    else f"{dst.node}/gpu{index} is not in MIG mode; {action.alloc!r} runs in "
                    "MIG instances"
                )
            if self.free[row] < dst.milli:
                return (
                    f"{dst.node}/gpu{index} has {int(self.free[row])} milli free at this step, "
                    f"the step needs {dst.milli}"
                )
        gpu_model = str(model.nodes.gpu_model[node])
        share = dst.milli * len(rows) / MILLI
        if not self.enforce:
            if old_node is not None:
                self._node_resources(old_node, holder, +1)
            self._node_resources(node, holder, -1)
            self._occupy(action, holder, rows)
            holder.node, holder.gpus, holder.milli = node, rows, [dst.milli] * len(rows)
            self._charge(holder.tenant, gpu_model, share)
            return None
        if not spec_allows(holder.spec, gpu_model):
            return f"{dst.node} has {gpu_model or 'unknown'} GPUs; {action.alloc!r} asks for {holder.spec}"
        if old_node is not None and action.kind != "rebalance":
            old_model = str(model.nodes.gpu_model[old_node])
            if old_model != gpu_model and not self.policy.allow_model_change:
                return (
                    f"moves {action.alloc!r} from {old_model} to {gpu_model}; only a rebalance "
                    "may change the GPU model"
                )
        if self.policy.island_locality:
            islands = model.gpus.nvlink_island[rows]
            if not islands_ok(islands, int(self.island_size[node])):
                return (
                    f"splits {action.alloc!r} ({len(rows)} GPUs) across NVLink islands "
                    f"{sorted(set(islands.tolist()))} of {dst.node}, where one island would hold it"
                )
        if old_node is not None and old_node != node:
            self._node_resources(old_node, holder, +1)
            if not self._node_resources(node, holder, -1):
                return f"{dst.node} lacks the CPU or memory {action.alloc!r} requests"
        elif old_node is None and not self._node_resources(node, holder, -1):
            return f"{dst.node} lacks the CPU or memory {action.alloc!r} requests"
        self._occupy(action, holder, rows)
        holder.node, holder.gpus, holder.milli = node, rows, [dst.milli] * len(rows)
        rack = str(model.nodes.rack[node])
        if self.policy.rack_locality:
            why = self._rack_rule(action, holder, rack, gpu_model)
            if why:
                return why
        return self._charge(holder.tenant, gpu_model, share)

    def _profile(self, row: int, name: str) -> MigProfile | None:
        model = self.model
        gpu_model = str(model.nodes.gpu_model[model.gpus.node[row]])
        return profile_named(gpu_model, float(model.gpus.memory_total_bytes[row]), name)

    def _mig_rule(self, action: Action, row: int, where: str) -> str | None:
        """Why a share step may not take a MIG instance of `dst.mig_profile` on GPU `row`."""
        dst = action.dst
        assert dst is not None and dst.mig_profile is not None
        profile = self._profile(row, dst.mig_profile)
        if profile is None:
            gpu_model = self.model.nodes.gpu_model[self.model.gpus.node[row]]
            return f"{where} ({gpu_model or 'unknown model'}) has no MIG profile {dst.mig_profile}"
        if dst.milli != milli_of(profile):
            return (
                f"MIG {profile.name} is {milli_of(profile)} milli of a GPU; the step says "
                f"{dst.milli}"
            )
        if not self.mig[row]:  # a plain GPU: the step switches it to MIG mode, idle only
            held = int(self.model.gpus.carved_milli[row]) - int(self.free[row])
            if held > 0:
                return (
                    f"{where} holds other work at this step ({held} milli): switching it to MIG "
                    f"mode for a {profile.name} instance of {action.alloc!r} needs it idle"
                )
            return None
        if row in self.instances:  # switched by the plan: the carved instances must fit
            have = list(self.instances[row].values())
            compute = sum(p.compute_slices for p in have) + profile.compute_slices
            memory = sum(p.memory_slices for p in have) + profile.memory_slices
            if compute > profile.compute_total or memory > profile.memory_total:
                carved = " + ".join(p.name for p in have)
                return (
                    f"{where} in MIG mode has {carved} carved; {profile.name} beside them "
                    f"needs {compute}/{profile.compute_total} compute and "
                    f"{memory}/{profile.memory_total} memory slices"
                )
            return None
        if self.free[row] < dst.milli:  # in MIG mode already: the room its instances carve
            return (
                f"{where} has {int(self.free[row])} milli free at this step, the step needs "
                f"{dst.milli}"
            )
        return None

    def _occupy(self, action: Action, holder: _Holder, rows: list[int]) -> None:
        """Take `dst.milli` of each GPU (the guarantee: limits above it are not capacity); a
        MIG-profile step onto a plain GPU switches it."""
        dst = action.dst
        assert dst is not None
        if action.kind == "share":  # a resize sets the limit anew (none: its guarantee)
            holder.limit = NO_LIMIT if dst.limit_milli is None else dst.limit_milli
        for row in rows:
            if dst.mig_profile is not None and not self.mig[row]:
                self.mig[row] = True
                self.switched[row] = self.step_no
                self.instances[row] = {}
                self.free[row] = 0  # its room is only the instances carved from here on
            if dst.mig_profile is not None and row in self.instances:
                profile = self._profile(row, dst.mig_profile)
                assert profile is not None  # _mig_rule checked it
                self.instances[row][action.alloc] = profile
            else:
                self.free[row] -= dst.milli
        if dst.mig_profile is not None:
            holder.mig = True

    def _rack_rule(self, action: Action, holder: _Holder, rack: str, gpu_model: str) -> str | None:
        if holder.row < 0:
            if not action.rack_local:
                return None
            first = self.reserve_racks.setdefault(holder.job, (rack, gpu_model))
            if first != (rack, gpu_model) or not rack:
                return (
                    f"reservation {action.alloc!r} of job {holder.job!r} lands in rack "
                    f"{rack or '(unknown)'} / {gpu_model}, the job needs one rack ({first[0]})"
                )
            return None
        rows = self.job_rows(holder.job)
        if len(rows) < 2:
            return None
        allocs = self.model.allocations
        before = {str(self.model.nodes.rack[n]) for n in allocs.node[rows].tolist() if n >= 0}
        if len(before) != 1 or "" in before:
            return None  # the job was not rack-local to begin with (or racks unknown)
        after = self.job_racks(holder.job)
        if after != before:
            return (
                f"moves task {action.alloc!r} of job {holder.job!r} out of rack "
                f"{next(iter(before))}; the job's tasks must stay in one rack"
            )
        return None

    def _node_resources(self, node: int, holder: _Holder, sign: int) -> bool:
        cpu = 0.0 if math.isnan(holder.cpu) else holder.cpu
        memory = 0.0 if math.isnan(holder.memory) else holder.memory
        self.cpu_free[node] += sign * cpu
        self.mem_free[node] += sign * memory
        tolerance = 1e-9
        # Only what a step asks for is checked: a node already over its CPU or memory (the
        # source said so) still takes work that requests none. NaN (unknown capacity)
        # compares False: no constraint.
        return not (
            (cpu > 0 and self.cpu_free[node] < -tolerance)
            or (memory > 0 and self.mem_free[node] < -tolerance)
        )

    def _charge(self, tenant: str, gpu_model: str, gpus: float) -> str | None:
        for key in ((tenant, ANY_MODEL), (tenant, gpu_model)):
            self.usage[key] += gpus
            limit = self.quota.get(key)
            # above the quota and above what the tenant held before this step: a migration
            # of a tenant already over quota (the source said so) keeps what it holds
            before = self.step_usage.get(key, 0.0)
            if gpus > 0 and limit is not None and self.usage[key] > max(limit, before) + 1e-9:
                scope = f" on {key[1]}" if key[1] else ""
                return (
                    f"tenant {tenant!r} would hold {self.usage[key]:g} GPUs{scope}, "
                    f"above its quota of {limit:g}"
                )
        return None

    def _borrow(self, action: Action) -> str | None:
        per_model: dict[str, float] = defaultdict(float)
        for tenant, gpu_model, delta in action.quota:
            key = (tenant, gpu_model)
            if key not in self.quota:
                scope = f" on {gpu_model}" if gpu_model else ""
                return f"tenant {tenant!r} has no quota{scope} to borrow from or into"
            self.quota[key] += delta
            per_model[gpu_model] += delta
        for gpu_model, total in per_model.items():
            if abs(total) > 1e-9:
                return f"borrow changes total quota on {gpu_model or 'all models'} by {total:g}"
        for tenant, gpu_model, delta in action.quota:
            key = (tenant, gpu_model)
            if delta < 0 and self.usage[key] > self.quota[key] + 1e-9:
                return (
                    f"lender {tenant!r} uses {self.usage[key]:g} GPUs, more than the "
                    f"{self.quota[key]:g} it would keep"
                )
        return None


def check_plan(
    model: ClusterModel,
    actions: Sequence[Action],
    policy: Policy | None = None,
    goal_priority: int | None = None,
) -> CheckResult:
    """Replay `actions` in order; the first broken rule, with its step, or OK."""
    replay = _Replay(model, policy or Policy(), goal_priority)
    for step, action in enumerate(actions, start=1):
        replay.step_no = step
        reason = replay.step(action)
        if reason is not None:
            return CheckResult(False, Violation(step, action, reason), step - 1, replay.free)
    return CheckResult(True, None, len(actions), replay.free)


def apply_plan(model: ClusterModel, actions: Sequence[Action]) -> ClusterModel:
    """The model after `actions` (replayed without rule checks beyond the model's own
    validation; run `check_plan` first). A GPU a MIG-profile share switched is in MIG mode
    there, carving exactly the instances of the tasks on it (`carved_milli`)."""
    replay = _Replay(model, Policy(), None, enforce=False)
    for step, action in enumerate(actions, start=1):
        if action.kind == "borrow":
            continue
        replay.step_no = step
        reason = replay.step(action)
        if reason is not None:
            raise ValueError(f"step {step}: {reason}")
    allocs = model.allocations
    node = allocs.node.copy()
    new_rows: list[tuple[str, _Holder]] = []
    for alloc, holder in replay.holders.items():
        if holder is None:
            node[replay.row_of[alloc]] = -1
        elif holder.row >= 0:
            node[holder.row] = holder.node
        else:
            new_rows.append((alloc, holder))
    touched = {h.row for h in replay.holders.values() if h is not None and h.row >= 0}
    touched |= {replay.row_of[a] for a, h in replay.holders.items() if h is None}
    places = model.placements
    keep = ~np.isin(places.alloc, np.fromiter(touched, dtype=np.int64, count=len(touched)))
    p_alloc = [places.alloc[keep]]
    p_gpu = [places.gpu[keep]]
    p_milli = [places.milli[keep]]
    extra_rows = len(allocs)
    for holder in replay.holders.values():
        if holder is not None and holder.row >= 0 and holder.gpus:
            p_alloc.append(np.full(len(holder.gpus), holder.row, dtype=np.int32))
            p_gpu.append(np.array(holder.gpus, dtype=np.int32))
            p_milli.append(np.array(holder.milli, dtype=np.int32))
    for offset, (_, holder) in enumerate(new_rows):
        p_alloc.append(np.full(len(holder.gpus), extra_rows + offset, dtype=np.int32))
        p_gpu.append(np.array(holder.gpus, dtype=np.int32))
        p_milli.append(np.array(holder.milli, dtype=np.int32))
    limit = allocs.gpu_limit_milli.copy()
    for holder in replay.holders.values():
        if holder is not None and holder.row >= 0 and holder.limit is not None:
            limit[holder.row] = holder.limit
    new_allocs = _append_reservations(replace(allocs, node=node, gpu_limit_milli=limit), new_rows)
    new_places = Placements(
        alloc=np.concatenate(p_alloc).astype(np.int32),
        gpu=np.concatenate(p_gpu).astype(np.int32),
        milli=np.concatenate(p_milli).astype(np.int32),
    )
    return replace(
        model,
        gpus=_switched_gpus(model, replay),
        allocations=new_allocs,
        placements=new_places,
        _cache={},
    )  # __post_init__ validates the result


def _switched_gpus(model: ClusterModel, replay: _Replay) -> Gpus:
    """The GPUs with those the plan switched to MIG mode: carving their instances (MILLI, as
    the model has it for a MIG GPU of unknown layout, where none is left)."""
    if not replay.instances:
        return model.gpus
    mig = model.gpus.mig_enabled.copy()
    carved = model.gpus.carved_milli.copy()
    for row, instances in replay.instances.items():
        mig[row] = True
        carved[row] = sum(milli_of(p) for p in instances.values()) if instances else MILLI
    return replace(model.gpus, mig_enabled=mig, carved_milli=carved)


def _append_reservations(allocs: Allocations, rows: list[tuple[str, _Holder]]) -> Allocations:
    if not rows:
        return allocs
    k = len(rows)
    nan = [math.nan] * k
    extra = allocations_from_columns(
        {
            "id": [a for a, _ in rows],
            "job": [h.job for _, h in rows],
            "tenant": [h.tenant for _, h in rows],
            "priority": [h.priority for _, h in rows],
            "num_gpu": [len(h.gpus) for _, h in rows],
            "gpu_milli": [max(h.milli) for _, h in rows],
            "cpu_milli": nan,
            "memory_mib": nan,
            "gpu_spec": [""] * k,
            "node": [h.node for _, h in rows],
            "start_time": nan,
            "creation_time": nan,
            "migratable": [False] * k,
            "restart_cost_s": nan,
            "qos": [RESERVATION_QOS] * k,
        }
    )
    return Allocations(
        **{
            name: np.concatenate([getattr(allocs, name), getattr(extra, name)])
            for name in ALLOCATION_COLUMNS
        }
    )
