"""FGD measure on hand-made nodes; every expected number is worked out in the comments."""

from __future__ import annotations

import numpy as np
import pytest

from advisor.fragmentation.fgd import (
    OnlineWorkload,
    Workload,
    cluster_fragment,
    learn_workload,
    node_fragment,
    node_fragment_by_type,
    spec_allows,
    workload_from_counts,
)

MODELS = ["T4", "V100M16"]


def _workload() -> Workload:
    # A: 2 CPU + 0.5 GPU (p 0.5); B: 1 CPU + 1 GPU (p 0.3); C: CPU-only 4 CPU (p 0.2)
    return Workload.from_shapes(
        [(2000, 500, 1, ""), (1000, 1000, 1, ""), (4000, 0, 0, "")], [0.5, 0.3, 0.2]
    )


def test_node_fragment_hand_computed() -> None:
    w = _workload()
    acc = w.access(MODELS)
    gpu = np.array([[1000, 300], [200, 0], [1000, 1000]])
    cpu = np.array([8000, 8000, 1000])
    model = np.array([0, 0, 0])
    per_type = node_fragment_by_type(gpu, cpu, model, w, acc)
    # node 0: A fits -> GPUs < 500 free: 300; B fits -> GPUs < 1000: 300; C: all idle 1300
    # node 1: A, B lack GPU -> all idle 200; C -> 200
    # node 2: A lacks CPU (1000 < 2000) -> 2000; B fits, no GPU below 1000 -> 0; C lacks CPU -> 2000
    assert per_type.tolist() == [[300, 300, 1300], [200, 200, 200], [2000, 0, 2000]]
    f = node_fragment(gpu, cpu, model, w, acc)
    # 0.5*300 + 0.3*300 + 0.2*1300 = 500; 200; 0.5*2000 + 0 + 0.2*2000 = 1400
    assert f == pytest.approx([500.0, 200.0, 1400.0])
    c = cluster_fragment(gpu, cpu, model, w, acc, capacity_milli=6000)
    assert c.amount == pytest.approx(2100.0)
    assert c.idle == 3500.0
    assert c.rate == pytest.approx(2100 / 3500)
    assert c.amount_pct == pytest.approx(35.0)


def test_model_constraint_and_multi_gpu() -> None:
    w = Workload.from_shapes([(1000, 500, 1, "V100M16"), (1000, 1000, 2, "")], [0.25, 0.75])
    acc = w.access(MODELS)
    assert acc.tolist() == [[False, True], [True, True]]
    gpu = np.array([[1000, 600], [1000, 1000], [1000, 600]])
    cpu = np.array([4000, 4000, 4000])
    model = np.array([0, 0, 1])  # T4, T4, V100M16
    per_type = node_fragment_by_type(gpu, cpu, model, w, acc)
    # node 0 (T4): type 0 no access -> 1600; type 1 needs two whole GPUs, has one -> 1600
    # node 1 (T4): no access -> 2000; two whole GPUs fit, none partly used -> 0
    # node 2 (V100M16): type 0 fits, no GPU below 500 -> 0; type 1 lacks GPU -> 1600
    assert per_type.tolist() == [[1600, 1600], [2000, 0], [0, 1600]]
    assert node_fragment(gpu, cpu, model, w, acc) == pytest.approx([1600, 500, 1200])


def test_empty_and_padded_nodes() -> None:
    w = _workload()
    acc = w.access(MODELS)
    # a 1-GPU node padded to 2 slots with 0; a fully used node has no fragment at all
    gpu = np.array([[400, 0], [0, 0]])
    f = node_fragment(gpu, np.array([8000, 8000]), np.array([0, 0]), w, acc)
    # node 0: A lacks GPU (400 < 500) -> 400; B lacks GPU -> 400; C -> 400 => 400
    assert f == pytest.approx([400.0, 0.0])


def test_spec_allows() -> None:
    assert spec_allows("", "T4")
    assert spec_allows("V100M16|V100M32", "V100M32")
    assert not spec_allows("V100M16|V100M32", "T4")
    assert not spec_allows("T4", "")
    assert spec_allows("|", "T4")


def test_workload_popularity_cut() -> None:
    a, b, c, d = (1000, 500, 1, ""), (2000, 1000, 1, ""), (3000, 0, 0, ""), (500, 200, 1, "")
    counts = {a: 10, b: 6, c: 3, d: 1}
    # 95% of 20 = 19: A (10), B (16), C (19) -> stop; renormalise by 19
    w = workload_from_counts(counts, 95)
    assert w.shapes == [a, b, c]
    assert w.popularity == pytest.approx([10 / 19, 6 / 19, 3 / 19])
    # 80% of 20 = 16: A, B
    assert workload_from_counts(counts, 80).shapes == [a, b]
    # 100%: everything, in count order
    assert workload_from_counts(counts, 100).shapes == [a, b, c, d]


def test_workload_ties_break_by_larger_shape() -> None:
    small, big = (1000, 500, 1, ""), (4000, 500, 1, "")
    w = workload_from_counts({small: 5, big: 5}, 50)
    assert w.shapes == [big]


def test_learn_workload_from_trace_columns() -> None:
    w = learn_workload(
        cpu_milli=[1000, 1000, 2000, 0],
        num_gpu=[1, 1, 0, 1],
        gpu_milli=[500, 500, 0, 1000],
        gpu_spec=["", "", "", "T4"],
        threshold_pct=100,
    )
    # the zero-CPU pod counts as 100 milli (kube-scheduler's non-zero default)
    assert w.shapes == [(1000, 500, 1, ""), (2000, 0, 0, ""), (100, 1000, 1, "T4")]
    assert w.popularity == pytest.approx([0.5, 0.25, 0.25])
    no_cpu = learn_workload([1000, 2000], [1, 0], [500, 0], ["", ""], 100, include_cpu=False)
    assert no_cpu.shapes == [(1000, 500, 1, "")]


def test_online_workload_only_knows_the_past() -> None:
    online = OnlineWorkload(threshold_pct=100)
    online.observe((1000, 500, 1, ""))
    assert online.workload().shapes == [(1000, 500, 1, "")]
    online.observe((2000, 1000, 1, ""))
    online.observe((2000, 1000, 1, ""))
    w = online.workload()
    assert w.shapes == [(2000, 1000, 1, ""), (1000, 500, 1, "")]
    assert w.popularity == pytest.approx([2 / 3, 1 / 3])
    with pytest.raises(ValueError, match=r"^cannot learn a workload from zero pods$"):
        OnlineWorkload().workload()


def test_bad_popularity_rejected() -> None:
    with pytest.raises(
        ValueError, match=r"^popularity must be >= 0 and sum to 1, got sum 0\.500000$"
    ):
        Workload.from_shapes([(1, 1, 1, "")], [0.5])
