"""Bounds on the numbers a command takes, a backfill that stops on SIGTERM, one line for a bad
sim option, a standard output that cannot be written, and an app address that cannot be bound:
each refused or handled in one line instead of memory, a spin or a traceback."""

from __future__ import annotations

import argparse
import errno
import io
import itertools
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from advisor import cli as advisor_cli
from advisor.cli import build_parser, main
from advisor.ingest.sources import SourceError, load_source

# --------------------------------------------------------------------------- 1: backfill


def test_the_backfill_bound_is_the_history_the_service_keeps() -> None:
    from advisor.forecast.live_idle import IDLE_MAX_H
    from advisor.history import NODE_HOURS
    from advisor.ingest.backfill import MAX_SPAN_S

    assert MAX_SPAN_S == NODE_HOURS * 3600.0 == IDLE_MAX_H * 3600.0 == 16 * 86400.0


@pytest.mark.slow
def test_sigterm_during_a_long_backfill_ends_the_advisor_promptly() -> None:
    """A week of 1,000 simulated nodes takes over a minute to step; SIGTERM once the backfill
    has run for 2 CPU-seconds after the server answered must end the process at the next
    simulated hour, exit 0. Both bounds are the process's own CPU time: a loaded machine
    stretches its wall time several times over, not the work it does."""
    from tests.fakes.cli_process import cli_process
    from tests.fakes.waiting import cpu_seconds, reap, wait_until

    args = ("--source", "sim:a100-16x8?nodes=1000", "--history.backfill", "16d")
    with cli_process("advise", *args, ready="/-/healthy") as (_base, process):
        started = cpu_seconds(process.pid)
        wait_until(lambda: cpu_seconds(process.pid) >= started + 2.0, "2 s of backfill", process)
        before = cpu_seconds(process.pid)
        process.send_signal(signal.SIGTERM)
        after = reap(process) - before  # one simulated hour of 1,000 nodes, then the exit
        err = process.stderr.read()
    assert process.returncode == 0 and after < 3.0, (process.returncode, after, err[-500:])
    assert "backfilled" in err and ": stopped" in err  # what was read, and why it ended


def test_a_sim_backfill_asks_to_stop_at_least_every_simulated_hour() -> None:
    from advisor.ingest import backfill as B
    from advisor.ingest.live import LiveSim

    sim = LiveSim("sim:a100-16x8?nodes=2&t=10d", clock=lambda: 0.0)
    asked = []

    def cancelled() -> bool:
        asked.append(sim.fleet.now)
        return len(asked) > 3

    past = B.backfill("sim:a100-16x8?nodes=2&t=10d", sim, 3 * 3600.0, cancelled=cancelled)
    assert past is not None and past.models == [] and past.reason == "stopped"
    assert sim.fleet.now <= 3 * 3600.0  # not stepped to t - span (~10 days) in one go
    assert all(b - a <= 3600.0 for a, b in itertools.pairwise(asked))


def test_a_sim_exporters_backfill_stops_when_cancelled(monkeypatch) -> None:
    from advisor.ingest import backfill as B
    from exporter.readings import SimClock

    clock = SimClock("a100-16x8", 42, 2, 10 * 86400.0, 1.7e9)
    monkeypatch.setattr(B.scrape, "fetch", lambda url, timeout: "")
    monkeypatch.setattr(B.scrape, "parse", lambda text, url: None)
    monkeypatch.setattr(B.scrape, "sim_clock", lambda page: clock)
    calls = []
    past = B.backfill(
        "http://127.0.0.1:1/metrics",
        lambda: None,
        48 * 3600.0,
        cancelled=lambda: calls.append(1) or len(calls) > 5,
    )
    assert past is not None and past.reason == "stopped" and len(past.models) < 48


# --------------------------------------------------------------------------- 2: bounds


