"""A recorded kube-state-metrics page for given Kubernetes objects, written from
kube-state-metrics' documented metric list (docs/metrics/cluster/node-metrics.md,
workload/pod-metrics.md, policy/resourcequota-metrics.md): the series and labels it exports,
label and annotation keys sanitized as it does, and only the node labels, pod labels and pod
annotations its allowlists name (`--metric-labels-allowlist`, `--metric-annotations-allowlist`).
"""

from __future__ import annotations

import re
from typing import Any

from advisor.ingest.kubernetes.records import pod_requests, quantity, timestamp

_INVALID = re.compile(r"[^a-zA-Z0-9_]")

HELP = {
    "kube_node_info": "Information about a cluster node.",
    "kube_node_labels": "Kubernetes labels converted to Prometheus labels.",
    "kube_node_status_allocatable": "The allocatable for different resources of a node that are available for scheduling.",
    "kube_node_spec_unschedulable": "Whether a node can schedule new pods.",
    "kube_node_spec_taint": "The taint of a cluster node.",
    "kube_node_status_condition": "The condition of a cluster node.",
    "kube_pod_info": "Information about pod.",
    "kube_pod_status_phase": "The pods current phase.",
    "kube_pod_container_resource_requests": "The number of requested request resource by a container.",
    "kube_pod_owner": "Information about the Pod's owner.",
    "kube_pod_labels": "Kubernetes labels converted to Prometheus labels.",
    "kube_pod_annotations": "Kubernetes annotations converted to Prometheus labels.",
    "kube_pod_created": "Unix creation timestamp",
    "kube_pod_start_time": "Start time in unix timestamp for a pod.",
    "kube_resourcequota": "Information about resource quota.",
}


def _name(key: str) -> str:
    return _INVALID.sub("_", key)


def _unit(resource: str) -> str:
    return {"cpu": "core", "memory": "byte"}.get(resource, "integer")


def _labels(pairs: dict[str, str]) -> str:
    def escape(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return ",".join(f'{k}="{escape(str(v))}"' for k, v in pairs.items())


def ksm_page(
    objects: dict[str, list[dict[str, Any]]],
    node_labels: tuple[str, ...] = (),
    pod_labels: tuple[str, ...] = (),
    pod_annotations: tuple[str, ...] = (),
) -> str:
    rows: dict[str, list[tuple[dict[str, str], float]]] = {name: [] for name in HELP}
    for node in objects.get("nodes", []):
        meta, spec, status = node["metadata"], node.get("spec") or {}, node.get("status") or {}
        name = meta["name"]
        rows["kube_node_info"].append(
            (
                {
                    "node": name,
                    "kubelet_version": "v1.33.1",
                    "container_runtime_version": "containerd://2.0.5",
                    "internal_ip": "10.0.0.1",
                    "provider_id": "",
                    "system_uuid": name,
                },
                1.0,
            )
        )
        kept = {
            f"label_{_name(k)}": v
            for k, v in (meta.get("labels") or {}).items()
            if k in node_labels
        }
        rows["kube_node_labels"].append(({"node": name, **kept}, 1.0))
        for resource, value in (status.get("allocatable") or {}).items():
            rows["kube_node_status_allocatable"].append(
                (
                    {"node": name, "resource": _name(resource), "unit": _unit(resource)},
                    quantity(value),
                )
            )
        rows["kube_node_spec_unschedulable"].append(
            ({"node": name}, 1.0 if spec.get("unschedulable") else 0.0)
        )
        for taint in spec.get("taints") or []:
            rows["kube_node_spec_taint"].append(
                (
                    {
                        "node": name,
                        "key": taint.get("key", ""),
                        "value": taint.get("value", ""),
                        "effect": taint.get("effect", ""),
                    },
                    1.0,
                )
            )
        for condition in status.get("conditions") or []:
            for state in ("true", "false", "unknown"):
                rows["kube_node_status_condition"].append(
                    (
                        {"node": name, "condition": condition["type"], "status": state},
                        1.0 if condition["status"].lower() == state else 0.0,
                    )
                )
    for pod in objects.get("pods", []):
        meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
        ids = {
            "namespace": meta["namespace"],
            "pod": meta["name"],
            "uid": meta.get("uid", meta["name"]),
        }
        owner = (meta.get("ownerReferences") or [{}])[0]
        rows["kube_pod_info"].append(
            (
                {
                    **ids,
                    "host_ip": "10.0.0.1",
                    "pod_ip": "10.1.0.1",
                    "node": spec.get("nodeName", ""),
                    "created_by_kind": owner.get("kind", ""),
                    "created_by_name": owner.get("name", ""),
                    "priority_class": spec.get("priorityClassName", ""),
                    "host_network": "false",
                },
                1.0,
            )
        )
        for phase in ("Pending", "Running", "Succeeded", "Failed", "Unknown"):
            rows["kube_pod_status_phase"].append(
                ({**ids, "phase": phase}, 1.0 if status.get("phase") == phase else 0.0)
            )
        for resource, value in pod_requests(spec).items():
            rows["kube_pod_container_resource_requests"].append(
                (
                    {
                        **ids,
                        "container": "main",
                        "node": spec.get("nodeName", ""),
                        "resource": _name(resource),
                        "unit": _unit(resource),
                    },
                    value,
                )
            )
        if owner:
            rows["kube_pod_owner"].append(
                (
                    {
                        **ids,
                        "owner_kind": owner.get("kind", ""),
                        "owner_name": owner.get("name", ""),
                        "owner_is_controller": "true" if owner.get("controller") else "false",
                    },
                    1.0,
                )
            )
        kept = {
            f"label_{_name(k)}": v for k, v in (meta.get("labels") or {}).items() if k in pod_labels
        }
        rows["kube_pod_labels"].append(({**ids, **kept}, 1.0))
        notes = {
            f"annotation_{_name(k)}": v
            for k, v in (meta.get("annotations") or {}).items()
            if k in pod_annotations
        }
        rows["kube_pod_annotations"].append(({**ids, **notes}, 1.0))
        rows["kube_pod_created"].append((ids, timestamp(meta.get("creationTimestamp"))))
        if status.get("startTime"):
            rows["kube_pod_start_time"].append((ids, timestamp(status["startTime"])))
    for quota in objects.get("resourcequotas", []):
        meta = quota["metadata"]
        for resource, value in (quota.get("spec") or {}).get("hard", {}).items():
            rows["kube_resourcequota"].append(
                (
                    {
                        "namespace": meta["namespace"],
                        "resourcequota": meta["name"],
                        "resource": resource,
                        "type": "hard",
                    },
                    quantity(value),
                )
            )
    lines = []
    for name, samples in rows.items():
        lines.append(f"# HELP {name} {HELP[name]}")
        lines.append(f"# TYPE {name} gauge")
        lines += [f"{name}{{{_labels(labels)}}} {value:g}" for labels, value in samples]
    return "\n".join(lines) + "\n"
