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
        if not (math.isfinite(value) and low <= value <= high) or (above and value == low):
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
