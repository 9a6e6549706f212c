"""Data access for the app: one advisor per source, and the view every page renders.

The app renders the advisor pipeline's published state (`advisor.pipeline.View`): the model and
the documents `/api/*` serves. In the demo and whenever it is given an advisor URL
(`advisor+http://HOST:PORT`, `gpu-defrag app --advisor URL`) it reads the service's API
(`RemoteAdvisor`, `advisor.client`): no poller, history or forecast of its own, so every page
shows the numbers the API serves. On any other source it runs the same pipeline in-process
(`LocalAdvisor`): a thread reads the source's past (the service's start-up backfill), then runs
the pipeline once for a static source (a simulated instant, a snapshot or trace file) or every
refresh for a live one (exporter URLs, Prometheus).

Pages ask `current()` for the `Shown` view and read what it holds; what they derive from it
(frames, figures) is cached on it, so it is computed once per published run. A reviewer can
freeze the view (`frozen`): the pages then keep it while the advisor goes on.
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

from advisor import documents as D
from advisor.app.cli import (
    ADVISOR_ENV,
    ADVISOR_PREFIX,
    DEFAULT_SOURCE,
    REFRESH_ENV,
    SOURCE_ENV,
    advisor_source,
)
from advisor.client import AdvisorClient, AdvisorUnavailable
from advisor.contract import GPU_STATE_CODES
from advisor.model import MILLI, ClusterModel
from advisor.pipeline import Pipeline, RunState, Settings, View
from advisor.pipeline import queries as Q

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
FIRST_VIEW_S = 300.0  # a page waits this long for a source's first view (a large sim's past)
GIB = 2**30

STATE_NAMES: dict[int, str] = {code: name for name, code in GPU_STATE_CODES.items()}
STATE_LABELS: dict[str, str] = {
    "free": "free",
    "busy": "allocated, busy",
    "allocated_idle": "allocated, idle",
    "unhealthy": "unhealthy / unavailable",
    "mig_free": "MIG, free instances",
    "owner_unknown": "in use, owner unknown",
    "reserved": "reserved (planned)",
}


# --------------------------------------------------------------------------- source specs


def is_advisor(spec: str) -> bool:
    return spec.strip().startswith(ADVISOR_PREFIX)


def is_live(spec: str) -> bool:
    """Exporter pages, Prometheus, Kubernetes, Slurm and the advisor service change under us;
    sims, snapshots and traces do not."""
    return is_advisor(spec) or spec.strip().startswith(
        ("http://", "https://", "prometheus+http", "prometheus+https", "slurm:", "slurm+", "k8s:")
    )


def initial_source(argv: list[str] | None = None, environ: dict[str, str] | None = None) -> str:
    """The source the app opens with: `--advisor URL` or `--source X` after `streamlit run
    main.py --`, else $GPU_DEFRAG_ADVISOR, $GPU_DEFRAG_SOURCE, else the built-in preset."""
    args = sys.argv[1:] if argv is None else argv
    for flag, make in (("--advisor", advisor_source), ("--source", str)):
        for i, arg in enumerate(args):
            if arg == flag and i + 1 < len(args):
                return make(args[i + 1])
            if arg.startswith(f"{flag}="):
                return make(arg.split("=", 1)[1])
    env = os.environ if environ is None else environ
    if env.get(ADVISOR_ENV):
        return advisor_source(env[ADVISOR_ENV])
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
    """The parts of a `sim:` spec (None for other sources), for the sidebar's fields."""
    if not spec.startswith("sim:"):
        return None
    preset, _, query = spec.removeprefix("sim:").partition("?")
    params = {k: v[-1] for k, v in parse_qs(query).items()}
    nodes = params.get("nodes")
    return SimSpec(
        preset,
        int(params.get("seed", "42")),
        Q.seconds(params.get("t", "0"), "t"),
        int(nodes) if nodes else None,
    )


