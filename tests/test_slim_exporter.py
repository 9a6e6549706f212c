"""The exporter and the command's help load no analysis stack, and a command whose optional extra
is missing says in one line which to install (issue 27: `pip install gpu-defrag` is the
exporter; the advisor and the app come with extras).

Each check runs in a fresh interpreter (`python -c`) and reads its `sys.modules`: the test
process itself has imported everything long before."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

from advisor.extras import EXTRA_OF_MODULE
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
HEAVY = (
    "pandas",
    "sklearn",
    "scipy",
    "ortools",
    "streamlit",
    "plotly",
    "matplotlib",
    "statsmodels",
)
REPORT_HEAVY = (
    "import json, sys; "
    f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))))"
)


def python(code: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout_s,
    )


def heavy_loaded(code: str) -> list[str]:
    """The heavy packages loaded once `code` has run (its last stdout line)."""
    done = python(f"{code}\n{REPORT_HEAVY}")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("argv", [["--help"], ["exporter", "--help"], ["bogus"]])
def test_help_loads_no_analysis_stack(argv) -> None:
    code = (
        "import contextlib, io\n"
        "from advisor.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        "    try:\n"
        f"        main({argv!r})\n"
        "    except SystemExit:\n"
        "        pass"
    )
    assert heavy_loaded(code) == []


def test_the_checker_sees_a_heavy_import() -> None:
    """The same check on a command that needs the stack finds it (a check that reads nothing
    would pass every rule)."""
    code = (
        "import contextlib, io\n"
        "from advisor.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n"
        "        main(['backtest', '--help'])\n"
        "    except SystemExit:\n"
        "        pass"
    )
    assert "pandas" in heavy_loaded(code)


@pytest.mark.slow
def test_a_serving_exporter_loads_no_analysis_stack() -> None:
    """The real exporter (sim backend) serves a page; then its process reports what it loaded
    and stops itself with SIGTERM, as a kubelet would."""
    port = free_port()
    code = f"""
import os, signal, sys, threading, time, urllib.request
from advisor.cli import main

def watch():
    while True:  # until the page holds the fleet; the test's own timeout bounds the wait
        try:
            page = urllib.request.urlopen("http://127.0.0.1:{port}/metrics", timeout=5).read()
            if b"gpu_node_gpus" in page:
                break
        except OSError:
            pass
        time.sleep(0.1)
    {REPORT_HEAVY}
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGTERM)

threading.Thread(target=watch, daemon=True).start()
sys.exit(main(["exporter", "--backend", "sim", "--sim.preset", "a100-16x8",
               "--collect.interval", "1s", "--web.listen-address", "127.0.0.1:{port}"]))
"""
    done = python(code, timeout_s=240)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


@pytest.mark.parametrize(
    ("blocked", "argv", "extra"),
    [
        ("pandas", ["backtest", "--help"], "advisor"),
        # advise's --help reads its defaults from advisor.settings, no analysis stack: a run
        (
            "scipy",
            ["advise", "--source", "sim:a100-16x8", "--web.listen-address", "127.0.0.1:0"],
            "advisor",
        ),
        ("streamlit", ["app"], "app"),
        ("plotly", ["demo"], "app"),
    ],
)
def test_a_missing_extra_is_one_line(blocked, argv, extra) -> None:
    """`sys.modules[name] = None` makes the import fail as a missing package does."""
    code = (
        f"import sys; sys.modules[{blocked!r}] = None\n"
        "from advisor.cli import main\n"
        f"sys.exit(main({argv!r}))"
    )
    done = python(code)
    assert done.returncode == 1, done.stderr
    assert done.stderr == (
        f"gpu-defrag {argv[0]}: error: needs the [{extra}] extra (no module named {blocked!r}): "
        f"pip install 'gpu-defrag[{extra}]'\n"
    )


def test_a_missing_module_of_our_own_keeps_its_traceback() -> None:
    """Only packages an extra brings get the one line: our own missing module is a bug."""
    code = (
        "import sys; sys.modules['advisor.analyze'] = None\n"
        "from advisor.cli import main\n"
        "sys.exit(main(['analyze', 'sim:a100-16x8']))"
    )
    done = python(code)
    assert done.returncode == 1
    assert "Traceback" in done.stderr and "advisor.analyze" in done.stderr


def _requirement_name(requirement: str) -> str:
    name = requirement
    for stop in "<>=![; ":
        name = name.split(stop)[0]
    return name.lower().replace("_", "-")


def test_the_extras_table_follows_pyproject() -> None:
    """advisor/extras.py names, for every package an extra brings, that extra; the base install
    brings none of the heavy packages."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = {
        extra: {_requirement_name(r) for r in requirements if not r.startswith("gpu-defrag")}
        for extra, requirements in project["optional-dependencies"].items()
    }
    base = {_requirement_name(r) for r in project["dependencies"]}
    distributions = {
        module: {name.lower().replace("_", "-") for name in names}
        for module, names in packages_distributions().items()
    }
    for module, extra in EXTRA_OF_MODULE.items():
        assert distributions[module] & extras[extra], f"{module}: not in the [{extra}] extra"
    for extra in ("advisor", "app"):
        for requirement in extras[extra]:
            modules = {m for m, names in distributions.items() if requirement in names}
            assert any(EXTRA_OF_MODULE.get(m) == extra for m in modules), (
                f"[{extra}] brings {requirement}: advisor/extras.py must name it"
            )
    for module in HEAVY:
        if module in distributions:
            assert not distributions[module] & base, f"the base install brings {module}"
    assert "statsmodels" not in {r for names in extras.values() for r in names} | base
