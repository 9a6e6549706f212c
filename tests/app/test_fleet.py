"""Fleet page: counts match the advisor's analysis, the heatmap holds every GPU in its state,
NVLink islands and filters work, for every sim preset."""

from __future__ import annotations

import numpy as np
import pytest

from advisor.app import data, figures
from advisor.contract import GPU_STATE_CODES
from advisor.fragmentation import measures
from advisor.ingest.sources import load_source
from tests.app.conftest import PRESETS, metrics, open_app
from tests.conftest import add_nodes


@pytest.mark.parametrize("source", PRESETS)
def test_fleet_page_matches_the_analysis(source: str) -> None:
    at = open_app(source)
    result = measures.analyze(load_source(source))
    shown = metrics(at)
    assert at.title[0].value == "Fleet"
    assert shown["GPUs"] == f"{result['cluster']['gpus']:,}"
    assert shown["Free"] == f"{result['spatial']['free_gpus']:,}"
    assert shown["Allocated, idle"] == f"{result['temporal']['allocated_idle_gpus']:,}"
    busy = result["temporal"]["allocated_gpus"] - result["temporal"]["allocated_idle_gpus"]
    assert shown["Allocated, busy"] == f"{busy:,}"
    assert shown["Unhealthy / unavailable"] == f"{result['cluster']['unhealthy_gpus']:,}"
    assert not at.error


def test_state_codes_follow_the_contract() -> None:
    model = load_source("sim:mixed-h100-a100-v100")
    idle = measures.allocated_idle(model)
    codes = measures.gpu_state_codes(model, idle)
    allocated = model.gpu_milli_allocated > 0
    assert np.array_equal(codes == GPU_STATE_CODES["free"], model.gpu_is_free)
    # the preset's MIG node: its GPUs with no instance in use are room for MIG work only
    mig_free = ~allocated & model.gpus.mig_enabled & model.gpu_usable
    assert mig_free.any()
    assert np.array_equal(codes == GPU_STATE_CODES["mig_free"], mig_free)
    assert np.array_equal(codes == GPU_STATE_CODES["allocated_idle"], allocated & idle)
    assert np.array_equal(codes == GPU_STATE_CODES["busy"], allocated & ~idle & model.gpus.healthy)


def test_unhealthy_and_cordoned_gpus_are_not_free() -> None:

    unhealthy = ("a", 1)
    builder = add_nodes(
        ["a"],
        2,
        pool="p",
        gpu_model="A100",
        utilization_ratio=0.5,
        healthy=lambda node, i: (node, i) != unhealthy,
    )
    add_nodes(
        ["b"],
        2,
        builder=builder,
        pool="p",
        gpu_model="A100",
        schedulable=False,
        utilization_ratio=0.5,
    )
    builder.add_allocation("job", num_gpu=1, node="b", gpus=[0], tenant="t")
    model = builder.build(timestamp=1.0)
    codes = measures.gpu_state_codes(model, measures.allocated_idle(model)).tolist()
    # a/0 free, a/1 unhealthy, b/0 allocated and busy (cordoning does not evict), b/1 cordoned
    assert codes == [0, 3, 1, 3]


def test_heatmap_cells_are_the_gpus_in_group_order() -> None:
    model = load_source("sim:mixed-h100-a100-v100")
    frame = data.gpu_frame(model, measures.gpu_state_codes(model, measures.allocated_idle(model)))
    fig = figures.fleet_heatmap(frame)
    heat = fig.data[0]
    z = np.asarray(heat.z, dtype=float)
    assert np.count_nonzero(~np.isnan(z)) == len(model.gpus)
    grid = figures.grid_of(frame)
    # rows grouped: pools never interleave
    pools = [frame.loc[frame["node"] == node, "pool"].iloc[0] for node in grid.nodes]
    assert pools == sorted(pools)
    row, col = 3, 5
    cell = frame.iloc[grid.cell[row, col]]
    assert z[row, col] == cell["state_code"]
    assert cell["node"] in heat.text[row][col] and f"GPU {col}" in heat.text[row][col]
    assert f"job: {cell['jobs'] or '-'}" in heat.text[row][col]


def test_nvlink_islands_are_drawn_only_where_a_node_has_several() -> None:
    def island_traces(source: str) -> list:
        model = load_source(source)
        fig = figures.fleet_heatmap(
            data.gpu_frame(model, measures.gpu_state_codes(model, measures.allocated_idle(model)))
        )
        return [t for t in fig.data if t.name == "NVLink island boundary"]

    split = island_traces("sim:nvlink-islands")
    assert len(split) == 1
    xs = [x for x in split[0].x if x is not None]
    assert set(xs) == {3.5}  # two 4-GPU islands per node: boundary between GPU 3 and 4
    assert island_traces("sim:a100-16x8") == []  # NVSwitch: one island per node


