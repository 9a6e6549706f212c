"""The NVML backend's tests, run again against real nvidia-ml-py releases other than the one
installed: the declared floor, the newest pinned one, and the release the project declared
before (12.535.108, below the floor: what it lacks must cost values, never the backend).

Each release is installed with pip into its own directory (`make test` fills them first;
`NVML_RELEASES_DIR`, default `.venv/nvml-releases/`) and put first on PYTHONPATH of a pytest
child process, so `import pynvml` in the backend and in the fake is that release's module: the
fake takes its constants, structs and function names from it (`tests/fakes/fake_pynvml.py`).
CI has no GPU: the fake drives the backend in every run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from exporter.backends.nvml_calls import PYNVML_FLOOR
from tests.ci import skip_or_fail

ROOT = Path(__file__).resolve().parents[2]
BELOW_FLOOR = "12.535.108"  # the floor pyproject.toml declared before: lacks calls we make
BACKEND_TESTS = (
    "tests/exporter/test_backend_nvml.py",
    "tests/exporter/test_backend_nvml_coverage.py",
    "tests/exporter/test_backend_nvml_rescan.py",
    "tests/exporter/test_fake_pynvml.py",
    "tests/exporter/test_nvml_library.py",
)


def newest() -> str:
    """The release constraints.txt pins (what `make test` installs, the newest we support)."""
    text = (ROOT / "constraints.txt").read_text()
    match = re.search(r"^nvidia-ml-py==(\S+)$", text, re.MULTILINE)
    assert match, "constraints.txt pins no nvidia-ml-py"
    return match.group(1)


def releases() -> list[str]:
    """Below the floor, the floor, the newest (`make nvml-releases` installs these)."""
    return [BELOW_FLOOR, PYNVML_FLOOR, newest()]


def releases_dir() -> Path:
    return Path(os.environ.get("NVML_RELEASES_DIR") or ROOT / ".venv" / "nvml-releases")


def installed(version: str) -> Path:
    """The directory holding `version` alone (pip --target), installed now if it is missing."""
    target = releases_dir() / version
    if (target / "pynvml.py").is_file():
        return target
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target"]
    command += [str(target), f"nvidia-ml-py=={version}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if done.returncode != 0 or not (target / "pynvml.py").is_file():
        lines = (done.stderr or done.stdout).strip().splitlines() or ["no output"]
        skip_or_fail(f"cannot install nvidia-ml-py=={version}: {lines[-1]}")
    return target


@pytest.mark.slow
@pytest.mark.parametrize("version", releases())
def test_backend_tests_pass_against_release(version):
    target = installed(version)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), str(ROOT)])}
    probe = subprocess.run(
        [sys.executable, "-c", "import pynvml; print(pynvml.__file__)"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
    )
    assert probe.stdout.strip() == str(target / "pynvml.py"), probe.stderr
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *BACKEND_TESTS],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
    )
    tail = "\n".join(run.stdout.splitlines()[-30:])
    assert run.returncode == 0, f"nvidia-ml-py {version}:\n{tail}\n{run.stderr[-2000:]}"
