"""The two images (Dockerfile targets `exporter` and `full`), their lock files and who runs which:
the base is pinned by digest, every dependency by version and hash, the exporter's lock holds no
analysis stack, and the DaemonSet and compose's exporters run the small image."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
HEAVY = {
    "pandas",
    "scikit-learn",
    "scipy",
    "ortools",
    "streamlit",
    "plotly",
    "matplotlib",
    "statsmodels",
}
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock(name: str) -> dict[str, tuple[str, int]]:
    """{package: (version, number of hashes)} of requirements/NAME.txt."""
    pins: dict[str, tuple[str, int]] = {}
    current = None
    for line in (ROOT / "requirements" / f"{name}.txt").read_text().splitlines():
        match = PIN.match(line)
        if match:
            current = canonical(match[1])
            pins[current] = (match[2], 0)
        elif line.strip().startswith("--hash=sha256:") and current is not None:
            version, hashes = pins[current]
            pins[current] = (version, hashes + 1)
        elif line and not line.startswith((" ", "#")):
            raise AssertionError(f"requirements/{name}.txt: not a pinned requirement: {line}")
    return pins


def requirement_names(requirements: list[str]) -> set[str]:
    return {
        canonical(re.split(r"[<>=!\[; ]", r, maxsplit=1)[0])
        for r in requirements
        if not r.startswith("gpu-defrag")
    }


PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
BASE = requirement_names(PROJECT["dependencies"])
EXTRAS = {k: requirement_names(v) for k, v in PROJECT["optional-dependencies"].items()}


def stages() -> dict[str, str]:
    """{stage name: its lines} of the Dockerfile."""
    text = (ROOT / "Dockerfile").read_text()
    found = {}
    for block in re.split(r"^(?=FROM )", text, flags=re.M)[1:]:
        name = re.match(r"FROM \S+ AS (\S+)", block)
        assert name, f"every stage is named: {block.splitlines()[0]}"
        found[name[1]] = block
    return found


def test_every_locked_package_has_a_version_and_hashes() -> None:
    for name in ("exporter", "full"):
        pins = lock(name)
        assert pins, name
        unhashed = [package for package, (_, hashes) in pins.items() if hashes == 0]
        assert not unhashed, f"requirements/{name}.txt: no hash for {unhashed}"


def test_the_locks_agree_with_the_constraints() -> None:
    """The images run the versions the tests ran (constraints.txt)."""
    constraints = {
        canonical(m[1]): m[2]
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if (m := PIN.match(line))
    }
    for name in ("exporter", "full"):
        for package, (version, _) in lock(name).items():
            if package in constraints:
                assert version == constraints[package], f"requirements/{name}.txt: {package}"


def test_the_exporter_lock_is_the_base_install_and_the_full_lock_everything() -> None:
    exporter, full = set(lock("exporter")), set(lock("full"))
    assert exporter >= BASE, f"run `make lock`: {sorted(BASE - exporter)} missing"
    assert not exporter & HEAVY, sorted(exporter & HEAVY)
    wanted = BASE | EXTRAS["advisor"] | EXTRAS["app"]
    assert wanted <= full, f"run `make lock`: {sorted(wanted - full)} missing"
    assert HEAVY - {"statsmodels"} <= full
    assert "statsmodels" not in full


def test_the_base_image_is_pinned_by_digest() -> None:
    text = (ROOT / "Dockerfile").read_text()
    (base,) = re.findall(r"^ARG PYTHON_IMAGE=(\S+)$", text, flags=re.M)
    assert re.fullmatch(r"python:3\.11-slim-bookworm@sha256:[0-9a-f]{64}", base), base
    for name, block in stages().items():
        source = block.split()[1]
        assert source == "${PYTHON_IMAGE}" or source in stages(), f"{name} starts from {source}"


def test_each_image_installs_its_own_lock_with_hashes() -> None:
    found = stages()
    assert {"exporter", "full"} <= set(found)
    for name in ("exporter", "full"):
        assert f"COPY requirements/{name}.txt " in found[name]
        assert "pip install --require-hashes -r" in found[name]
        assert 'ENTRYPOINT ["gpu-defrag"]' in found[name]
    assert found["exporter"].split("CMD ", 1)[1].startswith('["exporter"')


def test_the_exporters_run_the_small_image() -> None:
    services = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    for name in ("exporter", "exporter-gpu"):
        assert services[name]["build"]["target"] == "exporter", name
        assert services[name]["image"].startswith("gpu-defrag-exporter:"), name
    for name in ("advisor", "app"):
        assert services[name]["build"]["target"] == "full", name
        assert services[name]["image"].startswith("gpu-defrag:"), name
    images = {}
    for path in sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            spec = (document or {}).get("spec", {}).get("template", {}).get("spec", {})
            for container in spec.get("containers", []):
                images[(document["kind"], document["metadata"]["name"])] = container["image"]
    daemonsets = [image for (kind, _), image in images.items() if kind == "DaemonSet"]
    assert daemonsets and all("/gpu-defrag-exporter:" in image for image in daemonsets)
    others = [image for (kind, _), image in images.items() if kind != "DaemonSet"]
    assert others and all("/gpu-defrag:" in image for image in others)
    cluster = ROOT / "deploy/overlays/cluster/kustomization.yaml"  # where images are set
    kustomization = yaml.safe_load(cluster.read_text())
    named = {image["name"] for image in kustomization["images"]}
    assert {image.rsplit(":", 1)[0] for image in images.values()} == named
