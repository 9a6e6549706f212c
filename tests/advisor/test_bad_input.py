"""Bad input is one line naming the file and what is wrong (and where), exit status 2, nothing
written: snapshot files, demand JSON, web configs, openb CSVs; and a scraped page's impossible
values are read as unknown the same way by every command (advisor.ingest.exporter_scrape)."""

from __future__ import annotations

import copy
import json
import logging
import math
import re
from pathlib import Path

import pytest

from advisor import snapshot
from advisor.cli import main
from advisor.ingest import exporter_scrape, openb
from advisor.ingest.sources import load_source
from advisor.model import ClusterModel
from advisor.planner.cli import load_demand
from advisor.snapshot import SnapshotError
from gpu_defrag_common.webconfig import WebConfigError, load_web_config
from tests.fakes.page_server import Routes, serve

EXAMPLES = Path(__file__).parent.parent.parent / "examples"
SEED = EXAMPLES / "seed-16x8-a100.json"
DCGM_PAGE = Path(__file__).parent.parent / "fixtures" / "dcgm_exporter" / "a100_k8s.prom"
NOT_UTF8 = b'{"schema": "\xa5\xff"}'


def _seed() -> dict:
    return json.loads(SEED.read_text())


def _refused(doc: dict) -> str:
    with pytest.raises(SnapshotError) as error:
        snapshot.from_dict(doc)
    return str(error.value)


def _one_error_line(capsys, *needles: str) -> str:
    captured = capsys.readouterr()
    err = captured.err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


# --------------------------------------------------------------------------- 1, 2: encoding


@pytest.mark.parametrize("command", ["analyze", "snapshot"])
def test_a_snapshot_file_that_is_not_utf8_is_one_line_naming_it(command, tmp_path, capsys):
    path = tmp_path / "garbage.bin"
    path.write_bytes(NOT_UTF8)
    assert main([command, str(path)]) == 2
    _one_error_line(capsys, f"snapshot {path}: (file): not UTF-8 text", "at byte offset 12")
    assert [p.name for p in tmp_path.iterdir()] == ["garbage.bin"]


def test_plan_names_a_source_and_a_demand_file_that_are_not_utf8(tmp_path, capsys):
    source = tmp_path / "garbage.json"
    source.write_bytes(NOT_UTF8)
    assert main(["plan", str(source), "--goal", "job=8"]) == 2
    _one_error_line(capsys, f"{source}: (file): not UTF-8 text")
    demand = tmp_path / "d_nonutf.json"
    demand.write_bytes(b'{"8": 1}\xff')
    assert main(["plan", str(SEED), "--goal", "forecast=6h", "--demand", str(demand)]) == 2
    _one_error_line(capsys, f"{demand}: cannot read demand: not UTF-8 text", "at byte offset 8")


def test_a_web_config_that_is_not_utf8_names_the_file(tmp_path):
    path = tmp_path / "wc_nonutf.yml"
    path.write_bytes(b"basic_auth_users:\n  a: \xff\n")
    with pytest.raises(WebConfigError, match=rf"web config {path}: not UTF-8 text"):
        load_web_config(path)
    path.write_text("a: " + "[" * 100_000)
    with pytest.raises(WebConfigError, match=rf"web config {path}: not valid YAML"):
        load_web_config(path)


# --------------------------------------------------------------------------- 3, 4: sizes


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda d: d["nodes"][0]["gpus"][0].update(index=10**30),
            "nodes[0].gpus[0].index: must be within 0..2147483647, got 1000000000000000000000000000000",
        ),
        (
            lambda d: d["allocations"][0].update(priority=10**30),
            "allocations[0].priority: must be within -2147483648..2147483647",
        ),
        (
            lambda d: d["nodes"][0]["gpus"][0].update(memory_total_bytes=10**400),
            "nodes[0].gpus[0].memory_total_bytes: must be within 0..9007199254740992, got 1000",
        ),
        (
            lambda d: d["nodes"][0].update(cpu_milli=1e300),
            "nodes[0].cpu_milli: must be within 0..9007199254740992, got 1e+300",
        ),
        (
            lambda d: d["allocations"][0].update(restart_cost_s=1e300),
            "allocations[0].restart_cost_s: must be within 0..9007199254740992",
        ),
        (
            lambda d: d["allocations"][0].update(start_time=-1e300),
            "allocations[0].start_time: must be within -9007199254740992..9007199254740992",
        ),
        (
            lambda d: d["allocations"][0].update(gpus=[10**30, 1]),
            "allocations[0].gpus[0]: expected a GPU index, got 1000000000000000000000000000000",
        ),
    ],
)
def test_numbers_beyond_the_model_columns_are_refused_by_path(mutate, message):
    doc = _seed()
    mutate(doc)
    assert _refused(doc) == message or _refused(doc).startswith(message)


