"""`gpu-defrag app` and `gpu-defrag demo`: flags reach streamlit and the app as documented."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from advisor.app import cli, data
from advisor.cli import build_parser
from tests.ports import free_port


def test_app_flags() -> None:
    args = build_parser().parse_args(
        ["app", "--source", "sim:mixed-h100-a100-v100", "--address", "0.0.0.0", "--port", "9999"]
    )
    assert args.func is cli.run_app
    command = cli.streamlit_command(args.address, args.port, args.source)
    assert command[1:4] == ["-m", "streamlit", "run"] and command[4].endswith("app/main.py")
    joined = " ".join(command)
    assert "--server.address 0.0.0.0 --server.port 9999" in joined
    assert "--server.headless true" in joined and "--browser.gatherUsageStats false" in joined
    # what follows `--` reaches the script, where the app reads it
    assert data.initial_source(command[command.index("--") + 1 :], {}) == args.source
    env = cli.app_env(args.source, 3.0)
    assert env[data.SOURCE_ENV] == args.source and data.refresh_seconds(env) == 3.0
    assert cli.url_of("0.0.0.0", 9999) == "http://127.0.0.1:9999/"


def test_app_defaults_and_demo_children() -> None:
    args = build_parser().parse_args(["app"])
    assert (args.source, args.address, args.port) == (data.DEFAULT_SOURCE, "127.0.0.1", 8501)
    demo = build_parser().parse_args(["demo"])
    assert demo.func is cli.run_demo and demo.preset == "a100-16x8" and demo.sim_speed == 60
    exporter = " ".join(cli.exporter_command("a100-16x8", "fd://5", 60))
    assert "exporter --backend sim --sim.preset a100-16x8 --sim.speed 60 --sim.start 7d" in exporter
    assert "--web.listen-address fd://5" in exporter
    advisor = " ".join(cli.advisor_command("http://127.0.0.1:1234/metrics", "fd://6", 5))
    assert "advise --source http://127.0.0.1:1234/metrics --advise.interval 5s" in advisor
    assert "--web.listen-address fd://6" in advisor


def test_a_demo_child_listens_on_the_socket_the_demo_bound() -> None:
    """The demo binds each server's port itself and hands the socket down: the port it reports
    is the child's from the start, and no other process can take it in between."""
    script = (
        "import socket, sys; s = socket.socket(fileno=int(sys.argv[1][5:])); "
        "c, _ = s.accept(); c.sendall(b'mine'); c.close()"
    )
    child, port = cli.start_server(lambda listen: [sys.executable, "-c", script, listen], 0)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            assert sock.recv(16) == b"mine"
        assert child.wait(timeout=10) == 0
        assert cli.port_taken("127.0.0.1", port) == ""  # this process kept no copy of it
    finally:
        child.kill()


@contextmanager
def http_200() -> Iterator[int]:
    """Another HTTP server answering 200 everywhere; yields its port."""

    class Ok(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Ok)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield httpd.server_address[1]
    finally:
        httpd.shutdown()
        httpd.server_close()


class ExitsDuringTheCheck:
    """A child still running at the first poll that has exited (it could not bind the port)
    by the time the other server's 200 arrives."""

    def __init__(self) -> None:
        self.polls = 0

    def poll(self) -> int | None:
        self.polls += 1
        return None if self.polls == 1 else 2


def test_a_200_from_another_server_is_not_the_child_starting() -> None:
    with http_200() as port:
        assert not cli.wait_http(f"http://127.0.0.1:{port}/", 5, ExitsDuringTheCheck())
        assert cli.wait_http(f"http://127.0.0.1:{port}/", 5)  # no child to watch: the 200 counts


class ExitsAfter:
    """A child that runs for `polls` polls, then exits (as one that failed to start)."""

    def __init__(self, polls: int) -> None:
        self.polls, self.limit = 0, polls

    def poll(self) -> int | None:
        self.polls += 1
        return None if self.polls < self.limit else 1


def test_a_slow_child_is_waited_for_while_it_runs_and_said_so(monkeypatch, capsys) -> None:
    """No budget of seconds: a child that has not answered is waited for as long as it runs (on
    a loaded machine it starts slowly, not never), with a line now and then; its exit ends it."""
    monkeypatch.setattr(cli, "NOTE_EVERY_S", 0.0)
    child = ExitsAfter(polls=4)
    url = f"http://127.0.0.1:{free_port()}/"  # nothing listens
    assert not cli.wait_http(url, None, child, "the advisor service")
    assert child.polls == 4
    notes = capsys.readouterr().err.splitlines()
    assert notes and all(
        line.startswith(f"gpu-defrag: still waiting for the advisor service on {url} (")
        for line in notes
    )


