"""A restarted advisor reads its past from a real Prometheus and forecasts at once.

Sixty hours of a simulated fleet's exporter pages are written as OpenMetrics, one sample an
hour, and turned into TSDB blocks by `promtool tsdb create-blocks-from openmetrics` (what an
operator would use to backfill). Debian's Prometheus serves them with a lookback of 59 minutes:
hourly samples would be stale for the default 5, and a lookback over an hour would let a series
that ended in the last hour (no staleness marker in imported blocks) overlap its successor. `gpu-defrag advise` then starts on
`prometheus+http://...` with `--history.backfill 60h`: its first answer already has 24-h
forecasts with their backtest, which without the backfill would need 36 hours of runs.
"""

from __future__ import annotations

import json
import math
import subprocess
import time

from prometheus_client.parser import text_string_to_metric_families

from advisor.ingest.exporter_scrape import OUR_NAMES
from exporter.readings import Collection
from exporter.render import SelfState, render_page
from exporter.sim.fleet import SimFleet
from tests.integration import stack

HOURS = 60
TARGET = {"job": "gpu-exporter", "instance": "127.0.0.1:9835"}


def _label_text(labels: dict[str, str]) -> str:
    def escape(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return ",".join(f'{k}="{escape(v)}"' for k, v in sorted(labels.items()))


def openmetrics_history(end: float, hours: int, nodes: int = 2) -> tuple[str, list[float]]:
    """The exporter series the advisor's state query reads, one sample an hour from `hours`
    hours before `end` to `end`, grouped by metric as OpenMetrics requires; and the times."""
    fleet = SimFleet("a100-16x8", 42, nodes)
    times = [end - 3600.0 * k for k in range(hours, -1, -1)]
    t0 = times[0]
    state = SelfState("0.1.0", "test", True, 0.01, t0, 1, {})
    lines: dict[str, list[str]] = {}
    for at in times:
        fleet.advance(at - t0 - fleet.now)
        page = render_page(Collection(fleet.readings(lambda s: t0 + s), at), [], state)
        for family in text_string_to_metric_families(page.body.decode()):
            for sample in family.samples:
                if sample.name not in OUR_NAMES:
                    continue
                labels = _label_text({**sample.labels, **TARGET})
                lines.setdefault(sample.name, []).append(
                    f"{sample.name}{{{labels}}} {sample.value} {at:.3f}"
                )
    out = []
    for name, samples in lines.items():
        out.append(f"# TYPE {name} gauge")
        out.extend(samples)
    out.append("# EOF")
    return "\n".join(out) + "\n", times


def test_a_restarted_advisor_reads_its_past_from_prometheus(tmp_path):
    procs = stack.Processes(tmp_path)
    end = math.floor(time.time() / 60) * 60 - 60  # a minute ago: the latest sample
    text, times = openmetrics_history(end, HOURS)
    source = tmp_path / "history.om"
    source.write_text(text)
    made = subprocess.run(
        [
            stack.binary("promtool"),
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            "-q",
            str(source),
            str(tmp_path / "tsdb"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    try:
        url = stack.start_prometheus(procs, {}, [], extra=["--query.lookback-delta=59m"])
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
