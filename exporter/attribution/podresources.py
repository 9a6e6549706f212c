"""Which pod and container holds which GPU or MIG instance, from the kubelet PodResources API.

The kubelet is the only node-local source that knows device-plugin assignments, and it needs no
API-server access or RBAC: just the unix socket. `refresh()` makes one `List` call (run by the
background refresher, never per scrape) and keeps the last good answer when the call fails, so a
kubelet restart does not blank every pod label (dcgm-exporter calls `List` on every scrape and
loses labels on any error; its 4 MB default receive limit broke big nodes, dcgm-exporter#509).

Message classes are built at import time from `podresources.proto` next to this file, so there is
no generated code to keep in step with the protobuf runtime.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from exporter.readings import Allocation
from gpu_defrag_common.messages import one_line

log = logging.getLogger(__name__)
T = TypeVar("T")

PROTO_PATH = Path(__file__).with_name("podresources.proto")
DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
LIST_METHOD = "/v1.PodResourcesLister/List"
MAX_RECEIVE_BYTES = 64 * 1024 * 1024  # gRPC's default is 4 MiB; kubelet replies exceed it
DEFAULT_TIMEOUT_S = 10.0
# Names the NVIDIA device plugin registers: whole GPUs, time-sliced GPUs when renamed, MIG profiles.
GPU_RESOURCE_NAMES = ("nvidia.com/gpu", "nvidia.com/gpu.shared")
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"

_SCALARS = {
    "string": descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
    "int64": descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
    "uint64": descriptor_pb2.FieldDescriptorProto.TYPE_UINT64,
}
_FIELD = re.compile(r"^(repeated\s+)?(\w+)\s+(\w+)\s*=\s*(\d+)$")


def load_messages(proto_path: Path = PROTO_PATH) -> dict[str, type]:
    """Message classes for the proto3 subset in `proto_path`; anything else is a loud error."""
    text = re.sub(r"//[^\n]*", "", proto_path.read_text())
    package = re.search(r"\bpackage\s+([\w.]+)\s*;", text)
    if package is None:
        raise ValueError(f"{proto_path}: no package statement")
    file_proto = descriptor_pb2.FileDescriptorProto(
        name=proto_path.name, package=package.group(1), syntax="proto3"
    )
    bodies = re.findall(r"\bmessage\s+(\w+)\s*\{([^{}]*)\}", text)
    names = {name for name, _ in bodies}
    for name, body in bodies:
        message = file_proto.message_type.add(name=name)
        for statement in filter(None, (s.strip() for s in body.split(";"))):
            match = _FIELD.match(" ".join(statement.split()))
            if match is None:
                raise ValueError(f"{proto_path}: cannot read {statement!r} in message {name}")
            repeated, type_name, field_name, number = match.groups()
            field = message.field.add(name=field_name, number=int(number), json_name=field_name)
            field.label = (
                descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
                if repeated
                else descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
            )
            if type_name in _SCALARS:
                field.type = _SCALARS[type_name]
            elif type_name in names:
                field.type = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
                field.type_name = f".{file_proto.package}.{type_name}"
            else:
                raise ValueError(f"{proto_path}: unknown type {type_name!r} in message {name}")
    pool = descriptor_pool.DescriptorPool()  # private: "v1" is too generic for the default pool
    pool.Add(file_proto)
    return {
        name: message_factory.GetMessageClass(
            pool.FindMessageTypeByName(f"{file_proto.package}.{name}")
        )
        for name in names
    }


MESSAGES = load_messages()
ListPodResourcesRequest = MESSAGES["ListPodResourcesRequest"]
ListPodResourcesResponse = MESSAGES["ListPodResourcesResponse"]


@dataclass(frozen=True, slots=True)
class DeviceAssignment:
    """One GPU device id the kubelet gave one container."""

    pod: str
    namespace: str
    container: str
    resource_name: str
    device_id: str


@dataclass(frozen=True, slots=True)
class DeviceRef:
    """Where a device-plugin id points: a GPU/MIG UUID, or a device index (`nvidiaN`)."""

    uuid: str = ""
    index: int | None = None
    gpu_instance_id: int | None = None


_REPLICA = re.compile(r"::\d+$")  # NVIDIA device plugin time-slicing/MPS replicas
_MIG_LEGACY = re.compile(r"^MIG-(GPU-[0-9a-fA-F-]+)/(\d+)/(\d+)$")  # MIG-GPU-<uuid>/<gi>/<ci>
_MIG = re.compile(r"^MIG-[0-9a-fA-F-]+$")
_GPU = re.compile(r"^GPU-[0-9a-fA-F-]+$")
_GKE = re.compile(r"^nvidia(\d+)(?:/gi(\d+))?(?:/vgpu\d+)?$")  # nvidia0, nvidia0/gi1[/vgpu2]


def parse_device_id(device_id: str) -> DeviceRef | None:
    """Read the id forms device plugins use; None for anything else."""
    device_id = _REPLICA.sub("", device_id.strip())
    if match := _MIG_LEGACY.match(device_id):
        return DeviceRef(uuid=match.group(1), gpu_instance_id=int(match.group(2)))
    if _MIG.match(device_id) or _GPU.match(device_id):
        return DeviceRef(uuid=device_id)
    if match := _GKE.match(device_id):
        gi = match.group(2)
        return DeviceRef(index=int(match.group(1)), gpu_instance_id=None if gi is None else int(gi))
    return None


def resolve_device(
    ref: DeviceRef,
    gpu_index_by_uuid: Mapping[str, int],
    mig_by_uuid: Mapping[str, tuple[int, int]] | None = None,
) -> tuple[int, int | None] | None:
    """(GPU index, GPU-instance id) for a parsed id on this node, or None if it is not here.

    `mig_by_uuid` maps MIG device UUIDs to (parent GPU index, GPU-instance id); a MIG UUID found
    only in `gpu_index_by_uuid` resolves to its parent GPU without an instance id. `nvidiaN`
    is taken as NVML index N (device minor number order, as dcgm-exporter's device-name mode).
    """
    if ref.uuid:
        if mig_by_uuid and (mig := _lookup(mig_by_uuid, ref.uuid)) is not None:
            return mig
        index = _lookup(gpu_index_by_uuid, ref.uuid)
        return None if index is None else (index, ref.gpu_instance_id)
    if ref.index is None:
        return None
    if gpu_index_by_uuid and ref.index not in set(gpu_index_by_uuid.values()):
        return None
    return ref.index, ref.gpu_instance_id


def _lookup(mapping: Mapping[str, T], uuid: str) -> T | None:
    found = mapping.get(uuid)
    if found is None:  # NVML and device plugins agree on case in practice; be lenient anyway
        lowered = uuid.lower()
        found = next((v for k, v in mapping.items() if k.lower() == lowered), None)
    return found


def gpu_assignments(
    reply: object, extra_resource_names: Iterable[str] = ()
) -> tuple[DeviceAssignment, ...]:
    """The GPU device ids in a ListPodResourcesResponse, other resources dropped."""
    wanted = set(GPU_RESOURCE_NAMES) | set(extra_resource_names)
    found = []
    for pod in reply.pod_resources:  # type: ignore[attr-defined]
        for container in pod.containers:
            for devices in container.devices:
                name = devices.resource_name
                if name not in wanted and not name.startswith(MIG_RESOURCE_PREFIX):
                    continue
                found.extend(
                    DeviceAssignment(pod.name, pod.namespace, container.name, name, device_id)
                    for device_id in devices.device_ids
                )
    return tuple(found)


class PodResourcesSource:
    """Keeps the kubelet's GPU assignments; `refresh()` is the only call that touches the socket."""

    def __init__(
        self,
        socket_path: str = DEFAULT_SOCKET,
        extra_resource_names: Iterable[str] = (),
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_receive_bytes: int = MAX_RECEIVE_BYTES,
    ) -> None:
        self.socket_path = socket_path
        self.extra_resource_names = tuple(extra_resource_names)
        self.timeout_s = timeout_s
        self.max_receive_bytes = max_receive_bytes
        self.errors: Counter[str] = Counter()  # failed List calls, read by the collector
        self.last_success: float | None = None  # time.time() of the last good List
        self._assignments: tuple[DeviceAssignment, ...] = ()
        self._missing_logged = False
        self._failing = False
        self._unresolved_logged: set[str] = set()

    @property
    def assignments(self) -> tuple[DeviceAssignment, ...]:
        return self._assignments

    def refresh(self) -> None:
        """One `List` call. A missing socket means "not on Kubernetes": quiet, one log line."""
        if not os.path.exists(self.socket_path):
            if not self._missing_logged:
                log.info(
                    "kubelet pod-resources socket %s not found; no pod attribution",
                    self.socket_path,
                )
                self._missing_logged = True
            return
        self._missing_logged = False
        try:
            reply = self._list()
        except Exception as exc:  # grpc.RpcError, or a reply that does not decode
            self.errors["podresources_list"] += 1
            if not self._failing:
                log.warning(
                    "kubelet pod-resources List failed, keeping last mapping: %s", _one_line(exc)
                )
            self._failing = True
            return
        if self._failing:
            log.info("kubelet pod-resources List works again")
        self._failing = False
        self._assignments = gpu_assignments(reply, self.extra_resource_names)
        self.last_success = time.time()

    def _list(self) -> object:
        options = [("grpc.max_receive_message_length", self.max_receive_bytes)]
        target = "unix:" + os.path.abspath(self.socket_path)
        # A channel per refresh: after a kubelet restart the next call connects at once
        # instead of waiting out a long-lived channel's reconnect backoff.
        with grpc.insecure_channel(target, options=options) as channel:
            list_call = channel.unary_unary(
                LIST_METHOD,
                request_serializer=ListPodResourcesRequest.SerializeToString,
                response_deserializer=ListPodResourcesResponse.FromString,
            )
            return list_call(ListPodResourcesRequest(), timeout=self.timeout_s)

    def allocations(
        self,
        gpu_index_by_uuid: Mapping[str, int],
        mig_by_uuid: Mapping[str, tuple[int, int]] | None = None,
    ) -> list[Allocation]:
        """The cached assignments keyed to this node's GPUs; ids of other devices dropped."""
        seen: set[tuple[int, str, str, str, int | None]] = set()
        result = []
        for item in self._assignments:
            ref = parse_device_id(item.device_id)
            where = None if ref is None else resolve_device(ref, gpu_index_by_uuid, mig_by_uuid)
            if where is None:
                self._log_unresolved(item.device_id)
                continue
            key = (where[0], item.pod, item.namespace, item.container, where[1])
            if key in seen:  # several `::N` replicas of one GPU in one container
                continue
            seen.add(key)
            result.append(
                Allocation(
                    gpu=where[0],
                    pod=item.pod,
                    namespace=item.namespace,
                    container=item.container,
                    tenant=item.namespace,
                    gpu_instance_id=where[1],
                )
            )
        return result

    def _log_unresolved(self, device_id: str) -> None:
        if device_id not in self._unresolved_logged and len(self._unresolved_logged) < 1024:
            self._unresolved_logged.add(device_id)
            log.info("pod-resources device id %r matches no GPU on this node", device_id)


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, grpc.RpcError) and hasattr(exc, "code"):
        return f"{exc.code().name}: {exc.details()}"  # type: ignore[attr-defined]
    return one_line(exc, typed=True)
