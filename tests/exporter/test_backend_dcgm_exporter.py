"""DcgmExporterBackend against fixture pages served by a real local HTTP server."""

from __future__ import annotations

import argparse
import gzip
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from exporter.backends.base import BackendUnavailable
from exporter.backends.dcgm_common import XidTracker, is_blank
from exporter.backends.dcgm_exporter import DcgmExporterBackend
from exporter.backends.registry import backend_class
from exporter.readings import GpuReading
from gpu_defrag_common import page_fetch
from gpu_defrag_common.page_fetch import PageUnavailable, fetch_page
from gpu_defrag_common.page_parse import first_bad_line
from tests.fakes.page_server import (
    EXPOSITION,
    Answer,
    Routes,
    endless,
    fixed,
    head,
    serve,
    serve_raw,
    trickle,
)
from tests.ports import free_port

FIXTURES = Path(__file__).parent.parent / "fixtures" / "dcgm_exporter"
MIB = 2**20


class _Pages(Routes):
    """Pages the tests swap between collections."""

    def set(self, path: str, body: str, status: int = 200) -> str:
        return self.text(path, body, status)

    def fixture(self, name: str) -> str:
        return self.text(f"/{name}", (FIXTURES / name).read_text())


@pytest.fixture
def server() -> Iterator[tuple[str, _Pages]]:
    pages = _Pages()
    with serve(pages) as base:
        yield base, pages


def _collect(urls: list[str]):
    backend = DcgmExporterBackend(urls, timeout=2.0)
    backend.start()
    try:
        return backend.collect()
    finally:
        backend.close()


def _gpus(collection) -> dict[int, GpuReading]:
    (node,) = collection.nodes
    return {gpu.index: gpu for gpu in node.gpus}


# --- A100 node with Kubernetes pod labels ---------------------------------------------------


def test_a100_identity_and_units(server):
    base, pages = server
    collection = _collect([base + pages.fixture("a100_k8s.prom")])
    (node,) = collection.nodes
    assert node.node == "dgx-a100-07"
    assert node.driver_version == "550.90.07"
    assert [gpu.index for gpu in node.gpus] == list(range(8))
    gpu = node.gpus[0]
    assert gpu.uuid.startswith("GPU-") and len(gpu.uuid) == 40
    assert gpu.model == "NVIDIA A100-SXM4-80GB"
    assert gpu.pci_bus_id == "00000000:07:00.0"
    assert gpu.memory_used_bytes == 71680 * MIB
    assert gpu.memory_reserved_bytes == 591 * MIB
    assert gpu.memory_free_bytes == (81920 - 71680 - 591) * MIB
    assert gpu.memory_total_bytes == 81920 * MIB  # used + free + reserved: FB_TOTAL is not exported
    assert gpu.sm_clock_hertz == 1410e6
    assert gpu.memory_clock_hertz == 1593e6
    assert gpu.utilization_ratio == pytest.approx(0.97)
    assert gpu.memory_utilization_ratio == pytest.approx(0.41)
    assert gpu.energy_joules == pytest.approx(912345678.901)
    assert gpu.power_watts == pytest.approx(352.418)
    assert gpu.sm_active_ratio is None  # only GR_ENGINE_ACTIVE on the page: not SM activity
    assert gpu.tensor_active_ratio == pytest.approx(0.512345)
    assert gpu.pcie_tx_bytes_per_second == 412345678
    assert gpu.mig_enabled is False and gpu.mig_instances == []
    assert collection.errors == {}


def test_blank_sentinel_becomes_none(server):
    base, pages = server
    gpus = _gpus(_collect([base + pages.fixture("a100_k8s.prom")]))
    assert gpus[7].memory_temperature_celsius is None  # 9223372036854775794 on the page
    assert gpus[6].memory_temperature_celsius == 46


def test_pod_labels_become_allocations_with_namespace_as_tenant(server):
    base, pages = server
    (node,) = _collect([base + pages.fixture("a100_k8s.prom")]).nodes
    held = sorted((a.gpu, a.namespace, a.pod, a.container, a.tenant) for a in node.allocations)
    assert held == [
        *[(i, "ml-train", "llm-pretrain-worker-0", "trainer", "ml-train") for i in range(4)],
        (5, "inference", "bert-serve-7d9f8b6c5-x2k4q", "server", "inference"),
    ]
    assert all(a.gpu_instance_id is None for a in node.allocations)


