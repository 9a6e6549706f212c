"""Cost of the advisor's start-up backfill from a real Prometheus, against one live read.

A simulated fleet's exporter series, one sample an hour over `--hours`, are imported into
Debian's Prometheus with `promtool tsdb create-blocks-from openmetrics` (served with a 59-minute
lookback, `tests/integration/history_blocks.py`). Then, on the same Prometheus:
- baseline: one live read of the source (`load_source("prometheus+…")`, state plus an hour of
  usage history), the advisor's work at every run;
- the backfill (`advisor.ingest.backfill.from_prometheus`) over all the hours.

    python bench/service_backfill.py --nodes 16 --hours 168
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo's exporter, not bench/'s

from advisor.ingest.backfill import from_prometheus
from advisor.ingest.sources import load_source
from bench.machine import describe
from tests.integration import stack
from tests.integration.history_blocks import LOOKBACK, import_blocks, openmetrics_history


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=16, help="sim nodes of 8 GPUs (16)")
    parser.add_argument("--hours", type=int, default=168, help="hours of history (168)")
    args = parser.parse_args()
    print(describe(f"fleet {args.nodes} nodes x 8 GPUs, {args.hours} h"))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        end = math.floor(time.time() / 60) * 60 - 60
        started = time.perf_counter()
        text, _ = openmetrics_history(end, args.hours, args.nodes)
        import_blocks(text, work)
        print(
            f"setup (history {len(text) / 1e6:.0f} MB, blocks): {time.perf_counter() - started:.1f} s"
        )
        procs = stack.Processes(work)
        try:
            url = stack.start_prometheus(procs, {}, [], extra=[LOOKBACK])
            spec = f"prometheus+{url}"
            load_source(spec)  # warm Prometheus' caches for both measurements alike
            reads = []
            for _ in range(5):
                t0 = time.perf_counter()
                load_source(spec)
                reads.append(time.perf_counter() - t0)
            live = sorted(reads)[len(reads) // 2]
            past = from_prometheus(spec, args.hours * 3600.0, now=end + 30)
        finally:
            procs.stop_all()
    per_hour = past.seconds / max(len(past.models), 1)
    print(f"live read (median of 5): {live * 1000:.0f} ms")
    print(past.summary())
    print(f"backfill per hour: {per_hour * 1000:.0f} ms = {per_hour / live:.2f}x a live read")


if __name__ == "__main__":
    main()
