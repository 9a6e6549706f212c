"""Fragmentation: the cluster score and its trend, jobs per shape, worst nodes, three kinds."""

from __future__ import annotations

import streamlit as st

from advisor.app import data, figures
from advisor.pipeline import queries as Q

shown = data.current()
r = shown.result
spatial, temporal, frag, memory = r["spatial"], r["temporal"], r["fgd"], r["memory"]

st.title("Fragmentation")
st.caption(
    f"Source `{shown.view.meta.source}`"
    + (f" · at {data.when(shown)}" if data.when(shown) else "")
    + f" · FGD workload: {frag['workload']} ({frag['task_types']} task types)"
)

cols = st.columns(6)
cols[0].metric(
    "Fragmentation rate",
    f"{frag['fragment_rate']:.1%}",
    help="FGD: share of the free GPU capacity that a task drawn from the workload cannot use.",
)
cols[1].metric(
    "Fragmented GPUs",
    f"{frag['fragment_gpus']:,.1f}",
    help="FGD fragment amount: the free GPUs (fractions included) that a task drawn from the "
    "workload cannot use, weighted by how often such tasks arrive.",
)
cols[2].metric(
    "Free GPUs",
    f"{spatial['free_gpus']:,}",
    help="Healthy, unallocated GPUs on schedulable nodes; a lost or unhealthy GPU is not free, "
    "and neither is one in use whose owner no source names "
    f"({r['cluster']['owner_unknown_gpus']:,} now: busy or holding memory).",
)
cols[3].metric(
    "Largest job on one node",
    f"{spatial['largest_job']['single_node_gpus']} GPUs",
    help="The most whole free GPUs one node offers a single job now.",
)
cols[4].metric(
    "Allocated but idle",
    f"{temporal['allocated_idle_gpus']:,}",
    help=f"Allocated GPUs whose every utilization sample of the last "
    f"{temporal['window_s'] / 60:g} min was under {temporal['threshold']:.0%}.",
)
cols[5].metric(
    "Stranded GPU memory",
    f"{memory['stranded_memory_bytes'] / data.GIB:,.0f} GiB",
    help="Free memory on GPUs in use that no new request can take: all of it on GPUs fully "
    f"handed out, and less than {memory['min_request_bytes'] / data.GIB:g} GiB left on GPUs "
    "handed out in part.",
)

st.subheader("Trend")
trend = data.trend(shown)
if shown.preview:
    st.info("Reading this source's past; the trend appears when it is read.")
elif len(trend) < 2:
    if shown.live:
        st.info(
            f"Collecting history: {len(trend)} observation(s) so far, one per refresh. "
            "The trend appears after the second."
        )
    else:
        st.info(
            "This source is a single instant, so it has no trend. Pick a simulated time after "
            "t=0 (e.g. `sim:a100-16x8?t=1d`) or a live source to see one."
        )
else:
    st.plotly_chart(figures.trend_figure(trend), key="trend", config={"displaylogo": False})
    span = trend["time"].iloc[-1] - trend["time"].iloc[0]
    st.caption(
        (
            f"{len(trend)} observations from {trend['time'].iloc[0]:%Y-%m-%d %H:%M} to "
            f"{trend['time'].iloc[-1]:%Y-%m-%d %H:%M} UTC"
            if data.has_clock(shown.model)
            else f"{len(trend)} observations over {span.total_seconds() / 3600:.1f} h"
        )
        + ("" if shown.live else " (simulated: the preset stepped through the time before t)")
        + "."
    )

left, right = st.columns(2)
with left:
    st.subheader("Jobs that can start now")
    st.dataframe(data.shapes_frame(r), hide_index=True, key="shapes")
    st.caption(
        "Each shape alone on today's free capacity.",
        help="Multi-node shapes (2x8, 4x8) need their nodes in one rack with one GPU model. "
        "'Free GPUs it cannot use' are stranded for it.",
    )
    other = st.text_input(
        "Another shape",
        key="frag_shape",
        placeholder="e.g. 3, 2x4, 0.25, 4@NVIDIA H100 80GB HBM3",
        help="G GPUs on one node, KxG = K nodes of G GPUs in one rack, @MODEL limits the model.",
    )
    if other.strip():
        try:
            shape = Q.shape_from_text(other)
            fits = Q.jobs_that_fit(shown.model, shape)
        except ValueError as error:
            st.warning(str(error))
        else:
            st.metric(f"Jobs of {shape.name} that can start now", f"{fits:,}")
with right:
    st.subheader("Most fragmented nodes")
    worst = data.worst_nodes(r)
    if worst.empty:
        st.success("No node holds free capacity that the workload cannot use.")
    else:
        st.dataframe(
            worst[
                [
                    "node",
                    "pool",
                    "rack",
                    "free GPUs",
                    "largest free NVLink group",
                    "allocated idle",
                    "FGD fragment (GPUs)",
                    "score",
                ]
            ],
            hide_index=True,
            key="worst",
        )

spatial_tab, temporal_tab, type_tab, memory_tab = st.tabs(["Spatial", "Temporal", "Type", "Memory"])
with spatial_tab:
    largest = spatial["largest_job"]
    st.markdown(
        f"- **{spatial['free_gpus']:,}** whole GPUs free; **{spatial['free_capacity_gpus']:,.1f}** "
        f"GPUs of capacity incl. **{spatial['partial_free_gpus']:,.1f}** free on partly used GPUs\n"
        f"- largest job on one node: **{largest['single_node_gpus']}** GPUs; in one NVLink "
        f"island: **{largest['nvlink_group_gpus']}**; k×8 in one rack: "
        f"**{largest['multi_node_gpus_in_rack']}** GPUs\n"
        f"- free GPUs stranded by host CPU/memory: **{spatial['stranded_gpus_by_host']:,}**"
    )
with temporal_tab:
    st.markdown(
        f"**{temporal['allocated_idle_gpus']:,}** of **{temporal['allocated_gpus']:,}** "
        f"allocated GPUs ran under {temporal['threshold']:.0%} utilization over the last "
        f"{temporal['window_s'] / 60:g} min of samples."
    )
    by_tenant = data.idle_by_tenant(r)
    if by_tenant.empty:
        st.info("No allocated GPU is idle.")
    else:
        st.dataframe(by_tenant, hide_index=True, key="idle_tenants")
with type_tab:
    capacity, demand = data.type_frames(r)
    st.plotly_chart(figures.type_figure(capacity, demand), key="type_fig")
    st.dataframe(capacity, hide_index=True, key="type_capacity")
    if demand.empty:
        st.info("No queued demand in this source, so no model is short of GPUs.")
    else:
        st.dataframe(demand, hide_index=True, key="type_demand")
with memory_tab:
    st.markdown(
        f"**{memory['stranded_memory_bytes'] / data.GIB:,.1f} GiB** free on "
        f"**{memory['gpus_with_stranded_memory']:,}** in-use GPUs that no request of "
        f"{memory['min_request_bytes'] / data.GIB:g} GiB can use."
    )
