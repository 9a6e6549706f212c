"""The history at start-up: what the source already knows about the past.

The advisor keeps its history in memory, and the forecast needs hours of it (36 h for a 24-h
demand forecast with its backtest, 98–112 h for the idle windows). Without a backfill every
restart (a rollout, a drained node) would blank the forecasts for days. A `prometheus+` source
holds that past: the advisor reads the state at one instant an hour over the span, through the
same instant query and model builder as a live run, so a backfilled hour is the hour a live run
would have seen. A `sim:` source steps its simulated fleet through the span instead
(`LiveSim.backfill`). Exporter URLs have no past; the history then starts with the first run.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from advisor.ingest import prometheus
from advisor.ingest.exporter_scrape import SourceUnavailable
from advisor.ingest.sources import prometheus_spec
from advisor.model import ClusterModel, ModelError

log = logging.getLogger("advisor.service")

STEP_S = 3600.0  # one instant an hour: the forecast's grid
DEFAULT_SPAN_S = {"sim": 72 * 3600.0, "prometheus": 7 * 86400.0}


@dataclass
class Backfill:
    """The past models read (oldest first) and what could not be read."""

    source: str
    span_s: float
    models: list[ClusterModel] = field(default_factory=list)
    empty: int = 0  # instants at which the source held no GPU series
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
            line += f"; {self.empty} hour(s) without GPU series (before retention or a gap)"
        if self.failed:
            line += f"; {self.failed} hour(s) unreadable"
        if self.reason:
            line += f": {self.reason}"
        return line


def default_span_s(spec: str) -> float:
    """The span read when `--history.backfill` is not given: 72 h for a sim (stepping it costs
    time), 7 days from Prometheus (a week of hours for the backtests, one query an hour)."""
    if spec.strip().startswith("sim:"):
        return DEFAULT_SPAN_S["sim"]
    if spec.strip().startswith("prometheus+"):
        return DEFAULT_SPAN_S["prometheus"]
    return 0.0


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
    for k in range(math.ceil(span_s / STEP_S), 0, -1):
        if cancelled():
            result.reason = result.reason or "stopped"
            break
        at = end - k * STEP_S
        try:
            model = prometheus.load(target.base, at=at, history_s=0, client=client, source=spec)
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


def backfill(
    spec: str,
    ingest: Callable[[], ClusterModel],
    span_s: float,
    *,
    timeout: float = 10.0,
    cancelled: Callable[[], bool] = lambda: False,
) -> Backfill | None:
    """The source's past over `span_s`, or None where the source has none to read."""
    from advisor.service.loop import LiveSim

    if span_s <= 0:
        return None
    if isinstance(ingest, LiveSim):
        started = time.perf_counter()
        models = ingest.backfill(span_s, STEP_S)
        return Backfill(spec, span_s, models, seconds=time.perf_counter() - started)
    if spec.strip().startswith("prometheus+"):
        return from_prometheus(spec, span_s, timeout=timeout, cancelled=cancelled)
    return None
