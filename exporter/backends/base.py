"""The one interface every collection backend implements (node_exporter's collector shape)."""

from __future__ import annotations

import abc
import argparse

from exporter.readings import Collection


class BackendUnavailable(Exception):
    """The backend cannot collect at all right now (library missing, init failed, target down).

    The message is one line a person can act on. The collector loop shows it as
    `gpu_exporter_backend_up 0`, logs it, retries with backoff, and keeps serving.
    """


class Backend(abc.ABC):
    """Collects one `Collection` per cycle. Runs only in the collector thread, never on a scrape."""

    name: str = "base"

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Add this backend's own `--<name>.*` flags. Default: none."""

    @classmethod
    @abc.abstractmethod
    def from_args(cls, args: argparse.Namespace) -> Backend:
        """Build the backend from parsed flags; raise ValueError with one line on bad flags."""

    def start(self) -> None:
        """Initialise (e.g. nvmlInit). Raise BackendUnavailable if it cannot; it will be retried."""

    @abc.abstractmethod
    def collect(self) -> Collection:
        """One full cycle. Per-GPU or per-call failures go into `Collection.errors` and leave
        the affected values as None; only a total failure raises BackendUnavailable."""

    def close(self) -> None:
        """Release resources (e.g. nvmlShutdown). Must be safe to call twice."""