def test_health_remap_failure_and_clock_events(server):
    base, pages = server
    gpus = _gpus(_collect([base + pages.fixture("a100_k8s.prom")]))
    assert gpus[0].healthy and gpus[5].healthy
    assert not gpus[3].healthy  # DCGM_EXP_GPU_HEALTH_STATUS MEM = 20 (FAIL)
    assert not gpus[4].healthy  # DCGM_FI_DEV_ROW_REMAP_FAILURE = 1
    assert gpus[4].remapped_rows == {"uncorrectable": 0.0, "correctable": 2.0}
    assert gpus[4].remapped_rows_failure is True
    assert gpus[0].clock_event_active == {"sw_power_cap": True}
    assert gpus[2].clock_event_active == {}
    assert gpus[2].pcie_replay_errors == 3


def test_windowed_xid_count_is_turned_into_a_monotonic_counter(server):
    base, pages = server
    path = pages.fixture("a100_k8s.prom")
    backend = DcgmExporterBackend([base + path], timeout=2.0)
    first = {g.index: g for g in backend.collect().nodes[0].gpus}
    assert first[6].xid_errors == {}  # the window's 2 events predate our start: the baseline
    assert first[6].xid_last_timestamp_seconds is None
    assert first[0].xid_errors == {}
    again = {g.index: g for g in backend.collect().nodes[0].gpus}
    assert again[6].xid_errors == {}  # the same window read twice adds nothing
    text = (FIXTURES / "a100_k8s.prom").read_text()
    pages.set(path, text.replace('xid="13"} 2', 'xid="13"} 4'))
    third = {g.index: g for g in backend.collect().nodes[0].gpus}
    assert third[6].xid_errors == {13: 2.0}  # both new events, though the gauge shows one code
    assert third[6].xid_last_timestamp_seconds is not None
    pages.set(path, text.replace('xid="13"} 2', 'xid="13"} 1'))  # old events left the window
    fourth = {g.index: g for g in backend.collect().nodes[0].gpus}
    assert fourth[6].xid_errors == {13: 2.0}
    backend.close()


# --- MIG H100 node ----------------------------------------------------------------------------


def test_mig_instances_and_their_allocations(server):
    base, pages = server
    (node,) = _collect([base + pages.fixture("h100_mig.prom")]).nodes
    assert node.node == "gpu-h100-03"  # lower-case `hostname` label (dcgm-exporter HEAD)
    gpus = {gpu.index: gpu for gpu in node.gpus}
    assert len(gpus) == 8
    mig0 = gpus[0]
    assert mig0.mig_enabled is True
    instances = [(m.gpu_instance_id, m.profile) for m in mig0.mig_instances]
    assert instances == [(2, "3g.40gb"), (3, "2g.20gb"), (9, "1g.10gb"), (10, "1g.10gb")]
    first = mig0.mig_instances[0]
    assert first.memory_used_bytes == 30720 * MIB
    assert first.memory_total_bytes == 40448 * MIB
    assert first.sm_active_ratio is None  # only GR_ENGINE_ACTIVE on the page
    # Parent values repeated on instance series reach the GPU; per-GPU util does not exist.
    assert mig0.temperature_celsius == 50
    assert mig0.power_watts == pytest.approx(300.5)
    assert mig0.utilization_ratio is None
    assert mig0.memory_used_bytes == (30720 + 4096) * MIB
    assert mig0.memory_total_bytes == (40448 + 20096 + 9856 + 9856) * MIB
    assert [m.profile for m in gpus[1].mig_instances] == ["7g.80gb"]
    plain = gpus[2]
    assert plain.mig_enabled is False
    assert plain.memory_total_bytes == 81559 * MIB
    assert plain.utilization_ratio == 0.0
    held = sorted(
        (a.gpu, a.gpu_instance_id if a.gpu_instance_id is not None else -1, a.pod)
        for a in node.allocations
    )
    assert held == [
        (0, 2, "llama-finetune-0"),
        (0, 9, "notebook-alice"),
        (1, 0, "sdxl-render-5"),
        (4, -1, "triton-0"),
    ]


