"""A long-lived reader of a scheduler SOURCE (alone or joined with usage sources), for the
advisor service: the scheduler side is read through `schedulers.open_view` (a Kubernetes watch
keeps its view current without re-listing), the usage side anew on every call, and the two are
joined by `combine.build_model` each time. `close()` ends the watch."""

from __future__ import annotations

from advisor.ingest import combine, schedulers
from advisor.ingest.exporter_scrape import SourceUnavailable
from advisor.ingest.sources import DEFAULT_TIMEOUT, SourceError, load_source, prometheus_spec
from advisor.model import ClusterModel


class CombinedReader:
    def __init__(self, spec: str, timeout: float = DEFAULT_TIMEOUT) -> None:
        """SourceError at once for a SOURCE no read could ever take (a second scheduler, a
        bad option); a scheduler that is down now is the first call's error, retried."""
        self.spec = spec.strip()
        self.timeout = timeout
        try:
            scheduler, usage = schedulers.parts_of(self.spec)
            schedulers.check(scheduler)
            if usage and usage[0].startswith("prometheus+"):
                prometheus_spec(usage[0])
            self.view = schedulers.open_view(scheduler, timeout)
        except ValueError as error:
            raise SourceError(str(error)) from None
        self.usage = usage[0] if usage else None

    def __call__(self) -> ClusterModel:
        from advisor.ingest import slurm

        try:
            view = self.view()
        except (slurm.SlurmUnavailable, slurm.SlurmFormatError) as error:
            raise SourceError(f"{self.spec.split('+')[0].rstrip(':')}: {error}") from None
        except (SourceUnavailable, ValueError, OSError) as error:
            raise SourceError(str(error)) from None
        usage = load_source(self.usage, timeout=self.timeout) if self.usage else None
        return combine.build_model(view, usage, source=self.spec)

    def close(self) -> None:
        self.view.close()
