"""The app in a real browser: `streamlit run` on 127.0.0.1, Debian's chromium driven headless by
Playwright, every page loaded without a Streamlit exception, a screenshot of each saved under
test-output/screenshots/.

Needs /usr/bin/chromium (`make system`) and the playwright package (no `playwright install`: we
use the Debian browser). Skips when they are missing, except under CI (CI=1/true/yes/on,
`tests.ci`), where a missing browser is a failure rather than a silently skipped test.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from advisor.app.cli import app_env, streamlit_command
from tests.ci import skip_or_fail
from tests.fakes.waiting import CAP_S, reap, wait_until
from tests.ports import free_port

pytestmark = pytest.mark.integration

WAIT_MS = int(CAP_S * 1000)  # page waits end on their selector; this is only the net
ROOT = Path(__file__).resolve().parents[2]
MAIN = ROOT / "advisor" / "app" / "main.py"
SHOTS = ROOT / "test-output" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SOURCE = "sim:a100-16x8?t=2d"  # two simulated days: a trend and backtested forecasts
# (url path, page title, what must be drawn before the screenshot)
PLOT = '[data-testid="stPlotlyChart"] .main-svg'
PAGES = [
    ("", "Fleet", [PLOT]),
    ("fragmentation", "Fragmentation", [PLOT]),
    ("forecast", "Forecast", [PLOT, '[data-testid="stDataFrame"] canvas']),  # the fan, the nodes
    ("actions", "Actions", ['[data-testid="stDataFrame"] canvas']),
    ("whatif", "What-if", ['[data-testid="stAlert"]', '[data-testid="stMetricValue"]']),
]


def _need(what: str) -> None:
    skip_or_fail(what)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def app_url() -> Iterator[str]:
    with _streamlit(SOURCE, "streamlit-browser-test.log") as url:
        yield url


@contextmanager
def _streamlit(source: str, log_name: str, refresh: float | None = None) -> Iterator[str]:
    """`gpu-defrag app`'s Streamlit server on a free port of 127.0.0.1, healthy; its URL."""
    if not Path(CHROMIUM).exists():
        _need(f"{CHROMIUM} not installed (make system)")
    if importlib.util.find_spec("playwright") is None:
        _need("the playwright package is not installed")
    port = free_port()
    log = (ROOT / "test-output").resolve()
    log.mkdir(parents=True, exist_ok=True)
    with open(log / log_name, "wb") as out:
        process = subprocess.Popen(
            streamlit_command("127.0.0.1", port, source),  # exactly what `gpu-defrag app` runs
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=app_env(source, refresh),
        )
        try:
            url = f"http://127.0.0.1:{port}/"
            wait_until(
                lambda: _healthy(url + "_stcore/health"),
                "streamlit healthy (see test-output/streamlit-*.log)",
                process,
            )
            yield url
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.fixture(scope="module")
def browser(app_url: str) -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.mark.parametrize(("path", "title", "drawn"), PAGES, ids=[p[1] for p in PAGES])
def test_page_renders_without_exception(
    app_url: str, browser, path: str, title: str, drawn: list[str]
) -> None:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    SHOTS.mkdir(parents=True, exist_ok=True)
    shot = SHOTS / f"{title.lower().replace('-', '')}.png"
    try:
        page.goto(app_url + path, wait_until="domcontentloaded")
        page.wait_for_selector(f'h1:has-text("{title}")', timeout=WAIT_MS)
        # the script run is over when the status widget ("Running...") is gone
        page.wait_for_selector('[data-testid="stStatusWidget"]', state="detached", timeout=WAIT_MS)
        for selector in drawn:
            page.wait_for_selector(selector, timeout=WAIT_MS)
        # lazily loaded elements show grey skeletons until their code has arrived
        page.wait_for_function(
            "() => !document.querySelector('[data-testid=\"stSkeleton\"]')", timeout=WAIT_MS
        )
        page.wait_for_timeout(500)  # let lazy grids finish painting
        assert page.locator('[data-testid="stException"]').count() == 0
        assert page.locator('[data-testid="stAlertContentError"]').count() == 0
        page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 20_000  # a drawn page, not a blank header
    except Exception:
        page.screenshot(path=str(shot.with_suffix(".failed.png")), full_page=True)
        raise
    finally:
        page.close()


