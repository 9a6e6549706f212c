"""`gpu-defrag plan SOURCE --goal GOAL`: the checked consolidation plan, as a table or JSON.

    gpu-defrag plan examples/seed-16x8-a100.json --goal job=8x8
    gpu-defrag plan sim:a100-16x8 --goal free-nodes=6 --json
    gpu-defrag plan snapshot.json --goal forecast=6h --demand demand.json
    gpu-defrag plan examples/seed-quota-borrow.json --goal borrow=rnd-pretrain \
        --policy examples/policy-borrow.yaml
    gpu-defrag plan examples/seed-mixed-fleet.json --goal recommend

Goals recommend, reclaim, share, rebalance, reserve[=JOB] and borrow=... run the other
recommendation kinds (`advisor.planner.recommend`); several plans print one after another.

`--solver best` (default) runs the heuristic and, on clusters up to `--exact-max-nodes`, the
exact solver too, returns the cheaper checked plan and reports the heuristic's gap to the exact
optimum. A flag that only some goals read lists them in its help, and with any other goal it
is refused before the source is read (exit 2): `--tenant` with `--goal recommend` is an error,
not a recommendation scoped to that tenant.
Exit status: 0 a plan was found, 1 the goal cannot be reached, 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from advisor.fragmentation.measures import Shape, check_models, parse_shape
from advisor.model import ClusterModel
from advisor.planner.actions import CostWeights, GpuSet, Plan
from advisor.planner.consolidate import GOAL_KINDS, Goal, parse_goal
from advisor.planner.constraints import PolicyError, load_policy
from advisor.planner.policy_merge import merge_lines, merged_policy
from advisor.planner.solve import EXACT_MAX_NODES, solve
from advisor.snapshot import JsonFileError, read_json, repeated_key
from gpu_defrag_common.messages import say_error
from gpu_defrag_common.progress import Progress, add_quiet_flag
from gpu_defrag_common.units import fraction, number, positive_duration

# The flags that only some goals read, per goal (the goal is --goal up to its "="): the one place
# that knows which goal reads which flag. A flag in no row (SOURCE, --goal, --json, --policy)
# applies to every goal; one in some rows, given on the command line with a goal whose row lacks
# it, is refused. free-nodes reads --demand only for its before/after measures: the demand's
# shapes join the jobs-that-fit counts (the plan itself is the same).
_CONSOLIDATION_FLAGS = (
    "--solver",
    "--time-limit",
    "--workers",
    "--exact-max-nodes",
    "--priority",
    "--tenant",
)
_DEMAND_FLAGS = ("--demand", "--demand-model", "--demand-quantile")
GOAL_FLAGS: dict[str, tuple[str, ...]] = {
    "job": _CONSOLIDATION_FLAGS,
    "free-nodes": _CONSOLIDATION_FLAGS + _DEMAND_FLAGS,
    "forecast": _CONSOLIDATION_FLAGS + _DEMAND_FLAGS,
    # recommendation kinds (advisor.planner.recommend.GOALS): the model and the policy only
    **dict.fromkeys(("recommend", "reclaim", "share", "rebalance", "reserve", "borrow"), ()),
}
GIVEN = "plan_flags_given"  # the namespace attribute: goal-scoped flags on the command line


def goals_reading(flag: str) -> list[str]:
    """The goals whose row in `GOAL_FLAGS` names `flag` (none: it applies to every goal)."""
    return [goal for goal, flags in GOAL_FLAGS.items() if flag in flags]


class _Given(argparse.Action):
    """Stores the value, as `store` does, and notes the flag in `GIVEN`: argparse calls an
    action only for a flag on the command line, so a default is never taken for a choice and a
    default value given explicitly (`--tenant ""`) still counts as given."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, values)
        given = getattr(namespace, GIVEN, ())
        flag = self.option_strings[-1]
        if flag not in given:
            setattr(namespace, GIVEN, (*given, flag))


def _add_flag(parser: argparse.ArgumentParser, flag: str, **kwargs: Any) -> None:
    """`parser.add_argument(flag, ...)`; a flag that only some goals read records its use and
    says in its help which goals read it."""
    goals = goals_reading(flag)
    if goals:
        kwargs["action"] = _Given
        kwargs["help"] = f"{kwargs['help']} [goals: {', '.join(goals)}]"
    parser.add_argument(flag, **kwargs)


