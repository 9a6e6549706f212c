"""Unknown racks stay unknown: what a multi-node shape can do when no source names a rack.

A multi-node job needs its tasks in one rack (one leaf switch). Where no source knows a node's
rack (real exporters set none; a Kubernetes cluster without a rack label), counting that node as
a rack of its own says "0 jobs of 2x8 fit" and calls the free GPUs scattered, a confident
number from a missing fact. Instead every view gets two counts and a cause:

- `jobs_that_fit` (measures): on known racks only, the jobs that surely fit;
- `jobs_if_racks_allow`: as many as would fit if the nodes of unknown rack (of one GPU model)
  shared a rack: the most the missing fact could allow;
- `blocked_cause(...)`: why a shape with enough free GPUs fits nowhere: `rack_unknown` when the
  unknown racks are what decides it, `scattered` when even the most generous rack layout leaves
  no node (or rack) with room for it.

Pure functions over the model; `measures.analyze` and the service call them.
"""

from __future__ import annotations

import numpy as np

from advisor.fragmentation import measures
from advisor.fragmentation.measures import Shape
from advisor.model import MILLI, ClusterModel

RACK_UNKNOWN = "rack_unknown"
SCATTERED = "scattered"
QUOTA = "quota"
CAUSES = (RACK_UNKNOWN, SCATTERED, QUOTA)


def rack_unknown(model: ClusterModel) -> np.ndarray:
    """bool (N): nodes whose rack no source knows."""
    return model.nodes.rack == ""


def shared_rack_groups(model: ClusterModel) -> np.ndarray:
    """int64 (N): rack-and-model groups where the nodes of unknown rack of each GPU model form
    one group (the most generous layout the missing racks could have)."""
    nodes = model.nodes
    if len(nodes) == 0:
        return np.zeros(0, dtype=np.int64)
    racks = np.where(nodes.rack == "", "\0unknown", nodes.rack.astype(str))
    models = nodes.gpu_model.astype(str)
    keys = np.char.add(np.char.add(racks, "\0"), models)
    return np.unique(keys, return_inverse=True)[1].reshape(len(nodes)).astype(np.int64)


def jobs_if_racks_allow(model: ClusterModel, shape: Shape, parts: np.ndarray | None = None):
    """`measures.jobs_that_fit` (or, with `parts`, `jobs_that_fit_by_part`) as if the nodes of
    unknown rack shared one rack per GPU model."""
    groups = shared_rack_groups(model)
    if parts is None:
        return measures.jobs_that_fit(model, shape, groups)
    return measures.jobs_that_fit_by_part(model, shape, parts, groups)


def depends_on_racks(shape: Shape, known: int, generous: int) -> bool:
    """Whether the unknown racks decide the count: a multi-node shape whose count rises when
    the unknown racks are assumed shared."""
    return shape.tasks > 1 and generous > known


def blocked_cause(shape: Shape, known: int, generous: int, free_gpus: float) -> str | None:
    """Why no job of `shape` can start although `free_gpus` (whole, in one scheduling domain)
    are enough for one: None when one can start or too few GPUs are free."""
    if known > 0 or shape.gpu_milli < MILLI or free_gpus < shape.gpus:
        return None
    return RACK_UNKNOWN if depends_on_racks(shape, known, generous) else SCATTERED


def rack_summary(model: ClusterModel) -> dict[str, object]:
    """Nodes of unknown rack, and where the known racks came from (the scheduler's facts)."""
    unknown = rack_unknown(model)
    facts = model.scheduler
    origin = facts.rack_from if facts is not None else ""
    if not origin and (~unknown).any():
        origin = "the source's node labels"
    return {
        "nodes_rack_unknown": int(unknown.sum()),
        "racks_from": origin or None,
    }
