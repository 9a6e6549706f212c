"""The advisor's run loop: ingest → analyse → forecast → plan, on an interval, in one thread.

Each stage is timed and its failures counted by stage. A failed ingest (or analysis) keeps the
last good results and marks them stale, with the source's one-line error, so dashboards keep
their last picture and say how old it is; a failed forecast or plan keeps the previous run's
section, marked stale, beside fresh fragmentation numbers. The /metrics page is rendered once
per run (HTTP handlers only copy bytes), and page, results and health are published together.

The history also learns which jobs finished between runs and how long they ran; the plan stage
predicts the running jobs' ends from them (`advisor.forecast.job_ends`) for the reservations.
"""

from __future__ import annotations

import gzip
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from advisor.forecast.job_ends import JobEndSettings
from advisor.forecast.live import MAX_TENANTS, forecast_pools, tenant_section
from advisor.forecast.live_idle import IDLE_MAX_NODES, IDLE_RISK, IDLE_WINDOWS_H
from advisor.fragmentation import measures
from advisor.history import History
from advisor.ingest.slurm.spec import is_slurm
from advisor.ingest.sources import (
    SourceError,
    load_source,
    prometheus_spec,
    seconds,
    sim_fleet,
    sim_model,
    slurm_spec,
)
from advisor.logs import RedactingFilter, redact
from advisor.model import ClusterModel
from advisor.planner.constraints import Policy
from advisor.planner.policy_merge import merged_policy
from advisor.planner.timing import with_windows
from advisor.service import results as R
from advisor.service.plans import recommend_service
from advisor.service.scheduler import section as scheduler_section
from advisor.service.scheduler import with_blocked_plan
from gpu_defrag_common.exposition import Page
from gpu_defrag_common.messages import one_line
from gpu_defrag_common.server import Health
from gpu_defrag_common.units import duration_text

if TYPE_CHECKING:
    from gpu_defrag_sim.fleet import SimFleet

log = logging.getLogger("advisor.service")

STAGES = R.STAGES


# --------------------------------------------------------------------------- sources

# Every module of the service logs as "advisor.service": its records pass here, whatever
# handler (the CLI's stderr line, a test's capture) takes them. The readers it calls log as
# their own modules (`advisor.ingest.*`, naming the URL they read): `install_log_filters` puts
# the same filter on the handlers of the service process, which every record passes.
log.addFilter(RedactingFilter())


def _shown_source(model: ClusterModel) -> ClusterModel:
    """The model with its source as `redact` shows it (the API serves the model's source):
    `load_source` already shows it so, but the loop serves whatever its reader returns."""
    source = redact(model.source)
    return model if source == model.source else replace(model, source=source, _cache={})


class LiveSim:
    """A `sim:PRESET[?seed=&nodes=&t=]` source that keeps running: every read advances the
    simulated fleet by the wall time since the previous read, so the advisor watches jobs come
    and go instead of one frozen instant. `backfill()` first steps the fleet through a past
    span, which gives the forecast a history to learn from at start-up."""

    def __init__(self, spec: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.spec = spec
        self.fleet, params = sim_fleet(
            spec,
            {"seed", "nodes", "t"},
            why="does not apply to the advisor service, whose simulated fleet runs live",
        )
        self.start_s = seconds(params.get("t", "0"), "t")
        self.clock = clock
        self._last: float | None = None

    def backfill(
        self,
        span_s: float,
        step_s: float = 3600.0,
        cancelled: Callable[[], bool] = lambda: False,
    ) -> list[ClusterModel]:
        """Models every `step_s` over `span_s` of simulated time ending at the start time `t`
        (beginning at 0 when `t` is shorter than the span; the live run then starts where the
        backfill ended). Stops with the models so far once `cancelled()` (checked at least
        every simulated hour)."""
        models: list[ClusterModel] = []
        begin = max(0.0, self.start_s - span_s)
        for at in np.arange(begin, begin + span_s, step_s):
            if not step_fleet(self.fleet, float(at), cancelled):
                break
            models.append(sim_model(self.fleet, self.spec))
        return models

    def __call__(self) -> ClusterModel:
        now = self.clock()
        if self._last is None:
            self.fleet.advance(max(0.0, self.start_s - self.fleet.now))
        else:
            self.fleet.advance(max(0.0, now - self._last))
        self._last = now
        return sim_model(self.fleet, self.spec)


def step_fleet(fleet: SimFleet, to_s: float, cancelled: Callable[[], bool]) -> bool:
    """Advance a `SimFleet` to simulated time `to_s` an hour at a time (~1 s for 10,000 nodes),
    asking `cancelled()` before each: False, with the fleet where it got to, once it says stop,
    so a SIGTERM during a long backfill ends it within a step."""
    while True:
        if cancelled():
            return False
        if fleet.now >= to_s:
            return True
        fleet.advance(min(to_s, fleet.now + 3600.0) - fleet.now)


def make_ingest(spec: str, timeout_s: float) -> Callable[[], ClusterModel]:
    """The source's reader: a live simulation for `sim:`, else `load_source` on every run.
    SourceError at once for a spec no run could ever read (checked by `check_form`)."""
    if spec.strip().startswith("sim:"):
        return LiveSim(spec.strip())
    from advisor.ingest import schedulers

    if schedulers.is_combined(spec):  # a scheduler (watched) joined with usage sources
        from advisor.ingest.combined_reader import CombinedReader

        return CombinedReader(spec, timeout_s)
    check_form(spec)
    return lambda: load_source(spec, timeout=timeout_s)


def check_form(spec: str) -> None:
    """SourceError when `spec` is no source form (a typo such as `promethues+http://`) or has
    bad options: the service would serve 503 forever. A well-formed source that is down now
    passes: it may come up later, and the loop keeps trying."""
    spec = spec.strip()
    if spec.startswith(("prometheus+http://", "prometheus+https://")):
        prometheus_spec(spec)
    elif is_slurm(spec):  # a controller that is down now may answer later
        slurm_spec(spec)
    elif not spec.startswith(("http://", "https://", "openb:")) and not spec.endswith(".json"):
        load_source(spec)  # a file that exists loads; anything else is load_source's form error


# A reading this much older than the history's last one (and more than two intervals) is a new
# timeline, not a clock's jitter: the history starts again.
CLOCK_RESET_S = 300.0


def _utc(stamp: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(stamp))


# --------------------------------------------------------------------------- state


@dataclass(frozen=True)
class RunState:
    """Everything /metrics and the API serve, published atomically after every run."""

    source: str  # as `redact` shows it
    results: R.Results | None = None
    stale: bool = True
    source_up: bool = False
    source_error: str = ""
    last_error: str = ""  # the latest failure of any stage, "" after a clean run
    last_success_ts: float | None = None
    last_duration_s: float | None = None
    stage_seconds: dict[str, float] = field(default_factory=dict)
    runs: int = 0
    errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STAGES, 0))


