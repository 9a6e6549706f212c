"""`gpu-defrag exporter`: one per node, flags in the Prometheus exporters' style."""

from __future__ import annotations

import argparse
import logging
import os
import socket

from exporter.backends.registry import BACKENDS, backend_class
from exporter.node_gauges import IdlePolicy
from gpu_defrag_common.messages import say_error
from gpu_defrag_common.server_cli import add_server_arguments, configure_logging, server_limits
from gpu_defrag_common.shutdown import ShutdownSignals
from gpu_defrag_common.units import duration, number, positive_duration, size
from gpu_defrag_common.webconfig import WebConfigError, load_web_config

log = logging.getLogger("exporter")

DEFAULT_LISTEN = ":9835"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backend",
        choices=sorted(BACKENDS),
        default="nvml",
        help="where readings come from: NVML, DCGM, a running dcgm-exporter, or a simulated fleet",
    )
    add_server_arguments(parser, listen=DEFAULT_LISTEN, what="collection")
    parser.add_argument(
        "--collect.interval",
        dest="collect_interval",
        type=positive_duration,
        default=duration("15s"),
        help="collect this often in the background; /metrics serves the last collection",
    )
    parser.add_argument(
        "--collect.timeout",
        dest="collect_timeout",
        type=positive_duration,
        default=None,
        help="a cycle running longer is abandoned (default: 2 × interval, at least 10s)",
    )
    parser.add_argument(
        "--node-name",
        dest="node_name",
        default=os.environ.get("NODE_NAME") or socket.gethostname(),
        help="value of the `node` label (default: $NODE_NAME, else the host name)",
    )
    parser.add_argument(
        "--idle.threshold",
        dest="idle_threshold",
        type=number(0, 1),
        default=0.05,
        help="utilization (0-1) under which an allocated GPU counts as idle",
    )
    parser.add_argument(
        "--idle.window",
        dest="idle_window",
        type=positive_duration,
        default=duration("1h"),
        help="an allocated GPU is idle once under the threshold for this long",
    )
    parser.add_argument(
        "--stranded.min-request",
        dest="stranded_min_request",
        type=size,
        default=size("10GiB"),
        help="free memory below this on a shared GPU counts as stranded",
    )
    parser.add_argument(
        "--compat.dcgm-names",
        dest="dcgm_names",
        action="store_true",
        help="also emit DCGM_FI_* names so NVIDIA's dcgm-exporter dashboard works",
    )
    for name in sorted(BACKENDS):
        backend_class(name).add_arguments(parser)
    from exporter.attribution.combined import add_arguments as add_attribution_arguments

    add_attribution_arguments(parser)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "exporter",
        description="Collect GPU metrics in the background and serve them on /metrics.",
    )
    add_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from exporter.collector import CollectorLoop
    from gpu_defrag_common.server import ExporterServer

    configure_logging(args.log_level)
    try:
        web = load_web_config(args.web_config_file or None)
        backend = backend_class(args.backend).from_args(args)
    except (WebConfigError, ValueError) as error:
        say_error("exporter", str(error))
        return 2
    attribution_sources = _attach_attribution(backend, args)
    loop = CollectorLoop(
        backend,
        interval_s=args.collect_interval,
        timeout_s=args.collect_timeout,
        stale_intervals=args.stale_intervals,
        idle_policy=IdlePolicy(
            threshold=args.idle_threshold,
            window_s=args.idle_window,
            min_request_bytes=args.stranded_min_request,
        ),
        dcgm_names=args.dcgm_names,
        extra_error_sources=attribution_sources,
    )
    try:
        server = ExporterServer(args.listen_address, loop, web, limits=server_limits(args))
    except (OSError, ValueError) as error:
        say_error("exporter", f"cannot listen on {args.listen_address}: {error}")
        return 2
    signals = ShutdownSignals().install()
    loop.start()
    server.start()
    log.info(
        "serving backend=%s on %s every %.3gs", backend.name, server.url(), args.collect_interval
    )
    signals.wait()
    server.close()
    loop.stop()
    for source in attribution_sources:
        source.close()
    return 0


def _attach_attribution(backend, args: argparse.Namespace) -> tuple:
    """Backends that see host processes (NVML, DCGM) get pod/Slurm attribution."""
    if not hasattr(backend, "attribution"):
        return ()
    from exporter.attribution.combined import build_attribution

    attribution = build_attribution(args)
    attribution.start()
    backend.attribution = attribution
    return (attribution,)
