"""Kubernetes objects in the API's own JSON shapes, written from the API reference (core/v1
Node, Pod, ResourceQuota; Kueue v1beta1; Volcano scheduling v1beta1; coscheduling v1alpha1)."""

from __future__ import annotations

from typing import Any

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def node(
    name: str,
    gpus: int = 8,
    *,
    labels: dict[str, str] | None = None,
    product: str = "NVIDIA-A100-SXM4-80GB",
    unschedulable: bool = False,
    ready: bool = True,
    taints: list[dict[str, str]] | None = None,
    extra: dict[str, str] | None = None,
) -> dict[str, Any]:
    allocatable = {"cpu": "96", "memory": "1024Gi", "nvidia.com/gpu": str(gpus), "pods": "110"}
    allocatable.update(extra or {})
    spec: dict[str, Any] = {"taints": [GPU_TAINT, *(taints or [])]}
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "nvidia.com/gpu.product": product,
                "nvidia.com/gpu.count": str(gpus),
                "nvidia.com/gpu.memory": "81920",
                **(labels or {}),
            },
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": spec,
        "status": {
            "capacity": dict(allocatable),
            "allocatable": allocatable,
            "conditions": [{"type": "Ready", "status": "True" if ready else "Unknown"}],
        },
    }


def pod(
    namespace: str,
    name: str,
    gpus: float | int = 0,
    *,
    node_name: str | None = None,
    owner: tuple[str, str] | None = ("Job", "job"),
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    priority: int | None = None,
    resources: dict[str, str] | None = None,
    phase: str | None = None,
    created: str = "2026-01-01T00:00:00Z",
) -> dict[str, Any]:
    requests: dict[str, str] = {"cpu": "4", "memory": "32Gi"}
    limits: dict[str, str] = {}
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    for key, value in (resources or {}).items():
        limits[key] = value
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": f"uid-{namespace}-{name}",
        "labels": labels or {},
        "creationTimestamp": created,
    }
    if owner is not None:
        meta["ownerReferences"] = [
            {
                "apiVersion": "batch/v1",
                "kind": owner[0],
                "name": owner[1],
                "uid": f"uid-{owner[1]}",
                "controller": True,
            }
        ]
    if annotations:
        meta["annotations"] = annotations
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "main",
                "image": "registry.example/train:1",
                "resources": {"requests": requests, "limits": limits},
            }
        ],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }
    if priority is not None:
        spec["priority"] = priority
    if node_name:
        spec["nodeName"] = node_name
    status: dict[str, Any] = {"phase": phase or ("Running" if node_name else "Pending")}
    if node_name:
        status["startTime"] = "2026-01-01T01:00:00Z"
    else:
        status["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
            }
        ]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def resource_quota(namespace: str, gpus: int, name: str = "gpu") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"hard": {"requests.nvidia.com/gpu": str(gpus), "pods": "100"}},
    }


def cluster_queue(
    name: str,
    gpus: int,
    *,
    cohort: str = "",
    borrowing: int | None = None,
    lending: int | None = None,
    flavor: str = "default-flavor",
) -> dict[str, Any]:
    resource: dict[str, Any] = {"name": "nvidia.com/gpu", "nominalQuota": gpus}
    if borrowing is not None:
        resource["borrowingLimit"] = str(borrowing)
    if lending is not None:
        resource["lendingLimit"] = str(lending)
    spec: dict[str, Any] = {
        "namespaceSelector": {},
        "resourceGroups": [
            {
                "coveredResources": ["cpu", "nvidia.com/gpu"],
                "flavors": [
                    {
                        "name": flavor,
                        "resources": [{"name": "cpu", "nominalQuota": "1000"}, resource],
                    }
                ],
            }
        ],
    }
    if cohort:
        spec["cohort"] = cohort
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta1",
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": spec,
    }


def local_queue(namespace: str, cluster_queue_name: str, name: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta1",
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": cluster_queue_name},
    }


def workload(
    namespace: str, job: str, count: int, gpus: int, *, admitted: bool = False, priority: int = 0
) -> dict[str, Any]:
    status: dict[str, Any] = {
        "conditions": [
            {
                "type": "QuotaReserved",
                "status": "True" if admitted else "False",
                "reason": "QuotaReserved" if admitted else "Pending",
                "message": "Quota reserved in ClusterQueue"
                if admitted
                else "couldn't assign flavors to pod set main: insufficient unused quota for "
                "nvidia.com/gpu in flavor default-flavor, 16 more needed",
            }
        ]
    }
    if admitted:
        status["admission"] = {"clusterQueue": "team", "podSetAssignments": []}
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta1",
        "kind": "Workload",
        "metadata": {
            "name": f"job-{job}-1a2b3",
            "namespace": namespace,
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": job,
                    "uid": f"uid-{job}",
                    "controller": True,
                }
            ],
            "creationTimestamp": "2026-01-01T02:00:00Z",
        },
        "spec": {
            "queueName": "default",
            "priority": priority,
            "podSets": [
                {
                    "name": "main",
                    "count": count,
                    "template": {
                        "spec": {
                            "containers": [
                                {
                                    "name": "main",
                                    "image": "registry.example/train:1",
                                    "resources": {
                                        "requests": {"cpu": "8", "nvidia.com/gpu": str(gpus)},
                                        "limits": {"nvidia.com/gpu": str(gpus)},
                                    },
                                }
                            ],
                            "restartPolicy": "Never",
                        }
                    },
                }
            ],
        },
        "status": status,
    }


def volcano_queue(name: str, capability: int | None, deserved: int | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"weight": 1, "reclaimable": True}
    if capability is not None:
        spec["capability"] = {"nvidia.com/gpu": str(capability)}
    if deserved is not None:
        spec["deserved"] = {"nvidia.com/gpu": str(deserved)}
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "Queue",
        "metadata": {"name": name},
        "spec": spec,
        "status": {"state": "Open"},
    }


def volcano_podgroup(namespace: str, name: str, min_member: int, queue: str) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"minMember": min_member, "queue": queue},
        "status": {"phase": "Pending"},
    }


def coscheduling_podgroup(namespace: str, name: str, min_member: int) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"minMember": min_member, "scheduleTimeoutSeconds": 60},
    }
