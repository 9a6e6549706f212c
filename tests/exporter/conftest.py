"""Shared pieces of the exporter tests: its HTTP server over a scripted collector (the contract
both servers keep, tests/test_http_contract.py, starts it here too)."""

from __future__ import annotations

from exporter.collector import CollectorLoop
from gpu_defrag_common.server import ExporterServer
from gpu_defrag_common.webconfig import WebConfig
from tests.exporter.scripted_backend import ScriptedBackend


def exporter_loop() -> CollectorLoop:
    """A collector over one scripted "ok" reading, collected once."""
    backend = ScriptedBackend(["ok"])
    collector = CollectorLoop(backend, interval_s=10, clock=lambda: backend.now)
    collector.run_once()
    return collector


def serve_exporter(loop: CollectorLoop, web: WebConfig) -> ExporterServer:
    """The exporter's server on 127.0.0.1:<free port>, serving `loop`'s page; started."""
    return ExporterServer("127.0.0.1:0", loop, web).start()
