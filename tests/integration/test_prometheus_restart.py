"""The `prometheus+` source right after a real Prometheus restarts (Debian's, same TSDB).

Before the restart the exporter page says pod "old" holds GPU 0; while Prometheus is down the
pod is replaced by "new". The restarted Prometheus has no stale marker for the old series (the
process that would have written it is gone), so for its lookback (5 min) an instant query
returns both holders of one whole GPU: the advisor refused the reading as "oversubscribed:
2000 milli-GPU allocated > 1000" until the old series aged out, and served stale results ~2.5
minutes past the outage. The read must give the new holder only, at once.
"""

from __future__ import annotations

import logging

import pytest

from advisor.ingest import prometheus
from tests.fakes.page_server import Routes, serve
from tests.integration import stack

pytestmark = pytest.mark.integration


def page(pod: str) -> str:
    lines = [f'gpu_info{{gpu="{i}",node="n1",uuid="GPU-{i}",model="A100"}} 1' for i in (0, 1)]
    # GPU 1 is idle: busy without an owner it would be "in use, owner unknown", not free
    lines += [f'gpu_utilization_ratio{{gpu="{i}",node="n1"}} {u}' for i, u in ((0, 0.5), (1, 0))]
    lines.append(
        f'gpu_allocation_info{{gpu="0",node="n1",pod="{pod}",namespace="ml",gpu_milli="1000"}} 1'
    )
    return "\n".join(lines) + "\n"


def holders(url: str) -> set[str]:
    return {s["metric"]["pod"] for s in stack.query(url, "gpu_allocation_info")}


def test_the_read_right_after_a_restart_takes_each_targets_latest_scrape(tmp_path, caplog):
    routes = Routes()
    routes.text("/metrics", page("old"))
    procs = stack.Processes(tmp_path)
    try:
        with serve(routes) as base:
            target = base.removeprefix("http://")
            url = stack.start_prometheus(procs, {"gpu-exporter": target}, [])
            stack.poll(lambda: holders(url) == {"old"}, 30, "the old pod scraped")
            procs.stop_all()  # a clean shutdown: the samples are in the TSDB's WAL
            routes.text("/metrics", page("new"))  # the pod was replaced during the outage
            procs = stack.Processes(tmp_path)
            url = stack.start_prometheus(procs, {"gpu-exporter": target}, [])
            # the condition itself, in the real PromQL engine: both holders answer
            stack.poll(lambda: holders(url) == {"old", "new"}, 30, "the new pod scraped")
            with caplog.at_level(logging.WARNING, logger=prometheus.__name__):
                model = prometheus.load(url, history_s=0, timeout=5)
        assert model.allocations.id.tolist() == ["ml/new"]
        assert model.gpu_milli_allocated.tolist() == [1000, 0]
        warnings = [  # the reader's own (a loaded machine may add urllib3's retry lines)
            r.getMessage()
            for r in caplog.records
            if r.levelno == logging.WARNING and r.name == prometheus.__name__
        ]
        assert len(warnings) == 1 and 'pod="old"' in warnings[0], warnings
    except BaseException:
        print(procs.logs())
        raise
    finally:
        procs.stop_all()
