"""Batched NVML field reads: one `nvmlDeviceGetFieldValues` call per GPU instead of a dozen.

Covers memory temperature, energy and the health counters (ECC, retired pages, remapped rows,
PCIe replays, clock violation time), each with an individual-call fallback in `read_counters`,
and what only fields give: the driver's recommended recovery action and the NVLink data counters
(summed over every link: scope UINT_MAX, nvml.h).

The call succeeds when *some* slots are filled, so every slot's own `nvmlReturn` is checked.
A field the GPU does not report is dropped from later batches for that GPU, in the same
not-supported memory as the calls (`NvmlCalls`), so it is asked again when the GPU's MIG state
changes or the memory expires (remapped rows are not reported under MIG, and are again after);
the caller falls back to the individual API call for it (older drivers know the call, not the
field).
"""

from __future__ import annotations

from typing import Any

from exporter.backends.nvml_calls import NvmlCalls
from exporter.readings import GpuReading

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
    "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION": "recovery_action",
    "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX": "nvlink_tx_kib",
    "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX": "nvlink_rx_kib",
}
ALL_LINKS = 0xFFFFFFFF  # scopeId of an NVLink field: the sum over every link (nvml.h)
# Fields read for another scope than 0: field name -> scopeId
SCOPES: dict[str, int] = {
    "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX": ALL_LINKS,
    "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX": ALL_LINKS,
}

