"""GPU Performance Monitoring (GPM, Hopper and later): SM activity without DCGM.

GPM metrics are rates between two samples. Instead of sleeping between two samples inside a
cycle, the sampler keeps each GPU's (or MIG instance's) previous sample and computes the
metrics over the whole collection interval; the first cycle therefore has no GPM values.
Two sample buffers per key are alternated, so nothing is allocated after warm-up.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any

from exporter.backends.nvml_calls import NvmlCalls

# GpuReading attribute -> NVML GPM metric constant (values are percentages 0-100).
GPU_METRICS: dict[str, str] = {
    "graphics_engine_active_ratio": "NVML_GPM_METRIC_GRAPHICS_UTIL",
    "sm_active_ratio": "NVML_GPM_METRIC_SM_UTIL",
    "sm_occupancy_ratio": "NVML_GPM_METRIC_SM_OCCUPANCY",
    "tensor_active_ratio": "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
    "dram_active_ratio": "NVML_GPM_METRIC_DRAM_BW_UTIL",
}
# MigInstance attribute -> metric: engine activity is a MIG instance's utilization (no
# utilization counter covers a MIG instance)
MIG_METRICS: dict[str, str] = {
    "graphics_engine_active_ratio": "NVML_GPM_METRIC_GRAPHICS_UTIL",
    "sm_active_ratio": "NVML_GPM_METRIC_SM_UTIL",
    "tensor_active_ratio": "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
    "dram_active_ratio": "NVML_GPM_METRIC_DRAM_BW_UTIL",
}


class GpmSampler:
    """Previous-sample bookkeeping and metric computation for GPM."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._previous: dict[Hashable, Any] = {}
        self._spare: dict[Hashable, Any] = {}

    def supported(self, calls: NvmlCalls, scope: str, handle: Any) -> bool:
        """Whether `nvmlGpmQueryDeviceSupport` says this GPU does GPM."""
        support = calls(scope, "nvmlGpmQueryDeviceSupport", handle)
        return bool(support is not None and support.isSupportedDevice)

    def sample(
        self,
        calls: NvmlCalls,
        scope: str,
        handle: Any,
        key: Hashable,
        metrics: dict[str, str],
        gpu_instance_id: int | None = None,
    ) -> dict[str, float]:
        """Take a sample for `key`; return ratios (0-1) over the interval since the last one."""
        buffer = self._spare.pop(key, None)
        if buffer is None:
            buffer = calls(scope, "nvmlGpmSampleAlloc")
            if buffer is None:
                return {}
        if gpu_instance_id is None:
            taken = calls(scope, "nvmlGpmSampleGet", handle, buffer)
        else:
            taken = calls(
                scope, "nvmlGpmMigSampleGet", handle, gpu_instance_id, buffer, key="mig_sample"
            )
        if taken is None:
            self._spare[key] = buffer
            return {}
        previous, self._previous[key] = self._previous.get(key), buffer
        if previous is None:
            return {}
        self._spare[key] = previous
        return self._metrics(calls, scope, previous, buffer, metrics)

    def _metrics(
        self, calls: NvmlCalls, scope: str, first: Any, second: Any, metrics: dict[str, str]
    ) -> dict[str, float]:
        nvml = self._nvml
        ids = {getattr(nvml, name): attr for attr, name in metrics.items() if hasattr(nvml, name)}
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(ids)
        request.sample1, request.sample2 = first, second
        for slot, metric_id in zip(request.metrics, ids, strict=False):
            slot.metricId = metric_id
        if calls(scope, "nvmlGpmMetricsGet", request) is None:
            return {}
        out: dict[str, float] = {}
        for i in range(len(ids)):
            slot = request.metrics[i]
            if slot.nvmlReturn == nvml.NVML_SUCCESS and slot.metricId in ids:
                out[ids[slot.metricId]] = min(max(float(slot.value) / 100.0, 0.0), 1.0)
        return out

    def retain(self, calls: NvmlCalls, keys: Iterable[Hashable]) -> None:
        """Free the samples of keys not in `keys` (a MIG instance went away, a GPU was lost)."""
        keep = set(keys)
        for store in (self._previous, self._spare):
            for key in [k for k in store if k not in keep]:
                calls("system", "nvmlGpmSampleFree", store.pop(key))

    def keys(self) -> list[Hashable]:
        """The keys holding a previous sample (to sample again after NVML is re-initialised)."""
        return list(self._previous)

    def close(self, calls: NvmlCalls) -> None:
        """Free every sample: they belong to the NVML session that allocated them."""
        self.retain(calls, ())
