"""Flag values, parsed one way for every command: durations, byte sizes and bounded numbers.

All raise `argparse.ArgumentTypeError` with one line, so argparse prints it as the flag's error;
callers outside argparse (source specs) catch it and re-word it for their own error type.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from typing import Any

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d)?$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB|TiB)?$")
_SIZES = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, None: 1}


def duration(text: str) -> float:
    """Prometheus-style duration ("15s", "500ms", "1h", "2d"; a bare number is seconds)."""
    match = _DURATION.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 15s, 500ms or 1h")
    return float(match.group(1)) * _UNITS[match.group(2)]


def positive_duration(text: str) -> float:
    """A duration above zero (intervals, timeouts)."""
    value = duration(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive duration like 10s or 500ms")
    return value


def duration_at_most(limit_s: float, why: str) -> Callable[[str], float]:
    """An argparse type for a duration of at most `limit_s`; `why` ends the error after the
    bound ("'17d': at most 16d, the past the advisor keeps")."""

    def parse(text: str) -> float:
        value = duration(text)
        if value > limit_s:
            raise argparse.ArgumentTypeError(f"{text!r}: at most {duration_text(limit_s)}{why}")
        return value

    return parse


def size(text: str) -> float:
    """A byte size ("10GiB", "512MiB"; a bare number is bytes)."""
    match = _SIZE.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size like 10GiB")
    return float(match.group(1)) * _SIZES[match.group(2)]


def number(
    low: float, high: float = math.inf, *, above: bool = False, kind: type = float
) -> Callable[[str], Any]:
    """An argparse type for a finite number in [low, high] (`above`: strictly above `low`), so a
    nan, an infinity or an out-of-range value is refused at its flag instead of silently
    measuring nothing (nan compares false with everything)."""
    word = "whole number" if kind is int else "number"
    bounds = f"> {low:g}" if above else f">= {low:g}"
    if math.isfinite(high):
        bounds += f" and <= {high:g}"

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {word}") from None
        # an int beyond a float's range is out of every bound, not an OverflowError in isfinite
        finite = kind is int or math.isfinite(value)
        if not (finite and low <= value <= high) or (above and value == low):
            raise argparse.ArgumentTypeError(f"{text!r}: expected a finite {word} {bounds}")
        return value

    return parse


def fraction(part: str) -> float:
    """A number strictly inside (0, 1): a quantile level or a risk; 0, 1, nan and 1.5 are not."""
    try:
        value = float(part)
    except ValueError:
        value = float("nan")
    if not 0 < value < 1:  # false for nan too
        raise argparse.ArgumentTypeError(f"{part!r} is not a number strictly between 0 and 1")
    return value


def duration_text(seconds: float) -> str:
    """A duration as the flags take it ("15s", "1h", "500ms"): the largest whole unit."""
    for unit in ("d", "h", "m", "s", "ms"):
        count = seconds / _UNITS[unit]
        if count >= 1 and count == int(count):
            return f"{int(count)}{unit}"
    return f"{seconds:g}s"


def size_text(size_bytes: float) -> str:
    """A byte size as the flags take it ("10GiB"): the largest whole unit."""
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        count = size_bytes / _SIZES[unit]
        if count >= 1 and count == int(count):
            return f"{int(count)}{unit}"
    return f"{size_bytes:g}B"


class DefaultsFormatter(argparse.HelpFormatter):
    """Help that ends with each option's default, written as the flag takes it (15s, 10GiB,
    1,24), unless the text already says it: an operator should never need the source to know
    what an unset flag does."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            not action.option_strings
            or default is None
            or default is argparse.SUPPRESS
            or isinstance(default, bool)
            or default in ("", [], ())
            or "default" in text
        ):
            return action.help
        shown = default_text(action.type, default).replace("%", "%%")
        return f"{text} (default: {shown})" if text else f"default: {shown}"


def default_text(kind: Any, default: Any) -> str:
    """A flag's default in the form the flag accepts."""
    if kind in (duration, positive_duration) and isinstance(default, int | float):
        return duration_text(float(default))
    if kind is size and isinstance(default, int | float):
        return size_text(float(default))
    if isinstance(default, list | tuple | set | frozenset):
        return ",".join(str(part) for part in default)
    return f"{default:g}" if isinstance(default, float) else str(default)
