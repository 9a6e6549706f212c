"""Generate the Grafana dashboards from code (plain dicts, see grafana.py).

    python -m dashboards.generate           # writes dashboards/json/*.json that changed, one line
    python -m dashboards.generate --check   # exit 1 if a committed dashboard is out of date

One module per dashboard, each with `build(config) -> dict` (fleet_overview, node_detail,
fragmentation_advisor, dcgm_fleet), all selecting through `selectors.py` and built from the panel
helpers of `grafana.py`. Thresholds come from alerts/config.yaml, the same config the alert rules
use, so a panel turns red where the alert fires. Metric names come from exporter/contract.py and
advisor/contract.py (tests/ops/test_dashboards.py checks every name).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from alerts.config import load_config
from dashboards import dcgm_fleet, fleet_overview, fragmentation_advisor, node_detail
from gpu_defrag_common.files import sync_generated

OUT_DIR = Path(__file__).resolve().parent / "json"
DASHBOARDS = {
    "gpu-fleet-overview.json": fleet_overview.build,
    "gpu-node-detail.json": node_detail.build,
    "gpu-fragmentation-advisor.json": fragmentation_advisor.build,
    "gpu-fleet-dcgm-exporter.json": dcgm_fleet.build,
}


def render_all(config: dict | None = None) -> dict[str, dict]:
    config = config or load_config()
    return {name: build(config) for name, build in DASHBOARDS.items()}


def dumps(document: dict) -> str:
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if outputs are out of date")
    args = parser.parse_args(argv)
    files = {name: (OUT_DIR / name, dumps(doc)) for name, doc in render_all().items()}
    label = f"{OUT_DIR.parent.name}/{OUT_DIR.name}"
    return sync_generated(files, label, "python -m dashboards.generate", args.check)


if __name__ == "__main__":
    sys.exit(main())
