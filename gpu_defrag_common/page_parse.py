"""Read the samples of a scraped exposition page, leaving out the lines that cannot be parsed.

Real dcgm-exporter pages hold lines no parser reads: a field whose value DCGM cannot render
(`DCGM_FI_DEV_VGPU_PER_PROCESS_UTILIZATION{...} ERROR - FAILED TO CONVERT TO STRING`, the
`MIG-GPU-.../3` value of DCGM_FI_DEV_CUDA_VISIBLE_DEVICES_STR) sits between hundreds of good
ones. One such line must not cost the page: it is left out, counted, and the first one named,
and every other line is read. A page of which no line parses (an HTML error page, a binary) is
still refused, naming its first bad line. Text is parsed by prometheus_client's own parser; a
page that parses whole (every page of ours) takes one pass, as before.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

Sample = tuple[str, dict[str, str], float]
SHOWN_CHARS = 80  # of a bad line in a message
MAX_ROUNDS = 64  # whole-page retries for lines that parse alone but not in their page
# What a sample line looks like: a name, maybe labels, a number (and maybe a timestamp). Only a
# first sieve, so that the parser is asked about the few lines that do not look like one (and a
# 20,000-line page is not parsed line by line); the parser has the last word on every line.
_SAMPLE_SHAPE = re.compile(
    r"[A-Za-z_:][\w:]*(?:\{.*\})?[ \t]+[-+]?(?:[0-9.][0-9_.eE+-]*|NaN|Inf)(?:[ \t]+-?[0-9]+)?[ \t]*"
)


@dataclass(frozen=True, slots=True)
class Skipped:
    """The lines of one page left out: how many, and the first one (1-based number, text)."""

    count: int
    first_number: int
    first_line: str
    first_error: str

    def describe(self) -> str:
        """The first line left out for a log line: its number, the parser's error, its text."""
        return f"line {self.first_number}: {self.first_error} ({shorten(self.first_line)!r})"


def shorten(line: str) -> str:
    """A line for a log: whole when short, else its start (the name) and its end (the value,
    where a bad value usually is) around "..."."""
    if len(line) <= SHOWN_CHARS:
        return line
    return f"{line[: SHOWN_CHARS // 2]} ... {line[-(SHOWN_CHARS // 2 - 5) :]}"


class PageError(ValueError):
    """A page none of whose lines parse; the message names its first bad line."""


def _parse(text: str) -> list[Sample]:
    return [
        (s.name, s.labels, s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def _error(text: str) -> str | None:
    """The parser's error for `text`, None when it parses."""
    try:
        _parse(text)
    except ValueError as error:
        return " ".join(str(error).split()) or type(error).__name__
    return None


def first_bad_line(text: str) -> int | None:
    """1-based number of the first line that makes the parser fail (binary search on prefixes)."""
    lines = text.splitlines()

    def fails(count: int) -> bool:
        return _error("\n".join(lines[:count]) + "\n") is not None

    if not fails(len(lines)):
        return None
    low, high = 0, len(lines)  # prefix of `low` lines parses, prefix of `high` lines fails
    while high - low > 1:
        middle = (low + high) // 2
        if fails(middle):
            high = middle
        else:
            low = middle
    return high


def parse_page(text: str) -> tuple[list[Sample], Skipped | None]:
    """(samples, the lines left out or None) of an exposition page; PageError naming the first
    bad line when no line of it parses. Only when the page does not parse whole are its lines
    looked at: the parser is asked about each one that does not look like a sample, the rest are
    parsed together once, and a line that fails only in its page is found by bisection (at most
    `MAX_ROUNDS` of them)."""
    try:
        return _parse(text), None
    except ValueError:
        pass
    lines = text.splitlines()
    kept: list[int] = []  # numbers (0-based) of the lines kept
    bad: list[tuple[int, str]] = []
    for number, line in enumerate(lines):
        looks_right = not line.strip() or line.startswith("#") or _SAMPLE_SHAPE.fullmatch(line)
        error = None if looks_right else _error(line + "\n")
        if error is None:
            kept.append(number)
        else:
            bad.append((number, error))
    samples: list[Sample] = []
    for _ in range(MAX_ROUNDS):
        page = "\n".join(lines[n] for n in kept) + "\n"
        try:
            samples = _parse(page) if kept else []
            break
        except ValueError as error:
            at = first_bad_line(page)
            message = " ".join(str(error).split()) or type(error).__name__
            bad.append((kept.pop((at or 1) - 1), message))
    bad.sort()
    number, error = bad[0]
    skipped = Skipped(len(bad), number + 1, lines[number], error)
    if not samples:
        raise PageError(f"malformed exposition text at {skipped.describe()}")
    return samples, skipped
