"""Attribution: kubelet PodResources over a real unix-socket gRPC server, cgroups, Slurm mapping."""

from __future__ import annotations

import argparse
import logging
import socket
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from exporter.attribution.base import Owner
from exporter.attribution.cgroups import CgroupAttribution, CgroupInfo, parse_cgroup
from exporter.attribution.combined import CombinedAttribution, add_arguments, build_attribution
from exporter.attribution.podresources import (
    ListPodResourcesResponse,
    PodResourcesSource,
    parse_device_id,
    resolve_device,
)
from exporter.attribution.slurm import SlurmJobMapping
from exporter.readings import Allocation

UUID0 = "GPU-11111111-2222-3333-4444-555555555500"
UUID1 = "GPU-11111111-2222-3333-4444-555555555501"
UUID2 = "GPU-11111111-2222-3333-4444-555555555502"
MIG_UUID = "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
GPUS = {UUID0: 0, UUID1: 1, UUID2: 2}
POD_UID = "0d3f9a52-6b1c-4a8e-9f2d-7c5e8b1a2c3d"
CID = "a" * 64


def pod(name: str, namespace: str, *containers: tuple[str, list[tuple[str, list[str]]]]) -> dict:
    return {
        "name": name,
        "namespace": namespace,
        "containers": [
            {
                "name": cname,
                "devices": [{"resource_name": r, "device_ids": ids} for r, ids in devices],
                "cpu_ids": [1, 2],
            }
            for cname, devices in containers
        ],
    }


class FakeKubelet:
    """PodResourcesLister.List on a unix socket; counts calls, can be told to fail."""

    def __init__(self, socket_path: Path) -> None:
        self.reply = ListPodResourcesResponse()
        self.calls = 0
        self.fail = False
        self._lock = threading.Lock()
        handler = grpc.method_handlers_generic_handler(
            "v1.PodResourcesLister",
            {
                "List": grpc.unary_unary_rpc_method_handler(
                    self._list,
                    request_deserializer=lambda data: data,
                    response_serializer=lambda message: message.SerializeToString(),
                )
            },
        )
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=2),
            options=[("grpc.max_send_message_length", 64 * 1024 * 1024)],
        )
        self.server.add_generic_rpc_handlers((handler,))
        self.server.add_insecure_port(f"unix:{socket_path}")
        self.server.start()

    def set_pods(self, *pods: dict) -> None:
        self.reply = ListPodResourcesResponse(pod_resources=list(pods))

    def _list(self, request: bytes, context: grpc.ServicerContext):
        with self._lock:
            self.calls += 1
        if self.fail:
            context.abort(grpc.StatusCode.UNAVAILABLE, "kubelet restarting")
        return self.reply


@pytest.fixture
def kubelet(tmp_path: Path):
    socket_path = tmp_path / "kubelet.sock"
    fake = FakeKubelet(socket_path)
    fake.socket_path = str(socket_path)
    yield fake
    fake.server.stop(0)


# --- wire format: field numbers checked against the upstream schema, independently of our .proto


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _ld(field: int, payload: bytes | str) -> bytes:
    data = payload.encode() if isinstance(payload, str) else payload
    return _varint(field << 3 | 2) + _varint(len(data)) + data


def test_hand_encoded_kubelet_reply_decodes() -> None:
    # ContainerDevices{resource_name=1, device_ids=2}, ContainerResources{name=1, devices=2},
    # PodResources{name=1, namespace=2, containers=3}, ListPodResourcesResponse{pod_resources=1}
    devices = _ld(1, "nvidia.com/gpu") + _ld(2, UUID1) + _ld(2, UUID2)
    container = _ld(1, "trainer") + _ld(2, devices) + _ld(3, _varint(4) + _varint(5))
    pod_bytes = _ld(1, "job-0") + _ld(2, "team-a") + _ld(3, container)
    reply = ListPodResourcesResponse.FromString(_ld(1, pod_bytes))
    decoded = reply.pod_resources[0]
    assert (decoded.name, decoded.namespace) == ("job-0", "team-a")
    assert decoded.containers[0].name == "trainer"
    assert list(decoded.containers[0].cpu_ids) == [4, 5]  # packed repeated int64, field 3
    assert list(decoded.containers[0].devices[0].device_ids) == [UUID1, UUID2]


