"""Reading a large Kubernetes cluster through `k8s:`: list once into a model, then a watch keeps
it current without re-listing.

A recorded cluster (`--nodes` GPU nodes of 8 GPUs, `--pods` pods: GPU jobs, multi-pod gangs,
serving replicas, CPU pods on GPU nodes, a queue of pending gangs; every object in the API's
JSON shape with the fields a real API server returns, managedFields included) is served by the
fake API server (tests/fakes/kube_apiserver.py) in its own process, so the server's work does
not share this process's core. Measured here, with the real `kubernetes` client:

- list: `load_source("k8s:")`: nodes, pods, quotas listed in chunks, cut to records, turned into
  the scheduler view and the cluster model (the client library's import is timed apart);
- baseline: the client's own typed reading of the same pod list (`ApiClient.deserialize` into
  V1PodList, what `CoreV1Api.list_pod_for_all_namespaces()` returns), on `--baseline-pods` pods,
  per pod against ours per pod (its full size would take minutes);
- watch: a `Watcher` (the service's reader) lists once; then `--events` pod changes (new
  pending pods, deletions, pods finishing) go through the watch; the time until the view shows
  them, the requests sent meanwhile (lists must stay at 0), and one view + model build from the
  watched cache (each advisor run's cost) against a full re-list (what a poll would pay).

    python bench/k8s_source.py                       # 5,000 nodes, 100,000 pods
    python bench/k8s_source.py --nodes 50 --pods 1000 --events 100 --baseline-pods 200
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.machine import describe

RACK = "topology.kubernetes.io/rack"


# --------------------------------------------------------------------------- the cluster


def _stamp(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def node_object(i: int, nodes_per_rack: int) -> dict:
    name = f"gpu-node-{i:05d}"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"node-uid-{i}",
            "creationTimestamp": _stamp(1.76e9),
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "p4de.24xlarge",
                "topology.kubernetes.io/zone": f"zone-{i % 3}",
                RACK: f"rack-{i // nodes_per_rack:04d}",
                "karpenter.sh/nodepool": "a100",
                "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
                "nvidia.com/gpu.count": "8",
                "nvidia.com/gpu.memory": "81920",
                "nvidia.com/cuda.driver.major": "550",
                "nvidia.com/mig.strategy": "single",
                "feature.node.kubernetes.io/pci-10de.present": "true",
            },
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
        },
        "spec": {
            "providerID": f"aws:///zone/i-{i:017x}",
            "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
            **({"unschedulable": True} if i % 97 == 0 else {}),
        },
        "status": {
            "capacity": {
                "cpu": "96",
                "memory": "1148Gi",
                "nvidia.com/gpu": "8",
                "pods": "110",
                "ephemeral-storage": "7000Gi",
            },
            "allocatable": {
                "cpu": "95690m",
                "memory": "1140Gi",
                "nvidia.com/gpu": "8",
                "pods": "110",
                "ephemeral-storage": "6450Gi",
            },
            "conditions": [
                {
                    "type": t,
                    "status": "False",
                    "reason": f"Kubelet{t}",
                    "lastHeartbeatTime": _stamp(1.77e9),
                    "lastTransitionTime": _stamp(1.76e9),
                }
                for t in ("MemoryPressure", "DiskPressure", "PIDPressure")
            ]
            + [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "lastHeartbeatTime": _stamp(1.77e9),
                    "lastTransitionTime": _stamp(1.76e9),
                }
            ],
            "addresses": [
                {"type": "InternalIP", "address": f"10.{i // 65536}.{i // 256 % 256}.{i % 256}"},
                {"type": "Hostname", "address": name},
            ],
            "nodeInfo": {
                "kubeletVersion": "v1.33.1",
                "containerRuntimeVersion": "containerd://2.0.5",
                "kernelVersion": "6.8.0",
                "osImage": "Ubuntu 24.04",
                "architecture": "amd64",
                "operatingSystem": "linux",
            },
        },
    }


def pod_object(
    namespace: str,
    name: str,
    node: str | None,
    gpus: int,
    owner: tuple[str, str],
    labels: dict[str, str],
    priority: int,
) -> dict:
    requests = {"cpu": "8", "memory": "64Gi"}
    limits = {"memory": "64Gi"}
    if gpus:
        requests["nvidia.com/gpu"] = limits["nvidia.com/gpu"] = str(gpus)
    created = 1.765e9 + hash(name) % 86400
    status: dict = {
        "phase": "Running" if node else "Pending",
        "qosClass": "Burstable",
        "conditions": [
            {
                "type": t,
                "status": "True" if node else "False",
                "lastProbeTime": None,
                "lastTransitionTime": _stamp(created),
            }
            for t in (
                "PodReadyToStartContainers",
                "Initialized",
                "Ready",
                "ContainersReady",
                "PodScheduled",
            )
        ],
    }
    if node:
        status.update(
            hostIP="10.0.0.1",
            podIP="10.128.0.1",
            podIPs=[{"ip": "10.128.0.1"}],
            startTime=_stamp(created + 5),
            containerStatuses=[
                {
                    "name": "main",
                    "ready": True,
                    "restartCount": 0,
                    "started": True,
                    "image": "registry.example/train:1",
                    "imageID": "registry.example/train@sha256:" + "0" * 64,
                    "containerID": "containerd://" + "1" * 64,
                    "state": {"running": {"startedAt": _stamp(created + 9)}},
                }
            ],
        )
    else:
        status["conditions"][-1].update(
            reason="Unschedulable",
            message="0/5000 nodes are available: 5000 Insufficient nvidia.com/gpu.",
        )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"pod-uid-{namespace}-{name}",
            "creationTimestamp": _stamp(created),
            "labels": labels,
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": owner[0],
                    "name": owner[1],
                    "uid": f"owner-{owner[1]}",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": [
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": _stamp(created),
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:metadata": {"f:labels": {".": {}, **{f"f:{k}": {} for k in labels}}},
                        "f:spec": {
                            "f:containers": {
                                'k:{"name":"main"}': {".": {}, "f:image": {}, "f:resources": {}}
                            }
                        },
                    },
                },
            ],
        },
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/train:1",
                    "command": ["torchrun", "--nnodes=8", "train.py"],
                    "env": [
                        {"name": "NCCL_DEBUG", "value": "WARN"},
                        {"name": "RANK", "value": "0"},
                    ],
                    "resources": {"requests": requests, "limits": limits},
                    "volumeMounts": [
                        {
                            "name": "kube-api-access",
                            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                            "readOnly": True,
                        }
                    ],
                    "terminationMessagePath": "/dev/termination-log",
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
            "restartPolicy": "Never",
            "schedulerName": "default-scheduler",
            "priority": priority,
            "serviceAccountName": "default",
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
            **({"nodeName": node} if node else {}),
        },
        "status": status,
    }


def cluster(nodes: int, pods: int, seed: int = 7):
    """(key, object) of a recorded cluster: GPU nodes with their daemon pods, GPU jobs (some in
    8 x 8 gangs, a few of those waiting), serving replicas, CPU pods on GPU nodes, quotas."""
    rng = random.Random(seed)
    per_rack = 32
    for i in range(nodes):
        yield "nodes", node_object(i, per_rack)
    tenants = [f"team-{t:02d}" for t in range(20)]
    names = [f"gpu-node-{i:05d}" for i in range(nodes)]
    free = dict.fromkeys(names, 8)
    made = 0
    daemons = ("nvidia-device-plugin", "dcgm-exporter", "node-exporter", "kube-proxy", "cilium")
    for name in names:  # the daemon pods every node runs (no GPU request)
        for daemon in daemons:
            if made >= pods:
                break
            yield (
                "pods",
                pod_object(
                    "kube-system",
                    f"{daemon}-{name}",
                    name,
                    0,
                    ("DaemonSet", daemon),
                    {"app": daemon},
                    2_000_001_000,
                ),
            )
            made += 1
    gangs = max(1, pods // 1000)
    job = 0
    for g in range(gangs):  # 8 x 8 training gangs; every third waits in the queue
        group = f"pretrain-{g}"
        waiting = g % 3 == 2
        tenant = tenants[g % len(tenants)]
        for k in range(8):
            node = None
            if not waiting:
                node = next((n for n in rng.sample(names, min(64, nodes)) if free[n] == 8), None)
                if node:
                    free[node] = 0
            yield (
                "pods",
                pod_object(
                    tenant,
                    f"{group}-{k}",
                    node,
                    8,
                    ("Job", group),
                    {"scheduling.x-k8s.io/pod-group": group, "batch.kubernetes.io/job-name": group},
                    100,
                ),
            )
            made += 1
    while made < pods:
        job += 1
        tenant = rng.choice(tenants)
        gpu_pod = rng.random() < 0.35
        gpus = rng.choice((1, 1, 1, 2, 2, 4, 8)) if gpu_pod else 0
        node = rng.choice(names)
        if gpus and free[node] < gpus:
            node = next((n for n in rng.sample(names, min(16, nodes)) if free[n] >= gpus), None)
        if node and gpus:
            free[node] -= gpus
        serving = rng.random() < 0.2
        owner = ("ReplicaSet", f"serve-{job % 500}-7d9f") if serving else ("Job", f"job-{job}")
        labels = {"app": f"app-{job % 1000}"}
        if serving:
            labels["pod-template-hash"] = "7d9f"
        yield (
            "pods",
            pod_object(tenant, f"p-{job}", node, gpus, owner, labels, 1_000_000 if serving else 10),
        )
        made += 1
    for tenant in tenants:
        yield (
            "resourcequotas",
            {
                "apiVersion": "v1",
                "kind": "ResourceQuota",
                "metadata": {"name": "gpu", "namespace": tenant},
                "spec": {"hard": {"requests.nvidia.com/gpu": str(nodes * 8 // 16)}},
            },
        )
    for g in range(gangs):
        yield (
            "coscheduling-podgroups",
            {
                "apiVersion": "scheduling.x-k8s.io/v1alpha1",
                "kind": "PodGroup",
                "metadata": {"name": f"pretrain-{g}", "namespace": tenants[g % len(tenants)]},
                "spec": {"minMember": 8},
            },
        )


def serve(nodes: int, pods: int) -> None:
    """The server process: build the cluster into a fake API server, print its URL, serve."""
    from tests.fakes.kube_apiserver import KubeApiServer

    started = time.perf_counter()
    server = KubeApiServer({})
    server.install("coscheduling-podgroups")
    count = 0
    for key, obj in cluster(nodes, pods):
        server._put(key, obj, event=None)
        count += 1
    server.start()
    size = sum(len(e.body) for r in server.resources.values() for e in r.items.values())
    print(
        json.dumps(
            {
                "url": server.url,
                "objects": count,
                "bytes": size,
                "build_s": time.perf_counter() - started,
            }
        ),
        flush=True,
    )
    try:
        while True:
            time.sleep(3600)
    finally:
        server.stop()


# --------------------------------------------------------------------------- measuring


def cpu_seconds() -> float:
    """User + system CPU of this process (the wall clock also counts the machine's other load)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def post(url: str, path: str, doc: object) -> dict:
    request = urllib.request.Request(
        url + path, data=json.dumps(doc).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)


def server_requests(url: str) -> dict[str, int]:
    request = urllib.request.Request(
        url + "/_fake/requests", headers={"Authorization": "Bearer test-token"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def baseline_typed(url: str, token: str, pods: int) -> tuple[float, int]:
    """Seconds the client's typed models take for `pods` pods (list page -> V1PodList)."""
    from kubernetes import client

    configuration = client.Configuration(host=url, api_key={"authorization": f"Bearer {token}"})
    api = client.ApiClient(configuration)
    request = urllib.request.Request(
        f"{url}/api/v1/pods?limit={pods}", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        body = response.read()
    started = time.perf_counter()
    typed = api.deserialize(body.decode(), "V1PodList", "application/json")
    seconds = time.perf_counter() - started
    return seconds, len(typed.items)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=100_000)
    parser.add_argument("--events", type=int, default=2000, help="pod changes through the watch")
    parser.add_argument("--baseline-pods", type=int, default=5000)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.nodes, args.pods)
        return
    print(describe(f"cluster {args.nodes} nodes x 8 GPUs, {args.pods} pods"))
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", "--nodes", str(args.nodes), "--pods", str(args.pods)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(Path(__file__).resolve().parents[1]),
    )
    try:
        info = json.loads(server.stdout.readline())
        url = info["url"]
        print(
            f"recorded cluster: {info['objects']:,} objects, {info['bytes'] / 1e6:.0f} MB of "
            f"JSON, built in {info['build_s']:.1f} s (server process)"
        )
        measure(url, args)
    finally:
        server.terminate()
        server.wait(timeout=30)


def measure(url: str, args: argparse.Namespace) -> None:
    from tests.fakes.kube_apiserver import KubeApiServer

    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "kubeconfig"
        KubeApiServer.kubeconfig_for(url, config)
        os.environ["KUBECONFIG"] = str(config)
        started = time.perf_counter()
        import kubernetes.client
        import kubernetes.config  # noqa: F401

        print(f"import of the kubernetes client: {time.perf_counter() - started:.2f} s")
        from advisor.ingest.kubernetes.cache import Watcher
        from advisor.ingest.kubernetes.spec import parse
        from advisor.ingest.sources import load_source

        before = server_requests(url)
        cpu = cpu_seconds()
        started = time.perf_counter()
        model = load_source("k8s:", timeout=60)
        listed = time.perf_counter() - started
        listed_cpu = cpu_seconds() - cpu
        after = server_requests(url)
        lists = sum(v for k, v in after.items() if k.startswith("list")) - sum(
            v for k, v in before.items() if k.startswith("list")
        )
        pending = int((model.allocations.node < 0).sum())
        print(
            f"list + model: {listed:.2f} s wall, {listed_cpu:.2f} s CPU of this process "
            f"({len(model.nodes):,} nodes, {len(model.gpus):,} GPUs, "
            f"{len(model.allocations):,} allocations, {pending:,} pending tasks; {lists} list "
            f"requests; target < 10 s: {'met' if listed < 10 else 'MISSED'} on the wall clock, "
            f"{'met' if listed_cpu < 10 else 'MISSED'} in CPU)"
        )
        per_pod_ours = listed / max(args.pods, 1)
        typed_s, typed_n = baseline_typed(url, "test-token", args.baseline_pods)
        per_pod_typed = typed_s / max(typed_n, 1)
        print(
            f"baseline typed models: {typed_s:.2f} s for {typed_n:,} pods = "
            f"{1e3 * per_pod_typed:.3f} ms/pod; ours {1e3 * per_pod_ours:.3f} ms/pod for the whole "
            f"list + model (ratio ours/baseline {per_pod_ours / per_pod_typed:.3f}; the typed "
            f"models alone at {args.pods:,} pods: ~{per_pod_typed * args.pods:.0f} s)"
        )

        watcher = Watcher(parse("k8s:"), timeout=60)
        try:
            watcher()
            time.sleep(1.0)  # the watches open
            opened = watcher.requests
            events = []
            for i in range(args.events):
                kind = i % 4
                ns, name = "team-00", f"bench-event-{i}"
                if kind == 3 and i >= 4:  # delete a pod added before
                    events.append(
                        {
                            "type": "DELETED",
                            "resource": "pods",
                            "object": pod_object(
                                ns, f"bench-event-{i - 3}", None, 8, ("Job", "x"), {}, 5
                            ),
                        }
                    )
                else:
                    events.append(
                        {
                            "type": "ADDED",
                            "resource": "pods",
                            "object": pod_object(ns, name, None, 8, ("Job", f"bench-{i}"), {}, 5),
                        }
                    )
            expected = {e["object"]["metadata"]["name"] for e in events if e["type"] == "ADDED"} - {
                e["object"]["metadata"]["name"] for e in events if e["type"] == "DELETED"
            }
            lists_before = sum(v for k, v in server_requests(url).items() if k.startswith("list"))
            started = time.perf_counter()
            for chunk in range(0, len(events), 500):
                post(url, "/_fake/apply", events[chunk : chunk + 500])
            while True:
                seen = {
                    t.id.rpartition("/")[2]
                    for t in watcher().tasks
                    if t.id.startswith("team-00/bench-event-")
                }
                if seen == expected:
                    break
                if time.perf_counter() - started > 300:
                    raise SystemExit("the watch did not show the events within 300 s")
                time.sleep(0.2)
            current = time.perf_counter() - started
            lists_after = sum(v for k, v in server_requests(url).items() if k.startswith("list"))
            print(
                f"watch: {args.events:,} pod events shown in {current:.2f} s (posting included); "
                f"list requests meanwhile {lists_after - lists_before}, watch (re)opens "
                f"{watcher.requests - opened}, re-lists {watcher.relists}"
            )
            from advisor.ingest.combine import build_model

            cpu = cpu_seconds()
            started = time.perf_counter()
            build_model(watcher(), None, source="k8s:")
            run_s = time.perf_counter() - started
            run_cpu = cpu_seconds() - cpu
            cpu = cpu_seconds()
            started = time.perf_counter()
            load_source("k8s:", timeout=60)
            relist_s = time.perf_counter() - started
            relist_cpu = cpu_seconds() - cpu
            print(
                f"per advisor run: view + model from the watched cache {run_s:.2f} s wall, "
                f"{run_cpu:.2f} s CPU vs a full re-list {relist_s:.2f} s wall, {relist_cpu:.2f} s "
                f"CPU (ratio watch/re-list {run_s / relist_s:.3f} wall, "
                f"{run_cpu / max(relist_cpu, 1e-9):.3f} CPU)"
            )
        finally:
            watcher.close()


if __name__ == "__main__":
    main()
