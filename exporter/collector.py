"""The background loop: collect on an interval, render once, publish the page atomically.

A scrape reads `current_page()` and never calls the backend, so a slow or hung GPU call can only
make the data older, never the scrape slower. Health is judged by the age of the last complete
collection, so stale data cannot hide behind a healthy health check.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable

from exporter.backends.base import Backend, BackendUnavailable
from exporter.node_gauges import IdlePolicy, IdleTracker, NodeGauges, node_gauges
from exporter.readings import Collection
from exporter.render import SelfState, render_page
from gpu_defrag_common import __version__
from gpu_defrag_common.exposition import Page, TextCache
from gpu_defrag_common.messages import one_line
from gpu_defrag_common.server import Health

log = logging.getLogger(__name__)

# The loop's own failure kinds, counted from 0 on the first page so that `increase()` and
# `rate()` see the first failure (a counter born at 1 hides it).
LOOP_CALLS = ("collect", "collect_timeout", "collect_hung")
# Retries of a failing backend back off, but no further than this many intervals (and 5 min):
# a backend that is back (a DCGM restart, a driver reload) must be seen within a minute at the
# default 15 s, not after up to 5 min more of a red /health and no GPU series.
MAX_BACKOFF_INTERVALS = 4
MAX_BACKOFF_S = 300.0
STOP_WAIT_S = 2.0  # how long stop() waits for a collection in progress


class ErrorSource:
    """Anything besides the backend that counts failed calls (e.g. pod attribution)."""

    errors: Counter[str]


class CollectorLoop:
    def __init__(
        self,
        backend: Backend,
        *,
        interval_s: float = 15.0,
        timeout_s: float | None = None,
        stale_intervals: float = 3.0,
        idle_policy: IdlePolicy | None = None,
        dcgm_names: bool = False,
        extra_error_sources: tuple[ErrorSource, ...] = (),
        clock: Callable[[], float] = time.time,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("--collect.interval must be positive")
        self.backend = backend
        self.interval_s = interval_s
        self.timeout_s = timeout_s if timeout_s is not None else max(interval_s * 2, 10.0)
        self.stale_after_s = stale_intervals * interval_s
        self.dcgm_names = dcgm_names
        self.extra_error_sources = extra_error_sources
        self.clock = clock
        self.tracker = IdleTracker(idle_policy or IdlePolicy())
        self.errors: Counter[str] = Counter(dict.fromkeys(LOOP_CALLS, 0))
        self.skipped_lines: Counter[str] = Counter()  # unparseable lines of scraped pages
        self.collections = 0
        self.up = False
        self.last_error = "no collection yet"
        self.last_duration_s: float | None = None
        self.last_success_ts: float | None = None
        self._started_backend = False
        self._backoff_s = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._worker: threading.Thread | None = None
        self._last_collection: Collection | None = None
        self._last_gauges: list[NodeGauges] = []
        self._text_cache: TextCache = {}
        self._published = (self._render(), self.up, self.last_error, self.last_success_ts)

    # --- published state (read by the HTTP server) ---
    def current_page(self) -> Page:
        return self._published[0]

    def health(self) -> Health:
        """Judged on what was published with the current page, so /health and /metrics agree."""
        _page, up, last_error, last_success_ts = self._published
        if last_success_ts is None:
            return Health(False, f"no successful collection yet: {last_error}", None, None)
        age = self.clock() - last_success_ts
        if age > self.stale_after_s:
            return Health(
                False,
                f"last successful collection {age:.0f}s ago (> {self.stale_after_s:.0f}s): "
                f"{last_error}",
                last_success_ts,
                age,
            )
        if not up:
            return Health(False, last_error, last_success_ts, age)
        return Health(True, "ok", last_success_ts, age)

    def _publish(self) -> None:
        """Render, then swap page and health state in one reference assignment (atomic under
        the GIL): a reader never sees a new health state beside an old page."""
        self._published = (self._render(), self.up, self.last_error, self.last_success_ts)

    # --- the loop ---
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="collector", daemon=True)
        self._thread.start()

    def stop(self, wait_s: float = STOP_WAIT_S) -> None:
        """Stop collecting; a collection still running after `wait_s` is not waited for (a
        hung driver call would hold SIGTERM's shutdown for the whole timeout), and its
        backend is then not closed under it: the exiting process releases it."""
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=wait_s)
        worker = self._worker
        if (self._thread and self._thread.is_alive()) or (worker and worker.is_alive()):
            log.info(
                "a %s collection is still running at shutdown: not waited for", self.backend.name
            )
            return
        try:
            self.backend.close()
        except Exception as error:  # closing must never mask the reason we stop
            log.warning("closing backend %s: %s", self.backend.name, error)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.run_once()
            wait = max(self._backoff_s, self.interval_s - (time.monotonic() - started))
            self._stop.wait(wait)

    def run_once(self) -> None:
        """One cycle: collect (bounded by timeout), render, publish. Never raises."""
        if self._worker is not None and self._worker.is_alive():
            # The previous collect is still stuck in the backend; do not pile up threads.
            self._fail(
                "collect_hung", f"{self.backend.name} collection still running after timeout"
            )
            return
        result: dict[str, object] = {}
        started = time.monotonic()
        self._worker = threading.Thread(
            target=self._collect_into, args=(result,), name="collect", daemon=True
        )
        self._worker.start()
        self._worker.join(self.timeout_s)
        duration = time.monotonic() - started
        if self._worker.is_alive():
            self._fail(
                "collect_timeout", f"{self.backend.name} collection exceeded {self.timeout_s:.0f}s"
            )
            return
        self._worker = None
        error = result.get("error")
        if isinstance(error, BaseException):
            self._fail("collect", f"{self.backend.name}: {one_line(error)}")
            return
        collection = result["collection"]
        assert isinstance(collection, Collection)
        self.errors.update(collection.errors)
        self.skipped_lines.update(collection.skipped_lines)
        self.collections += 1
        self.up = True
        self.last_error = ""
        self._backoff_s = 0.0
        self.last_duration_s = duration
        self.last_success_ts = collection.timestamp
        self._last_collection = collection
        self._last_gauges = [
            node_gauges(node, self.tracker, collection.timestamp) for node in collection.nodes
        ]
        self.tracker.forget_except(
            {self.tracker.key(node.node, gpu) for node in collection.nodes for gpu in node.gpus}
        )
        self._publish()

    def _collect_into(self, result: dict[str, object]) -> None:
        try:
            if not self._started_backend:
                self.backend.start()
                self._started_backend = True
            result["collection"] = self.backend.collect()
        except BackendUnavailable as error:
            self._started_backend = False
            result["error"] = error
        except Exception as error:  # a backend bug must not kill the loop
            log.exception("backend %s raised", self.backend.name)
            result["error"] = error

    def _fail(self, call: str, message: str) -> None:
        if message != self.last_error:
            log.error("%s", message)
        self.errors[call] += 1
        self.collections += 1
        self.up = False
        self.last_error = message
        longest = max(self.interval_s, min(MAX_BACKOFF_INTERVALS * self.interval_s, MAX_BACKOFF_S))
        self._backoff_s = min(max(self._backoff_s * 2, self.interval_s), longest)
        # A short outage keeps the last good GPU series; once they are older than the
        # staleness limit they are dropped, so nobody graphs old numbers as current.
        if self.last_success_ts is None or self.clock() - self.last_success_ts > self.stale_after_s:
            self._last_collection, self._last_gauges = None, []
        self._publish()

    def _render(self) -> Page:
        errors = Counter(self.errors)
        for source in self.extra_error_sources:
            errors.update(source.errors)
        state = SelfState(
            version=__version__,
            backend=self.backend.name,
            up=self.up,
            last_duration_s=self.last_duration_s,
            last_success_ts=self.last_success_ts,
            collections=self.collections,
            errors=dict(errors),
            interval_s=self.interval_s,
            skipped_lines=dict(self.skipped_lines),
        )
        return render_page(
            self._last_collection,
            self._last_gauges,
            state,
            dcgm_names=self.dcgm_names,
            cache=self._text_cache,
        )