def describe_error(spec: str, error: BaseException) -> str:
    """One line for the page: source errors as they are, anything else with its type."""
    if isinstance(error, Q.SourceError | AdvisorUnavailable):
        return str(error)
    return f"{spec}: {type(error).__name__}: {error}"


# --------------------------------------------------------------------------- what pages see


@dataclass
class Shown:
    """One view as the pages render it: where it came from, when it was read, and what the
    pages derived from it (computed once per view, `cached`)."""

    spec: str
    view: View
    live: bool
    loaded_at: float  # wall time the view was read
    preview: bool = False  # the source's past is still being read: no trend, forecast, plans
    refresh_error: str | None = None  # the latest read failed: this view is the last good one
    frozen: bool = False
    derived: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def model(self) -> ClusterModel:
        return self.view.model

    @property
    def version(self) -> str:
        """What the open page was drawn from: a new view, or a read that failed (so the page
        says so at the next watch, not only at a reload), changes it."""
        failed = f"!{self.refresh_error}" if self.refresh_error else ""
        return f"{self.spec}@{self.view.version}{'~' if self.preview else ''}{failed}"

    def cached(self, key: str, compute: Callable[[], Any]) -> Any:
        if key not in self.derived:
            self.derived[key] = compute()
        return self.derived[key]

    @property
    def result(self) -> dict[str, Any]:
        """The served fragmentation document as JSON data (`/api/fragmentation?nodes=true`)."""
        return self.cached("result", lambda: D.as_json(self.view.fragmentation))

    @property
    def forecast(self) -> dict[str, Any]:
        """The served forecast document as JSON data (`/api/forecast`)."""
        return self.cached("forecast", lambda: D.as_json(self.view.forecast))

    @property
    def job_end_doc(self) -> dict[str, Any]:
        """Where the plans' job ends came from (`/api/recommendations`' `job_ends`)."""
        doc = self.view.recommendations.job_ends
        return {} if doc is None else D.as_json(doc)

    @property
    def planned_ends(self) -> dict[str, float]:
        return self.cached("ends", self.view.planned_ends)


# The one place tests replace the source's reader (spec -> model); None: the pipeline's own.
load_model: Callable[[str], ClusterModel] | None = None


class LocalAdvisor:
    """The pipeline run in-process on a source: a thread reads the source's past, then runs
    the pipeline once (static sources) or every `refresh_s` (live ones), publishing a view per
    run. A source whose past is slow to read (Prometheus, exporters, a simulated fleet of more
    than `SIM_LARGE_NODES` nodes) first gets a preview: one run without a past, so the Fleet and
    Fragmentation pages show at once. SourceError at once for a spec no run could ever read."""

    def __init__(self, spec: str, refresh_s: float, settings: Settings | None = None) -> None:
        self.spec = spec
        self.live = is_live(spec)
        self.refresh_s = refresh_s
        self.settings = settings or Settings()
        reader = load_model
        self._ingest = None if reader is None else (lambda: reader(spec))
        self.pipeline = self._pipeline()
        self.past = ""
        self._lock = threading.Lock()
        self._shown: Shown | None = None
        self._results: Any = None  # the run results `_shown` was made of
        self._error: str | None = None
        self._first = threading.Event()  # a view (or an error) was published
        self._settled = threading.Event()  # the past was read and a run published
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"advisor {spec}", daemon=True)
        self._thread.start()

    def _pipeline(self) -> Pipeline:
        return Pipeline(
            self.spec,
            self.settings,
            ingest=self._ingest,
            timeout_s=LOAD_TIMEOUT_S,
            frozen=not self.live,
        )

    def _run(self) -> None:
        try:
            if slow_past(self.spec):  # its own pipeline: the main one reads the past first
                self._publish(self._pipeline().run_once(), preview=True)
            got = self.pipeline.backfill(cancelled=self._stop.is_set)
            if got is not None:
                self.past = got.summary()
                log.info("%s", self.past)
            while not self._stop.is_set():
                self.run_once()
                if not self.live:
                    return
                self._stop.wait(self.refresh_s)
        except Exception as error:  # the pages say it; the thread ends
            log.exception("the pipeline on %s failed", self.spec)
            with self._lock:
                self._error = describe_error(self.spec, error)
            self._first.set()
            self._settled.set()

    def run_once(self) -> None:
        """One run of the pipeline, published (the thread's step; tests and benches call it)."""
        self._publish(self.pipeline.run_once())

    def _publish(self, state: RunState, preview: bool = False) -> None:
        error = state.source_error or state.last_error or None if state.stale else None
        with self._lock:
            if state.results is None or state.results is self._results:  # the last good stays
                self._error = state.last_error or "no results"
                if self._shown is not None:
                    self._shown.refresh_error = error or self._error
            else:
                self._results = state.results
                view = View.of(state)
                self._shown = Shown(self.spec, view, self.live, time.time(), preview, error)
                self._error = None
        self._first.set()
        if not preview:
            self._settled.set()

    def latest(self, wait_s: float = 0.0) -> tuple[Shown | None, str | None]:
        """(the latest view or None, why there is none or why it is old); waits up to `wait_s`
        for the first one (a preview, where the past is slow to read)."""
        self._first.wait(wait_s)
        with self._lock:
            return self._shown, self._error

    def wait_settled(self, timeout_s: float) -> bool:
        """Wait until the source's past is read and a run published (tests, benches)."""
        return self._settled.wait(timeout_s)

    def started(self) -> bool:
        return self._first.is_set()

    def stop(self) -> None:
        self._stop.set()