@dataclass(frozen=True)
class Config:
    interval_s: float = 60.0
    policy: Policy = field(default_factory=Policy)
    settings: measures.Settings = field(default_factory=measures.Settings)
    top_actions: int = 10
    horizons_h: tuple[int, ...] = (1, 6, 24)
    stale_intervals: float = 3.0
    job_ends: JobEndSettings = field(default_factory=JobEndSettings)
    idle_max_nodes: int = IDLE_MAX_NODES  # nodes whose idle windows are computed each hour
    idle_windows_h: tuple[int, ...] = IDLE_WINDOWS_H  # idle windows W, whole hours
    idle_risk: float = IDLE_RISK  # the idle windows' violation budget
    max_tenants: int = MAX_TENANTS  # tenants whose demand is forecast each hour


def analyze_model(
    model: ClusterModel, settings: measures.Settings, observed_at: float
) -> R.Results:
    """Pure: the fragmentation part of a run's results."""
    analysis = measures.analyze(model, settings)
    idle = measures.allocated_idle(model, settings.idle)
    return R.Results(
        model=model,
        observed_at=observed_at,
        finished_at=observed_at,
        analysis=analysis,
        shapes=R.shape_table(analysis, settings.shapes),
        pools=R.pool_table(model, analysis, idle),
        pool_shapes=R.pool_shape_table(model, settings.shapes),
        gpu_models=R.type_table(model, idle),
        gpu_states=measures.gpu_state_codes(model, idle),
    )


