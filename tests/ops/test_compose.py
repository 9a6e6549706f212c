"""compose.yaml without a Docker engine: `docker-compose config -q`, files, pins, health checks."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

import gpu_defrag_common
from advisor.cli import build_parser
from alerts.config import load_config

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose.yaml"


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def docker_compose(*args: str, file: Path = COMPOSE) -> subprocess.CompletedProcess:
    path = shutil.which("docker-compose")
    if path is None:
        pytest.fail(
            "docker-compose is missing: apt-get install --no-install-recommends docker-compose"
        )
    return subprocess.run(
        [path, "-f", str(file), *args], capture_output=True, text=True, timeout=60, cwd=ROOT
    )


@pytest.mark.parametrize("profile", [None, "gpu"])
def test_docker_compose_config_is_valid(profile):
    args = ["--profile", profile] if profile else []
    result = docker_compose(*args, "config", "-q")
    assert result.returncode == 0, result.stderr


def test_docker_compose_rejects_an_unknown_key(tmp_path):
    broken = compose()
    broken["services"]["prometheus"]["portz"] = ["9090:9090"]
    path = tmp_path / "compose.yaml"
    path.write_text(yaml.safe_dump(broken))
    result = docker_compose("config", "-q", file=path)
    assert result.returncode != 0 and "portz" in result.stderr


def bind_mounts() -> list[tuple[str, Path, str]]:
    mounts = []
    for name, service in compose()["services"].items():
        for volume in service.get("volumes", []):
            source, target = volume.split(":")[:2]
            if source.startswith((".", "/")):
                mounts.append((name, (ROOT / source).resolve(), target))
    return mounts


def test_every_referenced_file_exists():
    mounts = bind_mounts()
    assert len(mounts) >= 6
    for service, source, _ in mounts:
        assert source.exists(), f"{service}: {source} does not exist"
    for name, service in compose()["services"].items():
        build = service.get("build")
        if build:
            context = ROOT / build["context"]
            dockerfile = context / build.get("dockerfile", "Dockerfile")
            assert dockerfile.exists(), name
            for line in dockerfile.read_text().splitlines():
                if line.startswith("COPY ") and "--from=" not in line:  # not from another stage
                    for source in line.split()[1:-1]:
                        assert (context / source).exists(), f"Dockerfile copies missing {source}"


def test_images_are_pinned_and_services_have_health_checks():
    services = compose()["services"]
    assert {
        "exporter",
        "exporter-gpu",
        "advisor",
        "app",
        "prometheus",
        "alertmanager",
        "grafana",
    } <= set(services)
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(
        1
    )
    assert gpu_defrag_common.__version__ == version, (
        "gpu_defrag_common/__init__.py and pyproject.toml disagree"
    )
    for name, service in services.items():
        image = service["image"]
        repository, _, tag = image.rpartition(":")
        assert repository and tag and tag != "latest", f"{name}: {image} is not pinned"
        if "build" in service:
            assert tag == version, f"{name}: our image tag {tag} != project version {version}"
        assert service["healthcheck"]["test"][0] == "CMD", name


def test_named_volumes_are_declared_and_used():
    document = compose()
    declared = set(document["volumes"])
    used = {
        volume.split(":")[0]
        for service in document["services"].values()
        for volume in service.get("volumes", [])
        if not volume.startswith((".", "/"))
    }
    assert used == declared
    assert {"prometheus-data", "grafana-data", "alertmanager-data"} <= declared


def test_gpu_profile_uses_the_nvidia_runtime_and_the_sim_exporter_is_the_default():
    services = compose()["services"]
    gpu = services["exporter-gpu"]
    assert gpu["profiles"] == ["gpu"]
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    assert "--backend=nvml" in gpu["command"]
    assert "profiles" not in services["exporter"]
    assert "--backend=sim" in services["exporter"]["command"]
    for name in ("exporter", "exporter-gpu"):
        assert services[name]["networks"]["default"]["aliases"] == ["gpu-exporter"]


@pytest.mark.parametrize("service", ["exporter", "exporter-gpu", "advisor", "app"])
def test_our_commands_parse_with_the_real_cli(service):
    build_parser().parse_args(compose()["services"][service]["command"])


def test_prometheus_config_scrapes_the_jobs_the_rules_select_and_passes_promtool(tmp_path):
    mounts = {target: source for _, source, target in bind_mounts()}
    config_path = mounts["/etc/prometheus/prometheus.yml"]
    config = yaml.safe_load(config_path.read_text())
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    selectors = load_config()["selectors"]
    for selector in selectors.values():
        assert re.fullmatch(r'job="([\w-]+)"', selector).group(1) in jobs
    # rule files resolve, through the compose mounts, to the generated rule files
    rules_dir = mounts["/etc/prometheus/rules"]
    local = [str(rules_dir / Path(f).name) for f in config["rule_files"]]
    for path in local:
        assert Path(path).exists(), path
    assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == [
        "alertmanager:9093"
    ]
    assert config["global"]["external_labels"]["cluster"]
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing: apt-get install --no-install-recommends prometheus")
    config["rule_files"] = local
    checked = tmp_path / "prometheus.yml"
    checked.write_text(yaml.safe_dump(config))
    result = subprocess.run(
        [promtool, "check", "config", str(checked)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_grafana_mounts_match_the_provisioning_files():
    mounts = {target: source for service, source, target in bind_mounts() if service == "grafana"}
    providers = yaml.safe_load(
        (mounts["/etc/grafana/provisioning/dashboards"] / "gpu-defrag.yaml").read_text()
    )
    path = providers["providers"][0]["options"]["path"]
    assert path in mounts and sorted(mounts[path].glob("*.json"))
    assert (mounts["/etc/grafana/provisioning/datasources"] / "prometheus.yaml").exists()
    assert compose()["services"]["grafana"]["image"].endswith(":11.6.0"), (
        "dashboards are validated against the Grafana 11.6 schema"
    )