@pytest.mark.parametrize("flag", ["--exporter-port", "--advisor-port", "--port"])
def test_demo_refuses_a_port_another_server_holds_before_starting_anything(
    monkeypatch, capsys, flag
) -> None:
    def no_child(*args, **kwargs):
        raise AssertionError("a child was started")

    monkeypatch.setattr(cli.subprocess, "Popen", no_child)
    with http_200() as port:
        args = build_parser().parse_args(["demo", flag, str(port)])
        assert args.func(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"gpu-defrag demo: error: {flag} {port}: cannot listen on ")
    assert f":{port} (" in err and "\n" not in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--refresh", "0"], "argument --refresh: '0' is not a positive duration"),
        (["--refresh", "-1"], "argument --refresh: '-1'"),
        (["--refresh", "nan"], "argument --refresh: 'nan'"),
        (["--preset", "nope"], "argument --preset: invalid choice: 'nope'"),
        (["--sim-speed", "0"], "argument --sim-speed: '0': expected a finite number > 0"),
    ],
)
def test_demo_flags_are_checked_by_its_own_parser(capsys, args, message) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["demo", *args])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]


class _Child:
    """A started child that runs until terminated."""

    def __init__(self, *args, **kwargs) -> None:
        self.terminated = False

    def poll(self):
        return -15 if self.terminated else None

    def terminate(self) -> None:
        self.terminated = True

    def wait(self, timeout=None) -> int:
        return -15


class _FailsAtTheLastLine:
    """A standard output that takes the start-up lines and fails at the last one (the one
    that says how to stop it)."""

    def write(self, text: str) -> int:
        if "Ctrl-C" in text:
            raise OSError(9, "standard output is closed")
        return len(text)

    def flush(self) -> None:
        pass


@pytest.mark.parametrize("argv", [["app"], ["demo"]])
def test_a_status_line_that_cannot_be_written_stops_every_child(monkeypatch, argv) -> None:
    """`gpu-defrag demo >&-` (or a full disk) fails at its status line: exit 1 from `main`, and
    the exporter, advisor and app it started are stopped, not left running unsupervised."""
    started: list[_Child] = []

    def child(*args, **kwargs) -> _Child:
        started.append(_Child())
        return started[-1]

    monkeypatch.setattr(cli.subprocess, "Popen", child)
    monkeypatch.setattr(cli, "wait_http", lambda *args, **kwargs: True)
    monkeypatch.setattr(cli, "app_address_taken", lambda *args: "")
    monkeypatch.setattr(cli, "demo_ports_taken", lambda *args: "")
    monkeypatch.setattr(cli.sys, "stdout", _FailsAtTheLastLine())
    args = build_parser().parse_args(argv)
    with pytest.raises(OSError, match="standard output is closed"):
        args.func(args)
    assert started and all(c.terminated for c in started)


def test_sigterm_while_the_demo_starts_stops_the_children_it_started(tmp_path: Path) -> None:
    """Killed by SIGTERM's default action while its children start, the demo left them
    running (a supervisor's stop, `timeout`, `docker stop`); they are stopped now."""
    err = tmp_path / "err"
    with err.open("w") as stderr:  # a file: orphans holding a pipe would block its reader
        demo = subprocess.Popen(
            [sys.executable, "-m", "advisor.cli", "demo", "--port", str(free_port())],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 120
        started: list[str] = []
        while not started and time.monotonic() < deadline and demo.poll() is None:
            pgrep = ["pgrep", "-P", str(demo.pid)]
            started = subprocess.run(pgrep, capture_output=True, text=True).stdout.split()
            time.sleep(0.1)
        assert started, "the demo started no child"
        demo.send_signal(signal.SIGTERM)
        demo.wait(timeout=60)
        assert "Traceback" not in err.read_text()
        for pid in started:
            stat = Path(f"/proc/{pid}/stat")
            assert not stat.exists() or stat.read_text().split()[2] == "Z", pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(demo.pid, signal.SIGKILL)
        demo.wait()