def test_last_xid_gauge_counts_a_change_once(server):
    base, pages = server
    path = pages.fixture("h100_mig.prom")
    backend = DcgmExporterBackend([base + path], timeout=2.0)
    gpus = {g.index: g for g in backend.collect().nodes[0].gpus}
    assert gpus[1].xid_errors == {}  # 31 was standing at our start: the baseline
    assert gpus[0].xid_errors == {}
    text = (FIXTURES / "h100_mig.prom").read_text()
    pages.set(
        path,
        text.replace(
            'err_code="31",err_msg="GPU memory page fault"} 31',
            'err_code="13",err_msg="Graphics Engine Exception"} 13',
        ),
    )
    gpus = {g.index: g for g in backend.collect().nodes[0].gpus}
    assert gpus[1].xid_errors == {13: 1.0}
    gpus = {g.index: g for g in backend.collect().nodes[0].gpus}
    assert gpus[1].xid_errors == {13: 1.0}  # same last code again: no new event is visible
    pages.set(path, text)
    gpus = {g.index: g for g in backend.collect().nodes[0].gpus}
    assert gpus[1].xid_errors == {13: 1.0, 31: 1.0}
    backend.close()


# --- old namespace (-o) -----------------------------------------------------------------------


def test_old_namespace_names_and_labels(server):
    base, pages = server
    (node,) = _collect([base + pages.fixture("old_namespace.prom")]).nodes
    assert node.node == "v100-legacy-01"
    gpus = {gpu.index: gpu for gpu in node.gpus}
    busy = gpus[1]
    assert busy.uuid.startswith("GPU-")
    assert busy.model == "Tesla V100-SXM2-32GB"
    assert busy.utilization_ratio == 1.0
    assert busy.memory_used_bytes == 30000 * MIB
    assert busy.memory_total_bytes == 32510 * MIB
    assert busy.sm_clock_hertz == 1530e6
    assert busy.sm_active_ratio is None  # only GR_ENGINE_ACTIVE on the page
    assert busy.energy_joules == pytest.approx(55555555.556)
    (allocation,) = node.allocations
    assert (allocation.gpu, allocation.pod, allocation.namespace, allocation.container) == (
        1,
        "resnet-train-abc12",
        "batch",
        "worker",
    )
    assert allocation.tenant == "batch"


# --- cumulative XID total ---------------------------------------------------------------------

_XID_TOTAL_PAGE = """# HELP DCGM_EXP_XID_ERRORS_TOTAL Total XID errors observed since exporter start.
# TYPE DCGM_EXP_XID_ERRORS_TOTAL counter
DCGM_EXP_XID_ERRORS_TOTAL{{gpu="0",UUID="GPU-x",hostname="n1",xid="48"}} {n}
# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.
# TYPE DCGM_FI_DEV_XID_ERRORS gauge
DCGM_FI_DEV_XID_ERRORS{{gpu="0",UUID="GPU-x",hostname="n1",err_code="48",err_msg="DBE"}} 48
"""


def test_cumulative_xid_total_survives_an_exporter_restart(server):
    base, pages = server
    path = pages.set("/total", _XID_TOTAL_PAGE.format(n=5))
    backend = DcgmExporterBackend([base + path], timeout=2.0)
    assert backend.collect().nodes[0].gpus[0].xid_errors == {}  # 5 before our start: baseline
    pages.set(path, _XID_TOTAL_PAGE.format(n=7))
    assert backend.collect().nodes[0].gpus[0].xid_errors == {48: 2.0}
    pages.set(path, _XID_TOTAL_PAGE.format(n=1))  # dcgm-exporter restarted: 1 new event
    assert backend.collect().nodes[0].gpus[0].xid_errors == {48: 3.0}
    backend.close()


# --- XIDs from before our start ---------------------------------------------------------------


