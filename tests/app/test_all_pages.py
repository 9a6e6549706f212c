"""Every page on every sim preset (two simulated days in, so trend and forecasts exist): no
exception, no error, and each page's headline equals what the advisor computes for that state."""

from __future__ import annotations

import pytest

from advisor.app import forecasts
from advisor.fragmentation import measures
from advisor.ingest.sources import load_source
from advisor.pipeline import Settings
from advisor.pipeline import queries as Q
from tests.app.conftest import PRESETS, frame_with, metrics, open_app, served_json


@pytest.mark.parametrize("preset", PRESETS)
def test_every_page_agrees_with_the_advisor(preset: str) -> None:
    source = f"{preset}?t=2d"
    model = load_source(source)
    result = measures.analyze(model)

    at = open_app(source)
    assert metrics(at)["Free"] == f"{result['spatial']['free_gpus']:,}"

    at.switch_page("views/fragmentation.py").run()
    assert not at.exception and not at.error
    assert metrics(at)["Fragmentation rate"] == f"{result['fgd']['fragment_rate']:.1%}"
    assert any("49 observations" in c.value for c in at.caption)  # hourly over two days

    at.switch_page("views/forecast.py").run()
    assert not at.exception and not at.error
    docs = served_json(source)
    expected = forecasts.horizons_frame(docs["forecast"])
    shown = frame_with(at, "backtest WAPE")
    assert shown["forecast GPUs"].tolist() == expected["forecast GPUs"].tolist()

    at.switch_page("views/actions.py").run()
    assert not at.exception and not at.error
    goal = Q.next_big_job(model)
    ends = docs["view"].planned_ends()
    mine = Q.plan_goals(model, Settings(), ends, [Q.goal_text(goal)]) if goal else []
    recs = mine + [Q.plan_from_doc(p) for p in docs["recommendations"]["plans"]]
    recs = list({p.goal: p for p in recs}.values())  # the goal's own plan once
    if recs:
        overview = frame_with(at, "GPU-hours held idle")
        assert overview["goal"].tolist() == [p.goal for p in recs]
        assert overview["steps"].tolist() == [len(p.actions) for p in recs]
    else:
        assert any("No recommendation" in i.value for i in at.info)

    at.switch_page("views/whatif.py").run()
    assert not at.exception and not at.error
    width = int(model.nodes.gpu_count.max())
    fits = measures.jobs_that_fit(model, measures.Shape(width, tasks=2))
    if fits:
        assert at.success[0].value.startswith(f"Yes: {fits} job(s)")
    else:
        assert at.warning[0].value.startswith("No:")
