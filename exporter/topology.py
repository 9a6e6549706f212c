"""Derived topology facts shared by every backend: NVLink islands and free NVLink groups."""

from __future__ import annotations

from collections.abc import Iterable

from exporter.readings import TopologyLink


def nvlink_islands(gpu_indices: Iterable[int], links: Iterable[TopologyLink]) -> dict[int, int]:
    """Map each GPU index to the id of its NVLink-connected group (id = smallest member index).

    A GPU with no NVLink is an island of one. Islands are connected components, so a
    GPU reached only through another GPU's NVLink still belongs to the same island.
    """
    parent = {index: index for index in gpu_indices}

    def find(index: int) -> int:
        while parent[index] != index:
            parent[index] = parent[parent[index]]
            index = parent[index]
        return index

    for link in links:
        if link.link_type != "nvlink" or link.gpu not in parent or link.peer not in parent:
            continue
        root_a, root_b = find(link.gpu), find(link.peer)
        if root_a != root_b:
            parent[max(root_a, root_b)] = min(root_a, root_b)
    return {index: find(index) for index in parent}


def largest_connected_subset(members: Iterable[int], islands: dict[int, int]) -> int:
    """Size of the largest subset of `members` that lies inside one NVLink island."""
    counts: dict[int, int] = {}
    for index in members:
        island = islands.get(index, index)
        counts[island] = counts.get(island, 0) + 1
    return max(counts.values(), default=0)