def _refused(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    return err


ADVISE = ["advise", "--source", "sim:a100-16x8"]
EXPORTER = ["exporter", "--backend", "sim"]
REPLAY = ["replay", "--nodes", "n.csv", "--pods", "p.csv", "--out", "out"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([*ADVISE, "--history.backfill", "100000d"], "argument --history.backfill: '100000d'"),
        ([*ADVISE, "--history.backfill", "17d"], "at most 16d, the past the advisor keeps"),
        ([*ADVISE, "--sim.backfill", "365d"], "argument --sim.backfill: '365d'"),
        ([*EXPORTER, "--sim.nodes", "100000000"], "argument --sim.nodes: '100000000'"),
        ([*EXPORTER, "--sim.nodes", "10001"], "<= 10000"),
        ([*EXPORTER, "--sim.speed", "inf"], "argument --sim.speed: 'inf'"),
        ([*EXPORTER, "--sim.speed", "3601"], "<= 3600"),
        ([*EXPORTER, "--sim.speed", "0"], "argument --sim.speed: '0'"),
        ([*EXPORTER, "--sim.start", "100000d"], "argument --sim.start: '100000d': at most 30d"),
        ([*EXPORTER, "--sim.seed", "-1"], "argument --sim.seed: '-1'"),
        (["demo", "--sim-speed", "inf"], "argument --sim-speed: 'inf'"),
        (["demo", "--sim-speed", "3601"], "<= 3600"),  # the exporter it starts would refuse it
        ([*REPLAY, "--ratio", "1e6"], "argument --ratio: '1e6': expected a finite number > 0"),
        ([*REPLAY, "--seeds", "1-100000000"], "argument --seeds: '1-100000000': at most 1000"),
        ([*REPLAY, "--seeds", "1-600,601-1001"], "at most 1000 seeds"),
        ([*REPLAY, "--jobs", "10000"], "argument --jobs: '10000'"),
    ],
)
def test_out_of_bounds_numbers_are_refused_at_their_flag(argv, message, capsys) -> None:
    started = time.monotonic()
    err = _refused(argv, capsys)
    assert message in err and err.startswith("gpu-defrag ")
    assert time.monotonic() - started < 2.0  # refused up front (a seed range is not expanded)


@pytest.mark.parametrize(
    ("argv", "dest", "value"),
    [
        ([*ADVISE, "--history.backfill", "16d"], "history_backfill", 16 * 86400.0),
        ([*EXPORTER, "--sim.nodes", "10000"], "sim_nodes", 10000),
        ([*EXPORTER, "--sim.speed", "3600"], "sim_speed", 3600.0),
        ([*EXPORTER, "--sim.start", "30d"], "sim_start", 30 * 86400.0),
        ([*EXPORTER, "--sim.seed", "0"], "sim_seed", 0),
        (["demo", "--sim-speed", "3600"], "sim_speed", 3600.0),
        ([*REPLAY, "--ratio", "10"], "ratio", 10.0),
        ([*REPLAY, "--jobs", "64"], "jobs", 64),
    ],
)
def test_the_bounds_themselves_are_accepted(argv, dest, value) -> None:
    assert getattr(build_parser().parse_args(argv), dest) == value


def test_a_thousand_seeds_are_accepted() -> None:
    assert build_parser().parse_args([*REPLAY, "--seeds", "1-1000"]).seeds == list(range(1, 1001))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("sim:a100-16x8?nodes=100000000", "nodes='100000000': expected a finite whole number"),
        ("sim:a100-16x8?nodes=10001", "<= 10000"),
        ("sim:a100-16x8?t=100000d", "t=100000d: at most 30d"),
        ("sim:a100-16x8?t=7d&history=7d&step=1", "604,800 usage samples; at most 10,080"),
    ],
)
def test_a_sim_source_takes_the_exporters_bounds(spec, message) -> None:
    started = time.monotonic()
    with pytest.raises(SourceError) as error:
        load_source(spec)
    assert str(error.value).startswith(spec + ": ") and message in str(error.value)
    assert "\n" not in str(error.value)
    assert time.monotonic() - started < 2.0  # refused before anything is simulated


# --------------------------------------------------------------------------- 3: seed