_CALL = "nvmlDeviceGetFieldValues"
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
    """Reads `FIELDS` for one GPU per call, leaving out the fields the GPU lacks for now."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        # Constants missing from an older pynvml are skipped rather than guessed.
        self._ids = {getattr(nvml, n): key for n, key in FIELDS.items() if hasattr(nvml, n)}
        self._scopes = {getattr(nvml, n): scope for n, scope in SCOPES.items() if hasattr(nvml, n)}
        self._members = {
            getattr(nvml, n): member for n, member in _VALUE_MEMBER.items() if hasattr(nvml, n)
        }
        self._memo = {fid: f"field:{key}" for fid, key in self._ids.items()}
        self._lacks = {nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_INVALID_ARGUMENT}
        # field name -> when the driver took the value (seconds), for the last `read`'s GPU:
        # a rate between collections divides by the driver's time, not the collector's
        self.times: dict[str, float] = {}

    def read(self, calls: NvmlCalls, scope: str, handle: Any) -> dict[str, float]:
        """Field name -> value for the fields this GPU reported this cycle."""
        self.times = {}
        wanted = [
            (fid, self._scopes[fid]) if fid in self._scopes else fid
            for fid, memo in self._memo.items()
            if calls.supported(scope, memo)
        ]
        if not wanted:
            return {}
        slots = calls(scope, _CALL, handle, wanted)
        if slots is None:
            return {}
        out: dict[str, float] = {}
        for slot in slots:
            fid = int(slot.fieldId)
            if fid not in self._ids:
                continue
            code, memo = int(slot.nvmlReturn), self._memo[fid]
            if code == self._nvml.NVML_SUCCESS:
                calls.succeeded(scope, memo, name=_CALL)
                member = self._members.get(int(slot.valueType))
                if member is not None:
                    out[self._ids[fid]] = float(getattr(slot.value, member))
                    self.times[self._ids[fid]] = int(slot.timestamp) / 1e6
            elif code in self._lacks:
                calls.mark_unsupported(scope, memo, name=_CALL, code=code)
            else:
                calls.failed(scope, _CALL, code, key=memo)
        return out


# Violation (perf policy) counters -> reason label. The first four share the vocabulary of
# the clock-event bits; board limit and reliability have no bit and keep NVML's own name.
_VIOLATIONS = {
    "power": ("sw_power_cap", "NVML_PERF_POLICY_POWER"),
    "thermal": ("sw_thermal_slowdown", "NVML_PERF_POLICY_THERMAL"),
    "sync_boost": ("sync_boost", "NVML_PERF_POLICY_SYNC_BOOST"),
    "low_utilization": ("gpu_idle", "NVML_PERF_POLICY_LOW_UTILIZATION"),
    "board_limit": ("board_limit", "NVML_PERF_POLICY_BOARD_LIMIT"),
    "reliability": ("reliability", "NVML_PERF_POLICY_RELIABILITY"),
}


class Rate:
    """Per-second rates of counters between one collection and the next (the first collection
    of a key has none; a counter that went down, a driver reload, starts over)."""

    def __init__(self) -> None:
        self._previous: dict[object, tuple[float, float]] = {}

    def of(self, key: object, value: float | None, now: float) -> float | None:
        if value is None:
            self._previous.pop(key, None)
            return None
        before, self._previous[key] = self._previous.get(key), (now, value)
        if before is None or now <= before[0] or value < before[1]:
            return None
        return (value - before[1]) / (now - before[0])


def read_counters(
    reader: FieldReader, calls: NvmlCalls, scope: str, handle: Any, r: GpuReading
) -> dict[str, float]:
    """Memory temperature, energy and the health counters: batched, each with its fallback.
    Returns the batch, for the values the caller derives (NVLink rates)."""
    nvml, h, s = calls.nvml, handle, scope
    f = reader.read(calls, s, h)
    action = f.get("recovery_action")
    r.recovery_action = int(action) if action is not None else None
    r.memory_temperature_celsius = f.get("memory_temperature")
    energy = f.get("energy_mj")
    if energy is None:
        energy = calls(s, "nvmlDeviceGetTotalEnergyConsumption", h)
    r.energy_joules = scaled(energy, 1e-3)

    ecc = {"corrected": f.get("ecc_corrected"), "uncorrected": f.get("ecc_uncorrected")}
    for kind, error_type in (
        ("corrected", nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
        ("uncorrected", nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
    ):
        if ecc[kind] is None:
            ecc[kind] = calls(
                s,
                "nvmlDeviceGetTotalEccErrors",
                h,
                error_type,
                nvml.NVML_AGGREGATE_ECC,
                key=f"ecc_{kind}",
            )
    r.ecc_errors = {k: float(v) for k, v in ecc.items() if v is not None}

    retired = {"single_bit": f.get("retired_sbe"), "double_bit": f.get("retired_dbe")}
    for cause, source in (
        ("single_bit", nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),
        ("double_bit", nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),
    ):
        if retired[cause] is None:
            pages = calls(s, "nvmlDeviceGetRetiredPages", h, source, key=f"retired_{cause}")
            retired[cause] = len(pages) if pages is not None else None
    r.retired_pages = {k: float(v) for k, v in retired.items() if v is not None}
    pending = f.get("retired_pending")
    if pending is None:
        pending = calls(s, "nvmlDeviceGetRetiredPagesPendingStatus", h)
    r.retired_pages_pending = bool(pending) if pending is not None else None

    remap = [
        f.get(k)
        for k in (
            "remapped_correctable",
            "remapped_uncorrectable",
            "remapped_pending",
            "remapped_failure",
        )
    ]
    if any(v is None for v in remap):
        rows = calls(s, "nvmlDeviceGetRemappedRows", h)
        if rows is not None:
            remap = [float(v) for v in rows]
    if remap[0] is not None and remap[1] is not None:
        r.remapped_rows = {"correctable": remap[0], "uncorrectable": remap[1]}
    r.remapped_rows_pending = bool(remap[2]) if remap[2] is not None else None
    r.remapped_rows_failure = bool(remap[3]) if remap[3] is not None else None

    replay = f.get("pcie_replay")
    if replay is None:
        replay = calls(s, "nvmlDeviceGetPcieReplayCounter", h)
    r.pcie_replay_errors = number(replay)

    for short, (reason, policy) in _VIOLATIONS.items():
        ns = f.get(f"violation_{short}")
        if ns is None and hasattr(nvml, policy):
            status = calls(
                s,
                "nvmlDeviceGetViolationStatus",
                h,
                getattr(nvml, policy),
                key=f"violation_{short}",
            )
            ns = status.violationTime if status is not None else None
        if ns is not None:
            r.clock_event_seconds[reason] = float(ns) / 1e9
    return f


def number(value: Any) -> float | None:
    return float(value) if value is not None else None


def scaled(value: Any, factor: float) -> float | None:
    return float(value) * factor if value is not None else None
