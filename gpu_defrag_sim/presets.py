"""The named fleets: which nodes exist, how they are wired, and what runs on them at t=0.

`a100-16x8` has a hand-written t=0 layout (the classic "60 free GPUs but only 4 whole free
nodes" case); the other presets start from a warm state drawn from the workload mix. Every
preset takes a node-count override so the benchmark can ask for 1,000 nodes of the same shape.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpu_defrag_sim.models import (
    A100_40,
    A100_80,
    H100_80,
    V100_32,
    BoardLayout,
    GpuModel,
    dgx1_board,
    nvswitch_board,
    two_island_board,
)

NODES_PER_RACK = 8


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    model: GpuModel
    board: BoardLayout
    pool: str
    rack: str
    driver_version: str
    cuda_version: str
    mig: bool = False


@dataclass(frozen=True, slots=True)
class InitialJob:
    """A job placed by hand at t=0 (preset a): node index, GPU indices on that node, kind."""

    node: int
    gpus: tuple[int, ...]
    kind: str
    tenant: str
    namespace: str
    idle: bool = False  # allocated but idle (utilization ~0)
    has_process: bool = True


@dataclass(frozen=True, slots=True)
class FleetSpec:
    preset: str
    nodes: tuple[NodeSpec, ...]
    target_load: dict[str, float]  # pool -> long-run share of GPUs allocated
    initial: tuple[InitialJob, ...] | None  # None: warm start from the mix
    warm_load: dict[str, float]  # pool -> share allocated at t=0 for a warm start


PRESETS: tuple[str, ...] = ("a100-16x8", "mixed-h100-a100-v100", "nvlink-islands")

_RND_LLM = ("rnd", "rnd-llm")
_RND_VIS = ("rnd", "rnd-vision")
_ALGO_RANK = ("algorithms", "algo-ranking")
_ALGO_SPEECH = ("algorithms", "algo-speech")
_PROD_SERVE = ("product", "prod-serving")
_PROD_BATCH = ("product", "prod-batch")

# Preset (a) at t=0, per node (1-based in the comment): (gpus, kind, (tenant, ns), idle, process).
# Nodes 1-8 run 2-3 jobs of 1-2 GPUs; 9-12 are empty; 13-16 run one half-node job and one small
# one. With 1-2 GPU jobs only, 12 busy nodes could hold at most 64 GPUs, fewer than the 68 that
# "exactly 60 free of 128" needs, hence the half-node jobs on 13-16.
_A_LAYOUT: tuple[tuple[tuple[tuple[int, ...], str, tuple[str, str], bool, bool], ...], ...] = (
    (
        ((0, 1), "train", _RND_LLM, False, True),
        ((2, 3), "batch", _ALGO_SPEECH, False, True),
        ((5, 6), "train", _ALGO_RANK, False, True),
    ),
    (
        ((0, 1), "train", _RND_VIS, False, True),
        ((3,), "notebook", _RND_LLM, True, False),
        ((5, 6), "batch", _PROD_BATCH, False, True),
    ),
    (
        ((0, 1), "train", _ALGO_RANK, False, True),
        ((2, 3), "train", _RND_LLM, False, True),
        ((6, 7), "inference", _PROD_SERVE, False, True),
    ),
    (
        ((1, 2), "batch", _ALGO_SPEECH, False, True),
        ((3, 4), "train", _RND_VIS, False, True),
        ((6, 7), "notebook", _ALGO_RANK, True, True),
    ),
    (
        ((0,), "inference", _PROD_SERVE, False, True),
        ((2, 3), "train", _RND_LLM, False, True),
        ((4, 5), "batch", _ALGO_SPEECH, False, True),
    ),
    (
        ((0, 1), "train", _RND_LLM, False, True),
        ((2, 3), "train", _ALGO_RANK, False, True),
        ((4, 5), "batch", _PROD_BATCH, True, False),
    ),
    (
        ((0, 1), "train", _ALGO_RANK, False, True),
        ((3, 4), "inference", _PROD_SERVE, False, True),
        ((6, 7), "train", _RND_VIS, False, True),
    ),
    (
        ((0, 1), "notebook", _RND_VIS, True, True),
        ((2, 3), "batch", _ALGO_SPEECH, False, True),
        ((4, 5), "train", _RND_LLM, False, True),
    ),
    (),
    (),
    (),
    (),
    (
        ((0, 1, 2, 3), "train", _RND_LLM, False, True),
        ((5, 6), "batch", _ALGO_SPEECH, False, True),
    ),
    (
        ((0, 1, 2, 3), "train", _ALGO_RANK, False, True),
        ((6,), "notebook", _RND_VIS, True, False),
    ),
    (
        ((4, 5, 6, 7), "inference", _PROD_SERVE, False, True),
        ((0, 1), "train", _RND_VIS, False, True),
    ),
    (
        ((0, 1, 2, 3), "batch", _PROD_BATCH, False, True),
        ((5,), "inference", _PROD_SERVE, False, True),
    ),
)


def _name(prefix: str, i: int, count: int) -> str:
    return f"{prefix}-node-{i + 1:0{max(2, len(str(count)))}d}"


def _rack(i: int) -> str:
    return f"rack-{i // NODES_PER_RACK + 1:02d}"


def a100_16x8(nodes: int | None = None) -> FleetSpec:
    """16 DGX A100 (NVSwitch, NV12 every pair) in 2 racks; `nodes` tiles the same t=0 layout."""
    count = nodes or 16
    board = nvswitch_board(8, 12, 64)
    specs = tuple(
        NodeSpec(_name("a100", i, count), A100_80, board, "a100", _rack(i), "535.183.01", "12.2")
        for i in range(count)
    )
    initial = tuple(
        InitialJob(i, gpus, kind, tenant, namespace, idle, process)
        for i in range(count)
        for gpus, kind, (tenant, namespace), idle, process in _A_LAYOUT[i % len(_A_LAYOUT)]
    )
    return FleetSpec("a100-16x8", specs, {"a100": 0.62}, initial, {})


def mixed_h100_a100_v100(nodes: int | None = None) -> FleetSpec:
    """4 H100 + 8 A100 + 4 V100 nodes (1:2:1 when scaled), one pool per model.

    Demand sits on H100/A100 (near full) while V100 stays mostly idle: type fragmentation.
    The last A100 node runs MIG for inference and is left out of whole-GPU placement.
    """
    count = nodes or 16
    h100 = max(1, count // 4)
    v100 = max(1, count // 4)
    a100 = max(1, count - h100 - v100)
    specs: list[NodeSpec] = []
    for prefix, model, board, n, driver, cuda in (
        ("h100", H100_80, nvswitch_board(8, 18, 56), h100, "550.90.07", "12.4"),
        ("a100", A100_80, nvswitch_board(8, 12, 64), a100, "550.90.07", "12.4"),
        ("v100", V100_32, dgx1_board(), v100, "535.183.01", "12.2"),
    ):
        for i in range(n):
            index = len(specs)
            mig = prefix == "a100" and i == n - 1 and n > 1
            specs.append(
                NodeSpec(
                    _name(prefix, i, n),
                    model,
                    board,
                    "a100-mig" if mig else prefix,
                    _rack(index),
                    driver,
                    cuda,
                    mig,
                )
            )
    return FleetSpec(
        "mixed-h100-a100-v100",
        tuple(specs),
        {"h100": 1.05, "a100": 1.0, "v100": 0.2},
        None,
        {"h100": 0.9, "a100": 0.85, "v100": 0.2},
    )


def nvlink_islands(nodes: int | None = None) -> FleetSpec:
    """4 nodes of 8 A100-40GB on two 4-GPU NVLink boards each, joined across sockets by PCIe."""
    count = nodes or 4
    board = two_island_board(4, 32)
    specs = tuple(
        NodeSpec(
            _name("island", i, count), A100_40, board, "a100-40", _rack(i), "535.183.01", "12.2"
        )
        for i in range(count)
    )
    return FleetSpec("nvlink-islands", specs, {"a100-40": 0.7}, None, {"a100-40": 0.6})


_BUILDERS = {
    "a100-16x8": a100_16x8,
    "mixed-h100-a100-v100": mixed_h100_a100_v100,
    "nvlink-islands": nvlink_islands,
}


def build_preset(preset: str, nodes: int | None = None) -> FleetSpec:
    """The fleet spec of a named preset; ValueError lists the valid names."""
    try:
        builder = _BUILDERS[preset]
    except KeyError:
        raise ValueError(
            f"unknown sim preset {preset!r}; choose one of {', '.join(PRESETS)}"
        ) from None
    if nodes is not None and nodes < 1:
        raise ValueError(f"--sim.nodes must be at least 1, got {nodes}")
    return builder(nodes)
