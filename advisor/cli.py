"""The one `gpu-defrag` command. Each subcommand lives in its own module and registers itself.

Modules are imported when the parser is built; each exposes `register(subparsers)`, which adds a
parser and sets `func(args) -> int`. Keep this list the only place that knows every subcommand.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from exporter.units import DefaultsFormatter

SUBCOMMAND_MODULES: tuple[str, ...] = (
    "exporter.cli",
    "advisor.analyze",
    "advisor.app.cli",
    "advisor.planner.cli",
    "advisor.service.cli",
    "advisor.forecast.cli",
    "advisor.replay.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpu-defrag",
        description="GPU observability and defragmentation advisor.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module_name in SUBCOMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    for command in subparsers.choices.values():  # every command's help shows its defaults
        command.formatter_class = _with_defaults(command.formatter_class)
    return parser


def _with_defaults(formatter: type[argparse.HelpFormatter]) -> type[argparse.HelpFormatter]:
    """The command's own formatter (raw descriptions kept) that also shows each default."""
    if issubclass(formatter, DefaultsFormatter):
        return formatter
    return type(f"Defaults{formatter.__name__}", (DefaultsFormatter, formatter), {})


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
