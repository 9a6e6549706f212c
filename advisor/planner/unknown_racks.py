"""A multi-node goal on nodes of unknown rack: say so, never "infeasible (proved)".

Under rack locality a multi-node job needs its tasks in one rack. Nodes whose rack no source
knows are each a rack of their own to the planner (it never guesses two nodes share a rack), so
a goal may find no plan there. That is not a proof that none exists: the missing rack decides
it. `rack_unknown_reason` gives the reason a plan states instead, and the solvers skip their
"proved" claim for it (`extra["rack_unknown"]`).
"""

from __future__ import annotations

import numpy as np

from advisor.fragmentation import measures
from advisor.model import ClusterModel
from advisor.planner.constraints import Policy


def rack_unknown_reason(
    model: ClusterModel, shapes: list[tuple[int, str]], policy: Policy | None
) -> str:
    """Why a plan for multi-node jobs of (tasks, GPU spec) `shapes` that found nothing on known
    racks cannot be called impossible; "" when racks do not decide it (no multi-node job, no
    rack locality, or every candidate node's rack known)."""
    if policy is not None and not policy.rack_locality:
        return ""
    multi = [(tasks, spec) for tasks, spec in shapes if tasks > 1]
    if not multi:
        return ""
    candidates = np.zeros(len(model.nodes), dtype=bool)
    for _, spec in multi:
        candidates |= model.nodes.schedulable & measures._spec_mask(model, spec)
    unknown = int((candidates & (model.nodes.rack == "")).sum())
    if not unknown:
        return ""
    return (
        f"rack unknown: {unknown} candidate node(s) have no known rack, so whether their GPUs "
        "can hold a multi-node job in one rack is unknown (give the rack label, e.g. "
        "k8s:?rack-label=KEY, or plan without racks: rack_locality: false in the policy)"
    )
