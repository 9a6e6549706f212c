"""The exact consolidation plan: a CP-SAT model of the final placement, with a proof of optimality
when the solver finishes within its time limit.

Model (per goal; `consolidate` holds the shared tables):
- every movable task either stays (cost 0) or moves (its cost score, see `CostWeights`), to a
  node of its GPU model/spec (and rack, if its multi-node job is rack-local); a whole-GPU task
  that fits in one NVLink island of the target node goes to one island, else it spreads over the
  node's islands; a fractional task goes to one GPU;
- GPUs inside an island are interchangeable for whole-GPU work, so capacity is counted per
  island: GPUs kept by whole tasks that stay + GPUs that host fractional work + whole GPUs moved
  in + GPUs the goal takes <= usable GPUs of the island; a GPU with fractional work holds at most
  1000 milli and never a whole task;
- the goal: K windows of G GPUs (one per node, one island when G fits in one, all in one rack
  group when K > 1), or K whole nodes emptied; CPU and memory per node where known.

The optimum is a lower bound on every ordered plan (an ordered plan ends in such a final
state). The solution is turned into concrete GPUs (moved work takes GPUs that are free now before
vacated ones), ordered so each target is free at its step, and replayed by `check_plan` like any
plan; a solution whose moves wait on each other in a cycle is reported, not returned.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from ortools.sat.python import cp_model

from advisor.fragmentation import measures
from advisor.fragmentation.measures import Shape
from advisor.model import MILLI, ClusterModel
from advisor.planner.actions import CostWeights, Plan
from advisor.planner.check import check_plan
from advisor.planner.consolidate import (
    Goal,
    Instance,
    Need,
    Window,
    build_instance,
    finish,
    heuristic_windows,
    move_actions,
    need_text,
    needs_for,
    target_nodes_mask,
)
from advisor.planner.constraints import Policy, needs_one_island
from advisor.planner.unknown_racks import rack_unknown_reason

MAX_CUTS = 5  # re-solves when a solution's moves cannot be ordered
SCALE = 100_000  # cost score -> integer objective units (resolution 1e-5 per task)
STATUS = {
    cp_model.OPTIMAL: "optimal",
    cp_model.FEASIBLE: "feasible",
    cp_model.INFEASIBLE: "infeasible",
    cp_model.MODEL_INVALID: "invalid",
    cp_model.UNKNOWN: "unknown",
}


class _Builder:
    def __init__(self, inst: Instance, needs: Sequence[Need]) -> None:
        self.inst = inst
        self.needs = needs
        self.m = cp_model.CpModel()
        model = inst.model
        self.gpu_node = model.gpus.node.astype(np.int64)
        usable = inst.usable
        # units: (node, island) with usable GPUs
        keys = self.gpu_node * 1_000_000 + inst.unit_of_gpu
        self.unit_key = keys
        self.units: dict[int, list[int]] = defaultdict(list)
        for g in np.flatnonzero(usable).tolist():
            self.units[int(keys[g])].append(g)
        self.node_units: dict[int, list[int]] = defaultdict(list)
        for key in self.units:
            self.node_units[key // 1_000_000].append(key)
        self.cap = {u: len(gs) for u, gs in self.units.items()}
        self.usage: dict[int, list] = defaultdict(list)  # unit -> linear terms (whole GPUs)
        self.frac: dict[int, list] = defaultdict(list)  # gpu -> milli terms
        self.cpu: dict[int, list] = defaultdict(list)
        self.mem: dict[int, list] = defaultdict(list)
        self.cpu_in: dict[int, list] = defaultdict(list)  # tasks moved in that request CPU
        self.mem_in: dict[int, list] = defaultdict(list)
        self.cpu_now: dict[int, int] = defaultdict(int)  # requested now, by every task
        self.mem_now: dict[int, int] = defaultdict(int)
        self.moved: dict[int, cp_model.IntVar] = {}
        # (tasks of one class, [(count var, node, {unit: GPUs per task} or GPU row)])
        self.class_opts: list[tuple[list[int], list[tuple[object, int, object]]]] = []
        self.goal_opts: list[list[tuple[object, int, dict[int, object]]]] = []
        self.f: dict[int, object] = {}

    # -- helpers
    def _spread(self, var, node: int, k: int, name: str, most: int = 1) -> dict[int, object]:
        """`var` (up to `most`) tasks of k GPUs on `node`, spread over its islands: per-unit
        GPU counts."""
        units = list(self.node_units[node])
        if len(units) == 1:
            return {units[0]: var * k}
        counts = {}
        for u in units:
            counts[u] = self.m.NewIntVar(0, min(k * most, self.cap[u]), f"{name}_u{u}")
        self.m.Add(sum(counts.values()) == k * var)
        return counts

    def _frac_gpu(self, g: int):
        if g not in self.f:
            self.f[g] = self.m.NewBoolVar(f"f{g}")
        return self.f[g]

    # -- tasks
    def add_tasks(self) -> None:
        """Stay-or-move per task; where moved tasks land is counted per class of
        interchangeable tasks (same GPUs, share, allowed nodes, CPU and memory), which keeps
        the model small and loses nothing: the cost is on the per-task `moved` variable."""
        inst = self.inst
        allocs = inst.model.allocations
        classes: dict[tuple, list[int]] = defaultdict(list)
        for t in range(len(inst.task_rows)):
            row = int(inst.task_rows[t])
            gpus = [g for g in inst.task_gpus[t].tolist() if inst.usable[g]]
            node = int(allocs.node[row])
            cpu = int(np.ceil(np.nan_to_num(allocs.cpu_milli[row])))
            mem = int(np.ceil(np.nan_to_num(allocs.memory_mib[row])))
            if not inst.task_movable[t]:
                stay = 1
            else:
                mv = self.m.NewBoolVar(f"m{t}")
                self.moved[t] = mv
                stay = 1 - mv
                classes[self._class_key(t, row, cpu, mem)].append(t)
            self.cpu[node].append(cpu * stay)
            self.mem[node].append(mem * stay)
            self.cpu_now[node] += cpu
            self.mem_now[node] += mem
            if inst.task_whole[t]:
                for g in gpus:
                    self.usage[int(self.unit_key[g])].append(stay)
                    if isinstance(stay, int):
                        self.f[g] = 0  # a whole task that stays keeps this GPU
                    else:
                        self.m.Add(self._frac_gpu(g) <= 1 - stay)
            else:
                for g, milli in zip(
                    inst.task_gpus[t].tolist(), self._milli_of(row, inst.task_gpus[t]), strict=True
                ):
                    if not inst.usable[g]:
                        continue
                    self.frac[g].append(milli * stay)
                    fg = self._frac_gpu(g)
                    if isinstance(stay, int):
                        self.m.Add(fg == 1)
                    else:
                        self.m.Add(fg >= stay)
        for key, tasks in classes.items():
            self._destinations(key, tasks)

    def _class_key(self, t: int, row: int, cpu: int, mem: int) -> tuple:
        inst = self.inst
        allocs = inst.model.allocations
        return (
            bool(inst.task_whole[t]),
            len(inst.task_gpus[t]),
            int(inst.task_milli[t]),
            str(allocs.gpu_spec[row]),
            str(inst.model.nodes.gpu_model[allocs.node[row]]),
            inst.task_rack_lock[t],
            cpu,
            mem,
        )

    def _milli_of(self, row: int, gpus: np.ndarray) -> list[int]:
        places = self.inst.model.placements
        hit = np.flatnonzero(places.alloc == row)
        by_gpu = dict(zip(places.gpu[hit].tolist(), places.milli[hit].tolist(), strict=True))
        return [int(by_gpu[g]) for g in gpus.tolist()]

    def _destinations(self, key: tuple, tasks: list[int]) -> None:
        """Integer counts of class `key` tasks landing per island (whole tasks that fit one),
        per node (larger whole tasks) or per GPU (fractional tasks)."""
        inst = self.inst
        whole, k, milli, _, _, _, cpu, mem = key
        allowed = np.flatnonzero(target_nodes_mask(inst, tasks[0]))
        size = len(tasks)
        choices: list[tuple[object, int]] = []
        opts: list[tuple[object, int, dict[int, object] | int]] = []
        name = f"c{len(self.class_opts)}"
        if whole:
            for n in allowed.tolist():
                units = self.node_units.get(n, [])
                total = sum(self.cap[u] for u in units)
                if total < k:
                    continue
                if inst.policy.island_locality and needs_one_island(k, int(inst.island_size[n])):
                    for u in units:
                        if self.cap[u] >= k:
                            y = self.m.NewIntVar(0, min(size, self.cap[u] // k), f"{name}_{u}")
                            self.usage[u].append(k * y)
                            opts.append((y, n, {u: k}))
                            choices.append((y, n))
                else:
                    y = self.m.NewIntVar(0, min(size, total // k), f"{name}_n{n}")
                    counts = self._spread(y, n, k, f"{name}_z{n}", size)
                    for u, term in counts.items():
                        self.usage[u].append(term)
                    opts.append((y, n, counts))
                    choices.append((y, n))
        else:
            ok_node = np.zeros(inst.nodes, dtype=bool)
            ok_node[allowed] = True
            for g in np.flatnonzero(inst.usable & ok_node[self.gpu_node]).tolist():
                y = self.m.NewIntVar(0, min(size, MILLI // milli), f"{name}_g{g}")
                self.frac[g].append(milli * y)
                self._frac_gpu(g)
                opts.append((y, int(self.gpu_node[g]), g))
                choices.append((y, int(self.gpu_node[g])))
        self.m.Add(sum(v for v, _ in choices) == sum(self.moved[t] for t in tasks))
        for v, n in choices:
            if cpu:
                self.cpu[n].append(cpu * v)
                self.cpu_in[n].append(v)
            if mem:
                self.mem[n].append(mem * v)
                self.mem_in[n].append(v)
        self.class_opts.append((tasks, opts))

    # -- goal
    def add_goal(self) -> None:
        inst = self.inst
        model = inst.model
        groups = measures._rack_groups(model)
        for j, need in enumerate(self.needs):
            ok = model.nodes.schedulable & measures._spec_mask(model, need.spec)
            opts: list[tuple[object, int, dict[int, object]]] = []
            per_node: dict[int, list] = defaultdict(list)
            for n in np.flatnonzero(ok).tolist():
                units = self.node_units.get(n, [])
                gpus_here = int(model.nodes.gpu_count[n])
                usable_here = sum(self.cap[u] for u in units)
                if need.whole_node:
                    if usable_here != gpus_here or gpus_here == 0:
                        continue
                    e = self.m.NewBoolVar(f"e{j}_{n}")
                    counts = {u: self.cap[u] * e for u in units}
                    opts.append((e, n, counts))
                    per_node[n].append(e)
                    continue
                if usable_here < need.gpus:
                    continue
                local = inst.policy.island_locality and needs_one_island(
                    need.gpus, int(inst.island_size[n])
                )
                if local:
                    for u in units:
                        if self.cap[u] >= need.gpus:
                            s = self.m.NewBoolVar(f"s{j}_{u}")
                            opts.append((s, n, {u: need.gpus * s}))
                            per_node[n].append(s)
                else:
                    s = self.m.NewBoolVar(f"s{j}_n{n}")
                    opts.append((s, n, self._spread(s, n, need.gpus, f"g{j}_{n}")))
                    per_node[n].append(s)
            for _, _, counts in opts:
                for u, term in counts.items():
                    self.usage[u].append(term)
            self.m.Add(sum(v for v, _, _ in opts) == need.tasks)
            for vars_ in per_node.values():
                if len(vars_) > 1:
                    self.m.Add(sum(vars_) <= 1)
            if need.same_rack:
                by_group: dict[int, list] = defaultdict(list)
                for v, n, _ in opts:
                    by_group[int(groups[n])].append(v)
                r = {grp: self.m.NewBoolVar(f"r{j}_{grp}") for grp in by_group}
                self.m.Add(sum(r.values()) == 1)
                for grp, vars_ in by_group.items():
                    for v in vars_:
                        self.m.AddImplication(v, r[grp])
            self.goal_opts.append(opts)

    # -- capacity and objective
    def add_capacity(self) -> None:
        inst = self.inst
        for u, terms in self.usage.items():
            gpus = self.units.get(u, [])
            f_terms = [self.f[g] for g in gpus if g in self.f and not isinstance(self.f[g], int)]
            if terms or f_terms:
                self.m.Add(sum(terms) + sum(f_terms) <= self.cap.get(u, 0))
        for g, terms in self.frac.items():
            fg = self.f.get(g, 0)
            self.m.Add(sum(terms) <= MILLI * fg)
        nodes = inst.model.nodes
        for values, moved_in, now, capacity in (
            (self.cpu, self.cpu_in, self.cpu_now, nodes.cpu_milli),
            (self.mem, self.mem_in, self.mem_now, nodes.memory_mib),
        ):
            for n, terms in values.items():
                if np.isnan(capacity[n]):
                    continue
                if now[n] > capacity[n]:
                    # already over (as the source reports it): nothing requesting more moves in,
                    # the checker would refuse that step
                    if moved_in[n]:
                        self.m.Add(sum(moved_in[n]) == 0)
                    continue
                self.m.Add(sum(terms) <= int(np.floor(capacity[n])))

    def objective(self, upper: int | None = None) -> None:
        """Minimise the summed cost scores of moved tasks; `upper` (a known plan's value)
        prunes everything worse."""
        total = sum(self.weight(t) * v for t, v in self.moved.items())
        if upper is not None:
            self.m.Add(total <= upper)
        self.m.Minimize(total)

    def weight(self, t: int) -> int:
        return round(float(self.inst.task_score[t]) * SCALE)


def _assign(
    builder: _Builder, solver: cp_model.CpSolver
) -> tuple[list[list[Window]], dict[int, np.ndarray]]:
    """Concrete GPUs for moved tasks and goal windows from the solved counts."""
    inst = builder.inst
    value = solver.Value
    moved = {t for t, v in builder.moved.items() if value(v)}
    taken = np.zeros(len(inst.model.gpus), dtype=bool)
    for t in range(len(inst.task_rows)):
        if t in moved:
            continue
        for g in inst.task_gpus[t].tolist():
            if inst.task_whole[t]:
                taken[g] = True
    frac_used = np.zeros(len(inst.model.gpus), dtype=bool)
    for g, fg in builder.f.items():
        if (fg if isinstance(fg, int) else value(fg)) > 0:
            frac_used[g] = True
    targets: dict[int, np.ndarray] = {}

    def take(unit: int, count: int) -> list[int]:
        gpus = [g for g in builder.units[unit] if not taken[g] and not frac_used[g]]
        gpus.sort(key=lambda g: (inst.free[g] != MILLI, g))  # free now first
        if len(gpus) < count:
            raise RuntimeError(f"unit {unit} has {len(gpus)} GPUs left, needs {count}")
        for g in gpus[:count]:
            taken[g] = True
        return gpus[:count]

    def counts_of(counts: dict[int, object]) -> dict[int, int]:
        return {u: int(c) if isinstance(c, int) else int(value(c)) for u, c in counts.items()}

    for tasks, opts in builder.class_opts:
        movers = [t for t in tasks if t in moved]
        for y, _, where in opts:
            landed = int(value(y))
            if not landed:
                continue
            if isinstance(where, int):  # fractional: one GPU
                for _ in range(landed):
                    targets[movers.pop()] = np.array([where])
                continue
            per_unit = counts_of(where)
            k = len(inst.task_gpus[movers[-1]])
            if len(per_unit) == 1:  # island-local, or a node that is one island
                unit = next(iter(per_unit))
                for _ in range(landed):
                    targets[movers.pop()] = np.array(take(unit, k))
                continue
            pool = [g for u, c in per_unit.items() for g in take(u, c)]
            for i in range(landed):
                targets[movers.pop()] = np.array(pool[i * k : (i + 1) * k])
    windows: list[list[Window]] = []
    for opts in builder.goal_opts:
        group = []
        for s, n, counts in opts:
            if value(s):
                rows = []
                for u, c in counts_of(counts).items():
                    rows += take(u, c)
                group.append(Window(n, tuple(rows), frozenset(), 0.0))
        windows.append(group)
    return windows, targets


def _add_hint(builder: _Builder, plan: Plan) -> int:
    """Start the search from a known plan (the heuristic's): moved flags, where moved tasks
    landed, and where the goal sits. Returns that plan's objective value."""
    inst = builder.inst
    model = inst.model
    task_of = {str(model.allocations.id[r]): t for t, r in enumerate(inst.task_rows.tolist())}
    dest: dict[int, list[int]] = {}
    for action in plan.actions:
        if action.kind == "migrate" and action.alloc in task_of and action.dst is not None:
            node = model.node_index(action.dst.node)
            dest[task_of[action.alloc]] = [model.gpu_row(node, i) for i in action.dst.gpus]
    for t, var in builder.moved.items():
        builder.m.AddHint(var, int(t in dest))
    for tasks, opts in builder.class_opts:
        landed: dict[object, int] = defaultdict(int)
        for t in tasks:
            if t in dest:
                gpus = dest[t]
                landed[("gpu", gpus[0])] += 1
                landed[("unit", int(builder.unit_key[gpus[0]]))] += 1
                landed[("node", int(builder.gpu_node[gpus[0]]))] += 1
        for y, n, where in opts:
            if isinstance(where, int):
                key = ("gpu", where)
            elif len(where) == 1 and isinstance(next(iter(where.values())), int):
                key = ("unit", next(iter(where)))
            else:
                key = ("node", n)
            builder.m.AddHint(y, landed.get(key, 0))
    reserved = {
        (
            model.node_index(a.dst.node),
            int(builder.unit_key[model.gpu_row(model.node_index(a.dst.node), a.dst.gpus[0])]),
        )
        for a in plan.actions
        if a.kind == "reserve" and a.dst is not None
    }
    for opts in builder.goal_opts:
        for s, n, counts in opts:
            hit = any(node == n and (len(counts) > 1 or unit in counts) for node, unit in reserved)
            builder.m.AddHint(s, int(hit))
    return sum(builder.weight(t) for t in dest if t in builder.moved)


def _stuck_moves(inst: Instance, targets: dict[int, np.ndarray]) -> list[int]:
    """Tasks whose moves cannot run in any order: from the first move the checker refuses for
    want of room that another pending move would make (a cycle), to the end."""
    moves = move_actions(inst, targets, "")
    result = check_plan(inst.model, moves, inst.policy, inst.goal_priority)
    if result.ok or result.violation is None:
        return []
    reason = result.violation.reason
    if "at this step" not in reason and "lacks the CPU or memory" not in reason:
        return []
    ids = inst.model.allocations.id
    task_of = {str(ids[r]): t for t, r in enumerate(inst.task_rows.tolist())}
    return [task_of[a.alloc] for a in moves[result.violation.step - 1 :]]


PROVED = "no placement reaches the goal (proved by the exact solver)"


def _why_each(inst: Instance, needs: Sequence[Need]) -> str:
    """The numbers behind a proved infeasibility: what fails for the first job that cannot be
    cleared alone, else that only all of them together do not fit."""
    from advisor.planner.why import why_not_cleared

    for need in needs:
        if heuristic_windows(inst, need, np.zeros(len(inst.model.gpus), dtype=bool)) is None:
            return f"no {need_text(need)} can be cleared: {why_not_cleared(inst, need)}"
    jobs = ", ".join(need_text(n) for n in needs)
    return f"each job alone can be cleared, not all of them together ({jobs})"


def plan_exact(
    model: ClusterModel,
    goal: Goal,
    policy: Policy | None = None,
    weights: CostWeights | None = None,
    *,
    time_limit_s: float = 10.0,
    workers: int = 1,
    demand: Sequence[Shape] | None = None,
    hint: Plan | None = None,
) -> Plan:
    """The least-cost plan (CP-SAT). `extra` carries status (optimal, feasible, infeasible,
    unknown), objective and bound (cost scores) and the solver's time."""
    started = time.perf_counter()
    if hint is not None and hint.feasible and hint.migrations == 0:
        # nothing to move: no plan can cost less
        info = {"status": "optimal", "objective": 0.0, "bound": 0.0, "solver_s": 0.0}
        return replace(hint, method="exact (optimal)", extra={**hint.extra, **info})
    inst = build_instance(model, policy, goal.priority, weights)
    try:
        needs = needs_for(goal, demand, policy)
    except ValueError as error:
        return Plan(goal.text, False, (), reason=str(error), method="exact")
    builder = _Builder(inst, needs)
    builder.add_tasks()
    builder.add_goal()
    builder.add_capacity()
    upper = None
    if hint is not None and hint.feasible:
        upper = _add_hint(builder, hint)
    builder.objective(upper)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit_s)
    solver.parameters.num_workers = max(1, int(workers))
    code = solver.Solve(builder.m)
    status = STATUS.get(code, "unknown")
    solved = code in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    info = {
        "status": status,
        "objective": solver.ObjectiveValue() / SCALE if solved else None,
        "bound": solver.BestObjectiveBound() / SCALE if solved else None,
        "solver_s": solver.WallTime(),
        "variables": len(builder.m.Proto().variables),
        "cuts": 0,
    }
    if not solved:
        why = (
            f"{PROVED}: {_why_each(inst, needs)}"
            if code == cp_model.INFEASIBLE
            else f"exact solver found no plan within {time_limit_s:g} s"
        )
        racks = rack_unknown_reason(
            model, [(n.tasks, n.spec) for n in builder.needs if n.same_rack], policy
        )
        if racks:  # nothing on known racks proves nothing about nodes of unknown rack
            why = f"no placement reaches the goal on known racks; {racks}"
            info["rack_unknown"] = True
        return Plan(goal.text, False, (), reason=why, method=f"exact ({status})", extra=info)
    while True:
        windows, targets = _assign(builder, solver)
        stuck = _stuck_moves(inst, targets)
        if not stuck or info["cuts"] >= MAX_CUTS:
            break
        # The final state is right but its moves wait on each other in a cycle (a swap of GPUs
        # or of CPU): forbid moving exactly this set together and solve again. The first
        # solve's bound stays a lower bound; the result is no longer proved optimal.
        builder.m.Add(sum(builder.moved[t] for t in stuck) <= len(stuck) - 1)
        builder.m.ClearHints()
        info["cuts"] += 1
        code = solver.Solve(builder.m)
        info["solver_s"] += solver.WallTime()
        if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            why = "the exact solver's plans all need moves that wait on each other in a cycle"
            return Plan(goal.text, False, (), reason=why, method="exact (unordered)", extra=info)
        status = "feasible"
        info.update(status=status, objective=solver.ObjectiveValue() / SCALE)
    plan = finish(
        model, goal, inst, windows, targets, f"exact ({status})", started, demand, extra=info
    )
    return replace(plan, extra={**plan.extra, "elapsed_s": time.perf_counter() - started})