def test_utilization_colouring_uses_the_readings() -> None:
    model = load_source("sim:a100-16x8")
    frame = data.gpu_frame(model, measures.gpu_state_codes(model, measures.allocated_idle(model)))
    z = np.asarray(figures.fleet_heatmap(frame, "utilization").data[0].z, dtype=float)
    grid = figures.grid_of(frame)
    expected = frame["utilization"].to_numpy()[grid.cell]
    assert np.allclose(z, expected, equal_nan=True)


def test_filters_narrow_the_heatmap() -> None:
    at = open_app("sim:mixed-h100-a100-v100")
    model = load_source("sim:mixed-h100-a100-v100")
    pool = sorted(set(model.nodes.pool.tolist()))[0]
    at.multiselect(key="fleet_pools").set_value([pool]).run()
    assert not at.exception
    caption = " ".join(c.value for c in at.caption)
    assert f"{int((model.nodes.pool == pool).sum())} nodes shown" in caption
    # the metric row counts the GPUs the filters select, not the whole fleet
    frame = data.gpu_frame(model, measures.gpu_state_codes(model, measures.allocated_idle(model)))
    selected = data.filter_frame(frame, pools=[pool])
    counts = data.state_counts(selected)
    shown = metrics(at)
    assert shown["GPUs shown"] == f"{len(selected):,}" and len(selected) < len(frame)
    assert shown["Free"] == f"{counts['free']:,}"
    assert shown["Allocated, busy"] == f"{counts['busy']:,}"

    tenant = data.tenants_of(frame)[0]
    kept = data.filter_frame(frame, tenants=[tenant])
    holds = kept["tenants"].str.split(", ").map(lambda names: tenant in names)
    assert holds.any()
    assert set(kept["node"]) == set(kept.loc[holds, "node"])  # whole nodes of the tenant
    assert data.filter_frame(frame, pools=["no-such-pool"]).empty


def test_fleet_of_1000_nodes_renders() -> None:
    at = open_app("sim:a100-16x8?nodes=1000")
    assert metrics(at)["GPUs"] == "8,000"
    model = load_source("sim:a100-16x8?nodes=1000")
    fig = figures.fleet_heatmap(
        data.gpu_frame(model, measures.gpu_state_codes(model, measures.allocated_idle(model)))
    )
    assert len(fig.data) <= 3  # a handful of traces whatever the fleet size
    assert fig.layout.height <= 2200


def test_racks_in_natural_order_and_large_fleets_keep_cells_visible() -> None:
    model = load_source("sim:a100-16x8?nodes=200")
    frame = data.gpu_frame(model, measures.gpu_state_codes(model, measures.allocated_idle(model)))
    grid = figures.grid_of(frame)
    racks = [g.rsplit(" · ", 1)[-1] for g in grid.groups]
    numbers = [int(r.split("-")[-1]) for r in dict.fromkeys(racks)]
    assert numbers == sorted(numbers)  # rack-9 before rack-10
    fig = figures.fleet_heatmap(frame)
    separators = [t for t in fig.data if t.type == "scatter" and t.name != "NVLink island boundary"]
    assert separators == []  # one pool, one model: no line across 200 rows of cells
    assert list(fig.layout.yaxis.range) == [len(grid.nodes) - 0.5, -0.5]


def test_node_fragmentation_colouring_is_the_analysis_score() -> None:
    at = open_app("sim:a100-16x8")
    at.radio(key="fleet_color").set_value("node_score").run()
    assert not at.exception
    model = load_source("sim:a100-16x8")
    result = measures.analyze(model)
    shown, _ = data.latest("sim:a100-16x8", wait_s=60.0)
    frame = data.fleet_frame(shown)
    z = np.asarray(figures.fleet_heatmap(frame, "node_score").data[0].z, dtype=float)
    grid = figures.grid_of(frame)
    nodes = result["nodes"]
    score = dict(zip(nodes["node"].tolist(), nodes["score"].tolist(), strict=True))
    for row, node in enumerate(grid.nodes):
        assert np.allclose(z[row], score[node])  # one value across the node's GPUs
    assert z.max() > 0


def test_gpus_in_use_with_no_owner_known_are_their_own_state_never_free() -> None:
    """A dcgm-exporter page without pod labels: GPU 2 at 100 % with 70 GB in use and GPU 5
    holding 20 GB are shown as in use, owner unknown, and counted apart from the free GPUs."""
    from pathlib import Path

    from tests.fakes.page_server import Routes, serve

    page = Path(__file__).resolve().parents[1] / "fixtures" / "dcgm_exporter"
    routes = Routes()
    with serve(routes) as base:
        url = base + routes.text("/metrics", (page / "a100_unattributed.prom").read_text())
        model = load_source(url)
        at = open_app(url)
    codes = measures.gpu_state_codes(model, measures.allocated_idle(model))
    unknown = codes == GPU_STATE_CODES["owner_unknown"]
    assert np.flatnonzero(unknown).tolist() == [2, 5]
    assert not (unknown & model.gpu_is_free).any()
    shown = metrics(at)
    assert shown["In use, owner unknown"] == "2" and shown["Free"] == "6"
