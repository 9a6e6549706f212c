"""GPU quotas from Slurm's accounting limits, as the planner's `Policy`.

Read (from slurmdbd, through `sacctmgr --parsable2` or slurmrestd's `/slurmdb/...`):
- tenant=account (default): the `GrpTRES` of each account's own association (user and
  partition empty): `gres/gpu=N` caps the account's GPUs, `gres/gpu:TYPE=N` its GPUs of the model
  whose GRES type is TYPE. A parent account's limit is not a tenant quota and is not read.
- tenant=user: the `GrpTRES` of each user's associations, summed over their accounts.
- tenant=qos: each QOS's `GrpTRES`.

A cluster without slurmdbd has no such limits: the quotas are then empty, with a note, not an
error. An accounting database that is configured but does not answer is an error.
Merging with a `--policy` file is the caller's: `SlurmQuotas.policy` holds quotas only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from advisor.ingest.slurm import gres
from advisor.ingest.slurm.commands import Runner, SlurmUnavailable, failure
from advisor.ingest.slurm.values import SlurmFormatError, number, records
from advisor.planner.constraints import ANY_MODEL, Policy

NO_ACCOUNTING = (
    "not running a supported accounting_storage plugin",
    "accounting_storage/none",
    "slurmdbd is not configured",
)


@dataclass(frozen=True)
class SlurmQuotas:
    policy: Policy
    origin: dict[tuple[str, str], str] = field(default_factory=dict)  # quota -> "qos rnd"
    notes: tuple[str, ...] = ()


def gpu_limits(tres_text: str) -> dict[str, float]:
    """{model: GPUs} of a TRES limit string; model "" is all models together."""
    out: dict[str, float] = {}
    for key, value in gres.tres(tres_text).items():
        if key == "gres/gpu":
            out[ANY_MODEL] = value
        elif key.startswith("gres/gpu:"):
            out[key.split(":", 1)[1]] = value
    return out


def _add(
    quotas: dict[tuple[str, str], float],
    origin: dict[tuple[str, str], str],
    tenant: str,
    limits: Mapping[str, float],
    where: str,
    summed: bool,
) -> None:
    for model, value in limits.items():
        if not math.isfinite(value) or value < 0:
            continue
        key = (tenant, model)
        if summed and key in quotas:
            quotas[key] += value
            origin[key] = f"{origin[key]} + {where}"
        else:
            quotas[key] = value
            origin[key] = where


def quotas_from_rows(
    qos: Iterable[tuple[str, str]],
    associations: Iterable[tuple[str, str, str, str]],
    tenant: str,
) -> SlurmQuotas:
    """Quotas from QOS rows (name, GrpTRES) and association rows (account, user, partition,
    GrpTRES) for the tenant kind (module docstring); pure."""
    quotas: dict[tuple[str, str], float] = {}
    origin: dict[tuple[str, str], str] = {}
    if tenant == "qos":
        for name, tres_text in qos:
            _add(quotas, origin, name, gpu_limits(tres_text), f"QOS {name} GrpTRES", False)
    for account, user, partition, tres_text in associations:
        limits = gpu_limits(tres_text)
        if not limits:
            continue
        if tenant == "account" and not user and not partition:
            _add(quotas, origin, account, limits, f"account {account} GrpTRES", False)
        elif tenant == "user" and user:
            _add(quotas, origin, user, limits, f"association {account}/{user} GrpTRES", True)
    return SlurmQuotas(Policy(quotas=quotas), origin)


def _parsable(output: str, columns: int, command: str) -> list[tuple[str, ...]]:
    rows = []
    for number_, line in enumerate(output.splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split("|")
        if len(fields) != columns:
            raise SlurmFormatError(
                f"{command}: line {number_} has {len(fields)} fields, expected {columns}"
            )
        rows.append(tuple(fields))
    return rows


def _cluster_name(run: Runner) -> str:
    status, out, _ = run.text(["scontrol", "show", "config"], check=False)
    for line in out.splitlines() if status == 0 else ():
        key, _, value = line.partition("=")
        if key.strip() == "ClusterName":
            return value.strip()
    return ""


QOS_FORMAT = "format=Name,GrpTRES"
ASSOC_FORMAT = "format=Cluster,Account,User,Partition,GrpTRES"


def quotas_from_text(qos_text: str, assoc_text: str, tenant: str) -> SlurmQuotas:
    """Quotas from `sacctmgr --parsable2 --noheader show qos QOS_FORMAT` and `... show
    associations ASSOC_FORMAT` output; pure."""
    qos = _parsable(qos_text, 2, "sacctmgr show qos")
    rows = _parsable(assoc_text, 5, "sacctmgr show associations")
    found = quotas_from_rows(
        [(name, tres_text) for name, tres_text in qos],
        [(account, user, partition, tres_text) for _, account, user, partition, tres_text in rows],
        tenant,
    )
    return found if found.policy.quotas else _with_note(found, "no GPU limit (GrpTRES gres/gpu)")


def quotas_from_sacctmgr(run: Runner, tenant: str) -> SlurmQuotas:
    """Quotas through `sacctmgr`; empty with a note without slurmdbd."""
    qos_command = ["sacctmgr", "--parsable2", "--noheader", "show", "qos", QOS_FORMAT]
    status, qos_text, err = run.text(qos_command, check=False)
    if status != 0:
        if any(marker in (err + qos_text) for marker in NO_ACCOUNTING):
            return _absent("Slurm keeps no accounting database (no slurmdbd)")
        raise SlurmUnavailable(failure(" ".join(qos_command), status, err or qos_text))
    assoc_command = ["sacctmgr", "--parsable2", "--noheader", "show", "associations"]
    assoc_command.append(ASSOC_FORMAT)
    cluster = _cluster_name(run)
    if cluster:
        assoc_command += ["where", f"cluster={cluster}"]
    _, assoc_text, _ = run.text(assoc_command)
    return quotas_from_text(qos_text, assoc_text, tenant)


def _absent(why: str) -> SlurmQuotas:
    return SlurmQuotas(Policy(), {}, (f"{why}: no QOS or association GPU quotas",))


def _with_note(found: SlurmQuotas, note: str) -> SlurmQuotas:
    return SlurmQuotas(found.policy, found.origin, (*found.notes, note))


def _tres_list(value: Any) -> str:
    """A JSON TRES list ([{type, name, count}]) as a TRES string ("gres/gpu=4")."""
    if not isinstance(value, list):
        return ""
    parts = []
    for item in value:
        if not isinstance(item, Mapping):
            continue
        kind, name, count = item.get("type"), item.get("name"), number(item.get("count"))
        if count is None or not kind:
            continue
        parts.append(f"{kind}/{name}={count:g}" if name else f"{kind}={count:g}")
    return ",".join(parts)


def _path(doc: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(doc, Mapping):
            return None
        doc = doc.get(key)
    return doc


def quotas_from_json(qos_doc: Any, assoc_doc: Any, tenant: str) -> SlurmQuotas:
    """Quotas from slurmrestd's `/slurmdb/.../qos` and `/associations` answers; pure."""
    qos = [
        (str(row.get("name", "")), _tres_list(_path(row, "limits", "max", "tres", "total")))
        for row in records(qos_doc, "qos", "slurmdb qos")
    ]
    associations = [
        (
            str(row.get("account") or ""),
            str(row.get("user") or ""),
            str(row.get("partition") or ""),
            _tres_list(_path(row, "max", "tres", "total")),
        )
        for row in records(assoc_doc, "associations", "slurmdb associations")
    ]
    return quotas_from_rows(qos, associations, tenant)


def quotas_from_rest(client: Any, tenant: str, pinned: str = "") -> SlurmQuotas:
    """Quotas through slurmrestd; empty with a note where it serves no /slurmdb (no slurmdbd)."""
    api = client.api_version(pinned)
    qos_doc = client.get(f"/slurmdb/{api}/qos", missing_ok=True)
    if qos_doc is None:
        return _absent(f"slurmrestd {client.base} serves no /slurmdb/{api} (no slurmdbd)")
    assoc_doc = client.get(f"/slurmdb/{api}/associations")
    found = quotas_from_json(qos_doc, assoc_doc, tenant)
    return found if found.policy.quotas else _with_note(found, "no GPU limit (GrpTRES gres/gpu)")
