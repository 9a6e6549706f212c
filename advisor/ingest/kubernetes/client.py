"""List and watch through the official `kubernetes` client, as raw JSON, one line per failure.

The client's generated models cost milliseconds per pod to build; a fleet of 100,000 pods is
read as JSON (`_preload_content=False`) and cut down to `records` at once. Lists are chunked
(`limit` + `continue`, never one request per object); watches resume from the list's
`resourceVersion` with bookmarks, and a watch the server ends with 410 Gone raises `Gone` so the
cache re-lists.

Authentication is the client's own: the kubeconfig's context (`KUBECONFIG` or `~/.kube/config`)
or, without a kubeconfig inside a pod, the service account. Every failure is a `KubeError` with
one line: the server cannot be reached, the credentials are refused (401), or the account may
not do something (403: the line names the verb and resource to grant).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import urllib3

from advisor.ingest.exporter_scrape import SourceUnavailable
from advisor.ingest.kubernetes import shapes
from advisor.ingest.kubernetes.resources import POD_FIELD_SELECTOR, PODS, Resource
from advisor.ingest.kubernetes.spec import KubeSpec

PAGE = 2000  # objects per list request (kube-apiserver serves pages of any size)
RBAC_FILE = "deploy/kubernetes/advisor-rbac.yaml"


class KubeError(SourceUnavailable):
    """The API server could not be read; the message is one line."""


class Forbidden(KubeError):
    """403: the account lacks `verb` on `resource`."""

    def __init__(self, message: str, resource: Resource, verb: str) -> None:
        super().__init__(message)
        self.resource = resource
        self.verb = verb


class NotInstalled(KubeError):
    """404 on a custom resource: its CRD is not installed (simply absent)."""


class Gone(Exception):
    """410: the watch's resourceVersion is too old; list again."""


def _kubeconfig_path() -> str | None:
    env = os.environ.get("KUBECONFIG", "")
    paths = [p for p in env.split(os.pathsep) if p]
    if paths:
        return paths[0] if len(paths) == 1 else env
    default = Path.home() / ".kube" / "config"
    return str(default) if default.is_file() else None


def api_client(spec: KubeSpec) -> Any:
    """An ApiClient for the spec's context (or in-cluster); KubeError when neither exists."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    path = _kubeconfig_path()
    try:
        if path is not None:
            if os.pathsep in path:  # several files: the client merges them
                return config.new_client_from_config(
                    config_file=path, context=spec.context or None, persist_config=False
                )
            if not Path(path).is_file():
                raise KubeError(f"{spec.text}: kubeconfig {path} does not exist")
            return config.new_client_from_config(
                config_file=path, context=spec.context or None, persist_config=False
            )
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            if spec.context:
                raise KubeError(
                    f"{spec.text}: context {spec.context!r} asked for, but there is no kubeconfig "
                    "(KUBECONFIG, ~/.kube/config); in a pod use k8s: for its service account"
                )
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)
            return client.ApiClient(configuration)
    except ConfigException as error:
        raise KubeError(f"{spec.text}: {' '.join(str(error).split())}") from None
    raise KubeError(
        f"{spec.text}: no kubeconfig (KUBECONFIG, ~/.kube/config) and not inside a pod "
        "(no service account)"
    )


def _status_message(error: Any) -> str:
    """The API server's Status message from an ApiException body, else its reason."""
    body = getattr(error, "body", None)
    if body:
        try:
            doc = json.loads(body)
            if isinstance(doc, dict) and doc.get("message"):
                return " ".join(str(doc["message"]).split())
        except (ValueError, TypeError):
            pass
    return str(getattr(error, "reason", "") or "").strip()


