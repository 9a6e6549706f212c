"""Backend that scrapes running NVIDIA dcgm-exporter instances and re-reads their series.

For fleets that already run dcgm-exporter (GPU Operator), this turns its `/metrics` pages into
our readings: base units, one `_info` identity, pod allocations, MIG instances and per-code XID
counters, without touching the GPU a second time. The meaning of the series is
`exporter.dcgm_page` (which the advisor reads pages with too); fetching and parsing are
`gpu_defrag_common.page_fetch`'s; this module is the backend's flags, targets and errors.
"""

from __future__ import annotations

import argparse
import logging
import time
from urllib.parse import urlsplit

import requests

from exporter.backends.base import Backend, BackendUnavailable
from exporter.dcgm_page import PageNode, PageReader, group, parse_exposition
from exporter.readings import Collection
from gpu_defrag_common import bounded_get
from gpu_defrag_common.page_fetch import PageUnavailable, fetch_page
from gpu_defrag_common.page_parse import Skipped

log = logging.getLogger(__name__)


class DcgmExporterBackend(Backend):
    """Scrapes one or more dcgm-exporter `/metrics` URLs; one failing target does not stop the rest."""

    name = "dcgm-exporter"

    def __init__(self, urls: list[str], timeout: float = 5.0) -> None:
        if not urls:
            raise ValueError("--dcgm-exporter.url is required (e.g. http://localhost:9400/metrics)")
        self.urls = urls
        self.timeout = timeout
        self._session: requests.Session | None = None
        self._reader = PageReader()
        self._said_skipped: dict[str, tuple[int, int]] = {}  # url -> (count, first line) said

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        flags = parser.add_argument_group("dcgm-exporter backend")
        flags.add_argument(
            "--dcgm-exporter.url",
            dest="dcgm_exporter_url",
            action="append",
            default=[],
            metavar="URL",
            help="dcgm-exporter /metrics URL; repeat or comma-separate for several targets",
        )
        flags.add_argument(
            "--dcgm-exporter.timeout",
            dest="dcgm_exporter_timeout",
            type=float,
            default=5.0,
            metavar="SECONDS",
            help="HTTP timeout per target, for its whole page (default 5)",
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> DcgmExporterBackend:
        urls = [
            url.strip()
            for value in getattr(args, "dcgm_exporter_url", None) or []
            for url in value.split(",")
            if url.strip()
        ]
        for url in urls:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"--dcgm-exporter.url {url!r} is not an http(s) URL")
        timeout = getattr(args, "dcgm_exporter_timeout", 5.0)
        if timeout <= 0:
            raise ValueError("--dcgm-exporter.timeout must be positive")
        return cls(urls, timeout)

    def start(self) -> None:
        if self._session is None:
            self._session = bounded_get.new_session()

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    def fetch(self, url: str) -> str:
        """The page text; PageUnavailable with one line naming the URL on any HTTP failure."""
        self.start()
        return fetch_page(url, self.timeout, self._session)

    def collect(self) -> Collection:
        now = time.time()
        nodes: dict[str, PageNode] = {}
        errors: dict[str, str] = {}
        skipped: dict[str, int] = {}
        for url in self.urls:
            try:
                samples, bad = parse_exposition(self.fetch(url), url)
                if not group(samples, urlsplit(url).hostname or url, nodes):
                    raise PageUnavailable(f"{url}: no per-GPU series (is it dcgm-exporter?)")
            except PageUnavailable as error:
                errors[url] = str(error)
                log.warning("%s", error)
                continue
            self._say_skipped(url, bad)
            if bad is not None:
                skipped[url] = bad.count
        if len(errors) == len(self.urls):
            if len(errors) == 1:
                raise BackendUnavailable(next(iter(errors.values())))
            first = next(iter(errors.values()))
            raise BackendUnavailable(f"all {len(errors)} dcgm-exporter targets failed; {first}")
        collection = Collection(
            nodes=[self._reader.node_reading(node, now) for node in nodes.values()], timestamp=now
        )
        for url in errors:
            collection.errors[f"scrape {url}"] += 1
        collection.skipped_lines.update(skipped)
        return collection

    def _say_skipped(self, url: str, bad: Skipped | None) -> None:
        """One warning when a target's page starts having unparseable lines or has others, one
        line when it has none again: not one every collection."""
        said = self._said_skipped.get(url)
        now = None if bad is None else (bad.count, bad.first_number)
        if now == said:
            return
        if bad is None:
            del self._said_skipped[url]
            log.info("%s: every line of the page parses again", url)
            return
        self._said_skipped[url] = now
        log.warning(
            "%s: %d line(s) of the page cannot be parsed and are left out, the rest is read; "
            "first: %s",
            url,
            bad.count,
            bad.describe(),
        )
