"""The DCGM backend: reads GPUs and MIG instances through DCGM's own Python bindings.

The bindings (`pydcgm`, `dcgm_fields`, `dcgm_structs`, `dcgm_agent`, `DcgmReader`) ship with
the datacenter-gpu-manager package, not PyPI, so they are looked up in the package's install
folders. DCGM samples the hardware itself on the watch interval; a collection only reads its
cached latest values, which is why this backend is cheap to run at a short interval and why
profiling (DCP) fields such as SM activity are available per MIG instance. DCGM knows nothing
of pods, so allocations come from the same attribution (kubelet pod-resources, Slurm) as NVML's.

XID: only the latest value of `DCGM_FI_DEV_XID_ERRORS` is read, so the per-code counters see a
change of the last code and miss repeats (see `XidTracker`). As with NVML, they count since
this exporter started: the code standing at a GPU's first collection (kept by DCGM until the
driver reloads, maybe days old) is a baseline, neither counted nor making the GPU unhealthy.
"""

from __future__ import annotations

import argparse
import importlib
import os
import socket
import sys
import time
import warnings
from collections import Counter
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from exporter.attribution.base import Attribution, NoAttribution, node_allocations
from exporter.backends.base import Backend, BackendUnavailable
from exporter.backends.dcgm_common import (
    ALL_NUMERIC_FIELDS,
    IDENTITY,
    XID_FIELD,
    XidTracker,
    apply_fields,
    is_blank,
    mig_values,
)
from exporter.readings import Collection, GpuReading, MigInstance, NodeReading

BINDING_DIRS: tuple[str, ...] = (
    "/usr/share/datacenter-gpu-manager-4/bindings/python3",
    "/usr/local/dcgm/bindings/python3",
    "/usr/local/dcgm/bindings",
)
NOT_FOUND = "DCGM Python bindings not found; install datacenter-gpu-manager or use --backend nvml"
# DCGM 4.x renamed many fields (dcgm_fields._DEPRECATED_ALIASES); the old names still resolve
# there with a DeprecationWarning, or not at all when DCGM_DEPRECATED=0. New name tried first.
RENAMED: dict[str, str] = {
    "DCGM_FI_DRIVER_VERSION": "DCGM_FI_SYSTEM_DRIVER_VERSION",
    "DCGM_FI_DEV_NAME": "DCGM_FI_DEV_GPU_NAME",
    "DCGM_FI_DEV_SERIAL": "DCGM_FI_DEV_BOARD_SERIAL",
    "DCGM_FI_DEV_UUID": "DCGM_FI_DEV_GPU_UUID",
    "DCGM_FI_DEV_PCI_BUSID": "DCGM_FI_DEV_PCI_BUS_ID",
    "DCGM_FI_DEV_MEMORY_TEMP": "DCGM_FI_DEV_MEMORY_TEMP_CELSIUS",
    "DCGM_FI_DEV_GPU_TEMP": "DCGM_FI_DEV_GPU_TEMP_CELSIUS",
    "DCGM_FI_DEV_POWER_USAGE": "DCGM_FI_DEV_BOARD_POWER_WATTS",
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": "DCGM_FI_DEV_BOARD_POWER_LIMIT_ENFORCED_WATTS",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "DCGM_FI_DEV_PCIE_REPLAY_TOTAL",
    "DCGM_FI_DEV_GPU_UTIL": "DCGM_FI_DEV_GPU_UTIL_RATIO",
    "DCGM_FI_DEV_XID_ERRORS": "DCGM_FI_DEV_XID_ERROR",
    "DCGM_FI_DEV_RETIRED_SBE": "DCGM_FI_DEV_PAGE_RETIRED_SBE_TOTAL",
    "DCGM_FI_DEV_RETIRED_DBE": "DCGM_FI_DEV_PAGE_RETIRED_DBE_TOTAL",
    "DCGM_FI_DEV_RETIRED_PENDING": "DCGM_FI_DEV_PAGE_RETIRED_PENDING",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "DCGM_FI_DEV_ROW_REMAP_FAILED",
    "DCGM_FI_PROF_SM_ACTIVE": "DCGM_FI_PROF_SM_UTIL_RATIO",
    "DCGM_FI_PROF_SM_OCCUPANCY": "DCGM_FI_PROF_SM_OCCUPANCY_RATIO",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "DCGM_FI_PROF_TENSOR_UTIL_RATIO",
    "DCGM_FI_PROF_DRAM_ACTIVE": "DCGM_FI_PROF_DRAM_UTIL_RATIO",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO",
    "DCGM_FI_DEV_PSTATE": "DCGM_FI_DEV_GPU_PSTATE",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX": "DCGM_FI_DEV_BOARD_POWER_LIMIT_MAX_WATTS",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF": "DCGM_FI_DEV_BOARD_POWER_LIMIT_DEFAULT_WATTS",
    "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION": "DCGM_FI_DEV_GPU_RECOVERY_ACTION",
}
STRING_FIELDS: tuple[str, ...] = (*IDENTITY, "DCGM_FI_DRIVER_VERSION")
CUDA_FIELD = "DCGM_FI_CUDA_DRIVER_VERSION"  # integer, 12040 = CUDA 12.4


