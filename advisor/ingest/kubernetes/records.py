"""The few fields of each Kubernetes object the advisor uses, cut out of its JSON at once.

A cache of 100,000 pods keeps these small records, never the objects (a pod's JSON is kilobytes:
managed fields, env, volumes). `node_record` and `pod_record` read the API's own shapes (core/v1
Node and Pod); custom resources (Kueue, Volcano, coscheduling) are few and kept as their JSON.

GPU resources a pod asks for, per container, `resources.limits` first (extended resources must
have request == limit, and a request given alone defaults to it) then `requests`:

- `nvidia.com/gpu` whole GPUs (on a time-sliced node, `nvidia.com/gpu.replicas` > 1, each is a
  replica: a 1/replicas share of a GPU);
- `nvidia.com/mig-<profile>` MIG instances (the mixed strategy);
- HAMi-style sharing: `nvidia.com/gpucores` (percent of a GPU's compute) or
  `nvidia.com/gpumem-percentage`, or `nvidia.com/gpumem` (MiB) beside `nvidia.com/gpu`;
- Run:ai-style fractions: the annotations `gpu-fraction` (guaranteed share) and
  `gpu-fraction-limit` (what it may burst to), or `gpu-memory` / `gpu-memory-limit` (MiB).

A pod's request is the sum over its containers, or the largest init container's when that is
more (the scheduler's own rule).
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from advisor.ingest.kubernetes import shapes
from advisor.ingest.movability import MIGRATABLE_ANNOTATION, RESTART_COST_ANNOTATION

GPU = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"
HAMI_CORES = "nvidia.com/gpucores"
HAMI_MEMORY = "nvidia.com/gpumem"
HAMI_MEMORY_PERCENT = "nvidia.com/gpumem-percentage"
RUNAI_FRACTION = "gpu-fraction"
RUNAI_FRACTION_LIMIT = "gpu-fraction-limit"
RUNAI_MEMORY = "gpu-memory"
RUNAI_MEMORY_LIMIT = "gpu-memory-limit"
# GPU feature discovery (NVIDIA GPU operator) node labels
PRODUCT_LABEL = "nvidia.com/gpu.product"
COUNT_LABEL = "nvidia.com/gpu.count"
MEMORY_LABEL = "nvidia.com/gpu.memory"  # MiB per GPU
REPLICAS_LABEL = "nvidia.com/gpu.replicas"
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
MIG_CONFIG_LABEL = "nvidia.com/mig.config"
ZONE_LABEL = "topology.kubernetes.io/zone"
KEPT_ANNOTATIONS = (
    MIGRATABLE_ANNOTATION,
    RESTART_COST_ANNOTATION,
    RUNAI_FRACTION,
    RUNAI_FRACTION_LIMIT,
    RUNAI_MEMORY,
    RUNAI_MEMORY_LIMIT,
    "scheduling.k8s.io/group-name",  # Volcano
    "kueue.x-k8s.io/pod-group-total-count",
    "leaderworkerset.sigs.k8s.io/size",
)

_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)$")
_SUFFIX = {
    "": 1.0,
    "n": 1e-9,
    "u": 1e-6,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
    "Pi": 2.0**50,
    "Ei": 2.0**60,
}


def quantity(text: Any) -> float:
    """A Kubernetes quantity ("8", "500m", "16Gi", "1e3") as a number; NaN when malformed."""
    if type(text) is str:
        return _quantity_text(text)
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text)
    return _quantity_text(str(text))


@functools.lru_cache(maxsize=4096)
def _quantity_text(text: str) -> float:
    """Quantities repeat ("8", "64Gi"): a 100,000-pod list parses each distinct one once."""
    match = _QUANTITY.match(text.strip())
    if not match or match.group(2) not in _SUFFIX:
        return math.nan
    try:
        return float(match.group(1)) * _SUFFIX[match.group(2)]
    except ValueError:
        return math.nan


def timestamp(text: Any) -> float:
    """RFC 3339 ("2026-01-02T03:04:05Z") as Unix time; NaN when absent or malformed."""
    if not isinstance(text, str) or not text:
        return math.nan
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return math.nan


# --------------------------------------------------------------------------- nodes


@dataclass(slots=True)
class NodeRecord:
    name: str
    labels: dict[str, str]
    gpus: float  # allocatable nvidia.com/gpu
    mig: dict[str, int]  # allocatable MIG instances by profile
    cpu_milli: float
    memory_mib: float
    unschedulable: bool
    taints: tuple[tuple[str, str, str], ...]  # (key, value, effect) of NoSchedule/NoExecute
    ready: bool


def node_record(obj: Any) -> NodeRecord:
    """The record of a Node (a `shapes.Node`, or its JSON)."""
    node = shapes.as_node(obj)
    meta, spec, status = node.metadata, node.spec, node.status
    allocatable = status.allocatable or status.capacity or {}
    mig = {}
    for key, value in allocatable.items():
        if key.startswith(MIG_PREFIX):
            count = quantity(value)
            if count > 0:
                mig[key.removeprefix(MIG_PREFIX)] = int(count)
    taints = tuple(
        (t.key, t.value or "", t.effect)
        for t in spec.taints or ()
        if t.effect in ("NoSchedule", "NoExecute")
    )
    ready = True
    for condition in status.conditions or ():
        if condition.type == "Ready":
            ready = condition.status == "True"
    gpus = quantity(allocatable.get(GPU, 0))
    return NodeRecord(
        name=meta.name,
        labels=meta.labels or {},
        gpus=0.0 if math.isnan(gpus) else gpus,
        mig=mig,
        cpu_milli=quantity(allocatable.get("cpu", "nan")) * 1000.0,
        memory_mib=quantity(allocatable.get("memory", "nan")) / 2.0**20,
        unschedulable=bool(spec.unschedulable),
        taints=taints,
        ready=ready,
    )


# --------------------------------------------------------------------------- pods


@dataclass(slots=True)
class PodRecord:
    namespace: str
    name: str
    uid: str
    node: str  # "" = not bound: the queue
    phase: str
    gpus: float  # whole GPUs (nvidia.com/gpu)
    mig: dict[str, int]
    share: float | None  # guaranteed fraction of one GPU (HAMi/Run:ai), None = whole GPUs
    share_limit: float | None  # the fraction it may burst to
    share_memory_mib: float | None  # a fraction given as GPU memory (resolved per node)
    share_memory_limit_mib: float | None
    cpu_milli: float
    memory_mib: float
    priority: int
    priority_class: str
    created: float
    started: float
    owner_kind: str
    owner_name: str
    labels: dict[str, str]
    annotations: dict[str, str]
    node_selector_product: str  # nvidia.com/gpu.product the pod asks for ("" = any)
    tolerations: tuple[tuple[str, str, str, str], ...] = ()  # (key, operator, value, effect)
    unschedulable_message: str = ""
    gpu_memory_mib: float = math.nan  # HAMi gpumem for display
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def wants_gpu(self) -> bool:
        return (
            self.gpus > 0
            or bool(self.mig)
            or self.share is not None
            or (self.share_memory_mib is not None)
        )


def _container_resources(container: shapes.Container) -> dict[str, float]:
    """A container's requests; a limit given alone is the request (the API server's default,
    and extended resources such as GPUs always have request == limit)."""
    resources = container.resources
    if resources is None:
        return {}
    out: dict[str, float] = {}
    for values in (resources.requests, resources.limits):
        for key, value in (values or {}).items():
            if key not in out:  # (the hot loop of a 100,000-pod list: strings parse cached)
                out[key] = _quantity_text(value) if type(value) is str else quantity(value)
    return out


def pod_requests(spec: Any) -> dict[str, float]:
    """What a pod spec (a `shapes.PodSpec`, or its JSON) asks for: containers summed, or the
    largest init container if more (sidecars, `restartPolicy: Always`, add up)."""
    spec = shapes.as_pod_spec(spec)
    total: dict[str, float] = {}
    for container in spec.containers or ():
        for key, value in _container_resources(container).items():
            if not math.isnan(value):
                total[key] = total.get(key, 0.0) + value
    for container in spec.initContainers or ():
        if container.restartPolicy == "Always":  # a sidecar runs alongside
            for key, value in _container_resources(container).items():
                if not math.isnan(value):
                    total[key] = total.get(key, 0.0) + value
            continue
        for key, value in _container_resources(container).items():
            if not math.isnan(value) and value > total.get(key, 0.0):
                total[key] = value
    return total


def _mib(text: str | None) -> float | None:
    """GPU memory of an annotation: a bare number is MiB, a quantity ("5Gi") bytes."""
    if text is None:
        return None
    value = quantity(text)
    if math.isnan(value) or value <= 0:
        return None
    return value if text.strip()[-1:].isdigit() else value / 2.0**20


def _fraction(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0 < value <= 1 else None


def _owner(meta: shapes.ObjectMeta) -> tuple[str, str]:
    refs = meta.ownerReferences or []
    controller = next((r for r in refs if r.controller), refs[0] if refs else None)
    if controller is None:
        return "", ""
    return controller.kind, controller.name


def _selected_product(spec: shapes.PodSpec) -> str:
    selector = spec.nodeSelector or {}
    if PRODUCT_LABEL in selector:
        return selector[PRODUCT_LABEL]
    affinity = spec.affinity.nodeAffinity if spec.affinity else None
    required = affinity.requiredDuringSchedulingIgnoredDuringExecution if affinity else None
    products: list[str] = []
    for term in (required.nodeSelectorTerms or ()) if required else ():
        for expr in term.matchExpressions or ():
            if expr.key == PRODUCT_LABEL and expr.operator == "In":
                products += list(expr.values or ())
    return "|".join(products)


def pod_record(obj: Any) -> PodRecord | None:
    """The record of a pod (a `shapes.Pod`, or its JSON) that holds or waits for resources;
    None for a finished pod."""
    pod = shapes.as_pod(obj)
    meta, spec, status = pod.metadata, pod.spec, pod.status
    phase = status.phase or "Pending"
    if phase in ("Succeeded", "Failed") or (meta.deletionTimestamp and not spec.nodeName):
        return None
    requests = pod_requests(spec)
    annotations = meta.annotations or {}
    kept = {k: annotations[k] for k in KEPT_ANNOTATIONS if k in annotations}
    gpus = requests.get(GPU, 0.0)
    mig = {
        key.removeprefix(MIG_PREFIX): int(value)
        for key, value in requests.items()
        if key.startswith(MIG_PREFIX) and value > 0
    }
    share = share_limit = memory = memory_limit = None
    if HAMI_CORES in requests and gpus > 0:
        share = share_limit = min(1.0, requests[HAMI_CORES] / 100.0) or None
    elif HAMI_MEMORY_PERCENT in requests and gpus > 0:
        share = share_limit = min(1.0, requests[HAMI_MEMORY_PERCENT] / 100.0) or None
    elif HAMI_MEMORY in requests and gpus > 0:
        memory = memory_limit = requests[HAMI_MEMORY]
    if RUNAI_FRACTION in kept:
        share = _fraction(kept[RUNAI_FRACTION])
        share_limit = _fraction(kept.get(RUNAI_FRACTION_LIMIT)) or share
        gpus = max(gpus, 1.0) if share is not None else gpus
    elif RUNAI_MEMORY in kept and _mib(kept[RUNAI_MEMORY]) is not None:
        memory = _mib(kept[RUNAI_MEMORY])
        memory_limit = _mib(kept.get(RUNAI_MEMORY_LIMIT)) or memory
        gpus = max(gpus, 1.0)
    condition_message = ""
    if not spec.nodeName:
        for condition in status.conditions or ():
            if condition.type == "PodScheduled" and condition.status == "False":
                condition_message = " ".join((condition.message or "").split())[:200]
    owner_kind, owner_name = _owner(meta)
    tolerations: tuple[tuple[str, str, str, str], ...] = ()
    if gpus > 0 or mig or share is not None or memory is not None:  # GPU pods' only
        tolerations = tuple(
            (t.key or "", t.operator or "Equal", t.value or "", t.effect or "")
            for t in spec.tolerations or ()
        )
    return PodRecord(
        namespace=meta.namespace or "",
        name=meta.name,
        uid=meta.uid or "",
        node=spec.nodeName or "",
        phase=phase,
        gpus=0.0 if math.isnan(gpus) else gpus,
        mig=mig,
        share=share,
        share_limit=share_limit,
        share_memory_mib=memory,
        share_memory_limit_mib=memory_limit,
        cpu_milli=requests.get("cpu", math.nan) * 1000.0,
        memory_mib=requests.get("memory", math.nan) / 2.0**20,
        priority=spec.priority if spec.priority is not None else 0,
        priority_class=spec.priorityClassName or "",
        created=timestamp(meta.creationTimestamp),
        started=timestamp(status.startTime),
        owner_kind=owner_kind,
        owner_name=owner_name,
        labels=meta.labels or {},
        annotations=kept,
        node_selector_product=_selected_product(spec),
        tolerations=tolerations,
        unschedulable_message=condition_message,
    )
