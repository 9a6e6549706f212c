"""Slurm as a live scheduler source: `slurm:` (local scontrol/squeue/sinfo, `--json`) and
`slurm+http(s)://HOST:6820` / `slurm+unix:///PATH` (slurmrestd), read into the `ClusterModel`.

    load(spec, timeout) -> SlurmView        the model plus what it has no column for
    load_model(spec, timeout) -> ClusterModel   (what `sources.load_source` returns)
    load_quotas(spec, timeout) -> SlurmQuotas   QOS / association GPU limits as a `Policy`

One reader per Slurm command or endpoint, pure parsing apart from the I/O:
`nodes`, `jobs`, `topology`, `reservations`, `quotas` parse; `commands` (subprocess) and `rest`
(HTTP, unix socket) fetch, `read` runs one read; `build` turns a parsed `SlurmState` into the model; `spec` reads the
source spec. Failures are `SlurmUnavailable` (cannot reach or run Slurm) and
`SlurmFormatError` (an answer in a shape this reader does not know), one line each.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from advisor.ingest.slurm.commands import SlurmUnavailable
from advisor.ingest.slurm.spec import SlurmSpecError, is_slurm, parse_spec
from advisor.ingest.slurm.values import SlurmFormatError

if TYPE_CHECKING:  # the readers load numpy and the planner's policy: only when used
    from advisor.ingest.slurm.build import SlurmView
    from advisor.ingest.slurm.quotas import SlurmQuotas
    from advisor.model import ClusterModel

__all__ = [
    "SlurmFormatError",
    "SlurmSpecError",
    "SlurmUnavailable",
    "is_slurm",
    "load",
    "load_model",
    "load_quotas",
    "parse_spec",
]


def load(text: str, timeout: float = 10.0) -> SlurmView:
    """The model of a live Slurm cluster named by a `slurm:` spec, with its extras."""
    from advisor.ingest.slurm.build import build_model
    from advisor.ingest.slurm.read import read_state

    spec = parse_spec(text)
    return build_model(read_state(spec, timeout), spec.options, source=spec.text)


def load_model(text: str, timeout: float = 10.0) -> ClusterModel:
    return load(text, timeout).model


def load_quotas(text: str, timeout: float = 10.0) -> SlurmQuotas:
    """GPU quotas per tenant (the spec's tenant kind) from QOS and association limits; empty,
    with a note, where Slurm keeps no accounting database (no slurmdbd)."""
    from advisor.ingest.slurm import commands, rest
    from advisor.ingest.slurm.quotas import quotas_from_rest, quotas_from_sacctmgr

    spec = parse_spec(text)
    if spec.rest:
        client = rest.Rest(spec.rest, timeout, spec.user, spec.token_file)
        return quotas_from_rest(client, spec.options.tenant, spec.api)
    return quotas_from_sacctmgr(commands.Runner(timeout, spec.conf), spec.options.tenant)
