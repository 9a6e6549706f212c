"""Our second protocol: the same replay, but the advisor may also move already placed pods
(a budget: at most X % of the pods placed so far, in total), in two situations:

- **defragmentation**: once the cluster's fragment rate crosses `threshold`, every `interval`
  arrivals one move: first a consolidation (a sharing pod alone on its GPU moves into another
  GPU's hole it fills to within `tight` milli, so a whole GPU opens), else the single move that
  lowers the fragment amount most (leave a high-fragment node, land where FGD says the increase
  is least) if it gains at least `min_gain` milli-GPU;
- **rescue**: a pod that would be dropped gets room by moving at most two pods.

For a pod that fits nowhere we look for the node where the fewest moves make it fit: on a
target GPU the pods sharing it (largest first) until enough milli is free, plus pods holding the
node's CPU or memory if those are short. Every victim must then fit on some *other* node, chosen
by the replay's own policy; the plan is applied step by step on the live state (so it can never
oversubscribe) and rolled back whole if any step fails. Each move is counted with its cost: the
GPU it held (a checkpoint/restart of that much GPU work).
"""

from __future__ import annotations

import numpy as np

from advisor.placement.state import MILLI, PodSpec, select_node
from advisor.replay.protocol import Replay

MAX_TARGETS = 16  # candidate (node, GPU) targets examined per rescue, cheapest first


