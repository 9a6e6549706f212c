"""Every policy's score on hand-made nodes, with the arithmetic written out."""

from __future__ import annotations

import numpy as np
import pytest

from advisor.fragmentation.fgd import Workload
from advisor.ingest.openb import NodeTable
from advisor.placement import ALL_POLICIES, make_policy
from advisor.placement.base import place_with_gpus
from advisor.placement.bestfit import bestfit_scores, normalize_scores
from advisor.placement.clustering import clustering_scores
from advisor.placement.dotprod import dotprod_scores
from advisor.placement.fgd import FGDPolicy, FragTracker, fgd_scores
from advisor.placement.online import OnlineFGDPolicy
from advisor.placement.packing import packing_scores
from advisor.placement.state import ClusterState, PlacementError, PodSpec, select_node


def nodes(gpus: list[int], cpu: int = 8000, model: str = "T4") -> NodeTable:
    n = len(gpus)
    return NodeTable(
        name=np.array([f"n{i}" for i in range(n)], dtype=object),
        cpu_milli=np.full(n, cpu, dtype=np.int64),
        memory_mib=np.full(n, 65536, dtype=np.int64),
        gpu=np.array(gpus, dtype=np.int64),
        model=np.array([model] * n, dtype=object),
    )


def state_with(free: list[list[int]], cpu: int = 8000) -> ClusterState:
    """Nodes with the given per-GPU free milli (used milli is taken by anonymous pods)."""
    s = ClusterState.from_nodes(nodes([len(f) for f in free], cpu))
    for i, row in enumerate(free):
        s.gpu_free[i, : len(row)] = row
    return s


def test_dotprod_hand_computed() -> None:
    # node0: (64/128)(32/128) + (8/8)(1/8) = 0.125 + 0.125 = 0.25 -> 100 (1 - 0.125) = 87.5 -> 87
    # node1: (128/128)(32/128) + (2/8)(1/8) = 0.25 + 0.03125 -> 100 (1 - 0.140625) -> 85
    s = dotprod_scores(np.array([64000, 128000]), np.array([8000, 2000]), 32000, 1000)
    assert s.tolist() == [87, 85]


def test_packing_tiers() -> None:
    free = np.array([[1000, 1000], [1000, 300], [1000, 100], [1000, 900], [1000, 200]])
    n_gpu = np.array([2, 2, 2, 2, 2])
    # share pod of 200 milli:
    # [1000,1000] empty node -> max(33 - 2, 2) = 31
    # [1000,300] best fitting GPU has 300 left -> 100 - (30 // 10) = 97
    # [1000,100] only a whole free GPU fits -> max(50 - 1, 33) = 49
    # [1000,900] -> 100 - 90 // 10 = 91 ; [1000,200] -> 100 - 2 = 98
    assert packing_scores(free, n_gpu, 1, 200).tolist() == [31, 97, 49, 91, 98]
    # one whole GPU: empty node 31, used node max(50 - 1, 33) = 49
    assert packing_scores(free[:2], n_gpu[:2], 1, 1000).tolist() == [31, 49]
    # an empty 8-GPU node: max(33 - 8, 8) = 25; CPU-only pods score 0
    assert packing_scores(np.full((1, 8), 1000), np.array([8]), 2, 1000).tolist() == [25]
    assert packing_scores(free, n_gpu, 0, 0).tolist() == [0] * 5


def test_clustering_tiers() -> None:
    aff = np.zeros((4, 9), dtype=np.int64)
    aff[0, 0] = 3  # only share pods
    aff[1, [0, 1]] = 1  # share and 1-gpu
    aff[3, 1] = 2  # only 1-gpu pods
    idle = np.array([2000, 2000, 2000, 2000])
    # base = 25 * (8000 - 2000) // 8000 = 18
    assert clustering_scores(aff, idle, 0).tolist() == [93, 68, 43, 18]
    assert clustering_scores(aff, idle, 1).tolist() == [18, 68, 43, 93]
    assert clustering_scores(aff, idle, -1).tolist() == [0, 0, 0, 0]


