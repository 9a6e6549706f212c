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

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

Sample = tuple[str, dict[str, str], float]
SHOWN_CHARS = 80  # of a bad line in a message
MAX_ROUNDS = 64  # whole-page retries for lines that parse alone but not in their page


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
    bad line when no line of it parses. Lines are tried one by one only when the page does not
    parse whole; a line that parses alone but not in its page (a TYPE clash) is found by
    bisection, at most `MAX_ROUNDS` times."""
    try:
        return _parse(text), None
    except ValueError:
        pass
    lines = text.splitlines()
    kept: list[int] = []  # numbers (0-based) of the lines kept
    bad: list[tuple[int, str]] = []
    for number, line in enumerate(lines):
        error = _error(line + "\n") if line.strip() else None
        if error is None:
            kept.append(number)
        else:
            bad.append((number, error))
    for _ in range(MAX_ROUNDS):
        page = "\n".join(lines[n] for n in kept) + "\n"
        error = _error(page)
        if error is None:
            break
        at = first_bad_line(page)
        position = (at or 1) - 1
        bad.append((kept.pop(position), error))
    else:
        kept = []
    samples = _parse("\n".join(lines[n] for n in kept) + "\n") if kept else []
    bad.sort()
    number, error = bad[0]
    skipped = Skipped(len(bad), number + 1, lines[number], error)
    if not samples:
        raise PageError(f"malformed exposition text at {skipped.describe()}")
    return samples, skipped
