"""The `slurm:` source specs, taken apart (options are documented in docs/slurm.md).

    slurm:[?OPTIONS]                         scontrol/squeue/sinfo of this host, --json
    slurm+http(s)://HOST:6820[?OPTIONS]      slurmrestd, token from $SLURM_JWT or token-file=
    slurm+unix:///PATH/slurmrestd.sock[?...] slurmrestd on a local socket (rest_auth/local)

Options of every form: partition=NAME[,NAME] (only those partitions' nodes and jobs; the pool
is the partition), tenant=account|user|qos (default account), max-priority=N (running jobs
above N are not migratable; default: no cap), topology=FILE (a topology.conf to read racks from
instead of asking the controller; slurmrestd serves no topology). `slurm:` also takes conf=FILE
(the slurm.conf its commands read, as SLURM_CONF). slurmrestd forms also take user=NAME (the
X-SLURM-USER-NAME header; default $SLURM_USER, else this process's user), token-file=FILE (the
JWT, instead of $SLURM_JWT) and api=v0.0.NN (the OpenAPI version; default: the newest the
server and this reader share).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

TENANT_KINDS = ("account", "user", "qos")


@dataclass(frozen=True)
class SlurmOptions:
    """What a `slurm:` spec's options choose (advisor.ingest.slurm.spec)."""

    partitions: tuple[str, ...] = ()  # only nodes and jobs of these partitions ((): all)
    tenant: str = "account"  # account | user | qos
    max_priority: int | None = None  # running jobs above it are not migratable (None: no cap)


COMMON = {"partition", "tenant", "max-priority", "topology"}
LOCAL_ONLY = {"conf"}
REST_ONLY = {"user", "token-file", "api"}
PREFIXES = ("slurm:", "slurm+http://", "slurm+https://", "slurm+unix://")


class SlurmSpecError(ValueError):
    """A malformed `slurm:` spec; one line naming the spec."""


@dataclass(frozen=True)
class SlurmSpec:
    text: str
    rest: str  # "" for the local commands; http(s)://HOST:PORT or unix:///PATH for slurmrestd
    options: SlurmOptions
    conf: str = ""
    topology_file: str = ""
    user: str = ""
    token_file: str = ""
    api: str = ""


def is_slurm(spec: str) -> bool:
    return spec.startswith(PREFIXES)


def parse_spec(text: str) -> SlurmSpec:
    """SlurmSpecError for an unknown option (by name) or a malformed value."""
    text = text.strip()
    if text.startswith("slurm:"):
        head, _, query = text.removeprefix("slurm:").partition("?")
        if head:
            raise SlurmSpecError(
                f"{text}: slurm: takes no name after the colon (options go after '?', e.g. "
                "slurm:?partition=gpu)"
            )
        rest, allowed = "", COMMON | LOCAL_ONLY
    else:
        url = text.removeprefix("slurm+")
        parts = urlsplit(url)
        query = parts.query
        if parts.scheme == "unix":
            if not parts.path:
                raise SlurmSpecError(f"{text}: expected slurm+unix:///PATH/TO/slurmrestd.sock")
            rest = f"unix://{parts.path}"
        else:
            if not parts.hostname:
                raise SlurmSpecError(f"{text}: expected slurm+http://HOST:PORT")
            rest = parts._replace(query="", fragment="").geturl().rstrip("/")
        allowed = COMMON | REST_ONLY
    params = {key: values[-1] for key, values in parse_qs(query, keep_blank_values=True).items()}
    unknown = sorted(set(params) - allowed)
    if unknown:
        elsewhere = (LOCAL_ONLY | REST_ONLY) - allowed
        why = "is not read by this form" if unknown[0] in elsewhere else "is unknown"
        raise SlurmSpecError(
            f"{text}: option {unknown[0]!r} {why} (known: {', '.join(sorted(allowed))})"
        )
    tenant = params.get("tenant", "account") or "account"
    if tenant not in TENANT_KINDS:
        raise SlurmSpecError(
            f"{text}: tenant={tenant!r}: expected one of {', '.join(TENANT_KINDS)}"
        )
    max_priority = None
    if params.get("max-priority", ""):
        try:
            max_priority = int(params["max-priority"])
        except ValueError:
            raise SlurmSpecError(
                f"{text}: max-priority={params['max-priority']!r}: expected a whole number"
            ) from None
    partitions = tuple(p for p in params.get("partition", "").split(",") if p)
    api = params.get("api", "")
    if api and not (api.startswith("v0.0.") and api[5:].isdigit()):
        raise SlurmSpecError(f"{text}: api={api!r}: expected an OpenAPI version such as v0.0.38")
    return SlurmSpec(
        text=text,
        rest=rest,
        options=SlurmOptions(partitions=partitions, tenant=tenant, max_priority=max_priority),
        conf=params.get("conf", ""),
        topology_file=params.get("topology", ""),
        user=params.get("user", ""),
        token_file=params.get("token-file", ""),
        api=api,
    )