# --- device ids


@pytest.mark.parametrize(
    ("device_id", "expected"),
    [
        (UUID1, (1, None)),
        (UUID1 + "::3", (1, None)),  # time-slicing replica
        (UUID1.lower().replace("gpu-", "GPU-"), (1, None)),
        (f"MIG-{UUID2}/5/0", (2, 5)),  # legacy MIG id: parent uuid / gi / ci
        (MIG_UUID, (1, 3)),  # resolved through mig_by_uuid
        (MIG_UUID + "::1", (1, 3)),
        ("nvidia0", (0, None)),
        ("nvidia2/gi1", (2, 1)),  # GKE MIG
        ("nvidia2/gi1/vgpu0", (2, 1)),  # GKE MIG + time-sharing
        ("nvidia1/vgpu3", (1, None)),  # GKE time-sharing
        ("nvidia7", None),  # no such GPU here
        ("GPU-99999999-2222-3333-4444-555555555500", None),  # another node's GPU
        ("0000:3b:00.0", None),  # not a form we know
    ],
)
def test_device_ids_resolve(device_id: str, expected: tuple[int, int | None] | None) -> None:
    ref = parse_device_id(device_id)
    got = None if ref is None else resolve_device(ref, GPUS, {MIG_UUID: (1, 3)})
    assert got == expected


def test_mig_uuid_without_instance_map_falls_back_to_parent() -> None:
    ref = parse_device_id(MIG_UUID)
    assert ref is not None
    assert resolve_device(ref, {**GPUS, MIG_UUID: 1}) == (1, None)
    assert resolve_device(ref, GPUS) is None


# --- PodResources client against a real gRPC server


def test_list_over_unix_socket(kubelet: FakeKubelet) -> None:
    kubelet.set_pods(
        pod("train-0", "team-a", ("main", [("nvidia.com/gpu", [UUID0, UUID1])])),
        pod("infer", "team-b", ("srv", [("nvidia.com/mig-1g.10gb", [f"MIG-{UUID2}/3/0"])])),
        pod(
            "shared",
            "team-c",
            ("a", [("nvidia.com/gpu", [UUID2 + "::0", UUID2 + "::1"])]),  # two replicas, one GPU
            ("b", [("example.com/fpga", ["fpga0"]), ("nvidia.com/gpu.shared", [UUID2 + "::2"])]),
        ),
        pod("nic", "net", ("c", [("example.com/sriov", [UUID1])])),  # not a GPU resource
        pod("custom", "team-d", ("x", [("acme.io/gpu", ["nvidia1"])])),
    )
    source = PodResourcesSource(kubelet.socket_path, extra_resource_names=["acme.io/gpu"])
    source.refresh()
    assert kubelet.calls == 1
    assert source.allocations(GPUS) == [
        Allocation(gpu=0, pod="train-0", namespace="team-a", container="main", tenant="team-a"),
        Allocation(gpu=1, pod="train-0", namespace="team-a", container="main", tenant="team-a"),
        Allocation(
            gpu=2,
            pod="infer",
            namespace="team-b",
            container="srv",
            tenant="team-b",
            gpu_instance_id=3,
        ),
        Allocation(gpu=2, pod="shared", namespace="team-c", container="a", tenant="team-c"),
        Allocation(gpu=2, pod="shared", namespace="team-c", container="b", tenant="team-c"),
        Allocation(gpu=1, pod="custom", namespace="team-d", container="x", tenant="team-d"),
    ]
    assert not source.errors
    # lookups are answered from the cache
    for _ in range(100):
        source.allocations(GPUS)
    assert kubelet.calls == 1


