"""Before/after measures of a plan, the same way for every recommendation kind.

`outcome(model, actions, shapes)` applies the (already checked) actions and returns the
`consolidate.summary` of both models (free GPUs and nodes, jobs of each shape that fit, FGD
fragmentation) plus the `Benefit` that says which shapes became schedulable.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from advisor.fragmentation.measures import DEFAULT_SHAPES, Shape
from advisor.model import ClusterModel
from advisor.planner.actions import Action, Benefit
from advisor.planner.check import apply_plan
from advisor.planner.consolidate import summary

_FRAGMENT_KEYS = ("free_gpus", "free_nodes", "fgd_fragment_gpus", "fgd_fragment_rate")


def shapes_with(extra: Sequence[Shape] = ()) -> list[Shape]:
    """The default shapes plus `extra` ones (no duplicates), in that order."""
    shapes = list(DEFAULT_SHAPES)
    shapes.extend(s for s in extra if s not in shapes)
    return shapes


def outcome(
    model: ClusterModel,
    actions: Sequence[Action],
    shapes: Sequence[Shape] = DEFAULT_SHAPES,
    before: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, Any], Benefit]:
    """(before, after, benefit) of applying `actions` to `model`; `before` may be passed in
    when several plans on one model share it (it must be `summary(model, shapes)`)."""
    before = before if before is not None else summary(model, shapes)
    after = summary(apply_plan(model, actions), shapes) if actions else before
    benefit = Benefit(
        before["jobs_that_fit"],
        after["jobs_that_fit"],
        {k: before[k] for k in _FRAGMENT_KEYS},
        {k: after[k] for k in _FRAGMENT_KEYS},
    )
    return before, after, benefit