@dataclass(frozen=True, slots=True)
class Bindings:
    """The DCGM binding modules this backend uses (tests inject fakes with the same names)."""

    pydcgm: ModuleType
    dcgm_fields: ModuleType
    dcgm_structs: ModuleType
    dcgm_agent: ModuleType
    DcgmReader: ModuleType


def load_bindings() -> Bindings:
    """Import the bindings, adding DCGM's install folders to sys.path first."""
    for folder in (os.environ.get("DCGM_BINDINGS_PATH", ""), *BINDING_DIRS):
        if folder and os.path.isdir(folder) and folder not in sys.path:
            sys.path.append(folder)
    try:
        modules = {
            name: importlib.import_module(name)
            for name in ("pydcgm", "dcgm_fields", "dcgm_structs", "dcgm_agent", "DcgmReader")
        }
    except ImportError:
        raise BackendUnavailable(NOT_FOUND) from None
    return Bindings(**modules)


def field_ids(dcgm_fields: ModuleType, names: tuple[str, ...]) -> dict[int, str]:
    """Field id -> our (classic) field name, for the names this DCGM version knows."""
    ids: dict[int, str] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for name in names:
            for candidate in (RENAMED.get(name), name):
                field_id = getattr(dcgm_fields, candidate, None) if candidate else None
                if isinstance(field_id, int):
                    ids.setdefault(field_id, name)
                    break
    return ids


@dataclass(frozen=True, slots=True)
class _Instance:
    """A MIG GPU instance as DCGM's entity hierarchy describes it."""

    entity_id: int
    gpu_id: int
    gpu_instance_id: int
    compute_instance_id: int
    slices: int


def _text(value: object) -> str:
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    return "" if value is None or is_blank(value) else str(value)


