"""`--compat.dcgm-names` against a real Prometheus: NVIDIA's stock dashboard and every default
counter of dcgm-exporter return series when Prometheus scrapes our exporter instead.

Debian's Prometheus scrapes, on 127.0.0.1, two of our exporters on the NVML backend driven by
the faithful pynvml fake (CI has no GPU), with the kubelet's pod-resources API served by a real
gRPC server on a unix socket:
- an HGX H100 node: GPU 0 in MIG mode (a busy 3g.40gb instance held by a pod, an idle one),
  GPU 1 busy with NVLink traffic and held by a pod, GPU 2 with a remapped row, an XID and a
  recovery action, GPU 3 idle;
- a vGPU guest VM with one GPU: the only place DCGM_FI_DEV_VGPU_LICENSE_STATUS applies.
What dcgm-exporter writes is its own: the queries of its dashboard and its default counters are
copied from NVIDIA/dcgm-exporter into tests/fixtures/dcgm_exporter/ (the README there).
"""

from __future__ import annotations

import json
import re
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from exporter.attribution.combined import CombinedAttribution
from exporter.attribution.podresources import PodResourcesSource
from exporter.backends.nvml import NvmlBackend
from exporter.collector import CollectorLoop
from exporter.readings import Collection
from gpu_defrag_common.server import ExporterServer
from gpu_defrag_common.webconfig import load_web_config
from tests.exporter.test_attribution import FakeKubelet, pod
from tests.fakes.fake_pynvml import MIB, FakeGpu, FakeMig, FakeNvml, FakeProcess, hgx_h100
from tests.integration import stack

pytestmark = pytest.mark.integration
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dcgm_exporter"


def default_counters() -> dict[str, str]:
    rows = (FIXTURES / "default_counters.csv").read_text().splitlines()
    return dict(line.split(",") for line in rows if line and not line.startswith("#"))


def nvidia_dashboard() -> dict:
    return json.loads((FIXTURES / "nvidia_dashboard_queries.json").read_text())


def hgx_node() -> FakeNvml:
    fake = hgx_h100(4)
    mig, busy, faulty, _idle = fake.gpus
    mig.mig_enabled = True
    mig.migs = [
        FakeMig(1, 0, "3g.40gb", 3, 40192 * MIB, 30000 * MIB, 80.0, 99.6, 61.0, 47.0),
        FakeMig(2, 0, "3g.40gb", 3, 40192 * MIB, 0, 0.0, 0.0, 0.0, 0.0),
    ]
    busy.util_gpu, busy.memory_used = 85, 60 * 1024 * MIB
    busy.gpm = {
        pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: 88.0,
        pynvml.NVML_GPM_METRIC_SM_UTIL: 80.0,
        pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 52.0,
        pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 40.0,
    }
    busy.nvlink_kib_per_s = 50 * 1024 * 1024
    busy.pcie_tx_kbs, busy.pcie_rx_kbs = 900_000, 1_200_000
    busy.processes = [FakeProcess(4242, "python train.py", 60 * 1024 * MIB)]
    faulty.remap_correctable = 1
    faulty.recovery_action = 1
    return fake


def vgpu_guest() -> FakeNvml:
    gpu = FakeGpu(0, name="NVIDIA A100-SXM4-40GB", memory_total=40960 * MIB)
    gpu.virtualization_mode = pynvml.NVML_GPU_VIRTUALIZATION_MODE_VGPU
    return FakeNvml([gpu])


class Advancing(NvmlBackend):
    """Lets a second of the fake machine's time pass before each collection, as a real GPU's
    counters and GPM samples move between two collections."""

    def __init__(self, fake: FakeNvml, node: str, **kwargs: object) -> None:
        super().__init__(node, nvml_module=fake, **kwargs)
        self.fake = fake

    def collect(self) -> Collection:
        self.fake.advance(1.0)
        return super().collect()


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory) -> Iterator[tuple[str, FakeNvml]]:
    workdir = tmp_path_factory.mktemp("dcgm-compat")
    procs = stack.Processes(workdir)
    kubelet = FakeKubelet(workdir / "kubelet.sock")
    node, guest = hgx_node(), vgpu_guest()
    kubelet.set_pods(
        pod("train-0", "rnd", ("main", [("nvidia.com/gpu", [node.gpus[1].uuid])])),
        pod("infer-0", "prod", ("srv", [("nvidia.com/mig-3g.40gb", [node.gpus[0].migs[0].uuid])])),
    )
    attribution = CombinedAttribution(
        pod_resources=PodResourcesSource(str(workdir / "kubelet.sock"))
    )
    attribution.refresh()
    loops, servers = [], []
    try:
        for name, fake, extra in (
            ("hgx-h100-01", node, {"attribution": attribution}),
            ("vgpu-vm-07", guest, {}),
        ):
            backend = Advancing(fake, name, pcie_interval=0.5, xid_wait_ms=50, **extra)
            loop = CollectorLoop(backend, interval_s=1.0, dcgm_names=True)
            server = ExporterServer("127.0.0.1:0", loop, load_web_config(None)).start()
            loop.start()
            loops.append(loop)
            servers.append(server)
        targets = [f"127.0.0.1:{server.port}" for server in servers]
        url = stack.start_prometheus(procs, {"gpu-exporter": targets}, [])
        threading.Timer(2.0, node.push_xid, args=(2, 13)).start()  # after the watcher is up
        yield url, node
    finally:
        for server in servers:
            server.close()
        for loop in loops:
            loop.stop()
        procs.stop_all()
        kubelet.server.stop(0)


