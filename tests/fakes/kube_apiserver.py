"""A loopback stand-in for kube-apiserver that answers list and watch in the API's own JSON.

The real `kubernetes` client talks to it over HTTP like to any API server (tests write a
kubeconfig pointing here): lists in chunks (`limit`, `continue`), `resourceVersion` on every
object and list, `fieldSelector=status.phase!=X` on pods, watches as chunked streams of
`{"type": ..., "object": ...}` lines (ADDED, MODIFIED, DELETED, BOOKMARK) from a resourceVersion,
and an `ERROR` event with a 410 `Status` when that version is older than the history kept
(`compact()`), as the real server does. Errors are `Status` objects: 401 without the bearer
token, 403 for a resource made forbidden (naming the verb and resource as the API server does),
404 for a resource that is not installed (a CRD).

Use it in a test (`serve(objects)` as a context manager, or `KubeApiServer(...).start()`) or as
a process (`python -m tests.fakes.kube_apiserver OBJECTS.json[.gz]`: prints its URL, then
serves until killed; `POST /_fake/apply` takes `{"type", "path", "object"}` events and
`GET /_fake/requests` answers the request counts), so a benchmark's server runs on its own core.

Objects are kept serialized: a list of 100,000 pods is a join of bytes, not a dump.
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import socket
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

TOKEN = "test-token"
PATHS = {  # resource key -> API path (advisor.ingest.kubernetes.resources names the same)
    "nodes": "/api/v1/nodes",
    "pods": "/api/v1/pods",
    "resourcequotas": "/api/v1/resourcequotas",
    "clusterqueues": "/apis/kueue.x-k8s.io/v1beta1/clusterqueues",
    "localqueues": "/apis/kueue.x-k8s.io/v1beta1/localqueues",
    "workloads": "/apis/kueue.x-k8s.io/v1beta1/workloads",
    "resourceflavors": "/apis/kueue.x-k8s.io/v1beta1/resourceflavors",
    "volcano-queues": "/apis/scheduling.volcano.sh/v1beta1/queues",
    "volcano-podgroups": "/apis/scheduling.volcano.sh/v1beta1/podgroups",
    "coscheduling-podgroups": "/apis/scheduling.x-k8s.io/v1alpha1/podgroups",
}
LIST_KINDS = {
    "nodes": ("v1", "NodeList"),
    "pods": ("v1", "PodList"),
    "resourcequotas": ("v1", "ResourceQuotaList"),
    "clusterqueues": ("kueue.x-k8s.io/v1beta1", "ClusterQueueList"),
    "localqueues": ("kueue.x-k8s.io/v1beta1", "LocalQueueList"),
    "workloads": ("kueue.x-k8s.io/v1beta1", "WorkloadList"),
    "resourceflavors": ("kueue.x-k8s.io/v1beta1", "ResourceFlavorList"),
    "volcano-queues": ("scheduling.volcano.sh/v1beta1", "QueueList"),
    "volcano-podgroups": ("scheduling.volcano.sh/v1beta1", "PodGroupList"),
    "coscheduling-podgroups": ("scheduling.x-k8s.io/v1alpha1", "PodGroupList"),
}
BY_PATH = {path: key for key, path in PATHS.items()}


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _key(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta['name']}" if ns else str(meta["name"])


@dataclass
class _Entry:
    body: bytes  # the object's JSON
    phase: str  # pods: status.phase, for field selectors


@dataclass
class _Resource:
    items: dict[str, _Entry] = field(default_factory=dict)
    history: list[tuple[int, bytes]] = field(default_factory=list)  # (rv, event line)
    oldest: int = 0  # watches from before this version get 410


class KubeApiServer:
    """The fake API server (module docstring). `objects`: resource key -> JSON objects."""

    def __init__(
        self,
        objects: dict[str, Iterable[dict[str, Any]]] | None = None,
        *,
        token: str | None = TOKEN,
        forbidden: Iterable[tuple[str, str]] = (),
    ) -> None:
        self.token = token
        self.forbidden = set(forbidden)  # (verb, resource key)
        self.version = 1000
        self.resources: dict[str, _Resource] = {}
        self.requests: Counter[tuple[str, str]] = Counter()  # (verb, resource key)
        self.cond = threading.Condition()
        self.closing = False
        self.down = False  # answer 503 to everything (an API server that is restarting)
        self._open: set[Any] = set()
        for key in ("nodes", "pods", "resourcequotas"):
            self.install(key)
        for key, items in (objects or {}).items():
            self.install(key)
            for obj in items:
                self._put(key, obj, event=None)
        self.httpd: ThreadingHTTPServer | None = None
        self.thread: threading.Thread | None = None

    # --- state the tests change ---
    def install(self, key: str) -> None:
        """Make a resource exist (a CRD installed); core kinds always exist."""
        with self.cond:
            self.resources.setdefault(key, _Resource(oldest=self.version))

    def _put(self, key: str, obj: dict[str, Any], event: str | None) -> None:
        self.version += 1
        obj = json.loads(json.dumps(obj))
        meta = obj.setdefault("metadata", {})
        meta["resourceVersion"] = str(self.version)
        meta.setdefault("uid", f"uid-{key}-{_key(obj)}")
        body = json.dumps(obj, separators=(",", ":")).encode()
        phase = str((obj.get("status") or {}).get("phase", ""))
        resource = self.resources.setdefault(key, _Resource(oldest=self.version))
        if event == "DELETED":
            resource.items.pop(_key(obj), None)
        else:
            resource.items[_key(obj)] = _Entry(body, phase)
        if event is not None:
            line = b'{"type":"' + event.encode() + b'","object":' + body + b"}\n"
            resource.history.append((self.version, line))

    def apply(self, event: str, key: str, obj: dict[str, Any]) -> str:
        """ADDED, MODIFIED or DELETED: change the store and tell the watches; the new
        resourceVersion."""
        with self.cond:
            self._put(key, obj, event)
            self.cond.notify_all()
            return str(self.version)

    def compact(self) -> None:
        """Forget every event so far: a watch from an older version gets 410 Gone."""
        with self.cond:
            for resource in self.resources.values():
                resource.history.clear()
                resource.oldest = self.version + 1
            self.version += 1

    def drop_watches(self) -> None:
        """Cut every open watch connection (a dropped watch, as on an API server restart)."""
        with self.cond:
            connections = list(self._open)
        for connection in connections:
            with suppress(OSError):
                connection.shutdown(2)

    def count(self, verb: str, key: str | None = None) -> int:
        return sum(n for (v, k), n in self.requests.items() if v == verb and key in (None, k))

    # --- serving ---
    def start(self) -> KubeApiServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                # headers and body go out as two writes: without this, Nagle's algorithm and
                # the client's delayed ACK hold each answer ~40 ms
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def do_GET(self) -> None:
                server._get(self)

            def do_POST(self) -> None:
                server._post(self)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()
        return self

    @property
    def url(self) -> str:
        assert self.httpd is not None
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def stop(self) -> None:
        with self.cond:
            self.closing = True
            self.cond.notify_all()
        self.drop_watches()
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
        if self.thread is not None:
            self.thread.join(timeout=5)

    def kubeconfig(self, path: Path, context: str = "fake", token: str | None = None) -> Path:
        """A kubeconfig whose `context` points here with the bearer token."""
        return self.kubeconfig_for(self.url, path, context, token or self.token or "none")

    @staticmethod
    def kubeconfig_for(url: str, path: Path, context: str = "fake", token: str = TOKEN) -> Path:
        """A kubeconfig whose `context` points at `url` (a server in another process)."""
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": url}}],
            "users": [{"name": "advisor", "user": {"token": token}}],
            "contexts": [{"name": context, "context": {"cluster": "fake", "user": "advisor"}}],
            "current-context": context,
        }
        path.write_text(json.dumps(doc))
        return path

    # --- handlers ---
    def _send(self, handler: BaseHTTPRequestHandler, code: int, body: bytes) -> None:
        handler.send_response(code)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def _status(self, handler: BaseHTTPRequestHandler, code: int, reason: str, message: str):
        self._send(handler, code, json.dumps(status(code, reason, message)).encode())

    def _get(self, handler: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(handler.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        if parts.path == "/_fake/requests":
            counts = {f"{v} {k}": n for (v, k), n in self.requests.items()}
            self._send(handler, 200, json.dumps(counts).encode())
            return
        if self.down:
            self._status(handler, 503, "ServiceUnavailable", "the server is restarting")
            return
        expected = f"Bearer {self.token}"
        if self.token is not None and handler.headers.get("Authorization", "") != expected:
            self._status(handler, 401, "Unauthorized", "Unauthorized")
            return
        key = BY_PATH.get(parts.path)
        with self.cond:
            installed = key is not None and key in self.resources
        if key is None or not installed:
            self._status(
                handler, 404, "NotFound", "the server could not find the requested resource"
            )
            return
        watching = query.get("watch") in ("true", "1")
        verb = "watch" if watching else "list"
        with self.cond:
            self.requests[(verb, key)] += 1
        if (verb, key) in self.forbidden:
            group = parts.path.split("/")[2] if parts.path.startswith("/apis/") else ""
            plural = parts.path.rsplit("/", 1)[1]
            self._status(
                handler,
                403,
                "Forbidden",
                f'{plural} is forbidden: User "system:serviceaccount:gpu-defrag:advisor" cannot '
                f'{verb} resource "{plural}" in API group "{group}" at the cluster scope',
            )
            return
        if watching:
            self._watch(handler, key, query)
        else:
            self._list(handler, key, query)

    def _selected(self, entry: _Entry, selector: str) -> bool:
        for term in filter(None, selector.split(",")):
            field_name, _, value = term.partition("!=")
            if field_name == "status.phase" and entry.phase == value:
                return False
        return True

    def _list(self, handler: BaseHTTPRequestHandler, key: str, query: dict[str, str]) -> None:
        with self.cond:
            resource = self.resources[key]
            token = query.get("continue")
            if token:
                version, _, start_text = token.partition(":")
                start = int(start_text)
            else:
                version, start = str(self.version), 0
            entries = list(resource.items.values())
        selector = query.get("fieldSelector", "")
        if selector:
            entries = [e for e in entries if self._selected(e, selector)]
        limit = int(query.get("limit") or 0)
        end = start + limit if limit > 0 else len(entries)
        page = entries[start:end]
        meta: dict[str, str] = {"resourceVersion": version}
        if end < len(entries):
            meta["continue"] = f"{version}:{end}"
        api_version, kind = LIST_KINDS[key]
        head = json.dumps({"kind": kind, "apiVersion": api_version, "metadata": meta})
        body = head[:-1].encode() + b',"items":[' + b",".join(e.body for e in page) + b"]}"
        self._send(handler, 200, body)

    def _watch(self, handler: BaseHTTPRequestHandler, key: str, query: dict[str, str]) -> None:
        since = int(query.get("resourceVersion") or 0)
        timeout = float(query.get("timeoutSeconds") or 300)
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        connection = handler.connection
        with self.cond:
            self._open.add(connection)
        deadline = time.monotonic() + timeout

        def chunk(data: bytes) -> None:
            handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            handler.wfile.flush()

        try:
            with self.cond:
                resource = self.resources[key]
                if since and since < resource.oldest:
                    line = json.dumps(
                        {
                            "type": "ERROR",
                            "object": status(
                                410,
                                "Expired",
                                f"too old resource version: {since} ({self.version})",
                            ),
                        }
                    )
                    chunk(line.encode() + b"\n")
                    chunk(b"")
                    return
            sent = since

            def after(version: int) -> list[tuple[int, bytes]]:
                history = resource.history
                at = bisect.bisect_right(history, version, key=lambda item: item[0])
                return history[at:]

            while True:
                with self.cond:
                    pending = after(sent)
                    if not pending and not self.closing:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        self.cond.wait(min(left, 0.5))
                        pending = after(sent)
                    if self.closing:
                        break
                for version, line in pending:
                    chunk(line)
                    sent = version
                if time.monotonic() >= deadline:
                    break
            if bookmarks:
                mark = {
                    "type": "BOOKMARK",
                    "object": {
                        "kind": LIST_KINDS[key][1].removesuffix("List"),
                        "apiVersion": LIST_KINDS[key][0],
                        "metadata": {"resourceVersion": str(max(sent, since))},
                    },
                }
                chunk(json.dumps(mark).encode() + b"\n")
            chunk(b"")
        except OSError:
            pass  # the client went away, or drop_watches cut it
        finally:
            with self.cond:
                self._open.discard(connection)
            handler.close_connection = True

    def _post(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        doc = json.loads(handler.rfile.read(length) or b"{}")
        path = urlsplit(handler.path).path
        if path == "/_fake/apply":
            events = doc if isinstance(doc, list) else [doc]
            version = ""
            for event in events:
                version = self.apply(event["type"], event["resource"], event["object"])
            self._send(handler, 200, json.dumps({"resourceVersion": version}).encode())
        elif path == "/_fake/compact":
            self.compact()
            self._send(handler, 200, b"{}")
        else:
            self._status(handler, 404, "NotFound", "no such fake control")


@contextmanager
def serve(
    objects: dict[str, Iterable[dict[str, Any]]] | None = None, **kwargs: Any
) -> Iterator[KubeApiServer]:
    """A started fake API server for the block; stopped after it."""
    server = KubeApiServer(objects, **kwargs).start()
    try:
        yield server
    finally:
        server.stop()


def load_objects(path: str | Path) -> dict[str, list[dict[str, Any]]]:
    """Objects from a JSON file (gzipped when it ends in .gz): {resource key: [objects]}."""
    raw = Path(path).read_bytes()
    if str(path).endswith(".gz"):
        raw = gzip.decompress(raw)
    doc = json.loads(raw)
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for key, items in doc.items():
        out[key] = list(items)
    return dict(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="fake kube-apiserver on 127.0.0.1")
    parser.add_argument("objects", help="JSON (or .json.gz) of {resource key: [objects]}")
    parser.add_argument("--no-auth", action="store_true")
    parser.add_argument("--kubeconfig", help="write a kubeconfig pointing here to this file")
    args = parser.parse_args(argv)
    server = KubeApiServer(load_objects(args.objects), token=None if args.no_auth else TOKEN)
    server.start()
    if args.kubeconfig:
        server.kubeconfig(Path(args.kubeconfig))
    print(server.url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