class RemoteAdvisor:
    """The advisor service's API: a view of its latest run, read again at most every
    `refresh_s` (only what changed since: `AdvisorClient.view`). A service that is down or has
    no run yet (503 while it reads its past) is asked again every `RETRY_S` until it has one."""

    live = True
    RETRY_S = 2.0

    def __init__(self, spec: str, refresh_s: float) -> None:
        self.spec = spec
        self.refresh_s = refresh_s
        self.client = AdvisorClient(spec.removeprefix(ADVISOR_PREFIX), LOAD_TIMEOUT_S)
        self._lock = threading.Lock()
        self._shown: Shown | None = None
        self._error: str | None = None
        self._read_at = -math.inf

    def _read(self, previous: Shown | None) -> Shown:
        view = self.client.view(previous.view if previous else None)
        if previous is not None and view is previous.view:
            return previous
        return Shown(self.spec, view, True, time.time())

    def latest(self, wait_s: float = 0.0) -> tuple[Shown | None, str | None]:
        with self._lock:
            every = self.refresh_s if self._shown is not None else self.RETRY_S
            if time.monotonic() - self._read_at >= every:
                self._read_at = time.monotonic()
                try:
                    self._shown, self._error = self._read(self._shown), None
                except AdvisorUnavailable as error:
                    self._error = str(error)
                    log.warning("reading the advisor %s failed: %s", self.spec, error)
                if self._shown is not None:
                    self._shown.refresh_error = self._error
            return self._shown, self._error

    def wait_settled(self, timeout_s: float) -> bool:
        return True

    def started(self) -> bool:
        return True

    def stop(self) -> None:
        pass


Advisor = LocalAdvisor | RemoteAdvisor


def slow_past(spec: str) -> bool:
    """Whether reading the source's past takes long enough to show a preview first."""
    spec = spec.strip()
    if spec.startswith(("prometheus+", "http://", "https://")):
        return True
    sim = parse_sim(spec)
    if sim is None or sim.t <= 0:
        return False
    return (sim.nodes or 0) > Q.SIM_LARGE_NODES


def _stop_advisor(advisor: Advisor) -> None:
    advisor.stop()


