"""A real Slurm cluster on 127.0.0.1 for the tests: one slurmctld and one slurmd per node, all
Debian's `slurm-wlm` binaries run as this test's own processes from a generated slurm.conf.

Layout: `NODES` nodes `a100-node-01..16` with 8 fake A100 GPUs each (gres.conf `File=`
entries: character devices made with mknod when root, so Slurm tracks per-GPU indices), two
leaf switches of 8 nodes (`rack-01`, `rack-02`) in topology.conf, partitions `a100` (all
nodes, the default) and `borrow` (nodes 01-13). `AuthType=auth/none`, `NoInAddrAny`,
`SlurmdParameters=config_overrides` (the configured CPUs and memory, whatever this machine
has), one slurmd per NodeName via `slurmd -N` on its own port.

`start` polls until every node is idle (it never sleeps a fixed time); `stop` cancels every
job, waits for them to end, terminates the daemons by PID and then kills whatever is left in
their sessions (the slurmstepd and job processes the slurmds forked), so no process outlives
the test session.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tests.ports import free_ports

NODES = 16
GPUS = 8
RACK_SIZE = 8
BORROW_NODES = 13
BINARIES = ("slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scontrol", "scancel")
PACKAGE = "slurm-wlm"


def node_name(n: int) -> str:
    return f"a100-node-{n:02d}"


def missing_binaries() -> list[str]:
    return [name for name in BINARIES if shutil.which(name) is None]


class SlurmError(AssertionError):
    """The test cluster did not do what it was asked."""


class SlurmCluster:
    def __init__(self, workdir: Path) -> None:
        self.dir = workdir
        self.conf = workdir / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self.daemons: list[tuple[str, subprocess.Popen]] = []
        self.user = pwd.getpwuid(os.getuid()).pw_name

    # ------------------------------------------------------------------ configuration
    def _devices(self) -> str:
        """Eight GPU device files: char devices (1:3, /dev/null's numbers) where this user may
        make them (root), else plain files."""
        dev = self.dir / "dev"
        dev.mkdir(exist_ok=True)
        for i in range(GPUS):
            path = dev / f"nvidia{i}"
            if path.exists():
                continue
            try:  # slurmd logs an error for a plain file, and uses it all the same
                os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
            except PermissionError:
                path.touch()
        return f"{dev}/nvidia[0-{GPUS - 1}]"

    def write_config(self) -> None:
        ports = free_ports(NODES + 1)
        self.ctld_port = ports[0]
        for sub in ("state", "log"):
            (self.dir / sub).mkdir(exist_ok=True)
        for n in range(1, NODES + 1):
            (self.dir / "spool" / node_name(n)).mkdir(parents=True, exist_ok=True)
        lines = [
            "ClusterName=gdtest",
            "SlurmctldHost=localhost",
            f"SlurmctldPort={self.ctld_port}",
            "AuthType=auth/none",
            "CredType=cred/none",
            "CommunicationParameters=NoInAddrAny",
            f"SlurmUser={self.user}",
            f"SlurmdUser={self.user}",
            f"StateSaveLocation={self.dir}/state",
            f"SlurmdSpoolDir={self.dir}/spool/%n",
            f"SlurmctldPidFile={self.dir}/slurmctld.pid",
            f"SlurmdPidFile={self.dir}/slurmd-%n.pid",
            f"SlurmctldLogFile={self.dir}/log/slurmctld.log",
            f"SlurmdLogFile={self.dir}/log/slurmd-%n.log",
            "SlurmdParameters=config_overrides",
            "ProctrackType=proctrack/linuxproc",
            "SchedulerParameters=batch_sched_delay=0",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/backfill",
            "PriorityType=priority/basic",
            "TopologyPlugin=topology/tree",
            "GresTypes=gpu",
            "ReturnToService=2",
            "MinJobAge=2",
            "KillWait=1",
            "MailProg=/bin/true",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=60",
        ]
        for n, port in enumerate(ports[1:], start=1):
            lines.append(
                f"NodeName={node_name(n)} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} "
                f"CPUs=32 RealMemory=256000 Gres=gpu:a100:{GPUS} State=UNKNOWN"
            )
        everything = f"a100-node-[01-{NODES:02d}]"
        lines += [
            f"PartitionName=a100 Nodes={everything} Default=YES MaxTime=INFINITE State=UP",
            f"PartitionName=borrow Nodes=a100-node-[01-{BORROW_NODES:02d}] MaxTime=INFINITE "
            "State=UP",
        ]
        self.conf.write_text("\n".join(lines) + "\n")
        devices = self._devices()
        (self.dir / "gres.conf").write_text(
            f"NodeName={everything} Name=gpu Type=a100 File={devices}\n"
        )
        racks = [
            f"SwitchName=rack-{r + 1:02d} Nodes=a100-node-[{r * RACK_SIZE + 1:02d}-"
            f"{(r + 1) * RACK_SIZE:02d}]"
            for r in range(NODES // RACK_SIZE)
        ]
        racks.append(f"SwitchName=spine Switches=rack-[01-{NODES // RACK_SIZE:02d}]")
        (self.dir / "topology.conf").write_text("\n".join(racks) + "\n")

    # ------------------------------------------------------------------ processes
    def _daemon(self, name: str, args: list[str]) -> None:
        log = (self.dir / "log" / f"{name}.out").open("wb")
        process = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )
        log.close()
        self.daemons.append((name, process))

    def run(self, *args: str, check: bool = True, timeout: float = 30) -> str:
        done = subprocess.run(
            list(args), capture_output=True, text=True, env=self.env, timeout=timeout
        )
        if check and done.returncode != 0:
            raise SlurmError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
        return done.stdout

    def poll(self, check: Callable[[], Any], timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            result = check()
            if result:
                return result
            time.sleep(0.1)
        raise SlurmError(f"timed out after {timeout:g} s waiting for {what}\n{self.logs()}")

    def check_alive(self) -> None:
        for name, process in self.daemons:
            if process.poll() is not None:
                raise SlurmError(f"{name} exited with {process.returncode}\n{self.logs()}")

    def logs(self) -> str:
        out = []
        for path in sorted((self.dir / "log").glob("*")):
            if path.stat().st_size:
                out.append(f"--- {path.name} ---\n{path.read_text(errors='replace')[-1500:]}")
        return "\n".join(out[-6:])

    def start(self) -> None:
        self.write_config()
        self._daemon("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self.poll(
            lambda: self.run("scontrol", "ping", check=False).find("is UP") >= 0,
            20,
            "slurmctld to answer",
        )
        for n in range(1, NODES + 1):
            name = node_name(n)
            self._daemon(f"slurmd-{name}", ["slurmd", "-D", "-N", name, "-f", str(self.conf)])
        self.poll(lambda: self.idle_nodes() == NODES, 30, f"{NODES} idle nodes")

    def idle_nodes(self) -> int:
        doc = json.loads(self.run("sinfo", "--json"))
        return sum(
            1 for node in doc["nodes"] if node["state"] == "idle" and not node["state_flags"]
        )

    # ------------------------------------------------------------------ jobs
    def sbatch(self, *args: str) -> str:
        """Submit `sleep 600` with sbatch `args`; the job id."""
        out = self.run(
            "sbatch",
            "--parsable",
            "-o",
            "/dev/null",
            "-e",
            "/dev/null",
            *args,
            "--wrap",
            "sleep 600",
        )
        return out.strip().split(";")[0]

    def jobs(self) -> dict[str, dict[str, Any]]:
        doc = json.loads(self.run("squeue", "--json"))
        return {str(job["job_id"]): job for job in doc["jobs"]}

    def wait_running(self, ids: Sequence[str], timeout: float = 20) -> None:
        def started() -> bool:
            jobs = self.jobs()
            return all(jobs.get(i, {}).get("job_state") == "RUNNING" for i in ids)

        self.poll(started, timeout, f"jobs {', '.join(ids)} to run")

    def wait_pending(self, job_id: str, timeout: float = 20) -> str:
        """Waits until the scheduler has given pending `job_id` a reason; the reason."""

        def reason() -> str:
            job = self.jobs().get(job_id, {})
            if job.get("job_state") != "PENDING":
                raise SlurmError(f"job {job_id} is {job.get('job_state')}, not pending")
            return "" if job.get("state_reason") in (None, "None") else job["state_reason"]

        return self.poll(reason, timeout, f"job {job_id}'s pending reason")

    def cancel(self, *ids: str) -> None:
        self.run("scancel", *ids)
        self.poll(lambda: not (set(ids) & self._live()), 20, f"jobs {', '.join(ids)} to end")

    def _live(self) -> set[str]:
        ended = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED"}
        return {i for i, job in self.jobs().items() if job["job_state"] not in ended}

    def reset(self) -> None:
        """No job left, every node idle and resumed, no reservation."""
        live = sorted(self._live())
        if live:
            self.cancel(*live)
        for line in self.run("scontrol", "show", "reservation", "--oneliner").splitlines():
            if line.startswith("ReservationName="):
                name = line.split()[0].split("=", 1)[1]
                self.run("scontrol", "delete", f"reservation={name}")
        for n in range(1, NODES + 1):
            self.run("scontrol", "update", f"nodename={node_name(n)}", "state=resume", check=False)
        self.poll(lambda: self.idle_nodes() == NODES, 30, "every node idle again")

    # ------------------------------------------------------------------ slurmrestd
    def start_slurmrestd(self) -> str:
        """slurmrestd (openapi/v0.0.38 only: the dbv0.0.38 plugin needs slurmdbd) on a unix
        socket with rest_auth/local; its socket path. slurmrestd refuses to run as root, so
        as root it runs as `nobody`."""
        path = self.dir / "rest" / "slurmrestd.sock"
        if any(name == "slurmrestd" and p.poll() is None for name, p in self.daemons):
            return str(path)
        if shutil.which("slurmrestd") is None:
            raise SlurmError("slurmrestd is not installed: apt-get install slurmrestd")
        path.parent.mkdir(exist_ok=True)
        path.parent.chmod(0o777)
        args = ["slurmrestd", "-s", "openapi/v0.0.38", "-a", "rest_auth/local", f"unix:{path}"]
        if os.getuid() == 0:
            args = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *args]
        self._daemon("slurmrestd", args)
        self.poll(path.exists, 20, "slurmrestd's socket")
        return str(path)

    # ------------------------------------------------------------------ stop
    def stop(self) -> None:
        with contextlib.suppress(Exception):
            live = sorted(self._live())
            if live:
                self.run("scancel", *live, check=False)
                deadline = time.monotonic() + 10
                while self._live() and time.monotonic() < deadline:
                    time.sleep(0.1)
        sessions = {process.pid for _, process in self.daemons}
        for _, process in reversed(self.daemons):
            if process.poll() is None:
                process.terminate()
        for _, process in reversed(self.daemons):
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
        for pid in session_members(sessions):  # slurmstepd and job processes left behind
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def leftovers(self) -> list[int]:
        return session_members({process.pid for _, process in self.daemons})


def session_members(sessions: set[int]) -> list[int]:
    """PIDs of live (not zombie) processes whose session is one of `sessions`."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        state, sid = fields[0], int(fields[3])
        if sid in sessions and state != "Z":
            out.append(int(entry.name))
    return out
