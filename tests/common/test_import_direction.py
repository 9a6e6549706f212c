"""DESIGN.md's direction of imports, read from the source: the exporter never imports the
advisor, and the common package imports neither (both depend on it, it depends on no side)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def imported_packages(package: str) -> dict[str, set[str]]:
    """{module file: top-level packages it imports}, for every module under `package`."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
        found[str(path.relative_to(ROOT))] = names
    return found


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("exporter", {"advisor", "dashboards", "alerts"}),
        ("gpu_defrag_common", {"advisor", "exporter"}),
    ],
)
def test_package_imports_only_downwards(package: str, forbidden: set[str]) -> None:
    wrong = {
        module: sorted(names & forbidden)
        for module, names in imported_packages(package).items()
        if names & forbidden
    }
    assert not wrong, f"{package} must not import {sorted(forbidden)}: {wrong}"


def test_the_checker_sees_imports() -> None:
    """The walk finds real imports (a checker that reads nothing would pass every rule)."""
    assert "gpu_defrag_common" in imported_packages("exporter")["exporter/collector.py"]
