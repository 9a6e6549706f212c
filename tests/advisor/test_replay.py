"""Replay protocol, migrations and the CLI; hypothesis checks that no placement oversubscribes."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from advisor.cli import main
from advisor.fragmentation.fgd import learn_workload
from advisor.ingest.openb import NodeTable, PodTable
from advisor.placement import ALL_POLICIES, make_policy
from advisor.placement.state import MILLI, PodSpec
from advisor.replay.migration import Migrator
from advisor.replay.protocol import Curve, Replay, arrival_order, run_replay

MODELS = ["T4", "V100M16", "G2"]


def node_table(rows: list[tuple[int, int, int, str]]) -> NodeTable:
    return NodeTable(
        name=np.array([f"n{i}" for i in range(len(rows))], dtype=object),
        cpu_milli=np.array([r[0] for r in rows], dtype=np.int64),
        memory_mib=np.array([r[1] for r in rows], dtype=np.int64),
        gpu=np.array([r[2] for r in rows], dtype=np.int64),
        model=np.array([r[3] for r in rows], dtype=object),
    )


def pod_table(rows: list[tuple[int, int, int, int, str]]) -> PodTable:
    n = len(rows)
    return PodTable(
        name=np.array([f"p{i}" for i in range(n)], dtype=object),
        cpu_milli=np.array([r[0] for r in rows], dtype=np.int64),
        memory_mib=np.array([r[1] for r in rows], dtype=np.int64),
        num_gpu=np.array([r[2] for r in rows], dtype=np.int64),
        gpu_milli=np.array([r[3] for r in rows], dtype=np.int64),
        gpu_spec=np.array([r[4] for r in rows], dtype=object),
        qos=np.full(n, "", dtype=object),
        pod_phase=np.full(n, "", dtype=object),
        creation_time=np.full(n, np.nan),
        deletion_time=np.full(n, np.nan),
        scheduled_time=np.full(n, np.nan),
    )


node_rows = st.lists(
    st.tuples(
        st.integers(1000, 16000),
        st.integers(1000, 64000),
        st.integers(0, 4),
        st.sampled_from(MODELS),
    ),
    min_size=1,
    max_size=5,
).map(lambda rows: [(c, m, g, mod if g else "") for c, m, g, mod in rows])


@st.composite
def pod_row(draw: st.DrawFn) -> tuple[int, int, int, int, str]:
    k = draw(st.sampled_from([0, 1, 1, 1, 2, 4]))
    d = 0 if k == 0 else (MILLI if k > 1 else draw(st.sampled_from([100, 250, 500, 810, 1000])))
    spec = draw(st.sampled_from(["", "", "T4", "V100M16|G2"])) if k else ""
    return (draw(st.integers(0, 8000)), draw(st.integers(0, 16000)), k, d, spec)


def check_state(replay: Replay) -> None:
    """Recompute every node's free resources from the placed pods and compare."""
    s = replay.state
    assert (s.gpu_free >= 0).all() and (s.gpu_free <= MILLI).all()
    assert (s.cpu_free >= 0).all() and (s.mem_free >= 0).all()
    gpu_used = np.zeros_like(s.gpu_free)
    cpu_used = np.zeros_like(s.cpu_free)
    mem_used = np.zeros_like(s.mem_free)
    for node, gpus, pod in replay.where.values():
        cpu_used[node] += pod.cpu_milli
        mem_used[node] += pod.memory_mib
        assert len(set(gpus)) == pod.num_gpu
        for g in gpus:
            assert g < s.n_gpu[node]
            gpu_used[node, g] += pod.gpu_milli
        if pod.num_gpu:
            allowed = [m for m in pod.gpu_spec.split("|") if m]
            assert not allowed or s.models[s.model[node]] in allowed
    assert (cpu_used <= s.cpu_cap).all() and (mem_used <= s.mem_cap).all()
    assert (gpu_used <= MILLI).all()
    assert (s.cpu_free == s.cpu_cap - cpu_used).all()
    assert (s.mem_free == s.mem_cap - mem_used).all()
    slots = np.arange(s.gpu_free.shape[1])[None, :] < s.n_gpu[:, None]
    assert (s.gpu_free == np.where(slots, MILLI - gpu_used, 0)).all()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=node_rows,
    pods=st.lists(pod_row(), min_size=1, max_size=25),
    policy=st.sampled_from(ALL_POLICIES),
    seed=st.integers(0, 1000),
    budget=st.sampled_from([0.0, 0.0, 0.5]),
)
def test_no_placement_oversubscribes(nodes, pods, policy, seed, budget) -> None:
    table, ptable = node_table(nodes), pod_table(pods)
    workload = learn_workload(ptable.cpu_milli, ptable.num_gpu, ptable.gpu_milli, ptable.gpu_spec)
    replay = Replay(table, make_policy(policy, workload), workload, seed)
    if budget:
        replay.rescue = Migrator(replay, budget).rescue
    for i, row in enumerate(pods):
        replay.step(i, PodSpec(row[0], row[1], row[2], row[3], row[4], f"p{i}"))
        check_state(replay)
    assert replay.placed + replay.failed == len(pods)


