"""Read the cluster model from Prometheus' HTTP API: an instant query for the state, a range
query for the usage history. Works with our exporter's names and with dcgm-exporter's.

Only the HTTP calls live in `PrometheusClient`; turning samples into readings is shared with the
direct scrape (`ingest.exporter_scrape`), so both sources give the same model for the same fleet.
The history is held to the same values a GPU can report (`exporter_scrape.impossible`): a point
outside them (a negative or above-1 utilization, a negative or beyond-2^53 byte count, an
infinity) or a memory-used point above the GPU's total (compared exactly, in float64, before the
history's float32 rounds it: a full GPU is kept) is a gap like a missing point, with one warning
per metric; the rest is read.

Each scrape target (Prometheus tells them apart by `instance`, else `job`) is read by its own
kind, as the direct scrape reads each URL: a target with our names is our exporter's (its DCGM_*
series, `--compat.dcgm-names`, are not read), any other with DCGM_* names dcgm-exporter's, so a
fleet mid roll-out (some nodes with our exporter, the rest with dcgm-exporter only) is read
whole. A GPU that two targets report (one exporter scraped by two jobs, our exporter and
dcgm-exporter on one node, two exporters of one kind) follows the direct scrape's rule
(`exporter_scrape.merge`): targets ordered our exporter's first, then dcgm-exporter's, each in
name order (ours carries the allocations, topology and MIG that dcgm-exporter lacks), the GPU is
read whole from the first that reports it, with one warning naming both targets. Its history is
read from the series of its state's kind (our names, or dcgm-exporter's in their units; a query
of a kind only where a target of that kind is read), taking at each step the point of the target
its state was read from, else of the first other target of that kind (in name order) that has
one there: never two targets' points blended in one step, and a target that replaced another (an
exporter restarted under a new address) still gives the history before it.

A GPU exporter Prometheus cannot scrape, or whose backend is down, has no GPU series to read:
the fleet is read without its node, and one warning names it (`warn_left_out`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import urlsplit

import numpy as np
import requests

from advisor.ingest.exporter_scrape import (
    MEMORY_USED,
    OUR_NAMES,
    SHOWN,
    UTILIZATION,
    Sample,
    SourceUnavailable,
    dcgm_readings_unchecked,
    drop_impossible,
    exact_bytes,
    first_few,
    impossible,
    merge,
    our_readings_unchecked,
)
from advisor.ingest.readings import from_readings
from advisor.model import ClusterModel, Usage
from exporter.contract import DCGM_COMPAT
from exporter.dcgm_page import canonical_name
from gpu_defrag_common import bounded_get, units
from gpu_defrag_common.messages import one_line

DCGM_UTIL = "DCGM_FI_DEV_GPU_UTIL"
DCGM_FB_USED = "DCGM_FI_DEV_FB_USED"
STATE_QUERY = f'{{__name__=~"{"|".join(OUR_NAMES)}|DCGM_.+"}}'
# steps per range query: Prometheus refuses more than 11,000 per series; a margin for its rounding
MAX_STEPS = 10_000
# The most one reply may hold. The largest is a range query piece (at most MAX_STEPS steps):
# a point is 20-40 bytes of JSON (`[1700000060,"0.45"],` to `[1700000060.5,"0.4499999999"],`
# with a long float), so 1,000 GPUs x 10,000 steps is 200-400 MB. 512 MiB reads that; a larger
# reply is a broken server or a fleet beyond one query, refused rather than read until memory
# runs out.
MAX_REPLY_BYTES = 512 * 2**20
# Targets Prometheus cannot scrape, and exporters whose GPU backend is down: a GPU exporter's
# among them is a node this read leaves out (its series went stale), said in one warning.
DOWN_QUERY = "up == 0 or gpu_exporter_backend_up == 0"
QUERY_SHOWN = 80  # characters of a query an error line quotes (the state query has ~450)
NO_TARGET = "(no instance or job label)"  # the one target of series that name none
TARGET_ORDER = "(our exporter's targets first, then dcgm-exporter's, each in name order)"
TARGET_ORDER_AFTER_RESTART = (  # within LEFTOVER_WINDOW_S of a Prometheus start
    "(our exporter's targets first, then dcgm-exporter's, each those scraped since Prometheus "
    "started first, then in name order)"
)

# After Prometheus starts, series of its previous process that were not scraped again have no
# stale marker and answer instant queries for the lookback (5 min by default): an allocation
# that ended during the outage beside the one that replaced it on the same GPU. Instants this
# long after the start cannot see them (a lookback up to 15 min is covered).
LEFTOVER_WINDOW_S = 15 * 60.0
# A scrape writes every sample of a target with one timestamp (exporters send none of their
# own); a series older than its target's newest by more than this was not in the last scrape.
SCRAPE_SKEW_S = 0.5
NAME_LABEL = "gpu_defrag_name"  # names each series of the timestamps query (timestamp() drops it)
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_UNASKED = object()
_T = TypeVar("_T")
log = logging.getLogger(__name__)


class NoSeries(SourceUnavailable):
    """Prometheus answered, but holds no GPU series at that time (before its retention, before
    the fleet was scraped, or a scrape gap): nothing to read, rather than a broken source."""


class PrometheusClient:
    """Instant and range queries with a timeout; every failure is one SourceUnavailable line."""

    def __init__(
        self, base_url: str, timeout: float = 10.0, session: requests.Session | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.session = session or bounded_get.new_session()
        self._started: float | object | None = _UNASKED

    def _get(self, path: str, params: dict[str, Any]) -> dict[str, Any]:
        url = f"{self.base_url}{path}"
        try:
            response = bounded_get.get(
                url, self.timeout, cap=MAX_REPLY_BYTES, session=self.session, params=params
            )
        except requests.Timeout:
            raise SourceUnavailable(
                f"Prometheus at {self.base_url} unreachable: no answer within {self.timeout:g} s"
            ) from None
        except bounded_get.AnswerTooSlow:
            raise SourceUnavailable(
                f"Prometheus at {self.base_url}: no complete reply to {path} "
                f"within {self.timeout:g} s"
            ) from None
        except bounded_get.AnswerTooLarge:
            raise SourceUnavailable(
                f"Prometheus at {self.base_url}: reply to {path} larger than "
                f"{units.size_text(MAX_REPLY_BYTES)}"
            ) from None
        except requests.RequestException as error:
            raise SourceUnavailable(
                f"Prometheus at {self.base_url} unreachable: {type(error).__name__}"
            ) from None
        try:
            body = response.json()
        except ValueError:
            raise SourceUnavailable(
                f"Prometheus at {self.base_url}: HTTP {response.status_code}, not an API reply"
            ) from None
        if not isinstance(body, dict) or "status" not in body:
            raise self._malformed(params, f"HTTP {response.status_code}, no API status")
        if response.status_code != 200 or body.get("status") != "success":
            raise SourceUnavailable(
                f"Prometheus at {self.base_url}: query failed "
                f"({body.get('errorType', response.status_code)}: {body.get('error', '')})"
            )
        if not isinstance(body.get("data"), dict):
            raise self._malformed(params, "no data object")
        return body["data"]

    def _malformed(self, params: dict[str, Any], why: str) -> SourceUnavailable:
        """The one-line error for a reply that is not the API's shape: a proxy, another
        service on the port, or a broken Prometheus must not become a traceback."""
        query = str(params.get("query", ""))
        if len(query) > QUERY_SHOWN:
            query = query[: QUERY_SHOWN - 1] + "…"
        return SourceUnavailable(
            f"Prometheus at {self.base_url}: malformed reply to {query} ({why})"
        )

    def _results(self, path: str, params: dict[str, Any], parse: Callable[[Any], _T]) -> list[_T]:
        """`parse` applied to each series of the reply's `result` list; any parse failure is
        the malformed-reply error, naming the query and the first problem."""
        data = self._get(path, params)
        try:
            result = data.get("result", [])
            if not isinstance(result, list):
                raise TypeError(f"result is {type(result).__name__}, not a list")
            return [parse(series) for series in result]
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as error:
            raise self._malformed(params, _problem(error)) from None

    def start_time(self) -> float | None:
        """When this Prometheus process started (`/api/v1/status/runtimeinfo`), or None when
        it does not say (an older release, Thanos, Mimir, VictoriaMetrics...). Asked once."""
        if self._started is _UNASKED:
            try:
                data = self._get("/api/v1/status/runtimeinfo", {})
                self._started = _rfc3339(str(data["startTime"]))
            except (SourceUnavailable, KeyError, ValueError):
                self._started = None
        return self._started  # type: ignore[return-value]

    def instant(self, query: str, at: float | None = None) -> list[Sample]:
        """(metric name, labels without __name__, value) of each series of an instant vector."""
        params: dict[str, Any] = {"query": query}
        if at is not None:
            params["time"] = at
        return self._results("/api/v1/query", params, _instant_sample)

    def range(
        self, query: str, start: float, end: float, step: float
    ) -> list[tuple[str, dict[str, str], np.ndarray, np.ndarray]]:
        """(name, labels, times, values) of each series of a range query.

        Prometheus refuses a query of more than 11,000 steps ("exceeded maximum resolution"), so
        a longer one (a week at 15 s, a year hourly) is sent as consecutive pieces of the same
        grid and each series is joined back in time order, in the order it first appears."""
        pieces = []
        for first, last in range_pieces(start, end, step):
            params = {"query": query, "start": first, "end": last, "step": step}
            pieces.append(self._results("/api/v1/query_range", params, _range_series))
        if len(pieces) == 1:
            return pieces[0]
        joined: dict[tuple[str, tuple[tuple[str, str], ...]], list] = {}
        for piece in pieces:
            for name, labels, stamps, values in piece:
                key = (name, tuple(sorted(labels.items())))
                joined.setdefault(key, [name, labels, [], []])
                joined[key][2].append(stamps)
                joined[key][3].append(values)
        return [
            (name, labels, np.concatenate(stamps), np.concatenate(values))
            for name, labels, stamps, values in joined.values()
        ]


def range_pieces(start: float, end: float, step: float) -> list[tuple[float, float]]:
    """[first, last] evaluation times of consecutive range queries of at most `MAX_STEPS` steps
    each that together cover the grid start, start + step, … ≤ end exactly once."""
    steps = max(0, math.floor((end - start) / step)) + 1
    return [
        (start + k * step, min(end, start + (min(k + MAX_STEPS, steps) - 1) * step))
        for k in range(0, steps, MAX_STEPS)
    ]


def _problem(error: Exception) -> str:
    """A parse error on one line; a KeyError names the missing field."""
    if isinstance(error, KeyError):
        return f"missing {error.args[0]!r}" if error.args else "missing field"
    return one_line(error)


def _labels(series: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """(name, labels without __name__); labels must be strings, as the API sends them."""
    labels = series["metric"]
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        raise TypeError("metric is not a mapping of label names to strings")
    labels = dict(labels)
    return labels.pop("__name__", ""), labels


def _instant_sample(series: dict[str, Any]) -> Sample:
    name, labels = _labels(series)
    return name, labels, float(series["value"][1])


def _range_series(series: dict[str, Any]) -> tuple[str, dict[str, str], np.ndarray, np.ndarray]:
    name, labels = _labels(series)
    values = series.get("values", [])
    if not all(isinstance(point, list) and len(point) == 2 for point in values):
        raise ValueError("a point is not [time, value]")
    points = np.array(values, dtype=np.float64).reshape(-1, 2)
    return name, labels, points[:, 0], points[:, 1]


def _host(labels: dict[str, str]) -> str:
    instance = labels.get("instance", "")
    return urlsplit(f"//{instance}").hostname or instance or "prometheus"


def _target(labels: dict[str, str]) -> str:
    """The scrape target a series came from: its `instance` label, else its `job` label."""
    return labels.get("instance") or labels.get("job") or NO_TARGET


def _gpu_key(labels: dict[str, str], dcgm: bool) -> tuple[str, int] | None:
    """(node, gpu index) a series belongs to, as the readings name it."""
    index = labels.get("gpu", "")
    if not index.isdigit():
        return None
    node = labels.get("node", "") if not dcgm else ""
    if dcgm:
        node = labels.get("Hostname") or labels.get("hostname") or _host(labels)
    return (node, int(index)) if node else None


def load(
    base_url: str,
    *,
    timeout: float = 10.0,
    at: float | None = None,
    history_s: float = 3600.0,
    step_s: float = 60.0,
    source: str = "",
    client: PrometheusClient | None = None,
    check_left_out: bool = True,
) -> ClusterModel:
    """The model at `at` (default now) with `history_s` of usage at `step_s` resolution.

    Each scrape target is read by its own kind: our names where it has them, else
    dcgm-exporter's. `check_left_out` False skips asking which GPU exporters were down (a
    backfill of past hours: the targets down then are no news now).
    """
    client = client or PrometheusClient(base_url, timeout)
    end = time.time() if at is None else at
    by_target: dict[str, list[Sample]] = defaultdict(list)
    samples, newest = latest_only(client, client.instant(STATE_QUERY, end), end)
    for sample in samples:
        by_target[_target(sample[1])].append(sample)
    kinds: dict[str, bool] = {}  # target -> read as dcgm-exporter's (else as ours)
    read: dict[str, list[Sample]] = {}
    for target, group in by_target.items():
        ours = [s for s in group if s[0] in OUR_NAMES and "node" in s[1]]
        dcgm = [s for s in group if canonical_name(s[0]).startswith("DCGM_")]
        if ours or dcgm:
            kinds[target], read[target] = not ours, ours or dcgm
    if not read:
        raise NoSeries(
            f"Prometheus at {base_url}: no gpu_* (gpu-defrag exporter) or DCGM_* "
            "(dcgm-exporter) series found"
        )
    notes: list[str] = []  # what the readers leave out, for drop_impossible's one warning
    started = client.start_time() if newest else None
    stale_before = started if started is not None and started <= end else -math.inf
    per_target = [
        (
            target,
            dcgm_readings_unchecked({_host(read[target][0][1]): read[target]})
            if kinds[target]
            else our_readings_unchecked(read[target], notes),
        )
        # ours first; within a kind a target scraped since a Prometheus restart before one not
        # (a leftover of the old process), then by name
        for target in sorted(read, key=lambda t: (kinds[t], newest.get(t, end) < stale_before, t))
    ]
    left_out = tuple(warn_left_out(client, read, end)) if check_left_out else ()
    order = TARGET_ORDER_AFTER_RESTART if newest else TARGET_ORDER
    merged, sources = merge(per_target, what="Prometheus scrape target", order=order)
    drop_impossible(merged, notes)
    model = from_readings(merged, timestamp=end, source=source or f"prometheus+{base_url}")
    model = dataclasses.replace(model, left_out=left_out, _cache={})
    if history_s <= 0:
        return model
    return _with_history(model, client, end - history_s, end, step_s, kinds, sources)


def latest_only(
    client: PrometheusClient, samples: list[Sample], at: float
) -> tuple[list[Sample], dict[str, float]]:
    """The samples of an instant query without the leftovers of a restarted Prometheus, and
    each target's newest scrape time ({} when no leftovers can be there).

    A series Prometheus stops seeing gets a stale marker and drops out of instant queries at
    once, but only in the process that scraped it: after a restart, series the old process
    wrote answer for the whole lookback beside the ones that replaced them (an ended pod's
    allocation beside the new pod's on one GPU: "oversubscribed", and the reading was refused
    for minutes). Every sample of one scrape carries that scrape's time, so a series older than
    its target's newest scrape was not in that scrape: it is dropped, as its stale marker would
    have dropped it, with one warning. Asked only within `LEFTOVER_WINDOW_S` of the process's
    start (or when Prometheus does not say when it started); a failure of the extra query is
    logged and the samples are read as they are."""
    started = client.start_time()
    if started is not None and started + LEFTOVER_WINDOW_S <= at:
        return samples, {}
    names = sorted({name for name, _, _ in samples if _METRIC_NAME.fullmatch(name)})
    if not names:
        return samples, {}
    try:
        stamps = client.instant(_timestamps_query(names), at)
    except SourceUnavailable as error:
        log.info("cannot tell leftover series of a restarted Prometheus: %s", error)
        return samples, {}
    when: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for _, labels, value in stamps:
        name = labels.pop(NAME_LABEL, "")
        when[(name, tuple(sorted(labels.items())))] = value
    newest: dict[str, float] = {}
    for name, labels, _ in samples:
        stamp = when.get((name, tuple(sorted(labels.items()))))
        if stamp is not None:
            target = _target(labels)
            newest[target] = max(newest.get(target, -math.inf), stamp)
    kept, dropped = [], []
    for sample in samples:
        name, labels, _ = sample
        stamp = when.get((name, tuple(sorted(labels.items()))))
        if stamp is not None and stamp < newest[_target(labels)] - SCRAPE_SKEW_S:
            dropped.append(f"{name}{_shown_labels(labels)}")
        else:
            kept.append(sample)
    if dropped:
        log.warning(
            "Prometheus at %s: %d series not in their target's latest scrape (left over from "
            "before a Prometheus restart, without stale markers) are not read: %s",
            client.base_url,
            len(dropped),
            first_few(dropped),
        )
    return kept, newest


def _timestamps_query(names: list[str]) -> str:
    """Each series' sample time: `timestamp()` of every name, the name kept in a label (the
    function drops `__name__`, and `or` would merge series of equal labels)."""
    return " or ".join(
        f'label_replace(timestamp({{__name__="{name}"}}), "{NAME_LABEL}", "{name}", "", "")'
        for name in names
    )


def _shown_labels(labels: Mapping[str, str]) -> str:
    inner = ",".join(f'{k}="{v[:40]}"' for k, v in sorted(labels.items()) if k != "job")
    return f"{{{inner}}}"


def _rfc3339(text: str) -> float:
    """Seconds since the epoch of an RFC 3339 time with up to nanoseconds ("...45.1234567Z")."""
    head, dot, rest = text.replace("Z", "+00:00").partition(".")
    if dot:
        digits = re.match(r"\d*", rest).group(0)  # type: ignore[union-attr]
        rest = digits[:6].ljust(6, "0") + rest[len(digits) :]
        text = f"{head}.{rest}"
    else:
        text = head
    return datetime.fromisoformat(text).timestamp()


def warn_left_out(
    client: PrometheusClient, read: Mapping[str, list[Sample]], at: float
) -> list[str]:
    """Warn once naming the GPU exporters this read leaves out, and return them: a target of a
    job that serves GPUs here which Prometheus cannot scrape (`up` 0), or one whose backend is
    down and that serves no GPU (its last good series, kept a few intervals, are read). A direct
    scrape refuses such a fleet; here one node of hundreds down is routine, so the rest is read,
    but the analysis must not pass a smaller fleet off as the whole one. The query is advisory:
    its failure is logged, not raised (the state query has already answered)."""
    try:
        samples = client.instant(DOWN_QUERY, at)
    except SourceUnavailable as error:
        log.info("cannot tell which GPU exporters are down: %s", error)
        return []
    jobs = {labels.get("job") for group in read.values() for _, labels, _ in group}
    down: dict[str, str] = {}
    for name, labels, _ in samples:
        target = _target(labels)
        if target in read:
            continue  # its GPUs were read
        if name == "up" and labels.get("job") in jobs:
            down[target] = f"{target} (job {labels['job']}: not scraped)"
        elif name == "gpu_exporter_backend_up":
            down[target] = f"{target} ({labels.get('backend') or 'GPU'} backend down)"
    left = [down[target] for target in sorted(down)]
    if left:
        log.warning(
            "Prometheus at %s: %d GPU exporter target(s) down, their nodes are not in this read: "
            "%s",
            client.base_url,
            len(left),
            first_few(left),
        )
    return left


def _with_history(
    model: ClusterModel,
    client: PrometheusClient,
    start: float,
    end: float,
    step: float,
    kinds: Mapping[str, bool],
    sources: Mapping[tuple[str, int], str],
) -> ClusterModel:
    """Attach utilization and memory history on the common step grid (gaps stay NaN); a value
    no GPU can report (memory used above the GPU's total included) is a gap too, counted in one
    warning per metric naming the first few. `kinds` says which targets are read as
    dcgm-exporter's (the rest as ours): each kind's queries run only if a target of it is read,
    and a GPU's history comes from the series of its `sources` target's kind, each step the
    point of that target, else of the first other target of that kind by name."""
    steps = math.floor((end - start) / step) + 1
    times = start + step * np.arange(steps)
    rows = {
        (model.nodes.name[n], int(i)): r
        for r, (n, i) in enumerate(zip(model.gpus.node, model.gpus.index, strict=True))
    }
    dcgm_of = {key: kinds[target] for key, target in sources.items()}  # a GPU's kind
    needed = sorted(set(kinds.values()))  # ours (False) first, then dcgm-exporter's
    util_scale = 1.0 / DCGM_COMPAT[DCGM_UTIL][1]
    memory_scale = 1.0 / DCGM_COMPAT[DCGM_FB_USED][1]
    # the GpuReading attribute whose bounds apply -> (read as dcgm -> query, scale to the
    # model's unit)
    metrics: dict[str, dict[bool, tuple[str, float]]] = {
        "utilization_ratio": {False: (UTILIZATION, 1.0), True: (DCGM_UTIL, util_scale)},
        "memory_used_bytes": {False: (MEMORY_USED, 1.0), True: (DCGM_FB_USED, memory_scale)},
    }
    matrices = []
    for attr, queries in metrics.items():
        out = np.full((steps, len(model.gpus)), np.nan, dtype=np.float32)
        # the GPU's total where a point above it is impossible (NaN, unknown: no check)
        totals = model.gpus.memory_total_bytes if attr == "memory_used_bytes" else None
        notes: list[str] = []  # the first SHOWN of `dropped` impossible points
        dropped = 0
        named: set[str] = set()  # the queries points were dropped from
        found = []  # ((not the state's target, target), GPU, times, values, scale, query)
        for dcgm in needed:
            query, scale = queries[dcgm]
            for _, labels, stamps, values in client.range(query, start, end, step):
                if dcgm and labels.get("GPU_I_ID"):
                    continue  # a MIG instance's series, not the whole GPU
                key = _gpu_key(labels, dcgm)
                if key is None or key not in rows or dcgm_of.get(key) != dcgm:
                    continue  # not a GPU of the model, or one read from the other kind
                target = _target(labels)
                if kinds.get(target, dcgm) != dcgm:
                    continue  # our exporter's DCGM_* names: not read, as in the state
                preferred = (target != sources[key], target)
                found.append((preferred, key, stamps, values, scale, query))
        # preferred targets first; a step a series fills is not filled again by a later one
        for _, key, stamps, values, scale, query in sorted(found, key=lambda series: series[0]):
            row = rows[key]
            at = np.rint((stamps - start) / step).astype(np.int64)
            keep = (at >= 0) & (at < steps)
            stamps, values, at = stamps[keep], values[keep], at[keep]
            scaled = values * scale  # float64: a byte count exact up to 2^53
            bad = impossible(attr, scaled)
            above = scaled > totals[row] if totals is not None else np.zeros_like(bad)
            drop = bad | above
            dropped += int(drop.sum())
            if drop.any():
                named.add(query)
            for i in np.flatnonzero(drop)[: max(0, SHOWN - len(notes))]:  # a week: many
                where = f"{key[0]}/gpu{key[1]}"
                if bad[i]:
                    notes.append(f"{where}={values[i]:g} at {stamps[i]:.15g}")
                else:
                    notes.append(
                        f"{where} {exact_bytes(scaled[i])} > memory_total_bytes="
                        f"{exact_bytes(totals[row])} at {stamps[i]:.15g}"
                    )
            free = np.isnan(out[at, row])
            out[at[free], row] = np.where(drop, np.nan, scaled)[free]
        if dropped:
            log.warning(
                "Prometheus at %s: %d impossible value(s) in the %s history read as unknown: %s",
                client.base_url,
                dropped,
                " and ".join(queries[d][0] for d in needed if queries[d][0] in named),
                first_few(notes, dropped),
            )
        matrices.append(out)
    return dataclasses.replace(model, usage=Usage(times, matrices[0], matrices[1]), _cache={})
