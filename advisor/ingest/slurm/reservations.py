"""Slurm reservations, from JSON (`scontrol --json show reservations` from 23.02, slurmrestd's
`/reservations`) or from the text of `scontrol show reservation --oneliner` (21.08/22.05,
whose scontrol prints no JSON).

How the model shows them: the nodes of a reservation that is active at the read are not free
capacity (`schedulable=False`), as a drained node is; the jobs running inside keep their GPUs.
A reservation that starts later leaves its nodes free now. A reservation of part of a node
(cores or `gres/gpu=N` in its TRES) still takes the whole node out of free capacity: Slurm
does not say which GPUs it holds.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from advisor.ingest.slurm.hostlist import HostlistError, expand
from advisor.ingest.slurm.values import SlurmFormatError, number, records, text, words

_PAIR = re.compile(r"(\w+)=(.*?)(?=\s+\w+=|$)")


@dataclass(frozen=True)
class Reservation:
    name: str
    nodes: tuple[str, ...]
    start: float  # Unix time, NaN unknown
    end: float  # Unix time, NaN unknown (or never)
    flags: tuple[str, ...]
    accounts: str
    users: str

    def active(self, now: float) -> bool:
        """Started (or start unknown) and not ended at `now`."""
        started = math.isnan(self.start) or self.start <= now
        return started and (math.isnan(self.end) or now < self.end)


def _nodes(value: str, name: str) -> tuple[str, ...]:
    try:
        return tuple(expand(value))
    except HostlistError as error:
        raise SlurmFormatError(f"reservation {name}: {error}") from None


def _time(value: Any) -> float:
    parsed = number(value)
    return math.nan if parsed is None or parsed <= 0 else parsed


def parse_reservations(doc: Any, where: str = "reservations") -> list[Reservation]:
    """The reservations of a JSON answer."""
    out = []
    for row in records(doc, "reservations", where):
        name = text(row.get("name"))
        out.append(
            Reservation(
                name=name,
                nodes=_nodes(text(row.get("node_list")), name),
                start=_time(row.get("start_time")),
                end=_time(row.get("end_time")),
                flags=tuple(words(row.get("flags"))),
                accounts=text(row.get("accounts")),
                users=text(row.get("users")),
            )
        )
    return out


def _local_time(value: str) -> float:
    """scontrol's local "2026-11-28T18:13:27" as a Unix time; NaN for Unknown/None."""
    try:
        return time.mktime(time.strptime(value, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return math.nan


def parse_reservation_text(output: str) -> list[Reservation]:
    """The reservations of `scontrol show reservation --oneliner` (one per line; "No
    reservations in the system" is none)."""
    out = []
    for line in output.splitlines():
        pairs = dict(_PAIR.findall(line.strip()))
        name = pairs.get("ReservationName")
        if not name:
            continue
        start, end = _local_time(pairs.get("StartTime", "")), _local_time(pairs.get("EndTime", ""))
        out.append(
            Reservation(
                name=name,
                nodes=_nodes(text(pairs.get("Nodes")), name),
                start=start,
                end=end,
                flags=tuple(words(text(pairs.get("Flags")))),
                accounts=text(pairs.get("Accounts")),
                users=text(pairs.get("Users")),
            )
        )
    return out


def reserved_nodes(reservations: Iterable[Reservation], now: float) -> dict[str, str]:
    """{node: name of the first reservation active at `now` that holds it}."""
    out: dict[str, str] = {}
    for reservation in reservations:
        if reservation.active(now):
            for node in reservation.nodes:
                out.setdefault(node, reservation.name)
    return out