def _big_reply(kubelet: FakeKubelet) -> None:
    padding = [f"nic-{i:06d}-" + "x" * 90 for i in range(50_000)]
    kubelet.set_pods(
        pod("train-0", "team-a", ("main", [("nvidia.com/gpu", [UUID0])])),
        pod("bulk", "infra", ("c", [("example.com/sriov", padding)])),
    )
    assert kubelet.reply.ByteSize() > 4 * 1024 * 1024


def test_reply_above_grpc_default_limit_is_accepted(kubelet: FakeKubelet) -> None:
    _big_reply(kubelet)
    source = PodResourcesSource(kubelet.socket_path)
    source.refresh()
    assert not source.errors
    assert [(a.gpu, a.pod) for a in source.allocations(GPUS)] == [(0, "train-0")]
    # the same reply fails at gRPC's 4 MiB default, so the test really crosses the limit
    strict = PodResourcesSource(kubelet.socket_path, max_receive_bytes=4 * 1024 * 1024)
    strict.refresh()
    assert strict.errors["podresources_list"] == 1


def test_server_error_keeps_last_good_mapping(
    kubelet: FakeKubelet, caplog: pytest.LogCaptureFixture
) -> None:
    kubelet.set_pods(pod("train-0", "team-a", ("main", [("nvidia.com/gpu", [UUID1])])))
    source = PodResourcesSource(kubelet.socket_path)
    source.refresh()
    before = source.allocations(GPUS)
    assert [a.pod for a in before] == ["train-0"]
    kubelet.fail = True
    with caplog.at_level(logging.WARNING, logger="exporter.attribution.podresources"):
        source.refresh()
        source.refresh()
    assert source.errors["podresources_list"] == 2
    assert source.allocations(GPUS) == before
    failures = [r for r in caplog.records if "List failed" in r.getMessage()]
    assert len(failures) == 1 and "UNAVAILABLE" in failures[0].getMessage()
    kubelet.fail = False
    kubelet.set_pods()
    source.refresh()
    assert source.allocations(GPUS) == []  # a good empty reply does replace the mapping