class AdvisorLoop:
    """Runs the stages every `interval_s` and holds the latest `RunState` and /metrics page."""

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

        self.past = past
        self._behind = False  # readings older than the history's last, said once
        self.ingest = ingest
        self.config = config
        self.history = history if history is not None else History()
        self.clock = clock
        self._render = render or render_page
        self._lock = threading.Lock()
        self._state = RunState(source=redact(source))
        self._page = self._make_page(self._state)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._forecast_cache: tuple[Any, dict[str, Any]] | None = None
        self._unmatched: set[str] = set()  # --shapes models no GPU matched, each said once

    # --- what the HTTP side reads (PageSource protocol + the API's view) ---
    def state(self) -> RunState:
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
        """Past observations (e.g. a simulated backfill) go into the history, not the results;
        jobs seen to finish among them already count for the planner's job ends."""
        for model in models:
            if not math.isnan(model.timestamp):
                self.history.append(model)

    def run_once(self) -> RunState:
        started = time.perf_counter()
        previous = self.state()
        timings: dict[str, float] = {}
        errors = dict(previous.errors)
        failures: list[str] = []

        def fail(stage: str, error: BaseException) -> str:
            message = redact(one_line(error))
            errors[stage] = errors.get(stage, 0) + 1
            failures.append(f"{stage}: {message}")
            return message

        results: R.Results | None = None
        source_up, source_error = True, ""
        t0 = time.perf_counter()
        try:
            model = _shown_source(self.ingest())
        except Exception as error:  # any reader failure is the source being down
            source_up, source_error = False, fail("ingest", error)
            if not isinstance(error, (SourceError, OSError, ValueError)):
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
                results = analyze_model(model, self.config.settings, observed_at)
                policy = merged_policy(self.config.policy, model)
                results = replace(
                    results,
                    scheduler=scheduler_section(
                        model, results.analysis, self.config.settings.shapes, policy
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
                forecast = self._forecast()
            except Exception as error:
                log.exception("forecast failed")
                message = fail("forecast", error)
                forecast = {**(old.forecast if old else {}), "stale": True, "error": message}
            timings["forecast"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            scheduler = results.scheduler
            policy = merged_policy(self.config.policy, results.model)
            try:
                recs = recommend_service(
                    results.model,
                    self.config.settings.shapes,
                    results.shapes,
                    policy,
                    self.history.finished_jobs(),
                    self.config.job_ends,
                    self.history.jobs.running(results.model.timestamp),
                )
                # each plan's window: now, or the forecast's low-demand hour (planner.timing)
                recs = {**with_windows(recs, forecast, results.model), "stale": False, "error": ""}
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
                finished_at=self.clock(),
            )

        ok = results is not None
        duration = time.perf_counter() - started
        state = RunState(
            source=previous.source,
            results=results if ok else previous.results,
            stale=not ok,
            source_up=source_up,
            source_error=source_error,
            last_error="; ".join(failures),
            last_success_ts=self.clock() if ok else previous.last_success_ts,
            last_duration_s=duration,
            stage_seconds=timings,
            runs=previous.runs + 1,
            errors=errors,
        )
        page = self._make_page(state)
        with self._lock:
            self._state, self._page = state, page
        if ok and previous.stale and previous.runs:
            log.info("source %s is back; results are fresh again", previous.source)
        log.debug("run %d took %.3fs (%s)", state.runs, duration, timings)
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
        if behind <= max(CLOCK_RESET_S, 2 * self.config.interval_s):
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
            history.append(model)
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
        for shape in self.config.settings.shapes:
            try:
                measures.check_models(model, shape)
            except ValueError as error:
                if shape.name not in self._unmatched:
                    self._unmatched.add(shape.name)
                    log.warning("--shapes: %s; its jobs count 0 until such GPUs appear", error)
            else:
                self._unmatched.discard(shape.name)

    def _forecast(self) -> dict[str, Any]:
        """The forecast (demand and idle windows per pool and per node), recomputed only when
        the latest run is in a later hour than at the last computation, i.e. when another hour
        has completed. Between those, nothing is built: runs added or dropped from the history's
        start within the hour do not change what is served (the hour still running is never
        used). The per-node idle windows come from the history's per-node hours
        (`History.node_hours()`), at most `Config.idle_max_nodes` nodes; the windows and risk are
        `Config.idle_windows_h` and `Config.idle_risk`."""
        latest = self.history.latest_timestamp()
        hour = None if latest is None else math.floor(latest / 3600.0)
        if self._forecast_cache is None or self._forecast_cache[0] != hour:
            doc = forecast_pools(
                self.history.pool_demand(),
                self.config.horizons_h,
                windows_h=self.config.idle_windows_h,
                risk=self.config.idle_risk,
                nodes=self.history.node_hours(),
                max_nodes=self.config.idle_max_nodes,
            )
            tenants = self.history.tenant_demand() if self.config.max_tenants else None
            quotas = {t: q for (t, model), q in self.config.policy.quotas.items() if not model}
            doc["tenants"] = tenant_section(
                tenants, self.config.horizons_h, self.config.max_tenants, quotas
            )
            self._forecast_cache = (hour, {**doc, "stale": False, "error": ""})
        return self._forecast_cache[1]

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

    def stop(self, wait_s: float = 2.0) -> None:
        """Stop running; a run still in progress after `wait_s` (a long plan) is not waited
        for: it holds nothing that outlives the process, and SIGTERM must end it in seconds."""
        self._stop.set()
        close = getattr(self.ingest, "close", None)  # a watching reader (k8s:) ends its watches
        if callable(close):
            close()
        if self._thread is not None:
            self._thread.join(timeout=wait_s)


def describe(state: RunState) -> dict[str, Any]:
    """The freshness block every API answer carries."""
    results = state.results
    return {
        "source": state.source,
        "stale": state.stale or results is None,
        "source_up": state.source_up,
        "source_error": state.source_error or None,
        "last_error": state.last_error or None,
        "observed_at": results.observed_at if results else None,
        "last_success_timestamp": state.last_success_ts,
        "runs": state.runs,
        # the GPU exporters the served fleet lacks (down when it was read)
        "source_left_out": list(results.model.left_out) if results else [],
    }
