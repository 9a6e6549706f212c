"""Questions asked of one state of the pipeline: plans for a goal, what-if, a selection replayed.

The app's What-if and Actions pages ask these; every answer is computed on the model the
pipeline published and the running jobs' ends its plan stage learned (`View.planned_ends`), so
a what-if start time and a served reservation rest on the same ends. Pure functions over the
model: the app never reaches the planner's modules itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from advisor.forecast.job_ends import outlook
from advisor.fragmentation import measures
from advisor.fragmentation.measures import Shape, check_models, parse_shape
from advisor.ingest.sources import SIM_LARGE_NODES, SourceError, seconds
from advisor.model import RESERVATION_QOS, ClusterModel
from advisor.planner.actions import Action, Cost, Plan, mig_switch_steps
from advisor.planner.check import CheckResult, apply_plan, check_plan
from advisor.planner.consolidate import Goal, parse_goal
from advisor.planner.constraints import Policy, PolicyError, load_policy
from advisor.planner.observed import DurationPrior, expected_end, now_of
from advisor.planner.recommend import RecommendSettings, recommend, recommend_with_notes
from advisor.planner.reserve import Outlook, Request, gpu_ready_times, plan_reservations
from advisor.planner.solve import EXACT_MAX_NODES
from advisor.planner.timing import with_windows
from advisor.planner.why import why_not_now
from advisor.settings import HORIZONS_H, Settings

__all__ = [
    "EXACT_MAX_NODES",
    "SIM_LARGE_NODES",
    "Action",
    "Cost",
    "Outcome",
    "Plan",
    "Policy",
    "PolicyError",
    "Shape",
    "SourceError",
    "WhatIf",
    "allocated_idle",
    "check_goal",
    "compare",
    "free_gpus_by_node",
    "goal_text",
    "gpu_states",
    "hours",
    "jobs_that_fit",
    "mig_switch_steps",
    "next_big_job",
    "now_of",
    "plan_from_doc",
    "plan_goals",
    "plan_goals_with_notes",
    "planned_states",
    "policy_from",
    "replay",
    "reserved_gpus",
    "seconds",
    "shape_from_text",
    "whatif",
    "windows",
]

WHATIF_JOB = "what-if"


def policy_from(path: str) -> Policy:
    """The policy file named in the page, or the default policy. PolicyError/OSError escape."""
    return load_policy(path) if path.strip() else Policy()


def shape_from_text(text: str) -> Shape:
    """`measures.parse_shape`, but a GPU model after `@` may contain spaces (real model
    names do: "NVIDIA A100-SXM4-80GB")."""
    size, sep, model = text.strip().partition("@")
    shape = parse_shape(size.strip())
    if sep and model.strip():
        return Shape(shape.num_gpu, shape.gpu_milli, shape.tasks, gpu_spec=model.strip())
    return shape


def jobs_that_fit(model: ClusterModel, shape: Shape) -> int:
    """Jobs of `shape` that could start now; ValueError when no GPU of the fleet is of the
    shape's model (a typo, not fragmentation)."""
    check_models(model, shape)
    return measures.jobs_that_fit(model, shape)


def allocated_idle(model: ClusterModel, settings: Settings) -> np.ndarray:
    """bool (G): allocated GPUs idle over the settings' window (the analysis' rule)."""
    return measures.allocated_idle(model, settings.measures.idle)


def gpu_states(model: ClusterModel, settings: Settings) -> np.ndarray:
    """int8 (G): each GPU's state code (`advisor.contract.GPU_STATE_CODES`), as /metrics
    serves them."""
    return measures.gpu_state_codes(model, allocated_idle(model, settings))


def planned_states(model: ClusterModel) -> np.ndarray:
    """int8 (G): state codes of a planned model: nothing observed, so no GPU is idle (every
    allocated GPU counts busy)."""
    return measures.gpu_state_codes(model, np.zeros(len(model.gpus), dtype=bool))


def reserved_gpus(model: ClusterModel) -> np.ndarray:
    """bool (G): GPUs a planned reservation holds (the room a plan made for its goal job)."""
    places = model.placements
    held = np.zeros(len(model.gpus), dtype=bool)
    held[places.gpu[model.allocations.qos[places.alloc] == RESERVATION_QOS]] = True
    return held


# --------------------------------------------------------------------------- goals and plans


def next_big_job(model: ClusterModel) -> Shape | None:
    """The smallest multi-node job of full nodes (K x G, G = GPUs per node) that cannot start
    now: the natural "which migrations let the next big job start" question. None if even the
    largest rack's worth fits."""
    width = int(model.nodes.gpu_count.max(initial=0))
    if width == 0:
        return None
    racks = pd.Series(model.nodes.rack).value_counts()
    most = int(racks.max()) if len(racks) else 1
    for tasks in range(1, max(most, 1) + 1):
        shape = Shape(width, tasks=tasks)
        if measures.jobs_that_fit(model, shape) == 0:
            return shape
    return None


