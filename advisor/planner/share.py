"""Sharing and right-sizing: jobs that use a fraction of their GPU share one with others.

For every single-GPU task that holds a whole GPU alone, the observed usage (p95 utilization and
peak memory over `window_s`) gives the fraction it needs:

- on MIG-capable GPUs (A100, H100, H200, A30): the smallest valid MIG profile with at least the
  p95 utilization in compute slices and the peak memory (plus `memory_margin`), from
  `mig_profiles`;
- elsewhere: a guaranteed fraction with a limit, as dynamic GPU fractions do: guaranteed =
  max(p95 utilization, peak memory share + margin), limit = max(1.25 x peak utilization,
  guaranteed), each rounded up to 0.05 (the fraction also caps memory, so it covers both).
  Bins are packed by the guarantees (what a GPU can promise: at most one GPU); each shared
  GPU also says what its limits sum to (what it may be asked for when every task bursts at
  once, `contention_text`), and each share target carries its task's limit
  (`GpuSet.limit_milli`, the model after the plan holds it as `gpu_limit_milli`).

Tasks of one GPU model (and memory size) are then bin-packed (best-fit decreasing, two
dimensions: compute and memory, e.g. 0.3 + 0.5 + 0.4 -> two GPUs) preferring a bin on the
task's own node. Each bin with two or more tasks becomes `share` actions: its largest task is
resized in place first, then the others move onto that GPU, so every target has room at its
step.

A bin sized by MIG profiles runs in MIG instances, and the GPUs these tasks hold are plain (a
MIG GPU never holds whole-GPU work): its anchor GPU is switched to MIG mode. The anchor's step
says so (its target names its profile, `GpuSet.mig_profile`, and its reason begins with the
switch and the instances carved): the switch needs the GPU idle, which it is once the anchor's
own task has stopped for its resize. The other members' steps take an instance of their
profile on it. The checker replays the switch (the GPU must hold nothing else at that step and
runs MIG work only from then on) and `apply_plan`'s model has that GPU in MIG mode carving
exactly those instances, so its uncarved slices are no free room.

The plan is replayed by `check_plan`; a task whose step is refused is left alone and the rest
packed again. `extra` lists the right-sizing of every candidate, the bins, the GPUs switched to
MIG mode (`mig_switches`), the whole GPUs freed (`gpus_freed`) and the GPU share given back
(`gpu_share_freed`: free milli after minus before, on `apply_plan`'s model: the whole GPUs plus
the room left on shared plain GPUs; a switched GPU leaves none), and the GPU memory that no
request of `min_request_bytes` can use, before and after (stranded memory).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from advisor.fragmentation.measures import stranded_memory_bytes
from advisor.model import MILLI, ClusterModel
from advisor.planner.actions import Action, GpuSet, Plan, move_cost
from advisor.planner.check import apply_plan, check_plan
from advisor.planner.constraints import Policy
from advisor.planner.mig_profiles import milli_of, profiles_for, smallest_profile
from advisor.planner.observed import HISTORY_HINT, history_s, observe
from advisor.planner.outcome import outcome


@dataclass(frozen=True)
class ShareSettings:
    window_s: float = 24 * 3600.0  # history the sizing looks at
    min_samples: int = 3  # fewer observations: too little evidence to resize
    max_fraction: float = 0.8  # tasks needing more are not shared
    memory_margin: float = 0.02  # of the GPU's memory, above the observed peak
    use_mig: bool = True  # MIG profiles where the GPU supports them
    min_request_bytes: float = 10 * 2**30  # smallest memory request (stranded memory)


# --------------------------------------------------------------------------- packing


@dataclass(frozen=True)
class Item:
    """A demand to pack: `size` per dimension (units of `capacity`), preferred `home`."""

    key: str
    size: tuple[int, ...]
    home: str = ""


def pack(items: Sequence[Item], capacity: tuple[int, ...]) -> list[list[int]]:
    """Best-fit decreasing vector bin packing; returns item indices per bin, largest first in
    each. Prefers a bin opened by an item of the same `home`; an item that fits no bin
    (bigger than a bin) gets one of its own."""
    order = sorted(
        range(len(items)),
        key=lambda i: (-max(s / c for s, c in zip(items[i].size, capacity, strict=True)), i),
    )
    bins: list[list[int]] = []
    load: list[list[int]] = []
    homes: list[str] = []
    for i in order:
        size = items[i].size
        best, best_key = -1, None
        for b, used in enumerate(load):
            left = [c - u - s for c, u, s in zip(capacity, used, size, strict=True)]
            if min(left) < 0:
                continue
            key = (
                homes[b] != items[i].home,
                sum(x / c for x, c in zip(left, capacity, strict=True)),
            )
            if best_key is None or key < best_key:
                best, best_key = b, key
        if best < 0:
            bins.append([i])
            load.append(list(size))
            homes.append(items[i].home)
        else:
            bins[best].append(i)
            load[best] = [u + s for u, s in zip(load[best], size, strict=True)]
    return bins


# --------------------------------------------------------------------------- sizing


def _up(value: float, step: float = 0.05) -> float:
    return round(math.ceil(value / step - 1e-9) * step, 4)


def rightsize(
    model: ClusterModel, settings: ShareSettings = ShareSettings()
) -> list[dict[str, Any]]:
    """One row per whole-GPU single-GPU task with enough observations: what it would need."""
    obs = observe(model, settings.window_s)
    allocs, places = model.allocations, model.placements
    alone = model.gpu_milli_allocated == MILLI
    out = []
    for p in range(len(places)):
        row, gpu = int(places.alloc[p]), int(places.gpu[p])
        if allocs.num_gpu[row] != 1 or places.milli[p] != MILLI or not alone[gpu]:
            continue
        util, mem, total = (
            obs.util_p95[row],
            obs.memory_peak_bytes[row],
            obs.memory_total_bytes[row],
        )
        if obs.samples[row] < settings.min_samples or not (
            math.isfinite(util) and math.isfinite(mem) and math.isfinite(total) and total > 0
        ):
            continue
        node = int(allocs.node[row])
        gpu_model = str(model.nodes.gpu_model[node])
        mem_need = mem + settings.memory_margin * total
        compute = max(float(util), 0.01)
        profile = (
            smallest_profile(gpu_model, total, compute, mem_need)
            if settings.use_mig and profiles_for(gpu_model, total)
            else None
        )
        guaranteed = _up(max(compute, mem_need / total))
        limit = min(1.0, _up(max(1.25 * float(obs.util_peak[row]), guaranteed)))
        if profile is not None:
            milli, size = milli_of(profile), (profile.compute_slices, profile.memory_slices)
            capacity = (profile.compute_total, profile.memory_total)
            offer = f"MIG {profile.name}"
            limit_milli = None  # an instance is its slices, no more
        else:
            milli = round(guaranteed * MILLI)
            limit_milli = round(limit * MILLI)
            size, capacity = (milli,), (MILLI,)
            offer = f"{guaranteed:g} GPU guaranteed, {limit:g} limit"
        out.append(
            {
                "row": row,
                "alloc": str(allocs.id[row]),
                "job": str(allocs.job[row]),
                "tenant": str(allocs.tenant[row]),
                "node": str(model.nodes.name[node]),
                "gpu": int(model.gpus.index[gpu]),
                "gpu_row": gpu,
                "gpu_model": gpu_model,
                "memory_total_bytes": float(total),
                "util_p95": round(float(util), 4),
                "util_peak": round(float(obs.util_peak[row]), 4),
                "memory_peak_bytes": float(mem),
                "mig_profile": profile.name if profile else None,
                "guaranteed": guaranteed,
                "limit": limit,
                "milli": milli,
                "limit_milli": limit_milli,
                "offer": offer,
                "size": size,
                "capacity": capacity,
                "migratable": bool(allocs.migratable[row]),
                "fits_fraction": milli <= settings.max_fraction * MILLI,
            }
        )
    return out


# --------------------------------------------------------------------------- plan


def _bins_to_actions(
    model: ClusterModel, rows: list[dict[str, Any]], bins: list[list[int]], policy: Policy
) -> tuple[list[Action], list[dict[str, Any]], list[dict[str, Any]]]:
    """The share actions of the bins (anchors first), the shared GPUs and the MIG switches."""
    anchors: list[Action] = []
    movers: list[Action] = []
    shared = []
    switches = []
    multi = [members for members in bins if len(members) >= 2]
    for members in multi:
        anchor = rows[members[0]]
        names = [rows[i]["alloc"] for i in members]
        where = f"{anchor['node']}/gpu{anchor['gpu']}"
        profiles = [rows[i]["mig_profile"] for i in members]
        mig = all(p is not None for p in profiles)
        guaranteed = sum(rows[i]["milli"] for i in members)
        limits = guaranteed if mig else sum(rows[i]["limit_milli"] for i in members)
        contention = contention_text(guaranteed, limits)
        shared.append(
            {
                "node": anchor["node"],
                "gpu": anchor["gpu"],
                "gpu_model": anchor["gpu_model"],
                "allocs": names,
                "milli": guaranteed,
                "limit_milli": limits,
                "meaning": contention,
            }
        )
        switch_step = len(anchors) + 1  # anchors come first, in bin order
        if mig:
            switches.append(
                {
                    "node": anchor["node"],
                    "gpu": anchor["gpu"],
                    "gpu_model": anchor["gpu_model"],
                    "step": switch_step,
                    "profiles": profiles,
                    "allocs": names,
                    "carved_milli": sum(rows[i]["milli"] for i in members),
                }
            )
        for i in members:
            r = rows[i]
            others = ", ".join(n for n in names if n != r["alloc"])
            used = (
                f"{r['alloc']} used p95 {r['util_p95']:.0%} of a {r['gpu_model']} and "
                f"{r['memory_peak_bytes'] / 2**30:.1f} of {r['memory_total_bytes'] / 2**30:.0f} GiB:"
                f" {r['offer']} is enough"
            )
            if not mig:
                reason = f"{used}; shares {where} with {others}: {contention}"
            elif i == members[0]:
                reason = (
                    f"switch {where} to MIG mode (the GPU must be idle: its one task, "
                    f"{r['alloc']}, stops for this resize) and carve {' + '.join(profiles)}; "
                    f"{used}; runs in the {r['mig_profile']} instance, shares {where} with "
                    f"{others}"
                )
            else:
                reason = (
                    f"{used}; moves into a MIG {r['mig_profile']} instance of {where} "
                    f"(switched to MIG mode at step {switch_step}), shares it with {others}"
                )
            action = Action(
                "share",
                alloc=r["alloc"],
                job=r["job"],
                tenant=r["tenant"],
                src=GpuSet(r["node"], (r["gpu"],)),
                dst=GpuSet(
                    anchor["node"],
                    (anchor["gpu"],),
                    r["milli"],
                    r["mig_profile"] if mig else None,
                    None if mig else r["limit_milli"],
                ),
                reason=reason,
                cost=move_cost(model, r["row"], policy.default_restart_s),
            )
            (anchors if i == members[0] else movers).append(action)
    return anchors + movers, shared, switches


def contention_text(guaranteed_milli: int, limit_milli: int) -> str:
    """What a shared GPU's guarantees and limits mean, in numbers: the guarantees are what
    it promises (each holder always gets its own), the limits what it may be asked for when
    every holder bursts at once (above 1 GPU they contend for the room beyond the
    guarantees)."""
    promised, asked = guaranteed_milli / MILLI, limit_milli / MILLI
    text = (
        f"guarantees sum to {promised:g} GPU (each task always gets its own), limits to "
        f"{asked:g} GPU"
    )
    if guaranteed_milli >= MILLI and limit_milli > guaranteed_milli:
        return (
            f"{text}: the guarantees fill the GPU, so a task goes above its own only while "
            "the others use less than theirs"
        )
    if limit_milli > MILLI:
        return (
            f"{text}, {asked - 1:g} GPU more than the GPU has: when all burst at once they "
            f"share the {1 - promised:g} GPU above the guarantees"
        )
    return f"{text}: all can burst to their limits at once"


def _stranded_after(
    model: ClusterModel, after: ClusterModel, rows: list[dict[str, Any]], shared, minimum: float
) -> float:
    """Stranded memory after the plan: packed GPUs hold the peaks of their tasks; a GPU
    switched to MIG mode has no room left beyond its instances, so all its free memory is."""
    before = stranded_memory_bytes(model, minimum)
    out = stranded_memory_bytes(after, minimum)
    moved = {r["gpu_row"] for r in rows if any(r["alloc"] in b["allocs"] for b in shared)}
    peaks = {r["alloc"]: r["memory_peak_bytes"] for r in rows}
    for row in moved:
        out[row] = 0.0 if after.gpu_milli_allocated[row] == 0 else before[row]
    for b in shared:
        row = model.gpu_row(model.node_index(b["node"]), b["gpu"])
        free = float(model.gpus.memory_total_bytes[row]) - sum(peaks[a] for a in b["allocs"])
        full = after.gpu_milli_allocated[row] >= MILLI or bool(
            after.gpus.mig_enabled[row] and after.gpu_free_milli[row] <= 0
        )
        out[row] = max(free, 0.0) if (full or free < minimum) else 0.0
    return float(out.sum())


def _why_none(
    model: ClusterModel,
    sizing: list[dict[str, Any]],
    settings: ShareSettings,
    excluded: set[str],
) -> str:
    """Why no GPU is shared, in numbers: the tasks sharing could resize (single-GPU, holding a
    whole GPU alone), those with enough observations, those small and movable enough, and why
    no two of them pack together."""
    alone = model.gpu_milli_allocated == MILLI
    places, allocs = model.placements, model.allocations
    whole = (places.milli == MILLI) & alone[places.gpu] & (allocs.num_gpu[places.alloc] == 1)
    total = int(whole.sum())
    if not total:
        return "no task holds a whole GPU alone (sharing resizes those): nothing to share"
    most = settings.max_fraction
    small = [r for r in sizing if r["fits_fraction"]]
    movable = [r for r in small if r["migratable"] and r["alloc"] not in excluded]
    text = (
        f"of {total} task(s) holding a whole GPU alone, {len(sizing)} have the "
        f"{settings.min_samples} samples sizing needs, {len(small)} need at most {most:g} GPU"
        f" and {len(movable)} of those may move"
    )
    if len(small) < len(sizing):
        smallest = min(r["milli"] for r in sizing if not r["fits_fraction"]) / MILLI
        text += f" (the smallest of the rest needs {smallest:g} GPU)"
    if len(movable) < 2:
        return f"{text}: fewer than two can share a GPU"
    groups = Counter((r["gpu_model"], round(r["memory_total_bytes"] / 2**30)) for r in movable)
    if max(groups.values()) < 2:
        return f"{text}: no two of one GPU model and memory size, so none can share"
    return f"{text}: no two fit one GPU together"


def plan_share(
    model: ClusterModel, policy: Policy | None = None, settings: ShareSettings = ShareSettings()
) -> Plan:
    """A checked plan that packs small tasks onto shared GPUs (module docstring)."""
    policy = policy or Policy()
    sizing = rightsize(model, settings)
    rows = [r for r in sizing if r["fits_fraction"] and r["migratable"]]
    goal = "share GPUs between tasks that use a fraction of one"
    excluded: set[str] = set()
    actions: list[Action] = []
    shared: list[dict[str, Any]] = []
    switches: list[dict[str, Any]] = []
    for _ in range(len(rows) + 1):
        use = [r for r in rows if r["alloc"] not in excluded]
        groups: dict[tuple, list[int]] = defaultdict(list)
        for i, r in enumerate(use):
            key = (r["gpu_model"], round(r["memory_total_bytes"] / 2**30), r["capacity"])
            groups[key].append(i)
        bins: list[list[int]] = []
        for key, members in sorted(groups.items()):
            items = [Item(use[i]["alloc"], use[i]["size"], use[i]["node"]) for i in members]
            bins += [[members[j] for j in b] for b in pack(items, key[2])]
        actions, shared, switches = _bins_to_actions(model, use, bins, policy)
        result = check_plan(model, actions, policy)
        if result.ok:
            break
        assert result.violation is not None
        excluded.add(result.violation.action.alloc)
    else:  # pragma: no cover - each round excludes one task, so this ends
        actions, shared, switches = [], [], []
    before, after, benefit = outcome(model, actions)
    after_model = apply_plan(model, actions) if actions else model
    minimum = settings.min_request_bytes
    stranded_before = float(stranded_memory_bytes(model, minimum).sum())
    stranded_after = (
        _stranded_after(model, after_model, use, shared, minimum) if actions else stranded_before
    )
    freed = int(after_model.gpu_is_free.sum() - model.gpu_is_free.sum())
    given_back = int(after_model.gpu_free_milli.sum() - model.gpu_free_milli.sum()) / MILLI
    extra = {
        "rightsizing": [
            {k: v for k, v in r.items() if k not in ("row", "gpu_row", "size", "capacity")}
            for r in sizing
        ],
        "shared_gpus": shared,
        "mig_switches": switches,
        "gpus_freed": freed,
        "gpu_share_freed": given_back,
        "stranded_memory": {
            "min_request_bytes": minimum,
            "before_bytes": stranded_before,
            "after_bytes": stranded_after,
        },
        "left_alone": sorted(excluded),
    }
    note = ""
    if not actions and history_s(model, settings.window_s) <= 0 and settings.min_samples > 1:
        note = (
            "the source has no usage history, so how much of its GPU a task uses is unknown "
            f"(sizing needs {settings.min_samples} samples); {HISTORY_HINT}"
        )
    elif not actions:
        note = _why_none(model, sizing, settings, excluded)
    elif switches:
        note = (
            f"{len(switches)} GPU(s) switch to MIG mode (mig_switches): each must be idle at "
            "its switch, its one task stopped for the resize; on Kubernetes NVIDIA's MIG "
            "manager applies a node's layout and evicts that node's GPU pods while it does; "
            "a MIG GPU's uncarved slices are not counted as free"
        )
    return Plan(goal, True, tuple(actions), before, after, note, "share", benefit, extra)
