"""The app on a `k8s:` source (the fake API server) says where racks are unknown and what the
scheduler noted, and its shape table gives the rack-unknown count and cause."""

from __future__ import annotations

from pathlib import Path

from advisor import snapshot
from advisor.app import data
from advisor.ingest.kubernetes.manifests import objects_from_model
from advisor.ingest.live import make_ingest
from tests.app.conftest import frame_with, open_app

EXAMPLES = Path(__file__).parents[2] / "examples"


def test_fragmentation_page_says_rack_unknown(kube):
    seed = snapshot.load(EXAMPLES / "seed-16x8-a100.json")
    objects = objects_from_model(seed, rack_label="example.com/not-read")
    kube(objects)
    at = open_app("k8s:", "views/fragmentation.py")
    infos = [i.value for i in at.info]
    assert any("Rack unknown for all nodes" in line for line in infos), infos
    assert any("no GPU node has a rack label" in line for line in infos), infos
    shapes = frame_with(at, "why none can start").set_index("shape")
    assert shapes.loc["2x8 GPU", "why none can start"] == "rack unknown"
    assert shapes.loc["2x8 GPU", "if the unknown racks allow"] == 2
    assert shapes.loc["8 GPU", "why none can start"] == ""


def test_known_racks_say_nothing(kube):
    seed = snapshot.load(EXAMPLES / "seed-16x8-a100.json")
    kube(objects_from_model(seed))
    assert data.scheduler_lines(make_ingest("k8s:", 5.0)()) == []