def goal_text(shape: Shape) -> str:
    size = f"{shape.tasks}x{shape.num_gpu}" if shape.tasks > 1 else str(shape.num_gpu)
    return f"job={size}" + (f"@{shape.gpu_spec}" if shape.gpu_spec else "")


def check_goal(model: ClusterModel, text: str) -> Shape | None:
    """The goal's job shape (None for goals without one, e.g. `free-nodes=K`); ValueError for a
    malformed goal or a GPU model no GPU of the fleet is."""
    shape = parse_goal(text).shape
    if shape is not None:
        check_models(model, shape)
    return shape


def plan_goals(
    model: ClusterModel,
    settings: Settings,
    ends: Mapping[str, float],
    goals: Sequence[str] = (),
    exact: bool = False,
    others: bool = False,
    policy: Policy | None = None,
) -> list[Plan]:
    """`recommend()` for `goals` (consolidation; with `exact` the CP-SAT solver too on clusters
    of at most `EXACT_MAX_NODES` nodes, the cheaper checked plan kept) and, with `others`, every
    other kind, on the running jobs' ends `ends` ({allocation id: end}, the plan stage's)."""
    return plan_goals_with_notes(model, settings, ends, goals, exact, others, policy)[0]


def plan_goals_with_notes(
    model: ClusterModel,
    settings: Settings,
    ends: Mapping[str, float],
    goals: Sequence[str] = (),
    exact: bool = False,
    others: bool = False,
    policy: Policy | None = None,
) -> tuple[list[Plan], list[str]]:
    """`plan_goals`, and per kind that recommends nothing why, in numbers (the notes
    `gpu-defrag plan --goal recommend` and the service give)."""
    choice = RecommendSettings(exact=exact and len(model.nodes) <= EXACT_MAX_NODES, others=others)
    return recommend_with_notes(
        model, policy or settings.policy, outlook(ends), choice, [g.strip() for g in goals]
    )


def plan_from_doc(doc: Mapping[str, Any]) -> Plan:
    """A served plan (`documents.Plan`, dumped with its JSON names) as the planner's `Plan`."""
    return Plan.from_dict(dict(doc))


# --------------------------------------------------------------------------- selection


@dataclass(frozen=True)
class Outcome:
    """A selection of steps replayed: the check, the model after, and measures before/after."""

    check: CheckResult
    after: ClusterModel | None
    table: pd.DataFrame  # measure, before, after


def _goal_priority(plan: Plan) -> int | None:
    value = plan.extra.get("goal_priority")
    return int(value) if value is not None else None


def replay(
    model: ClusterModel,
    plan: Plan,
    steps: Sequence[int],
    policy: Policy,
    shapes: Sequence[Shape] = (),
) -> Outcome:
    """Check the chosen steps (1-based, in plan order) and, if they pass, apply them.

    `after` holds every chosen step (reserved GPUs are held by the goal job); the measures
    compare the cluster before with the cluster after the chosen moves but before the holds,
    since what a reservation holds is exactly the room the moves made for the goal job.
    """
    chosen = [plan.actions[i - 1] for i in sorted(steps)]
    result = check_plan(model, chosen, policy, _goal_priority(plan))
    if not result.ok:
        return Outcome(result, None, pd.DataFrame())
    after = apply_plan(model, chosen)
    moved = apply_plan(model, [a for a in chosen if a.kind != "reserve"])
    return Outcome(result, after, compare(model, moved, shapes))


def compare(
    before: ClusterModel, after: ClusterModel, shapes: Sequence[Shape] = ()
) -> pd.DataFrame:
    """Headline fragmentation measures and jobs per shape (defaults plus `shapes`)."""
    wanted = list(measures.DEFAULT_SHAPES) + [s for s in shapes if s not in measures.DEFAULT_SHAPES]
    settings = measures.Settings(shapes=tuple(wanted))
    a, b = measures.analyze(before, settings), measures.analyze(after, settings)

    def rows(result: dict[str, Any]) -> dict[str, float]:
        out: dict[str, float] = {
            "free GPUs": result["spatial"]["free_gpus"],
            "free whole nodes": int(
                (result["nodes"]["free_gpus"] == result["nodes"]["gpus"]).sum()
            ),
            "fragmentation rate (%)": round(100 * result["fgd"]["fragment_rate"], 1),
            "fragmented GPUs": round(result["fgd"]["fragment_gpus"], 2),
            "largest job on one node": result["spatial"]["largest_job"]["single_node_gpus"],
        }
        for shape in result["spatial"]["shapes"]:
            out[f"jobs of {shape['shape']} that fit"] = shape["jobs_that_fit"]
        return out

    before_rows, after_rows = rows(a), rows(b)
    return pd.DataFrame(
        {
            "measure": list(before_rows),
            "before": [float(v) for v in before_rows.values()],
            "after": [float(after_rows[k]) for k in before_rows],
        }
    )


