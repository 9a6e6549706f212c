"""`--forecast.idle-windows` and `--forecast.idle-risk`: parsed and refused like the other
forecast flags, passed through `Config` to every part of the idle windows (per pool and per node,
their release and their held-back backtest), and stated in /api/forecast and /metrics."""

from __future__ import annotations

import json

import jsonschema
import pytest

from advisor.cli import build_parser
from advisor.forecast import idle as I
from advisor.forecast import live_idle
from advisor.forecast.live_idle import idle_needs
from advisor.ingest.live import LiveSim
from advisor.service.api import Api, openapi_document
from advisor.service.loop import AdvisorLoop, Config
from advisor.settings import IDLE_RISK, IDLE_WINDOWS_H, Settings

HOUR = 3600.0


def advise(*flags: str):
    return build_parser().parse_args(["advise", "--source", "sim:a100-16x8", *flags])


def test_the_idle_flags_parse():
    args = advise("--forecast.idle-windows", "12h, 2h,2h,168h", "--forecast.idle-risk", "0.2")
    assert args.idle_windows == (2, 12, 168) and args.idle_risk == 0.2
    assert advise("--forecast.idle-windows", "1d").idle_windows == (24,)
    unset = advise()
    # the one settings object's defaults
    assert unset.idle_windows == IDLE_WINDOWS_H and unset.idle_risk == IDLE_RISK


@pytest.mark.parametrize(
    ("flag", "value", "words"),
    [
        ("--forecast.idle-windows", "90m", "whole hours from 1h to 168h"),
        ("--forecast.idle-windows", "0h", "whole hours from 1h to 168h"),
        ("--forecast.idle-windows", "169h", "whole hours from 1h to 168h"),
        ("--forecast.idle-windows", "8d", "whole hours from 1h to 168h"),
        ("--forecast.idle-windows", "1h,,4h", "is not a window like 1h or 8h"),
        ("--forecast.idle-windows", "", "is not a window like 1h or 8h"),
        ("--forecast.idle-windows", "four", "is not a window like 1h or 8h"),
        ("--forecast.idle-risk", "0", "strictly between 0 and 1"),
        ("--forecast.idle-risk", "1", "strictly between 0 and 1"),
        ("--forecast.idle-risk", "1.5", "strictly between 0 and 1"),
        ("--forecast.idle-risk", "nan", "strictly between 0 and 1"),
        ("--forecast.idle-risk", "5%", "strictly between 0 and 1"),
    ],
)
def test_a_bad_idle_flag_is_refused_in_one_line(capsys, flag, value, words):
    with pytest.raises(SystemExit) as stop:
        advise(flag, value)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"gpu-defrag advise: error: argument {flag}: ") and words in last


class Started(Exception):
    """Raised by the stand-in loop: `run` got as far as building the Config."""


@pytest.mark.parametrize(
    ("flags", "windows", "risk"),
    [
        (("--forecast.idle-windows", "2h,12h", "--forecast.idle-risk", "0.2"), (2, 12), 0.2),
        ((), IDLE_WINDOWS_H, IDLE_RISK),
    ],
)
def test_the_flags_reach_the_loops_config(monkeypatch, flags, windows, risk):
    import advisor.logs
    import advisor.service.cli as service_cli
    import advisor.service.loop as loop_module

    seen = []

    def stand_in(_source, _ingest, config, **_kwargs):
        seen.append(config)
        raise Started

    monkeypatch.setattr(loop_module, "AdvisorLoop", stand_in)
    monkeypatch.setattr(service_cli, "configure_logging", lambda *_a: None)
    monkeypatch.setattr(advisor.logs, "install_log_filters", lambda *_a: None)
    with pytest.raises(Started):
        service_cli.run(advise(*flags))
    assert seen[0].settings.idle_windows_h == windows and seen[0].settings.idle_risk == risk


def test_a_chosen_risk_and_windows_reach_every_part_and_the_served_output(monkeypatch):
    """Windows 2 h and 12 h at a 20 % risk: every release and held-back backtest (pools and
    nodes) is computed for them, /api/forecast states them (and validates against its schema)
    and /metrics has their windows only."""
    calls: list[tuple[str, tuple[int, ...], float]] = []
    real_release, real_backtest = live_idle.idle_windows, I.backtest

    def release(panel, windows, risk, *args, **kwargs):
        calls.append(("release", tuple(windows), risk))
        return real_release(panel, windows, risk, *args, **kwargs)

    def backtest(panel, windows, risk, *args, **kwargs):
        calls.append(("backtest", tuple(windows), risk))
        return real_backtest(panel, windows, risk, *args, **kwargs)

    monkeypatch.setattr(live_idle, "idle_windows", release)
    monkeypatch.setattr(I, "backtest", backtest)
    clock = [0.0]
    source = LiveSim("sim:a100-16x8?nodes=2&t=6d", clock=lambda: clock[0])
    loop = AdvisorLoop(
        "sim",
        source,
        Config(settings=Settings(horizons_h=(1,), idle_windows_h=(2, 12), idle_risk=0.2)),
    )
    loop.seed_history(source.backfill((idle_needs(12) + 2) * HOUR))
    state = loop.run_once()

    # pools and nodes, release and backtest: each with the windows and the risk asked for
    assert sorted(kind for kind, _, _ in calls) == ["backtest"] * 2 + ["release"] * 2
    assert {(w, r) for _, w, r in calls} == {((2, 12), 0.2)}

    served = json.loads(Api(lambda: state).routes()["/api/forecast"]("").body)
    idle = served["idle"]
    assert idle["risk"] == 0.2 and idle["windows"] == ["2h", "12h"]
    for entry in (*idle["pools"], *idle["nodes"]):
        assert [w["window"] for w in entry["windows"]] == ["2h", "12h"]
        assert all(w["available"] for w in entry["windows"]), entry
    spec = openapi_document()
    schema = {**spec["components"]["schemas"]["Forecast"], "components": spec["components"]}
    jsonschema.validate(served, schema)

    page = loop.current_page().body.decode()
    windows = {
        line.split('window="')[1].split('"')[0]
        for line in page.splitlines()
        if line.startswith("gpu_advisor_forecast_idle")
    }
    assert windows == {"2h", "12h"}