def test_usage_values_a_float32_cannot_hold_are_refused():
    doc = _seed()
    gpus = sum(len(node["gpus"]) for node in doc["nodes"])
    doc["usage"] = {
        "times": [1, 2],
        "utilization_ratio": [[0.5] * gpus] * 2,
        "memory_used_bytes": [[1e39] + [0.0] * (gpus - 1), [0.0] * gpus],
    }
    assert _refused(doc).startswith("usage.memory_used_bytes[0][0]: must be within")


def test_huge_numbers_in_a_snapshot_file_are_one_line(tmp_path, capsys):
    path = tmp_path / "snap_huge_prio.json"
    doc = _seed()
    doc["allocations"][0]["priority"] = 10**30
    path.write_text(json.dumps(doc))
    assert main(["analyze", str(path)]) == 2
    _one_error_line(capsys, f"snapshot {path}: allocations[0].priority: must be within")


def test_json_nested_too_deep_or_too_many_digits_is_one_line(tmp_path, capsys):
    path = tmp_path / "snap_deep.json"
    path.write_text("[" * 100_000)
    with pytest.raises(SnapshotError, match=r"^\(file\): JSON nested too deeply$"):
        snapshot.load(path)
    assert main(["analyze", str(path)]) == 2
    _one_error_line(capsys, f"snapshot {path}: (file): JSON nested too deeply")
    huge = "JSON integer too long: Exceeds the limit (4300 digits) for integer string conversion"
    path.write_text('{"schema": ' + "9" * 5000 + "}")
    with pytest.raises(SnapshotError, match=rf"^\(file\): {re.escape(huge)}: value has 5000"):
        snapshot.load(path)
    # the demand file of `plan` is read by the same reader, named as a demand
    demand = tmp_path / "d_deep.json"
    demand.write_text("[" * 100_000)
    with pytest.raises(ValueError, match=rf"^{demand}: cannot read demand: JSON nested too deep"):
        load_demand(str(demand))
    demand.write_text('{"8": ' + "9" * 5000 + "}")
    with pytest.raises(ValueError, match=rf"^{demand}: cannot read demand: {re.escape(huge)}"):
        load_demand(str(demand))


def test_a_value_too_large_to_show_is_still_a_snapshot_error():
    doc = _seed()
    doc["nodes"][0]["name"] = 10**5000  # json.dumps cannot write it (Python's digit limit)
    assert _refused(doc) == "nodes[0].name: expected a string, got <int too large to show>"


# --------------------------------------------------------------------------- 5: openb


def test_openb_integers_beyond_int64_are_refused_by_line_and_column(tmp_path, capsys):
    nodes = tmp_path / "n_huge_cpu.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nx," + "9" * 300 + ",1024,1,T4\n")
    with pytest.raises(openb.OpenbFormatError, match=r"line 2, column cpu_milli: 9999.*\.\.\. is"):
        openb.read_nodes(nodes)
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nx,1e300,1024,1,T4\n")
    with pytest.raises(openb.OpenbFormatError, match=r"out of range \(0\.\.9007199254740992\)"):
        openb.read_nodes(nodes)
    for command in ("analyze", "snapshot"):
        assert main([command, f"openb:{nodes}"]) == 2
        _one_error_line(capsys, f"{nodes} line 2, column cpu_milli")


def test_an_openb_csv_with_a_byte_order_mark_reads_like_one_without(tmp_path):
    plain = tmp_path / "n.csv"
    plain.write_text("sn,cpu_milli,memory_mib,gpu,model\nn1,64000,262144,2,P100\n")
    bom = tmp_path / "n_bom.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    assert openb.read_nodes(bom).name.tolist() == ["n1"] == openb.read_nodes(plain).name.tolist()