def refused_flag(args: argparse.Namespace) -> str | None:
    """The error for the first flag on the command line that `--goal` does not read, or that
    the other flags leave unread (`FLAG_NEEDS`), or None (an unknown goal is left to the goal's
    own error)."""
    goal = args.goal.strip()
    key = goal.partition("=")[0].strip()
    if key not in GOAL_FLAGS:
        return None
    for flag in getattr(args, GIVEN, ()):
        if flag not in GOAL_FLAGS[key]:
            goals = ", ".join(goals_reading(flag))
            return f"{flag} does not apply to --goal {goal} (it applies to: {goals})"
        if flag in FLAG_NEEDS:
            reads, needs = FLAG_NEEDS[flag]
            if not reads(args):
                return f"{flag} is not read {needs}"
    return None


def is_history(path: str) -> bool:
    """A `--demand` that is an arrival history to forecast (else a JSON of jobs per shape)."""
    return Path(path).suffix.lower() in (".csv", ".parquet", ".pq")


def _forecasts_demand(args: argparse.Namespace) -> bool:
    return bool(args.demand) and is_history(args.demand)


# Flags a goal reads only with certain other flags: flag -> (read?, the condition in words).
# The exact solver runs with --solver exact, or best below --exact-max-nodes nodes.
FLAG_NEEDS: dict[str, tuple[Callable[[argparse.Namespace], bool], str]] = {
    "--time-limit": (lambda a: a.solver != "heuristic", "with --solver heuristic"),
    "--workers": (lambda a: a.solver != "heuristic", "with --solver heuristic"),
    "--exact-max-nodes": (
        lambda a: a.solver == "best",
        "unless --solver is best (it caps the nodes best gives the exact solver)",
    ),
    "--demand-model": (
        _forecasts_demand,
        "unless --demand is an arrival history (CSV/Parquet) to forecast",
    ),
    "--demand-quantile": (
        _forecasts_demand,
        "unless --demand is an arrival history (CSV/Parquet) to forecast",
    ),
}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("source", help="snapshot file, exporter/Prometheus URL, or sim:PRESET")
    parser.add_argument(
        "--goal",
        required=True,
        help="job=KxG | job=G[@MODEL] | free-nodes=K | forecast=6h | recommend | reclaim | "
        "share | rebalance | reserve[=JOB] | borrow=JOB | borrow=TENANT:GPUS[:PRIORITY]",
    )
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    add_quiet_flag(parser)
    _add_flag(
        parser,
        "--solver",
        choices=("best", "heuristic", "exact"),
        default="best",
        help="default: best",
    )
    _add_flag(
        parser,
        "--time-limit",
        type=positive_duration,
        default=10.0,
        help="exact solver time: seconds, or a duration like 30s or 2m (default 10)",
    )
    _add_flag(parser, "--workers", type=number(1, kind=int), default=1, help="exact solver threads")
    _add_flag(
        parser,
        "--exact-max-nodes",
        type=number(0, kind=int),
        default=EXACT_MAX_NODES,
        help="run the exact solver next to the heuristic on clusters up to this many nodes",
    )
    _add_flag(
        parser,
        "--priority",
        type=int,
        default=None,
        help="priority of the goal's work; work above it is never moved (default: highest)",
    )
    _add_flag(parser, "--tenant", default="", help="tenant the goal job runs as (quotas)")
    _add_flag(parser, "--policy", help="YAML/JSON policy: quotas, restart time, locality")
    _add_flag(
        parser,
        "--demand",
        help="demand for forecast=H (for free-nodes=K: more shapes to measure before/after): "
        'JSON {"8": 2, "2x8": 1} (shape: jobs), or a CSV/Parquet arrival history (time, '
        "series=shape, value=jobs per step) to forecast H ahead",
    )
    _add_flag(
        parser,
        "--demand-model",
        default="same_hour_mean_7d",
        help="forecaster for a demand history (advisor.forecast model name, or advisor)",
    )
    _add_flag(
        parser,
        "--demand-quantile",
        type=fraction,
        default=0.5,
        help="forecast quantile of arrivals",
    )
    parser.set_defaults(func=run)


