"""Fleet: every GPU as one cell, coloured by state, utilization or memory, with filters."""

from __future__ import annotations

import streamlit as st

from advisor.app import data, figures

shown = data.current()
frame = data.fleet_frame(shown)
cluster = shown.result["cluster"]

st.title("Fleet")
st.caption(
    f"{cluster['nodes']:,} nodes · {cluster['gpus']:,} GPUs · source `{shown.view.meta.source}`"
    + (f" · at {data.when(shown)}" if data.when(shown) else "")
)

states = ["free", "busy", "allocated_idle", "unhealthy"]
all_counts = data.state_counts(frame)
states += [name for name in ("mig_free", "owner_unknown") if all_counts[name]]
cols = st.columns(1 + len(states))  # filled below, from the GPUs the filters select

left, mid, right, colour = st.columns([1, 1, 1, 1])
pools = left.multiselect("Pool", sorted(frame["pool"].unique()), key="fleet_pools")
models = mid.multiselect("GPU model", sorted(frame["gpu_model"].unique()), key="fleet_models")
tenants = right.multiselect("Tenant", data.tenants_of(frame), key="fleet_tenants")
color_by = colour.radio(
    "Colour by",
    list(figures.COLOR_BY),
    format_func=figures.COLOR_BY.get,
    horizontal=True,
    key="fleet_color",
)

shown_gpus = data.filter_frame(frame, pools, models, tenants)
counts = data.state_counts(shown_gpus)
filtered = bool(pools or models or tenants)
cols[0].metric("GPUs shown" if filtered else "GPUs", f"{len(shown_gpus):,}")
for col, name in zip(cols[1:], states, strict=True):
    col.metric(data.STATE_LABELS[name].capitalize(), f"{counts[name]:,}")
if shown_gpus.empty:
    st.info("No GPU matches these filters.")
else:
    key = ("heatmap", tuple(pools), tuple(models), tuple(tenants), color_by)
    figure = shown.cached(str(key), lambda: figures.fleet_heatmap(shown_gpus, color_by))
    st.plotly_chart(figure, key="fleet_heatmap", config={"displaylogo": False})
    temporal = shown.result["temporal"]
    st.caption(
        f"{shown_gpus['node'].nunique():,} nodes shown, grouped by pool · GPU model · rack.",
        help="Black bars split NVLink islands inside a node; hover a cell for job, tenant, "
        "utilization and memory. In use, owner unknown = busy or holding memory with no "
        f"allocation naming it (never free). Allocated-idle = utilization under "
        f"{temporal['threshold']:.0%} "
        f"over the last {temporal['window_s'] / 60:g} min of samples (or the latest reading when "
        "there is no history yet).",
    )
