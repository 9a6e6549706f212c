"""One way to name where a cluster model comes from: `load_source(SPEC)`.

    sim:PRESET[?seed=42&t=3600&nodes=N&history=1h&step=5m]
                                                  simulated fleet at t seconds (gpu_defrag_sim),
                                                  with usage sampled over the history; seed >= 0,
                                                  nodes 1 to 10000, t at most 30d (default 0, the
                                                  start: the history is cut at t)
    http://host:9835/metrics[,http://...]         exporter or dcgm-exporter pages, scraped now
    prometheus+http://host:9090[?at=UNIX&history=1h&step=60s]
                                                  Prometheus HTTP API (state + usage history)
        [&scheduler=kube-state-metrics&rack-label=KEY&...]
                                                  + Kubernetes from kube-state-metrics series
    FILE.json                                     a snapshot (docs/snapshot.md)
    slurm:[?partition=&tenant=&max-priority=&topology=]
                                                  live Slurm through this host's scontrol,
                                                  squeue and sinfo (docs/slurm.md)
    slurm+http://host:6820[?...]  slurm+unix:///PATH
                                                  slurmrestd (token: $SLURM_JWT or token-file=)
    openb:NODE_CSV[,POD_CSV]  or  openb:DIR       Alibaba trace: nodes, pods as pending demand
    k8s:[CONTEXT][?rack-label=KEY&pool-label=KEY&tenant=namespace|label:KEY|queue
        &priority-threshold=N]                    Kubernetes API: nodes, pods, the queue, quotas
    SCHEDULER+USAGE                               a scheduler joined by node name with exporter
                                                  URLs or prometheus+http://... (k8s:+http://...)

Every failure is a `SourceError` (a ValueError) with one line naming the source and the
problem, so the CLI can print it without a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

import numpy as np

from advisor import snapshot
from advisor.ingest import (
    combine,
    exporter_scrape,
    kube_state_metrics,
    openb,
    prometheus,
    schedulers,
    slurm,
)
from advisor.ingest.exporter_scrape import SourceUnavailable
from advisor.ingest.readings import from_readings
from advisor.ingest.slurm.spec import SlurmSpec
from advisor.logs import redact
from advisor.model import MILLI, ClusterModel, ModelBuilder, ModelError, Usage
from exporter.readings import NodeReading
from gpu_defrag_common import units

if TYPE_CHECKING:
    from gpu_defrag_sim.fleet import SimFleet

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 10.0
OPENB_NODES = "openb_node_list_gpu_node.csv"
OPENB_PODS = "openb_pod_list_default.csv"

SOURCE_HELP = __doc__.split("\n\n")[1] if __doc__ else ""


class SourceError(ValueError):
    """A source spec that cannot be read; the message is one line."""


def seconds(text: str, name: str, spec: str = "") -> float:
    """'90', '90s', '15m', '1h', '2d' -> seconds (`gpu_defrag_common.units.duration`); the SourceError
    names `spec`, as every other bad option of a source does."""
    try:
        return units.duration(text)
    except argparse.ArgumentTypeError:
        where = f"{spec}: " if spec else ""
        raise SourceError(
            f"{where}{name}={text!r}: expected a duration such as 60, 60s, 15m or 1h"
        ) from None


def _query(text: str) -> dict[str, str]:
    return {key: values[-1] for key, values in parse_qs(text, keep_blank_values=True).items()}


def _only(params: dict[str, str], allowed: set[str], spec: str, why: str = "") -> None:
    unknown = sorted(set(params) - allowed)
    if unknown:
        problem = f"option {unknown[0]!r} {why}" if why else f"unknown option {unknown[0]!r}"
        raise SourceError(f"{spec}: {problem} (known: {', '.join(sorted(allowed))})")


def load_source(spec: str, *, timeout: float = DEFAULT_TIMEOUT) -> ClusterModel:
    """The cluster model named by `spec` (see the module docstring for the forms). A password in
    the spec is read with, but shown (the model's `source`, which reports, snapshots and the
    API print, and every SourceError) as `redact` shows it."""
    try:
        model = _load(spec.strip(), timeout)
    except SourceError as error:
        raise SourceError(redact(str(error))) from None
    source = redact(model.source)
    return model if source == model.source else dataclasses.replace(model, source=source, _cache={})


def _load(spec: str, timeout: float) -> ClusterModel:
    try:
        if schedulers.is_combined(spec):
            return _combined(spec, timeout)
        if spec.startswith("sim:"):
            return _sim(spec)
        if spec.startswith(("prometheus+http://", "prometheus+https://")):
            return _prometheus(spec, timeout)
        if spec.startswith(("http://", "https://")):
            urls = [url.strip() for url in spec.split(",") if url.strip()]
            return exporter_scrape.scrape(urls, timeout=timeout, source=spec)
        if spec.startswith("openb:"):
            return _openb(spec)
        if slurm.is_slurm(spec):  # alone: Slurm's own model, with its scheduler facts
            from advisor.ingest import slurm_scheduler

            return slurm_scheduler.load_model(spec, timeout)
        if spec.endswith(".json") or Path(spec).is_file():
            return snapshot.load(spec)
    except SourceUnavailable as error:
        raise SourceError(str(error)) from None
    except snapshot.SnapshotError as error:
        raise SourceError(f"snapshot {spec}: {error}") from None
    except (openb.OpenbFormatError, ModelError) as error:
        raise SourceError(f"{spec}: {error}") from None
    except slurm.SlurmSpecError as error:
        raise SourceError(str(error)) from None
    except (slurm.SlurmUnavailable, slurm.SlurmFormatError) as error:
        raise SourceError(f"{spec.rstrip(':')}: {error}") from None
    raise SourceError(
        f"{spec!r} is not a source: use sim:PRESET, http(s)://.../metrics, "
        "prometheus+http://HOST:9090, FILE.json, openb:NODE_CSV[,POD_CSV], k8s:[CONTEXT], "
        "slurm: or slurm+http://HOST:6820"
    )


def _combined(spec: str, timeout: float) -> ClusterModel:
    """A scheduler source, alone or joined with one usage source (`advisor.ingest.schedulers`)."""
    try:
        scheduler, usage = schedulers.parts_of(spec)
    except ValueError as error:
        raise SourceError(str(error)) from None
    try:
        view = schedulers.read_view(scheduler, timeout)
    except (slurm.SlurmUnavailable, slurm.SlurmFormatError) as error:
        raise SourceError(f"{scheduler.rstrip(':')}: {error}") from None
    except ValueError as error:  # a bad option of the scheduler's source
        raise SourceError(str(error)) from None
    usage_model = _load(usage[0], timeout) if usage else None
    return combine.build_model(view, usage_model, source=spec)


# usage samples of `history`/`step` read from Prometheus (in pieces of `prometheus.MAX_STEPS`):
# a month at one a minute, 0.36 GB of history for 1,000 GPUs
PROMETHEUS_MAX_SAMPLES = 31 * 24 * 60


@dataclasses.dataclass(frozen=True)
class PrometheusSpec:
    """`prometheus+http(s)://HOST:PORT[?at=&history=&step=]` taken apart."""

    base: str  # the server's URL, without the options
    at: float | None  # Unix time of the state (None: now)
    history_s: float  # usage history read before `at`
    step_s: float
    # `scheduler=kube-state-metrics`: the scheduler's view from its series, with its options
    scheduler: str = ""
    scheduler_options: dict[str, str] = dataclasses.field(default_factory=dict)


def _check_samples(
    spec: str,
    params: dict[str, str],
    history_s: float,
    step_s: float,
    default_step: str,
    most: int,
    span: str,
) -> None:
    """SourceError when `history`/`step` asks for more than `most` usage samples (`span` at one
    a minute): the history is held in memory for every GPU."""
    if history_s / step_s > most:
        raise SourceError(
            f"{spec}: history={params['history']} every step={params.get('step', default_step)} "
            f"is {history_s / step_s:,.0f} usage samples; at most {most:,} ({span} at one a "
            "minute): use a longer step"
        )


def prometheus_spec(spec: str) -> PrometheusSpec:
    """SourceError for an unknown option or a malformed value."""
    url = spec.strip().removeprefix("prometheus+")
    parts = urlsplit(url)
    params = _query(parts.query)
    scheduler = params.get("scheduler", "")
    if scheduler and scheduler != kube_state_metrics.KIND:
        raise SourceError(
            f"{spec}: scheduler={scheduler!r}: the one Prometheus can stand in for is "
            f"{kube_state_metrics.KIND}"
        )
    extra = set(kube_state_metrics.OPTIONS) | {"scheduler"} if scheduler else {"scheduler"}
    _only(params, {"at", "history", "step"} | extra, spec)
    try:
        at = float(params["at"]) if params.get("at") else None
    except ValueError:
        raise SourceError(f"{spec}: at={params['at']!r}: expected a Unix time in seconds") from None
    history_s = seconds(params.get("history", "1h"), "history", spec)
    step_s = max(seconds(params.get("step", "60s"), "step", spec), 1.0)
    _check_samples(spec, params, history_s, step_s, "60s", PROMETHEUS_MAX_SAMPLES, "a month")
    options = {k: v for k, v in params.items() if k in kube_state_metrics.OPTIONS}
    if scheduler:
        try:
            kube_state_metrics.parse_options(spec, options)
        except ValueError as error:
            raise SourceError(str(error)) from None
    return PrometheusSpec(
        base=parts._replace(query="", fragment="").geturl(),
        at=at,
        history_s=history_s,
        step_s=step_s,
        scheduler=scheduler,
        scheduler_options=options,
    )


def _prometheus(spec: str, timeout: float) -> ClusterModel:
    target = prometheus_spec(spec)
    if target.scheduler:
        return _kube_state_metrics(spec, target, timeout)
    return prometheus.load(
        target.base,
        timeout=timeout,
        at=target.at,
        history_s=target.history_s,
        step_s=target.step_s,
        source=spec,
    )


def _kube_state_metrics(spec: str, target: PrometheusSpec, timeout: float) -> ClusterModel:
    """Kubernetes' view from kube-state-metrics series, joined with the GPU exporters' series
    in the same Prometheus (none there: the scheduler's view alone, usage unknown)."""
    client = prometheus.PrometheusClient(target.base, timeout)
    at = time.time() if target.at is None else target.at
    view = kube_state_metrics.read_view(client, spec, target.scheduler_options, at)
    try:
        usage = prometheus.load(
            target.base,
            at=at,
            history_s=target.history_s,
            step_s=target.step_s,
            client=client,
            source=spec,
        )
    except prometheus.NoSeries:
        usage = None
    return combine.build_model(view, usage, source=spec)


def slurm_spec(spec: str) -> SlurmSpec:
    """A `slurm:` / `slurm+http(s)://` / `slurm+unix://` spec taken apart, nothing read;
    SourceError for an unknown option or a malformed value."""
    try:
        return slurm.parse_spec(spec)
    except slurm.SlurmSpecError as error:
        raise SourceError(redact(str(error))) from None


SIM_OPTIONS = {"seed", "t", "nodes", "history", "step"}
SIM_LARGE_NODES = 256  # above this a simulated instant costs ~0.5 s to build: less past is stepped
SIM_MAX_SAMPLES = 7 * 24 * 60  # usage samples of `history`/`step`: a week at one a minute


def sim_fleet(
    spec: str, options: set[str] = SIM_OPTIONS, why: str = ""
) -> tuple[SimFleet, dict[str, str]]:
    """The simulated fleet of `sim:PRESET[?seed=&nodes=...]` at t=0 and the spec's options;
    SourceError as `sim_spec` says."""
    from gpu_defrag_sim.fleet import SimFleet  # the simulator is heavy; import only when asked

    preset, seed, nodes, params = sim_spec(spec, options, why)
    return SimFleet(preset, seed, nodes), params


def sim_spec(
    spec: str, options: set[str] = SIM_OPTIONS, why: str = ""
) -> tuple[str, int, int | None, dict[str, str]]:
    """(preset, seed, nodes, options) of `sim:PRESET[?seed=&nodes=...]`, nothing simulated;
    SourceError for an option outside `options` (`why` says why it is refused), an unknown
    preset, a seed that is not a whole number >= 0, nodes outside 1..`MAX_NODES` or a `t`
    beyond `MAX_START_S` (the exporter's `--sim.nodes` and `--sim.start` bounds: the fleet's
    build grows as nodes², and reaching `t` steps every simulated hour before it)."""
    from gpu_defrag_sim.bounds import MAX_NODES, MAX_START_S
    from gpu_defrag_sim.presets import PRESETS

    preset, _, query = spec.removeprefix("sim:").partition("?")
    params = _query(query)
    _only(params, options, spec, why)
    if preset not in PRESETS:
        raise SourceError(f"{spec}: unknown preset {preset!r} (known: {', '.join(PRESETS)})")
    seed = _whole(params.get("seed", "42"), "seed", spec, 0)
    nodes = _whole(params["nodes"], "nodes", spec, 1, MAX_NODES) if params.get("nodes") else None
    if seconds(params.get("t", "0"), "t", spec) > MAX_START_S:
        raise SourceError(
            f"{spec}: t={params['t']}: at most {units.duration_text(MAX_START_S)} of simulated time"
        )
    return preset, seed, nodes, params


def _whole(text: str, name: str, spec: str, low: int, high: float = math.inf) -> int:
    """`name`=`text` of `spec` as a whole number in [low, high], else one SourceError line."""
    try:
        return units.number(low, high, kind=int)(text)
    except argparse.ArgumentTypeError as error:
        raise SourceError(f"{spec}: {name}={error}") from None


def _sim(spec: str) -> ClusterModel:
    fleet, params = sim_fleet(spec)
    end = seconds(params.get("t", "0"), "t", spec)
    asked = seconds(params.get("history", "0"), "history", spec)
    history = min(asked, end)
    step = max(seconds(params.get("step", "5m"), "step", spec), 1.0)
    _check_samples(spec, params, history, step, "5m", SIM_MAX_SAMPLES, "a week")
    if asked > end:  # the simulation starts at t=0: there is no past before it
        log.warning(
            "%s: history=%s reaches before the simulation's start (t=0): %s; use t=%s or later",
            spec,
            params["history"],
            f"only {units.duration_text(end)} of it exists" if end > 0 else "none of it exists",
            units.duration_text(asked),
        )
    samples: list[tuple[float, dict[tuple[str, int], tuple[float, float]]]] = []
    for at in np.arange(end - history, end, step) if history > 0 else ():
        fleet.advance(float(at) - fleet.now)
        samples.append((fleet.unix_time, _usage_of(fleet.readings())))
    fleet.advance(end - fleet.now)
    model = sim_model(fleet, spec)
    if history <= 0:
        return model
    samples.append((fleet.unix_time, _usage_of(fleet.readings())))
    return with_usage(model, samples)


def _usage_of(readings: list[NodeReading]) -> dict[tuple[str, int], tuple[float, float]]:
    nan = math.nan
    return {
        (node.node, gpu.index): (
            nan if gpu.utilization_ratio is None else gpu.utilization_ratio,
            nan if gpu.memory_used_bytes is None else gpu.memory_used_bytes,
        )
        for node in readings
        for gpu in node.gpus
    }


def with_usage(
    model: ClusterModel, samples: list[tuple[float, dict[tuple[str, int], tuple[float, float]]]]
) -> ClusterModel:
    """The model with a usage history from (time, {(node, gpu index): (util, memory)}) samples;
    GPUs a sample does not mention stay NaN there."""
    names = model.nodes.name[model.gpus.node].tolist()
    keys = list(zip(names, model.gpus.index.tolist(), strict=True))
    util = np.full((len(samples), len(keys)), np.nan, dtype=np.float32)
    memory = np.full_like(util, np.nan)
    for t, (_, values) in enumerate(samples):
        for g, key in enumerate(keys):
            if key in values:
                util[t, g], memory[t, g] = values[key]
    times = np.array([at for at, _ in samples], dtype=np.float64)
    return dataclasses.replace(model, usage=Usage(times, util, memory), _cache={})


def sim_model(fleet: SimFleet, source: str) -> ClusterModel:
    """The model of a `SimFleet` at its current time, with job facts (tenant, priority, start
    time, migratable) and pending jobs; callers that step one fleet through time use this
    instead of re-simulating from t=0 for every instant."""
    readings = fleet.readings()
    epoch = fleet.unix_time - fleet.now
    info = {}
    for job in fleet.running_jobs():
        for pod in job.pods.values():
            info[f"{job.namespace}/{pod}" if job.namespace else pod] = {
                "job": job.name,
                "tenant": job.tenant,
                "priority": job.priority,
                "migratable": job.migratable,
                "start_time": epoch + job.start if job.start is not None else math.nan,
                "creation_time": epoch + job.arrival,
            }
    models_by_pool: dict[str, set[str]] = {}
    for node in readings:
        models_by_pool.setdefault(node.pool, set()).update(g.model for g in node.gpus if g.model)
    pending = []
    for job in fleet.pending_jobs():
        fraction = job.gpus < 1
        pending.append(
            {
                "id": f"{job.namespace}/{job.name}" if job.namespace else job.name,
                "num_gpu": 1 if fraction else round(job.gpus),
                "gpu_milli": round(job.gpus * MILLI) if fraction else MILLI,
                "job": job.name,
                "tenant": job.tenant,
                "priority": job.priority,
                "migratable": job.migratable,
                "gpu_spec": "|".join(sorted(models_by_pool.get(job.pool, ()))),
                "creation_time": epoch + job.arrival,
            }
        )
    return from_readings(
        readings, timestamp=fleet.unix_time, source=source, allocation_info=info, pending=pending
    )


def _openb(spec: str) -> ClusterModel:
    paths = [p for p in spec.removeprefix("openb:").split(",") if p]
    if not paths or len(paths) > 2:
        raise SourceError(f"{spec}: expected openb:NODE_CSV[,POD_CSV] or openb:DIR")
    if len(paths) == 1 and Path(paths[0]).is_dir():
        paths = [str(Path(paths[0]) / OPENB_NODES), str(Path(paths[0]) / OPENB_PODS)]
    nodes = openb.read_nodes(paths[0])
    pods = openb.read_pods(paths[1]) if len(paths) == 2 else None
    return model_from_openb(nodes, pods, source=spec)


def model_from_openb(
    nodes: openb.NodeTable, pods: openb.PodTable | None, *, source: str = ""
) -> ClusterModel:
    """Trace nodes as an empty cluster and trace pods as pending demand, times kept.

    The trace has no placements (the replay makes them), no racks and no GPU memory sizes.
    """
    builder = ModelBuilder()
    for name, cpu, memory, count, gpu_model in zip(
        nodes.name.tolist(),
        nodes.cpu_milli.tolist(),
        nodes.memory_mib.tolist(),
        nodes.gpu.tolist(),
        nodes.model.tolist(),
        strict=True,
    ):
        builder.add_node(name, gpu_model=gpu_model, cpu_milli=cpu, memory_mib=memory)
        for index in range(count):
            builder.add_gpu(name, index)
    if pods is not None:
        columns = zip(
            pods.name.tolist(),
            pods.num_gpu.tolist(),
            pods.gpu_milli.tolist(),
            pods.cpu_milli.tolist(),
            pods.memory_mib.tolist(),
            pods.gpu_spec.tolist(),
            pods.qos.tolist(),
            pods.creation_time.tolist(),
            pods.deletion_time.tolist(),
            pods.scheduled_time.tolist(),
            strict=True,
        )
        for name, k, milli, cpu, memory, spec, qos, created, deleted, scheduled in columns:
            builder.add_allocation(
                name,
                num_gpu=k,
                gpu_milli=milli if k else 0,
                cpu_milli=cpu,
                memory_mib=memory,
                gpu_spec=spec,
                qos=qos,
                creation_time=created,
                deletion_time=deleted,
                scheduled_time=scheduled,
            )
    return builder.build(source=source)
