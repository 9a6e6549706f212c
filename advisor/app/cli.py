"""`gpu-defrag app` (the Streamlit app alone) and `gpu-defrag demo` (exporter + advisor + app).

`demo` is what `make demo` runs on a fresh machine with no GPU and no server: (a) a sim exporter
serving preset a100-16x8 on 127.0.0.1, (b) the advisor service (`gpu-defrag advise`) reading it
and keeping the history (its /metrics and /api are what Prometheus and Grafana would read), and
(c) the app, which renders the advisor's API (`--advisor`): no second reader, history or
forecast. `gpu-defrag app --source SPEC` runs the same pipeline in the app's own process.
Ctrl-C stops every child.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from advisor.extras import require
from gpu_defrag_common.messages import error_line, say_error
from gpu_defrag_common.server import listening_socket

APP_PACKAGES = ("streamlit", "plotly")  # the [app] extra, checked before any child starts
DEFAULT_SOURCE = "sim:a100-16x8"
SOURCE_ENV = "GPU_DEFRAG_SOURCE"  # the app's starting source (also `-- --source X`)
ADVISOR_ENV = "GPU_DEFRAG_ADVISOR"  # an advisor service's URL the app reads (also `-- --advisor`)
ADVISOR_PREFIX = "advisor+"  # the app's spec of an advisor service: advisor+http://HOST:PORT
REFRESH_ENV = "GPU_DEFRAG_REFRESH"  # seconds between reads of a live source
MAIN = Path(__file__).with_name("main.py")
DEMO_PRESET = "a100-16x8"
DEMO_SIM_START = (
    "7d"  # the demo fleet has a simulated week behind it, which advisor and app read back
)


def register(subparsers: argparse._SubParsersAction) -> None:
    # imported here, not at the top: the app's own process imports this module's constants
    from advisor.ingest.schedulers import JoinSources
    from gpu_defrag_common.units import number
    from gpu_defrag_sim.bounds import MAX_SPEED, speed_flag
    from gpu_defrag_sim.presets import PRESETS

    app = subparsers.add_parser(
        "app",
        description="Start the capacity-review app (Fleet, Fragmentation, Forecast, Actions, "
        "What-if): on an advisor service's API (--advisor), or on SOURCE with the advisor "
        "pipeline in its own process. It never executes an action.",
    )
    app.add_argument(
        "--source",
        default=DEFAULT_SOURCE,
        action=JoinSources,
        metavar="SOURCE",
        help=f"sim:PRESET, exporter URLs, prometheus+http://..., FILE.json, openb:... or "
        f"k8s:...; repeated, a scheduler and the usage source it joins by node name "
        f"(k8s:...+http://...) (default {DEFAULT_SOURCE}); can be changed in the sidebar",
    )
    app.add_argument(
        "--advisor",
        default="",
        metavar="URL",
        help="a running `gpu-defrag advise` (e.g. http://127.0.0.1:9836): the app shows what "
        "its API serves instead of reading SOURCE itself",
    )
    _server_flags(app)
    app.set_defaults(func=run_app)

    demo = subparsers.add_parser(
        "demo",
        description="Start a sim exporter serving preset a100-16x8 a simulated week into its "
        "life, the advisor service reading it, and the app showing the advisor's API; print the "
        "URL. Ctrl-C stops everything.",
    )
    _server_flags(demo)
    demo.add_argument(
        "--exporter-port",
        type=number(0, 65535, kind=int),
        default=0,
        metavar="PORT",
        help="port of the sim exporter (default: a free one)",
    )
    demo.add_argument(
        "--sim-speed",
        type=speed_flag,  # the exporter's --sim.speed, which it is passed to
        default=60.0,
        metavar="X",
        help=f"simulated seconds per real second, at most {MAX_SPEED:g} "
        "(default 60: an hour a minute)",
    )
    demo.add_argument(
        "--preset", choices=PRESETS, default=DEMO_PRESET, help=f"sim preset (default {DEMO_PRESET})"
    )
    demo.add_argument(
        "--advisor-port",
        type=number(0, 65535, kind=int),
        default=0,
        metavar="PORT",
        help="port of the advisor service (default: a free one)",
    )
    demo.add_argument(
        "--no-advisor",
        action="store_true",
        help="do not start the advisor service: the app runs the pipeline on the exporter itself",
    )
    demo.set_defaults(func=run_demo)


def _server_flags(parser: argparse.ArgumentParser) -> None:
    from gpu_defrag_common.units import number, positive_duration

    parser.add_argument("--address", default="127.0.0.1", help="listen address")
    parser.add_argument("--port", type=number(1, 65535, kind=int), default=8501, help="app port")
    parser.add_argument(
        "--refresh",
        type=positive_duration,
        default=None,
        metavar="SECONDS",
        help="how often live sources (and the advisor's API) are re-read (default 15; demo 5)",
    )


def streamlit_command(address: str, port: int, source: str) -> list[str]:
    """`python -m streamlit run main.py` with server flags (no config file needed)."""
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(MAIN),
        "--server.headless",
        "true",
        "--server.address",
        address,
        "--server.port",
        str(port),
        "--browser.gatherUsageStats",
        "false",
        "--server.fileWatcherType",
        "none",
        "--client.toolbarMode",
        "viewer",
        "--",
        "--source",
        source,
    ]


def app_env(source: str, refresh: float | None) -> dict[str, str]:
    env = dict(os.environ, **{SOURCE_ENV: source})
    if refresh is not None:
        env[REFRESH_ENV] = str(refresh)
    return env


def url_of(address: str, port: int) -> str:
    host = "127.0.0.1" if address in ("0.0.0.0", "") else address
    return f"http://{host}:{port}/"


NOTE_EVERY_S = 30.0  # a child still starting says so this often


def wait_http(
    url: str, timeout_s: float | None, process: subprocess.Popen | None = None, name: str = ""
) -> bool:
    """Poll `url` until it answers 200 with the process still running (the 200 may come from
    another server on the port while the child fails to bind it), the process exits, or time
    runs out. `timeout_s` None waits as long as `process` runs: a child on a busy machine is
    slow, not dead, and one that fails exits; with `name`, a line on stderr says every
    `NOTE_EVERY_S` that it is still being waited for."""
    started = time.monotonic()
    noted = started
    while timeout_s is None or time.monotonic() < started + timeout_s:
        if process is not None and process.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return process is None or process.poll() is None
        except (urllib.error.URLError, OSError):
            pass
        if name and time.monotonic() - noted >= NOTE_EVERY_S:
            noted = time.monotonic()
            waited = noted - started
            print(
                f"gpu-defrag: still waiting for {name} on {url} ({waited:.0f} s)", file=sys.stderr
            )
        time.sleep(0.2)
    return False


def port_taken(address: str, port: int) -> str:
    """Why `port` cannot be listened on at `address`, '' when it can. SO_REUSEADDR as the
    servers set it, so a port left in TIME_WAIT counts as free."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except (OSError, OverflowError) as error:
            return getattr(error, "strerror", None) or str(error)
    return ""


