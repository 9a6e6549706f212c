"""Fragmentation page: headline numbers, shapes, worst nodes and the kinds are the advisor's;
a sim after t=0 has a simulated trend ending on the state shown."""

from __future__ import annotations

import pytest

from advisor.app import data
from advisor.fragmentation import measures
from advisor.ingest.sources import load_source
from tests.app.conftest import PRESETS, frame_with, metrics, open_app

PAGE = "views/fragmentation.py"


@pytest.mark.parametrize("source", PRESETS)
def test_fragmentation_page_matches_the_analysis(source: str) -> None:
    at = open_app(source, PAGE)
    result = measures.analyze(load_source(source))
    shown = metrics(at)
    assert at.title[0].value == "Fragmentation"
    assert shown["Fragmentation rate"] == f"{result['fgd']['fragment_rate']:.1%}"
    assert shown["Fragmented GPUs"] == f"{result['fgd']['fragment_gpus']:,.1f}"
    assert shown["Free GPUs"] == f"{result['spatial']['free_gpus']:,}"
    largest = result["spatial"]["largest_job"]["single_node_gpus"]
    assert shown["Largest job on one node"] == f"{largest} GPUs"
    assert shown["Allocated but idle"] == f"{result['temporal']['allocated_idle_gpus']:,}"
    # every headline says what it counts, with the analysis' own settings
    helps = {m.label: m.help for m in at.metric}
    assert all(helps.values()), helps
    window = f"{result['temporal']['window_s'] / 60:g} min"
    assert window in helps["Allocated but idle"]
    assert f"{result['memory']['min_request_bytes'] / 2**30:g} GiB" in helps["Stranded GPU memory"]

    shapes = frame_with(at, "jobs that can start now")
    assert shapes["shape"].tolist() == [s["shape"] for s in result["spatial"]["shapes"]]
    assert shapes["jobs that can start now"].tolist() == [
        s["jobs_that_fit"] for s in result["spatial"]["shapes"]
    ]
    # t=0: no past to show, and the page says so instead of drawing a flat line
    assert any("no trend" in info.value for info in at.info)


def test_worst_nodes_are_ordered_by_fgd_fragment() -> None:
    source = "sim:a100-16x8"
    at = open_app(source, PAGE)
    result = measures.analyze(load_source(source))
    worst = frame_with(at, "FGD fragment (GPUs)")
    fragments = worst["FGD fragment (GPUs)"].tolist()
    assert fragments == sorted(fragments, reverse=True) and fragments[0] > 0
    nodes = result["nodes"]
    best = max(range(len(nodes["node"])), key=lambda i: nodes["fgd_fragment_gpus"][i])
    assert fragments[0] == pytest.approx(nodes["fgd_fragment_gpus"][best])


def test_type_tab_shows_capacity_per_model() -> None:
    source = "sim:mixed-h100-a100-v100"
    at = open_app(source, PAGE)
    capacity = frame_with(at, "usable_gpus")
    expected = measures.analyze(load_source(source))["type"]["capacity"]
    assert capacity["gpu_model"].tolist() == [row["gpu_model"] for row in expected]
    assert capacity["free_gpus"].tolist() == [row["free_gpus"] for row in expected]


def test_sim_trend_ends_on_the_state_shown() -> None:
    source = "sim:a100-16x8?t=6h"
    at = open_app(source, PAGE)
    shown, _ = data.latest(source)
    trend = data.trend(shown)  # the served history's trend (/api/history)
    assert len(trend) == 7  # hourly from t=0 to t=6h
    last = measures.analyze(load_source(source))
    assert trend["fragment_rate"].iloc[-1] == pytest.approx(last["fgd"]["fragment_rate"])
    assert trend["free_gpus"].iloc[-1] == last["spatial"]["free_gpus"]
    first = measures.analyze(load_source("sim:a100-16x8"))
    assert trend["free_gpus"].iloc[0] == first["spatial"]["free_gpus"]

    assert not any("no trend" in info.value for info in at.info)
    assert any("7 observations" in c.value for c in at.caption)


def test_sim_at_t0_has_no_trend() -> None:
    open_app("sim:a100-16x8", PAGE)
    shown, _ = data.latest("sim:a100-16x8")
    assert len(data.trend(shown)) == 1  # the instant itself, no past


def test_any_shape_can_be_asked() -> None:
    source = "sim:mixed-h100-a100-v100"
    at = open_app(source, PAGE)
    model = load_source(source)
    h100 = next(m for m in set(model.nodes.gpu_model.tolist()) if "H100" in m)
    at.text_input(key="frag_shape").set_value(f"2x4@{h100}").run()
    assert not at.exception
    expected = measures.jobs_that_fit(model, measures.Shape(4, tasks=2, gpu_spec=h100))
    assert metrics(at)[f"Jobs of 2x4 GPU [{h100}] that can start now"] == f"{expected:,}"
    at.text_input(key="frag_shape").set_value("1.5").run()
    assert not at.exception and any("bad shape" in w.value for w in at.warning)