def test_arrival_order_shuffles_then_inflates() -> None:
    pods = pod_table([(1000, 1, 1, 500, "")] * 6 + [(1000, 1, 0, 0, "")] * 2)
    cap = 4 * MILLI
    order = arrival_order(pods, cap, seed=3, ratio=1.3)
    assert sorted(order[:8].tolist()) == list(range(8))  # every original pod once, first
    total = pods.total_gpu_milli[order].sum()
    assert total <= 1.3 * cap < total + 500  # stops at the first draw that would overshoot
    again = arrival_order(pods, cap, seed=3, ratio=1.3)
    assert (order == again).all()
    # a trace above the target is trimmed instead
    trimmed = arrival_order(pods, cap, seed=3, ratio=0.5)
    assert pods.total_gpu_milli[trimmed].sum() <= 2000
    # CPU-only pods can never reach a GPU target: the order is the shuffle, not an endless draw
    cpu_only = pod_table([(1000, 1, 0, 0, "")] * 3)
    assert sorted(arrival_order(cpu_only, cap, seed=3, ratio=1.3).tolist()) == [0, 1, 2]


def test_curve_bins_average_within_integer_percent() -> None:
    c = Curve(
        arrived_pct=[0.2, 0.4, 1.2, 3.0],
        unallocated_pct=[100, 98, 96, 90],
        frag_amount_pct=[1, 3, 5, 7],
        frag_rate=[0.1, 0.1, 0.2, 0.3],
    )
    b = c.binned()
    assert b["arrived_pct"].tolist() == [0, 1, 3]
    assert b["unallocated_pct"].tolist() == [99, 96, 90]
    assert c.at(2.0) == pytest.approx(93.0)  # interpolated between bins 1 and 3


def test_migration_rescues_a_pod_by_moving_one() -> None:
    table = node_table([(8000, 64000, 1, "T4"), (8000, 64000, 1, "T4")])
    pods = pod_table([(1000, 1, 1, 300, "")])
    workload = learn_workload(pods.cpu_milli, pods.num_gpu, pods.gpu_milli, pods.gpu_spec)
    replay = Replay(table, make_policy("bestfit"), workload, seed=0)
    small = PodSpec(1000, 1, 1, 300, "", "x")
    for pid, node in ((0, 0), (1, 1)):  # one small pod on each GPU: no GPU is whole
        replay.state.allocate(node, [0], small)
        replay.bind(pid, small, node, [0])
        replay.placed += 1
    migrator = Migrator(replay, budget=0.5)
    replay.rescue = migrator.rescue
    assert replay.step(2, PodSpec(2000, 1, 1, 1000, "", "whole"))
    assert migrator.moves == 1 and migrator.cost_gpu == pytest.approx(0.3)
    check_state(replay)
    # budget spent: int(0.5 * 3 placed) - 1 move = 0 -> the next one is dropped
    assert not replay.step(3, PodSpec(2000, 1, 1, 1000, "", "whole2"))


