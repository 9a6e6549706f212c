"""Scrape latency while other clients abuse the server (issue 29).

An authorised keep-alive client scrapes /metrics of the sim exporter (16 × 8 A100 by default)
every 50 ms and times each answer, in five cases measured in the same run:

  baseline        nothing else
  drippers        300 clients each holding a connection and sending a header line a second
  close wave      2,000 clients with a request cut short close at once as the scrapes start
  auth baseline   basic auth on (bcrypt cost 10), credentials remembered after the first scrape
  wrong passwords the same, while 20 clients send wrong passwords as fast as answered

It prints median and p99 latency, failures, and each case's median over its baseline's
(drippers and close wave over baseline, wrong passwords over auth baseline). The drippers
and the close wave also report how many of their connections were still open at the end,
and how many answers came back to requests that were never whole (should be none).

Usage: python bench/server_abuse.py [--quick] [--sim-nodes 16] [--scrapes 60]
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.machine import describe
from exporter.backends.sim import SimBackend
from exporter.collector import CollectorLoop
from gpu_defrag_common.server import ExporterServer
from gpu_defrag_common.webconfig import load_web_config

PASSWORD = "scrape-secret"


@dataclass
class Figures:
    case: str
    latencies: list[float]
    failures: int
    note: str = ""

    @property
    def median_ms(self) -> float:
        return statistics.median(self.latencies) * 1e3 if self.latencies else float("nan")

    @property
    def p99_ms(self) -> float:
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1e3


def sim_loop(nodes: int) -> CollectorLoop:
    parser = argparse.ArgumentParser()
    SimBackend.add_arguments(parser)
    args = parser.parse_args(["--sim.preset", "a100-16x8", "--sim.nodes", str(nodes)])
    loop = CollectorLoop(SimBackend.from_args(args), interval_s=3600)
    loop.run_once()
    return loop


def scrape(port: int, count: int, auth: tuple[str, str] | None) -> tuple[list[float], int]:
    session = requests.Session()
    latencies, failures = [], 0
    for _ in range(count):
        started = time.perf_counter()
        try:
            answer = session.get(f"http://127.0.0.1:{port}/metrics", auth=auth, timeout=30)
            _ = answer.content  # the whole body, as Prometheus reads it
            if answer.status_code != 200:
                failures += 1
            else:
                latencies.append(time.perf_counter() - started)
        except requests.RequestException:
            failures += 1
            session = requests.Session()
        time.sleep(0.05)
    return latencies, failures


def open_many(port: int, count: int, first: bytes) -> list[socket.socket]:
    sockets = []
    for _ in range(count):
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            sock.sendall(first)
            sockets.append(sock)
        except OSError:
            break
    return sockets


def answered(sockets: list[socket.socket]) -> tuple[int, int]:
    """(still open, answered with a status line) over connections whose request never ended."""
    still_open = answers = 0
    for sock in sockets:
        sock.setblocking(False)
        try:
            data = sock.recv(64)
        except BlockingIOError:
            still_open += 1
            continue
        except OSError:
            continue
        answers += data.startswith(b"HTTP/")
    return still_open, answers


def case_drippers(port: int, scrapes: int, clients: int) -> Figures:
    sockets = open_many(port, clients, b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    stop = threading.Event()

    def drip() -> None:
        n = 0
        while not stop.wait(1.0):
            n += 1
            for sock in sockets:
                with contextlib.suppress(OSError):
                    sock.send(b"X-Drip-%d: a\r\n" % n)

    dripper = threading.Thread(target=drip, daemon=True)
    dripper.start()
    latencies, failures = scrape(port, scrapes, None)
    stop.set()
    dripper.join()
    still_open, answers = answered(sockets)
    for sock in sockets:
        sock.close()
    note = f"{len(sockets)} drippers, {still_open} still held at the end, {answers} answered"
    return Figures("drippers", latencies, failures, note)


def case_close_wave(port: int, scrapes: int, clients: int) -> Figures:
    sockets = open_many(port, clients, b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    time.sleep(0.5)
    for sock in sockets:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)
    latencies, failures = scrape(port, scrapes, None)
    answers = 0
    for sock in sockets:
        sock.settimeout(0.01)
        with contextlib.suppress(OSError):
            answers += sock.recv(64).startswith(b"HTTP/")
        sock.close()
    note = f"{len(sockets)} cut-short requests closed at once, {answers} answered"
    return Figures("close wave", latencies, failures, note)


def case_wrong_passwords(port: int, scrapes: int, clients: int) -> Figures:
    stop = threading.Event()
    counts = [0] * clients

    def attack(n: int) -> None:
        session = requests.Session()
        while not stop.is_set():
            with contextlib.suppress(requests.RequestException):
                session.get(
                    f"http://127.0.0.1:{port}/metrics",
                    auth=("prometheus", f"guess-{n}"),
                    timeout=30,
                )
                counts[n] += 1

    attackers = [threading.Thread(target=attack, args=(n,), daemon=True) for n in range(clients)]
    for thread in attackers:
        thread.start()
    time.sleep(1.0)
    latencies, failures = scrape(port, scrapes, ("prometheus", PASSWORD))
    stop.set()
    for thread in attackers:
        thread.join(timeout=30)
    note = f"{clients} clients sent {sum(counts)} wrong passwords"
    return Figures("wrong passwords", latencies, failures, note)


def served(loop: CollectorLoop, web_config: str | None, run) -> Figures:
    server = ExporterServer("127.0.0.1:0", loop, load_web_config(web_config)).start()
    try:
        return run(server.port)
    finally:
        server.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few clients and scrapes (smoke)")
    parser.add_argument("--sim-nodes", type=int, default=16)
    parser.add_argument("--scrapes", type=int, default=60)
    args = parser.parse_args()
    drippers, wave, attackers, scrapes = (
        (20, 50, 3, 10) if args.quick else (300, 2000, 20, args.scrapes)
    )
    print(describe(f"sim {args.sim_nodes} nodes × 8 GPUs"))
    loop = sim_loop(args.sim_nodes)
    print(f"page: {len(loop.current_page().body) / 1e3:.0f} kB")
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "web.yml"
        hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10)).decode()
        config.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
        auth = ("prometheus", PASSWORD)
        results = [
            served(loop, None, lambda p: Figures("baseline", *scrape(p, scrapes, None))),
            served(loop, None, lambda p: case_drippers(p, scrapes, drippers)),
            served(loop, None, lambda p: case_close_wave(p, scrapes, wave)),
            served(
                loop, str(config), lambda p: Figures("auth baseline", *scrape(p, scrapes, auth))
            ),
            served(loop, str(config), lambda p: case_wrong_passwords(p, scrapes, attackers)),
        ]
    baseline = {"drippers": 0, "close wave": 0, "wrong passwords": 3}
    print("| case | scrapes ok | failed | median ms | p99 ms | median / baseline | note |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for figures in results:
        ratio = ""
        if figures.case in baseline:
            ratio = f"{figures.median_ms / results[baseline[figures.case]].median_ms:.2f}"
        print(
            f"| {figures.case} | {len(figures.latencies)} | {figures.failures} | "
            f"{figures.median_ms:.1f} | {figures.p99_ms:.1f} | {ratio} | {figures.note} |"
        )
    loop.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