def test_missing_socket_is_quiet(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    source = PodResourcesSource(str(tmp_path / "absent.sock"))
    with caplog.at_level(logging.INFO, logger="exporter.attribution.podresources"):
        source.refresh()
        source.refresh()
    assert source.allocations(GPUS) == []
    assert not source.errors
    assert len([r for r in caplog.records if "not found" in r.getMessage()]) == 1


def test_stale_socket_file_counts_an_error_quickly(tmp_path: Path) -> None:
    path = tmp_path / "stale.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.close()  # the file stays, nobody listens: a kubelet that died
    source = PodResourcesSource(str(path), timeout_s=5.0)
    started = time.monotonic()
    source.refresh()
    assert source.errors["podresources_list"] == 1
    assert time.monotonic() - started < 4.0


# --- cgroups


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (  # cgroup v2, systemd driver, containerd
            "0::/kubepods.slice/kubepods-burstable.slice/"
            f"kubepods-burstable-pod{POD_UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n",
            CgroupInfo(pod_uid=POD_UID, container_id=CID),
        ),
        (  # cgroup v1, cgroupfs driver, besteffort; first lines carry no pod
            f"12:rdma:/\n11:memory:/kubepods/besteffort/pod{POD_UID}/{CID}\n",
            CgroupInfo(pod_uid=POD_UID, container_id=CID),
        ),
        (  # guaranteed QoS, docker, systemd driver
            f"4:cpu,cpuacct:/kubepods.slice/kubepods-pod{POD_UID.replace('-', '_')}.slice/"
            f"docker-{CID}.scope\n",
            CgroupInfo(pod_uid=POD_UID, container_id=CID),
        ),
        (  # CRI-O, with a kind-style kubelet.slice prefix
            "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
            f"kubelet-kubepods-besteffort-pod{POD_UID.replace('-', '_')}.slice/crio-{CID}.scope\n",
            CgroupInfo(pod_uid=POD_UID, container_id=CID),
        ),
        (  # CRI-O conmon: the pod, not a container
            f"0::/kubepods.slice/kubepods-pod{POD_UID.replace('-', '_')}.slice/"
            f"crio-conmon-{CID}.scope\n",
            CgroupInfo(pod_uid=POD_UID),
        ),
        (  # static pod: uid is a 32-hex config hash
            "0::/kubepods/burstable/pod6d5f2f0b3c4c3a6e0c0f1e2d3a4b5c6d/" + CID + "\n",
            CgroupInfo(pod_uid="6d5f2f0b3c4c3a6e0c0f1e2d3a4b5c6d", container_id=CID),
        ),
        (  # private cgroup namespace: host paths outside it show up as /../..
            "0::/../../kubepods-besteffort.slice/"
            f"kubepods-besteffort-pod{POD_UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n",
            CgroupInfo(pod_uid=POD_UID, container_id=CID),
        ),
        ("7:devices:/slurm/uid_1000/job_4242/step_0/task_1\n", CgroupInfo(slurm_job="4242")),
        (
            "0::/system.slice/slurmstepd.scope/job_977/step_batch/user/task_0\n",
            CgroupInfo(slurm_job="977"),
        ),
        ("0::/system.slice/slurm-5150.scope\n", CgroupInfo(slurm_job="5150")),
        ("0::/user.slice/user-1000.slice/session-3.scope\n", CgroupInfo()),
        ("0::/system.slice/job_12.service\n", CgroupInfo()),  # job_ outside Slurm is not a job
    ],
)
def test_parse_cgroup(text: str, expected: CgroupInfo) -> None:
    assert parse_cgroup(text) == expected


def _proc(root: Path, pid: int, cgroup: str, start: int = 1000, environ: bytes = b"") -> None:
    d = root / "proc" / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "cgroup").write_text(cgroup)
    (d / "stat").write_text(
        f"{pid} (python3 (x) y) S 1 {pid} {pid} 0 -1 4194560 " + "0 " * 12 + f"{start} 0\n"
    )
    (d / "environ").write_bytes(environ)


@pytest.fixture
def host(tmp_path: Path) -> Path:
    pods = tmp_path / "log" / "pods"
    (pods / f"team-a_train-0_{POD_UID}" / "main").mkdir(parents=True)
    (pods / "kube-system_not-a-pod-dir").mkdir()
    containers = tmp_path / "log" / "containers"
    containers.mkdir()
    (containers / f"train-0_team-a_main-{CID}.log").write_text("")
    (tmp_path / "proc" / "2").mkdir(parents=True)
    (tmp_path / "proc" / "2" / "comm").write_text("kthreadd\n")  # the host PID namespace
    _proc(tmp_path, 100, f"0::/kubepods/besteffort/pod{POD_UID}/{CID}\n")
    _proc(tmp_path, 200, "0::/system.slice/slurmstepd.scope/job_977/step_0/user/task_0\n")
    _proc(tmp_path, 300, "0::/user.slice/session-1.scope\n", environ=b"HOME=/\0SLURM_JOB_ID=31\0")
    _proc(tmp_path, 400, "0::/user.slice/session-1.scope\n", environ=b"HOME=/\0")
    return tmp_path


def _cgroups(host: Path, **kw) -> CgroupAttribution:
    return CgroupAttribution(str(host / "proc"), pod_logs_dir=str(host / "log" / "pods"), **kw)


