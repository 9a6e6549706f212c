"""Render the kustomize overlays of deploy/ with the real `kubectl kustomize`, as `kubectl apply
-k` would, and look things up in what they render (a pod's environment, a container's
command line after the kubelet's $(VAR) expansion)."""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from pathlib import Path

import yaml

from tests.ci import skip_or_fail

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
BASE = DEPLOY / "kubernetes"
CLUSTER = DEPLOY / "overlays" / "cluster"
KUBE_PROMETHEUS_STACK = DEPLOY / "overlays" / "kube-prometheus-stack"
PLAIN_PROMETHEUS = DEPLOY / "overlays" / "prometheus"
INSTALLABLE = {"kube-prometheus-stack": KUBE_PROMETHEUS_STACK, "prometheus": PLAIN_PROMETHEUS}
_VARIABLE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        skip_or_fail("kubectl is not installed: the kustomize overlays are rendered with it")
    return path


def render_text(directory: Path) -> str:
    result = subprocess.run(
        [kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, f"kubectl kustomize {directory}:\n{result.stderr}"
    return result.stdout


@functools.cache
def _rendered(directory: str) -> str:
    return render_text(Path(directory))


def render(directory: Path) -> list[dict]:
    """The objects `kubectl kustomize directory` makes (parsed anew each call: tests may edit)."""
    return [doc for doc in yaml.safe_load_all(_rendered(str(directory))) if doc]


def copy_deploy(tmp_path: Path) -> Path:
    """A copy of deploy/ to edit: its overlays render as the committed ones do."""
    target = tmp_path / "deploy"
    shutil.copytree(DEPLOY, target)
    return target


def of_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def named(docs: list[dict], kind: str, name: str) -> dict:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def workloads(docs: list[dict]) -> list[dict]:
    return [d for d in docs if d["kind"] in ("DaemonSet", "Deployment")]


def configmap_value(docs: list[dict], namespace: str, name: str, key: str) -> str:
    (doc,) = [
        d
        for d in of_kind(docs, "ConfigMap")
        if d["metadata"]["name"] == name and d["metadata"].get("namespace") == namespace
    ]
    return doc["data"][key]


def environment(docs: list[dict], namespace: str, container: dict) -> dict[str, str]:
    """The container's environment as the kubelet sets it (values and ConfigMap keys)."""
    env = {}
    for variable in container.get("env", []):
        if "value" in variable:
            env[variable["name"]] = variable["value"]
            continue
        ref = variable["valueFrom"].get("configMapKeyRef")
        if ref is not None:
            env[variable["name"]] = configmap_value(docs, namespace, ref["name"], ref["key"])
    return env


def expand(text: str, env: dict[str, str]) -> str:
    """The kubelet's $(VAR) expansion of a command-line argument (undefined ones stay)."""
    return _VARIABLE.sub(lambda m: env.get(m.group(1), m.group(0)), text)


def command_line(docs: list[dict], workload: dict, container: dict) -> list[str]:
    env = environment(docs, workload["metadata"]["namespace"], container)
    return [expand(arg, env) for arg in container.get("args", [])]