def _xid_page(view: str, history: dict[str, list[int]]) -> str:
    """A page whose only XID view is `view`; `history` maps each GPU's UUID (index = position)
    to the XIDs it raised since dcgm-exporter started, all inside the COUNT window."""
    lines = ["# TYPE DCGM_FI_DEV_GPU_TEMP gauge"]
    lines += [
        f'DCGM_FI_DEV_GPU_TEMP{{gpu="{i}",UUID="{uuid}",hostname="n1"}} 40'
        for i, uuid in enumerate(history)
    ]
    if view == "last-code":
        lines.append("# TYPE DCGM_FI_DEV_XID_ERRORS gauge")
        for i, (uuid, xids) in enumerate(history.items()):
            code = xids[-1] if xids else 0
            lines.append(
                f'DCGM_FI_DEV_XID_ERRORS{{gpu="{i}",UUID="{uuid}",hostname="n1",'
                f'err_code="{code}"}} {code}'
            )
    else:
        name = "DCGM_EXP_XID_ERRORS_TOTAL" if view == "total" else "DCGM_EXP_XID_ERRORS_COUNT"
        lines.append(f"# TYPE {name} {'counter' if view == 'total' else 'gauge'}")
        for i, (uuid, xids) in enumerate(history.items()):
            labels = f'gpu="{i}",UUID="{uuid}",hostname="n1"'
            if view == "count":  # dcgm-exporter's 0-valued series of a GPU without XIDs
                lines.append(f'{name}{{{labels},window_size_in_ms="300000"}} 0')
            for code in sorted(set(xids)):
                lines.append(f'{name}{{{labels},xid="{code}"}} {xids.count(code)}')
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("view", ["total", "count", "last-code"])
def test_xids_from_before_our_start_are_a_baseline(server, view):
    """A restart of ours must not count old XIDs again, nor page on an old fatal one."""
    base, pages = server
    history = {"GPU-a": [48, 48], "GPU-b": [13]}  # raised before our start
    path = pages.set("/xid", _xid_page(view, history))
    backend = DcgmExporterBackend([base + path], timeout=2.0)
    for _ in range(2):  # the baseline, then the same page: nothing happened
        gpus = _gpus(backend.collect())
        assert gpus[0].xid_errors == {} and gpus[1].xid_errors == {}
        assert gpus[0].healthy and gpus[1].healthy
        assert gpus[0].xid_last_timestamp_seconds is None
    history["GPU-a"].append(64)  # a new fatal XID while we watch
    history["GPU-b"].append(31)
    # Hot-plug: GPU-c appears with its own old fatal XID; GPU-d without any XID yet.
    history["GPU-c"] = [74]
    history["GPU-d"] = []
    pages.set(path, _xid_page(view, history))
    gpus = _gpus(backend.collect())
    assert gpus[0].xid_errors == {64: 1.0} and not gpus[0].healthy and not gpus[0].lost
    assert gpus[0].xid_last_timestamp_seconds is not None
    assert gpus[1].xid_errors == {31: 1.0} and gpus[1].healthy
    assert gpus[2].xid_errors == {} and gpus[2].healthy  # GPU-c's own baseline
    assert gpus[3].xid_errors == {} and gpus[3].healthy
    history["GPU-c"].append(62)
    history["GPU-d"].append(48)  # its first XID: the first series of its code
    pages.set(path, _xid_page(view, history))
    gpus = _gpus(backend.collect())
    assert gpus[2].xid_errors == {62: 1.0} and not gpus[2].healthy
    assert gpus[3].xid_errors == {48: 1.0} and not gpus[3].healthy
    backend.close()


def test_xid_79_in_the_baseline_marks_the_gpu_lost_without_counting_it():
    """Lost follows the current view: off the bus until a reset, which clears the code."""
    for observe in (
        lambda t: t.observe_last_code("g", 79, 1.0),
        lambda t: t.observe_counts("g", {79: 1.0}, 1.0, cumulative=True),
        lambda t: t.observe_counts("g", {79: 1.0}, 1.0, cumulative=False),
    ):
        tracker = XidTracker()
        observe(tracker)
        gpu = GpuReading(index=0)
        tracker.apply("g", gpu)
        assert gpu.xid_errors == {} and gpu.xid_last_timestamp_seconds is None
        assert gpu.lost and not gpu.healthy


def test_last_code_view_after_a_counts_view_starts_with_its_own_baseline():
    tracker = XidTracker()
    tracker.observe_counts("g", {0: 0.0}, 1.0, cumulative=False)
    tracker.observe_last_code("g", 48, 2.0)  # the gauge carries no time: maybe old
    gpu = GpuReading(index=0)
    tracker.apply("g", gpu)
    assert gpu.xid_errors == {} and gpu.healthy


# --- failures ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "line", "gpus"), [("truncated.prom", 34, 8), ("bad_value.prom", 33, 8)]
)
def test_an_unparseable_line_is_left_out_counted_and_named(server, caplog, name, line, gpus):
    """A line cut mid-label or with a value that is no number costs that line, not the page."""
    base, pages = server
    url = base + pages.fixture(name)
    with caplog.at_level("WARNING", logger="exporter.backends.dcgm_exporter"):
        collection = _collect([url])
    assert len(_gpus(collection)) == gpus
    assert collection.skipped_lines == {url: 1}
    (warning,) = [r.getMessage() for r in caplog.records]
    assert url in warning and f"line {line}:" in warning and "\n" not in warning