def test_bestfit_hand_computed() -> None:
    # raw: 100 (1 - [0.5 free_cpu/128k + 0.5 (idle - 1000)/8000])
    # node0 (128k, 8000): 1 - (0.5 + 0.4375) -> 6 ; node1 (64k, 2000): 1 - (0.25 + 0.0625) -> 68
    # node2 (96k, 4000): 1 - (0.375 + 0.1875) -> 43 ; normalised (x - 6) * 100 // 62
    s = bestfit_scores(np.array([128000, 64000, 96000]), np.array([8000, 2000, 4000]), 0, 1000)
    assert s.tolist() == [0, 100, 59]
    assert normalize_scores(np.array([5, 5])).tolist() == [0, 0]


def test_fgd_score_curve() -> None:
    # int(100 sigmoid(-delta / 1000)): 0 -> 50, -1000 -> 73, +1000 -> 26, saturates at 0/100
    assert fgd_scores(np.array([0.0, -1000.0, 1000.0, -1e6, 1e6])).tolist() == [50, 73, 26, 100, 0]


def _two_type_workload() -> Workload:
    return Workload.from_shapes([(1000, 500, 1, ""), (1000, 1000, 1, "")], [0.5, 0.5])


def test_fgd_prefers_the_node_where_fragmentation_falls() -> None:
    w = _two_type_workload()
    s = state_with([[1000, 1000], [500, 0]])
    pol = FGDPolicy(w)
    pol.attach(s, np.random.default_rng(0))
    pod = PodSpec(1000, 1, 1, 500)
    # node0 [1000,1000]: before 0; after [500,1000]: type 1 sees 500 below 1000 -> 0.5 * 500
    #   delta +250 -> int(100 sigmoid(-0.25)) = 43
    # node1 [500,0]: before: type 0 fits (0), type 1 lacks GPU -> 500; F = 250
    #   after [0,0]: nothing idle -> 0; delta -250 -> 56
    assert pol.score(pod, np.array([0, 1])).tolist() == [43, 56]
    assert pol.gpus(pod, 1) == [0]


def test_fgd_picks_the_gpu_within_a_node() -> None:
    w = _two_type_workload()
    s = state_with([[1000, 600]])
    pol = FGDPolicy(w)
    pol.attach(s, np.random.default_rng(0))
    # before: type 0 fits (0), type 1 fits, 600 below 1000 -> F = 300
    # GPU0 -> [500,600]: type 1 lacks GPU -> 1100, F = 550, delta +250 -> 43
    # GPU1 -> [1000,100]: type 0: 100 below 500; type 1: 100 -> F = 100, delta -200 -> 54
    assert pol.score(PodSpec(1000, 1, 1, 500), np.array([0])).tolist() == [54]
    assert pol.gpus(PodSpec(1000, 1, 1, 500), 0) == [1]


def test_fgd_tracker_updates_after_each_placement() -> None:
    w = _two_type_workload()
    s = state_with([[1000, 1000], [1000, 1000]])
    tracker = FragTracker(s, w)
    assert tracker.amount == 0.0
    s.allocate(0, [0], PodSpec(1000, 1, 1, 700))
    # node0 [300,1000]: type 0: 300 below 500 -> 300; type 1: 300 -> F = 300
    assert tracker.frag.tolist() == [300.0, 0.0]


def test_random_policy_only_picks_feasible_nodes() -> None:
    s = state_with([[1000], [200], [1000]])
    rank = np.arange(3)
    pol = make_policy("random")
    pol.attach(s, np.random.default_rng(1))
    chosen = set()
    for _ in range(20):
        cand = s.feasible(PodSpec(100, 1, 1, 500))
        chosen.add(select_node(cand, pol.score(PodSpec(100, 1, 1, 500), cand), rank))
    assert chosen == {0, 2}


def test_select_node_breaks_ties_by_rank() -> None:
    cand = np.array([0, 1, 2])
    assert select_node(cand, np.array([5, 7, 7]), np.array([0, 2, 1])) == 2
    assert select_node(cand, np.array([9, 7, 7]), np.array([2, 0, 1])) == 0


