"""Exporter benchmark: scrape latency from the cache vs prometheus_client rendering per scrape.

Cases (issue 2):
  one-node   8 GPUs × 7 MIG instances and 20 processes (every field populated)
  sim-1000   the sim backend serving 1,000 nodes × 8 GPUs
For each: median and p99 latency of GET /metrics over loopback with a keep-alive client, for
our server (pre-rendered page) and for prometheus_client's own HTTP server with a collector
that builds the same families on every scrape (the baseline, measured in the same run), plus
the CPU time of one collection cycle (backend collect + render) in the collector thread.

Usage: .venv/bin/python bench/exporter.py [--quick] [--sim-nodes 1000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import requests
from prometheus_client import start_http_server
from prometheus_client.registry import CollectorRegistry

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.machine import describe
from exporter.collector import CollectorLoop
from exporter.contract import BY_NAME
from exporter.node_gauges import IdlePolicy, IdleTracker, node_gauges
from exporter.readings import (
    CLOCK_EVENT_REASONS,
    Allocation,
    Collection,
    GpuProcess,
    GpuReading,
    MigInstance,
    NodeReading,
    TopologyLink,
)
from exporter.render import SelfState, add_node, add_node_gauges, add_self
from gpu_defrag_common.exposition import Families
from gpu_defrag_common.server import ExporterServer
from gpu_defrag_common.webconfig import WebConfig

GiB = 2**30


def one_node() -> NodeReading:
    """8 H100s in MIG mode with 7 × 1g.10gb each, 20 processes spread over them."""
    gpus = []
    for index in range(8):
        gpu = GpuReading(
            index=index,
            uuid=f"GPU-{index:08x}-1111-2222-3333-444444444444",
            model="NVIDIA H100 80GB HBM3",
            pci_bus_id=f"00000000:{0x18 + index:02X}:00.0",
            serial=f"1652300000{index}",
            vbios_version="96.00.74.00.01",
            utilization_ratio=0.42,
            memory_utilization_ratio=0.2,
            sm_active_ratio=0.4,
            memory_total_bytes=80 * GiB,
            memory_used_bytes=30 * GiB,
            memory_free_bytes=49.5 * GiB,
            memory_reserved_bytes=0.5 * GiB,
            temperature_celsius=51,
            memory_temperature_celsius=58,
            power_watts=312.4,
            power_limit_watts=700,
            energy_joules=9.1e8,
            sm_clock_hertz=1.98e9,
            memory_clock_hertz=2.619e9,
            clock_event_active={reason: False for reason in CLOCK_EVENT_REASONS},
            clock_event_seconds={"sw_power_cap": 1.0, "hw_slowdown": 0.0},
            pcie_tx_bytes_per_second=1e9,
            pcie_rx_bytes_per_second=2e9,
            pcie_replay_errors=0,
            ecc_errors={"corrected": 0, "uncorrected": 0},
            retired_pages={"single_bit": 0, "double_bit": 0},
            retired_pages_pending=False,
            remapped_rows={"correctable": 0, "uncorrectable": 0},
            remapped_rows_pending=False,
            remapped_rows_failure=False,
            xid_errors={},
            mig_enabled=True,
            mig_instances=[
                MigInstance(
                    gi, 0, "1g.10gb", f"MIG-{index}{gi:07x}-0-0-0-0", 10 * GiB, 4 * GiB, 0.3
                )
                for gi in range(7)
            ],
            numa_node=index // 4,
            cpu_affinity="0-55" if index < 4 else "56-111",
            nvlink_island=0,
        )
        gpus.append(gpu)
    for pid in range(20):
        gpus[pid % 8].processes.append(
            GpuProcess(
                pid=10_000 + pid,
                name="python",
                memory_used_bytes=4 * GiB,
                sm_utilization_ratio=0.3,
                gpu_instance_id=pid % 7,
                pod=f"infer-{pid}",
                namespace="serving",
                container="model",
            )
        )
    links = [TopologyLink(a, b, "nvlink", 18) for a in range(8) for b in range(8) if a != b]
    allocations = [
        Allocation(gpu=g, gpu_instance_id=gi, pod=f"infer-{g}-{gi}", namespace="serving")
        for g in range(8)
        for gi in range(7)
    ]
    return NodeReading("bench-node", "550.54.15", "12.4", gpus, links, allocations, "h100", "r1")


class FixedBackend:
    """Returns the same prepared collection every cycle (rendering is what we measure)."""

    name = "bench"

    def __init__(self, nodes: list[NodeReading]) -> None:
        self.nodes = nodes

    def start(self) -> None:
        pass

    def collect(self) -> Collection:
        return Collection(nodes=self.nodes, timestamp=time.time())

    def close(self) -> None:
        pass


class RenderOnScrape:
    """The baseline: a prometheus_client collector that builds the families on each scrape."""

    def __init__(self, collection: Collection) -> None:
        self.collection = collection
        self.tracker = IdleTracker(IdlePolicy())

    def collect(self):
        families = Families(BY_NAME)
        for node in self.collection.nodes:
            add_node(families, node)
            add_node_gauges(families, node_gauges(node, self.tracker, self.collection.timestamp))
        add_self(families, SelfState("bench", "bench", True, 0.0, time.time(), 1, {}))
        return families.metric_families()

    def describe(self):
        return []


def latencies(url: str, count: int) -> list[float]:
    session = requests.Session()
    session.headers["Accept-Encoding"] = "gzip"  # what Prometheus sends
    session.get(url, timeout=60).raise_for_status()  # warm-up
    out = []
    for _ in range(count):
        started = time.perf_counter()
        response = session.get(url, timeout=60)
        response.content  # noqa: B018 - read the whole body
        out.append(time.perf_counter() - started)
    return out


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run_case(
    label: str,
    nodes: list[NodeReading],
    scrapes: int,
    backend=None,
    baseline_scrapes: int | None = None,
) -> None:
    backend = backend or FixedBackend(nodes)
    loop = CollectorLoop(backend, interval_s=3600, timeout_s=300)
    loop.run_once()  # first cycle fills the text cache, as in a running exporter
    cycles = []
    for _ in range(3):  # steady state: process CPU of a whole cycle (collect, gauges, render, gzip)
        cpu_started, wall_started = time.process_time(), time.perf_counter()
        loop.run_once()
        cycles.append((time.perf_counter() - wall_started, time.process_time() - cpu_started))
    wall, cpu = statistics.median(c[0] for c in cycles), statistics.median(c[1] for c in cycles)
    collection = loop._last_collection
    page = loop.current_page()
    series = page.body.count(b"\n") - page.body.count(b"\n#")

    ours = ExporterServer("127.0.0.1:0", loop, WebConfig()).start()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RenderOnScrape(collection))
    baseline_server, _thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    baseline_port = baseline_server.server_address[1]
    try:
        mine = latencies(f"http://127.0.0.1:{ours.port}/metrics", scrapes)
        theirs = latencies(f"http://127.0.0.1:{baseline_port}/metrics", baseline_scrapes or scrapes)
    finally:
        ours.close()
        baseline_server.shutdown()
    print(
        f"\n## {label}: {series} series, page {len(page.body) / 1024:.0f} KiB "
        f"({len(page.gzipped) / 1024:.0f} KiB gzipped)"
    )
    print(
        f"collection cycle, steady state (median of 3): {wall * 1000:.1f} ms wall, "
        f"{cpu * 1000:.1f} ms CPU (collect, gauges, render, gzip)"
    )
    print("| server | median ms | p99 ms | scrapes |")
    print("| --- | ---: | ---: | ---: |")
    for name, values in (
        ("gpu-defrag (pre-rendered)", mine),
        ("prometheus_client render-on-scrape", theirs),
    ):
        print(
            f"| {name} | {statistics.median(values) * 1000:.2f} | {p(values, 0.99) * 1000:.2f} | {len(values)} |"
        )
    print(
        f"ratio ours/baseline: median {statistics.median(mine) / statistics.median(theirs):.3f}, "
        f"p99 {p(mine, 0.99) / p(theirs, 0.99):.3f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer scrapes")
    parser.add_argument(
        "--sim-nodes",
        type=int,
        default=1000,
        help="nodes of the sim case (1000; fewer: a smoke run)",
    )
    args = parser.parse_args()
    print(f"# exporter benchmark — {describe()}")
    run_case("one node: 8 GPUs × 7 MIG, 20 processes", [one_node()], 200 if args.quick else 2000)

    from exporter.backends.sim import SimBackend

    sim = SimBackend.from_args(
        argparse.Namespace(
            sim_preset="a100-16x8",
            sim_seed=42,
            sim_speed=1.0,
            sim_nodes=args.sim_nodes,
            node_name="bench",
        )
    )
    sim.start()
    # prometheus_client needs ~10-20 s to render this page per scrape: fewer baseline scrapes.
    run_case(
        f"sim: {args.sim_nodes:,} nodes × 8 GPUs",
        [],
        10 if args.quick else 50,
        backend=sim,
        baseline_scrapes=5,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