def test_kubectl_and_slurm_exports_download_under_their_own_names(app_url: str, browser) -> None:
    """The Actions page's two scripts are both `.sh`: each downloads under its own name."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    try:
        page.goto(app_url + "actions", wait_until="domcontentloaded")
        page.wait_for_selector('h1:has-text("Actions")', timeout=60_000)
        page.wait_for_selector('[data-testid="stStatusWidget"]', state="detached", timeout=60_000)
        names = {}
        for tab in ("kubectl", "Slurm"):
            page.get_by_role("tab", name=tab).click()
            with page.expect_download(timeout=60_000) as download:
                page.get_by_role("button", name=f"Download {tab.lower()}").click()
            names[tab] = download.value.suggested_filename
    finally:
        page.close()
    assert names["kubectl"].endswith("-kubectl.sh") and names["Slurm"].endswith("-slurm.sh")
    assert names["kubectl"].removesuffix("-kubectl.sh") == names["Slurm"].removesuffix("-slurm.sh")


def test_an_open_page_says_when_its_live_source_goes_away(tmp_path: Path, browser) -> None:
    """The Fleet page open on a live exporter, the exporter stopped: within a few refreshes,
    without a reload, the page says the last refresh failed and keeps the last good figures."""
    from tests.integration import stack

    procs = stack.Processes(tmp_path)
    try:
        exporter = stack.start_exporter(procs)
        source = f"http://{exporter}/metrics"
        with _streamlit(source, "streamlit-outage-test.log", refresh=1.0) as url:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            try:
                page.goto(url, wait_until="domcontentloaded")
                page.wait_for_selector(PLOT, timeout=WAIT_MS)
                assert page.locator('[data-testid="stAlertContentWarning"]').count() == 0
                procs.stop_all()
                warning = page.locator(
                    '[data-testid="stAlertContentWarning"]', has_text="Last refresh failed"
                )
                warning.wait_for(timeout=WAIT_MS)
                assert page.locator(PLOT).count() > 0  # the last good figures stay
                assert page.locator('[data-testid="stException"]').count() == 0
            finally:
                page.close()
    finally:
        procs.stop_all()


def test_demo_starts_exporter_advisor_and_app_and_ctrl_c_stops_them(tmp_path: Path) -> None:
    """`gpu-defrag demo` (what `make demo` runs): every child answers, the URL is printed,
    and SIGINT (Ctrl-C) stops all of them."""
    port = free_port()
    out = tmp_path / "demo.log"
    with open(out, "wb") as log:
        demo = subprocess.Popen(
            [sys.executable, "-m", "advisor.cli", "demo", "--port", str(port)],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # one process group with its children, for the cleanup
        )
    try:
        url = f"http://127.0.0.1:{port}/"
        opened = f"gpu-defrag demo: open {url}"
        wait_until(lambda: opened in out.read_text(), f"the demo's line {opened!r}", demo)
        text = out.read_text()
        assert _healthy(url + "_stcore/health")
        # the lines that say where each child is (not "still waiting for ... on URL" notes,
        # which a loaded machine prints while a child starts)
        exporter = re.search(r"^sim exporter \(a100-16x8, 60x time\) on (\S+)", text, re.M)[1]
        advisor = re.search(r"^advisor service on (\S+)", text, re.M)[1]
        with urllib.request.urlopen(exporter, timeout=5) as page:
            assert b"gpu_" in page.read()
        with urllib.request.urlopen(advisor, timeout=5) as page:
            assert page.status == 200
        # the advisor read the sim fleet's simulated week back: forecasts and idle windows at once
        api = advisor.removesuffix("metrics") + "api/forecast"

        def forecast() -> dict | None:
            try:
                with urllib.request.urlopen(api, timeout=5) as page:
                    found = json.load(page)
            except urllib.error.HTTPError as error:  # 503 until the first run
                assert error.code == 503, error
                return None
            return found if found["pools"] else None

        doc = wait_until(forecast, "the advisor's first forecast", demo)
        horizons = [h for pool in doc["pools"] for h in pool["horizons"]]
        assert horizons and all(h["available"] for h in horizons), doc
        windows = [w for pool in doc["idle"]["pools"] for w in pool["windows"]]
        assert windows and all(w["available"] for w in windows), doc["idle"]
        children = [
            int(pid)
            for pid in subprocess.run(
                ["pgrep", "-P", str(demo.pid)], capture_output=True, text=True
            ).stdout.split()
        ]
        assert len(children) == 3  # exporter, advisor, app
        demo.send_signal(signal.SIGINT)
        reap(demo)
        assert demo.returncode == 0
        for pid in children:
            assert (
                not Path(f"/proc/{pid}").exists()
                or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
            )
    finally:  # a failed check must not leave the demo's children running on the machine
        if demo.poll() is None:
            demo.send_signal(signal.SIGINT)
            try:
                demo.wait(timeout=30)
            except subprocess.TimeoutExpired:
                demo.kill()
                demo.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(demo.pid, signal.SIGKILL)  # its session: children it could not stop
