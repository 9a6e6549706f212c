"""The systemd unit the runbook points at (`journalctl -u gpu-defrag-exporter`)."""

from __future__ import annotations

import configparser
import shlex
from pathlib import Path

from advisor.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "deploy" / "systemd" / "gpu-defrag-exporter.service"


def unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=True, interpolation=None)
    parser.optionxform = str  # systemd keys are case-sensitive
    parser.read_string(UNIT.read_text())
    return parser


def test_the_runbook_names_the_unit_that_ships():
    assert f"journalctl -u {UNIT.stem}" in (ROOT / "alerts" / "runbook.md").read_text()


def test_exec_start_parses_with_the_real_cli_on_the_nvml_backend():
    command = shlex.split(unit()["Service"]["ExecStart"])
    assert Path(command[0]).name == "gpu-defrag"
    args = build_parser().parse_args(command[1:])
    assert args.backend == "nvml"
    assert args.listen_address.endswith(":9835")


def test_it_restarts_on_failure_and_starts_at_boot():
    parsed = unit()
    assert parsed["Service"]["Restart"] == "on-failure"
    assert parsed["Install"]["WantedBy"] == "multi-user.target"
