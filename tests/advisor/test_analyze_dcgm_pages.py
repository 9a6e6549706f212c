"""`gpu-defrag analyze` and `snapshot` of dcgm-exporter pages as they come from the field:
unparseable lines, busy GPUs without pod labels, MIG instances busy by engine activity only,
pages without modelName or FB_RESERVED. Pages are served on 127.0.0.1 from the fixtures
(tests/fixtures/dcgm_exporter/README.md says what each holds)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from advisor import snapshot
from advisor.cli import main
from tests.fakes.page_server import Routes, serve

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dcgm_exporter"


@pytest.fixture
def page_url() -> Iterator:
    routes = Routes()
    with serve(routes) as base:

        def url(name: str) -> str:
            return base + routes.text(f"/{name}", (FIXTURES / name).read_text())

        yield url


def analyze_json(url: str, capsys) -> dict:
    assert main(["analyze", url, "--json", "--timeout", "5"]) == 0
    return json.loads(capsys.readouterr().out)


def test_failed_to_convert_lines_cost_nothing_but_a_warning(page_url, capsys, caplog):
    url = page_url("a100_unattributed.prom")
    with caplog.at_level("WARNING", logger="advisor.ingest.exporter_scrape"):
        result = analyze_json(url, capsys)
    assert result["cluster"]["gpus"] == 8
    (warning,) = [r.getMessage() for r in caplog.records if "cannot be parsed" in r.getMessage()]
    assert "8 line(s)" in warning and "FAILED TO CONVERT TO STRING" in warning


def test_busy_gpus_without_pod_labels_are_in_use_owner_unknown(page_url, capsys):
    """GPU 2 at 100 % with 70 GB in use and GPU 5 holding 20 GB: neither is free capacity."""
    url = page_url("a100_unattributed.prom")
    result = analyze_json(url, capsys)
    assert result["cluster"]["owner_unknown_gpus"] == 2
    assert result["spatial"]["free_gpus"] == 6
    assert result["cluster"]["allocated_gpus"] == 2.0
    assert result["temporal"]["allocated_idle_gpus"] == 0  # no owner to call idle
    assert result["spatial"]["largest_job"]["nvlink_group_gpus"] is None  # page has no topology
    assert main(["analyze", url, "--timeout", "5"]) == 0
    table = capsys.readouterr().out
    assert "2 GPUs in use, owner unknown" in table


def test_a_mig_instance_busy_by_engine_activity_is_not_free_capacity(page_url, capsys):
    """Instance 1 of GPU 0: 0.996 engine activity, 38 GB, no pod, no SM_ACTIVE on the page."""
    result = analyze_json(page_url("h100_mig_engine.prom"), capsys)
    assert result["cluster"]["owner_unknown_gpus"] == 1
    mig = next(row for row in result["type"]["capacity"])
    # GPU 1 is free; GPU 0 carves 4g + 3g = 7 slices, the 4g one held by its unknown owner
    assert mig["free_gpus"] == 1
    assert result["spatial"]["free_capacity_gpus"] == pytest.approx(1 + 3 / 7, abs=1e-3)


def test_an_old_page_without_model_and_reserved_memory(page_url, capsys, tmp_path):
    """dcgm-exporter 2.0: the model is unknown (not guessed), memory and node are read, and
    the busy GPU without a pod is in use, owner unknown; the snapshot keeps all of it."""
    url = page_url("v100_dcgm_exporter_2_0.prom")
    result = analyze_json(url, capsys)
    assert result["cluster"]["gpus"] == 4 and result["cluster"]["owner_unknown_gpus"] == 1
    assert [row["gpu_model"] for row in result["type"]["capacity"]] == [""]
    assert result["nodes"][0]["node"] == "127.0.0.1"
    path = tmp_path / "v100.json"
    assert main(["snapshot", url, "-o", str(path), "--timeout", "5"]) == 0
    model = snapshot.load(path)
    assert model.gpus.memory_total_bytes.tolist() == [16160 * 2**20] * 4
    assert model.gpu_owner_unknown.tolist() == [False, True, False, False]
