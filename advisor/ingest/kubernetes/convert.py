"""Kubernetes objects (as records and custom-resource JSON) -> one `SchedulerView`. Pure.

Nodes: GPU nodes only (allocatable `nvidia.com/gpu` or MIG resources, or GPU feature discovery
labels). Pool and rack from the first of the spec's label keys any node carries (a node without
it: unknown); GPU model, count and memory from GPU feature discovery; whole GPUs a time-sliced
node hands out are its allocatable / `nvidia.com/gpu.replicas`. Not free capacity: cordoned
(`spec.unschedulable`), NotReady, or a NoSchedule/NoExecute taint no GPU pod tolerates (GPU
nodes are commonly tainted so that only GPU pods land there: a taint GPU pods tolerate, or one
of the usual dedication keys `DEDICATION_TAINTS`, is a dedication, not a cordon).

Pods: every pod that asks for GPUs, and every other pod on a GPU node (its CPU and memory count
against the node). Bound pods are placed; Pending pods without a node are the queue. One job (the
gang) per:
coscheduling PodGroup (`scheduling.x-k8s.io/pod-group` label; its `minMember` is the gang
size), Volcano PodGroup (`scheduling.k8s.io/group-name` annotation; `minMember`, and its queue),
Kueue pod group (`kueue.x-k8s.io/pod-group-name`, `...-total-count`), JobSet, LeaderWorkerSet
group (size annotation), Kubeflow training job, RayCluster, or the controlling owner (Job,
MPIJob, PyTorchJob...). Replicas of a Deployment, ReplicaSet, StatefulSet or DaemonSet are jobs
of one pod each: they do not start or stop together.

Kueue: a Workload that is neither admitted nor finished is waiting; its Job is suspended and has
no pods, so its pod sets become the queue's tasks (the gang is their count). Admitted ones give
their Job's pods their gang size.

Quotas: ResourceQuota `requests.nvidia.com/gpu` per namespace; Kueue ClusterQueue nominal quota
of `nvidia.com/gpu` summed over its flavors (and per GPU model where a ResourceFlavor's node
labels name `nvidia.com/gpu.product`), its cohort, borrowing and lending limits; Volcano Queue
`deserved` (the quota) and `capability` (the most it may reach by borrowing). A queue's quota
belongs to the tenant its workloads have: with `tenant=queue` the queue itself; with
`tenant=namespace` the one namespace using it (a queue several namespaces share is noted, not
guessed onto one of them).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from advisor.ingest import movability
from advisor.ingest.kubernetes.records import (
    COUNT_LABEL,
    GPU,
    MEMORY_LABEL,
    MIG_STRATEGY_LABEL,
    PRODUCT_LABEL,
    REPLICAS_LABEL,
    ZONE_LABEL,
    NodeRecord,
    PodRecord,
    pod_requests,
    quantity,
    timestamp,
)
from advisor.ingest.kubernetes.spec import KubeSpec
from advisor.model import MILLI
from advisor.scheduler_view import Quota, SchedNode, SchedTask, SchedulerView

COSCHEDULING_LABELS = ("scheduling.x-k8s.io/pod-group", "pod-group.scheduling.sigs.k8s.io")
VOLCANO_GROUP = "scheduling.k8s.io/group-name"
KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
KUEUE_GROUP = "kueue.x-k8s.io/pod-group-name"
KUEUE_GROUP_TOTAL = "kueue.x-k8s.io/pod-group-total-count"
JOBSET = "jobset.sigs.k8s.io/jobset-name"
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP = "leaderworkerset.sigs.k8s.io/group-index"
LWS_SIZE = "leaderworkerset.sigs.k8s.io/size"
TRAINING_JOB = "training.kubeflow.org/job-name"
RAY_CLUSTER = "ray.io/cluster"
QUOTA_KEY = "requests.nvidia.com/gpu"
REPLICA_CONTROLLERS = frozenset({"ReplicaSet", "Deployment", "StatefulSet", "DaemonSet"})
# taints that take a node out of service whoever tolerates them
CORDON_TAINTS = frozenset(
    {
        "node.kubernetes.io/unschedulable",
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
        "node.kubernetes.io/network-unavailable",
        "node.cloudprovider.kubernetes.io/shutdown",
        "ToBeDeletedByClusterAutoscaler",
        "karpenter.sh/disrupted",
    }
)
# taints that dedicate GPU nodes to GPU work (the GPU operator's and the clouds' convention):
# never a cordon, even while no pod tolerating them runs
DEDICATION_TAINTS = frozenset({"nvidia.com/gpu", "sku", "dedicated", "gpu"})


@dataclass(frozen=True)
class Objects:
    """One read of the cluster: records of nodes and pods, JSON of the rest. A custom resource
    absent from `custom` is not installed (or not readable: `notes` says which)."""

    nodes: list[NodeRecord]
    pods: list[PodRecord]
    quotas: list[dict[str, Any]]
    custom: Mapping[str, list[dict[str, Any]]]
    notes: tuple[str, ...] = ()
    timestamp: float = math.nan
    stale: str = ""


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("metadata") or {}


def _ns_name(obj: dict[str, Any]) -> tuple[str, str]:
    meta = _meta(obj)
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind:
            return condition
    return None


def _one_line(text: Any, most: int = 200) -> str:
    return " ".join(str(text or "").split())[:most]


def _first_label(nodes: list[NodeRecord], keys: tuple[str, ...]) -> str:
    for key in keys:
        if any(key in node.labels for node in nodes):
            return key
    return ""


def product_name(label: str) -> str:
    """A GPU feature discovery product label without its sharing suffixes
    ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb" or "...-SHARED" -> "NVIDIA-A100-SXM4-40GB")."""
    name = label.removesuffix("-SHARED")
    cut = name.find("-MIG-")
    return name[:cut] if cut > 0 else name


