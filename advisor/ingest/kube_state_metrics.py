"""Kubernetes through Prometheus: the scheduler view from kube-state-metrics series.

Where the advisor may not talk to the API server, `prometheus+http://HOST:9090?scheduler=
kube-state-metrics[&rack-label=KEY&pool-label=KEY&tenant=...&priority-threshold=N&protect-
classes=A,B]` reads the cluster from the series kube-state-metrics exports (its documented
metric list; instant queries at the source's time):

- nodes: `kube_node_info`, `kube_node_labels` (rack, pool, GPU feature discovery labels: only
  those in kube-state-metrics' `--metric-labels-allowlist=nodes=[...]`), allocatable
  `kube_node_status_allocatable{resource="nvidia_com_gpu"}` (and MIG, CPU, memory),
  `kube_node_spec_unschedulable`, `kube_node_spec_taint`, the Ready condition;
- pods: `kube_pod_info` (node, namespace), `kube_pod_status_phase`,
  `kube_pod_container_resource_requests` (summed per pod), `kube_pod_owner`, `kube_pod_labels`
  and `kube_pod_annotations` (the allowlisted ones: pod groups, Kueue, the gpu-defrag.io
  annotations), `kube_pod_created`, `kube_pod_start_time`, the priority class;
- quotas: `kube_resourcequota{resource="requests.nvidia.com/gpu", type="hard"}`.

The records are the ones the API reader makes (`advisor.ingest.kubernetes.records`), so one
conversion (`advisor.ingest.kubernetes.convert`) gives the same view from either. What
kube-state-metrics does not export stays unknown and is said once: a pod's numeric priority
(only its class: work of the classes in `protect-classes`, default the two system classes, is
not migratable, and the priority threshold cannot apply), labels and annotations outside the
allowlists (no rack label: racks unknown), Kueue and Volcano objects (no queue quotas).
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import replace
from typing import Any

from advisor.ingest.kubernetes import convert
from advisor.ingest.kubernetes.records import (
    COUNT_LABEL,
    GPU,
    KEPT_ANNOTATIONS,
    MEMORY_LABEL,
    MIG_PREFIX,
    PRODUCT_LABEL,
    REPLICAS_LABEL,
    ZONE_LABEL,
    NodeRecord,
    PodRecord,
)
from advisor.ingest.kubernetes.spec import KubeSpec, SpecError
from advisor.ingest.kubernetes.spec import parse as parse_k8s
from advisor.ingest.movability import MIGRATABLE_ANNOTATION
from advisor.ingest.prometheus import PrometheusClient
from advisor.scheduler_view import SchedulerView

KIND = "kube-state-metrics"
OPTIONS = ("rack-label", "pool-label", "tenant", "priority-threshold", "protect-classes")
DEFAULT_PROTECTED = ("system-cluster-critical", "system-node-critical")
POD_LABELS = (
    *convert.COSCHEDULING_LABELS,
    convert.KUEUE_QUEUE,
    convert.KUEUE_GROUP,
    convert.JOBSET,
    convert.LWS_NAME,
    convert.LWS_GROUP,
    convert.TRAINING_JOB,
    convert.RAY_CLUSTER,
    "pod-template-hash",
)
NODE_LABELS = (PRODUCT_LABEL, COUNT_LABEL, MEMORY_LABEL, REPLICAS_LABEL, ZONE_LABEL)
_INVALID = re.compile(r"[^a-zA-Z0-9_]")
_MIG = re.compile(r"^nvidia_com_mig_(\d+g)_(\d+gb)$")

QUERIES = {
    "node_info": "kube_node_info",
    "node_labels": "kube_node_labels",
    "allocatable": 'kube_node_status_allocatable{resource=~"nvidia_com_.+|cpu|memory"}',
    "unschedulable": "kube_node_spec_unschedulable",
    "taints": 'kube_node_spec_taint{effect=~"NoSchedule|NoExecute"}',
    "ready": 'kube_node_status_condition{condition="Ready",status="true"}',
    "pod_info": "kube_pod_info",
    "phase": 'kube_pod_status_phase{phase=~"Pending|Running|Unknown"} == 1',
    "requests": "sum by (namespace, pod, uid, resource) "
    '(kube_pod_container_resource_requests{resource=~"nvidia_com_.+|cpu|memory"})',
    "owner": 'kube_pod_owner{owner_is_controller="true"}',
    "pod_labels": "kube_pod_labels",
    "pod_annotations": "kube_pod_annotations",
    "created": "kube_pod_created",
    "started": "kube_pod_start_time",
    "quota": 'kube_resourcequota{resource="requests.nvidia.com/gpu", type="hard"}',
}


def sanitize(key: str) -> str:
    """How kube-state-metrics names a label or annotation key in its series."""
    return _INVALID.sub("_", key)


def resource_name(resource: str) -> str:
    """kube-state-metrics' resource label back to the resource ("nvidia_com_gpu" ->
    "nvidia.com/gpu", "nvidia_com_mig_1g_10gb" -> "nvidia.com/mig-1g.10gb")."""
    if resource == "nvidia_com_gpu":
        return GPU
    match = _MIG.match(resource)
    if match:
        return f"{MIG_PREFIX}{match.group(1)}.{match.group(2)}"
    if resource.startswith("nvidia_com_"):
        return "nvidia.com/" + resource.removeprefix("nvidia_com_")
    return resource


def parse_options(source: str, params: dict[str, str]) -> tuple[KubeSpec, frozenset[str]]:
    """The Kubernetes options of a `scheduler=kube-state-metrics` source, as a KubeSpec, and
    the protected priority classes; SpecError for a bad one."""
    query = "&".join(f"{k}={v}" for k, v in params.items() if k in OPTIONS[:4])
    text = f"k8s:?{query}" if query else "k8s:"
    try:
        spec = parse_k8s(text)
    except SpecError as error:  # named by this source, not the k8s: spec built here
        raise SpecError(f"{source}: {str(error).removeprefix(text + ': ')}") from None
    classes = params.get("protect-classes")
    protected = (
        frozenset(c.strip() for c in classes.split(",") if c.strip())
        if classes is not None
        else frozenset(DEFAULT_PROTECTED)
    )
    return replace(spec, text=source), protected


def _by_pod(samples: list[tuple[str, dict[str, str], float]]) -> dict[tuple[str, str], dict]:
    return {(s[1].get("namespace", ""), s[1].get("pod", "")): s[1] for s in samples}


def _kept(labels: dict[str, str], keys: tuple[str, ...], prefix: str) -> dict[str, str]:
    out = {}
    for key in keys:
        value = labels.get(f"{prefix}{sanitize(key)}")
        if value:
            out[key] = value
    return out


def _nodes(results: dict[str, list], spec: KubeSpec) -> list[NodeRecord]:
    label_keys = (*spec.rack_labels, *spec.pool_labels, *NODE_LABELS)
    labels = {
        s[1].get("node", ""): _kept(s[1], label_keys, "label_") for s in results["node_labels"]
    }
    allocatable: dict[str, dict[str, float]] = defaultdict(dict)
    for _, series, value in results["allocatable"]:
        allocatable[series.get("node", "")][resource_name(series.get("resource", ""))] = value
    unschedulable = {s[1].get("node", ""): s[2] > 0 for s in results["unschedulable"]}
    taints: dict[str, list[tuple[str, str, str]]] = defaultdict(list)
    for _, series, value in results["taints"]:
        if value > 0:
            taints[series.get("node", "")].append(
                (series.get("key", ""), series.get("value", ""), series.get("effect", ""))
            )
    ready = {s[1].get("node", "") for s in results["ready"] if s[2] > 0}
    names = sorted({s[1].get("node", "") for s in results["node_info"]} - {""})
    out = []
    for name in names:
        have = allocatable.get(name, {})
        mig = {
            key.removeprefix(MIG_PREFIX): int(value)
            for key, value in have.items()
            if key.startswith(MIG_PREFIX) and value > 0
        }
        out.append(
            NodeRecord(
                name=name,
                labels=labels.get(name, {}),
                gpus=have.get(GPU, 0.0),
                mig=mig,
                cpu_milli=have.get("cpu", math.nan) * 1000.0,
                memory_mib=have.get("memory", math.nan) / 2.0**20,
                unschedulable=unschedulable.get(name, False),
                taints=tuple(taints.get(name, ())),
                ready=name in ready,
            )
        )
    return out


def _pods(results: dict[str, list], spec: KubeSpec, protected: frozenset[str]) -> list[PodRecord]:
    phases = {
        (s[1].get("namespace", ""), s[1].get("pod", "")): s[1]["phase"] for s in results["phase"]
    }
    info = _by_pod(results["pod_info"])
    owners = _by_pod(results["owner"])
    pod_labels = _by_pod(results["pod_labels"])
    annotations = _by_pod(results["pod_annotations"])
    created = {(s[1].get("namespace", ""), s[1].get("pod", "")): s[2] for s in results["created"]}
    started = {(s[1].get("namespace", ""), s[1].get("pod", "")): s[2] for s in results["started"]}
    requests: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    for _, series, value in results["requests"]:
        key = (series.get("namespace", ""), series.get("pod", ""))
        requests[key][resource_name(series.get("resource", ""))] = value
    tenant_keys = (spec.tenant_label,) if spec.tenant == "label" else ()
    out = []
    for key, phase in phases.items():
        meta = info.get(key, {})
        asked = requests.get(key, {})
        owner = owners.get(key, {})
        kept_annotations = _kept(annotations.get(key, {}), KEPT_ANNOTATIONS, "annotation_")
        priority_class = meta.get("priority_class", "")
        if priority_class in protected and MIGRATABLE_ANNOTATION not in kept_annotations:
            kept_annotations[MIGRATABLE_ANNOTATION] = "false"
        gpus = asked.get(GPU, 0.0)
        share = None
        cores = asked.get("nvidia.com/gpucores")
        if cores and gpus > 0:
            share = min(1.0, cores / 100.0)
        out.append(
            PodRecord(
                namespace=key[0],
                name=key[1],
                uid=meta.get("uid", ""),
                node=meta.get("node", ""),
                phase=phase,
                gpus=gpus,
                mig={
                    k.removeprefix(MIG_PREFIX): int(v)
                    for k, v in asked.items()
                    if k.startswith(MIG_PREFIX) and v > 0
                },
                share=share,
                share_limit=share,
                share_memory_mib=None,
                share_memory_limit_mib=None,
                cpu_milli=asked.get("cpu", math.nan) * 1000.0,
                memory_mib=asked.get("memory", math.nan) / 2.0**20,
                priority=0,
                priority_class=priority_class,
                created=created.get(key, math.nan),
                started=started.get(key, math.nan),
                owner_kind=owner.get("owner_kind", meta.get("created_by_kind", "")),
                owner_name=owner.get("owner_name", meta.get("created_by_name", "")),
                labels=_kept(pod_labels.get(key, {}), (*POD_LABELS, *tenant_keys), "label_"),
                annotations=kept_annotations,
                node_selector_product="",
            )
        )
    return out


def _quotas(results: dict[str, list]) -> list[dict[str, Any]]:
    return [
        {
            "metadata": {
                "namespace": s[1].get("namespace", ""),
                "name": s[1].get("resourcequota", ""),
            },
            "spec": {"hard": {"requests.nvidia.com/gpu": s[2]}},
        }
        for s in results["quota"]
    ]


def read_view(
    client: PrometheusClient,
    source: str,
    params: dict[str, str],
    at: float,
) -> SchedulerView:
    """The scheduler view at `at` from kube-state-metrics series in Prometheus."""
    spec, protected = parse_options(source, params)
    results = {name: client.instant(query, at) for name, query in QUERIES.items()}
    notes = [
        "kube-state-metrics exports no pod priority (only its class): priority-threshold does "
        "not apply; pods of the classes "
        + (", ".join(sorted(protected)) or "(none)")
        + " are not migratable"
    ]
    if not results["node_info"]:
        notes.append("no kube_node_info series: is kube-state-metrics scraped by this Prometheus?")
    objects = convert.Objects(
        nodes=_nodes(results, spec),
        pods=_pods(results, spec, protected),
        quotas=_quotas(results),
        custom={},
        notes=tuple(notes),
        timestamp=at,
    )
    view = convert.view(objects, spec)
    if not view.rack_from and view.nodes:
        notes.append(
            "kube-state-metrics exports node labels only when its --metric-labels-allowlist "
            "names them: add the rack label there (nodes=[...]) and rack-label= here"
        )
    return replace(view, kind=KIND, source=source, notes=(*view.notes, *notes[1:]))


__all__ = ["OPTIONS", "SpecError", "read_view", "sanitize"]
