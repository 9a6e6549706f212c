"""The `sim` backend: one exporter serving a whole simulated cluster (one NodeReading per node).

Simulated time runs `--sim.speed` simulated seconds per real second from the first collection,
so `--sim.speed 60` shows a simulated day in 24 real minutes. Event timestamps (XIDs) are
mapped back onto the real clock at that speed, so they never lie in the future.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from exporter.backends.base import Backend
from exporter.readings import Collection
from exporter.sim import PRESETS, SimFleet


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
    ):
        if speed <= 0:
            raise ValueError(f"--sim.speed must be positive, got {speed}")
        self.fleet = SimFleet(preset, seed, nodes)
        self.speed = speed
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
            "--sim.seed", dest="sim_seed", type=int, default=42, help="RNG seed (default: 42)"
        )
        group.add_argument(
            "--sim.speed",
            dest="sim_speed",
            type=float,
            default=1.0,
            help="simulated seconds per real second (default: 1; the demo uses 60)",
        )
        group.add_argument(
            "--sim.nodes",
            dest="sim_nodes",
            type=int,
            default=None,
            help="override the preset's node count, keeping its shape (e.g. 1000 for the bench)",
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SimBackend:
        return cls(
            preset=getattr(args, "sim_preset", "a100-16x8"),
            seed=getattr(args, "sim_seed", 42),
            speed=getattr(args, "sim_speed", 1.0),
            nodes=getattr(args, "sim_nodes", None),
        )

    def start(self) -> None:
        if self._started is None:
            self._started = self._clock()

    def collect(self) -> Collection:
        now = self._clock()
        if self._started is None:
            self._started = now
        target = (now - self._started) * self.speed
        if target > self.fleet.now:
            self.fleet.advance(target - self.fleet.now)
        started = self._started
        nodes = self.fleet.readings(lambda sim_t: started + sim_t / self.speed)
        return Collection(nodes=nodes, timestamp=now)