# An advisor evicted from the cache (or cleared) stops.
@st.cache_resource(
    max_entries=8, ttl=3600, show_spinner="Reading the source…", on_release=_stop_advisor
)
def _advisor(spec: str, refresh_s: float) -> Advisor:
    if is_advisor(spec):
        return RemoteAdvisor(spec, refresh_s)
    return LocalAdvisor(spec, refresh_s)


def get_advisor(spec: str) -> tuple[Advisor | None, str | None]:
    """(advisor, None) or (None, one-line error). Failures are not cached."""
    try:
        return _advisor(spec, refresh_seconds()), None
    except Exception as error:
        return None, describe_error(spec, error)


def latest(spec: str, wait_s: float = 0.0) -> tuple[Shown | None, str | None]:
    advisor, error = get_advisor(spec)
    if advisor is None:
        return None, error
    return advisor.latest(wait_s)


def first_view(spec: str) -> tuple[Shown | None, str | None]:
    """`latest`, waiting (with a spinner) for the source's first view when there is none yet."""
    advisor, error = get_advisor(spec)
    if advisor is None:
        return None, error
    if advisor.started():
        return advisor.latest()
    with st.spinner("Reading the source…"):
        return advisor.latest(FIRST_VIEW_S)


def current_spec() -> str:
    if "source" not in st.session_state:
        st.session_state["source"] = initial_source()
    return str(st.session_state["source"])


FROZEN = "frozen_view"  # session state: the view a reviewer froze (with its spec)


def frozen_view(spec: str) -> Shown | None:
    held = st.session_state.get(FROZEN)
    return held if isinstance(held, Shown) and held.spec == spec else None


def freeze(shown: Shown) -> Shown:
    """The view held for a review: a copy marked frozen, its derived data its own."""
    return Shown(
        shown.spec,
        shown.view,
        shown.live,
        shown.loaded_at,
        shown.preview,
        shown.refresh_error,
        frozen=True,
    )


def current() -> Shown:
    """The view of the session's source (the frozen one while the review is frozen), or an
    error message on the page and a stop."""
    spec = current_spec()
    held = frozen_view(spec)
    if held is not None:
        return held
    shown, error = first_view(spec)
    if shown is None:
        st.error(f"Cannot read the data source. {error or 'no view yet'}", icon=":material/error:")
        if is_live(spec):  # a live source or service may come up (an advisor reading its past)
            retry_until_shown(spec)
        st.stop()
    assert shown is not None
    if shown.refresh_error:
        st.warning(
            f"Last refresh failed ({shown.refresh_error}); showing data from "
            f"{wall_clock(shown.loaded_at)}.",
            icon=":material/sync_problem:",
        )
    left_out = shown.view.meta.source_left_out
    if left_out:
        st.warning(left_out_text(tuple(left_out)), icon=":material/dns:")
    for line in scheduler_lines(shown.model):
        st.info(line, icon=":material/info:")
    return shown


def retry_until_shown(spec: str) -> None:
    """Ask the source again every few seconds and draw the page once it gives a view."""

    @st.fragment(run_every=RemoteAdvisor.RETRY_S)
    def retry() -> None:
        shown, _ = latest(spec)
        if shown is not None:
            st.rerun()

    retry()


def page_version(page: str, shown: Shown | None) -> str:
    """What a page is drawn from: the page reruns when this changes. The Forecast page draws
    the forecast document, which changes once an hour, so a new reading alone does not redraw
    it (its per-node table, which follows every reading, has its own timer); the other pages
    follow every published run."""
    if shown is None:
        return ""
    if page != "Forecast" or shown.preview:
        return shown.version

    def digest() -> str:
        import hashlib

        body = shown.view.forecast.model_dump_json(exclude={"meta"})
        return hashlib.sha1(body.encode()).hexdigest()

    return f"{shown.spec}@forecast:{shown.cached('forecast digest', digest)}"


