"""Slurm host lists ("gpu[01-04,07],login1", "r[1-2]-n[01-02]") as node names.

Slurm prints node sets this way everywhere (a job's `nodes`, a reservation's `node_list`,
`scontrol show topology`). Expansion follows Slurm's rules: a bracket holds comma-separated
numbers or ranges, a range keeps the zero padding of its first number, and several brackets in
one name give every combination, the first bracket varying slowest.
"""

from __future__ import annotations

import itertools
import re

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
MAX_NAMES = 1_000_000  # a list naming more nodes than any cluster has is malformed


class HostlistError(ValueError):
    """A host list Slurm would not have printed; the message quotes it."""


def split_top(text: str) -> list[str]:
    """`text` split at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"host list {text!r}: nested brackets")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"host list {text!r}: ']' without '['")
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise HostlistError(f"host list {text!r}: '[' without ']'")
    parts.append(text[start:])
    return [part.strip() for part in parts if part.strip()]


def _numbers(inside: str, text: str) -> list[str]:
    out: list[str] = []
    for item in inside.split(","):
        match = _RANGE.match(item.strip())
        if not match:
            raise HostlistError(f"host list {text!r}: {item!r} is not a number or a range")
        low, high = match.group(1), match.group(2)
        if high is None:
            out.append(low)
            continue
        if int(high) < int(low):
            raise HostlistError(f"host list {text!r}: range {item!r} runs backwards")
        if int(high) - int(low) + len(out) >= MAX_NAMES:
            raise HostlistError(f"host list {text!r}: more than {MAX_NAMES:,} names")
        width = len(low)
        out.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
    return out


def _expand_one(name: str, text: str) -> list[str]:
    pieces = re.split(r"\[([^\]]*)\]", name)
    if len(pieces) == 1:
        return [name]
    fixed, choices = pieces[0::2], [_numbers(inside, text) for inside in pieces[1::2]]
    out = []
    for combo in itertools.product(*choices):
        out.append(
            "".join(
                part for pair in itertools.zip_longest(fixed, combo, fillvalue="") for part in pair
            )
        )
    return out


def expand(text: str | None) -> list[str]:
    """Every node name of a Slurm host list, in Slurm's order; [] for "" or None (a pending
    job's `nodes`). HostlistError for a list Slurm would not print."""
    if not text or text in ("(null)", "None"):
        return []
    if "[" not in text and "," not in text:
        return [text.strip()]
    names: list[str] = []
    for part in split_top(text):
        names.extend(_expand_one(part, text))
        if len(names) > MAX_NAMES:
            raise HostlistError(f"host list {text[:60]!r}...: more than {MAX_NAMES:,} names")
    return names
