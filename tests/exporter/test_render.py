import gzip
import shutil
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.contract import BY_NAME, DCGM_COMPAT, DCGM_KINDS, METRICS
from exporter.node_gauges import IdlePolicy, IdleTracker, node_gauges
from exporter.readings import SimClock
from exporter.render import DCGM_SPECS, SelfState, render_page
from tests.exporter import readings_factory

STATE = SelfState(
    version="0.1.0",
    backend="test",
    up=True,
    last_duration_s=0.012,
    last_success_ts=1_700_000_000.0,
    collections=3,
    errors={"nvmlDeviceGetPowerUsage": 2},
    interval_s=15.0,
    skipped_lines={"http://gpu-node-1:9400/metrics": 8},
)


def rendered(dcgm_names: bool = False) -> str:
    collection = readings_factory.collection()
    collection.sim = SimClock("a100-16x8", 42, None, 7200.0, 1_699_992_800.0)
    tracker = IdleTracker(IdlePolicy())
    gauges = [node_gauges(n, tracker, collection.timestamp) for n in collection.nodes]
    page = render_page(collection, gauges, STATE, dcgm_names=dcgm_names)
    assert gzip.decompress(page.gzipped) == page.body
    return page.body.decode()


def samples(text: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def test_every_contract_metric_is_rendered_with_its_labels():
    by_name = samples(rendered())
    for spec in METRICS:
        assert spec.name in by_name, f"{spec.name} missing from the page"
        for sample in by_name[spec.name]:
            assert set(sample.labels) == set(spec.labels), spec.name


def test_values_are_in_base_units():
    by_name = samples(rendered())

    def value(name, **labels):
        matches = [
            s.value for s in by_name[name] if all(s.labels[k] == v for k, v in labels.items())
        ]
        assert len(matches) == 1, (name, labels, matches)
        return matches[0]

    assert value("gpu_memory_total_bytes", node="node-0", gpu="0") == 80 * 2**30
    assert value("gpu_utilization_ratio", node="node-0", gpu="0") == 0.5
    assert value("gpu_xid_errors_total", node="node-0", gpu="0", xid="13") == 2
    assert value("gpu_clock_event_active", node="node-0", gpu="0", reason="sw_power_cap") == 1
    assert value("gpu_clock_event_active", node="node-0", gpu="0", reason="gpu_idle") == 0
    assert value("gpu_info", node="node-0", gpu="3", driver_version="550.54.15") == 1
    assert value("gpu_exporter_collection_errors_total", call="nvmlDeviceGetPowerUsage") == 2
    # 8 GPUs, allocations on 0, 1 and a MIG slice of 7, GPU 6 busy with no holder known: four
    # free, all NVLink-connected, and one in use with its owner unknown
    assert value("gpu_node_free_gpus", node="node-0") == 4
    assert value("gpu_node_owner_unknown_gpus", node="node-0") == 1
    assert value("gpu_node_largest_free_nvlink_group_gpus", node="node-0") == 4


def test_a_lost_gpu_is_rendered_lost_and_not_healthy():
    """NVML's lost flag wins over a health reading taken before the GPU fell off the bus."""
    collection = readings_factory.collection()
    gpu = collection.nodes[0].gpus[3]
    gpu.lost = True
    assert gpu.healthy  # the reading still says healthy: only `lost` may turn the gauge off
    by_name = samples(render_page(collection, [], STATE).body.decode())

    def value(name, gpu):
        (sample,) = [s for s in by_name[name] if s.labels == {"node": "node-0", "gpu": gpu}]
        return sample.value

    assert (value("gpu_lost", "3"), value("gpu_healthy", "3")) == (1, 0)
    assert (value("gpu_lost", "2"), value("gpu_healthy", "2")) == (0, 1)


def test_a_sim_page_says_which_fleet_and_where_its_clock_stands():
    by_name = samples(rendered())
    (info,) = by_name["gpu_sim_info"]
    assert info.labels == {"preset": "a100-16x8", "seed": "42", "nodes": ""}
    assert by_name["gpu_sim_time_seconds"][0].value == 7200.0
    assert by_name["gpu_sim_epoch_timestamp_seconds"][0].value == 1_699_992_800.0
    plain = render_page(readings_factory.collection(), [], STATE).body.decode()
    assert "gpu_sim_" not in plain  # real backends carry no sim clock


def test_absent_values_are_left_out_not_zeroed():
    collection = readings_factory.collection()
    collection.nodes[0].gpus[2].power_watts = None
    page = render_page(collection, [], STATE).body.decode()
    assert 'gpu_power_watts{gpu="2",node="node-0"}' not in page
    assert 'gpu_power_watts{gpu="1",node="node-0"} 350.5' in page
    assert 'gpu_power_watts{gpu="1",node="node-0"}' in page


def test_dcgm_compatible_names_use_dcgm_units():
    by_name = samples(rendered(dcgm_names=True))
    used = [s for s in by_name["DCGM_FI_DEV_FB_USED"] if s.labels["gpu"] == "0"]
    assert used[0].value == pytest.approx(40 * 1024)  # MiB
    util = [s for s in by_name["DCGM_FI_DEV_GPU_UTIL"] if s.labels["gpu"] == "0"]
    assert util[0].value == pytest.approx(50)  # percent
    assert used[0].labels["modelName"] == "NVIDIA H100 80GB HBM3"


def test_contract_names_follow_conventions():
    for spec in METRICS:
        assert spec.name.startswith("gpu_")
        assert (spec.kind == "counter") == spec.name.endswith("_total"), spec.name
        assert (spec.kind == "info") == spec.name.endswith("_info"), spec.name
        assert "percent" not in spec.name and "_mb" not in spec.name
        # target labels: Prometheus would rename ours to exported_job / exported_instance
        assert not {"job", "instance"} & set(spec.labels), spec.name
    assert len(BY_NAME) == len(METRICS)


@pytest.mark.integration
def test_promtool_check_metrics_accepts_the_page(tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not installed: run `make system` (Debian package prometheus)")
    result = subprocess.run(
        [promtool, "check", "metrics"],
        input=rendered(dcgm_names=False),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_page_is_byte_identical_to_prometheus_client(tmp_path):
    """Our direct renderer must write exactly what the library writes for the same samples."""
    from prometheus_client.exposition import generate_latest
    from prometheus_client.registry import CollectorRegistry

    from exporter.render import collect_families

    collection = readings_factory.collection()
    node = collection.nodes[0]
    node.gpus[0].processes[0].name = 'we"ird\\name\nwith newline'  # escaping
    node.gpus[1].energy_joules = float("inf")  # Go-style +Inf
    node.gpus[2].memory_total_bytes = 123456789.0  # Go-style exponent
    families = collect_families(collection, [], STATE, dcgm_names=True)
    # dcgm-exporter's series are written its way (counters without `_total`, no `label=""`),
    # which the library cannot write: `test_dcgm_compatible_series_*` check them.
    bare = set(DCGM_SPECS)

    class Static:
        def collect(self):
            return [family for family in families.metric_families() if family.name not in bare]

        def describe(self):
            return []

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Static())
    blocks = families.text().split("# HELP ")[1:]
    ours = "".join(f"# HELP {b}" for b in blocks if b.split(" ", 1)[0] not in bare)
    assert ours.encode() == generate_latest(registry)


def test_dcgm_compatible_series_keep_their_metric_kind():
    """dcgm-exporter types energy and PCIe replays as counters; so must our compat output."""
    text = rendered(dcgm_names=True)
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n" in text
    assert "# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER counter\n" in text
    assert "# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n" in text
    assert "\nDCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{" in text  # DCGM's name, no `_total` added
    for name, (ours, _factor) in DCGM_COMPAT.items():
        kind = "counter" if BY_NAME[ours].kind == "counter" else "gauge"
        kind = DCGM_KINDS.get(name, kind)  # dcgm-exporter's type where it differs from ours
        if f"# TYPE {name} " in text:
            assert f"# TYPE {name} {kind}\n" in text, name
    assert "# TYPE DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL counter\n" in text
    by_name = samples(text)  # the parser reads the bare counter names back
    assert by_name["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total"][0].value == pytest.approx(1.25e12)


def test_dcgm_compatible_sm_activity_and_graphics_engine_activity_are_each_their_own():
    by_name = samples(rendered(dcgm_names=True))

    def at_gpu0(name: str) -> float:
        (sample,) = [s for s in by_name[name] if s.labels["gpu"] == "0"]
        return sample.value

    assert at_gpu0("DCGM_FI_PROF_SM_ACTIVE") == at_gpu0("gpu_sm_active_ratio")
    assert at_gpu0("DCGM_FI_PROF_GR_ENGINE_ACTIVE") == at_gpu0("gpu_graphics_engine_active_ratio")


def test_text_cache_reuses_unchanged_families_and_tracks_changes():
    from exporter.render import collect_families

    cache: dict = {}
    first = readings_factory.collection()
    families = collect_families(first, [], STATE)
    cold = families.text(cache)
    assert cold == collect_families(first, [], STATE).text()
    static, changed = cache["gpu_topology_link_info"][1], cache["gpu_utilization_ratio"][1]
    second = readings_factory.collection()
    second.nodes[0].gpus[0].utilization_ratio = 0.99  # one value changes
    warm = collect_families(second, [], STATE).text(cache)
    assert warm == collect_families(second, [], STATE).text()  # same as an uncached render
    assert 'gpu_utilization_ratio{gpu="0",node="node-0"} 0.99' in warm
    assert static in cold
    assert cache["gpu_topology_link_info"][1] is static  # the static chunk was reused, not redone
    assert cache["gpu_utilization_ratio"][1] is not changed  # the changed family was re-rendered


def test_a_process_names_its_mig_instance_so_it_joins_the_instances_series():
    by_name = samples(rendered())
    processes = {
        (s.labels["gpu"], s.labels["pid"]): s.labels["gpu_instance_id"]
        for s in by_name["gpu_process_memory_used_bytes"]
    }
    assert processes[("7", "4444")] == "3"  # on the MIG GPU, in GPU instance 3
    assert processes[("0", "4242")] == ""  # a whole GPU: no instance
    instances = {s.labels["gpu_instance_id"] for s in by_name["gpu_mig_memory_used_bytes"]}
    assert "3" in instances