def load_demand(
    path: str,
    horizon_s: float = 0.0,
    model: str = "same_hour_mean_7d",
    quantile: float = 0.5,
    capacity_gpus: float = math.inf,
) -> list[Shape]:
    """Shapes from a JSON mapping shape -> number of jobs, or forecast from an arrival history
    (CSV/Parquet); ValueError names the bad entry, or a shape with more jobs than
    `capacity_gpus` GPUs could ever hold (the list would only grow, never plan)."""
    if is_history(path):
        return demand_from_history(path, horizon_s, model, quantile, capacity_gpus)
    try:
        doc = read_json(path)
    except OSError as error:
        raise ValueError(f"{path}: cannot read demand: {error.strerror or error}") from None
    except JsonFileError as error:
        raise ValueError(f"{path}: cannot read demand: {error}") from None
    if not isinstance(doc, dict):
        raise ValueError(f'{path}: expected a JSON object like {{"8": 2}}')
    if repeated_key(doc) is not None:
        raise ValueError(f"{path}: {repeated_key(doc)}: shape given twice (only one may stay)")
    shapes: list[Shape] = []
    for key, count in doc.items():
        if isinstance(count, float) and count.is_integer():  # 2.0 or 1e3: a whole number
            count = int(count)
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"{path}: {key}: expected a whole number of jobs, got {count!r}")
        try:
            shape = parse_shape(str(key))
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None
        shapes += _jobs(shape, count, capacity_gpus, path)
    return shapes


def _jobs(shape: Shape, count: int, capacity_gpus: float, path: str) -> list[Shape]:
    """`count` jobs of `shape`; ValueError when even an empty cluster of `capacity_gpus` GPUs
    holds fewer, so an absurd count is refused before it is expanded into a list."""
    most = math.floor(capacity_gpus / shape.gpus + 1e-9) if math.isfinite(capacity_gpus) else count
    if count > most:
        raise ValueError(
            f"{path}: {count} jobs of shape {shape.name}: the cluster's {capacity_gpus:g} GPUs "
            f"hold at most {most}"
        )
    return [shape] * count


def demand_from_history(
    path: str,
    horizon_s: float,
    model: str = "same_hour_mean_7d",
    quantile: float = 0.5,
    capacity_gpus: float = math.inf,
) -> list[Shape]:
    """Jobs per shape expected within `horizon_s`: the forecast `quantile` of arrivals per step
    (series named by shape, e.g. 8 or 2x8), summed over the steps of the horizon, rounded up."""
    from advisor.forecast.api import forecast
    from advisor.forecast.readers.long import read_long

    try:
        panel = read_long(path)
    except (OSError, ValueError) as error:
        raise ValueError(f"{path}: cannot read demand history: {error}") from None
    if len(panel.index) < 2:
        raise ValueError(f"{path}: a demand history needs at least two time steps")
    step_s = (panel.index[1] - panel.index[0]).total_seconds()
    steps = max(1, math.ceil(horizon_s / step_s))
    try:
        table = forecast(panel, horizons=range(1, steps + 1), quantiles=(quantile,), model=model)
    except Exception as error:  # a forecaster failing on this history is an input problem
        raise ValueError(f"{path}: forecast with {model!r} failed: {error}") from None
    column = f"q{quantile:g}"
    shapes: list[Shape] = []
    for series, total in table.groupby("series")[column].sum().items():
        count = math.ceil(max(0.0, float(total)) - 1e-9)
        try:
            shape = parse_shape(str(series))
        except ValueError as error:  # a series of a demand history names a job shape
            raise ValueError(f"{path}: series {str(series)!r}: {error}") from None
        shapes += _jobs(shape, count, capacity_gpus, path)
    return shapes


def _gpus(doc: dict | None) -> str:
    return str(GpuSet.from_dict(doc)) if doc else "-"


def _quota(doc: dict, sign: int) -> str:
    """A borrow action's lenders (`sign` -1) or borrower (+1): 'algorithms quota -10'."""
    parts = [
        f"{tenant}{f' {scope}' if scope else ''} quota {delta:+g}"
        for tenant, scope, delta in doc["quota"]
        if delta * sign > 0
    ]
    return ", ".join(parts) or "-"


