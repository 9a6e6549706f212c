"""One read of a Slurm controller: through this host's commands (`commands`) or slurmrestd
(`rest`), parsed into a `SlurmState` (the I/O of the `slurm:` sources; parsing is elsewhere)."""

from __future__ import annotations

import time
from pathlib import Path

from advisor.ingest.slurm import commands, rest
from advisor.ingest.slurm.build import SlurmState
from advisor.ingest.slurm.commands import SlurmUnavailable
from advisor.ingest.slurm.jobs import parse_jobs
from advisor.ingest.slurm.nodes import SlurmNode, parse_nodes
from advisor.ingest.slurm.reservations import parse_reservation_text, parse_reservations
from advisor.ingest.slurm.spec import SlurmSpec
from advisor.ingest.slurm.topology import racks
from advisor.ingest.slurm.values import SCONTROL_JSON, parse_release, version_supported
from advisor.ingest.slurm.values import version as doc_version


def _topology_file(path: str) -> dict[str, str]:
    try:
        return racks(Path(path).read_text())
    except OSError as error:
        raise SlurmUnavailable(f"topology={path}: cannot read: {error.strerror or error}") from None


def _largest(nodes: list[SlurmNode]) -> int:
    return max((node.gpu_count for node in nodes), default=0)


def read_local(spec: SlurmSpec, timeout: float) -> SlurmState:
    """One read through this host's Slurm commands (commands module docstring)."""
    run = commands.Runner(timeout, spec.conf)
    _, out, _ = run.text(["scontrol", "--version"])
    version = parse_release(out)
    version_supported(version, "scontrol --version")
    modern = version is not None and version >= SCONTROL_JSON
    if modern:
        node_doc = run.json(["scontrol", "--json", "show", "nodes"])
    else:
        node_doc = run.json(["sinfo", "--all", "--json"])
    nodes = parse_nodes(node_doc, "sinfo --json" if not modern else "scontrol --json show nodes")
    job_doc = run.json(["squeue", "--all", "--json"])
    read_at = time.time()
    jobs = parse_jobs(job_doc, _largest(nodes), "squeue --json")
    if spec.topology_file:
        topology = _topology_file(spec.topology_file)
    else:
        status, out, _ = run.text(["scontrol", "show", "topology"], check=False)
        topology = racks(out) if status == 0 else {}
    if modern:
        reservations = parse_reservations(
            run.json(["scontrol", "--json", "show", "reservations"]),
            "scontrol --json show reservations",
        )
    else:
        _, out, _ = run.text(["scontrol", "show", "reservation", "--oneliner"])
        reservations = parse_reservation_text(out)
    return SlurmState(nodes, jobs, topology, reservations, read_at, version)


def read_rest(spec: SlurmSpec, timeout: float) -> SlurmState:
    """One read through slurmrestd (rest module docstring)."""
    client = rest.Rest(spec.rest, timeout, spec.user, spec.token_file)
    api = client.api_version(spec.api)
    where = f"slurmrestd {spec.rest}/slurm/{api}"
    node_doc = client.get(f"/slurm/{api}/nodes")
    nodes = parse_nodes(node_doc, f"{where}/nodes")
    job_doc = client.get(f"/slurm/{api}/jobs")
    read_at = time.time()
    jobs = parse_jobs(job_doc, _largest(nodes), f"{where}/jobs")
    reservations = parse_reservations(
        client.get(f"/slurm/{api}/reservations"), f"{where}/reservations"
    )
    topology = _topology_file(spec.topology_file) if spec.topology_file else {}
    return SlurmState(nodes, jobs, topology, reservations, read_at, doc_version(job_doc))


def read_state(spec: SlurmSpec, timeout: float) -> SlurmState:
    return read_rest(spec, timeout) if spec.rest else read_local(spec, timeout)
