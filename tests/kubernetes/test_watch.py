"""The service's reader: list once, then watch; 410 re-lists; a dropped watch serves the last
good view marked stale until it is back. Requests are counted, never one per object."""

from __future__ import annotations

import time

from advisor.ingest.kubernetes.cache import Watcher
from advisor.ingest.kubernetes.spec import parse
from tests.kubernetes import objects as k


def wait_for(check, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not reached")


def pods_of(view):
    return sorted(t.id for t in view.tasks)


def test_watch_keeps_the_view_current_without_relisting(kube):
    server = kube({"nodes": [k.node("n1")], "pods": [k.pod("a", "p0", 1, node_name="n1")]})
    watcher = Watcher(parse("k8s:"), timeout=5)
    try:
        assert pods_of(watcher()) == ["a/p0"]
        lists = server.count("list")
        server.apply("ADDED", "pods", k.pod("a", "p1", 2, node_name="n1"))
        server.apply("DELETED", "pods", k.pod("a", "p0", 1, node_name="n1"))
        server.apply("MODIFIED", "pods", k.pod("a", "p1", 2, node_name="n1", phase="Succeeded"))
        server.apply("ADDED", "pods", k.pod("a", "w", 4))
        wait_for(lambda: pods_of(watcher()) == ["a/w"])
        server.apply("ADDED", "nodes", k.node("n2"))
        wait_for(lambda: len(watcher().nodes) == 2)
        assert server.count("list") == lists  # no re-list
        assert watcher.relists == 0
        assert watcher().stale == ""
    finally:
        watcher.close()


def test_gone_relists(kube):
    server = kube({"nodes": [k.node("n1")], "pods": []})
    watcher = Watcher(parse("k8s:"), timeout=5)
    try:
        watcher()
        wait_for(lambda: server.count("watch", "pods") >= 1)
        server.compact()  # the server forgets history: an old resourceVersion is 410 Gone
        server.apply("ADDED", "pods", k.pod("a", "late", 1, node_name="n1"))
        server.compact()
        server.drop_watches()
        wait_for(lambda: watcher.relists >= 1)
        wait_for(lambda: pods_of(watcher()) == ["a/late"])
    finally:
        watcher.close()


def test_dropped_watch_serves_last_view_marked_stale(kube):
    server = kube({"nodes": [k.node("n1")], "pods": [k.pod("a", "p0", 1, node_name="n1")]})
    watcher = Watcher(parse("k8s:"), timeout=5)
    try:
        watcher()
        wait_for(lambda: server.count("watch") >= 3)
        server.down = True
        server.drop_watches()
        stale = wait_for(lambda: watcher().stale)
        assert "serving the last good view" in stale and "is down" in stale
        assert pods_of(watcher()) == ["a/p0"]  # the last good view, still served
        server.down = False
        server.apply("ADDED", "pods", k.pod("a", "p1", 1, node_name="n1"))
        wait_for(lambda: not watcher().stale, timeout=20)
        wait_for(lambda: pods_of(watcher()) == ["a/p0", "a/p1"])
    finally:
        watcher.close()


def test_first_read_failure_is_retried_next_call(kube):
    server = kube({"nodes": [k.node("n1")]})
    server.down = True
    watcher = Watcher(parse("k8s:"), timeout=5)
    try:
        try:
            watcher()
        except Exception as error:  # the service's ingest error for this run
            assert "503" in str(error)
        else:
            raise AssertionError("a down server must fail the first read")
        server.down = False
        assert len(watcher().nodes) == 1
    finally:
        watcher.close()
