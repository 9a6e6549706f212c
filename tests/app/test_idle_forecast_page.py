"""Forecast page, idle windows: the releases shown are the service's for the same history, each
next to its held-back violations and capture; a short history shows reasons, not numbers."""

from __future__ import annotations

from advisor.app import forecasts
from tests.app.conftest import frame_with, open_app, served_json

PAGE = "views/forecast.py"


def test_idle_releases_match_the_service_document_with_their_backtest() -> None:
    source = "sim:a100-16x8?t=6d"
    at = open_app(source, PAGE)
    doc = served_json(source)["forecast"]
    shown = frame_with(at, "free GPUs for the whole window")
    expected = forecasts.idle_frame(doc)
    assert len(shown) == len(expected) == 3  # one pool, windows 1 h, 4 h, 8 h
    assert shown["window"].tolist() == ["1h", "4h", "8h"]
    assert (
        shown["free GPUs for the whole window"].tolist()
        == expected["free GPUs for the whole window"].tolist()
    )
    assert shown["backtest violations"].notna().all() and shown["backtest capture"].notna().all()
    assert (shown["held-back hours"] >= 24).all()
    assert (shown["free GPUs for the whole window"] <= shown["capacity GPUs"]).all()
    assert forecasts.IDLE_LOW in shown.columns  # the last complete hour's low, not "now"
    # the risk is the target the release aims at, the violations beside it what it measured
    (caption,) = [c.value for c in at.caption if c.value.startswith("GPUs of each pool")]
    assert "target risk of 5%" in caption and "at a 5% risk" not in caption
    assert "measured" in caption and "backtest violations" in caption


def test_short_history_names_the_hours_each_window_needs() -> None:
    source = "sim:a100-16x8?t=3d"
    at = open_app(source, PAGE)
    assert any("No idle-window forecast yet" in info.value for info in at.info)
    captions = [c.value for c in at.caption]
    assert any("1h: needs 98 complete hours" in c for c in captions), captions


def test_per_node_table_is_the_service_document_most_releasable_first() -> None:
    source = "sim:a100-16x8?t=6d"
    at = open_app(source, PAGE)
    doc = served_json(source)["forecast"]
    shown = frame_with(at, "free for 1h")
    expected = forecasts.idle_nodes_frame(doc)
    assert len(shown) == len(expected) == doc["idle"]["nodes_total"] == 16
    assert shown["node"].tolist() == expected["node"].tolist()
    assert shown["free for 1h"].tolist() == expected["free for 1h"].tolist()
    by_node = {n["node"]: n for n in doc["idle"]["nodes"]}
    for row in shown.to_dict("records"):
        windows = {w["window"]: w for w in by_node[row["node"]]["windows"]}
        assert row["free for 8h"] == windows["8h"]["release_gpus"]
        assert 0 <= row["free for 8h"] <= row["free for 4h"] <= row["free for 1h"] <= row["GPUs"]
        assert 0 <= row["1h backtest violations"] <= 1
    releases = shown["free for 1h"].tolist()
    assert releases == sorted(releases, reverse=True)  # most releasable first
    captions = [c.value for c in at.caption]
    assert any("The same per node" in c and "of 16 nodes have a release" in c for c in captions)