def test_a_page_of_which_no_line_parses_names_the_url_and_its_first_line(server):
    base, pages = server
    url = base + pages.fixture("garbage.prom")
    with pytest.raises(BackendUnavailable) as caught:
        _collect([url])
    message = str(caught.value)
    assert url in message and "line 1" in message and "\n" not in message


def test_failed_to_convert_lines_are_skipped_and_the_gpus_read(server, caplog):
    """dcgm-exporter writes `ERROR - FAILED TO CONVERT TO STRING` for a field it cannot render:
    one such line per GPU rejected the whole page (backend_up 0) before."""
    base, pages = server
    url = base + pages.fixture("a100_unattributed.prom")
    backend = DcgmExporterBackend([url], timeout=2.0)
    with caplog.at_level("WARNING", logger="exporter.backends.dcgm_exporter"):
        first, second = backend.collect(), backend.collect()
    backend.close()
    gpus = _gpus(first)
    assert len(gpus) == 8 and first.skipped_lines == {url: 8} == second.skipped_lines
    assert gpus[2].utilization_ratio == 1.0 and gpus[2].memory_used_bytes == 71680 * MIB
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1  # one line while the page stays the same, not one a cycle
    assert "8 line(s)" in warnings[0] and "DCGM_FI_DEV_VGPU_PER_PROCESS_UTILIZATION" in warnings[0]
    assert "FAILED TO CONVERT TO STRING" in warnings[0]


def test_gpus_in_use_without_pod_labels_are_owner_unknown_not_free(server):
    """dcgm-exporter without `-k`: GPU 2 at 100 % with 70 GB, GPU 5 holding 20 GB; the page
    gives no topology, so the largest free NVLink group is unknown, not 1."""
    from exporter.node_gauges import IdlePolicy, IdleTracker, node_gauges

    base, pages = server
    (node,) = _collect([base + pages.fixture("a100_unattributed.prom")]).nodes
    gauges = node_gauges(node, IdleTracker(IdlePolicy()), 0.0)
    assert (gauges.free_gpus, gauges.owner_unknown_gpus) == (6, 2)
    assert gauges.largest_free_nvlink_group is None


def test_a_mig_instance_reads_its_engine_activity_from_the_default_counters(server):
    """No SM_ACTIVE on the page (it is not a default counter): the instance at 0.996 engine
    activity is busy, and with no pod on it, in use with its owner unknown."""
    from exporter.node_gauges import IdlePolicy, IdleTracker, node_gauges

    base, pages = server
    url = base + pages.fixture("h100_mig_engine.prom")
    collection = _collect([url])
    (node,) = collection.nodes
    assert node.node == "h100-mig-21" and node.driver_version == "570.124.06"
    busy, idle = _gpus(collection)[0].mig_instances
    assert (busy.gpu_instance_id, busy.profile) == (1, "4g.40gb")
    assert busy.graphics_engine_active_ratio == pytest.approx(0.996)
    assert busy.tensor_active_ratio == pytest.approx(0.702)
    assert busy.dram_active_ratio == pytest.approx(0.551)
    assert busy.sm_active_ratio is None and busy.activity_ratio == pytest.approx(0.996)
    assert busy.memory_used_bytes == 38912 * MIB and busy.memory_total_bytes == 40448 * MIB
    assert idle.activity_ratio == 0.0
    assert collection.skipped_lines == {url: 2}  # the two CUDA_VISIBLE_DEVICES_STR values
    gauges = node_gauges(node, IdleTracker(IdlePolicy()), 0.0)
    assert (gauges.free_gpus, gauges.owner_unknown_gpus) == (1, 1)


def test_an_old_page_without_model_name_reserved_memory_or_host_label(server):
    """dcgm-exporter 2.0: `gpu`, `UUID`, `device` only. Memory is used + free; the node is the
    target's host; the model, which the page does not give, is unknown (""), not guessed."""
    base, pages = server
    url = base + pages.fixture("v100_dcgm_exporter_2_0.prom")
    collection = _collect([url])
    (node,) = collection.nodes
    assert node.node == "127.0.0.1"
    gpus = _gpus(collection)
    assert len(gpus) == 4 and collection.skipped_lines == {url: 4}
    assert {g.model for g in gpus.values()} == {""}
    assert gpus[1].memory_total_bytes == 16160 * MIB and gpus[1].memory_used_bytes == 14000 * MIB
    assert gpus[1].utilization_ratio == pytest.approx(0.91)


