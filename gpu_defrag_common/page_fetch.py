"""Fetch and parse one scraped `/metrics` page, one error for every way it can fail.

Both the exporter (its dcgm-exporter backend) and the advisor (its ingest of exporter pages)
read other processes' pages; the HTTP limits, the messages and the error they raise live here
once. Each side turns `PageUnavailable` into its own error in one place: the backend into
`gpu_exporter_backend_up 0` and a count per target, the advisor's ingest into
`SourceUnavailable`.
"""

from __future__ import annotations

import requests

from gpu_defrag_common import bounded_get, units
from gpu_defrag_common.page_parse import PageError, Sample, Skipped, parse_page

# The most a /metrics page may hold. dcgm-exporter's page of an 8-GPU node is ~90 KB, with MIG
# and profiling fields a few hundred KB; our exporter's page of a big node a few MB. 64 MiB is
# ten times the largest real page, and still parses in bounded time and memory: more is a
# broken or hostile target (an endless page), refused rather than read until memory runs out.
MAX_PAGE_BYTES = 64 * 2**20


class PageUnavailable(Exception):
    """A page cannot be read (down, slow, too large, empty, not exposition text); the message
    is one line naming its URL and the reason."""


def fetch_page(url: str, timeout: float, session: requests.Session | None = None) -> str:
    """The text of one /metrics page; PageUnavailable with one line naming the URL on any
    HTTP failure (timeout, refused, non-200, a page not complete within `timeout` or over
    `MAX_PAGE_BYTES`)."""
    try:
        response = bounded_get.get(url, timeout, cap=MAX_PAGE_BYTES, session=session)
    except requests.Timeout:
        raise PageUnavailable(f"{url}: no answer within {timeout:g} s") from None
    except bounded_get.AnswerTooSlow:
        raise PageUnavailable(f"{url}: no complete answer within {timeout:g} s") from None
    except bounded_get.AnswerTooLarge:
        raise PageUnavailable(
            f"{url}: page larger than {units.size_text(MAX_PAGE_BYTES)}"
        ) from None
    except requests.RequestException as error:
        raise PageUnavailable(f"{url}: unreachable ({type(error).__name__})") from None
    if response.status_code != 200:
        raise PageUnavailable(f"{url}: HTTP {response.status_code} {response.reason}")
    return response.text


def parse_samples(
    text: str, url: str, *, empty_hint: str = "", none_hint: str = ""
) -> tuple[list[Sample], Skipped | None]:
    """(sample name, labels, value) of every sample of any exposition page, and the lines left
    out as unparseable (`page_parse`); PageUnavailable with one line naming the URL for an
    empty page, one of which no line parses (naming its first bad line) or one without samples.
    The hints are added to the message of an empty page and of a page without samples."""
    if not text.strip():
        raise PageUnavailable(f"{url}: empty /metrics page{_hint(empty_hint)}")
    try:
        samples, skipped = parse_page(text)
    except PageError as error:
        raise PageUnavailable(f"{url}: {error}") from None
    if not samples:
        raise PageUnavailable(f"{url}: no samples in the /metrics page{_hint(none_hint)}")
    return samples, skipped


def _hint(text: str) -> str:
    return f" ({text})" if text else ""
