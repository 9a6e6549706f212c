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
from tests.advisor.test_bad_input import read_three_ways
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
        model = read_three_ways(url, out)
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


# --------------------------------------------------------------------------- memory above total

TOTAL = 85899345920  # 80 GiB
OVER = 2 * TOTAL  # more in use than the GPU holds: a broken exporter, not a reading


def _memory_page(used: float) -> str:
    return _page(
        f'gpu_memory_total_bytes{{gpu="0",node="n1"}} {TOTAL}',
        f'gpu_memory_used_bytes{{gpu="0",node="n1"}} {used:.0f}',
        f'gpu_memory_total_bytes{{gpu="1",node="n1"}} {TOTAL}',
        f'gpu_memory_used_bytes{{gpu="1",node="n1"}} {TOTAL}',  # full: possible
    )


def test_memory_used_above_total_is_unknown_for_analyze_snapshot_and_prometheus(tmp_path, caplog):
    from tests.advisor.test_ingest import _series, prometheus_api

    routes = Routes()
    routes.text("/metrics", _memory_page(OVER))
    routes.update(prometheus_api(_series(_memory_page(OVER), {"instance": "n1:9400"}), {}))
    out = tmp_path / "s.json"
    with caplog.at_level(logging.WARNING), serve(routes) as base:
        url = f"{base}/metrics"
        model = read_three_ways(url, out)
        prom = load_source(f"prometheus+{base}?at=1.7e9&history=0", timeout=2)
    gpus = json.loads(out.read_text())["nodes"][0]["gpus"]
    assert gpus[0]["memory_used_bytes"] is None and gpus[0]["memory_total_bytes"] == TOTAL
    assert gpus[1]["memory_used_bytes"] == gpus[1]["memory_total_bytes"] == TOTAL
    snapshot.load(out)  # what our own `snapshot` wrote loads back
    for read in (model, prom):
        assert math.isnan(read.gpus.memory_used_bytes[0])
        assert read.gpus.memory_total_bytes.tolist() == [TOTAL, TOTAL]
        assert read.gpus.memory_used_bytes[1] == TOTAL and read.gpus.utilization_ratio[0] == 0.5
    notes = _notes(caplog)
    assert len(notes) == 4  # one per read: analyze, snapshot, load_source, Prometheus
    assert set(notes) == {
        "1 impossible value(s) in the GPU series read as unknown: "
        f"n1/gpu0 memory_used_bytes={OVER} > memory_total_bytes={TOTAL}"
    }


def test_memory_parts_and_mig_memory_above_their_totals_are_unknown(caplog):
    gpu = '{gpu="0",node="n1"}'
    mig = '{gpu="0",node="n1",gpu_instance_id="%d"}'
    page = _page(
        f"gpu_memory_total_bytes{gpu} 1000",
        f"gpu_memory_free_bytes{gpu} 1001",
        f"gpu_memory_reserved_bytes{gpu} 2000",
        f"gpu_memory_used_bytes{gpu} 1000",  # equal: possible
        f"gpu_mig_memory_total_bytes{mig % 1} 1500",  # larger than its GPU
        f"gpu_mig_memory_used_bytes{mig % 1} 10",
        f"gpu_mig_memory_total_bytes{mig % 2} 500",
        f"gpu_mig_memory_used_bytes{mig % 2} 501",  # larger than its instance
        f"gpu_mig_memory_total_bytes{mig % 3} 500",
        f"gpu_mig_memory_used_bytes{mig % 3} 500",
    )
    with caplog.at_level(logging.WARNING):
        (node,) = exporter_scrape.our_readings(exporter_scrape.parse(page, "http://x/metrics"))
    reading = node.gpus[0]
    assert reading.memory_total_bytes == reading.memory_used_bytes == 1000
    assert reading.memory_free_bytes is None and reading.memory_reserved_bytes is None
    instances = {m.gpu_instance_id: m for m in reading.mig_instances}
    assert (instances[1].memory_total_bytes, instances[1].memory_used_bytes) == (None, 10)
    assert (instances[2].memory_total_bytes, instances[2].memory_used_bytes) == (500, None)
    assert (instances[3].memory_total_bytes, instances[3].memory_used_bytes) == (500, 500)
    (note,) = _notes(caplog)
    assert note == (
        "4 impossible value(s) in the GPU series read as unknown: "
        "n1/gpu0 memory_free_bytes=1001 > memory_total_bytes=1000; "
        "n1/gpu0 memory_reserved_bytes=2000 > memory_total_bytes=1000; "
        "n1/gpu0/gi1 memory_total_bytes=1500 > the GPU's memory_total_bytes=1000; ..."
    )


