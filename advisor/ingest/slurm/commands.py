"""The local Slurm commands the `slurm:` source runs, and nothing else: all read-only.

    scontrol --version                       which JSON shapes to expect
    squeue --all --json                      jobs, running and pending
    sinfo --all --json                       nodes (21.08, 22.05)
    scontrol --json show nodes               nodes (23.02 and newer: sinfo --json groups them)
    scontrol show topology                   leaf switches (racks); absent without a topology
    scontrol show reservation --oneliner     reservations (21.08, 22.05)
    scontrol --json show reservations        reservations (23.02 and newer)
    scontrol show config                     ClusterName (quotas only)
    sacctmgr --parsable2 --noheader show qos / associations   quotas (slurmdbd only)

Each failure is a `SlurmUnavailable` with one line: a command that is not installed, a
controller that does not answer, a command that fails, or one that runs past the timeout.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Sequence
from typing import Any

from advisor.ingest.slurm.values import SlurmFormatError

INSTALL_HINT = "Debian: apt-get install slurm-client"
_UNREACHABLE = (
    "Unable to contact slurm controller",
    "Unable to establish controller",
    "Connection refused",
    "Zero Bytes were transmitted",
    "Socket timed out",
)


class SlurmUnavailable(Exception):
    """A Slurm command could not give an answer; the message is one line."""


class Runner:
    """Runs Slurm commands with one deadline for the whole read and an optional slurm.conf."""

    def __init__(self, timeout: float, conf: str = "") -> None:
        self.deadline = time.monotonic() + timeout
        self.timeout = timeout
        self.env = dict(os.environ, SLURM_CONF=conf) if conf else None
        # Slurm's commands wait up to a minute for a slurm.conf that is not there
        named = conf or os.environ.get("SLURM_CONF", "")
        if named and not os.path.isfile(named):
            where = "conf=" if conf else "SLURM_CONF="
            raise SlurmUnavailable(f"{where}{named}: no slurm.conf there (no such file)")

    def text(self, args: Sequence[str], *, check: bool = True) -> tuple[int, str, str]:
        """(exit status, stdout, stderr) of `args`; SlurmUnavailable when it cannot run, runs
        past the read's deadline, or (with `check`) fails."""
        left = self.deadline - time.monotonic()
        command = " ".join(args)
        if left <= 0:
            raise SlurmUnavailable(f"{command}: no time left of the {self.timeout:g} s timeout")
        try:
            done = subprocess.run(
                list(args), capture_output=True, text=True, timeout=left, env=self.env, check=False
            )
        except FileNotFoundError:
            raise SlurmUnavailable(
                f"{args[0]} is not installed or not on PATH ({INSTALL_HINT}); the slurm: source "
                "reads the cluster with scontrol, squeue and sinfo"
            ) from None
        except subprocess.TimeoutExpired:
            raise SlurmUnavailable(
                f"{command} did not answer within the {self.timeout:g} s timeout"
            ) from None
        except OSError as error:
            raise SlurmUnavailable(f"{command}: cannot run: {error.strerror or error}") from None
        if check and done.returncode != 0:
            raise SlurmUnavailable(failure(command, done.returncode, done.stderr or done.stdout))
        return done.returncode, done.stdout, done.stderr

    def json(self, args: Sequence[str]) -> Any:
        """The JSON `args` print. 22.05's --json exits 0 with an "Unspecified error" when the
        controller is down, so an answer carrying errors is checked with `scontrol ping`."""
        _, out, _ = self.text(args)
        try:
            doc = json.loads(out)
        except json.JSONDecodeError as error:
            raise SlurmFormatError(
                f"{' '.join(args)} printed no JSON ({error.msg} at line {error.lineno}): "
                f"{out.strip()[:80]!r}"
            ) from None
        if isinstance(doc, dict) and doc.get("errors"):
            self.controller_up(" ".join(args))
        return doc

    def controller_up(self, command: str) -> None:
        """SlurmUnavailable when `scontrol ping` says the controller is down."""
        _, out, err = self.text(["scontrol", "ping"], check=False)
        lines = [line.strip() for line in (out + err).splitlines() if line.strip()]
        down = [line for line in lines if line.endswith("is DOWN")]
        if down and not any(line.endswith("is UP") for line in lines):
            raise SlurmUnavailable(
                f"{command}: the Slurm controller does not answer (scontrol ping: {down[0]}); "
                "is slurmctld running and SlurmctldHost in slurm.conf right?"
            )


def failure(command: str, status: int, output: str) -> str:
    """One line for a failed command: the controller unreachable, or its own last error line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    if any(marker in output for marker in _UNREACHABLE):
        return (
            f"{command}: the Slurm controller does not answer ({lines[-1] if lines else status}); "
            "is slurmctld running and SlurmctldHost in slurm.conf right?"
        )
    if "Could not establish a configuration source" in output:
        return (
            f"{command}: no slurm.conf found: run on a host of the cluster, or set SLURM_CONF "
            "(or the spec's conf=FILE)"
        )
    if "unrecognized option" in output and "--json" in command:
        return f"{command}: this Slurm's command has no --json (needs 21.08, or 23.02 for scontrol)"
    detail = lines[-1] if lines else "no output"
    return f"{command} failed (exit {status}): {detail}"
