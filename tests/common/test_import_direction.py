"""DESIGN.md's direction of imports, read from the source: the exporter never imports the
advisor, and the common package imports neither (both depend on it, it depends on no side).
The advisor imports from the exporter only its contract (metric names, the reading dataclasses,
the rule for "in use", how a dcgm-exporter page reads as readings), and only where readings
come in (`advisor/ingest/`) or the metric contract is extended (`advisor/contract.py`): the
model and every analysis know nothing of the exporter, and nothing of the advisor's imports
`exporter.backends`."""

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
        ("gpu_defrag_sim", {"advisor", "dashboards", "alerts"}),  # the fleet both may run
    ],
)
def test_package_imports_only_downwards(package: str, forbidden: set[str]) -> None:
    wrong = {
        module: sorted(names & forbidden)
        for module, names in imported_packages(package).items()
        if names & forbidden
    }
    assert not wrong, f"{package} must not import {sorted(forbidden)}: {wrong}"


def imported_modules(path: Path) -> set[str]:
    """Full names of the modules one file imports (`from a import b` is `a.b` where b is a
    module of ours, else `a`)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                as_path = ROOT / full.replace(".", "/")
                is_module = as_path.with_suffix(".py").is_file() or as_path.is_dir()
                names.add(full if is_module else node.module)
    return names


# What the advisor may import from the exporter: its contract (metric names, the reading
# dataclasses, the rule for "in use", how a dcgm-exporter page reads as readings). Nothing of
# exporter.backends: the dcgm-exporter backend reads pages with the same public reader.
EXPORTER_CONTRACT = {
    "exporter.contract",
    "exporter.readings",
    "exporter.usage",
    "exporter.dcgm_page",
}
READS_EXPORTER = {
    "advisor/contract.py": {"exporter.contract"},
    "advisor/ingest/": EXPORTER_CONTRACT,
}


def beyond_the_contract(root: Path) -> dict[str, list[str]]:
    """{module under `root` (advisor/...): the exporter modules it imports beyond what its
    place allows}."""
    wrong = {}
    for path in sorted((root / "advisor").rglob("*.py")):
        module = str(path.relative_to(root))
        allowed = set().union(
            *(names for prefix, names in READS_EXPORTER.items() if module.startswith(prefix))
        )
        exporter = {name for name in imported_modules(path) if name.split(".")[0] == "exporter"}
        if exporter - allowed:
            wrong[module] = sorted(exporter - allowed)
    return wrong


def test_the_advisor_imports_only_the_exporter_contract_where_readings_come_in() -> None:
    wrong = beyond_the_contract(ROOT)
    assert not wrong, f"the advisor imports from the exporter beyond its contract: {wrong}"


def test_an_import_of_the_exporters_backends_is_refused_even_in_ingest(tmp_path: Path) -> None:
    """The rule has no exception left: the page reader the ingest once took from the
    dcgm-exporter backend would be named again (and so would the backend's error)."""
    ingest = tmp_path / "advisor" / "ingest"
    ingest.mkdir(parents=True)
    (ingest / "pages.py").write_text(
        "from exporter.backends import dcgm_exporter as dx\n"
        "from exporter.backends.base import BackendUnavailable\n"
        "from exporter.dcgm_page import canonical_name\n"
    )
    assert beyond_the_contract(tmp_path) == {
        "advisor/ingest/pages.py": ["exporter.backends.base", "exporter.backends.dcgm_exporter"]
    }


def test_the_module_checker_sees_exporter_imports() -> None:
    """The walk names the exporter's modules the advisor's ingest reads (a checker that reads
    nothing would pass every rule)."""
    found = imported_modules(ROOT / "advisor/ingest/readings.py")
    assert {"exporter.readings", "exporter.usage"} <= found
    assert "exporter.dcgm_page" in imported_modules(ROOT / "advisor/ingest/exporter_scrape.py")


def test_the_checker_sees_imports() -> None:
    """The walk finds real imports (a checker that reads nothing would pass every rule)."""
    assert "gpu_defrag_common" in imported_packages("exporter")["exporter/collector.py"]