# --------------------------------------------------------------------------- one GPU, two URLs


def test_the_same_url_listed_twice_is_read_once(caplog):
    text, _ = our_page(1)
    hits = []
    routes = Routes()
    routes.text("/plain", text)
    routes["/metrics"] = lambda _query: (hits.append(1), 200, "text/plain", text)[1:]
    with caplog.at_level(logging.WARNING), serve(routes) as base:
        want = load_source(f"{base}/plain", timeout=2)
        hits.clear()
        got = load_source(f"{base}/metrics,{base}/metrics", timeout=2)
    assert len(hits) == 1
    assert same_state(got, want)  # not each allocation counted twice
    assert _notes(caplog) == []


def _gpus_page(node: str, util: float, *indices: int) -> str:
    lines = [f'gpu_info{{gpu="{i}",node="{node}",uuid="{node}-{i}"}} 1' for i in indices]
    lines += [f'gpu_utilization_ratio{{gpu="{i}",node="{node}"}} {util}' for i in indices]
    return "\n".join(lines) + "\n"


def test_a_gpu_two_urls_report_is_read_from_the_first_listed_with_one_warning(caplog):
    routes = Routes()
    routes.text("/a", _gpus_page("n1", 0.5, 0, 1))
    routes.text("/b", _gpus_page("n1", 0.9, 1, 2) + _gpus_page("n2", 0.9, 0))
    with caplog.at_level(logging.WARNING), serve(routes) as base:
        a, b = f"{base}/a", f"{base}/b"
        first = load_source(f"{a},{b}", timeout=2)
        second = load_source(f"{b},{a}", timeout=2)
    names = first.nodes.name[first.gpus.node].tolist()
    assert list(zip(names, first.gpus.index.tolist(), strict=True)) == [
        ("n1", 0),
        ("n1", 1),
        ("n1", 2),
        ("n2", 0),
    ]
    assert first.gpus.utilization_ratio.tolist() == [0.5, 0.5, 0.9, 0.9]  # n1/gpu1 from /a
    assert second.gpus.utilization_ratio.tolist() == [0.5, 0.9, 0.9, 0.9]  # n1/gpu1 from /b
    assert _notes(caplog) == [
        "1 GPU(s) reported by more than one URL, each read from the first URL listed that "
        f"reports it: n1/gpu1 from {a} (also reported by {b})",
        "1 GPU(s) reported by more than one URL, each read from the first URL listed that "
        f"reports it: n1/gpu1 from {b} (also reported by {a})",
    ]


def test_our_exporter_and_dcgm_exporter_on_one_node_keep_the_first_listed(tmp_path, caplog):
    from exporter.readings import Collection
    from exporter.render import render_page
    from tests.advisor.test_ingest import STATE
    from tests.exporter import readings_factory

    node = readings_factory.node("dgx-a100-07")  # the node DCGM_PAGE's Hostname names
    routes = Routes()
    routes.text("/ours", render_page(Collection([node], 1.7e9), [], STATE).body.decode())
    routes.text("/dcgm", DCGM_PAGE.read_text())
    out = tmp_path / "s.json"
    with caplog.at_level(logging.WARNING), serve(routes) as base:
        ours, dcgm = f"{base}/ours", f"{base}/dcgm"
        alone = load_source(ours, timeout=2)
        both = load_source(f"{ours},{dcgm}", timeout=2)
        flipped = load_source(f"{dcgm},{ours}", timeout=2)
        dcgm_alone = load_source(dcgm, timeout=2)
        assert main(["snapshot", f"{ours},{dcgm}", "-o", str(out)]) == 0
    assert same_state(both, alone)  # not "duplicate node name", not a mix of the two
    got, want = snapshot.to_dict(flipped), snapshot.to_dict(dcgm_alone)
    assert got["nodes"][0]["gpus"] == want["nodes"][0]["gpus"]  # every GPU from dcgm-exporter
    assert got["allocations"] == want["allocations"] != []
    assert flipped.nodes.pool.tolist() == ["h100"]  # a label dcgm-exporter lacks: from ours
    snapshot.load(out)
    notes = _notes(caplog)
    assert len(notes) == 3 and notes[0] == (
        "8 GPU(s) reported by more than one URL, each read from the first URL listed that "
        f"reports it: dgx-a100-07/gpu0, dgx-a100-07/gpu1, dgx-a100-07/gpu2, ... from {ours} "
        f"(also reported by {dcgm})"
    )
