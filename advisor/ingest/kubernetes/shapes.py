"""The parts of core/v1 Node and Pod the advisor reads, as msgspec Structs.

A pod list of 100,000 pods is hundreds of megabytes of JSON, most of it what the advisor never
reads (managed fields, environment, volumes, container statuses). Decoding straight into these
Structs builds only the fields named here and skips the rest without making Python objects of
it: about five times less CPU than `json.loads` on a realistic pod list
(bench/k8s_source.py). Field names and nesting are the API's own (core/v1), so any API server's
answer decodes; a field it leaves out takes the default.
"""

from __future__ import annotations

from typing import Any

import msgspec

Quantity = str | int | float


class Resources(msgspec.Struct):
    requests: dict[str, Quantity] | None = None
    limits: dict[str, Quantity] | None = None


class Container(msgspec.Struct):
    resources: Resources | None = None
    restartPolicy: str | None = None  # "Always" on an init container: a sidecar


class Toleration(msgspec.Struct):
    key: str | None = None
    operator: str | None = None
    value: str | None = None
    effect: str | None = None


class MatchExpression(msgspec.Struct):
    key: str = ""
    operator: str = ""
    values: list[str] | None = None


class SelectorTerm(msgspec.Struct):
    matchExpressions: list[MatchExpression] | None = None


class NodeSelector(msgspec.Struct):
    nodeSelectorTerms: list[SelectorTerm] | None = None


class NodeAffinity(msgspec.Struct):
    requiredDuringSchedulingIgnoredDuringExecution: NodeSelector | None = None


class Affinity(msgspec.Struct):
    nodeAffinity: NodeAffinity | None = None


class OwnerReference(msgspec.Struct):
    kind: str = ""
    name: str = ""
    controller: bool | None = None


class ObjectMeta(msgspec.Struct):
    name: str = ""
    namespace: str | None = None
    uid: str | None = None
    resourceVersion: str | None = None
    creationTimestamp: str | None = None
    deletionTimestamp: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    ownerReferences: list[OwnerReference] | None = None


class PodSpec(msgspec.Struct):
    containers: list[Container] | None = None
    initContainers: list[Container] | None = None
    nodeName: str | None = None
    priority: int | None = None
    priorityClassName: str | None = None
    tolerations: list[Toleration] | None = None
    nodeSelector: dict[str, str] | None = None
    affinity: Affinity | None = None


class Condition(msgspec.Struct):
    type: str = ""
    status: str = ""
    message: str | None = None


class PodStatus(msgspec.Struct):
    phase: str | None = None
    startTime: str | None = None
    conditions: list[Condition] | None = None


class Pod(msgspec.Struct):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: PodSpec = msgspec.field(default_factory=PodSpec)
    status: PodStatus = msgspec.field(default_factory=PodStatus)


class Taint(msgspec.Struct):
    key: str = ""
    value: str | None = None
    effect: str = ""


class NodeSpec(msgspec.Struct):
    unschedulable: bool | None = None
    taints: list[Taint] | None = None


class NodeStatus(msgspec.Struct):
    allocatable: dict[str, Quantity] | None = None
    capacity: dict[str, Quantity] | None = None
    conditions: list[Condition] | None = None


class Node(msgspec.Struct):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: NodeSpec = msgspec.field(default_factory=NodeSpec)
    status: NodeStatus = msgspec.field(default_factory=NodeStatus)


class ListMeta(msgspec.Struct):
    resourceVersion: str | None = None
    continue_: str | None = msgspec.field(default=None, name="continue")


class PodList(msgspec.Struct):
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[Pod] | None = None


class NodeList(msgspec.Struct):
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[Node] | None = None


class RawEvent(msgspec.Struct):
    """A watch event whose object is decoded by its type (a Status for ERROR)."""

    type: str = ""
    object: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"{}"))


LIST_DECODERS = {
    "pods": msgspec.json.Decoder(PodList),
    "nodes": msgspec.json.Decoder(NodeList),
}
OBJECT_DECODERS = {
    "pods": msgspec.json.Decoder(Pod),
    "nodes": msgspec.json.Decoder(Node),
}
EVENT_DECODER = msgspec.json.Decoder(RawEvent)


def as_pod(obj: Any) -> Pod:
    """A Pod Struct from a decoded Struct or a JSON dict (tests, custom resources' templates)."""
    return obj if isinstance(obj, Pod) else msgspec.convert(obj, Pod)


def as_node(obj: Any) -> Node:
    return obj if isinstance(obj, Node) else msgspec.convert(obj, Node)


def as_pod_spec(obj: Any) -> PodSpec:
    return obj if isinstance(obj, PodSpec) else msgspec.convert(obj or {}, PodSpec)


ShapeError = msgspec.ValidationError, msgspec.DecodeError