def test_process_owner_from_cache_after_background_resolution(host: Path) -> None:
    cg = _cgroups(host)
    woken = []
    cg.on_miss = lambda: woken.append(1)
    cg.refresh()
    assert [cg.process_owner(pid) for pid in (100, 200, 300, 400)] == [None] * 4  # misses
    assert len(woken) == 4
    assert cg.resolve_pending() == 4
    assert cg.process_owner(100) == Owner(pod="train-0", namespace="team-a", container="main")
    assert cg.process_owner(200) == Owner(slurm_job="977")
    assert cg.process_owner(300) == Owner(slurm_job="31")  # from SLURM_JOB_ID in environ
    assert cg.process_owner(400) is None
    assert len(woken) == 4  # hits, including the cached "no owner", do not wake anything
    assert cg.resolve_pending() == 0


def test_pod_name_appears_when_log_dir_does(host: Path, tmp_path: Path) -> None:
    other_uid = "9e8d7c6b-5a49-4382-a1b0-c9d8e7f6a5b4"
    _proc(tmp_path, 500, f"0::/kubepods/pod{other_uid}/{'b' * 64}\n")
    cg = _cgroups(host)
    cg.process_owner(500)
    cg.refresh()
    assert cg.process_owner(500) is None  # uid known, name not yet
    (host / "log" / "pods" / f"team-b_late_{other_uid}").mkdir()
    cg.refresh()
    assert cg.process_owner(500) == Owner(pod="late", namespace="team-b")


def test_exited_and_reused_pids_are_evicted(host: Path, tmp_path: Path) -> None:
    cg = _cgroups(host)
    for pid in (100, 200):
        cg.process_owner(pid)
    cg.refresh()
    assert cg.process_owner(100) is not None and cg.process_owner(200) is not None
    for name in ("cgroup", "stat", "environ"):
        (tmp_path / "proc" / "200" / name).unlink()
    _proc(tmp_path, 100, "0::/user.slice/session-9.scope\n", start=2000)  # PID reused
    cg.refresh()
    assert len(cg) == 0
    assert cg.process_owner(100) is None  # a miss again, then the new process's answer
    cg.resolve_pending()
    assert len(cg) == 1 and cg.process_owner(100) is None


def test_cache_is_bounded(host: Path) -> None:
    cg = _cgroups(host, max_entries=2)
    cg.refresh()  # pod names
    for pid in (100, 200, 300):
        cg.process_owner(pid)
    assert cg.resolve_pending() == 2  # the queue is bounded too
    cg.process_owner(100)  # used: 200 is now the least recently used
    cg.process_owner(300)
    cg.resolve_pending()
    assert len(cg) == 2
    assert cg.process_owner(300) == Owner(slurm_job="31")
    assert cg.process_owner(100) is not None
    assert cg.process_owner(200) is None  # evicted, so a miss


def test_missing_proc_root_is_logged_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cg = CgroupAttribution(str(tmp_path / "noproc"), pod_logs_dir=str(tmp_path / "nopods"))
    with caplog.at_level(logging.INFO, logger="exporter.attribution.cgroups"):
        for pid in (1, 2):
            cg.process_owner(pid)
        cg.resolve_pending()
        cg.refresh()
    assert cg.process_owner(1) is None and len(cg) == 2
    assert len(caplog.records) == 1 and "hostPID" in caplog.records[0].getMessage()


def test_private_pid_namespace_gives_no_owners(
    host: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "proc" / "2" / "comm").write_text("bash\n")  # PID 2 is some container process
    cg = _cgroups(host)
    with caplog.at_level(logging.WARNING, logger="exporter.attribution.cgroups"):
        cg.refresh()
        cg.process_owner(100)
        cg.resolve_pending()
        cg.refresh()
    assert cg.process_owner(100) is None
    assert len([r for r in caplog.records if "hostPID" in r.getMessage()]) == 1


# --- Slurm job mapping


