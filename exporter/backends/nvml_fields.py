"""Batched NVML field reads: one `nvmlDeviceGetFieldValues` call per GPU instead of a dozen.

The call succeeds when *some* slots are filled, so every slot's own `nvmlReturn` is checked.
A field the GPU does not report is dropped from later batches for that GPU; the caller then
falls back to the individual API call for it (older drivers know the call, not the field).
"""

from __future__ import annotations

from typing import Any

from exporter.backends.nvml_calls import NvmlCalls

# NVML field constant -> the name the backend reads it under.
FIELDS: dict[str, str] = {
    "NVML_FI_DEV_MEMORY_TEMP": "memory_temperature",
    "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "energy_mj",
    "NVML_FI_DEV_ECC_SBE_AGG_TOTAL": "ecc_corrected",
    "NVML_FI_DEV_ECC_DBE_AGG_TOTAL": "ecc_uncorrected",
    "NVML_FI_DEV_RETIRED_SBE": "retired_sbe",
    "NVML_FI_DEV_RETIRED_DBE": "retired_dbe",
    "NVML_FI_DEV_RETIRED_PENDING": "retired_pending",
    "NVML_FI_DEV_REMAPPED_COR": "remapped_correctable",
    "NVML_FI_DEV_REMAPPED_UNC": "remapped_uncorrectable",
    "NVML_FI_DEV_REMAPPED_PENDING": "remapped_pending",
    "NVML_FI_DEV_REMAPPED_FAILURE": "remapped_failure",
    "NVML_FI_DEV_PCIE_REPLAY_COUNTER": "pcie_replay",
    "NVML_FI_DEV_PERF_POLICY_POWER": "violation_power",
    "NVML_FI_DEV_PERF_POLICY_THERMAL": "violation_thermal",
    "NVML_FI_DEV_PERF_POLICY_SYNC_BOOST": "violation_sync_boost",
    "NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT": "violation_board_limit",
    "NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION": "violation_low_utilization",
    "NVML_FI_DEV_PERF_POLICY_RELIABILITY": "violation_reliability",
}

_VALUE_MEMBER = {
    "NVML_VALUE_TYPE_DOUBLE": "dVal",
    "NVML_VALUE_TYPE_UNSIGNED_INT": "uiVal",
    "NVML_VALUE_TYPE_UNSIGNED_LONG": "ulVal",
    "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG": "ullVal",
    "NVML_VALUE_TYPE_SIGNED_LONG_LONG": "sllVal",
    "NVML_VALUE_TYPE_SIGNED_INT": "siVal",
    "NVML_VALUE_TYPE_UNSIGNED_SHORT": "usVal",
}


class FieldReader:
    """Reads `FIELDS` for one GPU per call, remembering which fields each GPU lacks."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        # Constants missing from an older pynvml are skipped rather than guessed.
        self._ids = {getattr(nvml, n): key for n, key in FIELDS.items() if hasattr(nvml, n)}
        self._members = {
            getattr(nvml, n): member for n, member in _VALUE_MEMBER.items() if hasattr(nvml, n)
        }
        self._missing: dict[str, set[int]] = {}
        self._lacks = {nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_INVALID_ARGUMENT}

    def read(self, calls: NvmlCalls, scope: str, handle: Any) -> dict[str, float]:
        """Field name -> value for the fields this GPU reported this cycle."""
        missing = self._missing.setdefault(scope, set())
        wanted = [fid for fid in self._ids if fid not in missing]
        if not wanted:
            return {}
        slots = calls(scope, "nvmlDeviceGetFieldValues", handle, wanted)
        if slots is None:
            return {}
        out: dict[str, float] = {}
        for slot in slots:
            fid = int(slot.fieldId)
            if fid not in self._ids:
                continue
            if slot.nvmlReturn == self._nvml.NVML_SUCCESS:
                member = self._members.get(int(slot.valueType))
                if member is not None:
                    out[self._ids[fid]] = float(getattr(slot.value, member))
            elif slot.nvmlReturn in self._lacks:
                missing.add(fid)
            else:
                calls.errors["nvmlDeviceGetFieldValues"] += 1
        return out
