"""The seed cases of examples/ as the objects a live cluster would serve."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from advisor import snapshot
from advisor.ingest.kubernetes.manifests import objects_from_model, waiting_gang, with_objects
from advisor.model import ClusterModel

EXAMPLES = Path(__file__).parents[2] / "examples"


def seed_16x8(**kwargs: Any) -> tuple[ClusterModel, dict[str, list[dict[str, Any]]]]:
    """The 16 x 8 A100 seed case and its objects (`objects_from_model` keywords), plus the job
    it is about: `rnd/pretrain`, an 8 x 8 gang of priority 500 waiting in the queue."""
    seed = snapshot.load(EXAMPLES / "seed-16x8-a100.json")
    gang = waiting_gang("rnd", "pretrain", 8, 8, 500, len(seed.nodes))
    return seed, with_objects(objects_from_model(seed, **kwargs), gang)
