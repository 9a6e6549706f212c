"""A fake of the part of DCGM's Python bindings that `exporter.backends.dcgm` uses.

Module, class and function names, signatures and return shapes follow the real bindings
(NVIDIA/DCGM `testing/python3`: `pydcgm.DcgmHandle(handle=None, ipAddress=None, opMode=...)`,
`DcgmSystem.discovery.GetAllSupportedGpuIds()`, `dcgm_agent.dcgmGetGpuInstanceHierarchy(handle)`
returning `count` + `entityList[i].entity/.parent/.info`, `DcgmReader.DcgmReader(...)` with
`SetHandle`, `GetLatestEntityValuesAsFieldIdDict` and `Shutdown`, `dcgm_structs.DCGMError`
with `.value`). Field ids are DCGM's real ids; `renamed=True` models DCGM 4.x, where classic
names like DCGM_FI_DEV_GPU_TEMP only resolve through a deprecation shim, and not at all
with `deprecated_aliases=False` (DCGM_DEPRECATED=0).
"""

from __future__ import annotations

import sys
import types
import warnings
from dataclasses import dataclass, field
from typing import ClassVar

# Classic names -> real DCGM field ids (dcgm_fields.py).
CLASSIC_IDS: dict[str, int] = {
    "DCGM_FI_DRIVER_VERSION": 1,
    "DCGM_FI_CUDA_DRIVER_VERSION": 5,
    "DCGM_FI_DEV_NAME": 50,
    "DCGM_FI_DEV_SERIAL": 53,
    "DCGM_FI_DEV_UUID": 54,
    "DCGM_FI_DEV_PCI_BUSID": 57,
    "DCGM_FI_DEV_MIG_MODE": 67,
    "DCGM_FI_DEV_VBIOS_VERSION": 85,
    "DCGM_FI_DEV_SM_CLOCK": 100,
    "DCGM_FI_DEV_MEM_CLOCK": 101,
    "DCGM_FI_DEV_VIDEO_CLOCK": 102,
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": 112,
    "DCGM_FI_DEV_MEMORY_TEMP": 140,
    "DCGM_FI_DEV_GPU_TEMP": 150,
    "DCGM_FI_DEV_POWER_USAGE": 155,
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 156,
    "DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX": 162,
    "DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF": 163,
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": 164,
    "DCGM_FI_DEV_FABRIC_MANAGER_STATUS": 170,
    "DCGM_FI_DEV_PSTATE": 190,
    "DCGM_FI_DEV_FAN_SPEED": 191,
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 202,
    "DCGM_FI_DEV_GPU_UTIL": 203,
    "DCGM_FI_DEV_MEM_COPY_UTIL": 204,
    "DCGM_FI_DEV_ENC_UTIL": 206,
    "DCGM_FI_DEV_DEC_UTIL": 207,
    "DCGM_FI_DEV_XID_ERRORS": 230,
    "DCGM_FI_DEV_POWER_VIOLATION": 240,
    "DCGM_FI_DEV_THERMAL_VIOLATION": 241,
    "DCGM_FI_DEV_FB_TOTAL": 250,
    "DCGM_FI_DEV_FB_FREE": 251,
    "DCGM_FI_DEV_FB_USED": 252,
    "DCGM_FI_DEV_FB_RESERVED": 253,
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": 312,
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": 313,
    "DCGM_FI_DEV_RETIRED_SBE": 390,
    "DCGM_FI_DEV_RETIRED_DBE": 391,
    "DCGM_FI_DEV_RETIRED_PENDING": 392,
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 393,
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 394,
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": 395,
    "DCGM_FI_DEV_ROW_REMAP_PENDING": 396,
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": 449,
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 1001,
    "DCGM_FI_PROF_SM_ACTIVE": 1002,
    "DCGM_FI_PROF_SM_OCCUPANCY": 1003,
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 1004,
    "DCGM_FI_PROF_DRAM_ACTIVE": 1005,
    "DCGM_FI_PROF_PCIE_TX_BYTES": 1009,
    "DCGM_FI_PROF_PCIE_RX_BYTES": 1010,
    "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION": 1523,
}
# DCGM 4.x names (dcgm_fields._DEPRECATED_ALIASES, classic -> new) for the renamed ones.
NEW_NAMES: dict[str, str] = {
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
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO",
    "DCGM_FI_PROF_SM_ACTIVE": "DCGM_FI_PROF_SM_UTIL_RATIO",
    "DCGM_FI_PROF_SM_OCCUPANCY": "DCGM_FI_PROF_SM_OCCUPANCY_RATIO",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "DCGM_FI_PROF_TENSOR_UTIL_RATIO",
    "DCGM_FI_PROF_DRAM_ACTIVE": "DCGM_FI_PROF_DRAM_UTIL_RATIO",
    "DCGM_FI_DEV_PSTATE": "DCGM_FI_DEV_GPU_PSTATE",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX": "DCGM_FI_DEV_BOARD_POWER_LIMIT_MAX_WATTS",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF": "DCGM_FI_DEV_BOARD_POWER_LIMIT_DEFAULT_WATTS",
    "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION": "DCGM_FI_DEV_GPU_RECOVERY_ACTION",
}
PROF_IDS = range(1000, 1100)  # DCP fields are 1000-1099 (1523, recovery action, is not one)
FE_NONE, FE_GPU, FE_GPU_I, FE_GPU_CI = 0, 1, 4, 5
GLOBAL_FIELDS = frozenset({"DCGM_FI_DRIVER_VERSION", "DCGM_FI_CUDA_DRIVER_VERSION"})
ST_CONNECTION_NOT_VALID = -6
ST_PROFILING_NOT_SUPPORTED = -36


