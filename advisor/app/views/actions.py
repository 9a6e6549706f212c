"""Actions: the advisor's checked plans (or plans for another goal); select steps, see
before/after, export."""

from __future__ import annotations

import streamlit as st

from advisor.app import data, figures, plans
from advisor.pipeline import Settings
from advisor.pipeline import queries as Q

OTHER_KINDS_MAX_NODES = 300  # recommend() can take tens of seconds on trace-sized clusters
shown = data.current()
model = shown.model

st.title("Actions")
st.caption(
    "The advisor's recommendations, each replayed step by step on the model before it is "
    "shown: migrations that let the next big job start, and every other kind the advisor "
    "found. **The app never executes an action**: export the selection and run it yourself.",
    help="The checker never oversubscribes a GPU and respects GPU model, quotas, priority, "
    "NVLink/rack locality and each job's migratable flag. Reservations plan on the running "
    "jobs' ends the advisor learned from the jobs it saw finish.",
)
data.preview_note(shown)

left, right = st.columns(2)
next_job = Q.next_big_job(model)
goal = left.text_input(
    "Migrations: make room for",
    value=Q.goal_text(next_job) if next_job else "",
    key="actions_goal",
    help="job=KxG (K nodes x G GPUs in one rack), job=G or job=G@MODEL, free-nodes=K. The "
    "default is the smallest whole-node job that cannot start now. Empty: the advisor's plans "
    "alone.",
)
policy_path = right.text_input(
    "Policy file (optional)",
    key="actions_policy",
    placeholder="examples/policy-quotas.yaml",
    help="YAML/JSON: tenant quotas, borrowing rules, restart time, locality. Given, every plan is "
    "made again here, on the same model and job ends, under this policy.",
)
exact = st.checkbox(
    "Also run the exact solver (CP-SAT, up to 5 s; clusters of at most "
    f"{Q.EXACT_MAX_NODES} nodes) and keep the cheaper plan",
    key="actions_exact",
)
others = st.checkbox(
    "Also show reservations, quota loans, reclaims, sharing and rebalancing",
    value=len(model.nodes) <= OTHER_KINDS_MAX_NODES,
    key="actions_others",
    help=f"On by default up to {OTHER_KINDS_MAX_NODES} nodes: with a policy file, on a "
    "trace-sized cluster with thousands of waiting tasks, this search can take tens of seconds.",
)
try:
    policy = Q.policy_from(policy_path)
    goal_shape = Q.check_goal(model, goal) if goal.strip() else None
    served = data.served_plans(shown)
    migrations = [p.goal for p in served if p.goal.startswith(("job=", "free-nodes="))]
    notes = list(shown.view.recommendations.notes) if others else []
    if policy_path.strip():  # every plan again, under this policy
        goals = list(dict.fromkeys([goal.strip()] * bool(goal.strip()) + migrations))
        recs, notes = shown.cached(
            str(("plans", goal, policy_path, exact, others)),
            lambda: Q.plan_goals_with_notes(
                model, Settings(policy=policy), shown.planned_ends, goals, exact, others
            ),
        )
    else:  # the goal's plan, then the advisor's own (those it served)
        mine = []
        if goal.strip() and (exact or goal.strip() not in migrations):
            mine = shown.cached(
                str(("plans", goal, exact)),
                lambda: Q.plan_goals(model, Settings(), shown.planned_ends, [goal], exact),
            )
        first = mine or [p for p in served if p.goal == goal.strip()]
        rest = [p for p in served if p.goal != goal.strip()]
        recs = first + [p for p in rest if others or p.goal in migrations]
except (Q.PolicyError, OSError, ValueError) as error:
    st.error(f"Cannot plan: {error}", icon=":material/error:")
    st.stop()
shapes = [goal_shape] if goal_shape is not None else []

if not recs:
    why = (
        "every whole-node job up to a full rack can start now, so no migration is needed"
        if next_job is None and not goal.strip()
        else "no migration goal given"
    )
    st.info(
        f"No recommendation for this cluster: {why}; "
        + (
            "nothing waiting that a reservation or a loan would help, no long-idle allocation "
            "to reclaim, nothing to share or rebalance."
            if others
            else "the other kinds are not shown (see the checkbox above)."
        )
    )
    for note in notes:  # each kind's reason, in numbers
        st.caption(note)
    st.stop()