def test_model_from_a_dcgm_fi_dev_name_label_row(server):
    """A counters file with `DCGM_FI_DEV_NAME, label` names the model on every series."""
    base, pages = server
    text = (FIXTURES / "v100_dcgm_exporter_2_0.prom").read_text()
    text = text.replace('device="nvidia', 'DCGM_FI_DEV_NAME="Tesla V100-SXM2-16GB",device="nvidia')
    (node,) = _collect([base + pages.set("/named", text)]).nodes
    assert {g.model for g in node.gpus} == {"Tesla V100-SXM2-16GB"}


def test_first_bad_line_is_none_for_a_good_page():
    assert first_bad_line((FIXTURES / "old_namespace.prom").read_text()) is None


def test_empty_page_is_unavailable(server):
    base, pages = server
    with pytest.raises(BackendUnavailable, match="empty"):
        _collect([base + pages.set("/empty", "")])


def test_http_error_names_the_url(server):
    base, pages = server
    url = base + pages.set("/broken", "oops", status=500)
    with pytest.raises(BackendUnavailable, match=r"HTTP 500") as caught:
        _collect([url])
    assert url in str(caught.value)


def test_unreachable_target_names_the_url():
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    with pytest.raises(BackendUnavailable, match="unreachable") as caught:
        _collect([url])
    assert url in str(caught.value)
    assert "\n" not in str(caught.value)


def test_one_failing_target_is_counted_and_the_others_collected(server):
    base, pages = server
    good = base + pages.fixture("a100_k8s.prom")
    bad = base + "/missing"
    collection = _collect([good, bad])
    assert [node.node for node in collection.nodes] == ["dgx-a100-07"]
    assert collection.errors == {f"scrape {bad}": 1}


def test_several_targets_become_several_nodes(server):
    base, pages = server
    urls = [base + pages.fixture("a100_k8s.prom"), base + pages.fixture("h100_mig.prom")]
    names = sorted(node.node for node in _collect(urls).nodes)
    assert names == ["dgx-a100-07", "gpu-h100-03"]


def test_all_targets_failing_raises(server):
    base, _ = server
    with pytest.raises(BackendUnavailable, match="all 2 dcgm-exporter targets failed"):
        _collect([base + "/a", base + "/b"])


def test_url_host_names_the_node_without_hostname_label(server):
    base, pages = server
    page = '# TYPE DCGM_FI_DEV_GPU_TEMP gauge\nDCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-y"} 41\n'
    (node,) = _collect([base + pages.set("/nohost", page)]).nodes
    assert node.node == "127.0.0.1"
    assert node.gpus[0].temperature_celsius == 41


def test_sm_activity_comes_from_sm_active_and_violations_are_nanoseconds(server):
    base, pages = server
    labels = 'gpu="0",UUID="GPU-z",Hostname="n1"'
    mig = 'gpu="0",UUID="GPU-z",Hostname="n1",GPU_I_ID="3",GPU_I_PROFILE="3g.40gb"'
    page = (
        "# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge\n"
        f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{labels}}} 0.97\n"
        f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{mig}}} 0.95\n"
        "# TYPE DCGM_FI_PROF_SM_ACTIVE gauge\n"
        f"DCGM_FI_PROF_SM_ACTIVE{{{labels}}} 0.61\n"
        f"DCGM_FI_PROF_SM_ACTIVE{{{mig}}} 0.42\n"
        "# TYPE DCGM_FI_DEV_POWER_VIOLATION counter\n"
        f"DCGM_FI_DEV_POWER_VIOLATION{{{labels}}} 2500000000\n"
    )
    gpu = _gpus(_collect([base + pages.set("/sm", page)]))[0]
    assert gpu.sm_active_ratio == pytest.approx(0.61)
    assert gpu.mig_instances[0].sm_active_ratio == pytest.approx(0.42)
    assert gpu.clock_event_seconds == {"sw_power_cap": pytest.approx(2.5)}


# --- flags and registry -----------------------------------------------------------------------


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    DcgmExporterBackend.add_arguments(parser)
    return parser.parse_args(argv)


