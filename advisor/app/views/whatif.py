"""What-if: can a job of N GPUs x M nodes on model X start now; if not, at what cost, or when?"""

from __future__ import annotations

import streamlit as st

from advisor.app import data, forecasts, plans
from advisor.pipeline import Settings
from advisor.pipeline import queries as Q
from advisor.settings import NO_TENANT

shown = data.current()
model = shown.model

st.title("What-if")
st.caption("Ask about one job before it is submitted. Nothing is changed or reserved.")
data.preview_note(shown)

width = int(model.nodes.gpu_count.max(initial=1)) or 1
cols = st.columns(4)
num_gpu = int(
    cols[0].number_input("GPUs per node", min_value=1, max_value=width, value=width, key="wi_gpus")
)
nodes = int(cols[1].number_input("Nodes", min_value=1, value=2, key="wi_nodes"))
models = sorted(set(model.nodes.gpu_model.tolist()) - {""})
gpu_model = cols[2].selectbox("GPU model", ["any", *models], key="wi_model")
tenant = cols[3].selectbox(
    "Tenant", [NO_TENANT, *data.tenants_of(data.fleet_frame(shown))], key="wi_tenant"
)

exact = st.checkbox(
    "Also run the exact solver for the plan (CP-SAT, up to 5 s) and keep the cheaper one",
    key="wi_exact",
)
answer = shown.cached(
    str(("whatif", num_gpu, nodes, gpu_model, tenant, exact)),
    lambda: Q.whatif(
        model,
        Settings(),
        num_gpu,
        nodes,
        "" if gpu_model == "any" else gpu_model,
        tenant="" if tenant == NO_TENANT else tenant,
        exact=exact,
        job_end=shown.planned_ends,  # the plan stage's learned ends, as its reservations'
    ),
)
job = f"{nodes} x {num_gpu} GPUs" + ("" if gpu_model == "any" else f" on {gpu_model}")

st.subheader("Can it start now?")
if answer.fits_now:
    st.success(
        f"Yes: {answer.fits_now} job(s) of {job} can start now without moving anything.",
        icon=":material/check_circle:",
    )
    for estimate in answer.crossing:  # larger than an NVLink island: it runs, slower
        st.info(f"On {estimate['gpu_model']} it {estimate['text']}.", icon=":material/speed:")
    st.stop()
st.warning(
    f"No: the free GPUs cannot hold {job}"
    + (" (its nodes must share one rack and GPU model)" if nodes > 1 else "")
    + f": {answer.why_not}.",
    icon=":material/block:",
)

st.subheader("Cheapest plan to start it now")
plan = answer.plan
if plan is None or not plan.feasible:
    st.warning(
        f"No checked plan makes room: {plan.reason if plan else 'no plan'}",
        icon=":material/block:",
    )
else:
    cost = plan.cost
    cols = st.columns(4)
    cols[0].metric("Migrations", plan.migrations)
    cols[1].metric("Restarts", cost.restarts)
    cols[2].metric("GPU-hours lost", f"{cost.gpu_hours:.2f}")
    cols[3].metric("Tenants touched", len(cost.tenants))
    st.dataframe(plans.actions_frame(plan), hide_index=True, key="whatif_plan")
    st.caption(f"Method: {plan.method}. Review and export such plans on the Actions page.")

st.subheader("When will it fit without moving anything?")
wait = answer.wait
if wait is None:
    st.info("The reservation planner found no waiting time to report.")
elif not wait.feasible:
    st.warning(f"Not without moving work: {wait.reason}", icon=":material/block:")
else:
    extra = wait.extra
    start = data.at_time(shown, extra["start_at"])
    st.metric("Starts in", Q.hours(extra["starts_in_s"]), help=f"at {start}")
    st.markdown(
        f"On **{', '.join(extra['nodes'])}**, at about {start}. Job ends come from "
        f"{forecasts.job_ends_text(shown.job_end_doc)}; holding the GPUs until then leaves "
        f"{extra['idle_gpu_hours']:.1f} GPU-hours idle (other jobs may backfill them)."
    )
