"""`gpu-defrag backtest prometheus+http://…?query=…` on a real Prometheus holding 17 days.

Seventeen days of a simulated 2-node fleet (`history_blocks`) are imported into Debian's
Prometheus; the backtest's Prometheus input runs its range queries there: allocated GPUs per
node (`gpu_node_gpus - gpu_node_free_gpus`) with capacity (`gpu_node_gpus`). The panel it builds
must hold exactly the hourly values the exporter showed, and the CLI must write the full set of
results (metrics per node, horizon and model; the idle-window replay, since capacity is given).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
import urllib.parse

import pandas as pd

from advisor.forecast.io import load
from tests.integration import stack
from tests.integration.history_blocks import LOOKBACK, import_blocks, openmetrics_history

DAYS = 17
NAMES = frozenset({"gpu_node_gpus", "gpu_node_free_gpus"})
USED = "sum by (node) (gpu_node_gpus - gpu_node_free_gpus)"
CAPACITY = "sum by (node) (gpu_node_gpus)"


def _expected(text: str) -> dict[str, list[float]]:
    """Per node, the hourly allocated GPUs as the exporter showed them (gpus - free)."""
    values: dict[tuple[str, str], list[float]] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name, rest = line.split("{", 1)
        node = rest.split('node="', 1)[1].split('"', 1)[0]
        values.setdefault((name, node), []).append(float(line.rsplit(" ", 2)[1]))
    nodes = sorted({node for _, node in values})
    gpus, free = "gpu_node_gpus", "gpu_node_free_gpus"
    return {
        n: [g - f for g, f in zip(values[gpus, n], values[free, n], strict=True)] for n in nodes
    }


def _runs(values: list[float]) -> list[float]:
    """The values with consecutive repeats collapsed: the hourly readings a minute grid shows."""
    return [v for i, v in enumerate(values) if i == 0 or v != values[i - 1]]


def test_backtest_reads_days_of_demand_from_a_real_prometheus(tmp_path):
    procs = stack.Processes(tmp_path)
    end = math.floor(time.time() / 60) * 60 - 60
    text, _ = openmetrics_history(end, DAYS * 24, nodes=2, names=NAMES)
    import_blocks(text, tmp_path)
    expected = _expected(text)
    assert all(len(set(v)) > 1 for v in expected.values())  # the fleet's use moved
    try:
        # 17 days is past the default 15-day retention, which would drop the oldest hours
        retention = "--storage.tsdb.retention.time=30d"
        url = stack.start_prometheus(procs, {}, [], extra=[LOOKBACK, retention])
        query = urllib.parse.urlencode(
            {"query": USED, "capacity": CAPACITY, "days": DAYS, "step": 3600, "by": "node"}
        )
        spec = f"prometheus+{url}/?{query}"
        panel = load(spec)
        assert sorted(panel.series) == sorted(expected)
        for node, shown in expected.items():
            got = panel.values[node].dropna().tolist()
            assert len(got) >= DAYS * 24 - 2
            assert got == shown[-len(got) :]
            assert (panel.capacity[node].dropna() == 8).all()
        # at 1 min the 17 days are 24,481 steps, over Prometheus' 11,000 for one query; each
        # hourly reading shows for 59 of them (the lookback)
        minute = load(spec.replace("step=3600", "step=60"))
        for node, shown in expected.items():
            got = minute.values[node].dropna().tolist()
            assert len(got) >= (DAYS * 24 - 2) * 59
            changes = _runs(got)
            assert any(_runs(shown)[i : i + len(changes)] == changes for i in range(len(shown)))
        out = tmp_path / "out"
        started = time.perf_counter()
        flags = ["--horizons", "1,24", "--quantiles", "0.5,0.9", "--replays", "idle"]
        run = subprocess.run(
            [sys.executable, "-m", "advisor.cli", "backtest", spec, *flags, "--out", str(out)],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        took = time.perf_counter() - started
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
        metrics = pd.read_csv(out / "metrics.csv")
        assert set(metrics["series"]) == set(expected)
        assert set(metrics["horizon"]) == {1, 24}
        assert {"advisor", "naive", "seasonal_naive_24", "gbm"} <= set(metrics["model"])
        assert metrics[["mae", "pinball_q90", "coverage_q90"]].notna().all().all()
        picks = pd.read_csv(out / "picks.csv")
        assert picks["validated"].all(), picks  # 10 training days: picked, not defaulted
        decisions = pd.read_csv(out / "decisions.csv")
        idle = decisions[decisions["replay"] == "idle_window"]
        assert set(idle["series"]) == set(expected) and set(idle["window_h"]) == {1, 4}
        print(f"backtest of {DAYS} days x 2 nodes from Prometheus: {took:.1f} s")
    except BaseException:
        print(procs.logs())
        raise
    finally:
        procs.stop_all()


def test_an_unreachable_prometheus_is_one_line_and_writes_nothing(tmp_path):
    port = stack.free_port()
    out = tmp_path / "out"
    spec = f"prometheus+http://127.0.0.1:{port}/?query=up"
    run = subprocess.run(
        [sys.executable, "-m", "advisor.cli", "backtest", spec, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2
    assert run.stderr.count("\n") == 1 and "unreachable" in run.stderr, run.stderr
    assert not out.exists()