def test_every_policy_places_and_respects_model() -> None:
    table = nodes([2, 2])
    table.model[1] = "V100M16"
    w = Workload.from_shapes([(1000, 500, 1, "")], [1.0])
    for name in ALL_POLICIES:
        s = ClusterState.from_nodes(table)
        pol = make_policy(name, w)
        pol.attach(s, np.random.default_rng(0))
        pod = PodSpec(1000, 1, 1, 400, "V100M16")
        pol.observe(pod)
        node, gpus = place_with_gpus(s, pol, pod, np.arange(2))
        assert node == 1, name
        assert len(gpus) == 1


def test_allocate_refuses_oversubscription() -> None:
    s = state_with([[300, 1000]])
    with pytest.raises(PlacementError):
        s.allocate(0, [0], PodSpec(100, 1, 1, 500))
    with pytest.raises(PlacementError):
        s.allocate(0, [1], PodSpec(9000, 1, 1, 500))
    with pytest.raises(PlacementError):
        s.allocate(0, [1, 1], PodSpec(100, 1, 2, 1000))


def test_online_policy_learns_only_from_arrivals() -> None:
    s = state_with([[1000, 1000]])
    pol = OnlineFGDPolicy()
    pol.attach(s, np.random.default_rng(0))
    pol.observe(PodSpec(1000, 1, 1, 500))
    assert pol.tracker is not None
    assert pol.tracker.workload.shapes == [(1000, 500, 1, "")]
    pol.observe(PodSpec(2000, 1, 1, 1000))
    pol.observe(PodSpec(2000, 1, 1, 1000))  # third arrival: doubling schedule refreshes at 4
    pol.observe(PodSpec(2000, 1, 1, 1000))
    assert pol.tracker.workload.shapes == [(2000, 1000, 1, ""), (1000, 500, 1, "")]
    assert pol.tracker.workload.popularity == pytest.approx([0.75, 0.25])


def test_make_policy_errors() -> None:
    with pytest.raises(ValueError, match="needs a target workload"):
        make_policy("fgd")
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("tetris")


def test_online_policy_breaks_score_ties_toward_smaller_nodes() -> None:
    s = ClusterState.from_nodes(nodes([8, 2, 4]))
    pol = OnlineFGDPolicy()
    pol.attach(s, np.random.default_rng(0))
    pod = PodSpec(1000, 1, 1, 1000)
    pol.observe(pod)
    scores = pol.score(pod, np.array([0, 1, 2]))
    # every empty node scores the same integer; the 2-GPU node wins, the 8-GPU node is last
    assert np.floor(scores).tolist() == [50, 50, 50]
    assert select_node(np.array([0, 1, 2]), scores, np.array([0, 1, 2])) == 1
    assert scores[2] > scores[0]


def test_tight_holes_per_node() -> None:
    s = state_with([[300, 1000, 450], [1000, 1000], [100, 200]])
    left, gpu = s.tight_holes(np.array([0, 1, 2]), 250)
    # node 0: 300 - 250 = 50 on GPU 0 (450 leaves 200); node 1: only whole GPUs; node 2: none fit
    assert left.tolist() == [50, 1001, 1001] and gpu[0] == 0


def test_online_policy_fills_a_tight_hole_before_asking_fgd() -> None:
    # node 0: GPU 0 has a 300 hole; node 1: two whole GPUs; node 2: a 380 hole (130 left)
    s = state_with([[300, 1000], [1000, 1000], [380, 1000]])
    pol = OnlineFGDPolicy()
    pol.attach(s, np.random.default_rng(0))
    pod = PodSpec(1000, 1, 1, 250)
    pol.observe(pod)
    cand = np.array([0, 1, 2])
    scores = pol.score(pod, cand)
    assert scores[0] == 1000 + (100 - 50)  # within 100 milli: ranked above any FGD score
    assert scores[1] <= 101 and scores[2] <= 101  # no hole / 130 left: FGD's score
    assert select_node(cand, scores, np.array([2, 1, 0])) == 0 and pol.gpus(pod, 0) == [0]
    # a whole-GPU pod, or the rule switched off: FGD alone
    assert pol.score(PodSpec(1000, 1, 1, 1000), cand).max() <= 101
    off = OnlineFGDPolicy(tight_hole=0)
    off.attach(s, np.random.default_rng(0))
    off.observe(pod)
    assert off.score(pod, cand).max() <= 101
