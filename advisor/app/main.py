"""The capacity-review app: `streamlit run advisor/app/main.py [-- --advisor URL | --source SPEC]`.

This file is the frame: page config, the data-source picker in the sidebar, the review freeze,
the watch that redraws a page when what it shows has changed, and the page router. Pages live
in `views/` (not `pages/`, which Streamlit would treat as a legacy multipage folder) and read
everything through `advisor.app.data`.
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
        st.session_state.pop(data.FROZEN, None)
        st.session_state["freeze"] = False


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
    if kind == "advisor":
        url = st.sidebar.text_input(
            "Advisor service URL",
            value=spec.removeprefix(data.ADVISOR_PREFIX) if data.is_advisor(spec) else "",
            placeholder="http://127.0.0.1:9836",
            help="A running `gpu-defrag advise`: the app shows what its API serves.",
        )
        new = data.advisor_source(url) if url.strip() else ""
    elif kind == "sim":
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
            help="t=0 is the preset's starting layout; a later time shows the week before it "
            "as the history.",
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


def freeze_control() -> None:
    """Freeze the fleet for a review: every page keeps the view it had when the toggle was
    turned on, while the advisor goes on; turned off, the pages show the latest again."""
    spec = data.current_spec()
    frozen = st.sidebar.toggle(
        "Freeze the fleet for a review",
        key="freeze",
        help="Keeps every page on the view shown now (plans, steps and exports stay put while "
        "you review them); live data continues in the background.",
    )
    if not frozen:
        st.session_state.pop(data.FROZEN, None)
        return
    if data.frozen_view(spec) is None:
        latest, _ = data.latest(spec)
        if latest is not None:
            st.session_state[data.FROZEN] = data.freeze(latest)
    held = data.frozen_view(spec)
    if held is not None:
        at = data.when(held) or data.wall_clock(held.loaded_at)
        st.sidebar.caption(f"Frozen at {at}.")


def status_line(page: str) -> None:
    """Where the data came from and how fresh it is; live sources redraw the page when the
    advisor has published what the page shows anew (`data.page_version`)."""
    spec = data.current_spec()
    if data.frozen_view(spec) is not None:
        return
    shown, _ = data.first_view(spec)
    if shown is None:
        return
    when = data.wall_clock(shown.loaded_at)
    if not shown.live:
        if shown.preview:
            st.sidebar.caption(f"Read {when}; reading its past…")
            drawn = data.page_version(page, shown)

            @st.fragment(run_every=2.0)
            def settle(drawn: str) -> None:
                latest, _ = data.latest(spec)
                if data.page_version(page, latest) != drawn:
                    st.rerun()

            with st.sidebar:
                settle(drawn)
            return
        st.sidebar.caption(f"Static source, read {when}.")
        return
    refresh = data.refresh_seconds()
    what = "the advisor service's runs" if data.is_advisor(spec) else "the source"
    st.sidebar.caption(f"Live: refreshed every {refresh:g} s ({what}), last {when}.")

    @st.fragment(run_every=refresh)
    def watch(drawn: str) -> None:
        latest, _ = data.latest(spec)
        if data.page_version(page, latest) != drawn:
            st.rerun()

    with st.sidebar:
        watch(data.page_version(page, shown))


page = st.navigation(PAGES)
source_picker()
freeze_control()
status_line(page.title)
page.run()