def served_plans(shown: Shown) -> list[Q.Plan]:
    """The advisor's plans (`/api/recommendations`' `plans`) as the planner's plans, for the
    Actions page to replay and export."""

    def compute() -> list[Q.Plan]:
        docs = shown.view.recommendations.plans
        return [Q.plan_from_doc(p.model_dump(by_alias=True, exclude_unset=True)) for p in docs]

    return shown.cached("served plans", compute)


def scheduler_lines(model: ClusterModel) -> list[str]:
    """What every page says about the model's racks and its scheduler's view: racks unknown
    (multi-node shapes then count known racks only), a stale watch, the join's notes."""
    lines = []
    unknown = int((model.nodes.rack == "").sum())
    if unknown and len(model.nodes):
        where = "all" if unknown == len(model.nodes) else f"{unknown} of {len(model.nodes)}"
        lines.append(
            f"Rack unknown for {where} nodes: multi-node shapes are counted on known racks "
            'only, and where the racks decide it the count says "rack unknown" (give the rack '
            "label: k8s:?rack-label=KEY)."
        )
    facts = model.scheduler
    if facts is not None:
        if facts.stale:
            lines.append(f"The {facts.kind} view is stale: {facts.stale}.")
        lines += [f"{facts.kind}: {note}" for note in facts.notes[:5]]
    return lines


def left_out_text(left_out: tuple[str, ...]) -> str:
    """The line every page shows when the read lacks GPU exporters the source knows."""
    more = f" and {len(left_out) - 5} more" if len(left_out) > 5 else ""
    return (
        f"{len(left_out)} GPU exporter(s) could not be read, so their nodes are in no figure "
        f"here: {'; '.join(left_out[:5])}{more}."
    )


def preview_note(shown: Shown) -> None:
    """What a page that needs the source's past says while it is still being read."""
    if shown.preview:
        st.info(
            "Reading this source's past (for the trend, forecasts and learned job ends); this "
            "part of the page fills in when it is read.",
            icon=":material/hourglass_top:",
        )
        st.stop()


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


def gpu_frame(model: ClusterModel, codes: np.ndarray) -> pd.DataFrame:
    """One row per GPU with everything the heatmap shows or filters on; `codes` the GPUs'
    state codes (`queries.gpu_states`)."""
    gpus, nodes = model.gpus, model.nodes
    jobs, tenants = _holders(model)
    total = gpus.memory_total_bytes
    used = gpus.memory_used_bytes
    with np.errstate(invalid="ignore", divide="ignore"):
        memory_ratio = np.where(total > 0, used / total, np.nan)
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


def fleet_frame(shown: Shown) -> pd.DataFrame:
    """`gpu_frame` with the GPU states as /metrics serves them and each node's served FGD score
    (fragment / free capacity) on each of its GPUs."""

    def compute() -> pd.DataFrame:
        frame = gpu_frame(shown.model, Q.gpu_states(shown.model, Settings()))
        nodes = shown.result.get("nodes", [])
        score = {row["node"]: row["score"] for row in nodes}
        frame["node_score"] = frame["node"].map(score).astype(float)
        return frame

    return shown.cached("fleet_frame", compute)


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


def shapes_frame(result: dict[str, Any]) -> pd.DataFrame:
    rows = [
        {
            "shape": row["shape"],
            "GPUs per job": row["gpus_per_job"],
            "jobs that can start now": row["jobs_that_fit"],
            # where unknown racks decide the count: what they could allow (None elsewhere)
            "if the unknown racks allow": row.get("jobs_if_racks_allow"),
            "why none can start": {"rack_unknown": "rack unknown", "scattered": "scattered"}.get(
                row.get("blocked_by") or "", ""
            ),
            "free GPUs it cannot use": row["stranded_gpus"],
            "spans NVLink islands": _crossing_text(row["crosses_nvlink_islands"]),
        }
        for row in result["spatial"]["shapes"]
    ]
    return pd.DataFrame(rows)


