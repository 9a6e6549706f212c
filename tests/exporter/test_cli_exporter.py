"""The exporter as a user runs it: a real process on 127.0.0.1, scraped over HTTP."""

import signal
import subprocess
import sys

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.fakes.cli_process import cli_process
from tests.fakes.waiting import reap, wait_until


def exporter(*args: str):
    """The exporter on 127.0.0.1 (its liveness route answers as soon as it listens)."""
    return cli_process("exporter", *args)


def wait_for(predicate, process):
    """The predicate's first truthy value, as long as the exporter runs."""

    def check():
        try:
            return predicate()
        except requests.RequestException:
            return None

    return wait_until(check, "the exporter's answer", process)


def scrape(base: str) -> dict[tuple[str, tuple], float]:
    text = requests.get(f"{base}/metrics", timeout=10).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def total(samples, name: str) -> float:
    return sum(value for (metric, _), value in samples.items() if metric == name)


@pytest.mark.slow
def test_sim_exporter_serves_the_preset_and_stops_cleanly():
    with exporter("--backend", "sim", "--sim.preset", "a100-16x8", "--collect.interval", "1s") as (
        base,
        process,
    ):
        wait_for(lambda: requests.get(f"{base}/health", timeout=5).status_code == 200, process)
        samples = scrape(base)
        assert total(samples, "gpu_node_gpus") == 128
        assert len([key for key in samples if key[0] == "gpu_info"]) == 128
        assert total(samples, "gpu_exporter_backend_up") == 1
        # the preset's point: many free GPUs, few whole free nodes
        free_per_node = [v for (metric, _), v in samples.items() if metric == "gpu_node_free_gpus"]
        assert sum(free_per_node) >= 40
        assert sum(1 for v in free_per_node if v == 8) < 8
        process.send_signal(signal.SIGTERM)
        reap(process)
        assert process.returncode == 0
        assert f"serving backend=sim on {base}/metrics every 1s" in process.stderr.read()


@pytest.mark.slow
def test_nvml_without_a_gpu_serves_backend_down_instead_of_crashing():
    with exporter("--backend", "nvml", "--collect.interval", "1s") as (base, process):
        samples = wait_for(
            lambda: (s := scrape(base)) and total(s, "gpu_exporter_collections_total") >= 1 and s,
            process,
        )
        assert total(samples, "gpu_exporter_backend_up") == 0
        health = requests.get(f"{base}/health", timeout=5)
        assert health.status_code == 503
        assert "NVML" in health.text
        assert process.poll() is None  # still running, still serving


def test_bad_web_config_is_a_one_line_error(tmp_path):
    config = tmp_path / "web.yml"
    config.write_text("basic_auth_users:\n  admin: plaintext\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "advisor.cli",
            "exporter",
            "--backend",
            "sim",
            "--web.config.file",
            str(config),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "not a bcrypt hash" in lines[0]


@pytest.mark.parametrize("flag", ["--collect.interval", "--collect.timeout"])
def test_zero_interval_or_timeout_is_a_flag_error_not_a_traceback(flag):
    result = subprocess.run(
        [sys.executable, "-m", "advisor.cli", "exporter", "--backend", "sim", flag, "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert "not a positive duration" in result.stderr.strip().splitlines()[-1]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("command", ["exporter", "advise"])
@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0", "number > 0"),
        ("-1", "number > 0"),
        ("nan", "number > 0"),
        ("inf", "number > 0"),
        ("x", "number"),
    ],
)
def test_stale_intervals_must_be_a_finite_number_above_zero(capsys, command, value, message):
    """0 or less made /health 503 forever; both servers share the flag."""
    from advisor.cli import build_parser

    required = ["--source", "x"] if command == "advise" else []
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args([command, "--health.stale-intervals", value, *required])
    assert exit_.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--health.stale-intervals" in last and message in last
    parsed = build_parser().parse_args([command, "--health.stale-intervals", "0.5", *required])
    assert parsed.stale_intervals == 0.5
