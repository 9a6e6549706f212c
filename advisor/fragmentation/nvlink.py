"""The one NVLink-island rule, and what crossing islands costs: every counter and the planner
read it here, so `analyze`, the service, the app's What-if and a plan give one answer.

The rule (island locality): a task of k whole GPUs that fits in one NVLink island of its node
(1 < k <= the node's largest island) must sit in one island; a larger task crosses islands and
may; one GPU, or a node whose islands are not all known, has no rule (where the topology is
unknown nothing says the GPUs are connected or not, and no count is invented for it).

- `island_size_per_node(model)` — GPUs in each node's largest island; 0 where any of its GPUs'
  island is unknown (no rule applies, and `largest_free_nvlink_group` says unknown there).
- `needs_one_island(k, island_size)` — the rule itself (numpy arrays too).
- `islands_ok(islands, island_size)` — whether a placement on GPUs with these islands keeps it.
- `whole_tasks_per_node(model, free, k, island_locality)` — how many k-GPU tasks each node
  can host on the GPUs `free` marks, island by island where the rule applies.
- `largest_free_nvlink_group(model)` / `largest_task_per_node(model)` — most free GPUs in one
  island (-1 where unknown), and the largest task each node can start now under the rule.
- `crosses_islands(k, island_size)` and `cross_island_estimate(gpu_model)` — a task larger
  than an island spans islands: its collectives run over PCIe between them, not NVLink. The
  estimate is the two links' bandwidth per GPU from NVIDIA's data sheets (`LINKS`) and the
  step time at an assumed share of a step spent in collectives (`COLLECTIVE_SHARE`); both
  are stated wherever the estimate is shown.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from advisor.model import UNKNOWN_ISLAND, ClusterModel

UNKNOWN = -1  # a per-node count that cannot be known (islands unknown)


def island_size_per_node(model: ClusterModel) -> np.ndarray:
    """int64 (N): GPUs in the largest NVLink island of each node; 0 where islands are unknown
    on any of its GPUs (then no island rule applies). Cached on the model (its topology)."""
    return model._cached("island_size", lambda: _island_size(model))


def _island_size(model: ClusterModel) -> np.ndarray:
    gpus = model.gpus
    n = len(model.nodes)
    out = np.zeros(n, dtype=np.int64)
    if not len(gpus):
        return out
    unknown = np.bincount(
        gpus.node, weights=(gpus.nvlink_island == UNKNOWN_ISLAND).astype(float), minlength=n
    )
    known = gpus.nvlink_island != UNKNOWN_ISLAND
    # (node, island) as one int64, 2^32 apart: an island id is any int32 a snapshot may give
    keys = (gpus.node[known].astype(np.int64) << 32) + gpus.nvlink_island[known].astype(np.int64)
    unique, counts = np.unique(keys, return_counts=True)
    np.maximum.at(out, unique >> 32, counts)
    out[unknown > 0] = 0
    return out


def needs_one_island(k: int | np.ndarray, island_size: int | np.ndarray) -> bool | np.ndarray:
    """The rule: a task of `k` GPUs must sit in one island of a node whose largest island
    holds `island_size` GPUs (0: unknown, no rule) exactly when it fits in one."""
    return (np.asarray(k) > 1) & (np.asarray(k) <= np.asarray(island_size))


def crosses_islands(k: int | np.ndarray, island_size: int | np.ndarray) -> bool | np.ndarray:
    """A task of `k` GPUs larger than every island of its node (known islands) spans islands."""
    size = np.asarray(island_size)
    return (size > 0) & (np.asarray(k) > size)


def islands_ok(islands: np.ndarray, island_size: int) -> bool:
    """A task on GPUs with these island ids keeps the rule: if it fits in one island of its
    node (`island_size`, 0 = unknown) it sits in one island."""
    if not needs_one_island(len(islands), island_size):
        return True
    return bool(np.all(islands == islands[0]))


def _island_keys(model: ClusterModel) -> np.ndarray:
    """int64 (G): a key per (node, island); a GPU of unknown island is its own key."""
    return model._cached("island_keys", lambda: _keys(model))


def _keys(model: ClusterModel) -> np.ndarray:
    gpus = model.gpus
    island = np.where(
        gpus.nvlink_island == UNKNOWN_ISLAND,
        -1 - gpus.index.astype(np.int64),
        gpus.nvlink_island.astype(np.int64),
    )
    return gpus.node.astype(np.int64) * (1 << 32) + (island + (1 << 31))


def free_per_island(model: ClusterModel, free: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(node of each island, GPUs `free` marks in it) over the islands of the fleet (cached
    for the model's own free GPUs, which every shape counts on)."""
    if free is not model.gpu_is_free:
        return _per_island(model, free)
    if "free_island_node" not in model._cache:
        node, count = _per_island(model, free)
        model._cached("free_island_node", lambda: node)
        model._cached("free_island_count", lambda: count)
    return model._cache["free_island_node"], model._cache["free_island_count"]