# --------------------------------------------------------------------------- what-if


@dataclass(frozen=True)
class WhatIf:
    shape: Shape
    fits_now: int  # jobs of the shape that could start now
    plan: Plan | None  # cheapest checked plan to make room now (None when it fits)
    wait: Plan | None  # reservation: when it fits without moving anything (None when it fits)
    # per GPU model where a job that fits now spans NVLink islands: the slowdown estimate
    # (`measures.crossing`, what `analyze` prints too)
    crossing: tuple[dict[str, Any], ...] = ()
    why_not: str = ""  # why it cannot start now, in numbers (`planner.why.why_not_now`)


def whatif(
    model: ClusterModel,
    settings: Settings,
    num_gpu: int,
    nodes: int,
    gpu_model: str = "",
    tenant: str = "",
    exact: bool = False,
    job_end: Mapping[str, float] | Callable[[], Mapping[str, float]] | None = None,
) -> WhatIf:
    """Can a job of `nodes` x `num_gpu` GPUs on `gpu_model` start now; if not, the cheapest
    plan to make room, and when it would start without moving anything: on the running jobs'
    ends in `job_end` ({allocation id: end}, the plan stage's learned ends, as the served
    reservations use them), the planner's fallback for every allocation it leaves out. A
    callable `job_end` is called only then."""
    shape = Shape(num_gpu, tasks=nodes, gpu_spec=gpu_model)
    fits = measures.jobs_that_fit(model, shape)
    if fits > 0:
        return WhatIf(shape, fits, None, None, tuple(measures.crossing(model, shape)))
    size = f"{nodes}x{num_gpu}" if nodes > 1 else str(num_gpu)
    goal = Goal(
        f"job={size}" + (f"@{gpu_model}" if gpu_model else ""), "job", shape=shape, tenant=tenant
    )
    ends = dict((job_end() if callable(job_end) else job_end) or {})
    plan = recommend(
        model,
        settings.policy,
        None,
        RecommendSettings(exact=exact and len(model.nodes) <= EXACT_MAX_NODES, others=False),
        [goal],
    )[0]
    request = Request(WHATIF_JOB, tenant, None, nodes, num_gpu, gpu_model)
    waits = plan_reservations(model, settings.policy, [request], Outlook(job_end=ends))
    why = why_not_now(model, shape)
    return WhatIf(shape, fits, plan, waits[0] if waits else None, why_not=why)


def hours(seconds: float) -> str:
    if math.isinf(seconds):
        return "never"
    return f"{seconds / 3600:.1f} h"


# --------------------------------------------------------------------------- free GPUs


def free_gpus_by_node(
    model: ClusterModel, ends: Mapping[str, float], hours: Sequence[int] = HORIZONS_H
) -> pd.DataFrame:
    """Per node: GPUs free now (in the current snapshot, unlike the idle windows' last complete
    hour) and predicted free within each of `hours` hours without moving anything, from the
    running jobs' ends `ends` ({allocation id: end}, the plan stage's learned ends; the
    planner's fallback for every allocation it leaves out)."""
    ready = gpu_ready_times(model, expected_end(model, DurationPrior(), ends))
    now = now_of(model)
    nodes = model.nodes
    columns: dict[str, Any] = {
        "node": nodes.name,
        "pool": nodes.pool,
        "GPUs": nodes.gpu_count,
        "free now": np.bincount(
            model.gpus.node, weights=(ready <= now).astype(float), minlength=len(nodes)
        ).astype(int),
    }
    for h in hours:
        free = (ready <= now + h * 3600.0).astype(float)
        columns[f"free within {h} h"] = np.bincount(
            model.gpus.node, weights=free, minlength=len(nodes)
        ).astype(int)
    return pd.DataFrame(columns)


def windows(
    plans: Sequence[Plan], forecast: Mapping[str, Any] | None, model: ClusterModel
) -> list[dict[str, Any]]:
    """The plans as documents, each that acts with its window (`advisor.planner.timing`): now,
    or the served forecast's low-demand hour where its moves and holds cost least."""
    return with_windows({"plans": [p.to_dict() for p in plans]}, forecast, model)["plans"]