def test_consolidation_fills_a_tight_hole_and_frees_a_whole_gpu() -> None:
    table = node_table([(8000, 64000, 2, "T4"), (8000, 64000, 2, "T4")])
    pods = pod_table([(1000, 1, 1, 300, "")])
    workload = learn_workload(pods.cpu_milli, pods.num_gpu, pods.gpu_milli, pods.gpu_spec)
    replay = Replay(table, make_policy("bestfit"), workload, seed=0)
    # node 0 GPU 0: a 300 alone; node 1 GPU 0: 400 + 250 (350 free); node 1 GPU 1: a 500 alone
    for pid, (node, gpu, milli) in enumerate([(0, 0, 300), (1, 0, 400), (1, 0, 250), (1, 1, 500)]):
        spec = PodSpec(1000, 1, 1, milli, "", f"p{pid}")
        replay.state.allocate(node, [gpu], spec)
        replay.bind(pid, spec, node, [gpu])
        replay.placed += 1
    migrator = Migrator(replay, budget=1.0)
    assert migrator.consolidate_step()
    assert replay.where[0][:2] == (1, [0])  # into the 350 hole, 50 left
    assert replay.state.gpu_free[0, 0] == MILLI and replay.state.gpu_free[1, 0] == 50
    assert migrator.moves == 1 and migrator.cost_gpu == pytest.approx(0.3)
    check_state(replay)
    # the 500 alone finds only whole GPUs (never broken into) and the 50 left: nothing to do
    assert not migrator.consolidate_step()


def test_run_replay_is_deterministic_per_seed() -> None:
    table = node_table([(32000, 64000, 4, "T4")] * 3 + [(64000, 64000, 8, "G2")])
    rows = [(2000, 100, 1, d, "") for d in (250, 500, 810, 1000)] * 6 + [(4000, 100, 0, 0, "")]
    pods = pod_table(rows)
    a = run_replay(table, pods, make_policy("online"), seed=5)
    b = run_replay(table, pods, make_policy("online"), seed=5)
    assert a.curve.unallocated_pct == b.curve.unallocated_pct
    assert a.placed + a.failed == len(a.curve.arrived_pct)


def _write_trace(tmp_path: Path) -> tuple[Path, Path]:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(
        "sn,cpu_milli,memory_mib,gpu,model\n"
        + "".join(
            f"n{i},32000,65536,{2 + 2 * (i % 2)},{'T4' if i % 2 else 'G2'}\n" for i in range(6)
        )
    )
    pods = tmp_path / "pods.csv"
    lines = ["name,cpu_milli,memory_mib,num_gpu,gpu_milli"]
    for i in range(40):
        k, d = [(1, 1000), (1, 470), (0, 0), (2, 1000), (1, 810)][i % 5]
        lines.append(f"p{i},{2000 + 500 * (i % 3)},1024,{k},{d}")
    pods.write_text("\n".join(lines) + "\n")
    return nodes, pods


def test_cli_writes_curve_summary_and_plot(tmp_path: Path, capsys) -> None:
    nodes, pods = _write_trace(tmp_path)
    out = tmp_path / "out"
    rc = main(
        ["replay", "--nodes", str(nodes), "--pods", str(pods), "--policies", "all",
         "--seeds", "1-2", "--jobs", "1", "--out", str(out)]
    )  # fmt: skip
    assert rc == 0
    with (out / "curve.csv").open() as fh:
        curve = list(csv.DictReader(fh))
    assert list(curve[0]) == [
        "policy", "seed", "arrived_pct", "unallocated_gpu_pct", "frag_amount_pct", "frag_rate"
    ]  # fmt: skip
    assert {r["policy"] for r in curve} == set(ALL_POLICIES)
    with (out / "summary.csv").open() as fh:
        summary = list(csv.DictReader(fh))
    assert len(summary) == len(ALL_POLICIES) * 2
    assert list(summary[0])[:6] == [
        "policy", "seed", "migration_budget", "migrated_pods", "unalloc_100", "unalloc_130"
    ]  # fmt: skip
    assert (out / "replay.png").stat().st_size > 1000
    wrote = capsys.readouterr().out.splitlines()[-1]
    assert wrote == f"wrote {out / 'curve.csv'}, {out / 'summary.csv'}, {out / 'replay.png'}"
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == sorted(
        ["curve.csv", "summary.csv", "replay.png"]
    )


