"""The Slurm source against a real slurmctld + 16 slurmd on 127.0.0.1 (tests/slurm/cluster.py):
jobs that run and jobs that wait read back, the seed cases planned from live Slurm with the
same answer as their snapshots, `gpu-defrag analyze/plan slurm:` end to end, and the errors."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from advisor import snapshot
from advisor.cli import main
from advisor.ingest import slurm as slurm_source
from advisor.ingest.sources import SourceError, load_source
from tests.ports import free_ports
from tests.slurm.cluster import SlurmCluster
from tests.slurm.relay import jwt_front
from tests.slurm.seeds import submit_placed

ROOT = Path(__file__).resolve().parents[2]
SEED_16X8 = ROOT / "examples" / "seed-16x8-a100.json"
SEED_BORROW = ROOT / "examples" / "seed-quota-borrow.json"
POLICY_BORROW = ROOT / "examples" / "policy-borrow.yaml"

pytestmark = pytest.mark.integration


def spec(cluster: SlurmCluster, options: str = "") -> str:
    return f"slurm:?conf={cluster.conf}" + (f"&{options}" if options else "")


def cli(cluster: SlurmCluster, *args: str) -> subprocess.CompletedProcess:
    """`gpu-defrag ARGS` as a user runs it next to the controller (SLURM_CONF set)."""
    return subprocess.run(
        [sys.executable, "-m", "advisor.cli", *args],
        env=dict(cluster.env, PYTHONPATH=str(ROOT)),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def in_process(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(list(args))
    return code, out.getvalue()


def test_jobs_that_run_and_wait_are_read_back(slurm: SlurmCluster) -> None:
    two = slurm.sbatch("--gres=gpu:2", "-A", "rnd")
    gang = slurm.sbatch(
        "-N", "2", "--gres=gpu:3", "-A", "algo", "--comment", "gpu-defrag.io/restart-cost=15m"
    )
    slurm.wait_running([two, gang])
    waiting = slurm.sbatch("-N", "16", "--gres=gpu:8", "-A", "rnd")  # more GPUs than are free
    assert slurm.wait_pending(waiting) == "Resources"
    view = slurm_source.load(spec(slurm))
    model = view.model
    allocs = model.allocations
    ids = allocs.id.tolist()
    assert two in ids and allocs.num_gpu[ids.index(two)] == 2
    tasks = [i for i in ids if i.startswith(f"{gang}/")]
    assert len(tasks) == 2 and {allocs.job[ids.index(t)] for t in tasks} == {gang}
    assert all(allocs.num_gpu[ids.index(t)] == 3 for t in tasks)
    assert allocs.restart_cost_s[ids.index(tasks[0])] == 900
    queued = [i for i in ids if i.startswith(f"{waiting}#")]
    assert len(queued) == 16 and all(allocs.node[ids.index(q)] == -1 for q in queued)
    assert view.pending_reasons == {waiting: "Resources"}
    assert model.gpu_milli_allocated.sum() == (2 + 3 + 3) * 1000
    assert set(model.nodes.rack) == {"rack-01", "rack-02"}
    assert view.notes == ()


def test_drained_and_reserved_nodes_are_not_free(slurm: SlurmCluster) -> None:
    slurm.run("scontrol", "update", "nodename=a100-node-03", "state=drain", "reason=xid 79")
    slurm.run(
        "scontrol",
        "create",
        "reservation",
        "reservationname=hold",
        "nodes=a100-node-04",
        "starttime=now",
        "duration=60",
        f"users={slurm.user}",
    )
    slurm.run(
        "scontrol",
        "create",
        "reservation",
        "reservationname=later",
        "nodes=a100-node-05",
        "starttime=now+3600",
        "duration=60",
        f"users={slurm.user}",
    )
    view = slurm_source.load(spec(slurm))
    assert view.unschedulable == {
        "a100-node-03": "idle+drain: xid 79",
        "a100-node-04": "reservation hold",
    }
    free = dict(zip(view.model.nodes.name, view.model.nodes.schedulable.tolist(), strict=True))
    assert free["a100-node-05"] and not free["a100-node-03"] and not free["a100-node-04"]
    assert int(view.model.gpu_is_free.sum()) == 14 * 8


def test_seed_16x8_from_live_slurm_gives_the_snapshots_plan(slurm: SlurmCluster) -> None:
    """16 x 8 A100 in two racks with the snapshot's jobs and a pending 8 x 8 gang: `gpu-defrag
    plan slurm: --goal job=8x8` frees 8 whole nodes of one rack with the same 6 migrations
    (proved minimal by the exact solver) and never moves the job that cannot be requeued."""
    seed = snapshot.load(SEED_16X8)
    names = {job: name for name, job in submit_placed(slurm, seed).items()}
    goal = slurm.sbatch("-N", "8", "--gres=gpu:8", "-A", "rnd", "-J", "goal-8x8")
    assert slurm.wait_pending(goal) == "Resources"

    done = cli(slurm, "plan", "slurm:", "--goal", "job=8x8", "--json")
    assert done.returncode == 0, done.stderr
    live = json.loads(done.stdout)
    code, out = in_process("plan", str(SEED_16X8), "--goal", "job=8x8", "--json")
    assert code == 0
    reference = json.loads(out)

    def moves(plan: dict, rename: dict[str, str]) -> list[tuple]:
        return [
            (
                rename.get(a["alloc"], a["alloc"]),
                a["from"]["node"],
                a["from"]["gpus"],
                a["to"]["node"],
                a["to"]["gpus"],
            )
            for a in plan["actions"]
            if a["kind"] == "migrate"
        ]

    assert live["feasible"] and reference["feasible"]
    assert moves(live, names) == moves(reference, {})
    assert len(moves(live, names)) == 6
    assert (
        live["cost"]["restarts"] == 6
        and live["cost"]["restart_s"] == reference["cost"]["restart_s"]
    )
    assert live["comparison"]["exact_status"] == "optimal"
    assert live["comparison"]["exact_cost"] == pytest.approx(reference["comparison"]["exact_cost"])
    held = {a["to"]["node"] for a in live["actions"] if a["kind"] == "reserve"}
    assert held == {a["to"]["node"] for a in reference["actions"] if a["kind"] == "reserve"}
    racks = dict(zip(*_node_racks(slurm), strict=True))
    assert len(held) == 8 and len({racks[n] for n in held}) == 1
    # --no-requeue in Slurm, not migratable in the seed
    pinned = names_of(names, "a100-node-02-job2")
    assert pinned not in {a["alloc"] for a in live["actions"]}

    # only work of priority <= 50 may move: the snapshot and live Slurm both cannot reach it
    for source in (str(SEED_16X8), "slurm:"):
        assert _plan_code(slurm, source, "--priority", "50") == 1
    # the same limit set on the source (max-priority): no job above 50 is migratable
    model = slurm_source.load(spec(slurm, "max-priority=50")).model
    allocs = model.allocations
    placed = allocs.node >= 0
    assert not (allocs.migratable & placed & (allocs.priority > 50)).any()
    low = (seed.allocations.priority <= 50) & seed.allocations.migratable
    assert (allocs.migratable & placed).sum() == low.sum() == 16


def _plan_code(cluster: SlurmCluster, source: str, *flags: str) -> int:
    env = {"SLURM_CONF": str(cluster.conf)}
    old = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        code, _ = in_process("plan", source, "--goal", "job=8x8", "--solver", "heuristic", *flags)
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return code


def names_of(names: dict[str, str], wanted: str) -> str:
    return next(job for job, name in names.items() if name == wanted)


def _node_racks(cluster: SlurmCluster) -> tuple[list[str], list[str]]:
    model = slurm_source.load(spec(cluster)).model
    return model.nodes.name.tolist(), model.nodes.rack.tolist()


def test_borrow_case_from_live_slurm(slurm: SlurmCluster) -> None:
    """The tenant-borrowing seed on partition `borrow` (13 nodes): rnd's pending 4 x 8 job
    borrows 10 GPUs of algorithms, 5 of product and 12 no quota covers (quotas from --policy:
    this cluster has no slurmdbd, so Slurm itself holds no QOS limit), as in the snapshot."""
    seed = snapshot.load(SEED_BORROW)
    submit_placed(slurm, seed)
    # a higher-priority gang on the whole cluster keeps rnd-pretrain waiting on free nodes: it
    # starts when the seed's jobs reach their time limit, and rnd-pretrain (no time limit)
    # would delay it, so the backfill scheduler never starts rnd-pretrain
    blocker = slurm.sbatch(
        "-p", "a100", "-N", "16", "--gres=gpu:8", "--priority=1000000", "-t", "60"
    )
    job = slurm.sbatch("-p", "borrow", "-N", "4", "--gres=gpu:8", "-A", "rnd", "--priority=80")
    slurm.wait_pending(blocker)
    slurm.wait_pending(job)
    done = cli(
        slurm,
        "plan",
        "slurm:?partition=borrow",
        "--goal",
        f"borrow={job}",
        "--policy",
        str(POLICY_BORROW),
        "--json",
    )
    assert done.returncode == 0, done.stderr
    live = json.loads(done.stdout)
    code, out = in_process(
        "plan",
        str(SEED_BORROW),
        "--goal",
        "borrow=rnd-pretrain",
        "--policy",
        str(POLICY_BORROW),
        "--json",
    )
    reference = json.loads(out)

    def loans(plan: dict) -> list[tuple]:
        return [(a["from"], a["to"]) for a in plan["actions"] if a["kind"] == "borrow"]

    def starts(plan: dict) -> list[str]:
        return [a["to"]["node"] for a in plan["actions"] if a["kind"] == "reserve"]

    assert code == 0 and live["feasible"] and reference["feasible"]
    assert loans(live) == loans(reference) and len(loans(live)) == 3
    assert starts(live) == starts(reference) == [f"a100-node-{n}" for n in (10, 11, 12, 13)]


def test_analyze_slurm_end_to_end(slurm: SlurmCluster) -> None:
    slurm.wait_running([slurm.sbatch("--gres=gpu:2"), slurm.sbatch("-N", "2", "--gres=gpu:8")])
    waiting = slurm.sbatch("-N", "15", "--gres=gpu:8")
    slurm.wait_pending(waiting)
    done = cli(slurm, "analyze", "slurm:", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["source"] == "slurm:"
    cluster = doc["cluster"]
    assert cluster["nodes"] == 16 and cluster["gpus"] == 128 and cluster["allocated_gpus"] == 18
    assert cluster["placed_allocations"] == 3 and cluster["pending_tasks"] == 15


def test_slurmrestd_on_a_socket_reads_the_same_cluster(
    slurm: SlurmCluster, slurmrestd: str
) -> None:
    slurm.wait_running([slurm.sbatch("-N", "2", "--gres=gpu:4", "-A", "rnd")])
    waiting = slurm.sbatch("-N", "16", "--gres=gpu:8")
    slurm.wait_pending(waiting)
    topology = slurm.dir / "topology.conf"
    rest = slurm_source.load(f"slurm+unix://{slurmrestd}?topology={topology}")
    local = slurm_source.load(spec(slurm))
    for column in ("id", "job", "node", "num_gpu", "tenant", "priority", "migratable"):
        assert (
            getattr(rest.model.allocations, column).tolist()
            == getattr(local.model.allocations, column).tolist()
        )
    assert rest.model.nodes.rack.tolist() == local.model.nodes.rack.tolist()
    assert rest.pending_reasons == local.pending_reasons == {waiting: "Resources"}


def test_slurmrestd_over_http_sends_the_token(
    slurm: SlurmCluster, slurmrestd: str, monkeypatch, tmp_path
) -> None:
    job = slurm.sbatch("--gres=gpu:2", "-A", "rnd")
    slurm.wait_running([job])
    with jwt_front(slurmrestd, "ada", "tok-123") as (base, seen):
        monkeypatch.setenv("SLURM_JWT", "tok-123")
        view = slurm_source.load(f"slurm+{base}?user=ada")
        assert job in view.model.allocations.id.tolist()
        assert seen and all(h["x-slurm-user-token"] == "tok-123" for h in seen)
        monkeypatch.delenv("SLURM_JWT")
        token = tmp_path / "jwt"
        token.write_text("SLURM_JWT=tok-123\n")  # what `scontrol token` prints
        assert (
            job
            in slurm_source.load(f"slurm+{base}?user=ada&token-file={token}").model.allocations.id
        )
        with pytest.raises(SourceError) as error:  # as every command sees it
            load_source(f"slurm+{base}?user=ada")
    message = str(error.value)
    assert "refused (401 Authentication failure): set SLURM_JWT" in message and "\n" not in message


def test_controller_down_and_no_config_are_one_line(slurm_cluster: SlurmCluster, tmp_path) -> None:
    (port,) = free_ports(1)  # nothing listens there
    dead = tmp_path / "slurm.conf"
    text = slurm_cluster.conf.read_text().replace(
        f"SlurmctldPort={slurm_cluster.ctld_port}", f"SlurmctldPort={port}"
    )
    dead.write_text(text + "MessageTimeout=2\n")
    with pytest.raises(SourceError) as error:
        load_source(f"slurm:?conf={dead}")
    assert "the Slurm controller does not answer" in str(error.value)
    with pytest.raises(SourceError) as error:
        load_source(f"slurm:?conf={tmp_path / 'missing.conf'}")
    assert "missing.conf: no slurm.conf there" in str(error.value)
    done = cli(slurm_cluster, "analyze", f"slurm:?conf={dead}")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "does not answer" in done.stderr


def test_quotas_are_absent_without_slurmdbd(slurm_cluster: SlurmCluster) -> None:
    quotas = slurm_source.load_quotas(spec(slurm_cluster))
    assert quotas.policy.quotas == {}
    assert quotas.notes == (
        "Slurm keeps no accounting database (no slurmdbd): no QOS or association GPU quotas",
    )