def _per_island(model: ClusterModel, free: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    keys = _island_keys(model)[free]
    unique, counts = np.unique(keys, return_counts=True)
    return (unique >> 32).astype(np.int64), counts.astype(np.int64)


def whole_tasks_per_node(
    model: ClusterModel, free: np.ndarray, k: int, island_locality: bool = True
) -> np.ndarray:
    """int64 (N): how many tasks of `k` whole GPUs each node can host on the GPUs `free`
    marks: island by island where the rule applies (`needs_one_island`), else on the node's
    free GPUs together. Two islands with 2 free GPUs each hold no 4-GPU task of 4-GPU islands."""
    n = len(model.nodes)
    total = np.bincount(model.gpus.node[free], minlength=n).astype(np.int64)
    out = total // max(k, 1)
    if not island_locality or k <= 1:
        return out
    local = needs_one_island(k, island_size_per_node(model))
    if not local.any():
        return out
    node, counts = free_per_island(model, free)
    per_island = np.bincount(node, weights=counts // k, minlength=n).astype(np.int64)
    return np.where(local, per_island, out)


def largest_free_nvlink_group(model: ClusterModel) -> np.ndarray:
    """int64 (N): most free GPUs inside one NVLink island per node; `UNKNOWN` (-1) where the
    node's islands are unknown (nothing says which of its GPUs are connected)."""
    return model._cached("free_nvlink_group", lambda: _largest_group(model))


def _largest_group(model: ClusterModel) -> np.ndarray:
    n = len(model.nodes)
    out = np.zeros(n, dtype=np.int64)
    node, counts = free_per_island(model, model.gpu_is_free)
    np.maximum.at(out, node, counts)
    return np.where(island_size_per_node(model) > 0, out, UNKNOWN)


def largest_task_per_node(model: ClusterModel, island_locality: bool = True) -> np.ndarray:
    """int64 (N): the most whole GPUs one task can take on each node now under the rule: all
    its free GPUs when they are more than an island holds (the task crosses islands), else the
    most free in one island. 2 + 2 free on 4-GPU islands: 2, not 4."""
    free = np.bincount(model.gpus.node[model.gpu_is_free], minlength=len(model.nodes))
    free = free.astype(np.int64)
    if not island_locality:
        return free
    size = island_size_per_node(model)
    group = largest_free_nvlink_group(model)
    return np.where((size > 0) & (free <= size), group, free)


# --------------------------------------------------------------------------- crossing islands

# (substring of the GPU model name, NVLink GB/s, PCIe GB/s, PCIe generation), per GPU, both
# directions together, as NVIDIA's data sheets state them; first match wins.
LINKS: tuple[tuple[str, float, float, str], ...] = (
    ("B200", 1800.0, 128.0, "PCIe Gen5"),
    ("H200", 900.0, 128.0, "PCIe Gen5"),
    ("H100 NVL", 600.0, 128.0, "PCIe Gen5"),
    ("H100 PCIe", 600.0, 128.0, "PCIe Gen5"),
    ("H100", 900.0, 128.0, "PCIe Gen5"),
    ("A100", 600.0, 64.0, "PCIe Gen4"),
    ("A30", 200.0, 64.0, "PCIe Gen4"),
    ("V100", 300.0, 32.0, "PCIe Gen3"),
)
# Share of a training step spent in collectives over NVLink: unknown per job, so an assumption,
# stated with every estimate. A job that spends more is slowed more, up to the bandwidth ratio.
COLLECTIVE_SHARE = 0.1


@dataclass(frozen=True)
class CrossIsland:
    """What crossing NVLink islands costs a job on one GPU model, and where that comes from."""

    gpu_model: str
    nvlink_gbps: float | None  # None: the model is not in `LINKS`
    pcie_gbps: float | None
    link: str  # the PCIe generation, or ""
    datasheet: str = ""  # the `LINKS` entry the figures come from

    @property
    def bandwidth_ratio(self) -> float | None:
        """How many times slower collectives run between islands."""
        if self.nvlink_gbps is None or self.pcie_gbps is None:
            return None
        return self.nvlink_gbps / self.pcie_gbps

    @property
    def step_slowdown(self) -> float | None:
        """Step time across islands over step time in one, at `COLLECTIVE_SHARE`."""
        ratio = self.bandwidth_ratio
        return None if ratio is None else 1.0 + COLLECTIVE_SHARE * (ratio - 1.0)

    def text(self) -> str:
        """One line: the estimate and its source."""
        ratio, slowdown = self.bandwidth_ratio, self.step_slowdown
        if ratio is None or slowdown is None:
            return (
                f"crosses NVLink islands: slower, by how much unknown (no NVLink/PCIe "
                f"bandwidth known for {self.gpu_model or 'an unknown model'})"
            )
        return (
            f"crosses NVLink islands: est. {slowdown:.1f}x step time (collectives between "
            f"islands over {self.link}, {self.pcie_gbps:g} GB/s, not NVLink, "
            f"{self.nvlink_gbps:g} GB/s: {ratio:.1f}x slower, NVIDIA's {self.datasheet} data "
            f"sheet; at an assumed {COLLECTIVE_SHARE:.0%} of a step in collectives)"
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "gpu_model": self.gpu_model,
            "nvlink_gbps": self.nvlink_gbps,
            "pcie_gbps": self.pcie_gbps,
            "link": self.link,
            "datasheet": self.datasheet,
            "bandwidth_ratio": self.bandwidth_ratio,
            "collective_share": COLLECTIVE_SHARE,
            "step_slowdown": self.step_slowdown,
            "text": self.text(),
        }


def cross_island_estimate(gpu_model: str) -> CrossIsland:
    """The cost of crossing islands on `gpu_model` (substring match on `LINKS`, first hit)."""
    name = gpu_model.upper()
    for key, nvlink, pcie, link in LINKS:
        if key.upper() in name:
            return CrossIsland(gpu_model, nvlink, pcie, link, key)
    return CrossIsland(gpu_model, None, None, "")


def crossing_models(model: ClusterModel, k: int, nodes: np.ndarray) -> list[str]:
    """GPU models of the `nodes` (bool (N)) on which a k-GPU task spans islands, sorted."""
    cross = crosses_islands(k, island_size_per_node(model)) & nodes
    return sorted(set(model.nodes.gpu_model[cross].tolist()))


def crossing_note(model: ClusterModel, gpu_rows: np.ndarray | list[int]) -> str:
    """ "; " + `CrossIsland.text()` when GPU rows `gpu_rows` (of one node) span NVLink islands
    that are known, else "": what a plan's reason adds for a task placed across islands."""
    rows = np.asarray(gpu_rows, dtype=np.int64)
    islands = model.gpus.nvlink_island[rows]
    if len(rows) < 2 or (islands == UNKNOWN_ISLAND).any() or len(set(islands.tolist())) < 2:
        return ""
    node = int(model.gpus.node[rows[0]])
    return "; " + cross_island_estimate(str(model.nodes.gpu_model[node])).text()
