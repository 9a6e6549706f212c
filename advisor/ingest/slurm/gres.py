"""Slurm's GRES and TRES strings, as counts of GPUs (and their type) and per-GPU indices.

Forms read (every Slurm from 21.08 prints one of them):

    node GRES          gpu:a100:8  gpu:a100:8(S:0-1)  gpu:8  gpu:h100:2,gpu:h200:4,nic:1
    used / job detail  gpu:a100:5(IDX:0-4)  gpu:a100:3(IDX:0,2,5)  gpu:0(IDX:N/A)
    request            gres:gpu:8 (22.05)  gres/gpu:8  gres/gpu:a100:2 (23.02+)  gpu:2
    TRES               cpu=4,mem=1000M,node=2,billing=4,gres/gpu=16,gres/gpu:a100=16

Only the `gpu` GRES is read; other GRES (nic, shard, mps) are not GPUs. A GRES type is the
site's name for the GPU model (`gpu:a100:8` -> "a100"); "" when the site gives none.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass

from advisor.ingest.slurm.values import SlurmFormatError

GPU = "gpu"
_MEMORY_UNITS = {"": 1.0, "K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0**2, "P": 1024.0**3}
_COUNT = re.compile(r"^(\d+)([KMGTP]?)$")
_IDX = re.compile(r"IDX:([^)]*)")


@dataclass(frozen=True)
class GresEntry:
    """One `gpu[:type][:count][(...)]` item: `indices` are the devices it names (IDX), None
    when the string names none."""

    type: str
    count: int
    indices: tuple[int, ...] | None = None


def split_items(text: str) -> list[str]:
    """`text` split at the commas outside parentheses ("gpu:a:2(IDX:0,1),nic:1")."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "(":
            depth += 1
        elif char == ")":
            depth = max(0, depth - 1)
        elif char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item.strip() for item in items if item.strip()]


def indices(text: str) -> tuple[int, ...] | None:
    """ "0-2,5" -> (0, 1, 2, 5); None for "N/A" or ""."""
    text = text.strip()
    if not text or text.upper() == "N/A":
        return None
    out: list[int] = []
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise SlurmFormatError(f"GPU indices {text!r}: {part!r} is not a number or a range")
        out.extend(range(int(low), int(high or low) + 1))
    return tuple(out)


def _count(text: str, whole: str) -> int:
    match = _COUNT.match(text)
    if not match:
        raise SlurmFormatError(f"GRES {whole!r}: count {text!r} is not a number")
    scale = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}
    return int(match.group(1)) * scale[match.group(2)]


def entries(text: str | None, name: str = GPU) -> tuple[GresEntry, ...]:
    """The `name` GRES items of a GRES string (node total, used, a job's detail or request).

    A request may carry the "gres:" (22.05) or "gres/" (23.02+) prefix and "=" before the
    count; a count left out is 1, as Slurm reads it."""
    if not text:
        return ()
    return _entries(text, name)


@functools.lru_cache(maxsize=4096)  # a cluster's jobs repeat a few dozen GRES strings
def _entries(text: str, name: str) -> tuple[GresEntry, ...]:
    if text.strip().upper() in ("N/A", "(NULL)"):
        return ()
    out = []
    for item in split_items(text):
        body, _, detail = item.partition("(")
        body = body.strip()
        for prefix in ("gres:", "gres/"):
            body = body.removeprefix(prefix)
        body = body.replace("=", ":")
        parts = body.split(":")
        if parts[0] != name:
            continue
        if len(parts) == 1:
            gres_type, count = "", 1
        elif len(parts) == 2:
            gres_type, count = (
                ("", _count(parts[1], text)) if parts[1][:1].isdigit() else (parts[1], 1)
            )
        else:
            gres_type, count = ":".join(parts[1:-1]), _count(parts[-1], text)
        match = _IDX.search(detail)
        out.append(GresEntry(gres_type, count, indices(match.group(1)) if match else None))
    return tuple(out)


def gpu_count(text: str | None) -> int:
    """GPUs a GRES string names, all types together."""
    return sum(entry.count for entry in entries(text))


def gpu_type(items: Iterable[GresEntry]) -> str:
    """The type named by the most GPUs among `items` (ties: first listed); "" if none."""
    totals: dict[str, int] = {}
    for entry in items:
        totals[entry.type] = totals.get(entry.type, 0) + entry.count
    return max(totals, key=lambda t: totals[t]) if totals else ""


def tres(text: str | None) -> dict[str, float]:
    """A TRES string as {name: value}; memory ("mem") in MiB, whatever unit Slurm printed."""
    return dict(_tres(text)) if text else {}


@functools.lru_cache(maxsize=4096)
def _tres(text: str) -> tuple[tuple[str, float], ...]:
    out: dict[str, float] = {}
    for item in text.split(","):
        key, sep, value = item.strip().partition("=")
        if not sep:
            continue
        value = value.strip()
        if key == "mem":
            unit = value[-1:].upper() if value[-1:].isalpha() else ""
            digits = value[:-1] if unit else value
            try:
                out[key] = float(digits) * _MEMORY_UNITS[unit]
            except (ValueError, KeyError):
                raise SlurmFormatError(f"TRES {text!r}: mem={value!r} is not a size") from None
            continue
        try:
            out[key] = float(value)
        except ValueError:
            continue  # billing weights and the like that are not counts
    return tuple(out.items())


def tres_gpus(text: str | None) -> tuple[int, str]:
    """(GPUs, type) a TRES string holds: `gres/gpu=N`, and the type of a `gres/gpu:TYPE=N`
    entry when there is exactly one."""
    values = tres(text)
    total = int(values.get("gres/gpu", 0))
    typed = [key.split(":", 1)[1] for key in values if key.startswith("gres/gpu:")]
    return total, typed[0] if len(typed) == 1 else ""
