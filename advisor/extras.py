"""Which optional extra of the distribution brings which package, so a command that needs one
that is not installed says so in one line instead of a traceback.

`pip install gpu-defrag` alone gives the exporter (and the `gpu-defrag` command); the analysis
stack comes with `gpu-defrag[advisor]`, the Streamlit app with `gpu-defrag[app]`, both with
`gpu-defrag[all]` (pyproject.toml). Keep this table in step with those extras: a test compares
them.
"""

from __future__ import annotations

import importlib.util

# top-level import name -> the extra whose requirements bring it
EXTRA_OF_MODULE: dict[str, str] = {
    "pandas": "advisor",
    "sklearn": "advisor",
    "scipy": "advisor",
    "ortools": "advisor",
    "matplotlib": "advisor",
    "threadpoolctl": "advisor",
    "kubernetes": "advisor",
    "msgspec": "advisor",
    "fastapi": "advisor",
    "pydantic": "advisor",
    "uvicorn": "advisor",
    "streamlit": "app",
    "plotly": "app",
}


def missing_extra(error: ModuleNotFoundError) -> str | None:
    """The line to print for a failed import of a package an extra brings; None for any other
    missing module (a real bug, which keeps its traceback)."""
    top = (error.name or "").split(".")[0]
    extra = EXTRA_OF_MODULE.get(top)
    if extra is None:
        return None
    return f"needs the [{extra}] extra (no module named {top!r}): pip install 'gpu-defrag[{extra}]'"


def require(*modules: str) -> None:
    """Raise ModuleNotFoundError for the first of `modules` that is not installed: for commands
    that hand the import to another process (the app's Streamlit), checked before it starts."""
    for module in modules:
        if importlib.util.find_spec(module) is None:
            raise ModuleNotFoundError(f"No module named {module!r}", name=module)
