"""Generate the Grafana dashboards from code (plain dicts, see grafana.py).

    python -m dashboards.generate           # writes dashboards/json/*.json that changed, one line
    python -m dashboards.generate --check   # exit 1 if a committed dashboard is out of date

It also writes the same dashboards as Grafana-sidecar ConfigMaps for Kubernetes
(deploy/overlays/kube-prometheus-stack/dashboards.yaml, see configmaps.py).

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
from dashboards import configmaps, dcgm_fleet, fleet_overview, fragmentation_advisor, node_detail
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


def outputs(root: Path, out_dir: Path) -> dict[str, tuple[Path, str]]:
    """Every generated file, by its path under `root` as the one line names it: the dashboards'
    JSON and the same files as the Kubernetes ConfigMaps of the Grafana sidecar."""
    texts = {name: dumps(doc) for name, doc in render_all().items()}
    files = {name: out_dir / name for name in texts}
    files_shown = {str(path.relative_to(root)): (path, texts[path.name]) for path in files.values()}
    configmaps_file = root / configmaps.OUT_FILE
    files_shown[str(configmaps.OUT_FILE)] = (configmaps_file, configmaps.render(texts))
    return files_shown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if outputs are out of date")
    args = parser.parse_args(argv)
    root = OUT_DIR.parent.parent
    files = outputs(root, OUT_DIR)
    return sync_generated(files, "dashboards", "python -m dashboards.generate", args.check)


if __name__ == "__main__":
    sys.exit(main())
