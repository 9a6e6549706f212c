"""The `prometheus+` source on a real Prometheus whose GPU job has a target it cannot scrape.

Debian's Prometheus scrapes the sim exporter and a closed port in one job, `gpu-exporter`. The
read gives the exporter's sixteen nodes and warns once naming the closed port's target: the
advisor must not pass a smaller fleet off as the whole one (the `up == 0` query is checked by
the real PromQL engine here, where the unit tests use a stand-in).
"""

from __future__ import annotations

import logging

import pytest

from advisor.ingest import prometheus
from tests.integration import stack

pytestmark = pytest.mark.integration


def test_a_gpu_exporter_prometheus_cannot_scrape_is_named(tmp_path, caplog):
    procs = stack.Processes(tmp_path)
    dead = f"127.0.0.1:{stack.free_port()}"  # nothing listens there
    try:
        exporter = stack.start_exporter(procs)
        url = stack.start_prometheus(procs, {"gpu-exporter": [exporter, dead]}, [])

        def scraped() -> bool:  # both targets scraped once: the exporter's GPUs, the dead `up` 0
            up = {s["metric"]["instance"]: s["value"][1] for s in stack.query(url, "up")}
            return up.get(dead) == "0" and up.get(exporter) == "1"

        stack.poll(scraped, stack.CAP_S, "both targets scraped", procs=procs)
        with caplog.at_level(logging.WARNING, logger=prometheus.__name__):
            model = prometheus.load(url, history_s=0, timeout=5)
        assert len(model.nodes) == 16
        warnings = [  # the reader's own (a loaded machine may add urllib3's retry lines)
            r.getMessage()
            for r in caplog.records
            if r.levelno == logging.WARNING and r.name == prometheus.__name__
        ]
        assert warnings == [
            f"Prometheus at {url}: 1 GPU exporter target(s) down, their nodes are not in this "
            f"read: {dead} (job gpu-exporter: not scraped)"
        ]
    except BaseException:
        print(procs.logs())
        raise
    finally:
        procs.stop_all()
