"""What every gpu-defrag server shares at its command line: the `--web.*`/`--log.*` flags in the
Prometheus exporters' style, and one logfmt log line format."""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import replace

from gpu_defrag_common.connections import Limits
from gpu_defrag_common.units import number

LOG_FORMAT = "ts=%(asctime)s level=%(levelname)s source=%(name)s msg=%(message)s"  # logfmt


def server_limits(args: argparse.Namespace) -> Limits:
    """The connection limits the `--web.*` flags set."""
    return replace(Limits(), max_connections=args.max_connections)


def configure_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper()), format=LOG_FORMAT, stream=sys.stderr)


def add_server_arguments(parser: argparse.ArgumentParser, *, listen: str, what: str) -> None:
    """The flags every gpu-defrag server shares (exporter, advisor), in the exporters' style;
    `what` names the unit of work whose age /health judges ("collection", "run")."""
    parser.add_argument(
        "--web.listen-address",
        dest="listen_address",
        default=listen,
        help="[host]:port to serve /metrics and /health on (fd://N: a socket the parent "
        "process listens on, handed down as file descriptor N)",
    )
    parser.add_argument(
        "--web.config.file",
        dest="web_config_file",
        default="",
        help="exporter-toolkit web config (TLS, basic auth with bcrypt hashes)",
    )
    parser.add_argument(
        "--web.max-connections",
        dest="max_connections",
        type=number(1, kind=int),
        default=Limits().max_connections,
        help="connections held open at once; one more closes the one that has waited longest "
        "for its request",
    )
    parser.add_argument(
        "--health.stale-intervals",
        dest="stale_intervals",
        type=number(0, above=True),
        default=3.0,
        help=f"/health turns 503 when the last good {what} is older than this many intervals",
    )
    parser.add_argument(
        "--log.level",
        dest="log_level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="least severe log line written to stderr",
    )
