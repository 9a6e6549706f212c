"""The simulated workload: job kinds, the size/duration mix, the daily rhythm and activity noise.

Everything here is a pure function of (seed, time) so the fleet is reproducible however it is
stepped: arrivals come from one RNG per (seed, pool, simulated hour) and a job's utilization at
time t is a hash of (job seed, time bucket), never of how often someone looked.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

HOUR = 3600.0
DAY = 86400.0
WEEK = 7 * DAY
# Simulated t=0 is a Monday 09:00 in cluster-local time (UTC for the unix mapping).
START_HOUR_OF_WEEK = 9.0
SIM_EPOCH = 1767603600.0  # 2026-01-05T09:00:00Z, a Monday
UTIL_BUCKET = 60.0  # utilization noise changes once a simulated minute
IDLE_BUCKET = 3600.0  # idle stretches last 1-4 of these


@dataclass(frozen=True, slots=True)
class JobKind:
    """A class of work with its own shape, tenants and activity profile."""

    name: str
    weight: float  # share of arrivals
    sizes: tuple[tuple[float, float], ...]  # (gpus, probability); fractions < 1 share a GPU
    tenants: tuple[tuple[str, str], ...]  # (tenant, namespace)
    median_hours: float
    sigma: float  # lognormal shape of the duration: heavy tail
    max_hours: float
    util: tuple[float, float]
    memory: tuple[float, float]  # fraction of the (share of the) GPU's memory
    idle_prob: float  # chance a job is idle in any given hour
    stalled_prob: float  # chance a job is allocated but (almost) never busy
    no_process_prob: float  # chance an allocation has no process at all
    priority: int
    migratable: bool
    container: str
    process: str
    follows_day: bool = False  # inference traffic follows the daily rhythm


KINDS: tuple[JobKind, ...] = (
    JobKind(
        "train",
        0.33,
        ((1, 0.2), (2, 0.15), (4, 0.2), (8, 0.33), (16, 0.08), (32, 0.04)),
        (("rnd", "rnd-llm"), ("rnd", "rnd-vision"), ("algorithms", "algo-ranking")),
        4.0,
        1.5,
        7 * 24,
        (0.72, 0.98),
        (0.55, 0.95),
        0.04,
        0.05,
        0.0,
        100,
        True,
        "trainer",
        "python3",
    ),
    JobKind(
        "batch",
        0.25,
        ((1, 0.6), (2, 0.25), (4, 0.15)),
        (("algorithms", "algo-speech"), ("product", "prod-batch")),
        0.7,
        1.2,
        48,
        (0.45, 0.9),
        (0.3, 0.8),
        0.05,
        0.03,
        0.0,
        50,
        True,
        "worker",
        "python3",
    ),
    JobKind(
        "notebook",
        0.27,
        ((0.25, 0.2), (0.5, 0.4), (1, 0.4)),
        (("rnd", "rnd-llm"), ("algorithms", "algo-ranking"), ("rnd", "rnd-vision")),
        3.0,
        1.0,
        72,
        (0.05, 0.45),
        (0.1, 0.5),
        0.55,
        0.2,
        0.35,
        10,
        False,
        "notebook",
        "ipykernel_launcher",
    ),
    JobKind(
        "inference",
        0.15,
        ((0.25, 0.25), (0.5, 0.25), (1, 0.4), (2, 0.1)),
        (("product", "prod-serving"),),
        36.0,
        1.0,
        14 * 24,
        (0.25, 0.65),
        (0.15, 0.4),
        0.0,
        0.05,
        0.0,
        1000,
        False,
        "server",
        "tritonserver",
        follows_day=True,
    ),
)
KIND_BY_NAME = {kind.name: kind for kind in KINDS}


@dataclass(slots=True)
class JobRequest:
    """One job as drawn from the mix, before placement."""

    kind: str
    gpus: float  # < 1: a fraction of one GPU
    duration: float  # simulated seconds
    tenant: str
    namespace: str
    util: float
    memory: float
    idle_prob: float
    has_process: bool
    seed: int  # drives this job's activity noise and its names
    arrival: float = 0.0


def day_factor(t: float | np.ndarray) -> float | np.ndarray:
    """Arrival-rate multiplier at simulated time t: busy working hours, quiet nights, calm weekend.

    Averages to about 1 over a week, so a pool's long-run load stays at its target.
    """
    hours = (np.asarray(t, dtype=float) / HOUR + START_HOUR_OF_WEEK) % (7 * 24)
    hour_of_day = hours % 24
    weekend = hours >= 5 * 24
    working = 0.35 + 1.65 * np.exp(-(((hour_of_day - 13.5) / 3.6) ** 2))
    factor = np.where(weekend, 0.45 + 0.4 * (working - 0.35), working) / _WEEK_MEAN
    return float(factor) if np.ndim(factor) == 0 else factor


_WEEK_MEAN = 1.0
_WEEK_MEAN = float(np.mean(day_factor(np.arange(0, WEEK, 600.0))))


def is_working_hours(t: float) -> bool:
    """Weekday 09:00-18:00 in simulated cluster time."""
    hours = (t / HOUR + START_HOUR_OF_WEEK) % (7 * 24)
    return hours < 5 * 24 and 9 <= hours % 24 < 18


def _pick(rng: np.random.Generator, options: tuple[tuple[float, float], ...]) -> float:
    u = rng.random() * sum(weight for _, weight in options)
    for value, weight in options:
        u -= weight
        if u < 0:
            return float(value)
    return float(options[-1][0])


def draw_job(rng: np.random.Generator, max_gpus: int, gpus_per_node: int) -> JobRequest:
    """One job from the mix; multi-node sizes larger than `max_gpus` are redrawn as one node."""
    kind = KINDS[min(len(KINDS) - 1, int(np.searchsorted(_KIND_CUMULATIVE, rng.random())))]
    gpus = _pick(rng, kind.sizes)
    if gpus > max_gpus:
        gpus = float(gpus_per_node)
    tenant, namespace = kind.tenants[rng.integers(len(kind.tenants))]
    hours = min(kind.max_hours, kind.median_hours * math.exp(kind.sigma * rng.standard_normal()))
    stalled = rng.random() < kind.stalled_prob
    util = 0.01 if stalled else float(rng.uniform(*kind.util))
    return JobRequest(
        kind=kind.name,
        gpus=gpus,
        duration=max(120.0, hours * HOUR),
        tenant=tenant,
        namespace=namespace,
        util=util,
        memory=float(rng.uniform(*kind.memory)),
        idle_prob=1.0 if stalled else kind.idle_prob,
        has_process=not (stalled and rng.random() < 0.5) and rng.random() >= kind.no_process_prob,
        seed=int(rng.integers(1, 2**62)),
    )


_KIND_CUMULATIVE = np.cumsum([kind.weight for kind in KINDS]) / sum(kind.weight for kind in KINDS)
CALIBRATION_HORIZON = 2 * DAY


@functools.lru_cache(maxsize=32)
def mean_gpu_seconds(max_gpus: int, gpus_per_node: int, samples: int = 3000) -> float:
    """Expected GPU-seconds one arriving job holds, for rate calibration.

    Durations are cut at CALIBRATION_HORIZON: the heavy tail would otherwise set a rate whose
    load is only reached after weeks of simulated time, leaving the first days nearly empty.
    """
    rng = np.random.default_rng(12345)
    total = 0.0
    for _ in range(samples):
        job = draw_job(rng, max_gpus, gpus_per_node)
        total += job.gpus * min(job.duration, CALIBRATION_HORIZON)
    return total / samples


def arrivals_in_hour(
    seed: int, pool: int, hour: int, rate_per_second: float, max_gpus: int, gpus_per_node: int
) -> list[JobRequest]:
    """The jobs that arrive for one pool during simulated hour `hour`, sorted by time."""
    rng = np.random.default_rng([seed, pool, hour, 7])
    start = hour * HOUR
    expected = rate_per_second * HOUR * day_factor(start + HOUR / 2)
    count = int(rng.poisson(expected))
    times = np.sort(rng.uniform(start, start + HOUR, count))
    jobs = []
    for at in times:
        job = draw_job(rng, max_gpus, gpus_per_node)
        job.arrival = float(at)
        jobs.append(job)
    return jobs


_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLD = np.uint64(0x9E3779B97F4A7C15)


def hash01(seeds: np.ndarray, bucket: np.ndarray | int, salt: int = 0) -> np.ndarray:
    """A uniform [0, 1) value per (seed, bucket): splitmix64, vectorised, no RNG state."""
    with np.errstate(over="ignore"):
        x = seeds.astype(np.uint64) ^ np.uint64(salt * 0x632BE59BD9B4E019 & (2**64 - 1))
        x = x + (np.asarray(bucket).astype(np.uint64) + np.uint64(1)) * _GOLD
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
        x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(11)).astype(np.float64) / float(2**53)


def activity(
    seeds: np.ndarray,
    base_util: np.ndarray,
    idle_prob: np.ndarray,
    follows_day: np.ndarray,
    t: float,
) -> np.ndarray:
    """Utilization of each job at time t: base level, idle stretches, per-minute jitter.

    A job is idle or active for whole stretches of 1-4 hours (its own length and phase, so jobs
    do not all wake together); `idle_prob` is the share of stretches it sits idle.
    """
    stretch = IDLE_BUCKET * (1 + ((seeds >> np.uint64(16)) % np.uint64(4))).astype(np.float64)
    phase = (seeds % np.uint64(int(IDLE_BUCKET))).astype(np.float64)
    idle_stretch = ((t + phase) // stretch).astype(np.int64)
    active = hash01(seeds, idle_stretch, salt=1) >= idle_prob
    jitter = 0.85 + 0.3 * hash01(seeds, np.int64(t // UTIL_BUCKET), salt=2)
    level = np.where(follows_day, min(1.0, 0.3 + 0.7 * float(day_factor(t)) / 1.6), 1.0)
    return np.where(active, np.minimum(1.0, base_util * jitter * level), 0.0)
