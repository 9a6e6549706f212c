"""`gpu-defrag app` and `gpu-defrag demo`: flags reach streamlit and the app as documented."""

from __future__ import annotations

from advisor.app import cli, data
from advisor.cli import build_parser


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
    exporter = " ".join(cli.exporter_command("a100-16x8", 1234, 60))
    assert "exporter --backend sim --sim.preset a100-16x8 --sim.speed 60 --sim.start 7d" in exporter
    assert "--web.listen-address 127.0.0.1:1234" in exporter
    advisor = " ".join(cli.advisor_command("http://127.0.0.1:1234/metrics", 4321, 5))
    assert "advise --source http://127.0.0.1:1234/metrics --advise.interval 5s" in advisor
