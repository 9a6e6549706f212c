"""The history at start-up: what the source already knows about the past.

The advisor keeps its history in memory, and the forecast needs hours of it (36 h for a 24-h
demand forecast with its backtest, 98–112 h for the idle windows). Without a backfill every
restart (a rollout, a drained node) would blank the forecasts for days. A `prometheus+` source
holds that past: the advisor reads the state at one instant an hour over the span, through the
same instant query and model builder as a live run, so a backfilled hour is the hour a live run
would have seen. A `sim:` source steps its simulated fleet through the span instead
(`LiveSim.backfill`), and so does a sim exporter's URL: its page names the fleet and its clock
(`gpu_sim_*`), and a fleet depends only on those, so the same fleet re-simulated hour by hour is
the past the exporter went through. Other exporter URLs have no past; the history then starts
with the first run.

Every backfill asks `cancelled()` between instants (a sim steps at most a simulated hour between
asks), so a SIGTERM or Ctrl-C during a long one stops the start-up within a step. The span is at
most `MAX_SPAN_S` (`--history.backfill`'s bound).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from advisor.history import NODE_HOURS
from advisor.ingest import exporter_scrape as scrape
from advisor.ingest import prometheus
from advisor.ingest.combine import with_scheduler_labels
from advisor.ingest.exporter_scrape import SourceUnavailable
from advisor.ingest.live import LiveSim, step_fleet
from advisor.ingest.readings import from_readings
from advisor.ingest.schedulers import is_combined, split
from advisor.ingest.sources import SIM_LARGE_NODES, SourceError, prometheus_spec, sim_spec
from advisor.logs import redact
from advisor.model import ClusterModel, ModelError

log = logging.getLogger(__name__)

STEP_S = 3600.0  # one instant an hour: the forecast's grid
SIM_SPAN_S = 7 * 86400.0  # a `sim:` source: the week the app shows of the same spec
SIM_LARGE_SPAN_S = 72 * 3600.0  # above SIM_LARGE_NODES: a week of 1,000 nodes takes ~76 s
RECORDED_SPAN_S = 7 * 86400.0  # Prometheus or a sim exporter: a week of hours
# The longest past the service keeps: `NODE_HOURS` (16 days) per node, the idle windows'
# `IDLE_MAX_H`; the demand backtest looks back `MAX_ORIGINS` (14 days). An older hour would be
# read, then dropped.
MAX_SPAN_S = NODE_HOURS * STEP_S


@dataclass
class Backfill:
    """The past models read (oldest first) and what could not be read."""

    source: str
    span_s: float
    models: list[ClusterModel] = field(default_factory=list)
    empty: int = 0  # instants at which the source held no GPU series
    empty_why: str = "before retention or a gap"
    failed: int = 0  # instants whose series did not make a model
    reason: str = ""  # the first failure, or why the backfill stopped early
    seconds: float = 0.0

    def summary(self) -> str:
        """One log line."""
        line = (
            f"backfilled {len(self.models)} past hour(s) of {self.span_s / 3600:g} h "
            f"from {self.source} in {self.seconds:.1f} s"
        )
        if self.empty:
            line += f"; {self.empty} hour(s) without GPU series ({self.empty_why})"
        if self.failed:
            line += f"; {self.failed} hour(s) unreadable"
        if self.reason:
            line += f": {self.reason}"
        return redact(line)  # the spec and the errors may name a password


def default_span_s(spec: str) -> float:
    """The span read when `--history.backfill` is not given: 7 days (a week of hours for the
    backtests and the idle windows, as the app reads the same spec) from Prometheus, a sim
    exporter or a `sim:` source, but 72 h for a `sim:` fleet above `SIM_LARGE_NODES` nodes,
    where stepping a week would delay the first run by a minute or more."""
    spec = spec.strip()
    if is_combined(spec):  # a scheduler joined with a usage source: the usage side's past
        usage = split(spec)[1:]
        return default_span_s(usage[0]) if usage else 0.0
    if spec.startswith("sim:"):
        from gpu_defrag_sim.presets import build_preset

        try:
            preset, _, nodes, _ = sim_spec(spec)
        except SourceError:
            return SIM_SPAN_S  # the source itself is refused at start, with its reason
        count = len(build_preset(preset, nodes).nodes)  # the layout only: 20 ms, not a fleet
        return SIM_SPAN_S if count <= SIM_LARGE_NODES else SIM_LARGE_SPAN_S
    if spec.startswith(("prometheus+", "http://", "https://")):
        return RECORDED_SPAN_S
    return 0.0


def hours_before(end: float, span_s: float) -> list[float]:
    """The instants a backfill reads: one every `STEP_S` over the `span_s` before `end`
    (excluded, the live run's), oldest first."""
    return [end - k * STEP_S for k in range(math.ceil(span_s / STEP_S), 0, -1)]


def from_prometheus(
    spec: str,
    span_s: float,
    *,
    now: float | None = None,
    timeout: float = 10.0,
    client: prometheus.PrometheusClient | None = None,
    cancelled: Callable[[], bool] = lambda: False,
) -> Backfill:
    """The model at one instant an hour over the `span_s` before `now` (default: the spec's
    `at`, else the current time), oldest first.

    An instant without GPU series is skipped (the history masks that hour); one whose series do
    not make a model is skipped and counted; an unreachable or failing Prometheus stops the
    backfill with what was read so far, and the live runs report the source as down.
    """
    started = time.perf_counter()
    target = prometheus_spec(spec)
    client = client or prometheus.PrometheusClient(target.base, timeout)
    end = now if now is not None else target.at if target.at is not None else time.time()
    result = Backfill(spec, span_s)
    for at in hours_before(end, span_s):
        if cancelled():
            result.reason = result.reason or "stopped"
            break
        try:
            model = prometheus.load(
                target.base, at=at, history_s=0, client=client, source=spec, check_left_out=False
            )
        except prometheus.NoSeries:
            result.empty += 1
            continue
        except SourceUnavailable as error:
            result.reason = f"stopped: {error}"
            break
        except ModelError as error:
            result.failed += 1
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
            result.reason = result.reason or f"{when}: {error}"
            continue
        result.models.append(model)
    result.seconds = time.perf_counter() - started
    return result


def from_sim_exporter(
    spec: str,
    span_s: float,
    *,
    timeout: float = 10.0,
    cancelled: Callable[[], bool] = lambda: False,
) -> Backfill | None:
    """The past of the simulated fleet a sim exporter serves, re-simulated one instant an hour
    over `span_s` before its clock (never before the fleet's t = 0), stamped on its clock;
    None when `spec` is not a single exporter URL whose page (read now) carries a sim clock.
    Stops with what was read once `cancelled()`."""
    from gpu_defrag_sim import SimFleet

    urls = [url.strip() for url in spec.split(",") if url.strip()]
    if len(urls) != 1 or not urls[0].startswith(("http://", "https://")):
        return None
    started = time.perf_counter()
    try:
        clock = scrape.sim_clock(scrape.parse(scrape.fetch(urls[0], timeout), urls[0]))
    except SourceUnavailable:
        return None  # the live read says what is wrong with the source
    if clock is None:
        return None
    result = Backfill(spec, span_s, empty_why="before the simulated fleet's start")
    fleet = SimFleet(clock.preset, clock.seed, clock.nodes)
    for at in hours_before(clock.time_s, span_s):
        if at < 0:
            result.empty += 1
            continue
        if not step_fleet(fleet, at, cancelled):
            result.reason = "stopped"
            break
        readings = fleet.readings(lambda t: clock.epoch + t)
        result.models.append(from_readings(readings, timestamp=clock.epoch + at, source=spec))
    result.seconds = time.perf_counter() - started
    return result


def past(
    spec: str,
    span_s: float,
    *,
    timeout: float = 10.0,
    cancelled: Callable[[], bool] = lambda: False,
) -> Backfill | None:
    """What a `prometheus+` source or a sim exporter's URL knows of the `span_s` before now;
    None for a source without a past."""
    if span_s <= 0:
        return None
    if spec.strip().startswith("prometheus+"):
        return from_prometheus(spec, span_s, timeout=timeout, cancelled=cancelled)
    return from_sim_exporter(spec, span_s, timeout=timeout, cancelled=cancelled)


def backfill(
    spec: str,
    ingest: Callable[[], ClusterModel],
    span_s: float,
    *,
    timeout: float = 10.0,
    cancelled: Callable[[], bool] = lambda: False,
) -> Backfill | None:
    """The source's past over `span_s`, or None where the source has none to read; what was
    read so far once `cancelled()` (a SIGTERM during start-up)."""
    if span_s <= 0:
        return None
    if isinstance(ingest, LiveSim):
        started = time.perf_counter()
        models = ingest.backfill(span_s, STEP_S, cancelled)
        result = Backfill(spec, span_s, models, seconds=time.perf_counter() - started)
        result.reason = "stopped" if cancelled() else ""
        return result
    if is_combined(spec):
        return _scheduler_past(spec, ingest, span_s, timeout=timeout, cancelled=cancelled)
    return past(spec, span_s, timeout=timeout, cancelled=cancelled)


def _scheduler_past(
    spec: str,
    ingest: Callable[[], ClusterModel],
    span_s: float,
    *,
    timeout: float,
    cancelled: Callable[[], bool],
) -> Backfill | None:
    """A scheduler's past is not recorded, but its usage source's may be (Prometheus): those
    hours, each grouped by the pools and racks the scheduler names now
    (`combine.with_scheduler_labels`). None without a usage source that has a past."""
    usage = split(spec)[1:]
    if not usage:
        return None
    result = past(usage[0], span_s, timeout=timeout, cancelled=cancelled)
    if result is None or not result.models:
        return result
    view_of = getattr(ingest, "view", None)
    try:
        view = view_of() if callable(view_of) else None
    except Exception as error:  # the scheduler is down now: its first run will say so
        result.reason = result.reason or f"hours not grouped by the scheduler's pools: {error}"
        view = None
    if view is not None:
        result.models = [with_scheduler_labels(m, view) for m in result.models]
    result.source = spec
    return result
