"""`k8s:` for `advisor.ingest.schedulers`: one read, or a watched reader for the service."""

from __future__ import annotations

from advisor.ingest.kubernetes import cache
from advisor.ingest.kubernetes.spec import parse
from advisor.scheduler_view import SchedulerView


def _spec(text: str):  # type: ignore[no-untyped-def]
    """The parsed spec; SpecError (a ValueError: bad input, exit 2) for a bad option."""
    return parse(text)


def check(spec: str) -> None:
    """SpecError for a bad option; nothing read."""
    _spec(spec)


def read_view(spec: str, timeout: float) -> SchedulerView:
    """List nodes, pods, quotas and the installed custom resources once."""
    return cache.read(_spec(spec), timeout)


def open_view(spec: str, timeout: float) -> cache.Watcher:
    """A reader that lists once (at its first call) and then watches."""
    return cache.Watcher(_spec(spec), timeout)