def test_openb_empty_node_names_and_infinite_times_are_refused(tmp_path, capsys):
    nodes = tmp_path / "n.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn1,64000,262144,2,P100\n,1,1,1,T4\n")
    with pytest.raises(openb.OpenbFormatError, match=r"n\.csv line 3, column sn: empty node"):
        openb.read_nodes(nodes)
    pods = tmp_path / "p.csv"
    header = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,deletion_time\n"
    for bad in ("inf", "-inf", "1e300"):
        pods.write_text(header + f"p0,1000,1024,1,1000,0,{bad}\n")
        with pytest.raises(openb.OpenbFormatError, match=r"p\.csv line 2, column deletion_time"):
            openb.read_pods(pods)
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn1,64000,262144,2,P100\n")
    pods.write_text(header + "p0,1000,1024,1,1000,0,inf\n")
    for command in ("analyze", "snapshot"):  # both refuse: a snapshot cannot hold infinity
        assert main([command, f"openb:{nodes},{pods}"]) == 2
        _one_error_line(capsys, f"{pods} line 2, column deletion_time: 'inf'")
    # deleted before it was created: a broken export, not a pod that ran for negative time
    pods.write_text(header + "p0,1000,1024,1,1000,0,\np1,1000,1024,1,1000,500,100\n")
    assert main(["analyze", f"openb:{nodes},{pods}"]) == 2
    _one_error_line(
        capsys, f"{pods} line 3, column deletion_time: 100 is before the pod's creation_time 500"
    )


# --------------------------------------------------------------------------- 6: scraped pages

GPU0 = '{gpu="0",node="n1"}'
SERIES = {
    "gpu_memory_total_bytes": "8e10",
    "gpu_utilization_ratio": "0.5",
    "gpu_power_watts": "300",
    "gpu_nvlink_island": "0",
}


def read_three_ways(url: str, out) -> ClusterModel:
    """`url` read as a user and the service read it: `analyze`, `snapshot` into `out` and the
    source loader, each of which must succeed; the loaded model."""
    assert main(["analyze", url, "--json"]) == 0
    assert main(["snapshot", url, "-o", str(out)]) == 0
    return load_source(url, timeout=2)


def _page(**values: str) -> str:
    """Two GPUs on node n1; GPU 0's series as SERIES, with `values` instead where given."""
    lines = [f'gpu_info{{gpu="{i}",node="n1",uuid="GPU-{i}",model="A100"}} 1' for i in (0, 1)]
    lines += [f"{name}{GPU0} {values.get(name, value)}" for name, value in SERIES.items()]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("series", "value", "attribute"),
    [
        ("gpu_utilization_ratio", "-3", "utilization_ratio"),
        ("gpu_utilization_ratio", "5", "utilization_ratio"),
        ("gpu_utilization_ratio", "+Inf", "utilization_ratio"),
        ("gpu_memory_total_bytes", "-1", "memory_total_bytes"),
        ("gpu_memory_total_bytes", "1e308", "memory_total_bytes"),
        ("gpu_power_watts", "+Inf", "power_watts"),
        ("gpu_nvlink_island", "1e300", "nvlink_island"),
        ("gpu_nvlink_island", "1.5", "nvlink_island"),
    ],
)
def test_an_impossible_page_value_is_unknown_for_analyze_and_snapshot_alike(
    series, value, attribute, tmp_path, capsys, caplog
):
    routes = Routes()
    routes.text("/metrics", _page(**{series: value}))
    out = tmp_path / "s.json"
    with caplog.at_level(logging.WARNING), serve(routes) as base:
        model = read_three_ways(f"{base}/metrics", out)
    gpu = json.loads(out.read_text())["nodes"][0]["gpus"][0]
    assert gpu[attribute] is None  # unknown, not the impossible value
    assert gpu["uuid"] == "GPU-0" and len(model.gpus) == 2  # the rest is read
    column = getattr(model.gpus, attribute)[0]
    assert column == -1 if attribute == "nvlink_island" else math.isnan(column)
    notes = [r.getMessage() for r in caplog.records if r.name == exporter_scrape.__name__]
    assert len(notes) == 3 and all("n1/gpu0" in note for note in notes)
    assert notes[0].startswith("1 impossible value(s) in the GPU series read as unknown")


def test_page_labels_and_info_values_that_no_model_holds():
    samples = [
        ("gpu_info", {"gpu": "0", "node": "n1", "uuid": "GPU-0"}, math.nan),
        ("gpu_info", {"gpu": str(10**30), "node": "n1"}, 1.0),
        ("gpu_info", {"gpu": "²", "node": "n1"}, 1.0),  # a digit to str.isdigit, not to int
        (
            "gpu_allocation_info",
            {"gpu": "0", "node": "n1", "pod": "p", "priority": str(10**30), "gpu_milli": "5000"},
            math.nan,
        ),
    ]
    readings = exporter_scrape.our_readings(samples)
    assert [gpu.index for gpu in readings[0].gpus] == [0]
    assert readings[0].gpus[0].uuid == "GPU-0"  # an info series' labels, whatever its value
    alloc = readings[0].allocations[0]
    assert (alloc.pod, alloc.priority, alloc.gpu_milli) == ("p", None, None)


