"""A GPU in MIG mode is room for MIG instances, never a free whole GPU: the measures do not
count it free, whole-GPU work and reservations never take it, and MIG work takes only what its
instances carve."""

from __future__ import annotations

import numpy as np

from advisor.contract import GPU_STATE_CODES
from advisor.fragmentation import measures
from advisor.planner.actions import Action, GpuSet
from advisor.planner.check import check_plan
from advisor.planner.constraints import Policy
from advisor.planner.reserve import gpu_ready_times
from tests.conftest import add_nodes


def fleet():
    """n0: 8 plain A100, `small` (1 GPU) on 0. n1: 8 A100 in MIG mode, each carved 3g+3g (857
    milli), `inst` (3g, 429 milli) on GPU 0, `inst2` (3g) on GPU 6; the others hold nothing."""
    b = add_nodes(["n0"], gpu_model="A100", rack="r1", island=8)
    add_nodes(
        ["n1"], builder=b, gpu_model="A100", rack="r1", island=8, mig_enabled=True, carved_milli=857
    )
    b.add_allocation("small", num_gpu=1, node="n0", gpus=[0], tenant="t")
    b.add_allocation("inst", num_gpu=1, gpu_milli=429, node="n1", gpus=[0], tenant="t")
    b.add_allocation("inst2", num_gpu=1, gpu_milli=429, node="n1", gpus=[6], tenant="t")
    return b.build(timestamp=1_000_000.0)


def test_a_mig_gpu_is_never_a_free_whole_gpu() -> None:
    model = fleet()
    assert model.gpu_is_free.sum() == 7  # n0's 1-7
    assert measures.jobs_that_fit(model, measures.Shape(8)) == 0  # n1 is no 8-GPU node
    assert measures.jobs_that_fit(model, measures.Shape(1)) == 7
    assert model.gpu_free_milli[8:].tolist() == [428] + [857] * 5 + [428, 857]  # carved
    codes = measures.gpu_state_codes(model, measures.allocated_idle(model))
    mig_free = GPU_STATE_CODES["mig_free"]
    assert codes[8:].tolist()[1:6] == [mig_free] * 5 and codes[15] == mig_free
    assert np.isinf(gpu_ready_times(model, np.full(len(model.allocations), 2e6))[8:]).all()


def test_whole_gpu_work_never_takes_a_mig_gpu_and_mig_work_never_a_plain_one() -> None:
    model = fleet()
    onto_mig = Action(
        "migrate", alloc="small", src=GpuSet("n0", (0,), 1000), dst=GpuSet("n1", (3,), 1000)
    )
    result = check_plan(model, [onto_mig], Policy())
    assert result.violation.reason == "n1/gpu3 is in MIG mode; 'small' takes whole GPUs"
    hold = Action("reserve", alloc="r0", tenant="t", dst=GpuSet("n1", (4, 5)))
    assert "is in MIG mode" in check_plan(model, [hold], Policy()).violation.reason
    off_mig = Action(
        "migrate", alloc="inst", src=GpuSet("n1", (0,), 429), dst=GpuSet("n0", (5,), 429)
    )
    reason = check_plan(model, [off_mig], Policy()).violation.reason
    assert reason == "n0/gpu5 is not in MIG mode; 'inst' runs in MIG instances"
    beside = Action(  # GPU 6 has 857 - 429 = 428 carved milli left (571 if it were whole)
        "migrate", alloc="inst", src=GpuSet("n1", (0,), 429), dst=GpuSet("n1", (6,), 429)
    )
    reason = check_plan(model, [beside], Policy()).violation.reason
    assert reason == "n1/gpu6 has 428 milli free at this step, the step needs 429"
    within = Action(
        "migrate", alloc="inst", src=GpuSet("n1", (0,), 429), dst=GpuSet("n1", (7,), 429)
    )
    assert check_plan(model, [within], Policy()).ok
    full = Action("reserve", alloc="r1", tenant="t", dst=GpuSet("n1", (7,), 1000))
    assert "is in MIG mode" in check_plan(model, [full], Policy()).violation.reason
