"""INPUT form `prometheus+http://HOST:PORT/?query=PROMQL[&capacity=PROMQL][&days=30][&step=3600][&by=LABEL]`.

Runs the range queries through `advisor.ingest.prometheus.PrometheusClient` (the one HTTP client)
and returns a Panel: one series per result series, named by the `by` label (default: all labels),
capacity matched by the same name. Missing steps stay NaN (masked), as for files.
"""

from __future__ import annotations

import argparse
import time
from urllib.parse import parse_qs, urlsplit

import pandas as pd

from advisor.forecast.io import Panel, from_long
from exporter.units import duration


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


def _positive(params: dict[str, str], name: str, default: float, parse) -> float:
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


def _frame(results, by: str | None, column: str) -> pd.DataFrame:
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
        parts.append(
            pd.DataFrame(
                {
                    "time": pd.to_datetime(times, unit="s"),
                    "series": name,
                    column: values,
                }
            )
        )
    return (
        pd.concat(parts, ignore_index=True)
        if parts
        else pd.DataFrame(columns=["time", "series", column])
    )


def read_prometheus(source: str, client=None, now: float | None = None) -> Panel:
    """Range-query Prometheus for the demand (and optional capacity) history."""
    parts = urlsplit(source.removeprefix("prometheus+"))
    params = _options(parts.query)
    step = _positive(params, "step", 3600.0, duration)
    days = _positive(params, "days", 30.0, float)
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