class KubeClient:
    """Lists and watches `Resource`s for one source spec."""

    def __init__(self, spec: KubeSpec, timeout: float) -> None:
        self.spec = spec
        self.timeout = timeout
        self.api = api_client(spec)
        self.server = str(self.api.configuration.host)
        self.requests = 0  # list pages and watch opens sent (the bench counts them)
        self._open: set[Any] = set()
        self._lock = threading.Lock()

    # --- one request ---
    def _request(self, resource: Resource, verb: str, query: dict[str, Any], timeout: Any) -> Any:
        """The raw (urllib3) response of one list or watch request; KubeError otherwise.

        Sent by the client's own ApiClient (its authentication, TLS and proxy settings) to the
        resource's path: the generated CoreV1Api/CustomObjectsApi modules add nothing to a raw
        JSON read but seconds of import time."""
        from kubernetes.client.exceptions import ApiException

        if resource is PODS:
            query = {"fieldSelector": POD_FIELD_SELECTOR, **query}
        with self._lock:
            self.requests += 1
        try:
            params = self.api.param_serialize(
                method="GET",
                resource_path=resource.path,
                query_params=[(k, v) for k, v in query.items() if v is not None],
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
            )
            response = self.api.call_api(*params, _request_timeout=timeout)
            if not 200 <= response.status <= 299:
                response.read()
                raise ApiException.from_response(http_resp=response, body=None, data=None)
            return response.response
        except ApiException as error:
            raise self._api_error(error, resource, verb) from None
        except (urllib3.exceptions.HTTPError, OSError) as error:
            raise KubeError(
                f"{self.spec.text}: cannot reach the API server at {self.server}: {_reason(error)}"
            ) from None

    def _api_error(self, error: Any, resource: Resource, verb: str) -> KubeError:
        status = int(getattr(error, "status", 0) or 0)
        what = resource.full_name
        message = _status_message(error)
        if status == 401:
            return KubeError(
                f"{self.spec.text}: the API server at {self.server} refused the credentials "
                "(401 Unauthorized): check the kubeconfig's user or the service account token"
            )
        if status == 403:
            scope = " in all namespaces" if resource.namespaced else ""
            return Forbidden(
                f"{self.spec.text}: forbidden (403): the account may not {verb} {what}{scope}: "
                f"grant {verb} on {what} (the ClusterRole in {RBAC_FILE})"
                + (f"; the server said: {message}" if message else ""),
                resource,
                verb,
            )
        if status == 404 and resource.optional:
            return NotInstalled(f"{what} is not installed")
        if status == 410:
            return KubeError(f"{self.spec.text}: {what}: the list expired (410 Gone)")
        if status == 0:
            return KubeError(
                f"{self.spec.text}: cannot reach the API server at {self.server}: "
                f"{message or 'no answer'}"
            )
        return KubeError(
            f"{self.spec.text}: {verb} {what} failed: HTTP {status}"
            + (f": {message}" if message else "")
        )

    # --- list ---
    def list(
        self, resource: Resource, keep: Callable[[dict], Any] | None = None, page: int = PAGE
    ) -> tuple[list[Any], str]:
        """Every object and the list's resourceVersion, in chunks of `page`: the raw JSON
        dicts, or what `keep` makes of each (None drops it), page by page so that a large
        list never sits in memory as JSON."""
        items: list[Any] = []
        token: str | None = None
        version = ""
        while True:
            query = {"limit": page, "continue": token}
            response = self._request(resource, "list", query, self.timeout)
            try:
                page_items, page_version, token = self._page(resource, response.data)
            finally:
                response.release_conn()
            if keep is None:
                items.extend(page_items)
            else:
                items.extend(kept for kept in map(keep, page_items) if kept is not None)
            del page_items
            version = page_version or version
            if not token:
                return items, version

    def _page(self, resource: Resource, body: bytes) -> tuple[list[Any], str, str | None]:
        """(items, resourceVersion, continue token) of one list answer: nodes and pods as
        `shapes` Structs (only the fields read are built), the rest as JSON dicts."""
        decoder = shapes.LIST_DECODERS.get(resource.key)
        where = f"{self.spec.text}: list {resource.full_name}"
        if decoder is not None:
            try:
                doc = decoder.decode(body)
            except shapes.ShapeError as error:
                raise KubeError(f"{where}: not the API's list shape: {error}") from None
            meta = doc.metadata
            return doc.items or [], meta.resourceVersion or "", meta.continue_ or None
        try:
            raw = json.loads(body)
        except ValueError:
            raise KubeError(f"{where}: the answer is not JSON") from None
        if not isinstance(raw, dict) or not isinstance(raw.get("items", []), list):
            raise KubeError(f"{where}: the answer is no list")
        meta = raw.get("metadata") or {}
        return (
            raw.get("items") or [],
            str(meta.get("resourceVersion") or ""),
            (meta.get("continue") or None),
        )

    # --- watch ---
    def open_watch(self, resource: Resource, version: str, timeout_s: int = 300) -> Any:
        """Start a watch of `resource` after `version` (the server ends it after `timeout_s`);
        KubeError when the server refuses it. Read it with `events`."""
        query = {
            "watch": "true",
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": timeout_s,
        }
        response = self._request(resource, "watch", query, (self.timeout, timeout_s + self.timeout))
        with self._lock:
            self._open.add(response)
        return response

    def events(self, resource: Resource, response: Any) -> Iterator[tuple[str, dict]]:
        """(type, object) events of an open watch until the server ends it; `Gone` when its
        resourceVersion is too old; BOOKMARK events carry only the new resourceVersion."""
        from kubernetes.watch.watch import iter_resp_lines

        typed = shapes.OBJECT_DECODERS.get(resource.key)
        try:
            for line in iter_resp_lines(response):
                if not line:
                    continue
                try:
                    event = shapes.EVENT_DECODER.decode(line)
                    kind = event.type
                    if kind == "ERROR" or typed is None:
                        obj: Any = json.loads(bytes(event.object))
                    else:
                        obj = typed.decode(event.object)
                except (*shapes.ShapeError, ValueError):
                    raise KubeError(
                        f"{self.spec.text}: watch {resource.full_name}: an event is not the "
                        "API's JSON"
                    ) from None
                if kind == "ERROR":
                    obj = obj if isinstance(obj, dict) else {}
                    code = int(obj.get("code") or 0)
                    if code == 410:
                        raise Gone(obj.get("message") or "resourceVersion too old")
                    raise KubeError(
                        f"{self.spec.text}: watch {resource.full_name}: "
                        f"{obj.get('message') or obj.get('reason') or 'error event'}"
                    )
                yield kind, obj
        except (urllib3.exceptions.HTTPError, OSError) as error:
            raise KubeError(
                f"{self.spec.text}: watch {resource.full_name} dropped: {_reason(error)}"
            ) from None
        finally:
            with self._lock:
                self._open.discard(response)
            response.release_conn()

    def watch(
        self, resource: Resource, version: str, timeout_s: int = 300
    ) -> Iterator[tuple[str, dict]]:
        """`open_watch` then its `events`."""
        yield from self.events(resource, self.open_watch(resource, version, timeout_s))

    def close(self) -> None:
        """Ends every open watch (their iterators stop) and the connection pool."""
        with self._lock:
            open_now = list(self._open)
        for response in open_now:
            with contextlib.suppress(Exception):  # a stream that just ended: nothing to close
                response.shutdown() if hasattr(response, "shutdown") else response.close()
        with contextlib.suppress(Exception):
            self.api.close()


def _reason(error: BaseException) -> str:
    """The innermost cause of a urllib3/socket error, in a few words."""
    seen = error
    while getattr(seen, "reason", None) is not None and isinstance(seen.reason, BaseException):
        seen = seen.reason
    text = " ".join(str(seen).split())
    for marker in ("Connection refused", "timed out", "Name or service not known"):
        if marker in text:
            return marker.lower()
    return text or type(seen).__name__
