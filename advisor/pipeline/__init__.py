"""The advisor pipeline: ingest → cluster model → measures → forecasts → plans, one settings.

`Pipeline` (runner) reads a source into its history and publishes each run's `RunState`;
`stages` are the pure functions of one run; `View` is a published state as the app renders it,
and `queries` the questions the app asks of one (what-if, plans for a goal, a selection
replayed). The service serves a pipeline (`advisor.service`); the app renders one, its own or
the service's (`advisor.app`). This package is the app's only door into the advisor.
"""

from advisor.pipeline.runner import Pipeline, RunState
from advisor.pipeline.view import View
from advisor.settings import Settings

__all__ = ["Pipeline", "RunState", "Settings", "View"]
