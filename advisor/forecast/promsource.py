"""INPUT form `prometheus+http://HOST:PORT/?query=PROMQL[&capacity=PROMQL][&days=30][&step=3600][&by=LABEL]`.

Runs the range queries through `advisor.ingest.prometheus.PrometheusClient` (the one HTTP client)
and returns a Panel: one series per result series, named by the `by` label (default: all labels),
capacity matched by the same name. Missing steps stay NaN (masked), as for files.
"""

from __future__ import annotations

import time
from urllib.parse import parse_qs, urlsplit

import pandas as pd

from advisor.forecast.io import Panel, from_long


def _name(labels: dict[str, str], by: str | None) -> str:
    if by and by in labels:
        return labels[by]
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "series"


def _frame(results, by: str | None, column: str) -> pd.DataFrame:
    parts = []
    for _metric, labels, times, values in results:
        parts.append(
            pd.DataFrame(
                {
                    "time": pd.to_datetime(times, unit="s"),
                    "series": _name(labels, by),
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
    params = {k: v[0] for k, v in parse_qs(parts.query).items()}
    if "query" not in params:
        raise ValueError("prometheus input needs ?query=<PromQL> (e.g. sum by (pool) (...))")
    step = float(params.get("step", 3600))
    end = now if now is not None else time.time()
    start = end - float(params.get("days", 30)) * 86400
    if client is None:
        from advisor.ingest.prometheus import PrometheusClient

        client = PrometheusClient(f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}")
    by = params.get("by")
    frame = _frame(client.range(params["query"], start, end, step), by, "value")
    if frame.empty:
        days = params.get("days", 30)
        raise ValueError(f"the query returned no series over the last {days} days")
    if "capacity" in params:
        cap = _frame(client.range(params["capacity"], start, end, step), by, "capacity")
        frame = frame.merge(cap, on=["time", "series"], how="left")
    return from_long(frame, name="prometheus", freq=pd.Timedelta(seconds=step))
