"""DCGM field semantics shared by the `dcgm` and `dcgm-exporter` backends.

Both backends see the same DCGM fields under the same names (a running dcgm-exporter exposes
them as `DCGM_FI_*` series, the Python bindings as `dcgm_fields.DCGM_FI_*` ids), so the unit
conversions, blank handling and XID bookkeeping live here once. Scalar conversions come from
`exporter.contract.DCGM_COMPAT`, so the compat renderer and these backends cannot disagree
about a unit.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable

from exporter.backends.nvml_events import FATAL_XIDS
from exporter.contract import DCGM_COMPAT
from exporter.readings import CLOCK_EVENT_REASONS, GpuReading

# DCGM "blank" sentinels (dcgmvalue.py): int64 blank 0x7ffffffffffffff0 and its NOT_FOUND /
# NOT_SUPPORTED / NOT_PERMISSIONED successors, the same for int32 (0x7ffffff0..) and fp64 (2**47..).
INT64_BLANK = 0x7FFFFFFFFFFFFFF0
INT32_BLANK = 0x7FFFFFF0
FP64_BLANK = 140737488355328.0
_BLANK_WIDTH = 16  # every sentinel lies in [BLANK, BLANK + 16)


def is_blank(value: object) -> bool:
    """True for DCGM sentinels, NaN and `<<<...>>>` strings: "no value", never a reading."""
    if value is None:
        return True
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    if isinstance(value, str):
        return value.startswith("<<<") and ">>>" in value
    if not isinstance(value, int | float):
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    if value >= INT64_BLANK:  # text "9223372036854775794" parses to 2**63, still >= the blank
        return True
    if INT32_BLANK <= value < INT32_BLANK + _BLANK_WIDTH:
        return True
    return FP64_BLANK <= value < FP64_BLANK + _BLANK_WIDTH


def _attribute(metric: str) -> str:
    """Contract metric name -> GpuReading attribute (`gpu_energy_joules_total` -> `energy_joules`)."""
    name = metric.removeprefix("gpu_")
    return name.removesuffix("_total")


# DCGM field name -> (GpuReading attribute, divisor that turns DCGM's unit into our base unit).
SCALARS: dict[str, tuple[str, float]] = {
    name: (_attribute(ours), factor) for name, (ours, factor) in DCGM_COMPAT.items()
}
# SM activity is DCGM_FI_PROF_SM_ACTIVE only; GR_ENGINE_ACTIVE (the graphics/compute engine's
# busy time, in dcgm-exporter's default counters) is graphics engine activity, its own reading:
# neither stands in for the other.

# Keyed counters: field -> (dict attribute, key). Volatile ECC only fills in when the aggregate
# (lifetime) counter is absent, because our ECC metric is the lifetime counter.
KEYED: dict[str, tuple[str, str]] = {
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": ("ecc_errors", "corrected"),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": ("ecc_errors", "uncorrected"),
    "DCGM_FI_DEV_RETIRED_SBE": ("retired_pages", "single_bit"),
    "DCGM_FI_DEV_RETIRED_DBE": ("retired_pages", "double_bit"),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("remapped_rows", "correctable"),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("remapped_rows", "uncorrectable"),
}
KEYED_FALLBACK: dict[str, tuple[str, str]] = {
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("ecc_errors", "corrected"),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("ecc_errors", "uncorrected"),
}
FLAGS: dict[str, str] = {
    "DCGM_FI_DEV_RETIRED_PENDING": "retired_pages_pending",
    "DCGM_FI_DEV_ROW_REMAP_PENDING": "remapped_rows_pending",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "remapped_rows_failure",
    "DCGM_FI_DEV_MIG_MODE": "mig_enabled",
}
# Violation counters are nanoseconds (dcgm_fields.h and the DCGM field-id docs; dcgm_fields.py's
# "usec" comments are wrong, NVIDIA/dcgm-exporter#589), as NVML's violationTime -> seconds.
# Reason labels match the NVML backend: the first four share the clock-event vocabulary, board
# limit and reliability have no clock-event bit and keep their own names.
VIOLATIONS: dict[str, str] = {
    "DCGM_FI_DEV_POWER_VIOLATION": "sw_power_cap",
    "DCGM_FI_DEV_THERMAL_VIOLATION": "sw_thermal_slowdown",
    "DCGM_FI_DEV_SYNC_BOOST_VIOLATION": "sync_boost",
    "DCGM_FI_DEV_LOW_UTIL_VIOLATION": "gpu_idle",
    "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION": "board_limit",
    "DCGM_FI_DEV_RELIABILITY_VIOLATION": "reliability",
}
# The clock-event reason bitmask (field 112; renamed from CLOCK_THROTTLE_REASONS in DCGM 3.3).
CLOCK_EVENT_MASKS = ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")
XID_FIELD = "DCGM_FI_DEV_XID_ERRORS"
# The NVSwitch fabric manager's view of the GPU (dcgmFabricManagerStatus_t) -> (NVML's fabric
# state, completed with an error): 1 not started, 2 in progress, 3 success, 4 failure; 0 (not
# supported), 5 (unrecognized) and 6 (NVML too old) say nothing.
FABRIC_FIELD = "DCGM_FI_DEV_FABRIC_MANAGER_STATUS"
FABRIC_STATES: dict[int, tuple[int, bool]] = {
    1: (1, False),
    2: (2, False),
    3: (3, False),
    4: (3, True),
}
# Identity fields (strings) the `dcgm` backend reads through the same field API.
IDENTITY: dict[str, str] = {
    "DCGM_FI_DEV_UUID": "uuid",
    "DCGM_FI_DEV_NAME": "model",
    "DCGM_FI_DEV_PCI_BUSID": "pci_bus_id",
    "DCGM_FI_DEV_SERIAL": "serial",
    "DCGM_FI_DEV_VBIOS_VERSION": "vbios_version",
}
# XID codes after which the GPU has fallen off the bus: nothing else it reports is trusted.
XID_GPU_LOST = frozenset({79})

ALL_NUMERIC_FIELDS: tuple[str, ...] = (
    *SCALARS,
    *KEYED,
    *KEYED_FALLBACK,
    *FLAGS,
    *VIOLATIONS,
    *CLOCK_EVENT_MASKS,
    XID_FIELD,
    FABRIC_FIELD,
)


def apply_fields(gpu: GpuReading, values: dict[str, float]) -> None:
    """Set every known numeric DCGM field of one GPU from `{field name: raw value}`.

    Blank values are skipped, so the reading keeps None (a gap) instead of a sentinel. XID is
    not handled here: the last-code gauge needs state across cycles (see `XidTracker`).
    """
    clean = {name: float(value) for name, value in values.items() if not is_blank(value)}
    for name, (attribute, divisor) in SCALARS.items():
        if name in clean:
            setattr(gpu, attribute, clean[name] / divisor)
    for table in (KEYED_FALLBACK, KEYED):  # aggregate applied last, so it wins
        for name, (attribute, key) in table.items():
            if name in clean:
                getattr(gpu, attribute)[key] = clean[name]
    for name, attribute in FLAGS.items():
        if name in clean:
            setattr(gpu, attribute, clean[name] != 0)
    for name, reason in VIOLATIONS.items():
        if name in clean:
            gpu.clock_event_seconds[reason] = clean[name] * 1e-9
    for name in CLOCK_EVENT_MASKS:
        if name in clean:
            mask = int(clean[name])
            gpu.clock_event_active.update(
                {reason: bool(mask >> bit & 1) for bit, reason in enumerate(CLOCK_EVENT_REASONS)}
            )
    if FABRIC_FIELD in clean and int(clean[FABRIC_FIELD]) in FABRIC_STATES:
        gpu.fabric_state, gpu.fabric_error = FABRIC_STATES[int(clean[FABRIC_FIELD])]
    for attr in ("performance_state", "recovery_action"):  # whole numbers, read as floats
        value = getattr(gpu, attr)
        if value is not None:
            setattr(gpu, attr, int(value))
    fill_memory_total(gpu)
    if gpu.remapped_rows_failure:
        gpu.healthy = False


MIB = 2.0**20
# A MIG GPU instance's own activity fields (dcgm-exporter's default counters carry engine,
# tensor and DRAM activity; SM activity only where a user watches it) -> MigInstance attribute
MIG_ACTIVITY: dict[str, str] = {
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "graphics_engine_active_ratio",
    "DCGM_FI_PROF_SM_ACTIVE": "sm_active_ratio",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "tensor_active_ratio",
    "DCGM_FI_PROF_DRAM_ACTIVE": "dram_active_ratio",
}


def mig_values(values: dict[str, object]) -> dict[str, float | None]:
    """A MIG GPU instance's memory (MiB -> bytes; total = used + free + reserved where FB_TOTAL
    is not watched, reserved 0 on pages that lack it) and activity, as MigInstance keywords."""
    clean = {
        k: float(v) for k, v in values.items() if isinstance(v, int | float) and not is_blank(v)
    }
    used = clean.get("DCGM_FI_DEV_FB_USED")
    total = clean.get("DCGM_FI_DEV_FB_TOTAL")
    if total is None and used is not None and "DCGM_FI_DEV_FB_FREE" in clean:
        total = used + clean["DCGM_FI_DEV_FB_FREE"] + clean.get("DCGM_FI_DEV_FB_RESERVED", 0.0)
    out: dict[str, float | None] = {
        "memory_total_bytes": None if total is None else total * MIB,
        "memory_used_bytes": None if used is None else used * MIB,
    }
    out.update({attr: clean.get(name) for name, attr in MIG_ACTIVITY.items()})
    return out


def fill_memory_total(gpu: GpuReading) -> None:
    """FB_TOTAL is not in dcgm-exporter's default set: total = used + free (+ reserved)."""
    if gpu.memory_total_bytes is None and None not in (
        gpu.memory_used_bytes,
        gpu.memory_free_bytes,
    ):
        gpu.memory_total_bytes = (
            gpu.memory_used_bytes + gpu.memory_free_bytes + (gpu.memory_reserved_bytes or 0.0)
        )


