"""Valid MIG profiles per GPU model (NVIDIA MIG user guide, "Supported MIG Profiles").

A profile `Ng.Mgb` takes N compute slices (of 7; A30: of 4) and some memory slices (of 8;
A30: of 4). Which profiles may sit side by side is approximated by "compute slices and memory
slices each add up to at most the GPU's": NVIDIA's placement rules forbid a few such mixes
(e.g. where instances must start), so a packing is a proposal to check against
`nvidia-smi mig -lgipp` before it is applied.

- `profiles_for(gpu_model, memory_bytes)` — the profiles of that model (empty: no MIG).
- `smallest_profile(gpu_model, memory_bytes, compute, memory_bytes_needed)` — the smallest
  profile with at least `compute` (fraction of the GPU's SMs) and that much memory.
- `profile_named(gpu_model, memory_bytes, name)` — that model's profile called `name`, or None.
- `milli_of(profile)` — the profile's share in milli-GPU (compute slices; rounded down so that
  any set of profiles that fits adds up to at most 1000).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GB = 1e9  # MIG profile names count decimal-ish GB; the sizes below are the usable bytes
GIB = float(2**30)


@dataclass(frozen=True)
class MigProfile:
    name: str
    compute_slices: int
    memory_slices: int
    memory_bytes: float
    compute_total: int = 7
    memory_total: int = 8

    @property
    def compute_fraction(self) -> float:
        return self.compute_slices / self.compute_total


def _family(
    sizes: tuple[tuple[str, int, int, float], ...], compute: int = 7, memory: int = 8
) -> tuple[MigProfile, ...]:
    return tuple(MigProfile(n, c, m, gib * GIB, compute, memory) for n, c, m, gib in sizes)


# (profile, compute slices, memory slices, usable GiB)
A100_40 = _family(
    (
        ("1g.5gb", 1, 1, 4.75),
        ("1g.10gb", 1, 2, 9.75),
        ("2g.10gb", 2, 2, 9.75),
        ("3g.20gb", 3, 4, 19.62),
        ("4g.20gb", 4, 4, 19.62),
        ("7g.40gb", 7, 8, 39.38),
    )
)
A100_80 = _family(
    (
        ("1g.10gb", 1, 1, 9.62),
        ("1g.20gb", 1, 2, 19.5),
        ("2g.20gb", 2, 2, 19.5),
        ("3g.40gb", 3, 4, 39.25),
        ("4g.40gb", 4, 4, 39.25),
        ("7g.80gb", 7, 8, 79.0),
    )
)
H100_80 = _family(
    (
        ("1g.10gb", 1, 1, 9.75),
        ("1g.20gb", 1, 2, 19.62),
        ("2g.20gb", 2, 2, 19.62),
        ("3g.40gb", 3, 4, 39.38),
        ("4g.40gb", 4, 4, 39.38),
        ("7g.80gb", 7, 8, 79.0),
    )
)
H100_94 = _family(
    (
        ("1g.12gb", 1, 1, 11.0),
        ("1g.24gb", 1, 2, 23.0),
        ("2g.24gb", 2, 2, 23.0),
        ("3g.47gb", 3, 4, 46.0),
        ("4g.47gb", 4, 4, 46.0),
        ("7g.94gb", 7, 8, 93.0),
    )
)
H200_141 = _family(
    (
        ("1g.18gb", 1, 1, 16.75),
        ("1g.35gb", 1, 2, 33.0),
        ("2g.35gb", 2, 2, 33.0),
        ("3g.71gb", 3, 4, 67.0),
        ("4g.71gb", 4, 4, 67.0),
        ("7g.141gb", 7, 8, 134.0),
    )
)
A30_24 = _family(
    (("1g.6gb", 1, 1, 5.75), ("2g.12gb", 2, 2, 11.75), ("4g.24gb", 4, 4, 23.5)),
    compute=4,
    memory=4,
)


def profiles_for(gpu_model: str, memory_bytes: float = math.nan) -> tuple[MigProfile, ...]:
    """MIG profiles of this GPU model; `memory_bytes` tells 40 GB from 80 GB A100s (and 94 GB
    H100 NVL) where the name does not. Empty for GPUs without MIG (V100, T4, A10, L4, ...)."""
    name = gpu_model.upper()
    gib = memory_bytes / GIB if math.isfinite(memory_bytes) else math.nan
    if "A30" in name:
        return A30_24
    if "H200" in name or "GH200" in name:
        return H200_141
    if "H100" in name:
        return H100_94 if ("NVL" in name or gib > 85) else H100_80
    if "A100" in name:
        if "80GB" in name or gib > 45:
            return A100_80
        return A100_40
    return ()


def smallest_profile(
    gpu_model: str, memory_bytes: float, compute: float, memory_needed: float
) -> MigProfile | None:
    """The smallest profile (fewest compute slices, then memory slices) with at least
    `compute` of the GPU's SMs and `memory_needed` bytes; None if none or no MIG."""
    fits = [
        p
        for p in profiles_for(gpu_model, memory_bytes)
        if p.compute_fraction >= compute - 1e-9 and p.memory_bytes >= memory_needed
    ]
    return min(fits, key=lambda p: (p.compute_slices, p.memory_slices), default=None)


def profile_named(gpu_model: str, memory_bytes: float, name: str) -> MigProfile | None:
    """The profile `name` (e.g. "1g.10gb") of this GPU model and memory size; None if that
    model has no such profile (or no MIG). Names are per family: an A100 40 GB's 1g.10gb
    takes two memory slices, an 80 GB's one."""
    return next((p for p in profiles_for(gpu_model, memory_bytes) if p.name == name), None)


def milli_of(profile: MigProfile) -> int:
    """Share in milli-GPU by compute slices, rounded down (7 x 1g = 994 <= 1000)."""
    return max(1, (1000 * profile.compute_slices) // profile.compute_total)
