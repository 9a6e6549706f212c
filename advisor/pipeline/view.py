"""One published state of the advisor as the app renders it: the model and the documents.

A `View` holds the same documents whichever way the app got them: from the service's API
(`advisor.client`) in the demo and whenever an advisor URL is given, or from an in-process
`Pipeline` (`View.of`) standalone on a source. Every page reads one view, so the numbers of
every page are those of one run, and those the API serves for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from advisor import documents as D
from advisor.model import ClusterModel
from advisor.pipeline.runner import RunState

HISTORY_HOURS = 16 * 24  # the history a view carries: what the idle windows read


@dataclass(frozen=True)
class View:
    model: ClusterModel  # the run's model, its usage window included
    fragmentation: D.Fragmentation  # with the per-node table
    forecast: D.Forecast
    recommendations: D.Recommendations
    job_ends: D.JobEndList  # every running job, unfiltered
    history: D.History

    @staticmethod
    def of(state: RunState, hours: int = HISTORY_HOURS) -> View:
        """The view of a pipeline's state (it must have results)."""
        assert state.results is not None
        return View(
            model=state.results.model,
            fragmentation=D.build_fragmentation(state, nodes=True),
            forecast=D.build_forecast(state),
            recommendations=D.build_recommendations(state),
            job_ends=D.build_job_ends(state),
            history=D.build_history(state, hours),
        )

    @property
    def meta(self) -> D.Meta:
        return self.fragmentation.meta

    @property
    def version(self) -> tuple[int, float | None, bool]:
        """What changes with every published run: the run count, the model's time, staleness."""
        meta = self.meta
        return meta.runs, meta.observed_at, meta.stale

    def planned_ends(self) -> dict[str, float]:
        """The running jobs' ends the plan stage planned on ({allocation id: end})."""
        return self.job_ends.planned_ends()
