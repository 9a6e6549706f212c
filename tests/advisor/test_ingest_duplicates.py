"""A series (name and label set) given twice on one scraped page: copies with different values
read it as unknown with one warning naming the URL, the series and the values, the same for
analyze, snapshot and the source loader; identical copies are harmless; the rest of the page is
read (advisor.ingest.exporter_scrape.drop_duplicates)."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

from advisor import snapshot
from advisor.cli import main
from advisor.ingest import exporter_scrape
from advisor.ingest.sources import load_source
from tests.advisor.test_ingest import our_page, same_state
from tests.fakes.page_server import Routes, serve

DCGM_PAGE = Path(__file__).parent.parent / "fixtures" / "dcgm_exporter" / "a100_k8s.prom"
UTIL0 = 'gpu_utilization_ratio{gpu="0",node="n1"}'


def _page(*extra: str) -> str:
    """Two GPUs on node n1, GPU 0 with utilization 0.5 and 300 W, then the `extra` lines."""
    lines = [f'gpu_info{{gpu="{i}",node="n1",uuid="GPU-{i}",model="A100"}} 1' for i in (0, 1)]
    lines += [f"{UTIL0} 0.5", 'gpu_power_watts{gpu="0",node="n1"} 300', *extra]
    return "\n".join(lines) + "\n"


def _notes(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == exporter_scrape.__name__ and r.levelno >= logging.WARNING
    ]


def test_a_series_given_twice_with_two_values_is_unknown_for_analyze_and_snapshot_alike(
    tmp_path, caplog
):
    routes = Routes()
    routes.text("/metrics", _page(f"{UTIL0} 0.9"))
    out = tmp_path / "s.json"
    with caplog.at_level(logging.WARNING), serve(routes) as base:
        url = f"{base}/metrics"
        assert main(["analyze", url, "--json", "--timeout", "2"]) == 0
        assert main(["snapshot", url, "-o", str(out), "--timeout", "2"]) == 0
        model = load_source(url, timeout=2)
    gpu = json.loads(out.read_text())["nodes"][0]["gpus"][0]
    assert gpu["utilization_ratio"] is None  # neither 0.5 nor 0.9
    assert gpu["power_watts"] == 300 and gpu["uuid"] == "GPU-0"  # the rest of the page is read
    assert math.isnan(model.gpus.utilization_ratio[0]) and len(model.gpus) == 2
    snapshot.load(out)  # what was written loads back
    notes = _notes(caplog)
    assert len(notes) == 3  # one per read: analyze, snapshot, load_source
    assert notes[0] == (
        f"{url}: 1 series given more than once with different values, read as unknown: "
        f"{UTIL0} (0.5, 0.9)"
    )


def test_identical_copies_of_a_series_are_harmless(caplog):
    plain = _page()
    doubled = _page(
        f"{UTIL0} 0.5",  # the same value again
        'gpu_info{gpu="1",node="n1",uuid="GPU-1",model="A100"} 0',  # info: labels are the reading
        'gpu_memory_used_bytes{gpu="1",node="n1"} NaN',
        'gpu_memory_used_bytes{gpu="1",node="n1"} NaN',  # "no value" twice agrees
    )
    routes = Routes()
    routes.text("/plain", plain)
    routes.text("/doubled", doubled)
    with caplog.at_level(logging.WARNING), serve(routes) as base:
        want = load_source(f"{base}/plain", timeout=2)
        got = load_source(f"{base}/doubled", timeout=2)
    assert same_state(got, want)
    assert got.gpus.utilization_ratio[0] == 0.5 and got.gpus.uuid.tolist() == ["GPU-0", "GPU-1"]
    assert _notes(caplog) == []


def test_our_full_page_with_a_clash_keeps_everything_else(caplog):
    text, readings = our_page(1)
    line = next(x for x in text.splitlines() if x.startswith("gpu_utilization_ratio{"))
    series = line.rsplit(" ", 1)[0]
    routes = Routes()
    routes.text("/metrics", text + f"{series} 0.125\n{line}\n")  # three copies, two values
    with caplog.at_level(logging.WARNING), serve(routes) as base:
        model = load_source(f"{base}/metrics", timeout=2)
        want = load_source(f"{base}/metrics", timeout=2)  # no state kept between reads
    row = model.gpu_row(0, int(series.split('gpu="')[1].split('"')[0]))
    assert math.isnan(model.gpus.utilization_ratio[row])
    assert len(model.gpus) == len(readings[0].gpus)
    assert model.allocations.id.tolist() == want.allocations.id.tolist() != []
    notes = _notes(caplog)
    assert len(notes) == 2 and f"{series} (" in notes[0] and "0.125" in notes[0]


def test_a_dcgm_page_with_a_series_given_twice(caplog):
    text = DCGM_PAGE.read_text()
    line = next(x for x in text.splitlines() if x.startswith('DCGM_FI_DEV_GPU_UTIL{gpu="0"'))
    routes = Routes()
    routes.text("/plain", text)
    routes.text("/same", text + line + "\n")
    routes.text("/clash", text + line.rsplit(" ", 1)[0] + " 7\n")
    with caplog.at_level(logging.WARNING), serve(routes) as base:
        plain = load_source(f"{base}/plain", timeout=2)
        same = load_source(f"{base}/same", timeout=2)
        assert _notes(caplog) == []
        clash = load_source(f"{base}/clash", timeout=2)
    assert not math.isnan(plain.gpus.utilization_ratio[0])
    assert same_state(same, plain)
    assert math.isnan(clash.gpus.utilization_ratio[0]) and len(clash.gpus) == 8
    assert clash.gpus.utilization_ratio[1:].tolist() == plain.gpus.utilization_ratio[1:].tolist()
    (note,) = _notes(caplog)
    assert (
        note.startswith(f"{base}/clash: 1 series given more than once")
        and "DCGM_FI_DEV_GPU_UTIL{" in note
    )


def test_parse_names_the_first_few_clashes_in_one_line_and_keeps_the_order(caplog):
    clashes = [f'gpu_power_watts{{gpu="{i}",node="n\\"1"}} {v}' for i in range(5) for v in (1, 2)]
    text = "\n".join(['gpu_info{gpu="0",node="n1"} 1', *clashes, 'gpu_lost{gpu="0",node="n1"} 0'])
    with caplog.at_level(logging.WARNING):
        samples = exporter_scrape.parse(text + "\n", "http://x/metrics")
    assert [name for name, _, _ in samples] == ["gpu_info", "gpu_lost"]
    (note,) = _notes(caplog)
    assert note.startswith("http://x/metrics: 5 series given more than once with different")
    assert note.endswith('gpu_power_watts{gpu="2",node="n\\"1"} (1, 2); ...')  # as written


def test_a_clashing_sim_clock_is_no_clock():
    page = (
        'gpu_sim_info{preset="a100-16x8",seed="1",nodes="2"} 1\n'
        "gpu_sim_time_seconds 60\n"
        "gpu_sim_epoch_timestamp_seconds 1.7e9\n"
    )
    samples = exporter_scrape.parse(page, "http://x/metrics")
    assert exporter_scrape.sim_clock(samples) is not None
    clash = exporter_scrape.parse(page + "gpu_sim_time_seconds 120\n", "http://x/metrics")
    assert exporter_scrape.sim_clock(clash) is None  # neither time: the scrape stamps its own
