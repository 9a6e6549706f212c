"""The Kubernetes objects a cluster in a model's state would serve: a snapshot as a live cluster.

`objects_from_model(model, ...)` writes, in the API's own JSON shapes, one Node per node (GPU
feature discovery labels, the rack and pool labels, allocatable GPUs, CPU and memory, cordoned
when not schedulable, the `nvidia.com/gpu` dedication taint its GPU pods tolerate), one Pod per
allocation (bound and Running when placed, Pending with `PodScheduled=False` when not; GPUs as
`nvidia.com/gpu` requests, a share of one GPU as Run:ai's `gpu-fraction`; priority; migratable
work owned by a Job, the rest by a Deployment's ReplicaSet; restart cost as the
`gpu-defrag.io/restart-cost` annotation; the tasks of a multi-task job in one coscheduling
PodGroup whose `minMember` is their count), and the tenants' quotas as ResourceQuotas or as Kueue
ClusterQueues (with LocalQueues, a ResourceFlavor, and the waiting jobs as Workloads instead of
pods, as Kueue holds a Job suspended until it is admitted).

The tests serve these from a fake API server to read the seed cases back through `k8s:`, and
`examples/make_k8s_examples.py` writes them next to the snapshots. Pure: no I/O.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

import numpy as np

from advisor.ingest.kubernetes.records import (
    COUNT_LABEL,
    MEMORY_LABEL,
    PRODUCT_LABEL,
    RUNAI_FRACTION,
)
from advisor.ingest.kubernetes.spec import DEFAULT_POOL_LABELS, DEFAULT_RACK_LABELS
from advisor.ingest.movability import RESTART_COST_ANNOTATION
from advisor.model import MILLI, ClusterModel
from advisor.planner.constraints import ANY_MODEL, Policy

RACK_LABEL = DEFAULT_RACK_LABELS[0]
POOL_LABEL = DEFAULT_POOL_LABELS[0]
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
EPOCH = 1_767_225_600.0  # 2026-01-01T00:00:00Z: the time stamped where the model knows none
_NAME = re.compile(r"[^a-z0-9.-]+")


def dns_name(text: str) -> str:
    """A DNS-1123 name from any id ("rnd/Job_1" -> "rnd-job-1")."""
    name = _NAME.sub("-", text.lower()).strip("-.")
    return name[:63].rstrip("-.") or "x"


def rfc3339(seconds: float) -> str:
    when = EPOCH if math.isnan(seconds) else seconds
    return datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def product_label(gpu_model: str) -> str:
    """A GPU model as GPU feature discovery writes it ("NVIDIA A100-SXM4-80GB" ->
    "NVIDIA-A100-SXM4-80GB")."""
    return gpu_model.replace(" ", "-")


def _node(model: ClusterModel, i: int, rack_label: str, pool_label: str) -> dict[str, Any]:
    nodes, gpus = model.nodes, model.gpus
    start, stop = int(nodes.gpu_offset[i]), int(nodes.gpu_offset[i + 1])
    healthy = int((gpus.healthy[start:stop] & ~gpus.lost[start:stop]).sum())
    labels = {"kubernetes.io/hostname": str(nodes.name[i])}
    if nodes.rack[i]:
        labels[rack_label] = str(nodes.rack[i])
    if nodes.pool[i]:
        labels[pool_label] = str(nodes.pool[i])
    if nodes.gpu_model[i]:
        labels[PRODUCT_LABEL] = product_label(str(nodes.gpu_model[i]))
    labels[COUNT_LABEL] = str(stop - start)
    memory = gpus.memory_total_bytes[start:stop]
    if stop > start and np.isfinite(memory).all():
        labels[MEMORY_LABEL] = str(int(memory.max() // 2**20))
    allocatable = {"nvidia.com/gpu": str(healthy), "pods": "110"}
    if not math.isnan(nodes.cpu_milli[i]):
        allocatable["cpu"] = f"{int(nodes.cpu_milli[i])}m"
    if not math.isnan(nodes.memory_mib[i]):
        allocatable["memory"] = f"{int(nodes.memory_mib[i])}Mi"
    spec: dict[str, Any] = {
        "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    }
    if not nodes.schedulable[i]:
        spec["unschedulable"] = True
        spec["taints"].append({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"})
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": str(nodes.name[i]),
            "labels": labels,
            "creationTimestamp": rfc3339(math.nan),
        },
        "spec": spec,
        "status": {
            "capacity": dict(allocatable),
            "allocatable": allocatable,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    }


def _pod_name(alloc_id: str) -> str:
    return dns_name(alloc_id.rpartition("/")[2])


def _container(num_gpu: int, milli: int, cpu: float, memory: float) -> dict[str, Any]:
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if num_gpu and milli >= MILLI:
        requests["nvidia.com/gpu"] = limits["nvidia.com/gpu"] = str(num_gpu)
    if not math.isnan(cpu):
        requests["cpu"] = f"{int(cpu)}m"
    if not math.isnan(memory):
        requests["memory"] = f"{int(memory)}Mi"
    resources: dict[str, Any] = {}
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    return {"name": "main", "image": "registry.example/train:1", "resources": resources}


def _pod(
    model: ClusterModel,
    row: int,
    namespace: str,
    job_name: str,
    gang: int,
    kueue: bool,
) -> dict[str, Any]:
    allocs = model.allocations
    alloc_id = str(allocs.id[row])
    node = int(allocs.node[row])
    migratable = bool(allocs.migratable[row])
    labels = {"app.kubernetes.io/name": job_name}
    annotations: dict[str, str] = {}
    if gang > 1:
        labels[POD_GROUP_LABEL] = job_name
    if kueue:
        labels["kueue.x-k8s.io/queue-name"] = "default"
    if migratable:
        owner = {"apiVersion": "batch/v1", "kind": "Job", "name": job_name}
    else:  # serving work: a Deployment's replica
        labels["pod-template-hash"] = "5d8f7c9b6"
        owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"{job_name}-5d8f7c9b6"}
    owner.update({"uid": f"uid-{namespace}-{owner['name']}", "controller": True})
    restart = float(allocs.restart_cost_s[row])
    if not math.isnan(restart):
        annotations[RESTART_COST_ANNOTATION] = f"{restart:g}s"
    num_gpu, milli = int(allocs.num_gpu[row]), int(allocs.gpu_milli[row])
    if num_gpu and milli < MILLI:
        annotations[RUNAI_FRACTION] = f"{milli / MILLI:g}"
    spec: dict[str, Any] = {
        "containers": [
            _container(num_gpu, milli, float(allocs.cpu_milli[row]), float(allocs.memory_mib[row]))
        ],
        "priority": int(allocs.priority[row]),
        "restartPolicy": "Never" if migratable else "Always",
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }
    gpu_spec = str(allocs.gpu_spec[row])
    if gpu_spec:
        products = [product_label(p) for p in gpu_spec.split("|") if p]
        if len(products) == 1:
            spec["nodeSelector"] = {PRODUCT_LABEL: products[0]}
        else:
            spec["affinity"] = {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": PRODUCT_LABEL, "operator": "In", "values": products}
                                ]
                            }
                        ]
                    }
                }
            }
    status: dict[str, Any]
    created = float(allocs.creation_time[row])
    if node >= 0:
        spec["nodeName"] = str(model.nodes.name[node])
        started = float(allocs.start_time[row])
        status = {
            "phase": "Running",
            "startTime": rfc3339(started if not math.isnan(started) else created),
            "conditions": [{"type": "PodScheduled", "status": "True"}],
        }
    else:
        status = {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": f"0/{len(model.nodes)} nodes are available: insufficient "
                    "nvidia.com/gpu.",
                }
            ],
        }
    meta: dict[str, Any] = {
        "name": _pod_name(alloc_id),
        "namespace": namespace,
        "labels": labels,
        "ownerReferences": [owner],
        "creationTimestamp": rfc3339(created),
    }
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def _namespace(tenant: str) -> str:
    return dns_name(tenant) if tenant else "default"


def _quota_objects(
    policy: Policy, kind: str, namespaces: set[str], used: dict[str, float]
) -> dict[str, list[dict[str, Any]]]:
    tenants = sorted({t for (t, scope) in policy.quotas if scope == ANY_MODEL})
    if kind == "resourcequota":
        return {
            "resourcequotas": [
                {
                    "apiVersion": "v1",
                    "kind": "ResourceQuota",
                    "metadata": {"name": "gpu", "namespace": _namespace(t)},
                    "spec": {
                        "hard": {"requests.nvidia.com/gpu": f"{policy.quotas[(t, ANY_MODEL)]:g}"}
                    },
                    "status": {
                        "hard": {"requests.nvidia.com/gpu": f"{policy.quotas[(t, ANY_MODEL)]:g}"},
                        "used": {"requests.nvidia.com/gpu": f"{used.get(_namespace(t), 0.0):g}"},
                    },
                }
                for t in tenants
            ]
        }
    flavor = {
        "apiVersion": "kueue.x-k8s.io/v1beta1",
        "kind": "ResourceFlavor",
        "metadata": {"name": "default-flavor"},
        "spec": {},
    }
    queues = []
    for tenant in tenants:
        nominal = policy.quotas[(tenant, ANY_MODEL)]
        rules = policy.borrow_rules(tenant)
        resource: dict[str, Any] = {"name": "nvidia.com/gpu", "nominalQuota": f"{nominal:g}"}
        spec: dict[str, Any] = {
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": ["nvidia.com/gpu"],
                    "flavors": [{"name": "default-flavor", "resources": [resource]}],
                }
            ],
        }
        if rules is not None:
            spec["cohort"] = "gpu"
            resource["borrowingLimit"] = f"{rules.max_borrow_ratio * nominal:g}"
            if not rules.lend:
                resource["lendingLimit"] = "0"
        queues.append(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta1",
                "kind": "ClusterQueue",
                "metadata": {"name": _namespace(tenant)},
                "spec": spec,
            }
        )
    local = [
        {
            "apiVersion": "kueue.x-k8s.io/v1beta1",
            "kind": "LocalQueue",
            "metadata": {"name": "default", "namespace": ns},
            "spec": {"clusterQueue": ns},
        }
        for ns in sorted(namespaces | {_namespace(t) for t in tenants})
    ]
    return {"resourceflavors": [flavor], "clusterqueues": queues, "localqueues": local}


def _workload(
    model: ClusterModel, rows: list[int], namespace: str, job_name: str
) -> dict[str, Any]:
    allocs = model.allocations
    first = rows[0]
    created = float(allocs.creation_time[first])
    template = {
        "spec": {
            "containers": [
                _container(
                    int(allocs.num_gpu[first]),
                    int(allocs.gpu_milli[first]),
                    float(allocs.cpu_milli[first]),
                    float(allocs.memory_mib[first]),
                )
            ],
            "restartPolicy": "Never",
        }
    }
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta1",
        "kind": "Workload",
        "metadata": {
            "name": f"job-{job_name}-00000",
            "namespace": namespace,
            "creationTimestamp": rfc3339(created),
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": job_name,
                    "uid": f"uid-{namespace}-{job_name}",
                    "controller": True,
                }
            ],
        },
        "spec": {
            "queueName": "default",
            "priority": int(allocs.priority[rows].max()),
            "podSets": [{"name": "main", "count": len(rows), "template": template}],
        },
        "status": {
            "conditions": [
                {
                    "type": "QuotaReserved",
                    "status": "False",
                    "reason": "Pending",
                    "message": "couldn't assign flavors to pod set main: insufficient unused "
                    "quota for nvidia.com/gpu in flavor default-flavor",
                }
            ]
        },
    }


def objects_from_model(
    model: ClusterModel,
    *,
    rack_label: str = RACK_LABEL,
    pool_label: str = POOL_LABEL,
    policy: Policy | None = None,
    quotas_as: str = "resourcequota",
) -> dict[str, list[dict[str, Any]]]:
    """{resource key: objects} (module docstring). `quotas_as`: "resourcequota" or "kueue"."""
    if quotas_as not in ("resourcequota", "kueue"):
        raise ValueError(f"quotas_as={quotas_as!r}: resourcequota or kueue")
    kueue = quotas_as == "kueue" and policy is not None
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for i in range(len(model.nodes)):
        out["nodes"].append(_node(model, i, rack_label, pool_label))
    allocs = model.allocations
    by_job: dict[str, list[int]] = defaultdict(list)
    for row, job in enumerate(allocs.job.tolist()):
        by_job[str(job)].append(row)
    used: dict[str, float] = defaultdict(float)
    namespaces: set[str] = set()
    for job, rows in by_job.items():
        namespace = _namespace(str(allocs.tenant[rows[0]]))
        namespaces.add(namespace)
        job_name = dns_name(job.rpartition("/")[2])
        waiting = [r for r in rows if allocs.node[r] < 0]
        if kueue and waiting and len(waiting) == len(rows):
            out["workloads"].append(_workload(model, rows, namespace, job_name))
            continue
        if len(rows) > 1:
            out["coscheduling-podgroups"].append(
                {
                    "apiVersion": "scheduling.x-k8s.io/v1alpha1",
                    "kind": "PodGroup",
                    "metadata": {"name": job_name, "namespace": namespace},
                    "spec": {"minMember": len(rows)},
                }
            )
        for row in rows:
            out["pods"].append(_pod(model, row, namespace, job_name, len(rows), kueue))
            if allocs.node[row] >= 0:
                used[namespace] += float(allocs.num_gpu[row] * allocs.gpu_milli[row]) / MILLI
    if policy is not None and policy.quotas:
        for key, items in _quota_objects(policy, quotas_as, namespaces, used).items():
            out[key] += items
    return dict(out)


def waiting_gang(
    namespace: str, name: str, tasks: int, gpus: int, priority: int, nodes: int
) -> dict[str, list[dict[str, Any]]]:
    """A gang of `tasks` pods of `gpus` GPUs waiting in the queue (Pending, `PodScheduled`
    False as the scheduler writes it for a cluster of `nodes` nodes), owned by one Job, in a
    coscheduling PodGroup of minMember `tasks`: the seed cases' job that cannot start."""
    pods = []
    for i in range(tasks):
        pods.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"{name}-{i}",
                    "namespace": namespace,
                    "uid": f"uid-{namespace}-{name}-{i}",
                    "labels": {POD_GROUP_LABEL: name},
                    "ownerReferences": [
                        {
                            "apiVersion": "batch/v1",
                            "kind": "Job",
                            "name": name,
                            "uid": f"uid-{namespace}-{name}",
                            "controller": True,
                        }
                    ],
                    "creationTimestamp": rfc3339(math.nan),
                },
                "spec": {
                    "containers": [_container(gpus, MILLI, math.nan, math.nan)],
                    "priority": priority,
                    "tolerations": [
                        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
                    ],
                },
                "status": {
                    "phase": "Pending",
                    "conditions": [
                        {
                            "type": "PodScheduled",
                            "status": "False",
                            "reason": "Unschedulable",
                            "message": f"0/{nodes} nodes are available: {nodes} Insufficient "
                            "nvidia.com/gpu.",
                        }
                    ],
                },
            }
        )
    group = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"minMember": tasks},
    }
    return {"pods": pods, "coscheduling-podgroups": [group]}


def with_objects(
    objects: dict[str, list[dict[str, Any]]], more: dict[str, list[dict[str, Any]]]
) -> dict[str, list[dict[str, Any]]]:
    """`objects` and `more`, resource by resource."""
    out = {key: list(items) for key, items in objects.items()}
    for key, items in more.items():
        out.setdefault(key, []).extend(items)
    return out
