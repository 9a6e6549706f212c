"""Scheduler sources and how a SOURCE combines one with usage sources.

A SOURCE may name a scheduler and the usage sources to join it with, by node name, in one
string: the parts joined by `+`, the scheduler first::

    k8s:                                          the scheduler alone (usage unknown)
    k8s:+http://node1:9835/metrics,http://node2:9835/metrics
    k8s:prod?rack-label=example.com/rack+prometheus+http://prometheus:9090
    slurm:+http://node1:9400/metrics              (a dcgm-exporter page works the same)
    slurm+http://slurmrestd:6820+prometheus+http://prometheus:9090

A `+` splits only where a source form starts right after it (`http://`, `https://`,
`prometheus+http(s)://`, a scheduler form), so `prometheus+http://` stays one part and a `+`
inside an option's value does not split. The service and the app also take `--source`
repeated (`--source k8s: --source http://node1:9835/metrics`): the same thing, joined here.

Scheduler forms are registered in `SCHEDULERS` (prefix -> module that reads it), imported only
when used so no scheduler's client library loads for other sources. A module provides
`read_view(spec, timeout) -> SchedulerView` (one read: list everything once), and may provide
`open_view(spec, timeout)` returning a reader that stays current between reads (a watch) with
`__call__() -> SchedulerView` and `close()`; the advisor service uses that one.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Sequence
from typing import Protocol

from advisor.scheduler_view import SchedulerView

# prefix -> module with read_view (and optionally open_view)
SCHEDULERS: dict[str, str] = {
    "k8s:": "advisor.ingest.kubernetes.source",
    "slurm:": "advisor.ingest.slurm_scheduler",
    "slurm+http://": "advisor.ingest.slurm_scheduler",
    "slurm+https://": "advisor.ingest.slurm_scheduler",
    "slurm+unix://": "advisor.ingest.slurm_scheduler",
}
# Alone, these are read by their own reader into the model (`sources.load_source`, with their
# scheduler facts); joined with usage sources they go through their scheduler view like k8s:.
DIRECT = frozenset({"slurm:", "slurm+http://", "slurm+https://", "slurm+unix://"})
USAGE_FORMS = ("prometheus+http://", "prometheus+https://", "http://", "https://")
JOIN = "+"


class ViewReader(Protocol):
    def __call__(self) -> SchedulerView: ...

    def close(self) -> None: ...


def scheduler_prefix(spec: str) -> str | None:
    """The registered scheduler form `spec` starts with, or None."""
    spec = spec.strip()
    return next((p for p in sorted(SCHEDULERS, key=len, reverse=True) if spec.startswith(p)), None)


def _form_at(spec: str, at: int) -> str | None:
    """The source form starting at `at` (scheduler or usage), or None."""
    rest = spec[at:]
    for form in (*sorted(SCHEDULERS, key=len, reverse=True), *USAGE_FORMS):
        if rest.startswith(form):
            return form
    return None


def split(spec: str) -> list[str]:
    """The parts of a combined SOURCE (module docstring); a plain SOURCE is one part."""
    spec = spec.strip()
    parts: list[str] = []
    start = 0
    own = _form_at(spec, 0) or ""
    at = spec.find(JOIN, start + len(own))
    while at != -1:
        form = _form_at(spec, at + 1)
        if form is not None:
            parts.append(spec[start:at])
            start = at + 1
            own = form
            at = spec.find(JOIN, start + len(own))
        else:
            at = spec.find(JOIN, at + 1)
    parts.append(spec[start:])
    return [part.strip() for part in parts]


def join(specs: Sequence[str]) -> str:
    """Several `--source` values as one combined SOURCE (`split` gives them back)."""
    return JOIN.join(spec.strip() for spec in specs if spec.strip())


class JoinSources(argparse.Action):
    """`--source` given again joins the SOURCEs (`join`): `--source k8s: --source
    http://node1:9835/metrics` is `k8s:+http://node1:9835/metrics`; the first one given
    replaces the default."""

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        seen = getattr(namespace, f"_{self.dest}_given", False)
        current = getattr(namespace, self.dest, None)
        value = join([current, str(values)]) if seen and current else str(values)
        setattr(namespace, self.dest, value)
        setattr(namespace, f"_{self.dest}_given", True)


def is_combined(spec: str) -> bool:
    """Whether `spec` goes through the join: a scheduler with usage sources, or one without
    a reader of its own (`DIRECT`) alone."""
    parts = split(spec)
    prefix = scheduler_prefix(parts[0])
    return prefix is not None and (len(parts) > 1 or prefix not in DIRECT)


def parts_of(spec: str) -> tuple[str, list[str]]:
    """(scheduler part, usage parts) of a combined SOURCE; ValueError naming a misplaced part
    (a second scheduler, a scheduler after a usage source)."""
    parts = split(spec)
    scheduler, usage = parts[0], parts[1:]
    for part in usage:
        if scheduler_prefix(part) is not None:
            raise ValueError(
                f"{spec}: {part!r}: one scheduler per source, written first "
                "(k8s:...+http://exporter..., see gpu-defrag analyze --help)"
            )
    if scheduler_prefix(scheduler) is None:
        raise ValueError(f"{spec}: {scheduler!r} is no scheduler source (k8s:...)")
    if len(usage) > 1:
        raise ValueError(
            f"{spec}: one usage source with a scheduler: put every exporter URL in one "
            "comma-separated list, or read them all through Prometheus"
        )
    return scheduler, usage


def _module(spec: str):  # type: ignore[no-untyped-def]
    prefix = scheduler_prefix(spec)
    if prefix is None:
        raise ValueError(f"{spec!r} is no scheduler source")
    return importlib.import_module(SCHEDULERS[prefix])


def check(spec: str) -> None:
    """ValueError (one line) for a scheduler spec no read could take (a bad option), read
    nothing: the service refuses it at start instead of failing every run."""
    checker: Callable[[str], object] | None = getattr(_module(spec), "check", None)
    if checker is not None:
        checker(spec)


def read_view(spec: str, timeout: float) -> SchedulerView:
    """One read of the scheduler `spec` names (raises the module's SourceError lines)."""
    return _module(spec).read_view(spec, timeout)


def open_view(spec: str, timeout: float) -> ViewReader:
    """A reader that keeps the scheduler's view current between calls where the module can
    (a watch), else one that reads it anew on every call."""
    module = _module(spec)
    opener: Callable[[str, float], ViewReader] | None = getattr(module, "open_view", None)
    if opener is not None:
        return opener(spec, timeout)
    return _Rereader(lambda: module.read_view(spec, timeout))


class _Rereader:
    def __init__(self, read: Callable[[], SchedulerView]) -> None:
        self.read = read

    def __call__(self) -> SchedulerView:
        return self.read()

    def close(self) -> None:
        pass
