"""Load the one config of selectors and thresholds shared by the rules and the dashboards."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

from gpu_defrag_common.config_text import load_yaml

CONFIG_PATH = Path(__file__).with_name("config.yaml")

_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m(?!s))?(?:(\d+)s)?(?:(\d+)ms)?$")


def load_config(overrides: dict[str, Any] | None = None, path: Path = CONFIG_PATH) -> dict:
    """The config, with `overrides` merged in section by section (for fast test variants)."""
    config = load_yaml(path.read_text())
    return merge(config, overrides or {})


def merge(base: dict, overrides: dict) -> dict:
    merged = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def seconds(duration: str) -> float:
    """Seconds in a Prometheus duration such as `1h30m`, `10m`, `500ms`."""
    match = _DURATION.match(str(duration))
    if not match or not any(match.groups()):
        raise ValueError(f"{duration!r} is not a Prometheus duration")
    d, h, m, s, ms = (int(part or 0) for part in match.groups())
    return d * 86400 + h * 3600 + m * 60 + s + ms / 1000
