"""`gpu-defrag advise`: the advisor as a service — /metrics for Prometheus, a JSON API.

    gpu-defrag advise --source sim:a100-16x8
    gpu-defrag advise --source prometheus+http://prometheus:9090 --advise.interval 1m
    gpu-defrag advise --source http://node1:9835/metrics,http://node2:9835/metrics
    gpu-defrag advise --source k8s: --source http://node1:9835/metrics,http://node2:9835/metrics

Every `--advise.interval` it ingests the source, analyses fragmentation, forecasts demand per
pool from its own history and plans checked consolidations; see docs/service.md.
"""

from __future__ import annotations

import argparse
import logging
import math
import threading
from collections.abc import Callable
from http import HTTPStatus
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from advisor.settings import (
    HISTORY_MAX_POINTS,
    HORIZONS_H,
    IDLE_MAX_NODES,
    IDLE_RISK,
    IDLE_WINDOWS_H,
    MAX_TENANTS,
    OUTLOOK_HORIZONS_H,
    SHAPES_TEXT,
    TOP_ACTIONS,
    hours_text,
)
from gpu_defrag_common.messages import say_error
from gpu_defrag_common.progress import Progress, add_quiet_flag
from gpu_defrag_common.server_cli import add_server_arguments, configure_logging, server_limits
from gpu_defrag_common.shutdown import ShutdownSignals
from gpu_defrag_common.units import (
    duration,
    duration_at_most,
    duration_text,
    fraction,
    number,
    positive_duration,
)

if TYPE_CHECKING:
    from advisor.ingest.backfill import Backfill
    from gpu_defrag_common.server import Route

log = logging.getLogger("advisor.service")

# What a backfill gets to stop after SIGTERM, then it is left behind (its summary unsaid). The
# simulated hour of 1,000 nodes it finishes first takes 0.3-0.5 s of CPU, several times that in
# wall time on a loaded machine (2.5 s was too little at load average 12 on 2 cores); 8 s stays
# under the 10 s docker stop and compose wait before SIGKILL.
BACKFILL_STOP_S = 8.0

DEFAULT_LISTEN = ":9836"
HTML = "text/html; charset=utf-8"


def horizons(text: str) -> tuple[int, ...]:
    """'1h,6h,24h' -> (1, 6, 24): whole hours, the forecast's grid."""
    return _whole_hours(text, "a horizon like 1h or 24h", "horizons are whole hours (1h, 6h, 24h)")


MAX_IDLE_WINDOW_H = 168  # a week, as `gpu-defrag forecast --idle` and the demand horizons


def idle_windows(text: str) -> tuple[int, ...]:
    """'1h,4h,8h' -> (1, 4, 8): the idle windows W, whole hours from 1 to a week."""
    return _whole_hours(
        text,
        "a window like 1h or 8h",
        f"idle windows are whole hours from 1h to {MAX_IDLE_WINDOW_H}h",
        most=MAX_IDLE_WINDOW_H,
    )


def outlook_horizons(text: str) -> tuple[int, ...]:
    """'3h,12h,48h,72h' -> (3, 12, 48, 72), '' -> (): the outlook's horizons, up to a week."""
    if not text.strip():
        return ()
    return _whole_hours(
        text,
        "a horizon like 3h or 72h",
        f"outlook horizons are whole hours from 1h to {MAX_IDLE_WINDOW_H}h",
        most=MAX_IDLE_WINDOW_H,
    )


