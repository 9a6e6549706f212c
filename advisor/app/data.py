"""Data access for the app: one `SourceState` per source spec, loaded, analysed and cached.

Pages never call ingest or the measures directly; they ask `current()` and read what it holds,
so tests can swap `load_model` for a fake and every page sees the same numbers. Static sources
(simulated presets, snapshot and trace files) are loaded once per spec; live sources (exporter
URLs, Prometheus) get a `Poller` thread that re-reads them every `refresh_s` and keeps the
advisor's own `History`, so trends and the idle window fill in while the app is open.

Everything here except the `st.cache_resource` wrappers is plain Python over the model.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import numpy as np
import pandas as pd
import streamlit as st

from advisor.app.cli import DEFAULT_SOURCE, REFRESH_ENV, SOURCE_ENV
from advisor.contract import GPU_STATE_CODES
from advisor.fragmentation import measures
from advisor.history import History
from advisor.ingest.sources import (
    SIM_LARGE_NODES,
    SourceError,
    load_source,
    seconds,
    sim_model,
)
from advisor.model import MILLI, ClusterModel

log = logging.getLogger(__name__)


def configure_logging() -> None:
    """The app process's log on standard error, as the service's: every record redacted (a
    refresh that failed, and the readers' warnings, name the source's URL, password included)
    and a warning repeated on every refresh shown once an hour. Once per process: Streamlit
    runs the page script again on every interaction."""
    from advisor.logs import install_log_filters
    from gpu_defrag_common.server_cli import LOG_FORMAT

    root = logging.getLogger()
    if any(getattr(handler, "gpu_defrag_app", False) for handler in root.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    handler.gpu_defrag_app = True  # type: ignore[attr-defined]
    install_log_filters([handler])
    root.addHandler(handler)  # at the root's level: warnings and up


DEFAULT_REFRESH_S = 15.0
LOAD_TIMEOUT_S = 10.0
RECENT_S = 6 * 3600.0  # a live history's full-resolution part; hourly before it
HISTORY_HOURS = 16 * 24  # hours a live history keeps: the idle windows read 16 days
GIB = 2**30

STATE_NAMES: dict[int, str] = {code: name for name, code in GPU_STATE_CODES.items()}
STATE_LABELS: dict[str, str] = {
    "free": "free",
    "busy": "allocated, busy",
    "allocated_idle": "allocated, idle",
    "unhealthy": "unhealthy / unavailable",
    "mig_free": "MIG, free instances",
    "reserved": "reserved (planned)",
}


# --------------------------------------------------------------------------- source specs


def is_live(spec: str) -> bool:
    """Exporter pages and Prometheus change under us; sims, snapshots and traces do not."""
    return spec.strip().startswith(("http://", "https://", "prometheus+http", "prometheus+https"))


def initial_source(argv: list[str] | None = None, environ: dict[str, str] | None = None) -> str:
    """The source the app opens with: `--source X` after `streamlit run main.py --`, else
    $GPU_DEFRAG_SOURCE, else the built-in preset."""
    args = sys.argv[1:] if argv is None else argv
    for i, arg in enumerate(args):
        if arg == "--source" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--source="):
            return arg.split("=", 1)[1]
    env = os.environ if environ is None else environ
    return env.get(SOURCE_ENV) or DEFAULT_SOURCE


def refresh_seconds(environ: dict[str, str] | None = None) -> float:
    env = os.environ if environ is None else environ
    try:
        return max(1.0, float(env.get(REFRESH_ENV, DEFAULT_REFRESH_S)))
    except ValueError:
        return DEFAULT_REFRESH_S


@dataclass(frozen=True)
class SimSpec:
    preset: str
    seed: int
    t: float
    nodes: int | None


def parse_sim(spec: str) -> SimSpec | None:
    """The parts of a `sim:` spec (None for other sources). Only called after `load_source`
    accepted the spec, so the values are known to be valid."""
    if not spec.startswith("sim:"):
        return None
    preset, _, query = spec.removeprefix("sim:").partition("?")
    params = {k: v[-1] for k, v in parse_qs(query).items()}
    nodes = params.get("nodes")
    return SimSpec(
        preset,
        int(params.get("seed", "42")),
        seconds(params.get("t", "0"), "t"),
        int(nodes) if nodes else None,
    )


# --------------------------------------------------------------------------- loading


def load_model(spec: str) -> ClusterModel:
    """The one place the app reads a source (tests replace it). Raises SourceError."""
    return load_source(spec, timeout=LOAD_TIMEOUT_S)


def live_history(refresh_s: float) -> History:
    """A live source's history: every read of the last `RECENT_S` (the trend), one an hour for
    `HISTORY_HOURS` before (the forecasts), whatever the refresh rate."""
    recent = math.ceil(RECENT_S / refresh_s)
    return History(max_points=recent + HISTORY_HOURS + 1, hourly_after_s=RECENT_S)


def read_past(spec: str, history: History) -> str:
    """A Prometheus source's or a sim exporter's last week into `history` (the advisor
    service's start-up backfill), so the forecast page has hours at once; '' for sources
    without a past."""
    from advisor.ingest import backfill

    got = backfill.past(spec, backfill.default_span_s(spec), timeout=LOAD_TIMEOUT_S)
    if got is None:
        return ""
    history.extend(got.models)
    log.info("%s", got.summary())
    return got.summary()


def describe_error(spec: str, error: BaseException) -> str:
    """One line for the page: source errors as they are, anything else with its type."""
    if isinstance(error, SourceError):
        return str(error)
    return f"{spec}: {type(error).__name__}: {error}"


@dataclass
class SourceState:
    """One source as the pages see it: the latest model, its analysis, and its history."""

    spec: str
    model: ClusterModel
    result: dict[str, Any]
    history: History
    loaded_at: float
    live: bool
    refresh_error: str | None = None  # the last refresh failed; model is the last good one
    derived: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def version(self) -> str:
        """What the open page was drawn from: a new read, or a refresh that failed (so the page
        says so at the next watch, not only at a reload), changes it."""
        failed = f"!{self.refresh_error}" if self.refresh_error else ""
        return f"{self.spec}@{self.loaded_at:.6f}{failed}"

    def cached(self, key: str, compute: Callable[[], Any]) -> Any:
        """Derived data (frames, figures' inputs) computed once per loaded model."""
        if key not in self.derived:
            self.derived[key] = compute()
        return self.derived[key]


def analyze_state(spec: str, model: ClusterModel, history: History, live: bool) -> SourceState:
    """Attach the history's usage window, analyse, and (for live sources) record the point."""
    if live and not math.isnan(model.timestamp):
        model = history.with_usage(model)
    result = measures.analyze(model)
    if live and not math.isnan(model.timestamp):
        history.append(model, result)
    return SourceState(spec, model, result, history, time.time(), live)


class Poller:
    """Re-reads a live source every `refresh_s` on a daemon thread, keeping its history.

    The first load happens in the constructor, so a source that cannot be read fails at once
    (and, raised out of the cached factory, is not cached: the next rerun tries again).
    """

    def __init__(self, spec: str, refresh_s: float, history: History | None = None) -> None:
        self.spec = spec
        self.refresh_s = refresh_s
        self.history = history or live_history(refresh_s)
        self.past = read_past(spec, self.history) if history is None else ""
        self._state = analyze_state(spec, load_model(spec), self.history, live=True)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"poll {spec}", daemon=True)
        self._thread.start()

    def state(self) -> SourceState:
        return self._state

    def poll_once(self) -> None:
        try:
            model = load_model(self.spec)
        except Exception as error:  # keep the last good model; say why it is old
            self._state.refresh_error = describe_error(self.spec, error)
            log.warning("refresh of %s failed: %s", self.spec, self._state.refresh_error)
            return
        self._state = analyze_state(self.spec, model, self.history, live=True)

    def _run(self) -> None:
        while not self._stop.wait(self.refresh_s):
            self.poll_once()

    def stop(self) -> None:
        self._stop.set()


@st.cache_resource(max_entries=8, ttl=3600, show_spinner="Reading the source…")
def _static_state(spec: str) -> SourceState:
    return analyze_state(spec, load_model(spec), History(), live=False)


def _stop_poller(poller: Poller) -> None:
    poller.stop()


# A poller evicted from the cache (or cleared) stops polling.
@st.cache_resource(
    max_entries=4,
    show_spinner="Reading the source (from Prometheus, its last week too)…",
    on_release=_stop_poller,
)
def _poller(spec: str, refresh_s: float) -> Poller:
    return Poller(spec, refresh_s)


def get_state(spec: str) -> tuple[SourceState | None, str | None]:
    """(state, None) or (None, one-line error). Failures are not cached."""
    try:
        if is_live(spec):
            return _poller(spec, refresh_seconds()).state(), None
        return _static_state(spec), None
    except Exception as error:
        return None, describe_error(spec, error)


def current_spec() -> str:
    if "source" not in st.session_state:
        st.session_state["source"] = initial_source()
    return str(st.session_state["source"])


def current() -> SourceState:
    """The state of the session's source, or an error message on the page and a stop."""
    spec = current_spec()
    state, error = get_state(spec)
    if state is None:
        st.error(f"Cannot read the data source. {error}", icon=":material/error:")
        st.stop()
    assert state is not None
    if state.refresh_error:
        st.warning(
            f"Last refresh failed ({state.refresh_error}); showing data from "
            f"{wall_clock(state.loaded_at)}.",
            icon=":material/sync_problem:",
        )
    if state.model.left_out:
        st.warning(left_out_text(state.model.left_out), icon=":material/dns:")
    return state


def left_out_text(left_out: tuple[str, ...]) -> str:
    """The line every page shows when the read lacks GPU exporters the source knows."""
    more = f" and {len(left_out) - 5} more" if len(left_out) > 5 else ""
    return (
        f"{len(left_out)} GPU exporter(s) could not be read, so their nodes are in no figure "
        f"here: {'; '.join(left_out[:5])}{more}."
    )


# --------------------------------------------------------------------------- fleet frame


def _holders(model: ClusterModel) -> tuple[list[str], list[str]]:
    """Per GPU: the jobs and tenants on it, comma-joined (several when shared)."""
    jobs: list[list[str]] = [[] for _ in range(len(model.gpus))]
    tenants: list[list[str]] = [[] for _ in range(len(model.gpus))]
    allocs = model.allocations
    for alloc, gpu in zip(
        model.placements.alloc.tolist(), model.placements.gpu.tolist(), strict=True
    ):
        job, tenant = str(allocs.job[alloc]), str(allocs.tenant[alloc])
        if job not in jobs[gpu]:
            jobs[gpu].append(job)
        if tenant and tenant not in tenants[gpu]:
            tenants[gpu].append(tenant)
    return [", ".join(j) for j in jobs], [", ".join(t) for t in tenants]


def gpu_frame(model: ClusterModel, idle: np.ndarray) -> pd.DataFrame:
    """One row per GPU with everything the heatmap shows or filters on."""
    gpus, nodes = model.gpus, model.nodes
    jobs, tenants = _holders(model)
    total = gpus.memory_total_bytes
    used = gpus.memory_used_bytes
    with np.errstate(invalid="ignore", divide="ignore"):
        memory_ratio = np.where(total > 0, used / total, np.nan)
    codes = measures.gpu_state_codes(model, idle)
    return pd.DataFrame(
        {
            "node": nodes.name[gpus.node].astype(str),
            "gpu": gpus.index.astype(int),
            "pool": nodes.pool[gpus.node].astype(str),
            "gpu_model": nodes.gpu_model[gpus.node].astype(str),
            "rack": nodes.rack[gpus.node].astype(str),
            "state_code": codes,
            "state": [STATE_NAMES[int(c)] for c in codes.tolist()],
            "allocated_gpu": model.gpu_milli_allocated / MILLI,
            "utilization": gpus.utilization_ratio,
            "memory_used_gib": used / GIB,
            "memory_total_gib": total / GIB,
            "memory_ratio": memory_ratio,
            "nvlink_island": gpus.nvlink_island.astype(int),
            "jobs": jobs,
            "tenants": tenants,
        }
    )


def fleet_frame(state: SourceState) -> pd.DataFrame:
    """`gpu_frame` with the same idle rule the analysis used (so counts agree)."""

    def compute() -> pd.DataFrame:
        idle = measures.allocated_idle(state.model, measures.Settings().idle)
        frame = gpu_frame(state.model, idle)
        # the analysis' per-node FGD score (fragment / free capacity), on each of its GPUs
        nodes = state.result["nodes"]
        score = dict(zip(nodes["node"].tolist(), nodes["score"].tolist(), strict=True))
        frame["node_score"] = frame["node"].map(score).astype(float)
        return frame

    return state.cached("fleet_frame", compute)


def filter_frame(
    frame: pd.DataFrame,
    pools: list[str] | None = None,
    models: list[str] | None = None,
    tenants: list[str] | None = None,
) -> pd.DataFrame:
    """Rows of the nodes matching every non-empty filter; a tenant filter keeps the whole node
    of any GPU the tenant holds, so its neighbours (and their fragments) stay in view."""
    keep = pd.Series(True, index=frame.index)
    if pools:
        keep &= frame["pool"].isin(pools)
    if models:
        keep &= frame["gpu_model"].isin(models)
    if tenants:
        wanted = set(tenants)
        holds = frame["tenants"].map(lambda text: bool(wanted & set(text.split(", "))))
        keep &= frame["node"].isin(set(frame.loc[holds, "node"]))
    return frame[keep]


def tenants_of(frame: pd.DataFrame) -> list[str]:
    names: set[str] = set()
    for text in frame["tenants"].tolist():
        if text:
            names.update(text.split(", "))
    return sorted(names)


def state_counts(frame: pd.DataFrame) -> dict[str, int]:
    counts = frame["state"].value_counts()
    return {name: int(counts.get(name, 0)) for name in GPU_STATE_CODES}


# --------------------------------------------------------------------------- fragmentation


def shape_from_text(text: str) -> measures.Shape:
    """`measures.parse_shape`, but a GPU model after `@` may contain spaces (real model
    names do: "NVIDIA A100-SXM4-80GB")."""
    size, sep, model = text.strip().partition("@")
    shape = measures.parse_shape(size.strip())
    if sep and model.strip():
        return measures.Shape(shape.num_gpu, shape.gpu_milli, shape.tasks, gpu_spec=model.strip())
    return shape


def shapes_frame(result: dict[str, Any]) -> pd.DataFrame:
    rows = [
        {
            "shape": row["shape"],
            "GPUs per job": row["gpus_per_job"],
            "jobs that can start now": row["jobs_that_fit"],
            "free GPUs it cannot use": row["stranded_gpus"],
        }
        for row in result["spatial"]["shapes"]
    ]
    return pd.DataFrame(rows)


def worst_nodes(result: dict[str, Any], top: int = 10) -> pd.DataFrame:
    """`measures.most_fragmented`'s nodes, as the CLI lists them."""
    nodes = result["nodes"]
    order = measures.most_fragmented(nodes, top)
    frame = pd.DataFrame({key: np.asarray(value)[order] for key, value in nodes.items()})
    if result["spatial"]["largest_job"]["nvlink_group_gpus"] is None:  # no island known
        frame["largest_free_nvlink_group"] = None
    return frame.rename(
        columns={
            "gpu_model": "GPU model",
            "free_gpus": "free GPUs",
            "free_capacity_gpus": "free capacity",
            "largest_free_nvlink_group": "largest free NVLink group",
            "allocated_idle_gpus": "allocated idle",
            "stranded_memory_bytes": "stranded memory (bytes)",
            "fgd_fragment_gpus": "FGD fragment (GPUs)",
        }
    ).reset_index(drop=True)


def idle_by_tenant(result: dict[str, Any]) -> pd.DataFrame:
    items = result["temporal"]["idle_gpus_by_tenant"].items()
    return pd.DataFrame(list(items), columns=["tenant", "allocated idle GPUs"])


def type_frames(result: dict[str, Any]) -> tuple[pd.DataFrame, pd.DataFrame]:
    capacity = pd.DataFrame(result["type"]["capacity"])
    demand = pd.DataFrame(
        result["type"]["demand"],
        columns=[
            "gpu_spec",
            "pending_tasks",
            "pending_gpus",
            "free_capacity_gpus",
            "shortfall_gpus",
        ],
    )
    return capacity, demand


SIM_HISTORY_S = 7 * 86400.0  # a week: enough for daily seasonality and a backtest


def sim_history_plan(nodes: int) -> tuple[float, float]:
    """(window, step) seconds of simulated past for a fleet of `nodes` nodes."""
    if nodes <= SIM_LARGE_NODES:
        return SIM_HISTORY_S, 3600.0
    return 86400.0, 4 * 3600.0


def sim_trend(spec: str, window_s: float | None = None) -> History:
    """The simulated fleet's own past: one fleet stepped through the window before the spec's
    `t` (a week hourly; a day 4-hourly above 256 nodes), each instant measured like a live
    source. Empty when the spec is at t=0: the simulation has no past to show."""
    sim = parse_sim(spec)
    history = History(max_points=10_000, usage_window_s=0.0)
    if sim is None or sim.t <= 0:
        return history
    from exporter.sim.fleet import SimFleet

    fleet = SimFleet(sim.preset, sim.seed, sim.nodes)
    window, step = sim_history_plan(len(fleet.spec.nodes))
    start = max(0.0, sim.t - (window if window_s is None else window_s))
    fleet.advance(start)
    times = [*np.arange(start, sim.t, step).tolist(), sim.t]
    for t in times:
        fleet.advance(t - fleet.now)
        history.append(sim_model(fleet, spec))
    return history


@st.cache_resource(max_entries=8, ttl=3600, show_spinner="Simulating the fleet's past…")
def _sim_trend_cached(spec: str) -> History:
    return sim_trend(spec)


def trend_history(state: SourceState) -> History:
    """What the trend chart plots: the live history, or a sim's simulated past."""
    if state.live:
        return state.history
    if state.spec.startswith("sim:"):
        return _sim_trend_cached(state.spec)
    return state.history


def job_ends(state: SourceState) -> tuple[dict[str, float], dict[str, Any]]:
    """The running jobs' ends the advisor service would learn from this state's history, and
    where they come from (`forecasts.learned_job_ends`): computed once per loaded model, for
    the Forecast, What-if and Actions pages alike."""
    from advisor.app import forecasts

    return state.cached(
        "job_ends", lambda: forecasts.learned_job_ends(state.model, trend_history(state))
    )


# --------------------------------------------------------------------------- sidebar specs

SOURCE_KINDS: tuple[str, ...] = ("sim", "exporters", "prometheus", "file")
SOURCE_KIND_LABELS: dict[str, str] = {
    "sim": "Simulated fleet",
    "exporters": "Exporter URLs",
    "prometheus": "Prometheus",
    "file": "Snapshot or trace file",
}


def kind_of(spec: str) -> str:
    spec = spec.strip()
    if spec.startswith("sim:"):
        return "sim"
    if spec.startswith("prometheus+"):
        return "prometheus"
    if spec.startswith(("http://", "https://")):
        return "exporters"
    return "file"


def same_source(a: str, b: str) -> bool:
    """Whether two specs name the same source (`t=2d` and `t=48h` are one sim instant)."""
    if a.startswith("sim:") and b.startswith("sim:"):
        try:
            return parse_sim(a) == parse_sim(b)
        except (ValueError, SourceError):
            return a == b
    return a.strip() == b.strip()


def sim_spec(preset: str, seed: int = 42, hours: float = 0.0, nodes: int | None = None) -> str:
    """`sim:PRESET` with only the options that differ from the defaults."""
    options = []
    if seed != 42:
        options.append(f"seed={int(seed)}")
    if hours > 0:
        options.append(f"t={hours:g}h")
    if nodes:
        options.append(f"nodes={int(nodes)}")
    return f"sim:{preset}" + (f"?{'&'.join(options)}" if options else "")


def exporters_spec(text: str) -> str:
    """Exporter URLs typed one per line or comma-separated; `/metrics` added when missing."""
    urls = [u.strip() for u in text.replace("\n", ",").split(",") if u.strip()]
    out = []
    for url in urls:
        if "://" not in url:
            url = f"http://{url}"
        if url.rstrip("/").count("/") == 2:  # bare host:port
            url = url.rstrip("/") + "/metrics"
        out.append(url)
    return ",".join(out)


def prometheus_spec(url: str) -> str:
    url = url.strip()
    if url.startswith("prometheus+"):
        return url
    if "://" not in url:
        url = f"http://{url}"
    return f"prometheus+{url}"


def file_spec(path: str) -> str:
    """A snapshot (.json) as is; a trace directory or CSV as an `openb:` source."""
    path = path.strip()
    if path.startswith("openb:") or path.endswith(".json"):
        return path
    if path.endswith(".csv") or os.path.isdir(path):
        return f"openb:{path}"
    return path


def wall_clock(timestamp: float) -> str:
    """When the app read something, as UTC text marked as the wall clock: beside a simulated
    fleet's own time (`when`), which may be days apart, the two must not be confused."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC (wall clock)", time.gmtime(timestamp))


def when(state: SourceState) -> str:
    """The model's own timestamp (simulated time for sims) as UTC text; '' when unknown."""
    timestamp = state.model.timestamp
    if math.isnan(timestamp):
        return ""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(timestamp))