def test_flags_accept_repeats_and_commas():
    args = _parse(
        [
            "--dcgm-exporter.url",
            "http://a:9400/metrics,http://b:9400/metrics",
            "--dcgm-exporter.url",
            "http://c:9400/metrics",
            "--dcgm-exporter.timeout",
            "2.5",
        ]
    )
    backend = DcgmExporterBackend.from_args(args)
    assert backend.urls == [
        "http://a:9400/metrics",
        "http://b:9400/metrics",
        "http://c:9400/metrics",
    ]
    assert backend.timeout == 2.5
    assert backend_class("dcgm-exporter") is DcgmExporterBackend


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "--dcgm-exporter.url is required (e.g. http://localhost:9400/metrics)"),
        (["--dcgm-exporter.url", "localhost:9400"], "--dcgm-exporter.url 'localhost:9400' is not"),
        (
            ["--dcgm-exporter.url", "http://a/metrics", "--dcgm-exporter.timeout", "0"],
            "--dcgm-exporter.timeout must be positive",
        ),
    ],
)
def test_bad_flags_raise_value_error(argv, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        DcgmExporterBackend.from_args(_parse(argv))


# --- shared DCGM helpers ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        9223372036854775792,
        9223372036854775794.0,
        2147483632,
        2147483647,
        140737488355328.0,
        "<<<NULL>>>",
        float("nan"),
    ],
)
def test_blank_sentinels(value):
    assert is_blank(value)


@pytest.mark.parametrize("value", [0, 2147483631, 2**31 + 100, 912345678901, 0.5, "3g.40gb"])
def test_real_values_are_not_blank(value):
    assert not is_blank(value)


def test_last_code_tracking_undercounts_repeats():
    tracker = XidTracker()
    gpu = GpuReading(index=0)
    for now, code in enumerate([0, 13, 13, 31, 13, 0, 0]):
        tracker.observe_last_code("gpu0", code, float(now))
    tracker.apply("gpu0", gpu)
    assert gpu.xid_errors == {13: 2.0, 31: 1.0}  # the repeated 13 at t=2 is invisible
    assert gpu.xid_last_timestamp_seconds == 4.0


def test_xid_79_marks_the_gpu_lost():
    tracker = XidTracker()
    gpu = GpuReading(index=0)
    tracker.observe_last_code("g", 79, 1.0)
    tracker.apply("g", gpu)
    assert gpu.lost and not gpu.healthy


def test_fatal_xid_makes_the_gpu_unhealthy_but_not_lost():
    tracker = XidTracker()
    tracker.observe_counts("g", {48: 1.0}, 1.0, cumulative=True)  # the baseline
    tracker.observe_counts("g", {48: 2.0}, 2.0, cumulative=True)
    gpu = GpuReading(index=0)
    tracker.apply("g", gpu)
    assert not gpu.healthy and not gpu.lost
    tracker.observe_last_code("h", 0, 1.0)
    tracker.observe_last_code("h", 13, 2.0)
    benign = GpuReading(index=1)
    tracker.apply("h", benign)
    assert benign.healthy and benign.xid_errors == {13: 1.0}


def test_xid_series_repeated_per_mig_instance_count_once(server):
    base, pages = server

    def page(count: int) -> str:
        return "# TYPE DCGM_EXP_XID_ERRORS_COUNT gauge\n" + "".join(
            f'DCGM_EXP_XID_ERRORS_COUNT{{gpu="0",UUID="GPU-z",GPU_I_PROFILE="1g.10gb",'
            f'GPU_I_ID="{gi}",hostname="n",window_size_in_ms="300000",xid="94"}} {count}\n'
            for gi in (7, 8)
        )

    path = pages.set("/mig-xid", page(1))
    backend = DcgmExporterBackend([base + path], timeout=2.0)
    assert backend.collect().nodes[0].gpus[0].xid_errors == {}  # the baseline
    pages.set(path, page(3))
    assert backend.collect().nodes[0].gpus[0].xid_errors == {94: 2.0}  # not 4: counted once
    backend.close()


def test_a_page_without_gpu_series_is_not_dcgm_exporter(server):
    base, pages = server
    page = "# TYPE node_load1 gauge\nnode_load1 0.5\n"
    url = base + pages.set("/node", page)
    with pytest.raises(BackendUnavailable, match="no per-GPU series") as caught:
        _collect([url])
    assert url in str(caught.value)


# --- bounded answers: one deadline for the whole answer, a cap on its size --------------------


def _fetch_error(answer: Answer, timeout: float = 1.0) -> tuple[str, str, float]:
    """(URL, the one-line error, seconds taken) of fetching a page `answer` serves."""
    with serve_raw(answer) as base:
        url = base + "/metrics"
        started = time.monotonic()
        with pytest.raises(PageUnavailable) as caught:
            fetch_page(url, timeout)
        return url, str(caught.value), time.monotonic() - started