class DCGMError(Exception):
    """Like dcgm_structs.DCGMError: carries the DCGM status in `.value`."""

    _messages: ClassVar[dict[int, str]] = {
        ST_CONNECTION_NOT_VALID: "Host engine connection invalid/disconnected",
        ST_PROFILING_NOT_SUPPORTED: "Profiling is not supported for this group of GPUs or GPU",
    }

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return self._messages.get(self.value, f"DCGM error {self.value}")


def _blank(value: object) -> bool:
    """dcgmvalue.DcgmValue.IsBlank: int64 >= 0x7ffffffffffffff0, fp64 >= 2**47, '<<<..>>>'."""
    if isinstance(value, str):
        return value.startswith("<<<") and ">>>" in value
    if isinstance(value, float):
        return value >= 140737488355328.0
    return isinstance(value, int) and value >= 0x7FFFFFFFFFFFFFF0


@dataclass
class _Pair:  # c_dcgmGroupEntityPair_t
    entityGroupId: int = 0
    entityId: int = 0


@dataclass
class _Info:  # c_dcgmMigEntityInfo_t
    gpuUuid: str = ""
    nvmlGpuIndex: int = 0
    nvmlInstanceId: int = 0
    nvmlComputeInstanceId: int = 0
    nvmlMigProfileId: int = 0
    nvmlProfileSlices: int = 0


@dataclass
class _HierarchyInfo:  # c_dcgmMigHierarchyInfo_v2
    entity: _Pair
    parent: _Pair
    info: _Info


@dataclass
class _Hierarchy:  # c_dcgmMigHierarchy_v2
    version: int = 0
    count: int = 0
    entityList: list[_HierarchyInfo] = field(default_factory=list)


@dataclass
class FakeInstance:
    """One MIG GPU instance (and its single compute instance) of a fake GPU."""

    entity_id: int
    gpu_id: int
    gpu_instance_id: int
    slices: int
    values: dict[str, object]
    ci_entity_id: int = 0
    compute_instance_id: int = 0