def app_address_taken(address: str, port: int) -> str:
    """One line naming the flag at fault when the app cannot listen on `address`:`port`, ''
    when it can: `--address` when nothing can be bound there (not an address of this machine,
    an unknown host name), else `--port`. Checked before Streamlit starts, whose own failure is
    a traceback of 50 lines."""
    why = port_taken(address, 0)
    if why:
        return f"--address {address}: cannot listen on {address} ({why})"
    why = port_taken(address, port)
    if why:
        return f"--port {port}: cannot listen on {address}:{port} ({why})"
    return ""


def demo_ports_taken(args: argparse.Namespace) -> str:
    """One line naming the first address or port asked for that cannot be listened on, '' if
    none: a server already there would answer the readiness check in the child's place."""
    taken = app_address_taken(args.address, args.port)
    if taken:
        return taken
    wanted: list[tuple[str, str, int]] = []
    if args.exporter_port:
        wanted.append(("--exporter-port", "127.0.0.1", args.exporter_port))
    if args.advisor_port and not args.no_advisor:
        wanted.append(("--advisor-port", "127.0.0.1", args.advisor_port))
    for flag, address, port in wanted:
        why = port_taken(address, port)
        if why:
            return f"{flag} {port}: cannot listen on {address}:{port} ({why})"
    return ""


Child = tuple[str, subprocess.Popen]


def _stop(children: Sequence[Child]) -> None:
    """Terminate children by PID (SIGTERM, then SIGKILL after 5 s)."""
    processes = [process for _, process in children]
    for process in processes:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + 5
    for process in processes:
        try:
            process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


@contextmanager
def _interrupted_by_signals() -> Iterator[None]:
    """SIGTERM and SIGINT raise KeyboardInterrupt inside the block, so the demo stops its
    children however it is stopped, while they start too (killed by SIGTERM's default action
    it would leave them running). SIGINT too: a shell starts background jobs with SIGINT
    ignored, and Ctrl-C must still work."""
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _supervise(children: Sequence[Child]) -> int:
    """Block until Ctrl-C/SIGTERM or a child exits; then stop all. Returns the exit code."""
    try:
        while True:
            for name, process in children:
                code = process.poll()
                if code is not None:
                    print(
                        error_line("demo", f"the {name} exited with {code}; stopping the rest"),
                        file=sys.stderr,
                    )
                    return code or 1
            time.sleep(0.5)
    except KeyboardInterrupt:
        print("\nstopping…", file=sys.stderr)
        return 0
    finally:
        _stop(children)


def advisor_source(url: str) -> str:
    """The app's spec of an advisor service at `url` (`/api/` and a trailing slash dropped)."""
    url = url.strip().removeprefix(ADVISOR_PREFIX).rstrip("/").removesuffix("/api")
    return ADVISOR_PREFIX + (url if "://" in url else f"http://{url}")


