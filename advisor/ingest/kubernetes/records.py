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

import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

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
    if isinstance(text, int | float) and not isinstance(text, bool):
        return float(text)
    match = _QUANTITY.match(str(text).strip())
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


def node_record(obj: dict[str, Any]) -> NodeRecord:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    allocatable = status.get("allocatable") or status.get("capacity") or {}
    mig = {}
    for key, value in allocatable.items():
        if key.startswith(MIG_PREFIX):
            count = quantity(value)
            if count > 0:
                mig[key.removeprefix(MIG_PREFIX)] = int(count)
    taints = tuple(
        (str(t.get("key", "")), str(t.get("value", "")), str(t.get("effect", "")))
        for t in spec.get("taints") or []
        if t.get("effect") in ("NoSchedule", "NoExecute")
    )
    ready = True
    for condition in status.get("conditions") or []:
        if condition.get("type") == "Ready":
            ready = condition.get("status") == "True"
    gpus = quantity(allocatable.get(GPU, 0))
    return NodeRecord(
        name=str(meta.get("name", "")),
        labels={str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
        gpus=0.0 if math.isnan(gpus) else gpus,
        mig=mig,
        cpu_milli=quantity(allocatable.get("cpu", "nan")) * 1000.0,
        memory_mib=quantity(allocatable.get("memory", "nan")) / 2.0**20,
        unschedulable=bool(spec.get("unschedulable", False)),
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


def _container_resources(container: dict[str, Any]) -> dict[str, float]:
    """A container's requests; a limit given alone is the request (the API server's default,
    and extended resources such as GPUs always have request == limit)."""
    resources = container.get("resources") or {}
    out = {key: quantity(value) for key, value in (resources.get("requests") or {}).items()}
    for key, value in (resources.get("limits") or {}).items():
        out.setdefault(key, quantity(value))
    return out


def _mib(text: str | None) -> float | None:
    """GPU memory of an annotation: a bare number is MiB, a quantity ("5Gi") bytes."""
    if text is None:
        return None
    value = quantity(text)
    if math.isnan(value) or value <= 0:
        return None
    return value if text.strip()[-1:].isdigit() else value / 2.0**20


def pod_requests(spec: dict[str, Any]) -> dict[str, float]:
    """What the pod asks for: containers summed, or the largest init container if more."""
    total: dict[str, float] = {}
    for container in spec.get("containers") or []:
        for key, value in _container_resources(container).items():
            if not math.isnan(value):
                total[key] = total.get(key, 0.0) + value
    for container in spec.get("initContainers") or []:
        if (container.get("restartPolicy") or "") == "Always":  # a sidecar runs alongside
            for key, value in _container_resources(container).items():
                if not math.isnan(value):
                    total[key] = total.get(key, 0.0) + value
            continue
        for key, value in _container_resources(container).items():
            if not math.isnan(value) and value > total.get(key, 0.0):
                total[key] = value
    return total


def _fraction(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0 < value <= 1 else None


def _owner(meta: dict[str, Any]) -> tuple[str, str]:
    refs = meta.get("ownerReferences") or []
    controller = next((r for r in refs if r.get("controller")), refs[0] if refs else None)
    if controller is None:
        return "", ""
    return str(controller.get("kind", "")), str(controller.get("name", ""))


def _selected_product(spec: dict[str, Any]) -> str:
    selector = spec.get("nodeSelector") or {}
    if PRODUCT_LABEL in selector:
        return str(selector[PRODUCT_LABEL])
    affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    products: list[str] = []
    for term in affinity.get("nodeSelectorTerms") or []:
        for expr in term.get("matchExpressions") or []:
            if expr.get("key") == PRODUCT_LABEL and expr.get("operator") == "In":
                products += [str(v) for v in expr.get("values") or []]
    return "|".join(products)


def pod_record(obj: dict[str, Any]) -> PodRecord | None:
    """The record of a pod that holds or waits for resources; None for a finished pod."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    phase = str(status.get("phase") or "Pending")
    if phase in ("Succeeded", "Failed") or (
        meta.get("deletionTimestamp") and not spec.get("nodeName")
    ):
        return None
    requests = pod_requests(spec)
    annotations = meta.get("annotations") or {}
    kept = {k: str(annotations[k]) for k in KEPT_ANNOTATIONS if k in annotations}
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
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            condition_message = " ".join(str(condition.get("message", "")).split())[:200]
    owner_kind, owner_name = _owner(meta)
    tolerations = tuple(
        (
            str(t.get("key", "")),
            str(t.get("operator", "Equal")),
            str(t.get("value", "")),
            str(t.get("effect", "")),
        )
        for t in spec.get("tolerations") or []
    )
    priority = spec.get("priority")
    return PodRecord(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        node=str(spec.get("nodeName") or ""),
        phase=phase,
        gpus=0.0 if math.isnan(gpus) else gpus,
        mig=mig,
        share=share,
        share_limit=share_limit,
        share_memory_mib=memory,
        share_memory_limit_mib=memory_limit,
        cpu_milli=requests.get("cpu", math.nan) * 1000.0,
        memory_mib=requests.get("memory", math.nan) / 2.0**20,
        priority=int(priority) if isinstance(priority, int) else 0,
        priority_class=str(spec.get("priorityClassName") or ""),
        created=timestamp(meta.get("creationTimestamp")),
        started=timestamp(status.get("startTime")),
        owner_kind=owner_kind,
        owner_name=owner_name,
        labels={str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
        annotations=kept,
        node_selector_product=_selected_product(spec),
        tolerations=tolerations,
        unschedulable_message=condition_message,
    )