def _whole_hours(text: str, like: str, rule: str, most: int | None = None) -> tuple[int, ...]:
    """A comma list of durations as sorted distinct whole hours (≤ `most`); a part that is no
    duration says it is not `like`, one off the grid or above `most` says the `rule`."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        try:
            seconds = duration(part)
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"{part!r} is not {like}") from None
        if seconds < 3600 or seconds % 3600 or (most is not None and seconds > most * 3600):
            raise argparse.ArgumentTypeError(f"{part!r}: {rule}")
        out.append(int(seconds // 3600))
    return tuple(sorted(set(out)))


def shapes(text: str) -> tuple:
    """'1,2,4,8,2x8,8x8' -> Shapes (see `measures.parse_shape`)."""
    from advisor.fragmentation.measures import parse_shape

    try:
        return tuple(parse_shape(part) for part in text.split(",") if part.strip())
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def register(subparsers: argparse._SubParsersAction) -> None:
    from advisor.ingest.backfill import MAX_SPAN_S
    from advisor.ingest.schedulers import JoinSources
    from advisor.ingest.sources import SOURCE_HELP

    parser = subparsers.add_parser(
        "advise",
        description=__doc__,
        epilog="sources:\n" + SOURCE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # a longer past would be stepped through, then dropped: the service keeps 16 days
    backfill_span = duration_at_most(MAX_SPAN_S, ", the past the advisor keeps")
    parser.add_argument(
        "--source",
        required=True,
        action=JoinSources,
        help="where the cluster model comes from; repeated, a scheduler (k8s:...) and the "
        "usage source it joins by node name (the same as one SOURCE k8s:...+http://...)",
    )
    add_server_arguments(parser, listen=DEFAULT_LISTEN, what="run")
    parser.add_argument(
        "--advise.interval",
        dest="interval",
        type=positive_duration,
        default=duration("60s"),
        help="ingest, analyse, forecast and plan this often",
    )
    parser.add_argument(
        "--source.timeout",
        dest="source_timeout",
        type=positive_duration,
        default=duration("10s"),
        help="HTTP timeout of one read of the source",
    )
    parser.add_argument("--policy", default="", help="planner policy file (quotas, locality)")
    parser.add_argument(
        "--top-actions",
        dest="top_actions",
        type=number(0, kind=int),
        default=TOP_ACTIONS,
        help=f"bound of the gpu_advisor_action_info series (default {TOP_ACTIONS})",
    )
    parser.add_argument(
        "--forecast.horizons",
        dest="horizons",
        type=horizons,
        default=HORIZONS_H,
        help=f"comma-separated whole hours (default {hours_text(HORIZONS_H)})",
    )
    parser.add_argument(
        "--forecast.outlook-horizons",
        dest="outlook_horizons",
        type=outlook_horizons,
        default=OUTLOOK_HORIZONS_H,
        help="more horizons served in /api/forecast only (the app's fan chart; no /metrics "
        f"series, no alert), whole hours up to {MAX_IDLE_WINDOW_H}h, '' for none (default "
        f"{hours_text(OUTLOOK_HORIZONS_H)})",
    )
    parser.add_argument(
        "--forecast.idle-max-nodes",
        dest="idle_max_nodes",
        type=number(0, kind=int),
        default=IDLE_MAX_NODES,
        help="nodes whose idle windows are computed each hour, those with the most GPUs idle "
        f"first (default {IDLE_MAX_NODES}, about 1.2 s on 2 cores; 0: pools only)",
    )
    parser.add_argument(
        "--forecast.idle-windows",
        dest="idle_windows",
        type=idle_windows,
        default=IDLE_WINDOWS_H,
        help="idle windows W: GPUs forecast to stay free for the whole next W hours, "
        f"comma-separated whole hours from 1h to {MAX_IDLE_WINDOW_H}h "
        f"(default {hours_text(IDLE_WINDOWS_H)})",
    )
    parser.add_argument(
        "--forecast.idle-risk",
        dest="idle_risk",
        type=fraction,
        default=IDLE_RISK,
        help="the idle windows' risk of being wrong: the share of hours in which the release "
        f"may exceed what stays free, strictly between 0 and 1 (default {IDLE_RISK:g})",
    )
    parser.add_argument(
        "--forecast.max-tenants",
        dest="max_tenants",
        type=number(0, kind=int),
        default=MAX_TENANTS,
        help="tenants whose demand is forecast each hour, those holding the most GPUs first "
        f"(default {MAX_TENANTS}; 0: none)",
    )
    parser.add_argument(
        "--shapes",
        type=shapes,
        default=None,
        help="job shapes measured and planned for, e.g. 0.5,1,2,4,8,2x8,4x8,8x8 "
        f"(default: {SHAPES_TEXT}); a whole-GPU shape no job of which fits now gets a "
        "consolidation plan",
    )
    parser.add_argument(
        "--history.max-points",
        dest="history_points",
        type=number(0, kind=int),
        default=HISTORY_MAX_POINTS,
        help=f"runs kept for trends and forecasts (default {HISTORY_MAX_POINTS}: two weeks at "
        "1m); at the "
        "bound the oldest hours are thinned to their last run before any hour is dropped",
    )
    parser.add_argument(
        "--history.backfill",
        dest="history_backfill",
        type=backfill_span,
        default=None,
        help="past read into the history at start, one instant an hour, so a restarted advisor "
        "forecasts at once: from a prometheus+ source or a sim exporter's re-simulated fleet, "
        "or by stepping a sim: source (default 7d; 72h for a sim: fleet over 256 nodes); 0 "
        f"turns it off; at most {duration_text(MAX_SPAN_S)}, the past the advisor keeps; "
        "other exporter URLs have no past",
    )
    parser.add_argument(  # the flag's earlier name, before Prometheus sources had a backfill
        "--sim.backfill", dest="history_backfill", type=backfill_span, help=argparse.SUPPRESS
    )
    parser.add_argument(
        "--web.external-url",
        dest="external_url",
        type=external_url,
        default=None,
        help="the URL people reach the advisor at (default http://localhost:<listen port>); "
        "every alert's runbook_url is <URL>/runbooks/<AlertName> (alerts/config.yaml's "
        "advisor_external_url), served from the runbook shipped with the advisor",
    )
    add_quiet_flag(parser)
    parser.set_defaults(func=run)


def external_url(text: str) -> str:
    """An http(s) URL with a host, as people reach the advisor (no query or fragment)."""
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an http:// or https:// URL with a host (and no ?query or #fragment)"
        )
    return text.rstrip("/")


def runbook_routes(base_url: Callable[[], str]) -> dict[str, Route]:
    """/runbooks/ (the index) and /runbooks/<AlertName> (its page) as HTML; /runbooks sends
    the browser on to /runbooks/, where the index's relative links resolve. `base_url` is
    asked when a page is first served: the default names the port the server got, which a
    listen address of port 0 leaves unknown until it listens."""
    from advisor.service import runbooks
    from gpu_defrag_common.server import Response

    def serve(name: str) -> Route:  # shipped_pages is cached per base URL
        return lambda query: Response(
            HTTPStatus.OK, runbooks.shipped_pages(base_url())[name].encode(), HTML
        )

    routes = {f"/runbooks/{name}": serve(name) for name in runbooks.shipped_pages("")}
    moved = Response(HTTPStatus.PERMANENT_REDIRECT, b"", HTML, {"Location": "runbooks/"})
    routes["/runbooks"] = lambda query: moved
    return routes


def run(args: argparse.Namespace) -> int:
    from advisor.fragmentation import measures
    from advisor.ingest.backfill import backfill, default_span_s
    from advisor.ingest.live import make_ingest
    from advisor.ingest.sources import SourceError
    from advisor.logs import install_log_filters, redact
    from advisor.planner.constraints import Policy, PolicyError, load_policy
    from advisor.service.api import Api
    from advisor.service.http import AdvisorServer, build_app
    from advisor.service.loop import AdvisorLoop, Config
    from advisor.settings import Settings
    from gpu_defrag_common.server import parse_listen_address
    from gpu_defrag_common.webconfig import WebConfigError, load_web_config

    configure_logging(args.log_level)
    install_log_filters(logging.getLogger().handlers)
    try:
        web = load_web_config(args.web_config_file or None)
        policy = load_policy(args.policy) if args.policy else Policy()
        ingest = make_ingest(args.source, args.source_timeout)
        if args.history_points < 1:
            raise ValueError("--history.max-points must be at least 1")
        port = parse_listen_address(args.listen_address)[1]  # its errors say the flag
        base_url = args.external_url or f"http://localhost:{port}"
    except (WebConfigError, PolicyError, SourceError, ValueError, OSError) as error:
        say_error("advise", redact(str(error)))
        return 2
    settings = Settings(
        measures=measures.Settings(shapes=args.shapes) if args.shapes else measures.Settings(),
        policy=policy,
        horizons_h=args.horizons,
        outlook_horizons_h=args.outlook_horizons,
        idle_windows_h=args.idle_windows,
        idle_risk=args.idle_risk,
        idle_max_nodes=args.idle_max_nodes,
        max_tenants=args.max_tenants,
        history_max_points=args.history_points,
        backfill_s=args.history_backfill,
    )
    config = Config(
        interval_s=args.interval,
        stale_intervals=args.stale_intervals,
        top_actions=args.top_actions,
        settings=settings,
    )
    span = settings.backfill_s
    span = default_span_s(args.source) if span is None else span

    def read_past() -> list:
        """The source's past again, for a history that starts anew (its clock went back)."""
        past = backfill(args.source, ingest, span, timeout=args.source_timeout)
        return past.models if past is not None else []

    loop = AdvisorLoop(args.source, ingest, config, past=read_past)
    try:
        routes = {**Api(loop.state).routes(), **runbook_routes(lambda: base_url)}
        app = build_app(loop, routes, web, "gpu-defrag advisor")
        server = AdvisorServer(args.listen_address, app, web, server_limits(args))
    except (OSError, ValueError) as error:
        say_error("advise", f"cannot listen on {args.listen_address}: {error}")
        return 2
    if not args.external_url and not port:  # port 0: the port the server got
        base_url = f"http://localhost:{server.port}"
    signals = ShutdownSignals().install()
    server.start()
    steps = math.ceil(span / 3600.0) if span > 0 else None  # one instant an hour
    with Progress("advise", "backfill: past hours", steps, quiet=args.quiet) as progress:
        progress.done("")  # the log line below says what was read, and how long it took

        def stop_asked() -> bool:  # asked once per instant read: the bar's steps
            progress.advance()
            return signals.is_set()

        past = _backfill_unless_stopped(
            signals,
            lambda: loop.pipeline.backfill(cancelled=stop_asked),
        )
    if past is not None:
        log.info("%s", past.summary())
    if signals.is_set():  # SIGTERM or Ctrl-C during the backfill: no run starts
        server.close()
        return 0
    if past is None and args.history_backfill:
        log.info(
            "--history.backfill: %s has no past to read; the history starts now",
            args.source,  # the logger's RedactingFilter hides its credentials
        )
    loop.start()
    log.info(
        "advising on %s every %.3gs; serving /metrics and /api/ at %s, the runbooks at %s",
        args.source,
        args.interval,
        server.url(""),
        f"{base_url}/runbooks/",
    )
    signals.wait()
    server.close()
    loop.stop(timeout_s=1.0)  # a forecast in progress is not waited for: the thread is a daemon
    return 0


def _backfill_unless_stopped(
    signals: ShutdownSignals, read: Callable[[], Backfill | None]
) -> Backfill | None:
    """Run the backfill in a thread while the main thread waits for a signal: a read of the
    source blocked in a socket would otherwise hold off the signal's handler until it returns.
    After a signal the backfill (which asks `signals.is_set` between instants, a simulated
    hour of 1,000 nodes apart) gets `BACKFILL_STOP_S` to stop and return what it read; one
    still blocked then is left to end with the process."""
    outcome: list = []

    def work() -> None:
        try:
            outcome.append(read())
        except BaseException as error:  # re-raised in the main thread, as before the thread
            outcome.append(error)
        finally:
            signals.wake()

    thread = threading.Thread(target=work, name="backfill", daemon=True)
    thread.start()
    while not outcome and not signals.wait(or_woken=True):
        pass  # (`outcome`, not `is_alive`: the thread lives on for a moment after its wake-up)
    thread.join(timeout=BACKFILL_STOP_S)
    if outcome and isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0] if outcome else None
