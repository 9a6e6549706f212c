"""The small value shapes Slurm's JSON uses, read the same way for every version.

The `--json` output and slurmrestd share one data model per OpenAPI version, and it changed:

| Slurm (Debian release)        | plugin / data_parser | numbers          | states           |
| ----------------------------- | -------------------- | ---------------- | ---------------- |
| 21.08                         | openapi/v0.0.37      | plain            | "mixed" + flags  |
| 22.05 (bookworm)              | openapi/v0.0.38      | plain            | "mixed" + flags  |
| 23.02, 23.11                  | v0.0.39, v0.0.40     | {set, infinite, number} | ["MIXED", "DRAIN"] |
| 24.05, 24.11 (trixie), 25.x   | v0.0.41, v0.0.42+    | {set, infinite, number} | ["MIXED", "DRAIN"] |

Slurm 20.11 (bullseye) and older print no JSON at all (`version_supported` says so). Version
strings moved too: `meta.Slurm.version` with integers (<= 23.02), `meta.slurm.version` with
strings (>= 23.11). The readers call these helpers instead of branching on versions.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any

OLDEST_JSON = (21, 8)  # squeue/sinfo --json arrived in 21.08
SCONTROL_JSON = (23, 2)  # scontrol --json (nodes, reservations) arrived in 23.02


class SlurmFormatError(ValueError):
    """Slurm's output is not in a shape this reader knows; the message is one line."""


def number(value: Any) -> float | None:
    """A plain number, or the {set, infinite, number} object of v0.0.39+, as a float; None when
    unset, infinite or absent (Slurm's "no value", never a number to compute with)."""
    kind = type(value)
    if kind is int:  # the common case first: 100,000 jobs read ~10 of these each
        return float(value)
    if value is None or kind is bool:
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, Mapping):
        if not value.get("set", True) or value.get("infinite", False):
            return None
        return number(value.get("number"))
    if isinstance(value, str):
        try:
            parsed = float(value)
        except ValueError:
            return None
        return parsed if math.isfinite(parsed) else None
    return None


def whole(value: Any, default: int = 0) -> int:
    """`number` as an int, `default` where Slurm gives none."""
    parsed = number(value)
    return default if parsed is None else int(parsed)


def time_or_nan(value: Any) -> float:
    """A Unix time; NaN for Slurm's 0 ("not yet") and for no value."""
    parsed = number(value)
    return math.nan if parsed is None or parsed <= 0 else parsed


def words(value: Any) -> tuple[str, ...]:
    """A state or flag field as upper-case words: "mixed" (v0.0.38), ["MIXED", "DRAIN"]
    (v0.0.39+), "IDLE+DRAIN" (text) or None."""
    if value is None:
        return ()
    if isinstance(value, str):
        return _split_words(value)
    if isinstance(value, list | tuple):
        out: list[str] = []
        for item in value:
            out.extend(words(item))
        return tuple(out)
    raise SlurmFormatError(f"expected a state word or a list of them, got {value!r}")


_NULLS = frozenset({"(null)", "N/A", "n/a"})


@functools.lru_cache(maxsize=256)
def _split_words(value: str) -> tuple[str, ...]:
    return tuple(p.strip().upper() for p in value.replace("+", ",").split(",") if p.strip())


def text(value: Any) -> str:
    """A string field; "" for null (and Slurm's "(null)" and "N/A")."""
    if value is None:
        return ""
    value = value if type(value) is str else str(value)
    return "" if value in _NULLS else value


def version(doc: Mapping[str, Any]) -> tuple[int, int] | None:
    """(major, minor) of the Slurm that wrote `doc` (its `meta`), None when it does not say."""
    meta = doc.get("meta") if isinstance(doc, Mapping) else None
    if not isinstance(meta, Mapping):
        return None
    slurm = meta.get("Slurm") or meta.get("slurm")
    if not isinstance(slurm, Mapping):
        return None
    parts = slurm.get("version")
    if isinstance(parts, Mapping):
        try:
            return int(parts["major"]), int(parts["minor"])
        except (KeyError, TypeError, ValueError):
            pass
    return parse_release(str(slurm.get("release", "")))


def parse_release(release: str) -> tuple[int, int] | None:
    """(major, minor) of "22.05.8", "slurm 24.11.5" or "slurm-wlm 22.05.8"; None otherwise."""
    for token in release.replace("-", " ").split():
        pieces = token.split(".")
        if len(pieces) >= 2 and pieces[0].isdigit() and pieces[1].isdigit():
            return int(pieces[0]), int(pieces[1])
    return None


def version_text(ver: tuple[int, int]) -> str:
    return f"{ver[0]}.{ver[1]:02d}"


def version_supported(ver: tuple[int, int] | None, where: str) -> None:
    """SlurmFormatError for a Slurm too old to print JSON (20.11 and older)."""
    if ver is not None and ver < OLDEST_JSON:
        raise SlurmFormatError(
            f"{where}: Slurm {version_text(ver)} prints no JSON; the Slurm source needs "
            f"{version_text(OLDEST_JSON)} or newer (Debian bookworm ships 22.05)"
        )


def errors(doc: Mapping[str, Any], where: str) -> None:
    """SlurmFormatError with Slurm's own first error when the document reports one."""
    listed = doc.get("errors") or []
    if not isinstance(listed, list) or not listed:
        return
    first = listed[0]
    if isinstance(first, Mapping):
        message = first.get("description") or first.get("error") or str(first)
        code = first.get("error_number") or first.get("errno")
        message = f"{message} (error {code})" if code else str(message)
    else:
        message = str(first)
    raise SlurmFormatError(f"{where}: Slurm reported an error: {message}")


def records(doc: Any, key: str, where: str) -> list[Mapping[str, Any]]:
    """`doc[key]`, a list of objects, after checking the document's version and errors."""
    if not isinstance(doc, Mapping):
        raise SlurmFormatError(f"{where}: expected a JSON object, got {type(doc).__name__}")
    version_supported(version(doc), where)
    errors(doc, where)
    if key not in doc:
        known = ", ".join(sorted(str(k) for k in doc)[:6])
        raise SlurmFormatError(
            f"{where}: no {key!r} list in Slurm's answer (keys: {known}); is this the output of "
            "a Slurm version this reader knows (21.08 to 25.x)?"
        )
    items = doc[key]
    if items is None:
        return []
    if not isinstance(items, list) or not all(isinstance(item, Mapping) for item in items):
        raise SlurmFormatError(f"{where}: {key!r} is not a list of objects")
    return items
