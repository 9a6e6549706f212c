"""How the GPUs of one node reach each other, read from NVML once and refreshed rarely.

NVLink counts come from walking each GPU's links (`nvmlDeviceGetNvLinkState` +
`nvmlDeviceGetNvLinkRemotePciInfo`). A link whose far end is another GPU of this node counts
for that pair directly. A link that lands elsewhere counts as switch fabric only when
`nvmlDeviceGetNvLinkRemoteDeviceType` says NVSwitch (HGX/DGX boards); a link to a CPU (IBM
NPU), to a GPU this process cannot see, or of unknown type connects no two local GPUs. Two
GPUs on the switch fabric are connected when NVML's P2P NVLink status says so, with
min(links of either) NVLinks, which is what `nvidia-smi topo -m` prints ("NV18" on H100).
Pairs without NVLink get the PCIe common-ancestor level.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from exporter.backends.nvml_calls import GpuLost, NvmlCalls
from exporter.readings import TopologyLink

_LEVELS = {
    "NVML_TOPOLOGY_INTERNAL": "pcie_switch",  # two GPUs on one board: closer than a switch
    "NVML_TOPOLOGY_SINGLE": "pcie_switch",
    "NVML_TOPOLOGY_MULTIPLE": "pcie_multi_switch",
    "NVML_TOPOLOGY_HOSTBRIDGE": "host_bridge",
    "NVML_TOPOLOGY_NODE": "numa_node",
    "NVML_TOPOLOGY_SYSTEM": "cross_socket",
}

PciKey = tuple[int, int, int]  # (domain, bus, device)


def pci_key(info: Any) -> PciKey:
    return (int(info.domain), int(info.bus), int(info.device))


def discover_links(
    calls: NvmlCalls, handles: dict[int, Any], pci: dict[int, PciKey]
) -> list[TopologyLink]:
    """Every ordered pair of the given GPUs with its link type and NVLink count.

    Raises GpuLost when a GPU fell off the bus: a partial picture would drop its links.
    """
    nvml = calls.nvml
    levels = {getattr(nvml, name): kind for name, kind in _LEVELS.items() if hasattr(nvml, name)}
    index_by_pci = {key: index for index, key in pci.items()}
    direct: dict[int, Counter[int]] = {}
    fabric: dict[int, int] = {}
    for index, handle in handles.items():
        direct[index], fabric[index] = _walk_links(calls, index, handle, index_by_pci)

    links: list[TopologyLink] = []
    order = sorted(handles)
    for pos, a in enumerate(order):
        for b in order[pos + 1 :]:
            count = max(direct[a][b], direct[b][a])
            if count == 0 and fabric[a] and fabric[b] and _p2p_nvlink(calls, handles, a, b):
                count = min(fabric[a], fabric[b])
            if count:
                kind = "nvlink"
            else:
                level = _common_ancestor(calls, handles, a, b)
                kind = levels.get(level) if level is not None else None
                if kind is None:
                    continue
            links.append(TopologyLink(gpu=a, peer=b, link_type=kind, nvlink_count=count))
            links.append(TopologyLink(gpu=b, peer=a, link_type=kind, nvlink_count=count))
    return links


def _walk_links(
    calls: NvmlCalls, index: int, handle: Any, index_by_pci: dict[PciKey, int]
) -> tuple[Counter[int], int]:
    """(active links per peer GPU, active links into a switch fabric) for one GPU."""
    nvml, scope = calls.nvml, f"gpu{index}"
    stop = {nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_INVALID_ARGUMENT}
    peers: Counter[int] = Counter()
    fabric = 0
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        try:
            active = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except nvml.NVMLError as error:
            code = getattr(error, "value", None)
            if code == nvml.NVML_ERROR_GPU_IS_LOST:
                calls.failed(scope, "nvmlDeviceGetNvLinkState", code)
                raise GpuLost("nvmlDeviceGetNvLinkState") from error
            if code not in stop:  # stop: beyond the GPU's links, or no NVLink at all
                calls.failed(scope, "nvmlDeviceGetNvLinkState", code)
            break
        calls.succeeded(scope, "nvmlDeviceGetNvLinkState")
        if not active:
            continue
        remote = calls(scope, "nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
        if remote is None:
            continue
        peer = index_by_pci.get(pci_key(remote))
        if peer is not None:
            if peer != index:
                peers[peer] += 1
            continue
        kind = calls(scope, "nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
        if kind is not None and int(kind) == nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
            fabric += 1
    return peers, fabric


def _p2p_nvlink(calls: NvmlCalls, handles: dict[int, Any], a: int, b: int) -> bool:
    nvml = calls.nvml
    status = calls(
        f"gpu{a}",
        "nvmlDeviceGetP2PStatus",
        handles[a],
        handles[b],
        nvml.NVML_P2P_CAPS_INDEX_NVLINK,
    )
    return status == nvml.NVML_P2P_STATUS_OK


def _common_ancestor(calls: NvmlCalls, handles: dict[int, Any], a: int, b: int) -> int | None:
    return calls(f"gpu{a}", "nvmlDeviceGetTopologyCommonAncestor", handles[a], handles[b])
