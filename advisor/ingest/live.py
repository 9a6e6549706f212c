"""A source read again and again: the reader the pipeline calls at every run.

`make_ingest(spec)` gives a callable that returns the source's model now: `load_source` for
exporter URLs, Prometheus, snapshot and trace files; a `LiveSim` for `sim:` sources, whose fleet
advances by the wall time between reads (the service), or stays at its `t` (`frozen`, the app's
one instant of a simulated fleet, with the past before it as its history).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from advisor.ingest.slurm.spec import is_slurm
from advisor.ingest.sources import (
    load_source,
    prometheus_spec,
    seconds,
    sim_fleet,
    sim_model,
    slurm_spec,
)
from advisor.model import ClusterModel

if TYPE_CHECKING:
    from gpu_defrag_sim.fleet import SimFleet


class LiveSim:
    """A `sim:PRESET[?seed=&nodes=&t=]` source that keeps running: every read advances the
    simulated fleet by the wall time since the previous read, so the advisor watches jobs come
    and go instead of one frozen instant. `backfill()` first steps the fleet through a past
    span, which gives the forecast a history to learn from at start-up.

    `frozen`: every read is the fleet at `t`, and the backfill covers the span before `t` only
    (none at `t=0`): the app's view of one simulated instant with the past that led to it."""

    def __init__(
        self, spec: str, clock: Callable[[], float] = time.monotonic, frozen: bool = False
    ) -> None:
        self.spec = spec
        self.fleet, params = sim_fleet(
            spec,
            {"seed", "nodes", "t"},
            why="does not apply to the advisor service, whose simulated fleet runs live",
        )
        self.start_s = seconds(params.get("t", "0"), "t")
        self.clock = clock
        self.frozen = frozen
        self._last: float | None = None

    def backfill(
        self,
        span_s: float,
        step_s: float = 3600.0,
        cancelled: Callable[[], bool] = lambda: False,
    ) -> list[ClusterModel]:
        """Models every `step_s` over `span_s` of simulated time ending at the start time `t`
        (beginning at 0 when `t` is shorter than the span; the live run then starts where the
        backfill ended, and a frozen one stops before `t`). Stops with the models so far once
        `cancelled()` (checked at least every simulated hour)."""
        models: list[ClusterModel] = []
        begin = max(0.0, self.start_s - span_s)
        end = self.start_s if self.frozen else begin + span_s
        for at in np.arange(begin, end, step_s):
            if not step_fleet(self.fleet, float(at), cancelled):
                break
            models.append(sim_model(self.fleet, self.spec))
        return models

    def __call__(self) -> ClusterModel:
        now = self.clock()
        if self._last is None or self.frozen:
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


def make_ingest(spec: str, timeout_s: float, frozen: bool = False) -> Callable[[], ClusterModel]:
    """The source's reader: a live simulation for `sim:` (frozen at its `t` with `frozen`), else
    `load_source` on every run. SourceError at once for a spec no run could ever read (checked
    by `check_form`)."""
    if spec.strip().startswith("sim:"):
        return LiveSim(spec.strip(), frozen=frozen)
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
