"""Image size without a Docker engine: what each Dockerfile target adds to its base image.

For each lock file (requirements/exporter.txt: the `exporter` target; requirements/full.txt:
the `full` target) this sums the on-disk size of every file each locked distribution installed
in the running environment (its RECORD, bytecode pip wrote included), and adds the project's own
files as its wheel ships them (no bytecode: it is compiled in the image, not counted here). The
base image's size is the published one: docker-library/repo-info lists python:3.11-slim-bookworm
(linux/amd64) at 47.8 MB compressed and ~130 MB on disk. The full closure is the baseline the
exporter's is compared with, measured in the same run.

A locked version that differs from the installed one is listed: its size is the installed one's.

Usage: .venv/bin/python bench/image_size.py
"""

from __future__ import annotations

import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.machine import describe

ROOT = Path(__file__).resolve().parents[1]
MB = 1e6
BASE_ON_DISK_MB = 130.0  # repo-info repos/python/local/3.11-slim-bookworm.md, "Virtual Size"
BASE_COMPRESSED_MB = 47.8  # repo-info repos/python/remote/3.11-slim-bookworm.md, amd64
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def locked(name: str) -> dict[str, str]:
    """{distribution: version} pinned in requirements/NAME.txt."""
    text = (ROOT / "requirements" / f"{name}.txt").read_text()
    return {m[1]: m[2] for line in text.splitlines() if (m := PIN.match(line))}


def installed_bytes(distribution: metadata.Distribution) -> int:
    total = 0
    for file in distribution.files or ():
        path = Path(str(distribution.locate_file(file)))
        if path.is_file():
            total += path.stat().st_size
    return total


def project_bytes() -> int:
    """The project's packages as the wheel ships them: modules and package data."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    data = setuptools["package-data"]["*"]
    total = 0
    for pattern in setuptools["packages"]["find"]["include"]:
        for path in (ROOT / pattern.rstrip("*")).rglob("*"):
            if "__pycache__" in path.parts or not path.is_file():
                continue
            if path.suffix == ".py" or any(path.match(p) for p in data):
                total += path.stat().st_size
    return total


def closure(name: str) -> tuple[float, list[tuple[float, str]], list[str]]:
    """(MB, [(MB, distribution)] largest first, version differences) of a lock's closure."""
    sizes, differences = [], []
    for package, version in locked(name).items():
        try:
            distribution = metadata.distribution(package)
        except metadata.PackageNotFoundError:
            differences.append(f"{package}=={version} not installed (not counted)")
            continue
        if distribution.version != version:
            differences.append(f"{package}: locked {version}, installed {distribution.version}")
        sizes.append((installed_bytes(distribution) / MB, package))
    sizes.sort(reverse=True)
    return sum(s for s, _ in sizes), sizes, differences


def main() -> int:
    print(describe())
    project = project_bytes() / MB
    print(f"project (gpu-defrag wheel contents, both images): {project:.1f} MB")
    totals = {}
    for name in ("full", "exporter"):
        mb, sizes, differences = closure(name)
        totals[name] = mb
        largest = ", ".join(f"{package} {size:.1f}" for size, package in sizes[:5])
        print(f"{name}: {len(sizes)} distributions, {mb:.1f} MB installed (largest: {largest})")
        for line in differences:
            print(f"  {line}")
        image = BASE_ON_DISK_MB + mb + project
        print(
            f"  image on disk ~ {BASE_ON_DISK_MB:.0f} (base) + {mb:.1f} + {project:.1f} "
            f"= {image:.0f} MB"
        )
    print(
        f"ratio exporter/full: closure {totals['exporter'] / totals['full']:.3f}, image "
        f"{(BASE_ON_DISK_MB + totals['exporter'] + project) / (BASE_ON_DISK_MB + totals['full'] + project):.3f}"
    )
    print(f"base image compressed (pull size, amd64): {BASE_COMPRESSED_MB} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
