"""A fake API server (tests/fakes/kube_apiserver.py) per test, and KUBECONFIG pointing at it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.fakes.kube_apiserver import KubeApiServer


@pytest.fixture
def kube(tmp_path, monkeypatch) -> Iterator[Callable[..., KubeApiServer]]:
    """`kube(objects, **server options)` starts a fake API server and points the default
    kubeconfig at it; every server started is stopped after the test."""
    started: list[KubeApiServer] = []

    def start(objects: dict[str, list[dict[str, Any]]] | None = None, **kwargs: Any):
        server = KubeApiServer(objects, **kwargs).start()
        started.append(server)
        path = server.kubeconfig(tmp_path / f"kubeconfig-{len(started)}")
        monkeypatch.setenv("KUBECONFIG", str(path))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        return server

    yield start
    for server in started:
        server.stop()
