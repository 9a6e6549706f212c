"""Every way the API server can fail is one line naming the cause; nothing crashes."""

from __future__ import annotations

import pytest

from advisor.cli import main
from advisor.ingest.sources import SourceError, load_source
from tests.kubernetes import objects as k
from tests.ports import free_port


def one_line(spec: str) -> str:
    with pytest.raises(SourceError) as error:
        load_source(spec, timeout=3)
    text = str(error.value)
    assert "\n" not in text and "Traceback" not in text
    return text


def test_unreachable(kube, tmp_path, monkeypatch):
    server = kube({})
    port = free_port()
    path = tmp_path / "kc"
    server.kubeconfig(path)
    path.write_text(path.read_text().replace(server.url, f"http://127.0.0.1:{port}"))
    monkeypatch.setenv("KUBECONFIG", str(path))
    text = one_line("k8s:")
    assert f"cannot reach the API server at http://127.0.0.1:{port}" in text
    assert "connection refused" in text


def test_unauthorized(kube, tmp_path, monkeypatch):
    server = kube({}, token="right")
    monkeypatch.setenv("KUBECONFIG", str(server.kubeconfig(tmp_path / "kc", token="wrong")))
    assert "refused the credentials (401 Unauthorized)" in one_line("k8s:")


def test_forbidden_names_verb_and_resource(kube):
    kube({"nodes": [k.node("n1")]}, forbidden=[("list", "pods")])
    text = one_line("k8s:")
    assert "forbidden (403): the account may not list pods in all namespaces" in text
    assert "grant list on pods" in text and "advisor-rbac.yaml" in text


def test_forbidden_custom_resource_is_a_note(kube):
    kube(
        {"nodes": [k.node("n1")], "clusterqueues": [k.cluster_queue("a", 8)]},
        forbidden=[("list", "clusterqueues")],
    )
    model = load_source("k8s:")
    assert len(model.nodes) == 1
    assert any(
        "ClusterQueue (clusterqueues.kueue.x-k8s.io) not read" in n and "list" in n
        for n in model.scheduler.notes
    )


def test_crds_not_installed_are_simply_absent(kube):
    server = kube({"nodes": [k.node("n1", labels={"topology.kubernetes.io/rack": "r"})]})
    model = load_source("k8s:")
    assert model.scheduler.notes == ()
    assert server.count("list") == 3  # the 404s of absent CRDs are no error and no note


def test_missing_kubeconfig(monkeypatch, tmp_path):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "nope"))
    assert "kubeconfig" in one_line("k8s:") and "does not exist" in one_line("k8s:")


def test_no_kubeconfig_and_not_in_a_pod(monkeypatch, tmp_path):
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert "no kubeconfig" in one_line("k8s:")


def test_unknown_context(kube):
    kube({})
    assert "other" in one_line("k8s:other")


def test_cli_exit_2_one_line(kube, capsys):
    kube({"nodes": [k.node("n1")]}, forbidden=[("list", "nodes")])
    assert main(["analyze", "k8s:"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "may not list nodes" in err[0]
