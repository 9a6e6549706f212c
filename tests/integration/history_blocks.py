"""Days of a simulated fleet's exporter series, imported into a real Prometheus as TSDB blocks.

The exporter's page for a `SimFleet`, one sample an hour, written as OpenMetrics and turned into
blocks by `promtool tsdb create-blocks-from openmetrics` (what an operator uses to backfill).
Prometheus must then serve it with a lookback just under an hour (`LOOKBACK`): hourly samples
would be stale for the default 5 minutes, and a lookback over an hour would let a series that
ended in the last hour (imported blocks carry no staleness markers) overlap its successor.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from advisor.ingest.exporter_scrape import OUR_NAMES
from exporter.node_gauges import IdlePolicy, IdleTracker, node_gauges
from exporter.readings import Collection
from exporter.render import SelfState, render_page
from gpu_defrag_sim.fleet import SimFleet
from tests.integration import stack

LOOKBACK = "--query.lookback-delta=59m"
TARGET = {"job": "gpu-exporter", "instance": "127.0.0.1:9835"}


def _label_text(labels: dict[str, str]) -> str:
    def escape(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return ",".join(f'{k}="{escape(v)}"' for k, v in sorted(labels.items()))


def openmetrics_history(
    end: float, hours: int, nodes: int = 2, names: frozenset[str] = OUR_NAMES
) -> tuple[str, list[float]]:
    """The exporter series in `names` (default: those the advisor's state query reads; the
    per-node gauges such as `gpu_node_free_gpus` are there too), one sample an hour from
    `hours` hours before `end` to `end`, grouped by metric as OpenMetrics requires; and the
    sample times."""
    fleet = SimFleet("a100-16x8", 42, nodes)
    tracker = IdleTracker(IdlePolicy())
    times = [end - 3600.0 * k for k in range(hours, -1, -1)]
    t0 = times[0]
    state = SelfState("0.1.0", "test", True, 0.01, t0, 1, {})
    lines: dict[str, list[str]] = {}
    for at in times:
        fleet.advance(at - t0 - fleet.now)
        readings = fleet.readings(lambda s: t0 + s)
        gauges = [node_gauges(node, tracker, at) for node in readings]
        page = render_page(Collection(readings, at), gauges, state)
        for family in text_string_to_metric_families(page.body.decode()):
            for sample in family.samples:
                if sample.name not in names:
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


def import_blocks(text: str, workdir: Path) -> None:
    """`text` (OpenMetrics) into TSDB blocks under `workdir / "tsdb"`, where
    `stack.start_prometheus` keeps its data."""
    source = workdir / "history.om"
    source.write_text(text)
    blocks = ["tsdb", "create-blocks-from", "openmetrics", "-q", str(source)]
    made = subprocess.run(
        [stack.binary("promtool"), *blocks, str(workdir / "tsdb")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert made.returncode == 0, made.stdout + made.stderr
