"""The `sim` backend: one exporter serving a whole simulated cluster (one NodeReading per node).

Simulated time runs `--sim.speed` simulated seconds per real second from the first collection,
starting at `--sim.start` (default 0: the fleet's first instant), so `--sim.speed 60` shows a
simulated day in 24 real minutes. Event timestamps (XIDs) are mapped back onto the real clock at
that speed, so they never lie in the future. Each page also says which fleet it is and where its
clock stands (`gpu_sim_info`, `gpu_sim_time_seconds`, `gpu_sim_epoch_timestamp_seconds`): a
reading at simulated time t is stamped epoch + t, so a reader (the advisor, the app) keeps its
history on the simulated clock and can re-simulate the fleet's past up to the start.

The flags are bounded by `gpu_defrag_sim.bounds`, which a `sim:` source shares.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from exporter.backends.base import Backend
from exporter.readings import Collection, SimClock
from gpu_defrag_common.units import duration_text
from gpu_defrag_sim import PRESETS, SimFleet
from gpu_defrag_sim.bounds import (
    MAX_NODES,
    MAX_SPEED,
    MAX_START_S,
    nodes_flag,
    seed_flag,
    speed_flag,
    start_flag,
)


class SimBackend(Backend):
    """Collects from a `SimFleet`, advancing it by the real time elapsed × speed."""

    name = "sim"

    def __init__(
        self,
        preset: str = "a100-16x8",
        seed: int = 42,
        speed: float = 1.0,
        nodes: int | None = None,
        clock: Callable[[], float] = time.time,
        start_s: float = 0.0,
    ):
        if speed <= 0:
            raise ValueError(f"--sim.speed must be positive, got {speed}")
        if start_s < 0:
            raise ValueError(f"--sim.start must not be negative, got {start_s}")
        self.fleet = SimFleet(preset, seed, nodes)
        self.preset, self.seed, self.nodes = preset, seed, nodes
        self.speed = speed
        self.start_s = start_s
        self._clock = clock
        self._started: float | None = None

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("sim backend")
        group.add_argument(
            "--sim.preset",
            dest="sim_preset",
            choices=PRESETS,
            default="a100-16x8",
            help="simulated fleet layout (default: %(default)s)",
        )
        group.add_argument(
            "--sim.seed",
            dest="sim_seed",
            type=seed_flag,
            default=42,
            help="RNG seed, a whole number >= 0 (default: 42)",
        )
        group.add_argument(
            "--sim.speed",
            dest="sim_speed",
            type=speed_flag,
            default=1.0,
            help=f"simulated seconds per real second, > 0 and at most {MAX_SPEED:g} (an hour a "
            "second: each collection steps speed x interval simulated seconds and must end "
            "within its timeout) (default: 1; the demo uses 60)",
        )
        group.add_argument(
            "--sim.nodes",
            dest="sim_nodes",
            type=nodes_flag,
            default=None,
            help="override the preset's node count, keeping its shape (e.g. 1000 for the bench); "
            f"1 to {MAX_NODES:,} (the largest fleet builds in ~20 s)",
        )
        group.add_argument(
            "--sim.start",
            dest="sim_start",
            type=start_flag,
            default=0.0,
            help="simulated time the fleet starts at, e.g. 7d: it has that much past, which "
            "the advisor and the app re-simulate into their history; at most "
            f"{duration_text(MAX_START_S)}, twice the past the advisor keeps (default: 0)",
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SimBackend:
        return cls(
            preset=getattr(args, "sim_preset", "a100-16x8"),
            seed=getattr(args, "sim_seed", 42),
            speed=getattr(args, "sim_speed", 1.0),
            nodes=getattr(args, "sim_nodes", None),
            start_s=getattr(args, "sim_start", 0.0),
        )

    def start(self) -> None:
        if self._started is None:
            self._started = self._clock()

    def collect(self) -> Collection:
        now = self._clock()
        if self._started is None:
            self._started = now
        target = self.start_s + (now - self._started) * self.speed
        if target > self.fleet.now:
            self.fleet.advance(target - self.fleet.now)
        started, start_s = self._started, self.start_s
        nodes = self.fleet.readings(lambda sim_t: started + (sim_t - start_s) / self.speed)
        clock = SimClock(self.preset, self.seed, self.nodes, self.fleet.now, started - start_s)
        return Collection(nodes=nodes, timestamp=now, sim=clock)
