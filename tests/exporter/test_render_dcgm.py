"""`--compat.dcgm-names`: the series dcgm-exporter writes, under its names, units and labels.

The list of what dcgm-exporter writes by default is its own (`etc/default-counters.csv`, the
enabled rows in tests/fixtures/dcgm_exporter/default_counters.csv); the live check against a
real Prometheus evaluating NVIDIA's dashboard is tests/integration/test_dcgm_compat_prometheus.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.render import DCGM_SPECS, SelfState, render_page
from tests.exporter import readings_factory

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dcgm_exporter"
STATE = SelfState("0.1.0", "test", True, 0.01, 1.7e9, 1, {})


def default_counters() -> dict[str, str]:
    """dcgm-exporter's enabled default counters: field -> type (`label` for a label row)."""
    rows = (FIXTURES / "default_counters.csv").read_text().splitlines()
    return dict(line.split(",") for line in rows if line and not line.startswith("#"))


def page(collection=None) -> str:
    collection = collection or readings_factory.collection()
    return render_page(collection, [], STATE, dcgm_names=True).body.decode()


def dcgm_samples(text: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("DCGM_"):
                name = sample.name.removesuffix("_total")  # the parser adds it to counters
                out.setdefault(name, []).append(sample)
    return out


def test_every_default_counter_is_written_with_dcgm_exporters_type():
    text = page()
    by_name = dcgm_samples(text)
    for field, kind in default_counters().items():
        if kind == "label":
            assert all(field in s.labels for samples in by_name.values() for s in samples)
            continue
        assert field in by_name, f"{field} of the default counters is not written"
        assert f"# TYPE {field} {kind}\n" in text, field
        assert field in DCGM_SPECS


def test_no_label_is_written_empty():
    """A label nobody knows is left out, as dcgm-exporter leaves out the ones that do not
    apply: `pci_bus_id=""` would be a series no dcgm-exporter query expects."""
    collection = readings_factory.collection()
    collection.nodes[0].gpus[2].pci_bus_id = ""
    text = page(collection)
    lines = [line for line in text.splitlines() if line.startswith("DCGM_")]
    assert lines and not [line for line in lines if '=""' in line]
    gpu2 = [s for s in dcgm_samples(text)["DCGM_FI_DEV_GPU_TEMP"] if s.labels["gpu"] == "2"]
    assert "pci_bus_id" not in gpu2[0].labels
    gpu1 = [s for s in dcgm_samples(text)["DCGM_FI_DEV_GPU_TEMP"] if s.labels["gpu"] == "1"]
    assert gpu1[0].labels["pci_bus_id"] == "00000000:19:00.0"


def test_pod_labels_are_those_of_the_one_pod_holding_the_gpu():
    by_name = dcgm_samples(page())
    temps = {s.labels["gpu"]: s.labels for s in by_name["DCGM_FI_DEV_GPU_TEMP"]}
    assert (temps["0"]["pod"], temps["0"]["namespace"], temps["0"]["container"]) == (
        "train-0",
        "rnd",
        "trainer",
    )
    assert temps["1"]["pod"] == "idle-1" and "container" in temps["1"]
    assert "pod" not in temps["3"]  # nobody holds GPU 3


def test_a_gpu_shared_by_several_pods_names_none_of_them():
    collection = readings_factory.collection()
    node = collection.nodes[0]
    node.allocations.append(type(node.allocations[0])(gpu=0, pod="other", namespace="rnd"))
    temps = {
        s.labels["gpu"]: s.labels for s in dcgm_samples(page(collection))["DCGM_FI_DEV_GPU_TEMP"]
    }
    assert "pod" not in temps["0"]


def test_mig_instances_get_series_of_their_own_with_gpu_i_labels():
    by_name = dcgm_samples(page())
    used = [s for s in by_name["DCGM_FI_DEV_FB_USED"] if s.labels["gpu"] == "7"]
    assert {s.labels["GPU_I_ID"] for s in used} == {str(gi) for gi in range(7)}
    assert {s.labels["GPU_I_PROFILE"] for s in used} == {"1g.10gb"}
    by_gi = {s.labels["GPU_I_ID"]: s for s in used}
    assert by_gi["3"].value == pytest.approx(1024)  # MiB
    assert by_gi["3"].labels["pod"] == "infer" and "pod" not in by_gi["2"].labels
    engine = {
        s.labels["GPU_I_ID"]: s.value
        for s in by_name["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]
        if s.labels["gpu"] == "7"
    }
    assert engine["3"] == pytest.approx(0.35) and engine["0"] == 0.0
    # device-wide fields stay one series per GPU: a sum over them counts the GPU once
    temps = [s for s in by_name["DCGM_FI_DEV_GPU_TEMP"] if s.labels["gpu"] == "7"]
    assert len(temps) == 1 and "GPU_I_ID" not in temps[0].labels
    # and a GPU-wide framebuffer series would count the instances' memory twice
    assert all("GPU_I_ID" in s.labels for s in used)


def test_xid_errors_is_the_last_code_with_its_err_code_label():
    by_name = dcgm_samples(page())
    (xid,) = [s for s in by_name["DCGM_FI_DEV_XID_ERRORS"] if s.labels["gpu"] == "0"]
    assert xid.value == 31 and xid.labels["err_code"] == "31"


def test_row_remap_and_nvlink_and_license_in_dcgm_units():
    by_name = dcgm_samples(page())

    def at_gpu0(name: str) -> float:
        (sample,) = [s for s in by_name[name] if s.labels["gpu"] == "0"]
        return sample.value

    assert at_gpu0("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS") == 1
    assert at_gpu0("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS") == 0
    assert at_gpu0("DCGM_FI_DEV_ROW_REMAP_FAILURE") == 0
    assert at_gpu0("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL") == pytest.approx(5.0e10 / 2**20)
    assert at_gpu0("DCGM_FI_DEV_VGPU_LICENSE_STATUS") == 1


def test_vgpu_license_status_only_where_it_applies():
    collection = readings_factory.collection()
    for gpu in collection.nodes[0].gpus:
        gpu.vgpu_licensed = None  # bare metal: no vGPU license to hold
    assert "DCGM_FI_DEV_VGPU_LICENSE_STATUS" not in dcgm_samples(page(collection))
