"""A watched copy of the cluster: list once, then watch each kind from its resourceVersion.

`Watcher` is what the advisor service reads every run: the first call lists every kind (the
custom resources that are installed), then one daemon thread per kind watches it and applies
the events to a `Store` of records. A watch the server ends is reopened from the last
resourceVersion (bookmarks keep it fresh); 410 Gone re-lists that kind; a watch that drops
(the API server restarts, the network goes) is retried with backoff, and until it is back the
view is the last good one, marked stale with the reason. Nothing re-lists while the watches
hold (`KubeClient.requests` counts what was sent; bench/k8s_source.py reports it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from advisor.ingest.kubernetes import convert
from advisor.ingest.kubernetes.client import Forbidden, Gone, KubeClient, KubeError, NotInstalled
from advisor.ingest.kubernetes.records import node_record, pod_record
from advisor.ingest.kubernetes.resources import NODES, OPTIONAL, PODS, QUOTAS, Resource
from advisor.ingest.kubernetes.spec import KubeSpec
from advisor.scheduler_view import SchedulerView

log = logging.getLogger(__name__)

WATCH_TIMEOUT_S = 300  # the server ends each watch after this; it is reopened, not re-listed
BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0)


def _meta(obj: Any) -> tuple[str, str, str]:
    """(namespace, name, resourceVersion) of a `shapes` Struct or a JSON object."""
    if isinstance(obj, dict):
        meta = obj.get("metadata") or {}
        return (
            str(meta.get("namespace") or ""),
            str(meta.get("name") or ""),
            str(meta.get("resourceVersion") or ""),
        )
    meta = obj.metadata
    return meta.namespace or "", meta.name, meta.resourceVersion or ""


def _key(obj: Any) -> str:
    ns, name, _ = _meta(obj)
    return f"{ns}/{name}" if ns else name


def keeper(resource: Resource) -> Callable[[dict], Any]:
    """What a store keeps of an object: a record for nodes and pods, the JSON otherwise."""
    if resource is NODES:
        return node_record
    if resource is PODS:
        return pod_record
    return lambda obj: obj


class Store:
    """The objects of one kind by namespace/name, and the resourceVersion they are at."""

    def __init__(self, resource: Resource) -> None:
        self.resource = resource
        self.keep = keeper(resource)
        self.items: dict[str, Any] = {}
        self.version = ""
        self.lock = threading.Lock()

    def fill(self, client: KubeClient) -> None:
        """List the kind anew and replace the contents (the old stay until the list is whole)."""
        found: dict[str, Any] = {}

        def keep(obj: dict) -> None:
            kept = self.keep(obj)
            if kept is not None:
                found[_key(obj)] = kept

        _, version = client.list(self.resource, keep)
        with self.lock:
            self.items, self.version = found, version

    def apply(self, kind: str, obj: Any) -> None:
        version = _meta(obj)[2]
        with self.lock:
            if kind == "DELETED":
                self.items.pop(_key(obj), None)
            elif kind in ("ADDED", "MODIFIED"):
                kept = self.keep(obj)
                if kept is None:
                    self.items.pop(_key(obj), None)
                else:
                    self.items[_key(obj)] = kept
            if version:
                self.version = version

    def values(self) -> list[Any]:
        with self.lock:
            return list(self.items.values())


def list_once(client: KubeClient, spec: KubeSpec) -> tuple[dict[str, Store], list[str]]:
    """Stores of every required kind and every installed custom resource, listed once; notes
    for custom resources the account may not read. KubeError (one line) for the rest."""
    stores: dict[str, Store] = {}
    notes: list[str] = []
    for resource in (NODES, PODS, QUOTAS):
        store = Store(resource)
        store.fill(client)
        stores[resource.key] = store
    for resource in OPTIONAL:
        store = Store(resource)
        try:
            store.fill(client)
        except NotInstalled:
            continue  # the CRD is not installed: simply absent
        except Forbidden as error:
            notes.append(
                f"{resource.kind} ({resource.full_name}) not read: the account may not "
                f"{error.verb} it (grant get/list/watch)"
            )
            continue
        stores[resource.key] = store
    return stores, notes


def objects_of(
    stores: dict[str, Store], notes: list[str], stale: str = "", at: float | None = None
) -> convert.Objects:
    custom = {key: store.values() for key, store in stores.items() if store.resource.optional}
    return convert.Objects(
        nodes=stores[NODES.key].values(),
        pods=stores[PODS.key].values(),
        quotas=stores[QUOTAS.key].values(),
        custom=custom,
        notes=tuple(notes),
        timestamp=time.time() if at is None else at,
        stale=stale,
    )


class Watcher:
    """The service's reader of one `k8s:` source (module docstring)."""

    def __init__(self, spec: KubeSpec, timeout: float, client: KubeClient | None = None) -> None:
        self.spec = spec
        self.timeout = timeout
        self.client = client
        self.stores: dict[str, Store] = {}
        self.notes: list[str] = []
        self.relists = 0  # lists after the first (410 Gone, or a drop that outlived history)
        self._down: dict[str, str] = {}  # kind -> why its watch is down
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._started = False

    def _start(self) -> None:
        if self.client is None:
            self.client = KubeClient(self.spec, self.timeout)
        self.stores, self.notes = list_once(self.client, self.spec)
        for store in self.stores.values():
            thread = threading.Thread(
                target=self._watch,
                args=(store,),
                name=f"k8s-watch-{store.resource.key}",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)
        self._started = True

    def __call__(self) -> SchedulerView:
        with self._lock:
            if not self._started:
                self._start()  # a KubeError here is the service's ingest error, retried next run
        with self._lock:
            down = dict(self._down)
        stale = ""
        if down:
            kind, why = next(iter(sorted(down.items())))
            stale = f"serving the last good view: the watch of {kind} is down ({why})"
        return convert.view(objects_of(self.stores, self.notes, stale), self.spec)

    def _watch(self, store: Store) -> None:
        """Watch one kind until closed: reopen after the server's timeout, re-list on 410,
        back off while the API server cannot be reached."""
        failures = 0
        assert self.client is not None
        while not self._stop.is_set():
            try:
                response = self.client.open_watch(store.resource, store.version, WATCH_TIMEOUT_S)
                self._up(store)
                failures = 0
                for kind, obj in self.client.events(store.resource, response):
                    store.apply(kind, obj)
                    if self._stop.is_set():
                        return
            except Gone:
                if self._stop.is_set():
                    return
                try:
                    store.fill(self.client)
                    self.relists += 1
                    self._up(store)
                    failures = 0
                except KubeError as error:
                    failures = self._failed(store, str(error), failures)
            except KubeError as error:
                if self._stop.is_set():
                    return
                failures = self._failed(store, str(error), failures)
            except Exception as error:  # a malformed event must not end the watch for good
                if self._stop.is_set():
                    return
                log.exception("watch of %s failed", store.resource.full_name)
                failures = self._failed(store, f"{type(error).__name__}: {error}", failures)

    def _up(self, store: Store) -> None:
        with self._lock:
            if self._down.pop(store.resource.key, None) is not None:
                log.info("watch of %s is back", store.resource.full_name)

    def _failed(self, store: Store, why: str, failures: int) -> int:
        with self._lock:
            first = store.resource.key not in self._down
            self._down[store.resource.key] = why
        if first:
            log.warning("%s; serving the last good view, marked stale", why)
        self._stop.wait(BACKOFF_S[min(failures, len(BACKOFF_S) - 1)])
        return failures + 1

    def close(self) -> None:
        self._stop.set()
        if self.client is not None:
            self.client.close()
        for thread in self._threads:
            thread.join(timeout=5)

    @property
    def requests(self) -> int:
        return self.client.requests if self.client is not None else 0


def read(spec: KubeSpec, timeout: float) -> SchedulerView:
    """One read: list every kind once (no watch)."""
    client = KubeClient(spec, timeout)
    try:
        stores, notes = list_once(client, spec)
        return convert.view(objects_of(stores, notes), spec)
    finally:
        client.close()