def run_app(args: argparse.Namespace) -> int:
    require(*APP_PACKAGES)
    taken = app_address_taken(args.address, args.port)
    if taken:
        say_error("app", taken)
        return 2
    source = advisor_source(args.advisor) if args.advisor else args.source
    command = streamlit_command(args.address, args.port, source)
    children = [("app", subprocess.Popen(command, env=app_env(source, args.refresh)))]
    url = url_of(args.address, args.port)
    if not wait_http(url + "_stcore/health", None, children[0][1], "the app"):
        _stop(children)
        print(error_line("app", f"the app did not start on {url}"), file=sys.stderr)
        return 1
    try:  # a status line that cannot be written (`>&-`, a full disk) must not orphan the app
        print(f"gpu-defrag app on {url} (source {source}); Ctrl-C stops it", flush=True)
    except BaseException:
        _stop(children)
        raise
    return _supervise(children)


def exporter_command(preset: str, listen: str, speed: float) -> list[str]:
    return [
        sys.executable,
        "-m",
        "advisor.cli",
        "exporter",
        "--backend",
        "sim",
        "--sim.preset",
        preset,
        "--sim.speed",
        f"{speed:g}",
        "--sim.start",
        DEMO_SIM_START,
        "--collect.interval",
        "5",
        "--web.listen-address",
        listen,
    ]


def advisor_command(source: str, listen: str, interval_s: float) -> list[str]:
    return [
        sys.executable,
        "-m",
        "advisor.cli",
        "advise",
        "--source",
        source,
        "--advise.interval",
        f"{interval_s:g}s",
        "--web.listen-address",
        listen,
    ]


def start_server(command: Callable[[str], list[str]], port: int) -> tuple[subprocess.Popen, int]:
    """A server child on 127.0.0.1:`port` (0: any free port), and the port: this process binds
    the socket and hands it down (`fd://N`), so no other process can take the port between
    choosing it and the child listening (a readiness check would then talk to that one)."""
    sock, _ = listening_socket(f"127.0.0.1:{port}")
    with sock:
        fd = sock.fileno()
        return subprocess.Popen(command(f"fd://{fd}"), pass_fds=(fd,)), sock.getsockname()[1]


def run_demo(args: argparse.Namespace) -> int:
    require(*APP_PACKAGES)
    taken = demo_ports_taken(args)
    if taken:
        say_error("demo", taken)
        return 2
    with _interrupted_by_signals():
        return _run_demo(args)


def _run_demo(args: argparse.Namespace) -> int:
    children: list[Child] = []
    try:
        exporter, port = start_server(
            lambda listen: exporter_command(args.preset, listen, args.sim_speed),
            args.exporter_port,
        )
        exporter_url = f"http://127.0.0.1:{port}/metrics"
        children.append(("sim exporter", exporter))
        if not wait_http(exporter_url, None, exporter, "the sim exporter"):
            print(
                error_line("demo", f"the sim exporter did not answer on {exporter_url}"),
                file=sys.stderr,
            )
            _stop(children)
            return 1
        print(
            f"sim exporter ({args.preset}, {args.sim_speed:g}x time) on {exporter_url}", flush=True
        )
        refresh = 5.0 if args.refresh is None else args.refresh
        advisor_url = ""
        if not args.no_advisor:
            advisor, advisor_port = start_server(
                lambda listen: advisor_command(exporter_url, listen, refresh), args.advisor_port
            )
            advisor_url = f"http://127.0.0.1:{advisor_port}/"
            children.append(("advisor service", advisor))
            # its first run (after reading the fleet's week back): the app has a view at once
            if not wait_http(advisor_url + "health", None, advisor, "the advisor service"):
                print(
                    error_line("demo", f"the advisor did not answer on {advisor_url}"),
                    file=sys.stderr,
                )
                _stop(children)
                return 1
            print(f"advisor service on {advisor_url}metrics and {advisor_url}api/", flush=True)
        app_source = advisor_source(advisor_url) if advisor_url else exporter_url
        app = subprocess.Popen(
            streamlit_command(args.address, args.port, app_source),
            env=app_env(app_source, refresh),
        )
        children.append(("app", app))
        url = url_of(args.address, args.port)
        if not wait_http(url + "_stcore/health", None, app, "the app"):
            print(error_line("demo", f"the app did not start on {url}"), file=sys.stderr)
            _stop(children)
            return 1
        print(
            f"\n  gpu-defrag demo: open {url}\n"
            + (
                f"  (the app shows the advisor's API on {advisor_url}api/, read every "
                f"{refresh:g} s)"
                if advisor_url
                else f"  (the app runs the advisor pipeline on {exporter_url} every {refresh:g} s)"
            )
            + "\n  Ctrl-C stops everything.\n",
            flush=True,
        )
    except BaseException:  # a status line that cannot be written included: no orphans
        _stop(children)
        raise
    return _supervise(children)