st.subheader("Recommendations")
st.dataframe(plans.plans_frame(recs), hide_index=True, key="plans_table")
when = plans.windows_frame(recs, shown.forecast, model)  # the served forecast's low hours
if not when.empty:
    st.markdown("**When to act**")
    st.dataframe(when, hide_index=True, key="windows_table")
    st.caption(
        "Now, or the forecast's low-demand hour where the plan's moves and held GPUs cost "
        "least: held GPU-hours weigh by the share of GPUs in demand then, and every hour a "
        "waiting job waits counts its GPUs (docs/recommendations.md, When to act)."
    )

labels = [plans.plan_label(i, p) for i, p in enumerate(recs)]
actionable = [i for i, p in enumerate(recs) if p.feasible and p.actions]
label = st.selectbox(
    "Plan",
    labels,
    index=actionable[0] if actionable else 0,
    key=f"actions_plan_{plans.selection_key(recs)}",  # a new list is a new selector
)
choice = labels.index(label)
plan = recs[choice]
if not plan.feasible:
    st.warning(f"Not feasible: {plan.reason}", icon=":material/block:")
if not plan.actions:
    if plan.feasible and plan.reason:  # nothing to do, and why (in numbers)
        st.info(plan.reason)
    st.stop()

frame = plans.actions_frame(plan)
steps = st.multiselect(
    "Steps to review and export",
    frame["step"].tolist(),
    default=frame["step"].tolist(),
    key=f"actions_steps_{plans.selection_key(recs)}_{choice}",
)
st.dataframe(frame, hide_index=True, key="steps_table")
if not steps:
    st.info("Select at least one step.")
    st.stop()

replayed = (goal, policy_path, exact, others, plans.selection_key(recs), choice, sorted(steps))
outcome = shown.cached(
    str(("replay", *replayed)), lambda: Q.replay(model, plan, steps, policy, shapes)
)
if not outcome.check.ok:
    st.error(
        f"These steps do not pass the check on their own: {outcome.check.violation}. "
        "Add the steps they depend on.",
        icon=":material/rule:",
    )
    st.stop()

chosen = [plan.actions[i - 1] for i in sorted(steps)]
cost = plans.cost_of(chosen)
cols = st.columns(5)
cols[0].metric("Steps", len(chosen))
cols[1].metric("Restarts", cost.restarts)
cols[2].metric("GPU-hours lost", f"{cost.gpu_hours:.2f}", help="work lost to restarts")
cols[3].metric(
    "GPU-hours held idle",
    f"{cost.idle_gpu_hours:.2f}",
    help="free GPUs a reservation holds until its job starts: no work lost, no one else runs",
)
cols[4].metric("Jobs touched", len(cost.jobs))

st.subheader(
    "Before and after",
    help="Measures after the selected moves (reserved GPUs are the room made for the goal job, "
    "so they count as free here). Heatmaps: allocations as planned, GPUs held for the goal job "
    "in purple; no utilization is predicted, so nothing shows as idle.",
)
st.dataframe(outcome.table, hide_index=True, key="compare_table")
before_col, after_col = st.columns(2)
with before_col:
    st.markdown("**Before**")
    st.plotly_chart(figures.fleet_heatmap(plans.planned_frame(model)), key="before_heatmap")
with after_col:
    st.markdown("**After**")
    st.plotly_chart(figures.fleet_heatmap(plans.planned_frame(outcome.after)), key="after_heatmap")

st.subheader("Export")
texts = plans.exports(plan, steps, shown.spec)
for tab, (kind, text) in zip(
    st.tabs(["JSON", "YAML", "kubectl", "Slurm"]), texts.items(), strict=True
):
    _, language, mime = plans.EXPORTS[kind]
    with tab:
        st.download_button(
            f"Download {kind}",
            text,
            file_name=plans.export_name(plan.goal, kind),
            mime=mime,
            key=f"download_{kind}",
            on_click="ignore",  # a download is no reason to rerun the page (and its plans)
        )
        st.code(text, language=language)