def test_cli_migration_budget_labels_rows(tmp_path: Path, capsys) -> None:
    nodes, pods = _write_trace(tmp_path)
    out = tmp_path / "out"
    rc = main(
        ["replay", "--nodes", str(nodes), "--pods", str(pods), "--policies", "fgd",
         "--seeds", "3", "--migration-budget", "0,0.05", "--jobs", "1", "--out", str(out)]
    )  # fmt: skip
    assert rc == 0
    with (out / "summary.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [r["policy"] for r in rows] == ["fgd", "fgd+mig0.05"]
    assert (out / "migration.png").stat().st_size > 1000
    assert int(rows[1]["migrated_pods"]) <= 0.05 * int(rows[1]["placed"]) + 1
    printed = capsys.readouterr().out.splitlines()
    assert printed[-1] == (  # every file it wrote, migration.png too
        f"wrote {out / 'curve.csv'}, {out / 'summary.csv'}, {out / 'replay.png'}, "
        f"{out / 'migration.png'}"
    )
    line = next(x for x in printed if x.startswith("packing bound"))
    bound = float(line.split("below ")[1].split("%")[0])
    assert all(float(r["unalloc_100"]) >= bound - 0.005 for r in rows)  # printed to 2 decimals


def test_cli_reports_malformed_input_in_one_line(tmp_path: Path, capsys) -> None:
    nodes, pods = _write_trace(tmp_path)
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,zz,1,1,500\n")
    rc = main(["replay", "--nodes", str(nodes), "--pods", str(pods), "--out", str(tmp_path)])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert "line 2, column cpu_milli" in err and "\n" not in err


def test_cli_rejects_unknown_policy(tmp_path: Path) -> None:
    nodes, pods = _write_trace(tmp_path)
    with pytest.raises(SystemExit):
        main(["replay", "--nodes", str(nodes), "--pods", str(pods), "--policies", "tetris",
              "--out", str(tmp_path)])  # fmt: skip


def test_fidelity_table_compares_with_the_paper(tmp_path: Path) -> None:
    from advisor.replay.fidelity import fidelity_rows, markdown, read_summaries

    out = tmp_path / "run"
    out.mkdir()
    rows = [
        "policy,seed,migration_budget,migrated_pods,unalloc_100,unalloc_130,trace",
        "fgd,42,0.0,0,4.6,4.5,openb_pod_list_default.csv",
        "fgd,43,0.0,0,5.0,4.7,openb_pod_list_default.csv",
        "random,42,0.0,0,15.0,13.0,openb_pod_list_default.csv",
        "fgd+mig0.02,42,0.02,10,1.0,1.0,openb_pod_list_default.csv",
    ]
    (out / "summary.csv").write_text("\n".join(rows) + "\n")
    table = fidelity_rows(read_summaries([out]))
    by_policy = {r["policy"]: r for r in table}
    assert set(by_policy) == {"fgd", "random"}  # migration rows are not paper figures
    assert by_policy["fgd"]["ours"] == pytest.approx(4.8)
    assert by_policy["fgd"]["diff"] == pytest.approx(0.03)
    assert by_policy["fgd"]["ok"]
    assert by_policy["random"]["diff"] == pytest.approx(1.3)
    assert not by_policy["random"]["ok"]  # Random's tolerance is 1.0 pp
    assert "| default | fgd | 2 | 4.80 ± 0.28 | 4.77 | +0.03 | yes |" in markdown(table)


def test_packing_floor_hand_computed() -> None:
    from advisor.replay.floor import packing_floor_pct

    # 10 GPUs; 5 whole-GPU pods, six of 810 milli, one of 100: 9,960 milli, all arrived before
    # the 100 % bin ends (resampled extras beyond it are not counted). Best packing: 5 GPUs whole,
    # 5 GPUs with one 810 each (no two fit), the 100 beside one of them: 1,000 - 4,150 / 5,000 idle.
    rows = [(1000, 1, 1, 1000, "")] * 5 + [(1000, 1, 1, 810, "")] * 6 + [(1000, 1, 1, 100, "")]
    floor = packing_floor_pct(pod_table(rows), gpus=10, seed=0)
    assert floor == pytest.approx(100 * (5000 - 4150) / 10000)


def test_packing_bound_pairs_what_pairs_and_nothing_else() -> None:
    from collections import Counter

    from advisor.replay.floor import max_packed_milli

    assert max_packed_milli(Counter({700: 4, 300: 4}), gpus=4) == pytest.approx(4000)
    assert max_packed_milli(Counter({700: 4, 300: 4}), gpus=3) == pytest.approx(3000)
    # never two 600s on one GPU
    assert max_packed_milli(Counter({600: 3}), gpus=2) == pytest.approx(1200)
    assert max_packed_milli(Counter({250: 7}), gpus=2) == pytest.approx(1750)
    assert max_packed_milli(Counter(), gpus=2) == 0.0


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=node_rows,
    pods=st.lists(pod_row(), min_size=1, max_size=25),
    policy=st.sampled_from(ALL_POLICIES),
    seed=st.integers(0, 1000),
    budget=st.sampled_from([0.0, 0.5]),
)
def test_no_replay_goes_below_the_packing_floor(nodes, pods, policy, seed, budget) -> None:
    from advisor.replay.floor import packing_floor_pct

    table, ptable = node_table(nodes), pod_table(pods)
    if table.total_gpus == 0:
        return
    workload = learn_workload(ptable.cpu_milli, ptable.num_gpu, ptable.gpu_milli, ptable.gpu_spec)
    result = run_replay(
        table,
        ptable,
        make_policy(policy, workload),
        seed,
        workload=workload,
        migration_budget=budget,
    )
    floor = packing_floor_pct(ptable, table.total_gpus, seed)  # arrivals up to 100.5 %
    arrived = np.asarray(result.curve.arrived_pct)
    unallocated = np.asarray(result.curve.unallocated_pct)
    assert (unallocated[arrived <= 100.5] >= floor - 1e-9).all()