def test_slurm_mapping_dir(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    mapping = tmp_path / "jobs"
    mapping.mkdir()
    (mapping / "0").write_text("123\n")
    (mapping / "1.2").write_text("77\n78_3\n\nnot-a-job\n")
    (mapping / "9").write_text("555\n")  # no GPU 9 here
    (mapping / "README").write_text("ignored\n")
    source = SlurmJobMapping(str(mapping))
    source.refresh()
    assert source.allocations(GPUS) == [
        Allocation(gpu=0, job="123"),
        Allocation(gpu=1, job="77", gpu_instance_id=2),
        Allocation(gpu=1, job="78_3", gpu_instance_id=2),
    ]
    (mapping / "0").unlink()  # epilog
    assert len(source.allocations(GPUS)) == 3  # re-read only on refresh
    source.refresh()
    assert [a.job for a in source.allocations(GPUS)] == ["77", "78_3"]
    missing = SlurmJobMapping(str(tmp_path / "absent"))
    with caplog.at_level(logging.INFO, logger="exporter.attribution.slurm"):
        missing.refresh()
        missing.refresh()
    assert missing.allocations(GPUS) == [] and not missing.errors
    assert len(caplog.records) == 1


# --- combined, flags, background refresh


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_flags_build_the_sources(tmp_path: Path) -> None:
    args = _args()
    assert args.attribution_refresh_interval == 10.0
    assert args.pod_resources_socket == "/var/lib/kubelet/pod-resources/kubelet.sock"
    attribution = build_attribution(args)
    assert attribution.pod_resources is not None and attribution.slurm is None
    assert attribution.cgroups is not None and attribution.cgroups.proc_root == "/proc"
    attribution = build_attribution(
        _args(
            "--kubelet.pod-resources-socket=",
            "--proc-root=",
            f"--slurm.job-mapping-dir={tmp_path}",
            "--attribution.refresh-interval=500ms",
        )
    )
    assert attribution.pod_resources is None and attribution.cgroups is None
    assert attribution.slurm is not None and attribution.refresher.interval_s == 0.5
    with pytest.raises(SystemExit):
        _args("--attribution.refresh-interval=0")


def test_refresh_runs_on_the_timer_not_per_lookup(kubelet: FakeKubelet, host: Path) -> None:
    kubelet.set_pods(pod("train-0", "team-a", ("main", [("nvidia.com/gpu", [UUID0])])))
    jobs = host / "jobs"
    jobs.mkdir()
    (jobs / "2").write_text("4242\n")
    args = _args(
        f"--kubelet.pod-resources-socket={kubelet.socket_path}",
        f"--proc-root={host / 'proc'}",
        f"--kubelet.pod-logs-dir={host / 'log' / 'pods'}",
        f"--slurm.job-mapping-dir={jobs}",
        "--attribution.refresh-interval=0.3",
    )
    attribution = build_attribution(args)
    with attribution:
        _wait_for(lambda: attribution.refresher.rounds >= 1)
        started = time.monotonic()
        for _ in range(2000):
            found = attribution.allocations(GPUS)
        assert sorted((a.gpu, a.pod, a.job) for a in found) == [(0, "train-0", ""), (2, "", "4242")]
        _wait_for(lambda: kubelet.calls >= 3)
        elapsed = time.monotonic() - started
        assert kubelet.calls <= 2 + elapsed / 0.3  # one per interval, however many lookups
    thread = attribution.refresher._thread
    assert thread is not None and not thread.is_alive()  # close() stopped and joined it


def test_process_miss_is_resolved_without_waiting_for_the_timer(
    kubelet: FakeKubelet, host: Path
) -> None:
    attribution = CombinedAttribution(
        pod_resources=PodResourcesSource(kubelet.socket_path),
        cgroups=_cgroups(host),
        refresh_interval_s=60.0,
    )
    with attribution:
        _wait_for(lambda: attribution.refresher.rounds == 1)
        assert attribution.process_owner(100) is None
        _wait_for(lambda: attribution.process_owner(100) is not None)
        assert attribution.process_owner(100) == Owner("train-0", "team-a", "main")
        assert attribution.refresher.rounds == 1 and kubelet.calls == 1
        kubelet.fail = True
        attribution.refresh()
        assert attribution.errors == {"podresources_list": 1}


def _wait_for(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)
