"""`pip install .` with no extras, into a fresh virtual environment, as a GPU node would install
the exporter: it pulls none of the analysis stack, `gpu-defrag exporter` serves a fleet, and a
command that needs an extra says which in one line.

The install is offline (`--no-index --find-links`) from a wheelhouse of the exporter's lock
(requirements/exporter.txt, downloaded once with its hashes checked and kept in the temporary
directory under the lock's digest) plus setuptools to build the project: a base install that
needed anything else fails to resolve, and one whose lock brought it is caught by the listing.
No pip configuration of this machine is read (PIP_CONFIG_FILE=/dev/null)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.request
from pathlib import Path

import pytest

from tests.ci import skip_or_fail
from tests.ports import free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements" / "exporter.txt"
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


def clean_env() -> dict[str, str]:
    """This process's environment without pip's settings or a PYTHONPATH to the checkout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON"))}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


def run(*command: str | Path, timeout_s: float = 600, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(c) for c in command],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=timeout_s,
        **kwargs,
    )


@pytest.fixture(scope="module")
def wheelhouse() -> Path:
    key = hashlib.sha256(LOCK.read_bytes()).hexdigest()[:16]
    path = Path(tempfile.gettempdir()) / f"gpu-defrag-wheelhouse-{key}"
    if path.is_dir():
        return path
    partial = Path(tempfile.mkdtemp(prefix=f"{path.name}."))
    download = (sys.executable, "-m", "pip", "download", "-q", "--only-binary", ":all:")
    for args in (("--require-hashes", "-r", LOCK), ("setuptools>=77",)):
        done = run(*download, "-d", partial, *args)
        if done.returncode != 0:
            shutil.rmtree(partial)
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            skip_or_fail(f"cannot download the exporter's wheels: {last}")
    try:
        partial.rename(path)
    except OSError:  # another run stored it first
        shutil.rmtree(partial)
    return path


@pytest.fixture(scope="module")
def slim_venv(wheelhouse: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with `pip install .` of a copy of this checkout, offline."""
    tmp = tmp_path_factory.mktemp("slim")
    source = tmp / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    for pattern in setuptools["packages"]["find"]["include"]:
        package = pattern.rstrip("*")
        shutil.copytree(
            ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    venv = tmp / "venv"
    done = run(sys.executable, "-m", "venv", venv)
    assert done.returncode == 0, done.stderr
    done = run(
        venv / "bin" / "python",
        "-m",
        "pip",
        "install",
        "--no-index",
        "--find-links",
        wheelhouse,
        source,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return venv


def test_the_base_install_pulls_no_analysis_stack(slim_venv: Path) -> None:
    done = run(slim_venv / "bin" / "python", "-m", "pip", "list", "--format", "json")
    installed = {p["name"].lower().replace("_", "-") for p in json.loads(done.stdout)}
    assert "gpu-defrag" in installed
    assert {"numpy", "prometheus-client", "nvidia-ml-py"} <= installed
    assert not installed & HEAVY, sorted(installed & HEAVY)


def test_help_works_and_a_command_without_its_extra_says_which(slim_venv: Path, tmp_path) -> None:
    command = slim_venv / "bin" / "gpu-defrag"
    done = run(command, "--help", cwd=tmp_path)
    assert done.returncode == 0 and "exporter" in done.stdout, done.stderr
    done = run(command, "exporter", "--help", cwd=tmp_path)
    assert done.returncode == 0 and "--collect.interval" in done.stdout, done.stderr
    for argv, extra in ((["backtest", "--help"], "advisor"), (["app"], "app")):
        done = run(command, *argv, cwd=tmp_path)
        assert done.returncode == 1, done.stderr
        (line,) = done.stderr.splitlines()
        assert line.startswith(f"gpu-defrag {argv[0]}: error: needs the [{extra}] extra"), line
        assert line.endswith(f"pip install 'gpu-defrag[{extra}]'"), line


def test_the_exporter_serves_the_simulated_fleet(slim_venv: Path, tmp_path) -> None:
    port = free_port()
    process = subprocess.Popen(
        [
            str(slim_venv / "bin" / "gpu-defrag"),
            "exporter",
            "--backend=sim",
            "--sim.preset=a100-16x8",
            "--collect.interval=1s",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        cwd=tmp_path,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        page = b""
        while b"gpu_node_gpus" not in page:  # ready, or the process ended; pytest bounds it
            if process.poll() is not None:
                pytest.fail(f"the exporter exited: {process.stderr.read()}")
            try:
                page = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
            except OSError:
                time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0, process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
