"""INPUT form `prometheus+http://HOST:PORT/?query=PROMQL[&capacity=PROMQL][&days=30][&step=3600][&by=LABEL]`.

Runs the range queries through `advisor.ingest.prometheus.PrometheusClient` (the one HTTP client)
and returns a Panel: one series per result series, named by the `by` label (default: all labels),
capacity matched by the same name. Missing steps stay NaN (masked), as for files, and so does a
NaN sample (stale, 0/0). The long format's bounds hold for every reading: a value or capacity
that is negative, infinite or above `MAX_AMOUNT`, or a time outside the years 1970–2200, is one
line naming the series, the time and the reading (a reply has no rows to name).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

import pandas as pd

from advisor.forecast.panel import Panel
from advisor.forecast.readers.checks import (
    END_TIME,
    FIRST_TIME,
    MAX_STEPS,
    OUTSIDE_YEARS,
    bad_amounts,
    refuse,
)
from advisor.forecast.readers.long import from_long
from gpu_defrag_common.units import duration

if TYPE_CHECKING:
    from advisor.ingest.prometheus import PrometheusClient


def _name(labels: dict[str, str], by: str | None) -> str:
    if by and by in labels:
        return labels[by]
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "series"


OPTIONS = {
    "query": "PromQL",
    "capacity": "PromQL",
    "days": "a number of days > 0, e.g. days=30",
    "step": "seconds > 0 or a duration, e.g. step=3600 or step=1h",
    "by": "a label name, e.g. by=pool",
}


def _options(query: str) -> dict[str, str]:
    """The URL's options; an unknown one is refused (a typo such as `day=` would be ignored)."""
    params = {k: v[0] for k, v in parse_qs(query, keep_blank_values=True).items()}
    unknown = sorted(set(params) - set(OPTIONS))
    if unknown:
        raise ValueError(
            f"unknown prometheus input option {unknown[0]!r}; known: {', '.join(OPTIONS)}"
        )
    if not params.get("query"):
        raise ValueError("prometheus input needs ?query=<PromQL> (e.g. sum by (pool) (...))")
    return params


def _positive(
    params: dict[str, str], name: str, default: float, parse: Callable[[str], float]
) -> float:
    """Option `name` as a finite number > 0, or an error naming the option and its form."""
    text = params.get(name)
    if text is None:
        return default
    try:
        value = float(parse(text))
    except (ValueError, argparse.ArgumentTypeError):
        value = float("nan")
    if not 0 < value < float("inf"):  # false for nan too
        raise ValueError(f"prometheus input option {name}={text!r}: needs {OPTIONS[name]}")
    return value


def _refuse(
    frame: pd.DataFrame,
    bad: pd.Series,
    what: str,
    reading: Callable[[int], str],
    why: Callable[[int], str],
) -> None:
    """`io.refuse` naming the series of the first bad reading and the reading (`reading(i)`):
    a reply has no rows to name."""
    refuse(bad, what, lambda i: f"series {frame['series'].iloc[i]!r} {reading(i)}", why)


def _frame(
    results: list[tuple[str, dict[str, str], Any, Any]], by: str | None, column: str
) -> pd.DataFrame:
    """The long frame of one query's reply, its times and readings held to the long format's
    bounds (a NaN reading is masked)."""
    parts = []
    named: dict[str, dict[str, str]] = {}
    for _metric, labels, times, values in results:
        name = _name(labels, by)
        if name in named:
            raise ValueError(
                f"two result series are both named {name!r} ({named[name]} and {labels}); "
                f"aggregate them in the query, e.g. sum by ({by or 'pool'}) (…)"
            )
        named[name] = labels
        parts.append(pd.DataFrame({"seconds": times, "series": name, column: values}))
    if not parts:
        return pd.DataFrame(columns=["time", "series", column])
    frame = pd.concat(parts, ignore_index=True)
    # on the epoch seconds, before pandas' clock (1677–2262) could overflow on them
    seconds = frame.pop("seconds")
    first, end = (t.timestamp() for t in (FIRST_TIME, END_TIME))
    outside = ~((seconds >= first) & (seconds < end))  # NaN too
    _refuse(
        frame,
        outside,
        "time",
        lambda i: f"time {seconds.iloc[i]:.15g} (epoch seconds)",
        lambda _i: OUTSIDE_YEARS,
    )
    frame.insert(0, "time", pd.to_datetime(seconds.to_numpy(), unit="s"))
    readings = frame[column]
    _numbers, bad, why = bad_amounts(readings)
    _refuse(
        frame,
        bad,
        column,
        lambda i: f"{column} {readings.iloc[i]:.15g} at {frame['time'].iloc[i].isoformat()}Z",
        why,
    )
    return frame


def read_prometheus(
    source: str, client: PrometheusClient | None = None, now: float | None = None
) -> Panel:
    """Range-query Prometheus for the demand (and optional capacity) history."""
    parts = urlsplit(source.removeprefix("prometheus+"))
    params = _options(parts.query)
    step = _positive(params, "step", 3600.0, duration)
    days = _positive(params, "days", 30.0, float)
    if days * 86400 / step + 1 > MAX_STEPS:
        raise ValueError(
            f"days={params['days']} at step={params.get('step', '3600')} is "
            f"{days * 86400 / step + 1:,.0f} steps per series; at most {MAX_STEPS:,}: use a "
            "longer step or fewer days"
        )
    end = now if now is not None else time.time()
    start = end - days * 86400
    if client is None:
        from advisor.ingest.prometheus import PrometheusClient

        client = PrometheusClient(f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}")
    by = params.get("by")
    frame = _frame(client.range(params["query"], start, end, step), by, "value")
    if frame.empty:
        raise ValueError(f"the query returned no series over the last {days:g} days")
    if "capacity" in params:
        cap = _frame(client.range(params["capacity"], start, end, step), by, "capacity")
        frame = frame.merge(cap, on=["time", "series"], how="left")
    return from_long(frame, name="prometheus", freq=pd.Timedelta(seconds=step))
