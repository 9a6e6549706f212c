"""GPU models and node board layouts the simulated fleet is built from.

Numbers are the datasheet / `nvidia-smi` values of the real parts, so dashboards and the advisor
see plausible magnitudes (memory sizes, power limits, clocks, NVLink counts per pair).
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = float(2**30)
MIB = float(2**20)


@dataclass(frozen=True, slots=True)
class GpuModel:
    """One GPU part: what NVML would report as name, sizes, limits and clocks."""

    key: str  # short pool key: "a100", "h100", "v100", "a100-40"
    name: str  # NVML device name
    memory_bytes: float
    reserved_bytes: float
    power_limit_watts: float
    idle_power_watts: float
    max_sm_clock_hertz: float
    idle_sm_clock_hertz: float
    memory_clock_hertz: float
    vbios_version: str
    row_remapping: bool  # Ampere and later remap rows; Volta retires pages
    mig_profiles: tuple[tuple[str, int, float], ...] = ()  # (profile, compute slices, bytes)


A100_80 = GpuModel(
    key="a100",
    name="NVIDIA A100-SXM4-80GB",
    memory_bytes=81920 * MIB,
    reserved_bytes=507 * MIB,
    power_limit_watts=400.0,
    idle_power_watts=62.0,
    max_sm_clock_hertz=1410e6,
    idle_sm_clock_hertz=210e6,
    memory_clock_hertz=1593e6,
    vbios_version="92.00.45.00.06",
    row_remapping=True,
    mig_profiles=(
        ("1g.10gb", 1, 9856 * MIB),
        ("2g.20gb", 2, 19968 * MIB),
        ("3g.40gb", 3, 40192 * MIB),
        ("4g.40gb", 4, 40192 * MIB),
        ("7g.80gb", 7, 80896 * MIB),
    ),
)
H100_80 = GpuModel(
    key="h100",
    name="NVIDIA H100 80GB HBM3",
    memory_bytes=81559 * MIB,
    reserved_bytes=512 * MIB,
    power_limit_watts=700.0,
    idle_power_watts=72.0,
    max_sm_clock_hertz=1980e6,
    idle_sm_clock_hertz=345e6,
    memory_clock_hertz=2619e6,
    vbios_version="96.00.74.00.0B",
    row_remapping=True,
    mig_profiles=(
        ("1g.10gb", 1, 9984 * MIB),
        ("2g.20gb", 2, 20096 * MIB),
        ("3g.40gb", 3, 40320 * MIB),
        ("4g.40gb", 4, 40320 * MIB),
        ("7g.80gb", 7, 80896 * MIB),
    ),
)
V100_32 = GpuModel(
    key="v100",
    name="Tesla V100-SXM2-32GB",
    memory_bytes=32768 * MIB,
    reserved_bytes=306 * MIB,
    power_limit_watts=300.0,
    idle_power_watts=42.0,
    max_sm_clock_hertz=1530e6,
    idle_sm_clock_hertz=135e6,
    memory_clock_hertz=877e6,
    vbios_version="88.00.4F.00.09",
    row_remapping=False,
)
A100_40 = GpuModel(
    key="a100-40",
    name="NVIDIA A100-SXM4-40GB",
    memory_bytes=40960 * MIB,
    reserved_bytes=415 * MIB,
    power_limit_watts=400.0,
    idle_power_watts=55.0,
    max_sm_clock_hertz=1410e6,
    idle_sm_clock_hertz=210e6,
    memory_clock_hertz=1215e6,
    vbios_version="92.00.36.00.02",
    row_remapping=True,
)

# PCI bus ids of an 8-GPU HGX board (DGX A100 order); reused for every 8-GPU node.
PCI_BUS_IDS_8 = tuple(
    f"00000000:{bus}:00.0" for bus in ("07", "0F", "47", "4E", "87", "90", "B7", "BD")
)


@dataclass(frozen=True, slots=True)
class BoardLayout:
    """How the GPUs of one node connect: ordered-pair links, NUMA node and CPU affinity per GPU."""

    name: str
    links: tuple[tuple[int, int, str, int], ...]  # (gpu, peer, link_type, nvlink_count)
    numa: tuple[int, ...]
    cpu_affinity: tuple[str, ...]

    @property
    def gpus(self) -> int:
        return len(self.numa)


def _two_socket(n: int, cpus_per_socket: int) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """GPUs split evenly over two sockets; affinity lists the socket's cores and their SMT twins."""
    numa = tuple(0 if gpu < n // 2 else 1 for gpu in range(n))
    total = 2 * cpus_per_socket
    affinity = tuple(
        f"{s * cpus_per_socket}-{(s + 1) * cpus_per_socket - 1},"
        f"{total + s * cpus_per_socket}-{total + (s + 1) * cpus_per_socket - 1}"
        for s in numa
    )
    return numa, affinity


def nvswitch_board(n: int = 8, nvlinks: int = 12, cpus_per_socket: int = 64) -> BoardLayout:
    """HGX/DGX with NVSwitch: every GPU pair is NVLink-connected with the same link count."""
    numa, affinity = _two_socket(n, cpus_per_socket)
    links = tuple((a, b, "nvlink", nvlinks) for a in range(n) for b in range(n) if a != b)
    return BoardLayout(f"nvswitch-nv{nvlinks}", links, numa, affinity)


# DGX-1V hybrid cube mesh (nvidia-smi topo -m): NVLink count per pair, 0 = no NVLink (SYS).
_DGX1_NV = (
    (0, 1, 1, 2, 2, 0, 0, 0),
    (1, 0, 2, 1, 0, 2, 0, 0),
    (1, 2, 0, 2, 0, 0, 1, 0),
    (2, 1, 2, 0, 0, 0, 0, 1),
    (2, 0, 0, 0, 0, 1, 1, 2),
    (0, 2, 0, 0, 1, 0, 2, 1),
    (0, 0, 1, 0, 1, 2, 0, 2),
    (0, 0, 0, 1, 2, 1, 2, 0),
)


def dgx1_board() -> BoardLayout:
    """DGX-1 with V100: hybrid cube mesh, non-NVLink pairs cross the CPU interconnect."""
    numa, affinity = _two_socket(8, 20)
    links = tuple(
        (a, b, "nvlink" if _DGX1_NV[a][b] else "cross_socket", _DGX1_NV[a][b])
        for a in range(8)
        for b in range(8)
        if a != b
    )
    return BoardLayout("dgx1-hybrid-cube-mesh", links, numa, affinity)


def two_island_board(nvlinks: int = 4, cpus_per_socket: int = 32) -> BoardLayout:
    """Two 4-GPU NVLink boards, one per socket: 0-3 and 4-7 are islands joined only via PCIe.

    Inside an island every pair has NVLink. Across islands the path goes through the host
    bridges and the CPU interconnect, which NVML reports as SYS (cross_socket).
    """
    numa, affinity = _two_socket(8, cpus_per_socket)
    links = tuple(
        (a, b, "nvlink", nvlinks) if a // 4 == b // 4 else (a, b, "cross_socket", 0)
        for a in range(8)
        for b in range(8)
        if a != b
    )
    return BoardLayout("two-islands-nv4", links, numa, affinity)
