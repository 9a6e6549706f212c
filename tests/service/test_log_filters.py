"""The service's log: every record is redacted whichever module logs it (the readers name the
URL they read, password included), and a warning repeated word for word on every run is shown
once per hour with how many were held back."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from advisor import logs
from advisor.logs import RepeatFilter
from tests.advisor.test_ingest_duplicates import UTIL0, _page
from tests.fakes.cli_process import cli_process
from tests.fakes.page_server import Routes, serve
from tests.fakes.waiting import reap, wait_until


def _record(message: str, level: int = logging.WARNING) -> logging.LogRecord:
    return logging.LogRecord(
        "advisor.ingest.exporter_scrape", level, __file__, 1, message, (), None
    )


def test_a_repeated_warning_is_shown_once_per_period_with_the_count_held_back():
    now = [0.0]
    repeats = RepeatFilter(every_s=3600.0, clock=lambda: now[0])
    shown = []
    for t in range(0, 7200 + 1, 5):  # one run every 5 s for two hours
        now[0] = float(t)
        record = _record("http://x/metrics: 1 series given more than once")
        if repeats.filter(record):
            shown.append((t, record.getMessage()))
    assert [t for t, _ in shown] == [0, 3600, 7200]
    assert shown[0][1] == "http://x/metrics: 1 series given more than once"
    assert shown[1][1].endswith("(719 more like it held back in 1 h)")
    # a different warning, and anything but a warning, is never held back
    assert repeats.filter(_record("http://x/metrics: 2 series given more than once"))
    assert all(repeats.filter(_record("same", logging.ERROR)) for _ in range(3))
    assert all(repeats.filter(_record("same", logging.INFO)) for _ in range(3))


@pytest.mark.slow
def test_the_service_log_hides_the_sources_password_and_says_a_repeated_warning_once():
    """A source URL with a password and a page that repeats a series with two values: the
    reader's warning named the URL with its password, on every run (each second here). The
    test waits for three runs, however long a loaded machine takes to reach them."""
    routes = Routes()
    routes.text("/metrics", _page(f"{UTIL0} 0.9"))
    with serve(routes) as base:
        source = base.replace("http://", "http://admin:s3cret@") + "/metrics"
        with cli_process("advise", "--source", source, "--advise.interval", "1s") as running:
            advisor, process = running
            wait_until(lambda: runs(advisor) >= 3, "three advisor runs", process)
            process.send_signal(signal.SIGTERM)
            reap(process)
            err = process.stderr.read()
    assert "s3cret" not in err
    warnings = [line for line in err.splitlines() if "given more than once" in line]
    assert len(warnings) == 1, err
    assert "http://admin:***@127.0.0.1:" in warnings[0]
    assert "source=advisor.ingest.exporter_scrape" in warnings[0]


def runs(base: str) -> float:
    """The advisor's run counter (0 while it cannot be read)."""
    try:
        page = requests.get(f"{base}/metrics", timeout=10).text
    except requests.RequestException:
        return 0.0
    return sum(
        sample.value
        for family in text_string_to_metric_families(page)
        for sample in family.samples
        if sample.name == "gpu_advisor_runs_total"
    )


def test_the_app_process_log_is_redacted_and_set_up_once(capsys):
    """The app (Streamlit runs its script again on every interaction) logged a failed refresh
    of `http://admin:s3cret@…` with the password, through Python's last-resort handler."""
    from advisor.app import data

    root = logging.getLogger()
    earlier = [h for h in root.handlers if getattr(h, "gpu_defrag_app", False)]
    for handler in earlier:  # set up by an app test of this process before this one
        root.removeHandler(handler)
    before = list(root.handlers)
    try:
        data.configure_logging()
        data.configure_logging()  # a rerun of the page script
        added = [h for h in root.handlers if h not in before]
        assert len(added) == 1
        for _ in range(3):  # the poller, every refresh
            logging.getLogger("advisor.app.data").warning(
                "refresh of %s failed: %s", "http://admin:s3cret@gpu-01:9835/metrics", "timeout"
            )
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "s3cret" not in err
        assert "msg=refresh of http://admin:***@gpu-01:9835/metrics failed: timeout" in err
    finally:
        for handler in [h for h in root.handlers if h not in before]:
            root.removeHandler(handler)
        for handler in earlier:
            root.addHandler(handler)


def test_a_service_record_is_redacted_once_though_it_passes_two_filters(monkeypatch):
    """The service's own records pass the filter on `advisor.service` and again on the process's
    handlers: the second pass re-ran `redact` over every message and traceback."""
    import io

    from advisor.service import loop

    calls = []
    monkeypatch.setattr(logs, "redact", lambda text: calls.append(text) or text)
    handler = logging.StreamHandler(io.StringIO())
    logs.install_log_filters([handler])
    loop.log.addHandler(handler)
    try:
        loop.log.warning("source %s is down", "http://a:b@x/metrics")
    finally:
        loop.log.removeHandler(handler)
    assert calls == ["source http://a:b@x/metrics is down"]


def test_a_one_shot_commands_warning_hides_the_sources_password():
    """`analyze` and `snapshot` configure no log handler: the reader's warning went out through
    Python's last-resort handler with the password of the URL."""
    routes = Routes()
    routes.text("/metrics", _page(f"{UTIL0} 0.9"))
    with serve(routes) as base:
        source = base.replace("http://", "http://admin:s3cret@") + "/metrics"
        for command in (["analyze", source], ["snapshot", source]):
            run = subprocess.run(
                [sys.executable, "-m", "advisor.cli", *command],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert run.returncode == 0, run.stderr
            assert "s3cret" not in run.stderr + run.stdout
            assert "http://admin:***@127.0.0.1:" in run.stderr
            assert "given more than once" in run.stderr


def test_a_one_shot_commands_error_line_hides_the_sources_password():
    from tests.ports import free_port

    down = f"admin:s3cret@127.0.0.1:{free_port()}"
    commands = {
        "analyze": ["analyze", f"http://{down}/metrics"],
        "plan": ["plan", f"prometheus+http://{down}", "--goal", "recommend"],
        "backtest": ["backtest", f"prometheus+http://{down}/?query=up"],
    }
    for name, command in commands.items():
        run = subprocess.run(
            [sys.executable, "-m", "advisor.cli", *command],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode != 0 and run.stderr.count("\n") == 1, (name, run.stderr)
        assert "unreachable" in run.stderr and "admin:***@127.0.0.1" in run.stderr, run.stderr
        assert "s3cret" not in run.stderr, run.stderr
