"""examples/k8s/ is what examples/make_k8s_examples.py writes, and reads back through `k8s:`."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from advisor import scheduler_report
from advisor.ingest.sources import load_source
from tests.fakes.kube_apiserver import load_objects

EXAMPLES = Path(__file__).parents[2] / "examples"


def test_committed_objects_are_what_the_script_writes(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("make_k8s", EXAMPLES / "make_k8s_examples.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(tmp_path)
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == sorted(p.name for p in (EXAMPLES / "k8s").iterdir())
    for name in written:
        assert json.loads((tmp_path / name).read_text()) == json.loads(
            (EXAMPLES / "k8s" / name).read_text()
        ), f"examples/k8s/{name} is stale: run examples/make_k8s_examples.py"


def test_the_16x8_example_has_its_gang_waiting(kube):
    kube(load_objects(EXAMPLES / "k8s" / "seed-16x8-a100.json"))
    model = load_source("k8s:")
    (job,) = scheduler_report.pending_jobs(model)
    assert (job["job"], job["shape"], job["priority"]) == ("rnd/pretrain", "8x8", 500)