def has_series(url: str, expr: str) -> bool:
    return bool(stack.query(url, expr))


def wait_for(url: str, exprs: list[str], timeout: float = 60.0) -> None:
    """Poll until every expression returns series; fail naming the ones that still do not."""
    missing: list[str] = list(exprs)

    def done() -> bool:
        missing[:] = [expr for expr in exprs if not has_series(url, expr)]
        return not missing

    try:
        stack.poll(done, timeout, "the dcgm-exporter compatible series")
    except pytest.fail.Exception:
        pytest.fail(f"no series for: {missing}")


def label_values(url: str, query: str) -> list[str]:
    """Grafana's label_values(metric, label), through Prometheus' series API."""
    match = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", query)
    assert match, query
    metric, label = match.groups()
    params = urllib.parse.urlencode({"match[]": metric})
    return sorted({s[label] for s in stack.api(url, f"/api/v1/series?{params}") if label in s})


def test_every_query_of_nvidia_stock_dashboard_returns_series(prometheus):
    url, _ = prometheus
    dashboard = nvidia_dashboard()
    both = "count(count by (instance) (DCGM_FI_DEV_GPU_TEMP)) == 2"  # both targets scraped
    wait_for(url, [both, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_DEV_GPU_UTIL"])
    chosen: dict[str, str] = {}
    for variable in dashboard["variables"]:
        values = label_values(url, variable["query"])
        assert values, f"${variable['name']} ({variable['query']}) has no values"
        chosen[variable["name"]] = "|".join(values)  # Grafana's "All" of a multi-value variable
    assert len(chosen["instance"].split("|")) == 2 and "3" in chosen["gpu"].split("|")
    for panel in dashboard["panels"]:
        expr = panel["expr"]
        for name, value in chosen.items():
            expr = expr.replace(f"${name}", value)
        assert has_series(url, expr), f"{panel['title']}: {expr} returned no series"


def test_every_default_counter_returns_series(prometheus):
    url, _ = prometheus
    counters = default_counters()
    fields = [name for name, kind in counters.items() if kind != "label"]
    wait_for(url, fields)
    labels = [name for name, kind in counters.items() if kind == "label"]
    for label in labels:  # a `label` row is a label on every GPU series
        assert has_series(url, f'DCGM_FI_DEV_GPU_TEMP{{{label}!=""}}')
        assert not has_series(url, f'DCGM_FI_DEV_GPU_TEMP{{{label}=""}}')


def test_mig_instances_pods_xid_and_license_as_dcgm_exporter_labels_them(prometheus):
    url, node = prometheus
    mig_engine = 'DCGM_FI_PROF_GR_ENGINE_ACTIVE{GPU_I_ID="1", GPU_I_PROFILE="3g.40gb"} > 0.9'
    wait_for(
        url,
        [
            mig_engine,
            'DCGM_FI_DEV_FB_USED{GPU_I_ID="2", GPU_I_PROFILE="3g.40gb"}',
            'DCGM_FI_DEV_GPU_UTIL{pod="train-0", namespace="rnd", container="main", gpu="1"}',
            'DCGM_FI_PROF_GR_ENGINE_ACTIVE{pod="infer-0", namespace="prod", GPU_I_ID="1"}',
            'DCGM_FI_DEV_XID_ERRORS{gpu="2", err_code="13"} == 13',
            'DCGM_FI_DEV_VGPU_LICENSE_STATUS{Hostname="vgpu-vm-07"} == 1',
            "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL > 0",
        ],
    )
    # an idle GPU carries no pod labels; the license applies to the vGPU guest only
    assert not has_series(url, 'DCGM_FI_DEV_GPU_UTIL{gpu="3", pod!=""}')
    assert not has_series(url, 'DCGM_FI_DEV_VGPU_LICENSE_STATUS{Hostname="hgx-h100-01"}')
    # device-wide fields stay one series per GPU, the MIG GPU's included: sums count it once
    power = stack.query(url, 'count by (gpu) (DCGM_FI_DEV_POWER_USAGE{Hostname="hgx-h100-01"})')
    assert {r["metric"]["gpu"]: r["value"][1] for r in power} == {str(i): "1" for i in range(4)}
    assert has_series(url, 'gpu_recovery_action{gpu="2"} == 1')
    assert node.gpus[0].mig_enabled
