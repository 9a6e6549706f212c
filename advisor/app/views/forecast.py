"""Forecast: demand per pool with its interval, next to its backtest error against the
seasonal-naive baseline and naive; idle GPUs that stay free for the next W hours, per pool and per node,
with their held-back violations and capture; predicted free GPUs per node, on the job ends
learned from the jobs the history saw finish."""

from __future__ import annotations

import streamlit as st

from advisor.app import data, figures, forecasts


def percent_columns(*names: str) -> dict[str, st.column_config.NumberColumn]:
    """The ratio columns of a table (WAPE, coverage, violations, capture) shown as percents."""
    return {name: st.column_config.NumberColumn(format="percent") for name in names}


state = data.current()

st.title("Forecast")
st.caption(
    "Demand = GPUs allocated per pool, hourly, from this source's history. Every forecast is "
    "shown with its error on held-back hours of a rolling-origin backtest, next to the "
    "seasonal-naive (same hour yesterday) baseline's and naive's (last hour's value) errors; a "
    "horizon without enough history shows no number."
)

history = data.trend_history(state)
if state.spec.startswith("sim:") and data.sim_history_plan(len(state.model.nodes))[1] > 3600:
    st.info(
        f"The simulated past of fleets above {data.SIM_LARGE_NODES} nodes is stepped 4-hourly "
        "(each instant costs about a second to build); forecasts are backtested on hourly "
        "points only. Use a smaller preset size or a live source."
    )
    st.stop()
doc = state.cached("forecast", lambda: forecasts.forecast_doc(history))
table = forecasts.horizons_frame(doc)

st.subheader("Demand per pool")
if table.empty:
    if state.live:
        where = (
            "Prometheus held no more of this source's past."
            if state.spec.startswith("prometheus+")
            else "An exporter keeps no past: a `prometheus+http://…` source gives the app its "
            "last week at start, and a simulated week (e.g. `sim:a100-16x8?t=7d`) shows the "
            "forecasts now."
        )
        st.info(
            f"Collecting history: {doc['history_hours']} complete hour(s) so far, one point per "
            "refresh. Forecasts appear once each horizon has enough hours for a backtest. " + where
        )
    elif not len(history):
        st.info(
            "This source is a single instant, so there is no history to forecast from. Pick a "
            "simulated time of a few days (e.g. `sim:a100-16x8?t=7d`) or a live source."
        )
    else:
        st.info(f"No forecast yet: history of {doc['history_hours']} complete hour(s).")
else:
    st.plotly_chart(
        figures.forecast_figure(forecasts.hourly_demand(history), table),
        key="forecast_fig",
        config={"displaylogo": False},
    )
    st.dataframe(
        table,
        hide_index=True,
        key="forecast_table",
        column_config=percent_columns(
            "backtest WAPE",
            f"{doc['baseline']} WAPE",
            f"{forecasts.NAIVE} WAPE",
            "q0.9 coverage",
            f"{doc['baseline']} q0.9 coverage",
        ),
    )
    st.caption(
        f"From the last complete hour ({doc['origin']}), {doc['history_hours']} hours of "
        "history. WAPE = sum of absolute errors / sum of actuals over the held-back origins; "
        "the model was chosen on the earlier origins only, so it can lose to naive there (shown, "
        "not used to choose). Interval: 10th to 90th percentile, blank while the model has too "
        "few known errors; q0.9 coverage = share of held-back hours at or below the 90th "
        "percentile (a calibrated interval covers about 90 %), over the held-back hours that "
        "had an interval (coverage hours), blank when too few did."
    )
for reason in forecasts.missing_reasons(doc):
    st.caption(f"No forecast for {reason}.")
for reason in forecasts.interval_reasons(doc):
    st.caption(f"No interval for {reason}.")

