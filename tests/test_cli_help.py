"""Every flag of every command says what it does and what it defaults to, in the form it takes."""

from __future__ import annotations

import argparse

import pytest

from advisor.cli import build_parser
from gpu_defrag_common.units import duration_text, size_text


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


COMMANDS = _commands()


def _entry(command: str, flag: str) -> str:
    """The flag's own entry in the command's help (its line and continuation lines), joined."""
    lines = COMMANDS[command].format_help().splitlines()
    start = next(
        i
        for i, line in enumerate(lines)
        if line.startswith("  -") and flag in line.split("  ", 2)[1].replace(",", " ").split()
    )
    entry = [lines[start]]
    for line in lines[start + 1 :]:
        if not line.startswith("   "):  # the next option (2 spaces) or section
            break
        entry.append(line)
    return " ".join(" ".join(entry).split())


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_argument_has_help(name: str) -> None:
    silent = [
        action.option_strings[-1] if action.option_strings else action.dest
        for action in COMMANDS[name]._actions
        if not isinstance(action, argparse._HelpAction) and not (action.help or "").strip()
    ]
    assert not silent, f"{name}: {silent}"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_default_is_shown(name: str) -> None:
    for action in COMMANDS[name]._actions:
        default = action.default
        if (
            not action.option_strings
            or action.help == argparse.SUPPRESS
            or default in (None, "", [], (), argparse.SUPPRESS)
            or isinstance(default, bool)
        ):
            continue
        flag = action.option_strings[-1]
        assert "default" in _entry(name, flag), f"{name} {flag}: {_entry(name, flag)}"


@pytest.mark.parametrize(
    ("command", "flag", "shown"),
    [
        ("exporter", "--collect.interval", "(default: 15s)"),
        ("exporter", "--idle.window", "(default: 1h)"),
        ("exporter", "--stranded.min-request", "(default: 10GiB)"),
        ("exporter", "--idle.threshold", "(default: 0.05)"),
        ("advise", "--advise.interval", "(default: 1m)"),
        ("backtest", "--quantiles", "(default: 0.5,0.9)"),
    ],
)
def test_defaults_are_written_as_the_flag_takes_them(command, flag, shown) -> None:
    assert shown in _entry(command, flag)


def test_duration_and_size_text() -> None:
    assert [duration_text(s) for s in (15, 60, 90, 3600, 86400, 0.5, 1.25)] == [
        "15s",
        "1m",
        "90s",
        "1h",
        "1d",
        "500ms",
        "1250ms",
    ]
    assert [size_text(b) for b in (10 * 2**30, 512 * 2**20, 1536, 100)] == [
        "10GiB",
        "512MiB",
        "1536B",
        "100B",
    ]
