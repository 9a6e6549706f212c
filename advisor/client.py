"""A client of the advisor service's API: one run's documents read back as a `View`.

The app uses it in the demo and whenever it is given an advisor URL: it renders what the service
serves, so a page and `/api/*` can never disagree. `AdvisorClient.view()` reads
`/api/fragmentation?nodes=true` first; when the service has published a run since the last view
it reads the other documents and the model (`/api/snapshot`), and retries when a run was
published between its reads (every document of a view carries the same `meta.runs`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import requests
from pydantic import ValidationError

from advisor import documents as D
from advisor import snapshot
from advisor.pipeline.view import HISTORY_HOURS, View
from advisor.snapshot import SnapshotError
from gpu_defrag_common import bounded_get
from gpu_defrag_common.messages import one_line

CAP = 512 * 2**20  # bytes of one answer (a 1,000-node snapshot with its usage is ~30 MB)
ATTEMPTS = 3  # reads of a whole view before a run published between reads is an error

Doc = TypeVar("Doc", bound=D.Document)


class AdvisorUnavailable(Exception):
    """The service cannot give a view now: not reachable, no run yet, or a bad answer; the
    message is one line."""


def base_url(url: str) -> str:
    """`http://host:9836/`, `.../api/` or `.../api` -> `http://host:9836`."""
    url = url.strip().rstrip("/")
    return url.removesuffix("/api")


class AdvisorClient:
    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        self.base = base_url(url)
        self.timeout_s = timeout_s
        self._session = bounded_get.new_session()

    def _get(self, path: str, kind: type[Doc]) -> Doc:
        url = self.base + path
        try:
            answer = bounded_get.get(url, self.timeout_s, cap=CAP, session=self._session)
        except (requests.RequestException, bounded_get.AnswerTooSlow) as error:
            raise AdvisorUnavailable(f"{url}: {one_line(error)}") from None
        except bounded_get.AnswerTooLarge as error:
            raise AdvisorUnavailable(f"{url}: {error}") from None
        if answer.status_code != 200:
            try:
                why = D.Error.model_validate_json(answer.content).error
            except ValidationError:
                why = answer.text.strip()[:200] or answer.reason
            raise AdvisorUnavailable(f"{url}: {answer.status_code} {why}")
        try:
            return kind.model_validate_json(answer.content)
        except ValidationError as error:
            raise AdvisorUnavailable(
                f"{url}: not a {kind.__name__} document: {one_line(error)}"
            ) from None

    def view(self, previous: View | None = None) -> View:
        """The service's latest run as a view; `previous` itself while no run was published
        since it was read. AdvisorUnavailable when there is none to give."""
        for _ in range(ATTEMPTS):
            fragmentation = self._get("/api/fragmentation?nodes=true", D.Fragmentation)
            if previous is not None and _same_run(previous.fragmentation.meta, fragmentation.meta):
                return previous
            reads: dict[str, Callable[[], D.Document]] = {
                "forecast": lambda: self._get("/api/forecast", D.Forecast),
                "recommendations": lambda: self._get("/api/recommendations", D.Recommendations),
                "job_ends": lambda: self._get("/api/job-ends", D.JobEndList),
                "history": lambda: self._get(f"/api/history?hours={HISTORY_HOURS}", D.History),
                "snapshot": lambda: self._get("/api/snapshot", D.SnapshotResponse),
            }
            docs = {name: read() for name, read in reads.items()}
            if all(_same_run(doc.meta, fragmentation.meta) for doc in docs.values()):  # type: ignore[attr-defined]
                snap = docs.pop("snapshot")
                assert isinstance(snap, D.SnapshotResponse)
                try:
                    model = snapshot.from_dict(snap.snapshot)
                except SnapshotError as error:
                    raise AdvisorUnavailable(f"{self.base}/api/snapshot: {error}") from None
                return View(model=model, fragmentation=fragmentation, **docs)  # type: ignore[arg-type]
        raise AdvisorUnavailable(
            f"{self.base}: a new run was published during each of {ATTEMPTS} reads"
        )


def _same_run(a: D.Meta, b: D.Meta) -> bool:
    return (a.runs, a.observed_at, a.stale) == (b.runs, b.observed_at, b.stale)
