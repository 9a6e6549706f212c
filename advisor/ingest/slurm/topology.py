"""Racks from Slurm's network topology: the leaf switch (or block) a node hangs off is its rack.

Read from `scontrol show topology` (the controller's view, one `SwitchName=... Level=0 ...
Nodes=...` line per switch, or `BlockName=... Nodes=...` with topology/block) or from a
`topology.conf` file (`SwitchName=leaf1 Nodes=gpu[01-08]`; a switch listing `Nodes=` is a leaf,
one listing only `Switches=` is above the leaves). A cluster without a topology plugin has no
racks: every node's rack stays "" (unknown), never a guess.
"""

from __future__ import annotations

import re

from advisor.ingest.slurm.hostlist import HostlistError, expand
from advisor.ingest.slurm.values import SlurmFormatError

_PAIR = re.compile(r"(\w+)=(\S*)")


def _pairs(line: str) -> dict[str, str]:
    return {key: value for key, value in _PAIR.findall(line.partition("#")[0])}


def racks(text: str) -> dict[str, str]:
    """{node: leaf switch or block} from `scontrol show topology` output or `topology.conf`
    text; {} when it names none. A node under two leaves keeps the first (Slurm refuses such
    a file, so it only comes from a hand-edited copy)."""
    out: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        pairs = _pairs(line)
        name = pairs.get("SwitchName") or pairs.get("BlockName")
        if not name or "Nodes" not in pairs:
            continue
        if "SwitchName" in pairs and pairs.get("Level", "0") != "0":
            continue  # scontrol lists every switch's nodes; only the leaves are racks
        try:
            nodes = expand(pairs["Nodes"])
        except HostlistError as error:
            raise SlurmFormatError(f"topology line {number}: {error}") from None
        for node in nodes:
            out.setdefault(node, name)
    return out