class Migrator:
    """Moves placed pods of one `Replay` within a migration budget (defrag and rescue)."""

    def __init__(
        self,
        replay: Replay,
        budget: float,
        max_moves_per_rescue: int = 2,
        threshold: float = 0.3,
        interval: int = 1,
        min_gain: float = 1.0,
        top_nodes: int = 64,
        tight: int = 100,
    ) -> None:
        if not 0 <= budget <= 1:
            raise ValueError(f"migration budget must be a fraction 0..1, got {budget}")
        self.replay = replay
        self.budget = budget
        self.max_moves = max_moves_per_rescue
        self.threshold = threshold
        self.interval = interval
        self.min_gain = min_gain
        self.top_nodes = top_nodes
        self.tight = tight
        self.consolidations = 0
        self.moves = 0
        self.cost_gpu = 0.0
        self.rescued = 0
        self.defrag_moves = 0
        self._since = 0
        self._wait = interval  # backs off while defrag steps find nothing worth moving
        self._failed: dict[tuple, int] = {}  # pod shape -> placed count at its failed rescue
        # the policy's own fragmentation view if it has one (ours learns it online), else the
        # replay's measurement workload
        self.tracker = getattr(replay.policy, "tracker", None) or replay.recorder

    def after_arrival(self) -> None:
        """Called after every arrival: maybe make one defragmenting move."""
        self._since += 1
        if self._since < self._wait or self.allowance() <= 0:
            return
        tracker = getattr(self.replay.policy, "tracker", None) or self.tracker
        idle = self.replay.idle
        if idle <= 0 or tracker.amount / idle < self.threshold:
            return
        self._since = 0
        moved = (self.tight > 0 and self.consolidate_step()) or self.defrag_step(tracker)
        self._wait = self.interval if moved else min(self._wait * 2, 32)

    def defrag_step(self, tracker) -> bool:
        """The best single move by fragment change; applied only if it gains `min_gain`."""
        r = self.replay
        s = r.state
        order = np.argsort(-tracker.frag)[: self.top_nodes]
        shape_best: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        best: tuple[float, int, int] | None = None  # (net change, pod id, target node)
        for node in order.tolist():
            if tracker.frag[node] <= 0:
                break
            for pid in r.node_pods[node]:
                _, gpus, spec = r.where[pid]
                if spec.num_gpu == 0:
                    continue
                gain = tracker.removal_gain(node, gpus, spec)
                if gain <= self.min_gain:
                    continue
                key = (spec.cpu_milli, spec.num_gpu, spec.gpu_milli, spec.gpu_spec)
                if key not in shape_best:  # memory aside: checked per pod below
                    shape = PodSpec(spec.cpu_milli, 0, spec.num_gpu, spec.gpu_milli, spec.gpu_spec)
                    cand = s.feasible(shape)
                    delta = tracker.deltas(shape, cand)[0] if cand.size else np.zeros(0)
                    shape_best[key] = (cand, delta)
                cand, delta = shape_best[key]
                elsewhere = (cand != node) & (s.mem_free[cand] >= spec.memory_mib)
                if not elsewhere.any():
                    continue
                i = int(np.argmin(np.where(elsewhere, delta, np.inf)))
                net = float(delta[i]) - gain
                if net < -self.min_gain and (best is None or net < best[0]):
                    best = (net, pid, int(cand[i]))
        if best is None:
            return False
        _, pid, target = best
        node, gpus, spec = r.unbind(pid)
        cand = s.feasible(spec)
        r.policy.score(spec, cand)  # lets FGD-style policies pick the GPU on `target`
        g = r.policy.gpus(spec, target)
        s.allocate(target, g, spec)
        r.bind(pid, spec, target, g)
        self.moves += 1
        self.defrag_moves += 1
        self.cost_gpu += spec.total_gpu_milli / MILLI
        return True

    def consolidate_step(self) -> bool:
        """Move a sharing pod that sits alone on a GPU into another GPU's hole it fills to
        within `tight` milli: two partly used GPUs become one nearly full and one whole.

        Whole GPUs are what most arrivals need (whole-GPU pods are most of the trace), and a
        hole that fits a pod this tightly is the best any later arrival could do with it.
        """
        r = self.replay
        s = r.state
        alone: dict[tuple, list[int]] = {}
        for pid, (node, gpus, spec) in r.where.items():
            if spec.num_gpu == 1 and spec.gpu_milli < MILLI and r.gpu_pods[node, gpus[0]] == 1:
                key = (spec.cpu_milli, spec.memory_mib, spec.gpu_milli, spec.gpu_spec)
                alone.setdefault(key, []).append(pid)
        best: tuple[int, int, int, int] | None = None  # (leftover, pod id, node, gpu)
        for (cpu, mem, milli, spec), pids in alone.items():
            nodes = np.flatnonzero((s.cpu_free >= cpu) & (s.mem_free >= mem) & s.access(spec))
            if nodes.size == 0:
                continue
            lefts, gpus = s.tight_holes(nodes, milli)  # never a whole GPU
            i = int(np.argmin(lefts))
            node, gpu, left = int(nodes[i]), int(gpus[i]), int(lefts[i])
            if left > self.tight or (best is not None and left >= best[0]):
                continue
            # the source: the lone pod whose node has the most CPU left for a whole-GPU pod
            sources = [p for p in pids if r.where[p][0] != node]
            if sources:
                pid = max(sources, key=lambda p: (int(s.cpu_free[r.where[p][0]]), -p))
                best = (left, pid, node, gpu)
        if best is None:
            return False
        _, pid, node, gpu = best
        _, _, spec = r.unbind(pid)
        s.allocate(node, [gpu], spec)
        r.bind(pid, spec, node, [gpu])
        self.moves += 1
        self.consolidations += 1
        self.cost_gpu += spec.total_gpu_milli / MILLI
        return True

    def allowance(self) -> int:
        """Moves still allowed: budget x pods placed so far, minus moves made."""
        return int(self.budget * self.replay.placed) - self.moves

    def rescue(self, pod_id: int, pod: PodSpec) -> bool:
        limit = min(self.max_moves, self.allowance())
        if limit <= 0:
            return False
        # a shape that could not be rescued is retried only after the cluster changed enough
        key = (pod.cpu_milli, pod.memory_mib, pod.num_gpu, pod.gpu_milli, pod.gpu_spec)
        placed = self.replay.placed + self.moves
        if key in self._failed and placed - self._failed[key] < 20:
            return False
        for node, victims in self._plans(pod, limit):
            if self._apply(pod_id, pod, node, victims):
                self.rescued += 1
                self._failed.pop(key, None)
                return True
        self._failed[key] = placed
        return False

    # planning -------------------------------------------------------------------------------
    def _plans(self, pod: PodSpec, limit: int) -> list[tuple[int, list[int]]]:
        """Candidate (node, victims) plans, fewest victims and least GPU moved first.

        Targets are nodes of an allowed model and enough capacity where either the GPUs already
        fit (CPU or memory is short) or the missing GPUs can be opened by moving at most
        `limit` pods; the vectorised prefilter keeps a rescue attempt to a few milliseconds.
        """
        r = self.replay
        s = r.state
        immovable, movable_cpu = self._mobility()
        ok = (s.cpu_cap >= pod.cpu_milli) & (s.mem_cap >= pod.memory_mib)
        if pod.num_gpu:
            ok &= s.access(pod.gpu_spec) & (s.n_gpu >= pod.num_gpu)
            fits = s.gpu_free >= pod.gpu_milli
            slot = np.arange(s.gpu_free.shape[1])[None, :] < s.n_gpu[:, None]
            openable = ~fits & slot & (r.gpu_pods > 0) & (r.gpu_pods <= limit) & (immovable == 0)
            extra = np.where(openable, r.gpu_pods, 99)
            extra.sort(axis=1)
            missing = np.maximum(pod.num_gpu - fits.sum(axis=1), 0)
            cols = np.minimum(missing, extra.shape[1])
            cum = np.concatenate([np.zeros((len(s), 1), dtype=np.int64), extra.cumsum(axis=1)], 1)
            gpu_moves = cum[np.arange(len(s)), cols]
        else:
            gpu_moves = np.zeros(len(s), dtype=np.int64)
        # GPU victims free their CPU too; otherwise movable CPU-only pods must cover the gap
        cpu_short = (s.cpu_free < pod.cpu_milli) & (gpu_moves == 0)
        ok &= ~cpu_short | (s.cpu_free + movable_cpu >= pod.cpu_milli)
        est = gpu_moves + cpu_short
        ok &= (est <= limit) & (est > 0)
        nodes = np.flatnonzero(ok)
        if nodes.size == 0:
            return []
        order = np.lexsort((r.rank[nodes], est[nodes]))
        plans: list[tuple[int, list[int], float]] = []
        for n in nodes[order[:MAX_TARGETS]]:
            victims = self._victims(int(n), pod, limit)
            if victims is not None:
                moved = sum(r.where[v][2].total_gpu_milli for v in victims)
                plans.append((int(n), victims, len(victims) + moved / (10.0 * MILLI)))
        plans.sort(key=lambda p: p[2])
        return [(n, v) for n, v, _ in plans]

    def _mobility(self) -> tuple[np.ndarray, np.ndarray]:
        """Per GPU, pods that could not go anywhere else; per node, CPU of movable CPU pods.

        Feasibility is computed once per pod shape (memory aside, checked exactly later), so a
        rescue attempt costs milliseconds even with thousands of placed pods.
        """
        r = self.replay
        s = r.state
        immovable = np.zeros_like(r.gpu_pods)
        movable_cpu = np.zeros(len(s), dtype=np.int64)
        groups: dict[tuple[int, int, int, str], list[tuple[int, list[int], int]]] = {}
        for node, gpus, spec in r.where.values():
            key = (spec.cpu_milli, spec.num_gpu, spec.gpu_milli, spec.gpu_spec)
            groups.setdefault(key, []).append((node, gpus, spec.memory_mib))
        for (cpu, num_gpu, gpu_milli, gpu_spec), members in groups.items():
            f = s.feasible(PodSpec(cpu, 0, num_gpu, gpu_milli, gpu_spec))
            nodes = np.array([m[0] for m in members])
            if f.size > 32:  # plenty of room: memory will not be the limit everywhere
                movable = np.ones(len(members), dtype=bool)
            else:
                mem = np.array([m[2] for m in members])
                elsewhere = (f[None, :] != nodes[:, None]) & (
                    s.mem_free[f][None, :] >= mem[:, None]
                )
                movable = elsewhere.any(axis=1)
            if num_gpu == 0:
                np.add.at(movable_cpu, nodes[movable], cpu)
            elif not movable.all():
                stuck = np.flatnonzero(~movable)
                gpus = np.array([members[i][1] for i in stuck])
                np.add.at(immovable, (nodes[stuck][:, None], gpus), 1)
        return immovable, movable_cpu

    def _movable(self, pid: int, node: int) -> bool:
        """Whether a placed pod could go to some other node right now."""
        spec = self.replay.where[pid][2]
        cand = self.replay.state.feasible(spec)
        return bool((cand != node).any())

    def _victims(self, node: int, pod: PodSpec, limit: int) -> list[int] | None:
        """Fewest movable pods to move off `node` so that `pod` fits there, or None."""
        r = self.replay
        s = r.state
        free = s.gpu_free[node].copy()
        cpu, mem = int(s.cpu_free[node]), int(s.mem_free[node])
        on_gpu: dict[int, list[int]] = {}
        for pid in r.node_pods[node]:
            for g in r.where[pid][1]:
                on_gpu.setdefault(g, []).append(pid)
        chosen: list[int] = []

        def take(pid: int) -> None:
            nonlocal cpu, mem
            _, gpus, spec = r.where[pid]
            chosen.append(pid)
            cpu += spec.cpu_milli
            mem += spec.memory_mib
            for g in gpus:
                free[g] += spec.gpu_milli

        if pod.num_gpu:
            have = [g for g in range(int(s.n_gpu[node])) if free[g] >= pod.gpu_milli]
            openable = sorted(
                (g for g in range(int(s.n_gpu[node])) if free[g] < pod.gpu_milli),
                key=lambda g: (len(on_gpu.get(g, [])), -int(free[g])),
            )
            for g in openable[: max(pod.num_gpu - len(have), 0)]:
                for pid in sorted(on_gpu.get(g, []), key=lambda p: -r.where[p][2].gpu_milli):
                    if free[g] >= pod.gpu_milli:
                        break
                    if pid in chosen:
                        continue
                    if len(chosen) >= limit or not self._movable(pid, node):
                        return None
                    take(pid)
                if free[g] < pod.gpu_milli:
                    return None
        rest = sorted(
            (p for p in r.node_pods[node] if p not in chosen),
            key=lambda p: (r.where[p][2].total_gpu_milli, -r.where[p][2].cpu_milli),
        )
        for pid in rest:
            if cpu >= pod.cpu_milli and mem >= pod.memory_mib:
                break
            if r.where[pid][2].num_gpu or len(chosen) >= limit:
                return None  # never move a GPU pod just for CPU: it would strand its GPU
            if self._movable(pid, node):
                take(pid)
        if cpu < pod.cpu_milli or mem < pod.memory_mib:
            return None
        return chosen

    # applying -------------------------------------------------------------------------------
    def _apply(self, pod_id: int, pod: PodSpec, node: int, victims: list[int]) -> bool:
        """Evict victims, bind the pod on `node`, re-place victims elsewhere; all or nothing."""
        r = self.replay
        s = r.state
        evicted = [(pid, *r.unbind(pid)) for pid in victims]
        cand = s.feasible(pod)
        if node not in set(cand.tolist()):
            self._restore(evicted, [])
            return False
        s_pod = r.policy.score(pod, cand)
        del s_pod  # policy caches its GPU choice for `node` in score()
        gpus = r.policy.gpus(pod, node)
        s.allocate(node, gpus, pod)
        r.bind(pod_id, pod, node, gpus)
        moved: list[int] = []
        for pid, _, _, spec in evicted:
            c = s.feasible(spec)
            c = c[c != node]
            if c.size == 0:
                r.unbind(pod_id)
                self._restore(evicted, moved)
                return False
            target = select_node(c, r.policy.score(spec, c), r.rank)
            g = r.policy.gpus(spec, target)
            s.allocate(target, g, spec)
            r.bind(pid, spec, target, g)
            moved.append(pid)
        self.moves += len(victims)
        self.cost_gpu += sum(spec.total_gpu_milli for _, _, _, spec in evicted) / MILLI
        return True

    def _restore(
        self, evicted: list[tuple[int, int, list[int], PodSpec]], moved: list[int]
    ) -> None:
        r = self.replay
        for pid in moved:
            r.unbind(pid)
        for pid, node, gpus, spec in evicted:
            r.state.allocate(node, gpus, spec)
            r.bind(pid, spec, node, gpus)
