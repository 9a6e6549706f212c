"""The capacity-review app: `streamlit run advisor/app/main.py [-- --source SPEC]`.

This file is the frame: page config, the data-source picker in the sidebar, auto-refresh for
live sources, and the page router. Pages live in `views/` (not `pages/`, which Streamlit would
treat as a legacy multipage folder) and read everything through `advisor.app.data`.
"""

from __future__ import annotations

import streamlit as st

from advisor.app import data

st.set_page_config(page_title="gpu-defrag · capacity review", page_icon="🧩", layout="wide")
data.configure_logging()

PAGES = [
    st.Page("views/fleet.py", title="Fleet", icon=":material/grid_view:", default=True),
    st.Page("views/fragmentation.py", title="Fragmentation", icon=":material/scatter_plot:"),
    st.Page("views/forecast.py", title="Forecast", icon=":material/trending_up:"),
    st.Page("views/actions.py", title="Actions", icon=":material/playlist_add_check:"),
    st.Page("views/whatif.py", title="What-if", icon=":material/help_center:"),
]


def _use(spec: str) -> None:
    if spec:
        st.session_state["source"] = spec


def source_picker() -> None:
    """Sidebar: pick a source kind, fill its fields, press Load. Nothing reloads on typing."""
    spec = data.current_spec()
    st.sidebar.subheader("Data source")
    kinds = list(data.SOURCE_KINDS)
    kind = st.sidebar.selectbox(
        "Kind",
        kinds,
        index=kinds.index(data.kind_of(spec)),
        format_func=data.SOURCE_KIND_LABELS.get,
        key="source_kind",
    )
    if kind == "sim":
        from gpu_defrag_sim.presets import PRESETS

        sim = data.parse_sim(spec) if spec.startswith("sim:") else None
        preset = st.sidebar.selectbox(
            "Preset",
            PRESETS,
            index=PRESETS.index(sim.preset) if sim and sim.preset in PRESETS else 0,
        )
        seed = st.sidebar.number_input("Seed", value=sim.seed if sim else 42, step=1)
        hours = st.sidebar.number_input(
            "Simulated time (hours)",
            min_value=0.0,
            value=(sim.t / 3600.0) if sim else 0.0,
            step=1.0,
            help="t=0 is the preset's starting layout; a later time shows the day before it "
            "as the trend.",
        )
        nodes = st.sidebar.number_input(
            "Nodes (0 = preset size)",
            min_value=0,
            value=(sim.nodes or 0) if sim else 0,
            step=16,
        )
        new = data.sim_spec(preset, int(seed), float(hours), int(nodes) or None)
    elif kind == "exporters":
        text = st.sidebar.text_area(
            "Exporter /metrics URLs (one per line)",
            value=spec.replace(",", "\n") if data.kind_of(spec) == "exporters" else "",
        )
        new = data.exporters_spec(text)
    elif kind == "prometheus":
        url = st.sidebar.text_input(
            "Prometheus URL",
            value=spec.removeprefix("prometheus+") if spec.startswith("prometheus+") else "",
            placeholder="http://127.0.0.1:9090",
        )
        new = data.prometheus_spec(url) if url.strip() else ""
    else:
        path = st.sidebar.text_input(
            "Snapshot (.json) or openb trace (CSV or directory)",
            value=spec if data.kind_of(spec) == "file" else "",
        )
        new = data.file_spec(path) if path.strip() else ""
    st.sidebar.button(
        "Load",
        on_click=_use,
        args=(new,),
        disabled=not new or data.same_source(new, spec),
        type="primary",
    )
    st.sidebar.caption(f"Source: `{spec}`")


def status_line() -> None:
    """Where the data came from and how fresh it is; live sources rerun the app when the
    poller has a newer observation than the one on screen."""
    spec = data.current_spec()
    state, _ = data.get_state(spec)
    if state is None:
        return
    when = data.wall_clock(state.loaded_at)
    if not state.live:
        st.sidebar.caption(f"Static source, read {when}.")
        return
    refresh = data.refresh_seconds()
    st.sidebar.caption(
        f"Live: refreshed every {refresh:g} s, last {when}; {len(state.history)} observation(s) kept."
    )

    @st.fragment(run_every=refresh)
    def watch(shown: str) -> None:
        latest, _ = data.get_state(spec)
        if latest is not None and latest.version != shown:
            st.rerun()

    with st.sidebar:
        watch(state.version)


page = st.navigation(PAGES)
source_picker()
status_line()
page.run()
