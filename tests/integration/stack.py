"""Start and stop the real pieces of the monitoring stack on 127.0.0.1 for integration tests.

Every process gets a free port and a temp dir, is polled until ready (never slept on), and is
stopped by its PID in a `finally`. A missing binary fails the test with the package to install.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fakes.waiting import CAP_S
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {
    "prometheus": "prometheus",
    "promtool": "prometheus",
    "prometheus-alertmanager": "prometheus-alertmanager",
    "amtool": "prometheus-alertmanager",
}


def binary(name: str) -> str:
    """Path of a required binary; fails (never skips) when it is missing."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} is missing: apt-get install --no-install-recommends {PACKAGES.get(name, name)}"
        )
    return path


def poll(
    check: Callable[[], Any],
    timeout: float,
    what: str,
    interval: float = 0.2,
    procs: Processes | None = None,
) -> Any:
    """Call `check` until it returns something truthy; fail with `what` after `timeout` s, or
    at once when one of `procs` has exited. Pass `CAP_S` as `timeout`: the wait is for the
    event, however slow a loaded machine makes it (tests/fakes/waiting.py), not a budget."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        if procs is not None:
            procs.check_alive()
        try:
            result = check()
        except (OSError, urllib.error.URLError, ValueError, KeyError) as error:
            last_error = error
        else:
            if result:
                return result
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what} (last error: {last_error})")


def http_get(url: str, timeout: float = 5) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


class Processes:
    """Child processes with their logs; `stop_all` kills each by PID."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.children: list[tuple[str, subprocess.Popen, Path]] = []

    def start(self, name: str, args: list[str]) -> subprocess.Popen:
        log = self.workdir / f"{name}.log"
        handle = log.open("wb")
        process = subprocess.Popen(
            args, stdout=handle, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True
        )
        handle.close()
        self.children.append((name, process, log))
        return process

    def check_alive(self) -> None:
        for name, process, log in self.children:
            if process.poll() is not None:
                pytest.fail(f"{name} exited with {process.returncode}:\n{log.read_text()[-3000:]}")

    def logs(self) -> str:
        return "\n".join(f"--- {n} ---\n{log.read_text()[-2000:]}" for n, _, log in self.children)

    def stop_all(self) -> None:
        for _, process, _ in reversed(self.children):
            if process.poll() is None:
                process.terminate()
        for _, process, _ in reversed(self.children):
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


def start_exporter(procs: Processes, *extra: str) -> str:
    """The sim exporter (`gpu-defrag exporter --backend sim`); returns its host:port."""
    port = free_port()
    procs.start(
        "exporter",
        [
            sys.executable,
            "-m",
            "advisor.cli",
            "exporter",
            "--backend",
            "sim",
            "--sim.preset",
            "a100-16x8",
            "--web.listen-address",
            f"127.0.0.1:{port}",
            "--collect.interval",
            "1s",
            *extra,
        ],
    )
    address = f"127.0.0.1:{port}"
    poll(
        lambda: b"gpu_info" in http_get(f"http://{address}/metrics"),
        CAP_S,
        "the sim exporter",
        procs=procs,
    )
    return address


def start_advisor(
    procs: Processes,
    source: str,
    interval: str = "5s",
    shapes: str | None = None,
    extra: Sequence[str] = (),
) -> str:
    """The real advisor service (`gpu-defrag advise`); returns its host:port."""
    port = free_port()
    procs.start(
        "advisor",
        [
            sys.executable,
            "-m",
            "advisor.cli",
            "advise",
            "--source",
            source,
            "--web.listen-address",
            f"127.0.0.1:{port}",
            "--advise.interval",
            interval,
            *(["--shapes", shapes] if shapes else []),
            *extra,
        ],
    )
    address = f"127.0.0.1:{port}"
    poll(
        lambda: b"gpu_advisor_fragmentation_ratio" in http_get(f"http://{address}/metrics"),
        CAP_S,
        "the advisor's first run",
        procs=procs,
    )
    return address


def start_prometheus(
    procs: Processes,
    scrape: dict[str, str | list[str]],
    rule_files: list[Path],
    *,
    alertmanager: str | None = None,
    cluster: str = "integration",
    extra: Sequence[str] = (),
) -> str:
    """Debian's Prometheus scraping `scrape` (job -> host:port, or a list of them) every second;
    returns its URL.
    Its data lives in `procs.workdir / "tsdb"` (blocks put there first are served too)."""
    port = free_port()
    config: dict[str, Any] = {
        "global": {
            "scrape_interval": "1s",
            "scrape_timeout": "1s",
            "evaluation_interval": "1s",
            "external_labels": {"cluster": cluster},
        },
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [
            {
                "job_name": job,
                "static_configs": [{"targets": [target] if isinstance(target, str) else target}],
            }
            for job, target in scrape.items()
        ],
    }
    if alertmanager:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
    path = procs.workdir / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    check = subprocess.run(
        [binary("promtool"), "check", "config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    procs.start(
        "prometheus",
        [
            binary("prometheus"),
            f"--config.file={path}",
            f"--storage.tsdb.path={procs.workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            *extra,
        ],
    )
    url = f"http://127.0.0.1:{port}"
    poll(lambda: http_get(f"{url}/-/ready"), CAP_S, "Prometheus to be ready", procs=procs)
    return url


def query(url: str, expr: str, *, range_s: float | None = None) -> list[dict]:
    """Run a PromQL query through the HTTP API; raises AssertionError with Prometheus' error."""
    params = {"query": expr}
    endpoint = "query"
    if range_s:
        now = time.time()
        params.update(start=str(now - range_s), end=str(now), step="2")
        endpoint = "query_range"
    data = urllib.parse.urlencode(params).encode()
    try:
        with urllib.request.urlopen(f"{url}/api/v1/{endpoint}", data=data, timeout=10) as response:
            body = json.load(response)
    except urllib.error.HTTPError as error:
        body = json.load(error)
    assert body["status"] == "success", f"{expr!r}: {body.get('errorType')}: {body.get('error')}"
    return body["data"]["result"]


def api(url: str, path: str) -> Any:
    body = json.loads(http_get(f"{url}{path}"))
    assert body["status"] == "success", body
    return body["data"]


@contextlib.contextmanager
def http_server(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """A threaded HTTP server on a free 127.0.0.1 port; yields host:port."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
