"""The advisor's own bounded history: what it measured at each look at the cluster.

When the advisor reads exporters directly (no Prometheus), nobody else keeps a past, yet the
fragmentation trend, the allocated-but-idle window, demand forecasts, job ends and idle windows
all need one. Three trackers, one per module, each fed every observation by `History.append`:

- `observations`: `History` itself, the headline measures and per-pool and per-tenant demand of
  each observation and the per-GPU usage of the last hour (`History.with_usage`);
- `job_lifetimes`: how long jobs run (`JobLifetimes`, `History.finished_jobs()`);
- `node_hours`: per node, its held GPUs and capacity hour by hour (`NodeRecord`,
  `History.node_hours()`).
"""

from advisor.history.job_lifetimes import (
    FINISHED_COLUMNS,
    UNATTRIBUTED,
    FinishedJob,
    JobLifetimes,
    RunningJob,
    running_jobs,
)
from advisor.history.node_hours import NODE_HOURS, NodeHours, NodeRecord, NodeRows, node_rows
from advisor.history.observations import (
    POOL_COLUMNS,
    TREND_COLUMNS,
    History,
    Point,
    gpu_keys,
    headline,
    pool_rows,
    tenant_rows,
)

__all__ = [
    "FINISHED_COLUMNS",
    "NODE_HOURS",
    "POOL_COLUMNS",
    "TREND_COLUMNS",
    "UNATTRIBUTED",
    "FinishedJob",
    "History",
    "JobLifetimes",
    "NodeHours",
    "NodeRecord",
    "NodeRows",
    "Point",
    "RunningJob",
    "gpu_keys",
    "headline",
    "node_rows",
    "pool_rows",
    "running_jobs",
    "tenant_rows",
]
