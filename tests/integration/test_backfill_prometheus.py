"""A restarted advisor reads its past from a real Prometheus and forecasts at once.

Sixty hours of a simulated fleet are imported into Debian's Prometheus as TSDB blocks
(`history_blocks`). `gpu-defrag advise` then starts on `prometheus+http://...` with
`--history.backfill 60h`: its first answer already has 24-h forecasts with their backtest, which
without the backfill would need 36 hours of runs.
"""

from __future__ import annotations

import json
import math
import time

from tests.integration import stack
from tests.integration.history_blocks import LOOKBACK, import_blocks, openmetrics_history

HOURS = 60


def test_a_restarted_advisor_reads_its_past_from_prometheus(tmp_path):
    procs = stack.Processes(tmp_path)
    end = math.floor(time.time() / 60) * 60 - 60  # a minute ago: the latest sample
    text, times = openmetrics_history(end, HOURS)
    import_blocks(text, tmp_path)
    try:
        url = stack.start_prometheus(procs, {}, [], extra=[LOOKBACK])
        oldest = stack.query(url, f"count(gpu_info @ {times[0] + 1:.3f})")
        assert oldest and float(oldest[0]["value"][1]) == 16, "the blocks are not served"
        advisor = stack.start_advisor(
            procs, f"prometheus+{url}", interval="5s", extra=["--history.backfill", f"{HOURS}h"]
        )
        doc = json.loads(stack.http_get(f"http://{advisor}/api/forecast"))
        assert doc["history_hours"] >= HOURS - 2, doc["history_hours"]
        horizons = {h["horizon"]: h for pool in doc["pools"] for h in pool["horizons"]}
        assert horizons["24h"]["available"], horizons["24h"]
        assert horizons["24h"]["backtest"]["test_origins"] >= 6
        log = (tmp_path / "advisor.log").read_text()
        assert f"backfilled {HOURS} past hour(s) of {HOURS} h from prometheus+{url}" in log, log
    except BaseException:
        print(procs.logs())
        raise
    finally:
        procs.stop_all()