def _page(body: bytes, content_type: str = EXPOSITION, **headers: str) -> bytes:
    """A page with its length (and its type, unless that is empty)."""
    typed = {"Content_Type": content_type} if content_type else {}
    return head(**typed, Content_Length=str(len(body)), **headers) + body


A100 = (FIXTURES / "a100_k8s.prom").read_bytes()


def test_a_page_that_trickles_ends_at_the_timeout_in_one_line():
    """A byte every 0.1 s never trips requests' wait between bytes; the deadline ends it."""
    answer = _page(A100)
    url, error, took = _fetch_error(trickle(answer, 0.1, start=len(answer) - 1000))
    assert error == f"{url}: no complete answer within 1 s"
    assert 0.9 < took < 2.0


def test_trickled_headers_end_at_the_timeout():
    url, error, took = _fetch_error(trickle(_page(A100), 0.1, start=10))
    assert error == f"{url}: no answer within 1 s"
    assert took < 2.0


def test_a_page_read_to_the_close_is_not_taken_whole_when_the_deadline_cuts_it():
    """No Content-Length: the end of the page is the close, which the deadline must not fake."""
    answer = head(Content_Type=EXPOSITION, Connection="close") + A100
    url, error, took = _fetch_error(trickle(answer, 0.1, start=len(answer) - 1000))
    assert error == f"{url}: no complete answer within 1 s"
    assert took < 2.0


def test_an_endless_page_is_refused_at_the_cap(monkeypatch):
    monkeypatch.setattr(page_fetch, "MAX_PAGE_BYTES", 2**20)
    url, error, took = _fetch_error(endless(head(Transfer_Encoding="chunked")), timeout=10)
    assert error == f"{url}: page larger than 1MiB"
    assert took < 5


def test_a_content_length_over_the_cap_is_refused_without_reading():
    """The server sends the head and then nothing: only a refusal at the head ends it early."""
    declared = head(Content_Length=str(page_fetch.MAX_PAGE_BYTES + 1))
    url, error, took = _fetch_error(lambda conn, stop: (conn.sendall(declared), stop.wait(10)), 5)
    assert error == f"{url}: page larger than 64MiB"
    assert took < 1


def test_a_page_of_exactly_the_cap_is_read(monkeypatch):
    monkeypatch.setattr(page_fetch, "MAX_PAGE_BYTES", len(A100))
    with serve_raw(fixed(_page(A100))) as base:
        assert fetch_page(base + "/metrics", 2) == A100.decode()
    monkeypatch.setattr(page_fetch, "MAX_PAGE_BYTES", len(A100) - 1)
    url, error, _ = _fetch_error(fixed(head(Content_Type=EXPOSITION) + A100))
    assert error == f"{url}: page larger than {len(A100) - 1}B"


def test_a_gzip_page_is_read_as_the_plain_one():
    with (
        serve_raw(fixed(_page(A100))) as plain,
        serve_raw(fixed(_page(gzip.compress(A100), Content_Encoding="gzip"))) as zipped,
    ):
        assert fetch_page(zipped + "/metrics", 2) == fetch_page(plain + "/metrics", 2)
        assert _gpus(_collect([zipped + "/metrics"])) == _gpus(_collect([plain + "/metrics"]))


@pytest.mark.parametrize(
    "content_type",
    [EXPOSITION, "text/plain; charset=utf-8", "application/octet-stream", ""],
)
def test_the_text_is_decoded_as_requests_decodes_it(content_type):
    """Charset from Content-Type, text/* without one as ISO-8859-1, else detected: as ever."""
    body = 'gpu_info{gpu="0",model="NVIDIA H100 80GB HBM3 — ünïcode"} 1\n'.encode() * 50
    with serve_raw(fixed(_page(body, content_type))) as base:
        assert fetch_page(base + "/metrics", 2) == requests.get(base + "/metrics", timeout=2).text


def test_a_trickling_target_does_not_stop_the_others(server):
    base, pages = server
    good = base + pages.fixture("a100_k8s.prom")
    with serve_raw(trickle(_page(A100), 0.1, start=100)) as slow_base:
        slow = slow_base + "/metrics"
        backend = DcgmExporterBackend([slow, good], timeout=1.0)
        started = time.monotonic()
        try:
            collection = backend.collect()
        finally:
            backend.close()
        assert time.monotonic() - started < 2.0
    assert [node.node for node in collection.nodes] == ["dgx-a100-07"]
    assert collection.errors == {f"scrape {slow}": 1}