@pytest.mark.parametrize("ratio", ["nan", "inf", "-inf", "0", "-1", "x"])
def test_cli_refuses_a_ratio_that_is_not_finite_and_positive(tmp_path: Path, ratio, capsys) -> None:
    nodes, pods = _write_trace(tmp_path)
    with pytest.raises(SystemExit) as stop:
        main(["replay", "--nodes", str(nodes), "--pods", str(pods), "--jobs", "1",
              "--out", str(tmp_path / "r"), f"--ratio={ratio}"])  # fmt: skip
    assert stop.value.code == 2
    assert "argument --ratio:" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("ratio", [float("nan"), float("inf"), 0.0, -1.0])
def test_arrival_order_refuses_a_ratio_it_cannot_reach(ratio: float) -> None:
    pods = pod_table([(1000, 1, 1, 500, "")] * 4)
    with pytest.raises(ValueError, match="ratio"):
        arrival_order(pods, 4 * MILLI, seed=1, ratio=ratio)


def test_a_curve_with_no_arrivals_bins_to_nothing() -> None:
    empty = Curve()
    assert empty.binned()["arrived_pct"].size == 0
    assert np.isnan(empty.at(100.0))


@pytest.mark.parametrize("jobs", ["0", "-1", "two"])
def test_cli_refuses_fewer_than_one_job(tmp_path: Path, jobs: str) -> None:
    nodes, pods = _write_trace(tmp_path)
    with pytest.raises(SystemExit) as stop:
        main(["replay", "--nodes", str(nodes), "--pods", str(pods), f"--jobs={jobs}",
              "--out", str(tmp_path / "r")])  # fmt: skip
    assert stop.value.code == 2


@pytest.mark.parametrize(
    ("rows", "says"),
    [
        ("", "no pods"),  # header only
        ("p1,1000,1024,0,0\n", "no pod asks for a GPU"),  # no GPU demand to replay
    ],
)
def test_cli_a_pod_list_with_nothing_to_replay_is_one_line(
    tmp_path: Path, capsys, rows: str, says: str
) -> None:
    nodes, pods = _write_trace(tmp_path)
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n" + rows)
    rc = main(["replay", "--nodes", str(nodes), "--pods", str(pods), "--jobs", "1",
               "--out", str(tmp_path / "r")])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and f"{pods}: {says}" in err
    assert not (tmp_path / "r").exists()


def test_cli_checks_out_before_replaying(tmp_path: Path, capsys, monkeypatch) -> None:
    import advisor.replay.sweep as sweep

    nodes, pods = _write_trace(tmp_path)
    out = tmp_path / "afile"
    out.write_text("keep")
    monkeypatch.setattr(sweep, "run_tasks", lambda *a, **k: pytest.fail("replayed first"))
    rc = main(["replay", "--nodes", str(nodes), "--pods", str(pods), "--jobs", "1",
               "--out", str(out)])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "not a directory" in err
    assert out.read_text() == "keep"