def render_table(plan: Plan) -> str:
    """The plan as text: a header, one row per action (a borrow's row: the job, the quota
    lent and the quota taken), the cost and what changes; `goal priority` only for the goals
    that have one (the consolidation goals: job, free-nodes, forecast)."""
    doc = plan.to_dict()
    method = f"method: {plan.method}   " if plan.method else ""
    lines = [f"goal: {plan.goal}   {method}feasible: {plan.feasible}"]
    if not plan.feasible:
        lines.append(f"why: {plan.reason}")
    rows = [("#", "kind", "task", "from", "to", "restart s", "GPU-h lost")]
    for i, action in enumerate(doc["actions"], start=1):
        cost = action["cost"]
        loan = action["kind"] == "borrow"
        rows.append(
            (
                str(i),
                action["kind"],
                action["job"] if loan else action["alloc"],
                _quota(action, -1) if loan else _gpus(action["from"]),
                _quota(action, +1) if loan else _gpus(action["to"]),
                f"{cost['restart_s']:g}" if cost["restarts"] else "-",
                f"{cost['gpu_hours']:.3f}" if cost["restarts"] else "-",
            )
        )
    if len(rows) > 1:
        widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
        for row in rows:
            lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))
    cost = plan.cost
    if plan.feasible:
        lines.append(
            f"cost: {cost.restarts} restarts, {cost.restart_s:g} s restart time, "
            f"{cost.gpu_hours:.3f} GPU-hours lost"
            + (f", {cost.idle_gpu_hours:.3f} GPU-hours held idle" if cost.idle_gpu_hours else "")
            + f"; jobs touched {len(cost.jobs)}, "
            f"tenants touched {len(cost.tenants)} ({', '.join(cost.tenants) or '-'})"
        )
    before, after = doc["before"], doc["after"]
    for key in ("free_gpus", "free_nodes", "largest_free_nvlink_group", "fgd_fragment_gpus"):
        if key in before:
            was, now = (("unknown" if v is None else v) for v in (before[key], after.get(key)))
            lines.append(f"{key}: {was} -> {now}")
    if doc.get("benefit"):
        benefit = doc["benefit"]
        lines.append(f"newly schedulable shapes: {', '.join(benefit['newly_schedulable']) or '-'}")
        lines.append(f"shapes with more room: {', '.join(benefit['more_jobs_fit']) or '-'}")
    comparison = doc.get("comparison")
    if comparison:
        gap = comparison.get("heuristic_gap")
        heuristic, exact = (
            "-" if cost is None else f"{cost:.3f}"
            for cost in (comparison["heuristic_cost"], comparison["exact_cost"])
        )
        w = CostWeights()
        lines.append(
            f"objective (restarts x {w.migration:g} + GPU-hours lost x {w.gpu_hour:g}): heuristic "
            f"{heuristic}, exact {exact} ({comparison['exact_status']})"
            + (f", heuristic/exact = {gap:.3f}" if gap else "")
        )
    elif doc.get("exact"):
        lines.append(doc["exact"])
    if doc.get("goal_priority") is not None:
        lines.append(f"goal priority: {doc['goal_priority']} (work above it is never moved)")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from advisor.ingest.sources import load_source
    from advisor.planner.recommend import GOALS

    refused = refused_flag(args)
    if refused:  # before the source is read: a flag the goal ignores is no plan for it
        say_error("plan", refused)
        return 2
    key = args.goal.partition("=")[0].strip()
    if key in GOALS:  # recommendation kinds (recommend.py)
        return _run_recommendation(args)
    if key not in GOAL_KINDS:
        say_error(
            "plan",
            f"bad goal {args.goal!r}: unknown goal {key!r} (job=8x8, job=4, "
            "free-nodes=8, forecast=6h, recommend, reclaim, share, rebalance, reserve[=JOB] or "
            "borrow=JOB|TENANT:GPUS)",
        )
        return 2
    try:
        goal = parse_goal(args.goal, priority=args.priority, tenant=args.tenant)
        check_forecast_goal(goal, args.demand)
        file_policy = load_policy(args.policy) if args.policy else None
        model = load_source(args.source)
        policy = merged_policy(file_policy, model)  # a scheduler's quotas under the file's
        quota_lines = merge_lines(file_policy, model, args.policy)
        if goal.shape is not None:
            check_models(model, goal.shape)
        demand = (
            load_demand(
                args.demand,
                goal.horizon_s,
                args.demand_model,
                args.demand_quantile,
                capacity_gpus=len(model.gpus),
            )
            if args.demand
            else None
        )
    except (ValueError, PolicyError) as error:
        say_error("plan", str(error))
        return 2
    # the exact solver (seconds to minutes) is the long part: only it shows progress
    exact = args.solver == "exact" or (
        args.solver == "best" and len(model.nodes) <= args.exact_max_nodes
    )
    nodes = len(model.nodes)
    quiet = args.quiet or not exact
    with Progress("plan", f"exact solver on {nodes} nodes", quiet=quiet) as progress:
        plan = solve(
            model,
            goal,
            policy,
            args.solver,
            args.time_limit,
            args.exact_max_nodes,
            demand,
            workers=args.workers,
        )
        found = "a plan" if plan.feasible else "no plan"
        progress.done(f"{found} for {goal.text} ({args.solver} solver, {nodes} nodes)")
        [doc] = windowed([plan], model)
        if args.json:
            if quota_lines:
                doc["quotas"] = quota_lines
            print(json.dumps(doc, indent=2, default=_jsonable))
        else:
            quotas = "\n\n" + "\n".join(quota_lines) if quota_lines else ""
            print(render_table(plan) + when_line(doc) + quotas)
        sys.stdout.flush()  # a full disk fails here, before the closing line
    return 0 if plan.feasible else 1


