"""The Prometheus text exposition both servers write: metric specs, families, a rendered page.

The exporter and the advisor each have their own contract of series (`exporter.contract`,
`advisor.contract`); both render through `Families`, which writes the classic text format
(0.0.4) exactly as prometheus_client would, and publish a `Page` that a scrape only copies.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

Kind = Literal["gauge", "counter", "info"]


@dataclass(frozen=True, slots=True)
class MetricSpec:
    name: str  # exposed name, including `_total` / `_info` suffix
    kind: Kind
    help: str
    labels: tuple[str, ...]
    # Leave a label out of a sample whose value for it is "" (dcgm-exporter's own series carry
    # MIG or pod labels only where they apply), instead of writing `label=""` as the library does
    omit_empty: bool = False

    @property
    def family(self) -> str:
        """Name without the type suffix that prometheus_client adds itself."""
        if self.kind == "counter" and self.name.endswith("_total"):
            return self.name[: -len("_total")]
        if self.kind == "info" and self.name.endswith("_info"):
            return self.name[: -len("_info")]
        return self.name


Sample = tuple[tuple[str, ...], float]
TextCache = dict[str, tuple[list[Sample], str]]  # family -> (last samples, their text)


def escape_label(value: str) -> str:
    """A label value as exposition text writes it (backslash, newline and quote escaped)."""
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


def _number(value: float) -> str:
    """prometheus_client's floatToGoString, with a fast path for the common small values."""
    if -1e6 < value < 1e6:
        return repr(value)
    return floatToGoString(value)


class Families:
    """Samples grouped by metric; a family exists only once it has a sample, so absent
    (unsupported, failed) metrics are left out rather than written as zero."""

    def __init__(self, specs: Mapping[str, MetricSpec]) -> None:
        self._specs = specs  # the contract `add` looks names up in
        self._records: dict[str, tuple[MetricSpec, list[Sample]]] = {}

    def add(self, name: str, labels: Iterable[str], value: float | None) -> None:
        if value is not None:
            self.add_spec(self._specs[name], labels, value)

    def add_spec(self, spec: MetricSpec, labels: Iterable[str], value: float) -> None:
        entry = self._records.get(spec.name)
        if entry is None:
            entry = self._records[spec.name] = (spec, [])
        entry[1].append((tuple(labels), float(value)))

    def __iter__(self) -> Iterator[tuple[MetricSpec, list[Sample]]]:
        return iter(self._records.values())

    def text(self, cache: TextCache | None = None) -> str:
        """The classic text exposition format (0.0.4), exactly as prometheus_client writes it.

        With a cache, a family whose samples equal last cycle's reuses last cycle's text:
        topology, identity and most error counters rarely change, and they are most lines.
        """
        out: list[str] = []
        blocks: dict[tuple, str] = {}  # label set -> its rendered text (omit_empty families)
        for spec, samples in self._records.values():
            if cache is not None:
                previous = cache.get(spec.name)
                if previous is not None and previous[0] == samples:
                    out.append(previous[1])
                    continue
            start = len(out)
            kind = "gauge" if spec.kind == "info" else spec.kind
            help_text = spec.help.replace("\\", r"\\").replace("\n", r"\n")
            out.append(f"# HELP {spec.name} {help_text}\n# TYPE {spec.name} {kind}\n")
            if spec.omit_empty:
                out.extend(_sparse_lines(spec, samples, blocks))
            else:
                # The library writes labels sorted by name; one format template per family.
                order = sorted(range(len(spec.labels)), key=spec.labels.__getitem__)
                pairs = ",".join(f'{spec.labels[i]}="{{{i}}}"' for i in order)
                line = (
                    f"{spec.name}{{{{{pairs}}}}} {{value}}\n"
                    if pairs
                    else f"{spec.name} {{value}}\n"
                )
                fmt = line.format
                out.extend(
                    fmt(*map(escape_label, labels), value=_number(value))
                    for labels, value in samples
                )
            if cache is not None:
                chunk = "".join(out[start:])
                del out[start:]
                out.append(chunk)
                cache[spec.name] = (samples, chunk)
        return "".join(out)

    def metric_families(self) -> list[Metric]:
        """The same samples as prometheus_client families (its registry, the bench, tests)."""
        families: list[Metric] = []
        for spec, samples in self._records.values():
            family: Metric
            if spec.kind == "gauge":
                family = GaugeMetricFamily(spec.family, spec.help, labels=list(spec.labels))
            elif spec.kind == "counter":
                family = CounterMetricFamily(spec.family, spec.help, labels=list(spec.labels))
            else:
                family = InfoMetricFamily(spec.family, spec.help, labels=[])
            for labels, value in samples:
                if isinstance(family, InfoMetricFamily):
                    family.add_metric([], dict(zip(spec.labels, labels, strict=True)))
                else:
                    family.add_metric(list(labels), value)
            families.append(family)
        return families


def _sparse_lines(spec: MetricSpec, samples: list[Sample], blocks: dict[tuple, str]) -> list[str]:
    """The samples of an `omit_empty` family: each with its non-empty labels, sorted by name.
    `blocks` keeps each label set's rendered `{...}` for the other families of the same text:
    dcgm-exporter's series of one GPU repeat one label set over every field."""
    out = []
    name = spec.name
    for labels, value in samples:
        key = (spec.labels, labels)
        block = blocks.get(key)
        if block is None:
            pairs = sorted((n, v) for n, v in zip(spec.labels, labels, strict=True) if v)
            block = blocks[key] = ",".join(f'{n}="{escape_label(v)}"' for n, v in pairs)
        out.append(
            f"{name}{{{block}}} {_number(value)}\n" if block else f"{name} {_number(value)}\n"
        )
    return out


@dataclass(frozen=True, slots=True)
class Page:
    """A rendered /metrics page, plain and gzip-compressed, ready to be copied to a socket."""

    body: bytes
    gzipped: bytes


def page_of(families: Families, cache: TextCache | None = None) -> Page:
    """The families as a `Page`: text, and gzip at level 1 (a scrape's CPU matters more)."""
    body = families.text(cache).encode()
    return Page(body=body, gzipped=gzip.compress(body, compresslevel=1))