def _crossing_text(estimates: list[dict[str, Any]]) -> str:
    """Where a job of the shape spans NVLink islands and how much slower (est.), in short."""
    return "; ".join(
        f"{e['gpu_model']}: "
        + ("slower" if e["step_slowdown"] is None else f"est. {e['step_slowdown']:.1f}x step time")
        for e in estimates
    )


def worst_nodes(result: dict[str, Any], top: int = 10) -> pd.DataFrame:
    """The served nodes with an FGD fragment, the largest first (ties: more free capacity
    first), as the CLI lists them (`measures.most_fragmented`)."""
    frame = pd.DataFrame(result.get("nodes", []))
    if frame.empty:
        return frame
    frame = frame[frame["fgd_fragment_gpus"] > 0]
    frame = frame.sort_values(
        ["fgd_fragment_gpus", "free_capacity_gpus"], ascending=False, kind="stable"
    ).head(top)
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


def trend(shown: Shown) -> pd.DataFrame:
    """The advisor's history as the trend chart plots it: one row per run, `time` (UTC) and
    the headline measures (`/api/history`'s trend)."""

    def compute() -> pd.DataFrame:
        points = shown.view.history.trend
        frame = pd.DataFrame(
            [{k: v for k, v in p.model_dump().items() if k != "jobs_that_fit"} for p in points]
        )
        if frame.empty:
            return pd.DataFrame(columns=["time"])
        frame["time"] = pd.to_datetime(frame["time"], unit="s", utc=True)
        return frame

    return shown.cached("trend", compute)


def hourly_demand(shown: Shown) -> pd.DataFrame:
    """The complete hours the demand forecast learned from, per pool (`/api/history`'s
    demand): `pool, hour, allocated_gpus, capacity_gpus`, masked hours NaN."""

    def compute() -> pd.DataFrame:
        rows = [h.model_dump() for h in shown.view.history.demand]
        frame = pd.DataFrame(rows, columns=["pool", "hour", "allocated_gpus", "capacity_gpus"])
        frame["hour"] = pd.to_datetime(frame["hour"], utc=True)
        return frame.astype({"allocated_gpus": float, "capacity_gpus": float})

    return shown.cached("hourly_demand", compute)


# --------------------------------------------------------------------------- sidebar specs

SOURCE_KINDS: tuple[str, ...] = ("advisor", "sim", "exporters", "prometheus", "file")
SOURCE_KIND_LABELS: dict[str, str] = {
    "advisor": "Advisor service",
    "sim": "Simulated fleet",
    "exporters": "Exporter URLs",
    "prometheus": "Prometheus",
    "file": "Snapshot or trace file",
}


def kind_of(spec: str) -> str:
    spec = spec.strip()
    if is_advisor(spec):
        return "advisor"
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
        except ValueError:
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


# --------------------------------------------------------------------------- times


def wall_clock(timestamp: float) -> str:
    """When the app read something, as UTC text marked as the wall clock: beside a simulated
    fleet's own time (`when`), which may be days apart, the two must not be confused."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC (wall clock)", time.gmtime(timestamp))


CLOCK_FROM = 946_684_800.0  # 2000-01-01: earlier "times" are counts from a trace's or file's 0


def has_clock(model: ClusterModel) -> bool:
    """Whether the model's times are dates: a snapshot without a timestamp, or a trace that
    counts from its own start, has times from 0, which are no dates (shown as dates, they read
    1970-01-01)."""
    return math.isfinite(model.timestamp) and model.timestamp >= CLOCK_FROM


def when(shown: Shown) -> str:
    """The model's own timestamp (simulated time for sims) as UTC text; '' when unknown."""
    if not has_clock(shown.model):
        return ""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(shown.model.timestamp))


def at_time(shown: Shown, timestamp: float) -> str:
    """A time the plans give (a start, an end) as a date, or, for a model without a clock, as
    hours after the model's time (no date is known)."""
    if has_clock(shown.model):
        return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(timestamp))
    return f"{(timestamp - Q.now_of(shown.model)) / 3600:.1f} h after the snapshot's time"
