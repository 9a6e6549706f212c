"""App benchmark: time to first render of the Fleet page for 1,000 nodes x 8 GPUs.

Source `sim:a100-16x8?nodes=1000` (8,000 GPUs, 125 racks). Three figures, each the best of
--repeat cold runs (caches cleared):
  server    the page's work in-process: read the source, analyse, build the per-GPU frame
            and the heatmap figure, serialise it as Streamlit sends it (plotly JSON)
  apptest   the whole Fleet page script run by `streamlit.testing.v1.AppTest` (cold cache)
  browser   `streamlit run` + headless Debian chromium (Playwright): from navigation to the
            heatmap being drawn, first load of a fresh server (cold) and a reload (warm
            cache), for --nodes and for 16 nodes (the fixed cost of a first Streamlit load);
            skipped with a note when chromium or playwright is missing
Also prints the heatmap payload size. Prints the machine.

Usage: .venv/bin/python bench/app.py [--nodes 1000] [--repeat 3] [--no-browser]
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.machine import describe  # noqa: E402 (after the path)

CHROMIUM = "/usr/bin/chromium"
BASELINE_NODES = 16  # the same page on the preset's own size: what is fixed cost, what scales


def server_side(spec: str) -> tuple[float, dict[str, float], int]:
    """Seconds for the Fleet page's data work, split by step, and the figure's JSON size."""
    from advisor.app import data, figures
    from advisor.fragmentation import measures
    from advisor.history import History

    steps: dict[str, float] = {}
    t0 = time.perf_counter()
    model = data.load_model(spec)
    steps["read source"] = time.perf_counter() - t0
    t = time.perf_counter()
    state = data.analyze_state(spec, model, History(), live=False)
    steps["analyze"] = time.perf_counter() - t
    t = time.perf_counter()
    frame = data.gpu_frame(state.model, measures.allocated_idle(state.model))
    steps["gpu frame"] = time.perf_counter() - t
    t = time.perf_counter()
    fig = figures.fleet_heatmap(frame)
    steps["heatmap figure"] = time.perf_counter() - t
    t = time.perf_counter()
    payload = fig.to_json()
    steps["plotly json"] = time.perf_counter() - t
    return time.perf_counter() - t0, steps, len(payload)


def apptest(spec: str) -> float:
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    st.cache_resource.clear()
    at = AppTest.from_file(str(ROOT / "advisor" / "app" / "main.py"), default_timeout=300)
    at.session_state["source"] = spec
    t = time.perf_counter()
    at.run()
    elapsed = time.perf_counter() - t
    if at.exception:
        raise SystemExit(f"fleet page raised: {at.exception[0].value}")
    return elapsed


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def browser(spec: str) -> tuple[float, float] | str:
    """(cold, warm) seconds from navigation to the heatmap drawn, or why it was skipped."""
    if not Path(CHROMIUM).exists():
        return f"skipped: {CHROMIUM} not installed"
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return "skipped: playwright not installed"
    port = _free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streamlit",
            "run",
            str(ROOT / "advisor" / "app" / "main.py"),
            "--server.headless=true",
            "--server.address=127.0.0.1",
            f"--server.port={port}",
            "--browser.gatherUsageStats=false",
            "--server.fileWatcherType=none",
            "--",
            "--source",
            spec,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(url + "_stcore/health", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    return "skipped: streamlit did not start"
                time.sleep(0.2)
        with sync_playwright() as p:
            b = p.chromium.launch(
                executable_path=CHROMIUM,
                headless=True,
                args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
            )
            page = b.new_page(viewport={"width": 1400, "height": 1000})
            times = []
            for _ in range(2):  # cold server cache, then warm
                t = time.perf_counter()
                page.goto(url, wait_until="domcontentloaded")
                page.wait_for_selector(
                    '[data-testid="stPlotlyChart"] .main-svg .heatmaplayer image, '
                    '[data-testid="stPlotlyChart"] .main-svg .hm',
                    timeout=120_000,
                )
                times.append(time.perf_counter() - t)
            b.close()
        return times[0], times[1]
    finally:
        process.terminate()
        process.wait(10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-browser", action="store_true")
    args = parser.parse_args()
    spec = f"sim:a100-16x8?nodes={args.nodes}"
    print(describe())
    print(f"source: {spec} ({args.nodes:,} nodes x 8 = {args.nodes * 8:,} GPUs)")
    best, best_steps, size = float("inf"), {}, 0
    for _ in range(args.repeat):
        total, steps, size = server_side(spec)
        if total < best:
            best, best_steps = total, steps
    print(
        f"server   {best:6.2f} s  ("
        + ", ".join(f"{name} {seconds:.2f}" for name, seconds in best_steps.items())
        + ")"
    )
    print(f"         heatmap payload {size / 1e6:.1f} MB of plotly JSON")
    runs = [apptest(spec) for _ in range(args.repeat)]
    print(f"apptest  {min(runs):6.2f} s  (Fleet page script, cold cache; best of {len(runs)})")
    if not args.no_browser:
        small = f"sim:a100-16x8?nodes={BASELINE_NODES}"
        for label, source in ((f"{args.nodes:,} nodes", spec), (f"{BASELINE_NODES} nodes", small)):
            result = browser(source)
            if isinstance(result, str):
                print(f"browser  {result}")
                break
            print(
                f"browser  {result[0]:6.2f} s  first load to heatmap drawn, {result[1]:.2f} s "
                f"reload ({label}; fresh server each)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
