"""The pipeline object: one source read into one history, run stage by stage, results published.

`Pipeline(source, settings)` reads the source (`advisor.ingest.live.make_ingest`), keeps the
history the forecasts and the job-end learning read, and on `run_once()` runs ingest → analyze
→ forecast → plan and publishes a `RunState` atomically. The service (`gpu-defrag advise`) runs
it on an interval and serves it; the app runs it in-process on a source when no advisor URL is
given. Both read the same documents from it (`advisor.documents`).

The analyse stage also measures what a scheduler source says (the queue, unknown racks, why
shapes cannot start: `advisor.pipeline.scheduler`), and the plan stage plans for the biggest
blocked job, both on the policy merged with the scheduler's quotas. A reading older than the
history's last is noticed (`_check_clock`): a long step back starts the history anew.

Each stage is timed and its failures counted by stage. A failed ingest (or analysis) keeps the
last good results and marks them stale, with the source's one-line error; a failed forecast or
plan keeps the previous run's section, marked stale, beside fresh fragmentation numbers. The
forecast is recomputed only when another hour has completed; the trend and the hourly demand
behind it are published with every run.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pandas as pd

from advisor import documents
from advisor.fragmentation import measures
from advisor.history import History
from advisor.ingest.backfill import Backfill, backfill, default_span_s
from advisor.ingest.live import make_ingest
from advisor.ingest.sources import SourceError
from advisor.logs import RedactingFilter, redact
from advisor.model import ClusterModel
from advisor.pipeline import stages
from advisor.pipeline.scheduler import section as scheduler_section
from advisor.pipeline.scheduler import with_blocked_plan
from advisor.planner.policy_merge import merged_policy
from advisor.results import STAGES, Results
from advisor.settings import Settings
from gpu_defrag_common.messages import one_line
from gpu_defrag_common.units import duration_text

log = logging.getLogger("advisor.pipeline")
# The readers it calls log as their own modules (`advisor.ingest.*`, naming the URL they read):
# the processes put the same filter on their handlers (`advisor.logs.install_log_filters`).
log.addFilter(RedactingFilter())


# A reading this much older than the history's last one (and more than two intervals) is a new
# timeline, not a clock's jitter: the history starts again.
CLOCK_RESET_S = 300.0


def _utc(stamp: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(stamp))


def _shown_source(model: ClusterModel) -> ClusterModel:
    """The model with its source as `redact` shows it (the API serves the model's source):
    `load_source` already shows it so, but the pipeline serves whatever its reader returns."""
    source = redact(model.source)
    return model if source == model.source else replace(model, source=source, _cache={})


@dataclass(frozen=True)
class RunState:
    """Everything the pipeline publishes after a run: what /metrics, the API and the app read."""

    source: str  # as `redact` shows it
    results: Results | None = None
    stale: bool = True
    source_up: bool = False
    source_error: str = ""
    last_error: str = ""  # the latest failure of any stage, "" after a clean run
    last_success_ts: float | None = None
    last_duration_s: float | None = None
    stage_seconds: dict[str, float] = field(default_factory=dict)
    runs: int = 0
    errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STAGES, 0))


class Pipeline:
    """ingest → model → measures → forecasts → plans for one source, with one `Settings`.

    `ingest` replaces the source's reader (tests script one); `history` the history (the app's
    keeps its recent runs at full resolution); `frozen` keeps a `sim:` fleet at its `t`;
    `past` reads the source's past again (the start-up backfill) for a history that starts
    anew when the source's clock goes back (`_check_clock`); `interval_s` is how often it runs
    (a step back within two intervals is jitter)."""

    def __init__(
        self,
        source: str,
        settings: Settings | None = None,
        *,
        ingest: Callable[[], ClusterModel] | None = None,
        history: History | None = None,
        clock: Callable[[], float] = time.time,
        timeout_s: float = 10.0,
        frozen: bool = False,
        past: Callable[[], Sequence[ClusterModel]] = lambda: (),
        interval_s: float = 0.0,
    ) -> None:
        self.past = past
        self.interval_s = interval_s
        self._behind = False  # readings older than the history's last, said once
        self.source = source
        self.settings = settings or Settings()
        self.timeout_s = timeout_s
        self.ingest = ingest or make_ingest(source, timeout_s, frozen)
        self.history = history if history is not None else History(self.settings.history_max_points)
        self.clock = clock
        self._lock = threading.Lock()
        self._state = RunState(source=redact(source))
        self._forecast_cache: tuple[int | None, dict[str, Any], pd.DataFrame] | None = None
        self._unmatched: set[str] = set()  # shapes whose GPU model no GPU matched, said once

    def state(self) -> RunState:
        with self._lock:
            return self._state

    # --- the past ---
    def backfill(self, cancelled: Callable[[], bool] = lambda: False) -> Backfill | None:
        """The source's past (`settings.backfill_s`, else the source's default span) read into
        the history; None where the source has none. Stops within a step once `cancelled()`."""
        span = self.settings.backfill_s
        span = default_span_s(self.source) if span is None else span
        past = backfill(self.source, self.ingest, span, timeout=self.timeout_s, cancelled=cancelled)
        if past is not None:
            self.seed_history(past.models)
        return past

    def seed_history(self, models: Sequence[ClusterModel]) -> None:
        """Past observations (e.g. a simulated backfill) go into the history, not the results;
        jobs seen to finish among them already count for the planner's job ends."""
        for model in models:
            if not math.isnan(model.timestamp):  # measured as the runs are: the same shapes
                self.history.append(model, measures.analyze(model, self.settings.measures))

    # --- one run ---
    def run_once(self) -> RunState:
        started = time.perf_counter()
        previous = self.state()
        timings: dict[str, float] = {}
        errors = dict(previous.errors)
        failures: list[str] = []

        def fail(stage: str, error: BaseException, typed: bool = False) -> str:
            message = redact(one_line(error, typed=typed))
            errors[stage] = errors.get(stage, 0) + 1
            failures.append(f"{stage}: {message}")
            return message

        results: Results | None = None
        source_up, source_error = True, ""
        t0 = time.perf_counter()
        try:
            model = _shown_source(self.ingest())
        except Exception as error:  # any reader failure is the source being down
            expected = isinstance(error, (SourceError, OSError, ValueError))
            source_up, source_error = False, fail("ingest", error, typed=not expected)
            if not expected:  # a reader's bug, not the source being down: its type too
                log.exception("ingest from %s failed unexpectedly", previous.source)
            log.warning(
                "source %s failed: %s; %s",
                previous.source,
                source_error,
                "serving the last good results" if previous.results else "no results yet",
            )
            model = None
        timings["ingest"] = time.perf_counter() - t0

        if model is not None:
            self._check_clock(model.timestamp, previous.source)
            t0 = time.perf_counter()
            try:
                observed_at = model.timestamp if not math.isnan(model.timestamp) else self.clock()
                model = self.history.with_usage(model)
                results = stages.analyze_model(model, self.settings.measures, observed_at)
                policy = merged_policy(self.settings.policy, model)
                results = replace(
                    results,
                    scheduler=scheduler_section(
                        model, results.analysis, self.settings.shapes, policy
                    ),
                )
                self._say_unmatched_shapes(model)
                if not math.isnan(model.timestamp):
                    self.history.append(model, results.analysis)
            except Exception as error:
                log.exception("analysis of %s failed", previous.source)
                fail("analyze", error)
                results = None
            timings["analyze"] = time.perf_counter() - t0

        if results is not None:
            old = previous.results
            t0 = time.perf_counter()
            try:
                forecast, demand = self._forecast()
            except Exception as error:
                log.exception("forecast failed")
                message = fail("forecast", error)
                forecast = {**(old.forecast if old else {}), "stale": True, "error": message}
                demand = old.demand if old else None
            timings["forecast"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            scheduler = results.scheduler
            policy = merged_policy(self.settings.policy, results.model)
            try:
                recs = stages.plans(
                    results.model,
                    replace(self.settings, policy=policy),
                    results.shapes,
                    self.history.finished_jobs(),
                    self.history.jobs.running(results.model.timestamp),
                    forecast,
                )
                recs = {**recs, "stale": False, "error": ""}
                documents.check(documents.Recommendations, documents.recommendations_section(recs))
            except Exception as error:
                log.exception("planning failed")
                message = fail("plan", error)
                recs = {**(old.recommendations if old else {}), "stale": True, "error": message}
            try:
                scheduler = with_blocked_plan(scheduler, results.model, policy)
            except Exception as error:  # the queue's plan failing never costs the others
                log.exception("planning for the biggest blocked job failed")
                scheduler = {**scheduler, "blocked_plan_error": one_line(error)}
            timings["plan"] = time.perf_counter() - t0
            results = replace(
                results,
                forecast=forecast,
                recommendations=recs,
                scheduler=scheduler,
                trend=self.history.trend(),
                demand=demand,
                finished_at=self.clock(),
            )

        ok = results is not None
        state = RunState(
            source=previous.source,
            results=results if ok else previous.results,
            stale=not ok,
            source_up=source_up,
            source_error=source_error,
            last_error="; ".join(failures),
            last_success_ts=self.clock() if ok else previous.last_success_ts,
            last_duration_s=time.perf_counter() - started,
            stage_seconds=timings,
            runs=previous.runs + 1,
            errors=errors,
        )
        with self._lock:
            self._state = state
        if ok and previous.stale and previous.runs:
            log.info("source %s is back; results are fresh again", previous.source)
        log.debug("run %d took %.3fs (%s)", state.runs, state.last_duration_s, timings)
        return state

    def _check_clock(self, stamp: float, source: str) -> None:
        """A reading older than the history's last was skipped without a word: a sim exporter
        restarted at speed 60 went back days of simulated time, and the history stood still
        until its new clock caught up. A step back of at most `CLOCK_RESET_S` (or two
        intervals) is said once and its readings are not recorded until the clock passes the
        last one; a longer one is a new timeline: the history starts again from the source's
        past (`self.past`, the start-up backfill), with one warning."""
        latest = self.history.latest_timestamp()
        if latest is None or math.isnan(stamp) or stamp >= latest:
            self._behind = False
            return
        behind = latest - stamp
        shown = f"{duration_text(behind)} older than the last one ({_utc(latest)})"
        if behind <= max(CLOCK_RESET_S, 2 * self.interval_s):
            if not self._behind:
                log.warning(
                    "source %s: a reading at %s is %s; the history records none until the "
                    "source's clock passes it",
                    source,
                    _utc(stamp),
                    shown,
                )
            self._behind = True
            return
        history = self.history.fresh()
        past = [m for m in self.past() if not math.isnan(m.timestamp) and m.timestamp < stamp]
        for model in past:
            history.append(model, measures.analyze(model, self.settings.measures))
        log.warning(
            "source %s: its clock went back: a reading at %s is %s (a restarted sim exporter, "
            "or a clock set back); the history starts again with %d past hour(s) read from it",
            source,
            _utc(stamp),
            shown,
            len(past),
        )
        self.history, self._forecast_cache, self._behind = history, None, False

    def _say_unmatched_shapes(self, model: ClusterModel) -> None:
        """Warn once per shape whose GPU model no GPU of the fleet matches (`--shapes
        8@B200`): its count is 0 by a typo, not by fragmentation, until such GPUs appear."""
        for shape in self.settings.shapes:
            try:
                measures.check_models(model, shape)
            except ValueError as error:
                if shape.name not in self._unmatched:
                    self._unmatched.add(shape.name)
                    log.warning("--shapes: %s; its jobs count 0 until such GPUs appear", error)
            else:
                self._unmatched.discard(shape.name)

    def _forecast(self) -> tuple[dict[str, Any], pd.DataFrame]:
        """The forecast document (demand and idle windows per pool and per node, demand per
        tenant) and the hourly demand it learned from, recomputed only when the latest run is
        in a later hour than at the last computation, i.e. when another hour has completed.
        Between those, nothing is built: runs added or dropped from the history's start within
        the hour do not change what is served (the hour still running is never used)."""
        hour = stages.forecast_hour(self.history)
        if self._forecast_cache is None or self._forecast_cache[0] != hour:
            doc = {**stages.forecast(self.history, self.settings), "stale": False, "error": ""}
            documents.check(documents.Forecast, documents.forecast_section(doc))
            self._forecast_cache = (hour, doc, stages.hourly_demand(self.history))
        return self._forecast_cache[1], self._forecast_cache[2]
