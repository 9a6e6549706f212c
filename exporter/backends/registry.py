"""Where each backend name lives. Imported lazily so `--backend sim` never needs pynvml or DCGM."""

from __future__ import annotations

import importlib

from exporter.backends.base import Backend

BACKENDS: dict[str, str] = {
    "nvml": "exporter.backends.nvml:NvmlBackend",
    "dcgm": "exporter.backends.dcgm:DcgmBackend",
    "dcgm-exporter": "exporter.backends.dcgm_exporter:DcgmExporterBackend",
    "sim": "exporter.backends.sim:SimBackend",
}


def backend_class(name: str) -> type[Backend]:
    """The Backend subclass for `name`; ValueError lists the valid names."""
    try:
        module_name, _, class_name = BACKENDS[name].partition(":")
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}") from None
    return getattr(importlib.import_module(module_name), class_name)