def test_cli_a_write_that_fails_is_exit_1_and_keeps_the_previous_run(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """A full disk after the replays is no bad input: exit 1 (as for the other commands'
    results), one line, and the previous run's files stay whole."""
    import errno

    import advisor.replay.output as output

    nodes, pods = _write_trace(tmp_path)
    out = tmp_path / "run"
    base = ["replay", "--nodes", str(nodes), "--pods", str(pods), "--policies", "fgd",
            "--seeds", "1", "--jobs", "1", "--out", str(out)]  # fmt: skip
    assert main(base) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(output, "plot", full)
    capsys.readouterr()
    assert main(base) == 1
    err = capsys.readouterr().err
    assert err == f"gpu-defrag replay: error: cannot write {out}: No space left on device\n"
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_cli_a_new_run_leaves_no_file_of_the_previous_one(tmp_path: Path) -> None:
    nodes, pods = _write_trace(tmp_path)
    out = tmp_path / "mix"
    base = ["replay", "--nodes", str(nodes), "--pods", str(pods), "--policies", "fgd",
            "--jobs", "1", "--out", str(out)]  # fmt: skip
    assert main([*base, "--seeds", "1", "--migration-budget", "0.05"]) == 0
    assert (out / "migration.png").exists()
    assert main([*base, "--seeds", "2"]) == 0
    assert not (out / "migration.png").exists()
    with (out / "summary.csv").open() as fh:
        assert [r["seed"] for r in csv.DictReader(fh)] == ["2"]


def test_cli_a_users_migration_png_is_refused_before_replaying_with_a_budget(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """migration.png is written only with a budget: a file of that name the user keeps in
    --out was refused only after the replays; it is checked first, as the other three are."""
    import advisor.replay.sweep as sweep

    nodes, pods = _write_trace(tmp_path)
    out = tmp_path / "mine"
    out.mkdir()
    (out / "migration.png").write_text("keep")
    monkeypatch.setattr(sweep, "run_tasks", lambda *a, **k: pytest.fail("replayed first"))
    rc = main(["replay", "--nodes", str(nodes), "--pods", str(pods), "--jobs", "1",
               "--migration-budget", "0.05", "--out", str(out)])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "migration.png" in err, err
    assert (out / "migration.png").read_text() == "keep"


def test_cli_out_below_a_file_is_refused_before_replaying(tmp_path: Path, capsys) -> None:
    nodes, pods = _write_trace(tmp_path)
    rc = main(["replay", "--nodes", str(nodes), "--pods", str(pods), "--jobs", "1",
               "--out", str(nodes / "r")])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and f"{nodes} is not a directory" in err


@pytest.mark.parametrize("below", ["out", "new/out"])
def test_cli_refuses_an_out_it_cannot_write_before_replaying(
    tmp_path: Path, capsys, monkeypatch, below: str
) -> None:
    """A read-only parent, or a missing one that cannot be made in a read-only folder: one
    line naming the folder, exit 2, before any replay, and nothing made."""
    import os

    import advisor.replay.sweep as sweep

    nodes, pods = _write_trace(tmp_path)
    locked = tmp_path.resolve() / "locked"  # the message names the folder behind any link
    locked.mkdir(mode=0o555)
    if os.geteuid() == 0:  # root writes anywhere: the folder as any other user sees it
        access = os.access
        monkeypatch.setattr(
            os, "access", lambda p, mode, **kw: Path(p) != locked and access(p, mode, **kw)
        )
    monkeypatch.setattr(sweep, "run_tasks", lambda *a, **k: pytest.fail("replayed first"))
    out = locked / below
    rc = main(["replay", "--nodes", str(nodes), "--pods", str(pods), "--jobs", "1",
               "--out", str(out)])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert err.strip() == f"gpu-defrag replay: error: --out {out}: {locked} is not writable"
    assert list(locked.iterdir()) == []


def test_cli_json_prints_the_summary_rows_and_the_files(tmp_path: Path, capsys) -> None:
    import json

    nodes, pods = _write_trace(tmp_path)
    out = tmp_path / "out"
    rc = main(
        ["replay", "--nodes", str(nodes), "--pods", str(pods), "--policies", "fgd,bestfit",
         "--seeds", "3", "--jobs", "1", "--out", str(out), "--json", "--quiet"]
    )  # fmt: skip
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    with (out / "summary.csv").open() as fh:
        summary = list(csv.DictReader(fh))
    assert [r["policy"] for r in doc["replays"]] == [r["policy"] for r in summary]
    assert list(doc["replays"][0]) == list(summary[0])  # summary.csv's columns
    assert [float(r["unalloc_100"]) for r in summary] == pytest.approx(
        [r["unalloc_100"] for r in doc["replays"]]
    )
    assert doc["packing_bound_pct"] <= min(r["unalloc_100"] for r in doc["replays"]) + 1e-9
    assert doc["wrote"] == [str(out / n) for n in ("curve.csv", "summary.csv", "replay.png")]