@pytest.mark.parametrize("command", ["analyze", "snapshot"])
def test_a_negative_sim_seed_is_one_line_naming_seed(command, capsys) -> None:
    assert main([command, "sim:a100-16x8?seed=-1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "sim:a100-16x8?seed=-1: seed='-1': expected a finite whole number >= 0" in err


def test_plan_and_advise_name_the_seed_too(capsys, monkeypatch) -> None:
    # the service installs its log filters on the process's root handlers, pytest's own
    # among them, where they would hold back other tests' repeated warnings
    monkeypatch.setattr("advisor.logs.install_log_filters", lambda handlers, every_s=0: None)
    assert main(["plan", "sim:a100-16x8?seed=-1", "--goal", "free-nodes=6"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "seed='-1'" in err
    args = build_parser().parse_args(["advise", "--source", "sim:a100-16x8?seed=-1"])
    assert args.func(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "seed='-1'" in err


# --------------------------------------------------------------------------- 4: stdout


def _fake_command(monkeypatch, body) -> None:
    """`gpu-defrag fake` runs `body(stdout)`: main's handling of stdout, whatever the command."""
    real = build_parser

    def parser(argv=None) -> argparse.ArgumentParser:
        p = real(argv)
        sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
        sub.add_parser("fake").set_defaults(func=lambda _args: body(sys.stdout))
        return p

    monkeypatch.setattr(advisor_cli, "build_parser", parser)


class Failing(io.StringIO):
    """A standard output whose writes (or only its flushes) fail with `error`."""

    def __init__(self, error: OSError, on_write: bool = True) -> None:
        super().__init__()
        self.error, self.on_write = error, on_write

    def write(self, text: str) -> int:
        if self.on_write:
            raise self.error
        return super().write(text)

    def flush(self) -> None:
        raise self.error


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO])
def test_a_stdout_that_fails_is_one_line_and_exit_1(monkeypatch, capsys, code) -> None:
    _fake_command(monkeypatch, lambda out: print("result", file=out) or 0)
    monkeypatch.setattr(sys, "stdout", Failing(OSError(code, "no way")))
    assert main(["fake"]) == 1
    err = capsys.readouterr().err
    assert err == "gpu-defrag fake: error: cannot write to standard output: no way\n"


def test_output_that_fails_only_at_the_flush_after_the_command_is_exit_1(
    monkeypatch, capsys
) -> None:
    """Buffered output the command never flushed: main flushes it, not the interpreter."""
    _fake_command(monkeypatch, lambda out: out.write("result\n") and 0)
    monkeypatch.setattr(sys, "stdout", Failing(OSError(errno.ENOSPC, "full"), on_write=False))
    assert main(["fake"]) == 1
    assert "cannot write to standard output: full" in capsys.readouterr().err


def test_a_closed_pipe_part_way_is_quiet_and_not_a_success(monkeypatch, capsys) -> None:
    after = []

    def body(out) -> int:
        print("first", file=out)
        after.append("the rest of the work")  # never reached
        return 0

    _fake_command(monkeypatch, body)
    monkeypatch.setattr(sys, "stdout", Failing(BrokenPipeError(errno.EPIPE, "Broken pipe")))
    assert main(["fake"]) == advisor_cli.SIGPIPE_EXIT == 141
    assert capsys.readouterr().err == "" and after == []


def test_a_closed_pipe_after_the_command_finished_keeps_its_status(monkeypatch, capsys) -> None:
    _fake_command(monkeypatch, lambda out: out.write("all of it\n") and 3)
    broken = Failing(BrokenPipeError(errno.EPIPE, "Broken pipe"), on_write=False)
    monkeypatch.setattr(sys, "stdout", broken)
    assert main(["fake"]) == 3
    assert capsys.readouterr().err == ""


def test_an_oserror_that_is_not_stdouts_is_the_commands_own(monkeypatch) -> None:
    def body(out) -> int:
        raise OSError(errno.ENOSPC, "a file of the command's own")

    _fake_command(monkeypatch, body)
    with pytest.raises(OSError, match="own"):
        main(["fake"])


def _cli(*args: str, stdout) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "advisor.cli", *args],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
    )


def test_plan_and_replay_to_dev_full_are_one_line(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,P100\n")
    pods = tmp_path / "pods.csv"
    pods.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
        "deletion_time,scheduled_time\np0,1000,1024,1,1000,,LS,Running,0,10,0\n"
    )
    runs = {
        "plan": ["plan", "sim:a100-16x8", "--goal", "free-nodes=6"],
        "replay": [
            *("replay", "--nodes", str(nodes), "--pods", str(pods), "--seeds", "1"),
            *("--policies", "bestfit", "--jobs", "1", "--out", str(tmp_path / "out")),
        ],
    }
    for command, argv in runs.items():
        with open("/dev/full", "w") as full:
            done = _cli(*argv, stdout=full)
        assert done.returncode == 1, (command, done.stderr)
        assert done.stderr == (
            f"gpu-defrag {command}: error: cannot write to standard output: No space left on device\n"
        )


def test_analyze_into_a_reader_that_stops_is_quiet() -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "advisor.cli", "snapshot", "sim:a100-16x8?nodes=300"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.read(10)  # `| head -c 10`
    process.stdout.close()
    assert process.wait(timeout=60) in (0, 141)  # 141 when the pipe broke part way
    assert process.stderr.read() == b""


# --------------------------------------------------------------------------- 5: app address


def _no_child(*args, **kwargs):
    raise AssertionError("Streamlit was started")


def test_an_app_address_not_on_this_machine_is_one_line(monkeypatch, capsys) -> None:
    from advisor.app import cli as app_cli

    monkeypatch.setattr(app_cli.subprocess, "Popen", _no_child)
    address = "192.0.2.1"  # TEST-NET-1 (RFC 5737): never an address of this machine
    args = build_parser().parse_args(["app", "--address", address])
    assert args.func(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"gpu-defrag app: error: --address {address}: cannot listen on {address}")


def test_an_app_port_in_use_names_the_port(monkeypatch, capsys) -> None:
    from advisor.app import cli as app_cli

    monkeypatch.setattr(app_cli.subprocess, "Popen", _no_child)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        args = build_parser().parse_args(["app", "--port", str(port)])
        assert args.func(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpu-defrag app: error: --port {port}: cannot listen on 127.0.0.1:")
    assert err.count("\n") == 1


# --------------------------------------------------------------------------- 6: --out folders


def _replay_inputs(folder: Path) -> list[str]:
    nodes = folder / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,P100\n")
    pods = folder / "pods.csv"
    pods.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
        "deletion_time,scheduled_time\np0,1000,1024,1,1000,,LS,Running,0,10,0\n"
    )
    return [
        *("replay", "--nodes", str(nodes), "--pods", str(pods), "--seeds", "1"),
        *("--policies", "bestfit", "--jobs", "1"),
    ]


@pytest.mark.parametrize("command", ["backtest", "replay"])
def test_an_empty_out_is_refused_before_any_work(tmp_path: Path, command, capsys) -> None:
    """`--out ''` wrote nothing and exited 0 (backtest), or wrote its files into the current
    folder (replay: Path('') is '.')."""
    if command == "backtest":
        from tests.advisor.test_forecast_cli import _long_csv

        argv = ["backtest", str(_long_csv(tmp_path)), "--horizons", "1", "--replays", ""]
        argv += ["--out", ""]
        code = main(argv)
    else:
        with pytest.raises(SystemExit) as exit_:
            main([*_replay_inputs(tmp_path), "--out", ""])
        code = exit_.value.code
    assert code == 2
    assert "empty path" in capsys.readouterr().err


def test_a_backtest_and_a_replay_share_an_out_folder_without_losing_a_file(tmp_path) -> None:
    """The second command used to replace the folder whole: the backtest's eight files were
    gone and its summary.csv was the replay's. Each now replaces only its own files, and a
    name it did not write (summary.csv is both commands') is refused before the work."""
    from tests.advisor.test_forecast_cli import _long_csv

    out = tmp_path / "out"
    series = _long_csv(tmp_path)
    assert (
        main(["backtest", str(series), "--horizons", "1", "--replays", "", "--out", str(out)]) == 0
    )
    backtest = {p.name: p.read_bytes() for p in out.iterdir()}
    (out / "notes.txt").write_text("mine\n")
    done = _cli(*_replay_inputs(tmp_path), "--out", str(out), stdout=subprocess.DEVNULL)
    assert done.returncode == 2 and "summary.csv" in done.stderr and "\n" not in done.stderr[:-1]
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.name != "notes.txt"} == backtest
    assert (out / "notes.txt").read_text() == "mine\n"
    # a rerun of the same command replaces its own files and keeps the user's
    assert (
        main(["backtest", str(series), "--horizons", "1", "--replays", "", "--out", str(out)]) == 0
    )
    assert (out / "notes.txt").read_text() == "mine\n" and (out / "metrics.csv").exists()