class XidTracker:
    """Turns DCGM's XID views into per-code counters of the XIDs raised since exporter start.

    As in the NVML backend (whose events only arrive after registration), the counters and the
    "fatal XID => unhealthy" rule cover what happened while this exporter was watching. DCGM's
    views also hold history from before our start, so the first reading per GPU key (its first
    collection) is a baseline: remembered, but not counted, and no health or timestamp is
    derived from it; else each restart of ours would count a days-old standing fatal code again
    and page.

    DCGM itself keeps only the LAST XID code per GPU in `DCGM_FI_DEV_XID_ERRORS`, a gauge that is
    not reset until the driver reloads. From that alone only a *change* of code is visible, so a
    GPU that raises XID 13 twice in a row (or twice between two collections) counts once:
    repeats are invisible and the counter undercounts. dcgm-exporter can do better, and we use
    its series when the scrape has them, best first:
    `DCGM_EXP_XID_ERRORS_TOTAL{xid}` (cumulative since dcgm-exporter's start, maybe long before
    ours; a drop after our baseline means it restarted, so the new value is all new events),
    then `DCGM_EXP_XID_ERRORS_COUNT{xid}` (events inside a sliding window; each rise is added,
    which still undercounts when old events leave the window in the same interval as new ones
    arrive).
    Keys are the backends' (UUID, else GPU id or index): a GPU first seen later (hot-plug, a
    replaced board) gets its own baseline; a MIG re-partition keeps the key and the state. A
    code's count series appearing after the key's first collection holds new events
    (dcgm-exporter writes it once it sees the code, so a GPU without XIDs may have none yet).
    The last-code view needs a previous code of its own: its first value is a baseline even
    when the GPU was collected before (the gauge carries no time, so it may be old).
    XID 79 (fell off the bus) marks the GPU lost from the CURRENT view, baseline included: lost
    is a state, not an event, and lasts until a reset or driver reload, which clears the code.
    """

    def __init__(self) -> None:
        self._totals: dict[Hashable, Counter[int]] = {}
        self._last_code: dict[Hashable, int] = {}
        self._previous: dict[Hashable, dict[int, float]] = {}
        self._last_time: dict[Hashable, float] = {}
        self._lost: dict[Hashable, bool] = {}
        self._seen: set[Hashable] = set()  # keys read before, with or without XID series

    def observe_last_code(self, key: Hashable, code: float | None, now: float) -> None:
        """One reading of the last-XID gauge (None: the GPU has none); a new non-zero code
        counts as one event. The first code read per key is the baseline: it may predate us."""
        self._seen.add(key)
        if code is None or is_blank(code):
            return
        current = int(code)
        totals = self._totals.setdefault(key, Counter())
        before = self._last_code.get(key)
        if before is not None and current != 0 and current != before:
            totals[current] += 1
            self._last_time[key] = now
        self._last_code[key] = current
        self._lost[key] = current in XID_GPU_LOST

    def observe_counts(
        self, key: Hashable, counts: dict[int, float], now: float, *, cumulative: bool
    ) -> None:
        """One reading of per-code counts: cumulative totals, or counts inside a window. In a
        key's first reading they are the baseline: they hold events from before our start."""
        totals = self._totals.setdefault(key, Counter())
        if key in self._seen:  # else this is the baseline
            previous = self._previous.get(key, {})
            for code, count in counts.items():
                before = previous.get(code, 0.0)
                rise = count if cumulative and count < before else count - before
                if rise > 0:
                    totals[code] += int(rise)
                    self._last_time[key] = now
        self._previous[key] = dict(counts)
        self._seen.add(key)
        self._lost[key] = any(counts.get(code, 0) > 0 for code in XID_GPU_LOST)

    def apply(self, key: Hashable, gpu: GpuReading) -> None:
        """Copy the counters into the reading. As in the NVML backend, a fatal XID counted since
        start (never one only in a baseline) makes the GPU unhealthy; XID 79 standing now (the
        baseline included) marks it lost."""
        totals = self._totals.get(key)
        if totals:
            gpu.xid_errors = {code: float(count) for code, count in sorted(totals.items())}
            gpu.xid_last_timestamp_seconds = self._last_time.get(key)
            if any(totals.get(code) for code in FATAL_XIDS):
                gpu.healthy = False
        if self._lost.get(key):
            gpu.lost = True
            gpu.healthy = False