def windowed(plans: list[Plan], model: ClusterModel) -> list[dict[str, Any]]:
    """The plans as documents, each that acts with its window (`advisor.planner.timing`): this
    command reads no history, so no demand forecast says a later hour is cheaper: now."""
    from advisor.planner.timing import with_windows

    return with_windows({"plans": [p.to_dict() for p in plans]}, None, model)["plans"]


def when_line(doc: dict[str, Any]) -> str:
    window = doc.get("window")
    return f"\nwhen: {window['reason']}" if window else ""


def check_forecast_goal(goal: Goal, demand: str | None) -> None:
    """A forecast goal plans for demand the user gives: with none, or a zero horizon, the
    input is incomplete (exit 2), not a goal the cluster cannot reach (exit 1)."""
    if goal.kind != "forecast":
        return
    if goal.horizon_s <= 0:
        raise ValueError(f"bad goal {goal.text!r}: the forecast horizon must be above zero")
    if not demand:
        raise ValueError(
            f"--goal {goal.text} needs --demand: a JSON of jobs per shape or an arrival history"
        )


def check_reserve_job(model: ClusterModel, goal: str) -> None:
    """`reserve=JOB` names a job of the model; an unknown one is bad input, as for borrow."""
    key, _, job = goal.partition("=")
    job = job.strip()
    if key.strip() == "reserve" and job and job not in set(model.allocations.job.tolist()):
        raise ValueError(f"no job {job!r} in the model")


def _run_recommendation(args: argparse.Namespace) -> int:
    """`--goal` recommend, reclaim, share, rebalance, reserve[=JOB] or borrow=...: the plans
    one after another; 2 for bad input, 1 when any plan is infeasible."""
    from advisor.ingest.sources import load_source
    from advisor.planner.recommend import (
        nothing_recommended,
        plan_for_goal,
        recommend_with_notes,
        render_notes,
    )

    notes: list[str] = []
    try:
        file_policy = load_policy(args.policy) if args.policy else None
        model = load_source(args.source)
        policy = merged_policy(file_policy, model)  # a scheduler's quotas under the file's
        quota_lines = merge_lines(file_policy, model, args.policy)
        check_reserve_job(model, args.goal)
        if args.goal.partition("=")[0].strip() == "recommend":
            plans, notes = recommend_with_notes(model, policy)
        else:
            plans = plan_for_goal(model, policy, args.goal) or []
    except (ValueError, PolicyError) as error:
        say_error("plan", str(error))
        return 2
    docs = windowed(plans, model)
    if args.json:
        print(json.dumps(docs[0] if len(docs) == 1 else docs, indent=2, default=_jsonable))
    elif not plans:  # recommend, when no kind has anything: one line saying why
        print(nothing_recommended(notes))
    else:
        print(
            "\n\n".join(
                render_table(p) + "\n" + render_notes(p) + when_line(d)
                for p, d in zip(plans, docs, strict=True)
            )
        )
    if quota_lines and not args.json:
        print("\n" + "\n".join(quota_lines))
    return 0 if all(p.feasible for p in plans) else 1


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
