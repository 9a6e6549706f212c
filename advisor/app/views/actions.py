"""Actions: the planner's checked recommendations; select steps, see before/after, export."""

from __future__ import annotations

import streamlit as st

from advisor.app import data, figures, forecasts, plans
from advisor.fragmentation import measures
from advisor.planner.consolidate import parse_goal
from advisor.planner.constraints import PolicyError

state = data.current()
model = state.model

st.title("Actions")
st.caption(
    "The planner's recommendations for this cluster, each replayed step by step on the model "
    "before it is shown (no GPU oversubscribed; GPU model, quotas, priority, NVLink/rack "
    "locality and the migratable flag respected). **The app never executes an action**: "
    "export the selection and run it yourself."
)

left, right = st.columns(2)
next_job = plans.next_big_job(model)
goal = left.text_input(
    "Migrations: make room for",
    value=plans.goal_text(next_job) if next_job else "",
    key="actions_goal",
    help="job=KxG (K nodes x G GPUs in one rack), job=G or job=G@MODEL, free-nodes=K. "
    "The default is the smallest whole-node job that cannot start now. Empty: no migrations.",
)
policy_path = right.text_input(
    "Policy file (optional)",
    key="actions_policy",
    placeholder="examples/policy-quotas.yaml",
    help="YAML/JSON: tenant quotas, borrowing rules, restart time, locality.",
)

exact = st.checkbox(
    "Also run the exact solver (CP-SAT, up to 5 s; clusters of at most "
    f"{plans.EXACT_MAX_NODES} nodes) and keep the cheaper plan",
    key="actions_exact",
)
others = st.checkbox(
    "Also look for reservations, quota loans, reclaims, sharing and rebalancing",
    value=len(model.nodes) <= plans.OTHER_KINDS_MAX_NODES,
    key="actions_others",
    help=f"On by default up to {plans.OTHER_KINDS_MAX_NODES} nodes: on trace-sized clusters "
    "with thousands of waiting tasks this search can take tens of seconds.",
)
try:
    policy = plans.policy_from(policy_path)
    shapes = [parse_goal(goal).shape] if goal.strip() else []
    for shape in shapes:
        if shape is not None:
            measures.check_models(model, shape)
    ends = data.job_ends(state)[0] if others else {}
    recs, notes = state.cached(
        str(("plans", goal, policy_path, exact, others)),
        lambda: plans.recommendations_with_notes(model, policy, goal.strip(), exact, others, ends),
    )
except (PolicyError, OSError, ValueError) as error:
    st.error(f"Cannot plan: {error}", icon=":material/error:")
    st.stop()
shapes = [s for s in shapes if s is not None]

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
            else "the other kinds were not searched (see the checkbox above)."
        )
    )
    for note in notes:  # each kind's reason, in numbers
        st.caption(note)
    st.stop()

st.subheader("Recommendations")
st.dataframe(plans.plans_frame(recs), hide_index=True, key="plans_table")
forecast = state.cached("forecast", lambda: forecasts.forecast_doc(data.trend_history(state)))
when = plans.windows_frame(recs, forecast, model)
if not when.empty:
    st.markdown("**When to act**")
    st.dataframe(when, hide_index=True, key="windows_table")
    st.caption(
        "Now, or the forecast's low-demand hour where the plan's moves and held GPUs cost "
        "least: held GPU-hours weigh by the share of GPUs in demand then, and every hour a "
        "waiting job waits counts its GPUs (docs/recommendations.md, When to act)."
    )

actionable = [i for i, p in enumerate(recs) if p.feasible and p.actions]
choice = st.selectbox(
    "Plan",
    list(range(len(recs))),
    index=actionable[0] if actionable else 0,
    format_func=lambda i: plans.plan_label(i, recs[i]),
    key="actions_plan",
)
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
    key=f"actions_steps_{choice}_{goal}",
)
st.dataframe(frame, hide_index=True, key="steps_table")
if not steps:
    st.info("Select at least one step.")
    st.stop()

outcome = state.cached(
    str(("replay", goal, policy_path, exact, others, choice, tuple(sorted(steps)))),
    lambda: plans.replay(model, plan, steps, policy, shapes),
)
if not outcome.check.ok:
    st.error(
        f"These steps do not pass the check on their own: {outcome.check.violation}. "
        "Add the steps they depend on.",
        icon=":material/rule:",
    )
    st.stop()

chosen = [plan.actions[i - 1] for i in sorted(steps)]
cost = plans.Plan(plan.goal, True, tuple(chosen)).cost
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

st.subheader("Before and after")
st.dataframe(outcome.table, hide_index=True, key="compare_table")
st.caption(
    "Measures after the selected moves (reserved GPUs are the room made for the goal job, so "
    "they count as free here). Heatmaps: allocations as planned, GPUs held for the goal job "
    "in purple; no utilization is predicted, so nothing shows as idle."
)
before_col, after_col = st.columns(2)
before_frame = plans.planned_frame(model)
after_frame = plans.planned_frame(outcome.after)
with before_col:
    st.markdown("**Before**")
    st.plotly_chart(figures.fleet_heatmap(before_frame), key="before_heatmap")
with after_col:
    st.markdown("**After**")
    st.plotly_chart(figures.fleet_heatmap(after_frame), key="after_heatmap")

st.subheader("Export")
doc = plans.selection_doc(plan, steps, state.spec)
json_tab, yaml_tab, kubectl_tab, slurm_tab = st.tabs(["JSON", "YAML", "kubectl", "Slurm"])
exports = {
    "json": (json_tab, plans.to_json(doc), "json", "application/json"),
    "yaml": (yaml_tab, plans.to_yaml(doc), "yaml", "application/yaml"),
    "kubectl": (kubectl_tab, plans.kubectl_commands(chosen), "bash", "text/x-shellscript"),
    "slurm": (slurm_tab, plans.slurm_commands(chosen), "bash", "text/x-shellscript"),
}
for name, (tab, text, language, mime) in exports.items():
    with tab:
        st.download_button(
            f"Download {name}",
            text,
            file_name=f"gpu-defrag-plan.{'sh' if language == 'bash' else name}",
            mime=mime,
            key=f"download_{name}",
        )
        st.code(text, language=language)