class FakeDcgm:
    """Hostengine state plus the binding modules built over it."""

    def __init__(self, *, renamed: bool = False, deprecated_aliases: bool = True) -> None:
        self.gpus: dict[int, dict[str, object]] = {}  # gpu id -> classic field name -> value
        self.instances: list[FakeInstance] = []
        self.profiling_supported = True
        self.reachable = True
        self.connected = True  # False: DcgmReader swallows CONNECTION_NOT_VALID, returns {}
        self.hierarchy_supported = True
        self.reader_filters_blanks = True  # DcgmReader(ignoreBlank=True) drops blank samples
        self.handles_open = 0
        self.watches: list[dict] = []  # one entry per SetHandle: field ids, gpus, entities
        self.renamed = renamed
        self.deprecated_aliases = deprecated_aliases  # False models DCGM_DEPRECATED=0
        self.modules = self._modules()

    def install(self, monkeypatch) -> None:
        for name, module in self.modules.items():
            monkeypatch.setitem(sys.modules, name, module)

    # --- the modules -------------------------------------------------------------------------

    def _modules(self) -> dict[str, types.ModuleType]:
        return {
            "dcgm_structs": self._structs(),
            "dcgm_fields": self._fields(),
            "pydcgm": self._pydcgm(),
            "dcgm_agent": self._agent(),
            "DcgmReader": self._reader_module(),
        }

    def _structs(self) -> types.ModuleType:
        module = types.ModuleType("dcgm_structs")
        module.DCGMError = DCGMError
        module.DCGM_OPERATION_MODE_AUTO = 1
        module.DCGM_ST_CONNECTION_NOT_VALID = ST_CONNECTION_NOT_VALID
        module.DCGM_ST_PROFILING_NOT_SUPPORTED = ST_PROFILING_NOT_SUPPORTED
        module.c_dcgmGroupEntityPair_t = _Pair
        return module

    def _fields(self) -> types.ModuleType:
        names = {NEW_NAMES.get(n, n) if self.renamed else n: i for n, i in CLASSIC_IDS.items()}
        aliases = dict(NEW_NAMES) if self.renamed and self.deprecated_aliases else {}

        class _Fields(types.ModuleType):
            def __getattr__(self, name: str) -> int:
                if name in aliases:  # DCGM 4.x deprecation shim
                    warnings.warn(f"{name} is deprecated", DeprecationWarning, stacklevel=2)
                    return getattr(self, aliases[name])
                raise AttributeError(name)

        module = _Fields("dcgm_fields")
        for name, value in names.items():
            setattr(module, name, value)
        module.DCGM_FE_NONE, module.DCGM_FE_GPU, module.DCGM_FE_GPU_I, module.DCGM_FE_GPU_CI = (
            FE_NONE,
            FE_GPU,
            FE_GPU_I,
            FE_GPU_CI,
        )
        return module

    def _pydcgm(self) -> types.ModuleType:
        fake = self
        module = types.ModuleType("pydcgm")

        class _Discovery:
            def GetAllSupportedGpuIds(self) -> list[int]:
                return sorted(fake.gpus)

        class _System:
            def __init__(self) -> None:
                self.discovery = _Discovery()

        class DcgmHandle:
            def __init__(self, handle=None, ipAddress=None, opMode=1, **kwargs) -> None:
                if handle is not None:
                    self.handle = handle
                    return
                if not fake.reachable:
                    raise DCGMError(ST_CONNECTION_NOT_VALID)
                fake.handles_open += 1
                self.ipAddress = ipAddress
                self.handle = object()

            def GetSystem(self) -> _System:
                return _System()

            def Shutdown(self) -> None:
                if self.handle is not None:
                    fake.handles_open -= 1
                self.handle = None

        module.DcgmHandle = DcgmHandle
        return module

    def _agent(self) -> types.ModuleType:
        fake = self
        module = types.ModuleType("dcgm_agent")

        def dcgmGetGpuInstanceHierarchy(handle) -> _Hierarchy:
            if not fake.hierarchy_supported:
                raise DCGMError(-1)
            entries: list[_HierarchyInfo] = []
            for inst in fake.instances:
                info = _Info(nvmlInstanceId=inst.gpu_instance_id, nvmlProfileSlices=inst.slices)
                entries.append(
                    _HierarchyInfo(
                        _Pair(FE_GPU_I, inst.entity_id), _Pair(FE_GPU, inst.gpu_id), info
                    )
                )
                ci = _Info(
                    nvmlInstanceId=inst.gpu_instance_id,
                    nvmlComputeInstanceId=inst.compute_instance_id,
                )
                entries.append(
                    _HierarchyInfo(
                        _Pair(FE_GPU_CI, inst.ci_entity_id), _Pair(FE_GPU_I, inst.entity_id), ci
                    )
                )
            return _Hierarchy(count=len(entries), entityList=entries + [None] * 4)

        module.dcgmGetGpuInstanceHierarchy = dcgmGetGpuInstanceHierarchy
        return module

    def _reader_module(self) -> types.ModuleType:
        fake = self
        module = types.ModuleType("DcgmReader")

        class DcgmReader:
            def __init__(
                self,
                hostname="localhost",
                fieldIds=None,
                updateFrequency=10000000,
                maxKeepAge=3600.0,
                ignoreList=None,
                fieldGroupName="dcgm_fieldgroupData",
                gpuIds=None,
                entities=None,
            ) -> None:
                self.field_ids = list(fieldIds or [])
                self.gpu_ids = list(gpuIds or [])
                self.entities = list(entities or [])
                self.update_frequency = updateFrequency
                self.watching = False

            def SetHandle(self, handle) -> None:
                if not fake.profiling_supported and any(i in PROF_IDS for i in self.field_ids):
                    raise DCGMError(ST_PROFILING_NOT_SUPPORTED)
                fake.watches.append(
                    {
                        "fields": self.field_ids,
                        "gpus": self.gpu_ids,
                        "entities": [(e.entityGroupId, e.entityId) for e in self.entities],
                        "update_frequency": self.update_frequency,
                    }
                )
                self.watching = True

            def GetLatestEntityValuesAsFieldIdDict(self) -> dict:
                if not fake.connected:
                    return {}
                ids = set(self.field_ids)
                by_id = {CLASSIC_IDS[name]: name for name in CLASSIC_IDS}

                def pick(values: dict[str, object]) -> dict[int, object]:
                    picked = {i: values[by_id[i]] for i in ids if i in by_id and by_id[i] in values}
                    if fake.reader_filters_blanks:
                        picked = {i: v for i, v in picked.items() if not _blank(v)}
                    return picked

                out: dict[int, dict[int, dict[int, object]]] = {FE_GPU: {}, FE_NONE: {0: {}}}
                for gpu_id in self.gpu_ids:
                    values = fake.gpus.get(gpu_id, {})
                    device = {k: v for k, v in values.items() if k not in GLOBAL_FIELDS}
                    out[FE_GPU][gpu_id] = pick(device)
                    # DCGM_FS_GLOBAL fields come back once, under DCGM_FE_NONE
                    system = {k: v for k, v in values.items() if k in GLOBAL_FIELDS}
                    out[FE_NONE][0].update(pick(system))
                for group, entity_id in ((e.entityGroupId, e.entityId) for e in self.entities):
                    inst = next(i for i in fake.instances if i.entity_id == entity_id)
                    out.setdefault(group, {})[entity_id] = pick(inst.values)
                return out

            def Shutdown(self) -> None:
                self.watching = False

        module.DcgmReader = DcgmReader
        return module
