"""Forecast: demand per pool as a fan over the coming hours and days, each horizon with its
backtest beside the seasonal-naive baseline's and naive's; idle GPUs that stay free for the
next W hours, per pool and per node; predicted free GPUs per node on the learned job ends.

The page draws the advisor's forecast document, which changes once an hour: it is redrawn when
that document changes (`data.page_version`), not at every reading; the predicted free GPUs per
node, which do follow every reading, refresh on their own timer."""

from __future__ import annotations

import streamlit as st

from advisor.app import data, figures, forecasts
from advisor.pipeline import queries as Q
from advisor.settings import HORIZONS_H


def percent_columns(*names: str) -> dict[str, st.column_config.NumberColumn]:
    """The ratio columns of a table (WAPE, coverage, violations, capture) shown as percents."""
    return {name: st.column_config.NumberColumn(format="percent") for name in names}


shown = data.current()

st.title("Forecast")
st.caption(
    "GPUs allocated per pool, forecast from this source's history; every forecast with its "
    "error on held-back hours.",
    help="Demand = GPUs allocated per pool, hourly. Each horizon's model is picked on the "
    "earlier half of a rolling-origin backtest and scored on the later, held-back half, next "
    "to the seasonal-naive (same hour yesterday) baseline and naive (last hour's value). A "
    "horizon without enough history shows no number, and why.",
)
data.preview_note(shown)
doc = shown.forecast
table = forecasts.horizons_frame(doc)

st.subheader("Demand per pool")
if table.empty:
    if shown.live:
        where = (
            "Prometheus held no more of this source's past."
            if "prometheus+" in shown.view.meta.source
            else "An exporter keeps no past: a `prometheus+http://…` source gives its last "
            "week at start, and a simulated week (e.g. `sim:a100-16x8?t=7d`) shows the "
            "forecasts now."
        )
        st.info(
            f"Collecting history: {doc.get('history_hours', 0)} complete hour(s) so far. "
            "Forecasts appear once each horizon has enough hours for a backtest. " + where
        )
    elif len(shown.view.history.trend) < 2:
        st.info(
            "This source is a single instant, so there is no history to forecast from. Pick a "
            "simulated time of a few days (e.g. `sim:a100-16x8?t=7d`) or a live source."
        )
    else:
        st.info(f"No forecast yet: history of {doc.get('history_hours', 0)} complete hour(s).")
else:
    pools = sorted(set(table["pool"]))
    pool = pools[0] if len(pools) == 1 else st.selectbox("Pool", pools, key="forecast_pool")
    fan = forecasts.fan_frame(doc, pool)
    st.plotly_chart(
        shown.cached(
            f"fan {pool}", lambda: figures.fan_chart(data.hourly_demand(shown), fan, pool)
        ),
        key="forecast_fig",
        config={"displaylogo": False},
    )
    ahead = fan.iloc[1:].to_dict("records")
    for col, row in zip(st.columns(min(len(ahead), 8) or 1), ahead, strict=False):
        low, high = row["q0.1"], row["q0.9"]
        band = f"{low:.0f}–{high:.0f}" if low == low and high == high else "no interval"
        col.metric(
            f"in {row['horizon']}",
            f"{row['point']:.0f} GPUs",
            f"10–90 %: {band}",
            delta_color="off",
            delta_arrow="off",
        )
    st.caption(
        f"From the last complete hour ({doc['origin']}), {doc['history_hours']} hours of "
        "history; band: 10th to 90th percentile.",
        help="WAPE = sum of absolute errors / sum of actuals over the held-back origins; the "
        "model was chosen on the earlier origins only, so it can lose to naive there (shown, not "
        "used to choose). The interval is blank while the model has too few known errors; q0.9 "
        "coverage = share of held-back hours at or below the 90th percentile (a calibrated "
        "interval covers about 90 %), over the held-back hours that had an interval.",
    )
    with st.expander("Each horizon with its backtest"):
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
for reason in forecasts.missing_reasons(doc):
    st.caption(f"No forecast for {reason}.")
for reason in forecasts.interval_reasons(doc):
    st.caption(f"No interval for {reason}.")

tenants = doc.get("tenants") or {}
tenant_table = forecasts.tenants_frame(doc)
if not tenant_table.empty:
    with st.expander(
        f"Demand per tenant: the {len(tenants['tenants'])} of {tenants['tenants_total']} "
        "tenants holding the most GPUs"
    ):
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
            "GPUs held by each tenant's running allocations (held: the last complete hour's "
            "mean), forecast and backtested as the pools are. Tenants have quotas, not GPUs of "
            "their own: nothing to clip to."
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
        f"released for a target risk of {idle['risk']:.0%}; the measured rate is the backtest "
        "violations beside it.",
        help="Idle in an hour = capacity − the hour's peak of GPUs with anything allocated on "
        "them; the idle column is the last complete hour's. The target is not a measurement: "
        "backtest violations = share of held-back hours in which the release exceeded what "
        "stayed free, which can be above the target; capture = share of the GPUs that stayed "
        f"free that it released; `{baseline}` releases what was free over the past window. For "
        "reservations and for choosing when to defragment.",
    )
for reason in forecasts.idle_missing_reasons(doc):
    st.caption(f"No idle-window release for {reason}.")

nodes_table = forecasts.idle_nodes_frame(doc)
if not nodes_table.empty:
    first = idle["windows"][0]
    released = sum(1 for n in idle["nodes"] if any(w["available"] for w in n["windows"]))
    with st.expander(
        f"Per node: {released} of {idle['nodes_total']} nodes have a release", expanded=False
    ):
        st.dataframe(
            nodes_table,
            hide_index=True,
            key="idle_nodes_table",
            column_config=percent_columns(
                f"{first} backtest violations", f"{first} backtest capture"
            ),
        )
        st.caption(
            f"The same per node: GPUs of each node that stay free for the whole window starting "
            f"{idle['valid_from']} for a target risk of {idle['risk']:.0%}, from "
            f"{idle['node_history_hours']} complete hours of the node's own peak of held GPUs, "
            "each node's rule calibrated on its own hours, with the measured held-back "
            f"violations and capture of the {first} window. Most releasable nodes first; "
            f"{released} of {idle['nodes_total']} nodes have a release (at most "
            f"{idle['max_nodes']} nodes, those with the most GPUs idle in the last complete "
            "hour, are computed). Where to place a job that must not be disturbed, or which "
            "nodes to drain."
        )
for reason in forecasts.idle_node_reasons(doc):
    st.caption(f"No per-node release for {reason}.")


@st.fragment(run_every=data.refresh_seconds() if shown.live and not shown.frozen else None)
def predicted_free() -> None:
    """Follows every reading (the current snapshot and the latest learned ends), on its own
    timer: the rest of the page waits for the hourly forecast."""
    latest = data.current() if not shown.frozen else shown
    st.subheader("Predicted free GPUs per node")
    free = latest.cached(
        "node_free", lambda: Q.free_gpus_by_node(latest.model, latest.planned_ends, HORIZONS_H)
    )
    st.caption(
        "Without moving anything: GPUs free now and by each horizon, from the predicted ends "
        f"of the jobs on them. Job ends come from {forecasts.job_ends_text(latest.job_end_doc)}.",
        help="Free now is the current snapshot, unlike the last complete hour's low in the idle "
        "tables above; the ends are those the advisor's reservations plan on too.",
    )
    st.dataframe(free, hide_index=True, key="node_free")


predicted_free()
