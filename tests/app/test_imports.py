"""The app is a view over the advisor pipeline (DESIGN.md): it imports the pipeline's interface,
never the planner, forecast, fragmentation, ingest, history or service internals. Every import
of every module under advisor/app/, at the top or inside a function, is checked."""

from __future__ import annotations

import ast
from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "advisor" / "app"
# what the app may import of the advisor: the pipeline and what it publishes
ALLOWED = (
    "advisor.app",
    "advisor.pipeline",  # Pipeline, View, Settings, queries
    "advisor.documents",  # the typed results it renders
    "advisor.client",  # the service's API, read back as a View
    "advisor.settings",  # the one settings object and its defaults
    "advisor.model",  # the cluster model type a view holds
    "advisor.contract",  # the GPU state codes /metrics serves
    "advisor.logs",  # the processes' log filters
    "advisor.ingest.schedulers",  # the SOURCE grammar: --source repeated joins (JoinSources)
    "advisor.extras",  # which extra brings streamlit and plotly (a one-line error when missing)
)


def advisor_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every `advisor...` import in the file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "advisor":  # from advisor import x: the module advisor.x
                out += [(node.lineno, f"advisor.{alias.name}") for alias in node.names]
            else:
                out.append((node.lineno, node.module))
    return [(line, name) for line, name in out if name.split(".")[0] == "advisor"]


def test_the_app_imports_only_the_pipelines_interface() -> None:
    files = sorted(APP.rglob("*.py"))
    assert len(files) >= 10  # main, data, plans, forecasts, figures, cli, the five views
    wrong = [
        f"{path.relative_to(APP.parents[1])}:{line}: {name}"
        for path in files
        for line, name in advisor_imports(path)
        if not name.startswith(ALLOWED)
    ]
    assert wrong == []


def test_the_check_sees_imports_inside_functions(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from advisor import pipeline\n"
        "def f():\n"
        "    from advisor.planner.cli import solve\n"
        "    import advisor.forecast.live\n"
    )
    names = [name for _, name in advisor_imports(probe)]
    assert names == ["advisor.pipeline", "advisor.planner.cli", "advisor.forecast.live"]
    assert [n for n in names if not n.startswith(ALLOWED)] == names[1:]