tenants = doc.get("tenants") or {}
tenant_table = forecasts.tenants_frame(doc)
if not tenant_table.empty:
    st.subheader("Demand per tenant")
    st.dataframe(
        tenant_table,
        hide_index=True,
        key="tenant_table",
        column_config=percent_columns(
            "backtest WAPE",
            f"{tenants['baseline']} WAPE",
            f"{forecasts.NAIVE} WAPE",
            "q0.9 coverage",
            f"{tenants['baseline']} q0.9 coverage",
        ),
    )
    st.caption(
        f"GPUs held by each tenant's running allocations (held: the last complete hour's mean): "
        f"the {len(tenants['tenants'])} of {tenants['tenants_total']} tenants holding the most "
        "at the latest run, forecast and backtested as the pools are. Tenants have quotas, not "
        "GPUs of their own: nothing to clip to."
    )
elif tenants.get("error"):
    st.caption(f"No forecast per tenant: {tenants['error']}")

st.subheader("Idle GPUs that stay free")
idle = doc.get("idle") or {}
idle_table = forecasts.idle_frame(doc)
if idle_table.empty:
    st.info(
        f"No idle-window forecast yet: {idle.get('history_hours', 0)} complete hour(s) of "
        "history; each window needs enough hours to hold some back for its backtest."
    )
else:
    baseline = idle["baseline"]
    st.dataframe(
        idle_table,
        hide_index=True,
        key="idle_table",
        column_config=percent_columns(
            "backtest violations",
            "backtest capture",
            f"{baseline} violations",
            f"{baseline} capture",
        ),
    )
    st.caption(
        f"GPUs of each pool that stay free for the whole window starting {idle['valid_from']}, "
        f"released for a target risk of {idle['risk']:.0%} of being wrong (idle in an hour = "
        "capacity − the hour's peak of GPUs with anything allocated on them; the idle column "
        "is the last complete hour's). "
        "The target is not a measurement: the measured rate is the backtest violations beside "
        "it = share of held-back hours in which the release exceeded what stayed free, which "
        "can be above the target; capture = share of the GPUs that stayed free that it "
        f"released; `{baseline}` releases what was free over the past window. For "
        "reservations and for choosing when to defragment."
    )
for reason in forecasts.idle_missing_reasons(doc):
    st.caption(f"No idle-window release for {reason}.")

nodes_table = forecasts.idle_nodes_frame(doc)
if not nodes_table.empty:
    first = idle["windows"][0]
    st.markdown("**Per node**")
    st.dataframe(
        nodes_table,
        hide_index=True,
        key="idle_nodes_table",
        column_config=percent_columns(f"{first} backtest violations", f"{first} backtest capture"),
    )
    shown = sum(1 for n in idle["nodes"] if any(w["available"] for w in n["windows"]))
    st.caption(
        f"The same per node: GPUs of each node that stay free for the whole window starting "
        f"{idle['valid_from']} for a target risk of {idle['risk']:.0%}, from "
        f"{idle['node_history_hours']} complete hours of the node's own peak of held GPUs, each "
        "node's rule calibrated on its own hours (no pooled model), with the measured held-back "
        f"violations (which can exceed the target) and capture of the {first} window. Most releasable nodes first; {shown} of {idle['nodes_total']} nodes "
        f"have a release (at most {idle['max_nodes']} nodes, those with the most GPUs idle in "
        "the last complete hour, are computed). Where to place a job that must not be "
        "disturbed, or which nodes to drain."
    )
for reason in forecasts.idle_node_reasons(doc):
    st.caption(f"No per-node release for {reason}.")

st.subheader("Predicted free GPUs per node")
ends, ends_doc = data.job_ends(state)
free = state.cached("node_free", lambda: forecasts.node_free_times(state.model, ends))
st.caption(
    f"Without moving anything: GPUs free now (the current snapshot, unlike the last complete "
    f"hour's low in the idle tables above) and by each horizon, from the predicted ends of "
    f"the jobs on them. Job ends come from {forecasts.job_ends_text(ends_doc)}, the ends "
    "the advisor service's reservations plan on too."
)
st.dataframe(free, hide_index=True, key="node_free")
