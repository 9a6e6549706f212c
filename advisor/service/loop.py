"""The service's run loop: the pipeline run on an interval, in one thread, and its /metrics page.

`advisor.pipeline.Pipeline` does the work (ingest → analyse → forecast → plan, stale marking,
errors by stage); this loop runs it every `interval_s`, renders the /metrics page once per run
(HTTP handlers only copy bytes), publishes page and state together, and says whether the
results are fresh enough for `/health`.
"""

from __future__ import annotations

import gzip
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from advisor.history import History
from advisor.logs import RedactingFilter
from advisor.model import ClusterModel
from advisor.pipeline import Pipeline, RunState
from advisor.settings import TOP_ACTIONS, Settings
from gpu_defrag_common.exposition import Page
from gpu_defrag_common.server import Health

log = logging.getLogger("advisor.service")
# Every module of the service logs as "advisor.service": its records pass here, whatever
# handler (the CLI's stderr line, a test's capture) takes them.
log.addFilter(RedactingFilter())


@dataclass(frozen=True)
class Config:
    """How the service runs its pipeline: how often, when /health calls it stale, how many
    ranked actions /metrics lists; what the pipeline computes is `settings`."""

    interval_s: float = 60.0
    stale_intervals: float = 3.0
    top_actions: int = TOP_ACTIONS
    settings: Settings = field(default_factory=Settings)


class AdvisorLoop:
    """Runs the pipeline every `interval_s` and holds the latest `RunState` and /metrics page."""

    def __init__(
        self,
        source: str,
        ingest: Callable[[], ClusterModel],
        config: Config = Config(),
        history: History | None = None,
        clock: Callable[[], float] = time.time,
        render: Callable[[RunState, Config], bytes] | None = None,
        past: Callable[[], Sequence[ClusterModel]] = lambda: (),
    ) -> None:
        """`past` reads the source's past again (the start-up backfill) for a history that
        starts anew when the source's clock goes back (`_check_clock`)."""
        from advisor.service.metrics import render_page  # metrics imports this module's types

        self.config = config
        self.pipeline = Pipeline(
            source,
            config.settings,
            ingest=ingest,
            history=history,
            clock=clock,
            past=past,
            interval_s=config.interval_s,
        )
        self.clock = clock
        self._render = render or render_page
        self._lock = threading.Lock()
        self._state = self.pipeline.state()
        self._page = self._make_page(self._state)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def history(self) -> History:
        return self.pipeline.history

    # --- what the HTTP side reads (PageSource protocol + the API's view) ---
    def state(self) -> RunState:
        """The latest run's state, published together with its /metrics page."""
        with self._lock:
            return self._state

    def current_page(self) -> Page:
        with self._lock:
            return self._page

    def health(self) -> Health:
        """Ready when the last run succeeded and is not older than `stale_intervals` intervals."""
        state = self.state()
        if state.last_success_ts is None:
            reason = state.last_error or "no advisor run yet"
            return Health(False, f"no successful advisor run yet: {reason}", None, None)
        age = max(0.0, self.clock() - state.last_success_ts)
        limit = self.config.stale_intervals * self.config.interval_s
        if state.stale:
            return Health(
                False, f"serving stale results: {state.last_error}", state.last_success_ts, age
            )
        if age > limit:
            return Health(
                False,
                f"last successful run {age:.0f}s ago (> {limit:.0f}s)",
                state.last_success_ts,
                age,
            )
        return Health(True, "ok", state.last_success_ts, age)

    # --- running ---
    def seed_history(self, models: Sequence[ClusterModel]) -> None:
        self.pipeline.seed_history(models)

    def run_once(self) -> RunState:
        state = self.pipeline.run_once()
        page = self._make_page(state)
        with self._lock:
            self._state, self._page = state, page
        return state

    def _make_page(self, state: RunState) -> Page:
        body = self._render(state, self.config)
        return Page(body=body, gzipped=gzip.compress(body, compresslevel=1))

    def _loop(self) -> None:
        next_run = time.monotonic()
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception:  # never let the thread die; the next run tries again
                log.exception("advisor run failed")
            next_run += self.config.interval_s
            delay = next_run - time.monotonic()
            if delay < 0:  # a run longer than the interval: start the next one now, no backlog
                next_run, delay = time.monotonic(), 0.0
            self._stop.wait(delay)

    def start(self) -> AdvisorLoop:
        self._thread = threading.Thread(target=self._loop, name="advisor", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop after the run in progress, waiting at most `timeout_s` for it (the thread is a
        daemon: a process that exits does not wait for a long plan to finish; SIGTERM must end
        it in seconds)."""
        self._stop.set()
        close = getattr(
            self.pipeline.ingest, "close", None
        )  # a watching reader (k8s:) ends its watches
        if callable(close):
            close()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