class DcgmBackend(Backend):
    """Watches our fields on every GPU and MIG instance of an embedded or remote hostengine."""

    name = "dcgm"

    def __init__(
        self,
        host: str = "",
        node_name: str = "",
        update_interval: float = 5.0,
        bindings: Bindings | None = None,
        attribution: Attribution | None = None,
    ) -> None:
        self.host = host
        self.attribution: Attribution = attribution or NoAttribution()  # pods / Slurm jobs
        self.node_name = node_name or os.environ.get("NODE_NAME", "") or _host_part(host)
        self.node_name = self.node_name or socket.gethostname()
        self.update_interval = update_interval
        self._bindings = bindings
        self._handle: Any = None
        self._reader: Any = None
        self._gpu_ids: list[int] = []
        self._instances: dict[int, _Instance] = {}
        self._ids: dict[int, str] = {}
        self.profiling = True  # cleared when the GPUs or the hostengine refuse DCP fields
        self._xids = XidTracker()
        self._pending_errors: Counter[str] = Counter()  # failed calls, reported with next cycle

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("dcgm backend")
        group.add_argument(
            "--dcgm.host",
            dest="dcgm_host",
            default="",
            metavar="HOST[:PORT]",
            help="nv-hostengine to connect to (default: start an embedded hostengine)",
        )
        group.add_argument(
            "--dcgm.update-interval",
            dest="dcgm_update_interval",
            type=float,
            default=5.0,
            metavar="SECONDS",
            help="how often DCGM samples the watched fields (default 5)",
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> DcgmBackend:
        interval = getattr(args, "dcgm_update_interval", 5.0)
        if interval <= 0:
            raise ValueError("--dcgm.update-interval must be positive")
        return cls(
            host=getattr(args, "dcgm_host", "") or "",
            node_name=getattr(args, "node_name", "") or "",
            update_interval=interval,
        )

    @property
    def where(self) -> str:
        return f"nv-hostengine at {self.host}" if self.host else "the embedded DCGM hostengine"

    def start(self) -> None:
        if self._reader is not None:
            return
        b = self._bindings = self._bindings or load_bindings()
        try:
            self._handle = b.pydcgm.DcgmHandle(
                ipAddress=self.host or None, opMode=b.dcgm_structs.DCGM_OPERATION_MODE_AUTO
            )
            self._gpu_ids = list(self._handle.GetSystem().discovery.GetAllSupportedGpuIds())
        except b.dcgm_structs.DCGMError as error:
            self.close()
            raise BackendUnavailable(f"cannot use {self.where}: {error}") from None
        if not self._gpu_ids:
            self.close()
            raise BackendUnavailable(f"{self.where} sees no supported GPUs")
        self._instances = self._read_hierarchy()
        self._reader = self._watch()

    def _read_hierarchy(self) -> dict[int, _Instance]:
        """GPU instances (entity id -> parent GPU, NVML GI/CI ids); empty when MIG is off."""
        b = self._bindings
        assert b is not None
        try:
            hierarchy = b.dcgm_agent.dcgmGetGpuInstanceHierarchy(self._handle.handle)
        except b.dcgm_structs.DCGMError:
            self._pending_errors["dcgmGetGpuInstanceHierarchy"] += 1
            return {}  # remote hostengine without NVML, or MIG unsupported: GPUs only
        fe = b.dcgm_fields
        entries = list(hierarchy.entityList[: hierarchy.count])
        ci_of = {
            e.parent.entityId: e.info.nvmlComputeInstanceId
            for e in entries
            if e.entity.entityGroupId == fe.DCGM_FE_GPU_CI
        }
        return {
            e.entity.entityId: _Instance(
                entity_id=e.entity.entityId,
                gpu_id=e.parent.entityId,
                gpu_instance_id=e.info.nvmlInstanceId,
                compute_instance_id=ci_of.get(e.entity.entityId, 0),
                slices=e.info.nvmlProfileSlices,
            )
            for e in entries
            if e.entity.entityGroupId == fe.DCGM_FE_GPU_I
            and e.parent.entityGroupId == fe.DCGM_FE_GPU
        }

    def _watch(self) -> Any:
        """A DcgmReader watching our fields on every GPU and GPU instance; DCP dropped if refused."""
        b = self._bindings
        assert b is not None
        names = (*ALL_NUMERIC_FIELDS, *STRING_FIELDS, CUDA_FIELD)
        entities = [
            b.dcgm_structs.c_dcgmGroupEntityPair_t(b.dcgm_fields.DCGM_FE_GPU_I, entity_id)
            for entity_id in sorted(self._instances)
        ]
        last_error: Exception | None = None
        for with_profiling in (True, False) if self.profiling else (False,):
            chosen = tuple(n for n in names if with_profiling or not n.startswith("DCGM_FI_PROF_"))
            self._ids = field_ids(b.dcgm_fields, chosen)
            reader = b.DcgmReader.DcgmReader(
                hostname=self.host or "localhost",
                fieldIds=sorted(self._ids),
                updateFrequency=int(self.update_interval * 1e6),
                maxKeepAge=max(60.0, 10 * self.update_interval),
                fieldGroupName=f"gpu_defrag_{os.getpid()}",
                gpuIds=self._gpu_ids,
                entities=entities or None,
            )
            try:
                reader.SetHandle(self._handle.handle)
            except b.dcgm_structs.DCGMError as error:
                last_error = error
                self._pending_errors["dcgm_watch_fields"] += 1
                self.profiling = False
                continue
            return reader
        self.close()
        raise BackendUnavailable(f"{self.where} refused the field watches: {last_error}")

    def close(self) -> None:
        reader, handle = self._reader, self._handle
        self._reader = self._handle = None
        if reader is not None:
            reader.Shutdown()
        if handle is not None:
            handle.Shutdown()

    def collect(self) -> Collection:
        self.start()
        b = self._bindings
        assert b is not None and self._reader is not None
        now = time.time()
        try:
            if set(self._read_hierarchy()) != set(self._instances):
                self.close()  # MIG was re-partitioned: watch the new instances
                self.start()
            values = self._reader.GetLatestEntityValuesAsFieldIdDict()
        except b.dcgm_structs.DCGMError as error:
            self.close()
            raise BackendUnavailable(f"{self.where}: {error}") from None
        gpus_seen = values.get(b.dcgm_fields.DCGM_FE_GPU, {})
        if not gpus_seen:  # DcgmReader swallows a lost connection and returns nothing
            self.close()
            raise BackendUnavailable(f"{self.where} returned no values (connection lost?)")
        collection = Collection(nodes=[], timestamp=now)
        collection.errors.update(self._pending_errors)
        self._pending_errors.clear()
        instances = values.get(b.dcgm_fields.DCGM_FE_GPU_I, {})
        # Driver and CUDA versions are global-scope fields: under DCGM_FE_NONE, or per GPU.
        system: dict[str, object] = {}
        for entity_values in values.get(getattr(b.dcgm_fields, "DCGM_FE_NONE", 0), {}).values():
            system.update(self._named(entity_values))
        node = NodeReading(node=self.node_name)
        for gpu_id in sorted(gpus_seen):
            by_name = self._named(gpus_seen[gpu_id])
            versions = {**by_name, **system}
            node.driver_version = node.driver_version or _text(
                versions.get("DCGM_FI_DRIVER_VERSION")
            )
            node.cuda_version = node.cuda_version or _cuda(versions.get(CUDA_FIELD))
            node.gpus.append(self._gpu(gpu_id, by_name, instances, now))
        try:
            node.allocations = node_allocations(self.attribution, node)
        except Exception:  # an attribution bug must not cost the GPU readings
            collection.errors["attribution.allocations"] += 1
        collection.nodes.append(node)
        return collection

    def _named(self, by_id: dict[int, object]) -> dict[str, object]:
        return {self._ids[i]: v for i, v in by_id.items() if i in self._ids}

    def _gpu(
        self, gpu_id: int, by_name: dict[str, object], instances: dict, now: float
    ) -> GpuReading:
        gpu = GpuReading(index=gpu_id)
        for field, attribute in IDENTITY.items():
            setattr(gpu, attribute, _text(by_name.get(field)))
        numeric = {name: value for name, value in by_name.items() if isinstance(value, int | float)}
        apply_fields(gpu, numeric)
        own = [i for i in self._instances.values() if i.gpu_id == gpu_id]
        if own:
            gpu.mig_enabled = True
        for instance in sorted(own, key=lambda i: i.gpu_instance_id):
            gpu.mig_instances.append(
                _mig(instance, self._named(instances.get(instance.entity_id, {})))
            )
        key = gpu.uuid or gpu_id
        self._xids.observe_last_code(key, numeric.get(XID_FIELD), now)
        self._xids.apply(key, gpu)
        return gpu


def _mig(instance: _Instance, values: dict[str, object]) -> MigInstance:
    """One GPU instance: DCGM_FI_DEV_NAME on a GPU_I entity is its profile name (`1g.10gb`);
    memory and activity (engine activity its utilization) from its own fields."""
    uuid = _text(values.get("DCGM_FI_DEV_UUID"))
    return MigInstance(
        gpu_instance_id=instance.gpu_instance_id,
        compute_instance_id=instance.compute_instance_id,
        profile=_text(values.get("DCGM_FI_DEV_NAME")) or f"{instance.slices}g",
        uuid=uuid if uuid.startswith("MIG-") else "",
        **mig_values(values),
    )


def _cuda(value: object) -> str:
    """DCGM's integer CUDA driver version (12040) as "12.4"."""
    if not isinstance(value, int) or is_blank(value) or value <= 0:
        return ""
    return f"{value // 1000}.{value % 1000 // 10}"


def _host_part(host: str) -> str:
    """`gpu-7:5555` -> `gpu-7`: a remote hostengine names the node it runs on."""
    if not host:
        return ""
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host