def _tolerated(taint: tuple[str, str, str], tolerations: Iterable[tuple[str, str, str, str]]):
    key, value, effect = taint
    for t_key, operator, t_value, t_effect in tolerations:
        if t_effect and t_effect != effect:
            continue
        if not t_key and operator == "Exists":
            return True
        if t_key == key and (operator == "Exists" or t_value == value):
            return True
    return False


# --------------------------------------------------------------------------- nodes


def _is_gpu_node(node: NodeRecord) -> bool:
    return node.gpus > 0 or bool(node.mig) or COUNT_LABEL in node.labels


def single_mig_profile(labels: Mapping[str, str]) -> str:
    """The MIG profile of a node under the `single` MIG strategy, where `nvidia.com/gpu` counts
    MIG instances of one profile and the product label says which ("NVIDIA-A100-SXM4-40GB-MIG-
    1g.5gb" -> "1g.5gb"); "" otherwise."""
    product = labels.get(PRODUCT_LABEL, "")
    cut = product.find("-MIG-")
    if cut < 0 and labels.get(MIG_STRATEGY_LABEL) != "single":
        return ""
    return product[cut + len("-MIG-") :] if cut >= 0 else ""


def _sched_node(
    node: NodeRecord,
    rack_key: str,
    pool_key: str,
    tolerations: set[tuple[str, str, str, str]],
) -> SchedNode:
    labels = node.labels
    replicas = max(1, int(quantity(labels.get(REPLICAS_LABEL, "1")) or 1))
    profile = single_mig_profile(labels)
    physical = quantity(labels.get(COUNT_LABEL, "nan"))
    memory_mib = quantity(labels.get(MEMORY_LABEL, "nan"))
    reasons = []
    if node.unschedulable:
        reasons.append("cordoned")
    if not node.ready:
        reasons.append("NotReady")
    for taint in node.taints:
        if taint[0] in DEDICATION_TAINTS and taint[0] not in CORDON_TAINTS:
            continue
        if taint[0] in CORDON_TAINTS or not _tolerated(taint, tolerations):
            key, value, effect = taint
            reasons.append(f"taint {key}{'=' + value if value else ''}:{effect}")
    return SchedNode(
        name=node.name,
        pool=labels.get(pool_key, "") if pool_key else "",
        rack=labels.get(rack_key, "") if rack_key else "",
        zone=labels.get(ZONE_LABEL, ""),
        gpu_model=product_name(labels.get(PRODUCT_LABEL, "")),
        gpus=0 if profile else int(node.gpus // replicas),
        mig={profile: int(node.gpus)} if profile else dict(node.mig),
        physical_gpus=None if math.isnan(physical) else int(physical),
        gpu_memory_bytes=memory_mib * 2.0**20,
        cpu_milli=node.cpu_milli,
        memory_mib=node.memory_mib,
        schedulable=not reasons,
        unschedulable_reason=", ".join(reasons),
    )


# --------------------------------------------------------------------------- jobs


@dataclass
class _Groups:
    """Gang facts from the custom resources."""

    volcano: dict[tuple[str, str], dict[str, Any]]
    coscheduling: dict[tuple[str, str], dict[str, Any]]
    kueue_by_owner: dict[tuple[str, str, str], dict[str, Any]]  # (ns, kind, name) -> workload
    local_queues: dict[tuple[str, str], str]  # (ns, local queue) -> cluster queue


def _groups(custom: Mapping[str, list[dict[str, Any]]]) -> _Groups:
    volcano = {_ns_name(g): g for g in custom.get("volcano-podgroups", [])}
    cosched = {_ns_name(g): g for g in custom.get("coscheduling-podgroups", [])}
    by_owner: dict[tuple[str, str, str], dict[str, Any]] = {}
    for workload in custom.get("workloads", []):
        ns, _ = _ns_name(workload)
        for ref in _meta(workload).get("ownerReferences") or []:
            by_owner[(ns, str(ref.get("kind", "")), str(ref.get("name", "")))] = workload
    queues = {
        _ns_name(lq): str((lq.get("spec") or {}).get("clusterQueue", ""))
        for lq in custom.get("localqueues", [])
    }
    return _Groups(volcano, cosched, by_owner, queues)


def _podset_total(workload: dict[str, Any]) -> int:
    return sum(
        int(ps.get("count", 1) or 0) for ps in (workload.get("spec") or {}).get("podSets") or []
    )


def _min_member(group: dict[str, Any]) -> int | None:
    value = (group.get("spec") or {}).get("minMember")
    return int(value) if isinstance(value, int) and value > 0 else None


def _job_of(pod: PodRecord, groups: _Groups) -> tuple[str, int | None, str]:
    """(job, declared gang size, controller kind for movability) of a pod."""
    ns, labels, notes = pod.namespace, pod.labels, pod.annotations
    kind, owner = pod.owner_kind, pod.owner_name
    controller = kind
    if kind == "ReplicaSet" and "pod-template-hash" in labels:
        controller = "Deployment"
    for label in COSCHEDULING_LABELS:
        if label in labels:
            group = groups.coscheduling.get((ns, labels[label]))
            return f"{ns}/{labels[label]}", _min_member(group) if group else None, controller
    if VOLCANO_GROUP in notes:
        name = notes[VOLCANO_GROUP]
        group = groups.volcano.get((ns, name))
        return f"{ns}/{name}", _min_member(group) if group else None, controller
    if KUEUE_GROUP in labels:
        total = quantity(notes.get(KUEUE_GROUP_TOTAL, "nan"))
        return f"{ns}/{labels[KUEUE_GROUP]}", None if math.isnan(total) else int(total), controller
    if LWS_NAME in labels:
        size = quantity(notes.get(LWS_SIZE, "nan"))
        job = f"{ns}/{labels[LWS_NAME]}/{labels.get(LWS_GROUP, '0')}"
        return job, None if math.isnan(size) else int(size), "LeaderWorkerSet"
    if JOBSET in labels:
        return f"{ns}/{labels[JOBSET]}", None, "JobSet"
    if TRAINING_JOB in labels:
        return f"{ns}/{labels[TRAINING_JOB]}", None, controller or "PyTorchJob"
    if RAY_CLUSTER in labels:
        return f"{ns}/{labels[RAY_CLUSTER]}", None, "RayCluster"
    if kind and kind not in REPLICA_CONTROLLERS:
        workload = groups.kueue_by_owner.get((ns, kind, owner))
        return f"{ns}/{owner}", _podset_total(workload) if workload else None, controller
    return pod.key, None, controller


def _tenant_of(pod_ns: str, labels: Mapping[str, str], queue: str, spec: KubeSpec) -> str:
    if spec.tenant == "label":
        return labels.get(spec.tenant_label) or pod_ns
    if spec.tenant == "queue":
        return queue or pod_ns
    return pod_ns


def _pod_queue(pod: PodRecord, groups: _Groups) -> str:
    """The Kueue ClusterQueue of the pod's LocalQueue, else its Volcano PodGroup's queue."""
    local = pod.labels.get(KUEUE_QUEUE)
    if local:
        return groups.local_queues.get((pod.namespace, local), "")
    name = pod.annotations.get(VOLCANO_GROUP)
    if name:
        group = groups.volcano.get((pod.namespace, name))
        if group:
            return str((group.get("spec") or {}).get("queue", "") or "default")
    return ""


# --------------------------------------------------------------------------- tasks


@dataclass
class _Notes:
    bad_annotations: list[str]
    unknown_memory_share: list[str]

    def lines(self) -> list[str]:
        out = []
        if self.bad_annotations:
            out.append(
                f"{len(self.bad_annotations)} pod annotation(s) not understood (the default "
                f"applies): {'; '.join(self.bad_annotations[:3])}"
            )
        if self.unknown_memory_share:
            out.append(
                f"{len(self.unknown_memory_share)} pod(s) ask for a share of GPU memory on a node "
                "whose GPU memory is unknown (no nvidia.com/gpu.memory label): counted as whole "
                f"GPUs: {', '.join(self.unknown_memory_share[:3])}"
            )
        return out


def _gpu_shape(
    pod: PodRecord, node: SchedNode | None, replicas: int, notes: _Notes, single: str = ""
) -> tuple[int, int, int | None, str]:
    """(num_gpu, milli per GPU, limit milli, MIG profile); `single`: the node's profile under
    the single MIG strategy, where `nvidia.com/gpu` hands out its MIG instances."""
    if pod.mig:
        profile, count = next(iter(sorted(pod.mig.items())))
        return count, MILLI, None, profile
    if single and pod.gpus > 0 and pod.share is None:
        return max(1, math.ceil(pod.gpus)), MILLI, None, single
    whole = max(1, math.ceil(pod.gpus)) if pod.gpus > 0 else 0
    share, limit = pod.share, pod.share_limit
    if share is None and pod.share_memory_mib is not None:
        per_gpu = node.gpu_memory_bytes / 2.0**20 if node is not None else math.nan
        if math.isnan(per_gpu) or per_gpu <= 0:
            notes.unknown_memory_share.append(pod.key)
        else:
            share = min(1.0, pod.share_memory_mib / per_gpu)
            limit = min(1.0, (pod.share_memory_limit_mib or pod.share_memory_mib) / per_gpu)
    if share is not None:
        milli = max(1, round(share * MILLI))
        return max(1, whole), milli, round((limit or share) * MILLI), ""
    if replicas > 1 and whole:  # time-sliced: each replica is a share of one GPU
        return 1, min(MILLI, round(MILLI * pod.gpus / replicas)), None, ""
    return whole, MILLI, None, ""


def _task(
    pod: PodRecord,
    node: SchedNode | None,
    replicas: int,
    groups: _Groups,
    spec: KubeSpec,
    notes: _Notes,
    single: str = "",
) -> tuple[SchedTask, int | None]:
    job, gang, controller = _job_of(pod, groups)
    num_gpu, milli, limit, profile = _gpu_shape(pod, node, replicas, notes, single)
    allowed, why = movability.migratable(
        pod.annotations.get(movability.MIGRATABLE_ANNOTATION),
        pod.priority,
        controller,
        spec.priority_threshold,
    )
    if why and allowed:  # a malformed annotation on movable work
        notes.bad_annotations.append(f"{pod.key}: {why}")
    elif "is not true or false" in why:
        notes.bad_annotations.append(f"{pod.key}: {why.split(';')[0]}")
    restart, problem = movability.restart_cost_s(
        pod.annotations.get(movability.RESTART_COST_ANNOTATION)
    )
    if problem:
        notes.bad_annotations.append(f"{pod.key}: {problem}")
    task = SchedTask(
        id=pod.key,
        job=job,
        node=pod.node or None,
        num_gpu=num_gpu,
        gpu_milli=milli if num_gpu else MILLI,
        gpu_limit_milli=limit,
        mig_profile=profile,
        tenant=_tenant_of(pod.namespace, pod.labels, _pod_queue(pod, groups), spec),
        priority=pod.priority,
        cpu_milli=pod.cpu_milli,
        memory_mib=pod.memory_mib,
        gpu_spec=pod.node_selector_product,
        start_time=pod.started,
        creation_time=pod.created,
        migratable=allowed,
        migratable_why=why,
        restart_cost_s=restart,
        qos=pod.priority_class,
        owner=f"{pod.owner_kind}/{pod.owner_name}" if pod.owner_kind else "",
    )
    return task, gang


def _waiting_workloads(
    custom: Mapping[str, list[dict[str, Any]]],
    jobs_seen: set[str],
    groups: _Groups,
    spec: KubeSpec,
) -> tuple[list[SchedTask], dict[str, int], dict[str, str]]:
    """Kueue workloads neither admitted nor finished whose Job has no pods yet: the queue."""
    tasks: list[SchedTask] = []
    gangs: dict[str, int] = {}
    reasons: dict[str, str] = {}
    for workload in custom.get("workloads", []):
        status = workload.get("status") or {}
        finished = _condition(workload, "Finished")
        admitted = _condition(workload, "Admitted")
        if status.get("admission") or (admitted and admitted.get("status") == "True"):
            continue
        if finished and finished.get("status") == "True":
            continue
        ns, name = _ns_name(workload)
        refs = _meta(workload).get("ownerReferences") or []
        job = f"{ns}/{refs[0].get('name')}" if refs else f"{ns}/{name}"
        if job in jobs_seen:
            continue
        wl_spec = workload.get("spec") or {}
        cluster_queue = groups.local_queues.get((ns, str(wl_spec.get("queueName", ""))), "")
        tenant = _tenant_of(ns, _meta(workload).get("labels") or {}, cluster_queue, spec)
        priority = wl_spec.get("priority")
        priority = int(priority) if isinstance(priority, int) else 0
        created = timestamp(_meta(workload).get("creationTimestamp"))
        total = 0
        for podset in wl_spec.get("podSets") or []:
            template = (podset.get("template") or {}).get("spec") or {}
            requests = pod_requests(template)
            gpus = requests.get(GPU, 0.0)
            count = int(podset.get("count", 1) or 0)
            total += count
            if not gpus > 0:
                continue
            allowed, why = movability.migratable(
                None, priority, "Workload", spec.priority_threshold
            )
            for i in range(count):
                tasks.append(
                    SchedTask(
                        id=f"{ns}/{name}/{podset.get('name', 'main')}-{i}",
                        job=job,
                        node=None,
                        num_gpu=math.ceil(gpus),
                        tenant=tenant,
                        priority=priority,
                        cpu_milli=requests.get("cpu", math.nan) * 1000.0,
                        memory_mib=requests.get("memory", math.nan) / 2.0**20,
                        creation_time=created,
                        migratable=allowed,
                        migratable_why=why,
                        owner=f"Workload/{name}",
                    )
                )
        gangs[job] = total
        reserved = _condition(workload, "QuotaReserved")
        if reserved is not None and reserved.get("status") == "False":
            reasons[job] = f"Kueue: {_one_line(reserved.get('message') or reserved.get('reason'))}"
        else:
            reasons[job] = "Kueue: waiting for admission"
    return tasks, gangs, reasons


# --------------------------------------------------------------------------- quotas


def _flavor_models(custom: Mapping[str, list[dict[str, Any]]]) -> dict[str, str]:
    out = {}
    for flavor in custom.get("resourceflavors", []):
        labels = (flavor.get("spec") or {}).get("nodeLabels") or {}
        if PRODUCT_LABEL in labels:
            out[str(_meta(flavor).get("name", ""))] = product_name(str(labels[PRODUCT_LABEL]))
    return out


def _sum_optional(values: list[float | None]) -> float | None:
    return (
        None if any(v is None for v in values) else float(sum(v for v in values if v is not None))
    )


def _queue_tenants(
    owners: Mapping[str, set[str]], queue: str, kind: str, spec: KubeSpec, notes: list[str]
) -> str | None:
    """The tenant a queue's quota belongs to (module docstring); None (noted) when shared."""
    if spec.tenant == "queue":
        return queue
    namespaces = sorted(owners.get(queue, set()))
    if len(namespaces) == 1:
        return namespaces[0]
    if not namespaces:
        return queue  # no namespace uses it: its own name, so the merge still shows it
    notes.append(
        f"{kind} {queue} is used by namespaces {', '.join(namespaces)}: its quota caps them "
        "together, which per-namespace tenants cannot say (use k8s:?tenant=queue)"
    )
    return None


def _quotas(
    objects: Objects, groups: _Groups, spec: KubeSpec, tenants_of_ns: Mapping[str, set[str]]
) -> tuple[list[Quota], list[str]]:
    quotas: list[Quota] = []
    notes: list[str] = []
    for rq in objects.quotas:
        hard = (rq.get("spec") or {}).get("hard") or {}
        if QUOTA_KEY not in hard:
            continue
        ns, name = _ns_name(rq)
        gpus = quantity(hard[QUOTA_KEY])
        if math.isnan(gpus):
            notes.append(f"ResourceQuota {ns}/{name}: {QUOTA_KEY}={hard[QUOTA_KEY]!r} not read")
            continue
        tenant = ns
        if spec.tenant != "namespace":
            held = sorted(tenants_of_ns.get(ns, {ns}))
            if len(held) != 1:
                notes.append(
                    f"ResourceQuota {ns}/{name} caps namespace {ns}, whose pods belong to tenants "
                    f"{', '.join(held)}: not a tenant quota here"
                )
                continue
            tenant = held[0]
        quotas.append(Quota(tenant, gpus, origin=f"ResourceQuota {ns}/{name}"))
    custom = objects.custom
    cq_namespaces: dict[str, set[str]] = defaultdict(set)
    for (ns, _), cq in groups.local_queues.items():
        cq_namespaces[cq].add(ns)
    models = _flavor_models(custom)
    for cq in custom.get("clusterqueues", []):
        name = str(_meta(cq).get("name", ""))
        cq_spec = cq.get("spec") or {}
        cohort = str(cq_spec.get("cohort") or cq_spec.get("cohortName") or "")
        nominal: list[float] = []
        borrowing: list[float | None] = []
        lending: list[float | None] = []
        per_model: dict[str, float] = defaultdict(float)
        for group in cq_spec.get("resourceGroups") or []:
            for flavor in group.get("flavors") or []:
                for resource in flavor.get("resources") or []:
                    if resource.get("name") != GPU:
                        continue
                    value = quantity(resource.get("nominalQuota", 0))
                    nominal.append(value)
                    borrow = resource.get("borrowingLimit")
                    lend = resource.get("lendingLimit")
                    borrowing.append(None if borrow is None else quantity(borrow))
                    lending.append(None if lend is None else quantity(lend))
                    model = models.get(str(flavor.get("name", "")))
                    if model:
                        per_model[model] += value
        if not nominal:
            continue
        tenant = _queue_tenants(cq_namespaces, name, "ClusterQueue", spec, notes)
        if tenant is None:
            continue
        origin = f"ClusterQueue {name}" + (f" (cohort {cohort})" if cohort else "")
        quotas.append(
            Quota(
                tenant,
                float(sum(nominal)),
                origin=origin,
                cohort=cohort,
                borrowing_limit=_sum_optional(borrowing),
                lending_limit=_sum_optional(lending),
                borrows=bool(cohort),
            )
        )
        if len(per_model) > 1 or (per_model and sum(per_model.values()) < sum(nominal)):
            quotas += [
                Quota(tenant, gpus, gpu_model=model, origin=origin, cohort=cohort)
                for model, gpus in per_model.items()
            ]
    volcano_namespaces: dict[str, set[str]] = defaultdict(set)
    for (ns, _), group in groups.volcano.items():
        volcano_namespaces[str((group.get("spec") or {}).get("queue", "") or "default")].add(ns)
    for queue in custom.get("volcano-queues", []):
        name = str(_meta(queue).get("name", ""))
        q_spec = queue.get("spec") or {}
        capability = quantity((q_spec.get("capability") or {}).get(GPU, "nan"))
        deserved = quantity((q_spec.get("deserved") or {}).get(GPU, "nan"))
        if math.isnan(capability) and math.isnan(deserved):
            continue
        tenant = _queue_tenants(volcano_namespaces, name, "Volcano Queue", spec, notes)
        if tenant is None:
            continue
        reclaimable = q_spec.get("reclaimable", True) is not False
        if math.isnan(deserved):
            quotas.append(Quota(tenant, capability, origin=f"Volcano Queue {name} (capability)"))
            continue
        limit = None if math.isnan(capability) else max(0.0, capability - deserved)
        quotas.append(
            Quota(
                tenant,
                deserved,
                origin=f"Volcano Queue {name} (deserved"
                + ("" if limit is None else f", capability {capability:g}")
                + ")",
                cohort="volcano",
                borrowing_limit=limit,
                lending_limit=None if reclaimable else 0.0,
                borrows=limit is None or limit > 0,
            )
        )
    return quotas, notes


# --------------------------------------------------------------------------- the view


def view(objects: Objects, spec: KubeSpec) -> SchedulerView:
    """The scheduler view of one read (module docstring)."""
    gpu_nodes = [n for n in objects.nodes if _is_gpu_node(n)]
    rack_key = _first_label(gpu_nodes, spec.rack_labels)
    pool_key = _first_label(gpu_nodes, spec.pool_labels)
    tolerations = {t for p in objects.pods if p.wants_gpu for t in p.tolerations}
    nodes = [_sched_node(n, rack_key, pool_key, tolerations) for n in gpu_nodes]
    by_name = {n.name: n for n in nodes}
    replicas = {
        n.name: max(1, int(quantity(n.labels.get(REPLICAS_LABEL, "1")) or 1)) for n in gpu_nodes
    }
    singles = {n.name: single_mig_profile(n.labels) for n in gpu_nodes}
    groups = _groups(objects.custom)
    notes = _Notes([], [])
    tasks: list[SchedTask] = []
    gangs: dict[str, int] = {}
    reasons: dict[str, str] = {}
    tenants_of_ns: dict[str, set[str]] = defaultdict(set)
    for pod in objects.pods:
        if not (pod.wants_gpu or pod.node in by_name):
            continue  # neither GPU work nor on a GPU node
        task, gang = _task(
            pod,
            by_name.get(pod.node),
            replicas.get(pod.node, 1),
            groups,
            spec,
            notes,
            singles.get(pod.node, ""),
        )
        tasks.append(task)
        if task.num_gpu:
            tenants_of_ns[pod.namespace].add(task.tenant)
        if gang:
            gangs[task.job] = gang
        if task.node is None and pod.unschedulable_message:
            reasons.setdefault(task.job, pod.unschedulable_message)
    waiting, wl_gangs, wl_reasons = _waiting_workloads(
        objects.custom, {t.job for t in tasks}, groups, spec
    )
    tasks += waiting
    gangs.update(wl_gangs)
    reasons.update(wl_reasons)
    quotas, quota_notes = _quotas(objects, groups, spec, tenants_of_ns)
    lines = list(objects.notes)
    if not rack_key and gpu_nodes:
        lines.append(
            "no GPU node has a rack label (tried "
            + ", ".join(spec.rack_labels)
            + "): racks unknown; give k8s:?rack-label=KEY"
        )
    elif rack_key:
        missing = sum(1 for n in gpu_nodes if rack_key not in n.labels)
        if missing:
            lines.append(
                f"{missing} GPU node(s) lack the rack label {rack_key}: rack unknown there"
            )
    cordoned = Counter(n.unschedulable_reason for n in nodes if not n.schedulable)
    if cordoned:
        lines.append(
            f"{sum(cordoned.values())} GPU node(s) are not free capacity: "
            + "; ".join(f"{reason} ({count})" for reason, count in cordoned.most_common(3))
        )
    lines += notes.lines() + quota_notes
    return SchedulerView(
        kind="kubernetes",
        source=spec.text,
        nodes=tuple(nodes),
        tasks=tuple(tasks),
        quotas=tuple(quotas),
        gang_size=gangs,
        rack_from=f"node label {rack_key}" if rack_key else "",
        pool_from=f"node label {pool_key}" if pool_key else "",
        notes=tuple(lines),
        timestamp=objects.timestamp,
        stale=objects.stale,
        waiting_reason=reasons,
    )