def test_a_dcgm_page_with_an_impossible_value_reads_it_as_unknown(tmp_path, caplog):
    text = DCGM_PAGE.read_text()
    line = next(x for x in text.splitlines() if x.startswith('DCGM_FI_DEV_GPU_UTIL{gpu="0"'))
    routes = Routes()
    routes.text("/dcgm", text.replace(line, line.rsplit(" ", 1)[0] + " 500"))
    with caplog.at_level(logging.WARNING), serve(routes) as base:
        model = load_source(f"{base}/dcgm", timeout=2)
        snapshot.save(model, tmp_path / "s.json")  # the loader accepts what was read
    assert math.isnan(model.gpus.utilization_ratio[0]) and len(model.gpus) == 8
    assert any("utilization_ratio=5" in r.getMessage() for r in caplog.records)


# --------------------------------------------------------------------------- 7: documented rules


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda d: d["nodes"][0]["gpus"][0].update(utilization_ratio=2.5),
            "nodes[0].gpus[0].utilization_ratio: must be within 0..1, got 2.5",
        ),
        (
            lambda d: d["nodes"][0]["gpus"][0].update(nvlink_island=-3),
            "nodes[0].gpus[0].nvlink_island: must be within 0..2147483647, got -3",
        ),
        (lambda d: d["nodes"][0].update(name=""), "nodes[0].name: must not be empty"),
        (
            lambda d: d["allocations"][0].update(gpu_milli=0),
            "allocations[0].gpu_milli: must be within 1..1000 for a task that holds GPUs, got 0",
        ),
        (
            lambda d: d.update(
                usage={"times": [5, 1], "utilization_ratio": [], "memory_used_bytes": []}
            ),
            "usage.times[1]: times must ascend, got 1 after 5",
        ),
        (
            lambda d: d.update(
                usage={"times": [5, 5], "utilization_ratio": [], "memory_used_bytes": []}
            ),
            "usage.times[1]: times must ascend, got 5 after 5",
        ),
    ],
)
def test_values_the_docs_call_invalid_are_refused_by_path(mutate, message):
    doc = _seed()
    mutate(doc)
    assert _refused(doc) == message


def test_gpu_milli_zero_is_fine_on_a_task_without_gpus():
    doc = _seed()
    doc["allocations"].append({"id": "cpu-only", "num_gpu": 0, "gpu_milli": 0})
    assert snapshot.from_dict(doc).allocations.gpu_milli[-1] == 0


def test_a_key_given_twice_is_refused_by_its_path(tmp_path, capsys):
    text = SEED.read_text()
    top = tmp_path / "snap_nodes_dupkey.json"
    top.write_text(text.replace('"nodes":[', '"nodes":[],"nodes":[', 1))
    with pytest.raises(SnapshotError, match=r"^nodes: key given twice in one object"):
        snapshot.load(top)
    assert main(["analyze", str(top)]) == 2
    _one_error_line(capsys, f"snapshot {top}: nodes: key given twice")
    nested = tmp_path / "snap_dupkey.json"
    nested.write_text(text.replace('"index":0,', '"index":0,"index":1,', 1))
    with pytest.raises(SnapshotError, match=r"^nodes\[0\]\.gpus\[0\]\.index: key given twice"):
        snapshot.load(nested)
    demand = tmp_path / "d_dupkey.json"
    demand.write_text('{"8": 1, "8": 2}')
    with pytest.raises(ValueError, match=rf"^{demand}: 8: shape given twice"):
        load_demand(str(demand))
    demand.write_text('{"zz": 1}')
    with pytest.raises(ValueError, match=rf"^{demand}: bad shape 'zz'"):
        load_demand(str(demand))


def test_every_example_and_a_written_snapshot_still_load(tmp_path):
    for path in sorted(EXAMPLES.glob("*.json")):
        snapshot.load(path)
    model = load_source("sim:a100-16x8?history=1h&t=2h")
    snapshot.save(model, tmp_path / "s.json")
    back = snapshot.load(tmp_path / "s.json")
    assert snapshot.to_dict(back) == snapshot.to_dict(model)
    assert copy.deepcopy(snapshot.to_dict(back))["usage"]["times"] == sorted(
        set(back.usage.times.tolist())
    )
