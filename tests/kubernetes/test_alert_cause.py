"""End to end: the real advisor reads a Kubernetes API (the fake server, rack labels absent) and
exporter pages; real Prometheus scrapes it and evaluates the shipped rules (short `for`);
GpuJobShapeUnschedulable fires with the real cause: `rack_unknown` for the multi-node shapes
that would fit if the racks allowed, `scattered` for the 8 x 8 gang no rack layout could hold,
and its description says which, never "scattered" for lack of a rack."""

from __future__ import annotations

import pytest

from alerts import generate
from alerts.config import load_config
from tests.fakes.page_server import Routes, serve
from tests.integration import stack
from tests.kubernetes.pages import exporter_page, readings_from_model
from tests.kubernetes.seeds import seed_16x8

pytestmark = pytest.mark.integration


def test_shape_alert_names_rack_unknown_and_scattered(tmp_path, kube):
    seed, objects = seed_16x8(rack_label="example.com/not-read")
    kube(objects)
    routes = Routes()
    routes.text("/metrics", exporter_page(readings_from_model(seed)))
    procs = stack.Processes(tmp_path)
    try:
        with serve(routes) as exporters:
            rules = tmp_path / "alerts.yaml"
            fast = load_config({"for": {"shape_unschedulable": "2s"}})
            rules.write_text(generate.dump(generate.render_alerts(fast)))
            advisor = stack.start_advisor(
                procs, "k8s:", interval="2s", extra=("--source", f"{exporters}/metrics")
            )
            prometheus = stack.start_prometheus(procs, {"gpu-advisor": advisor}, [rules])

            def firing():
                procs.check_alive()
                alerts = stack.query(
                    prometheus,
                    'ALERTS{alertname="GpuJobShapeUnschedulable", alertstate="firing"}',
                )
                found = {(a["metric"]["shape"], a["metric"]["cause"]) for a in alerts}
                return found if {("2x8", "rack_unknown"), ("8x8", "scattered")} <= found else None

            found = stack.poll(firing, 60, "GpuJobShapeUnschedulable with its causes")
            assert found == {("2x8", "rack_unknown"), ("4x8", "rack_unknown"), ("8x8", "scattered")}
            rules_api = stack.api(prometheus, "/api/v1/alerts")["alerts"]
            by_shape = {
                a["labels"]["shape"]: a["annotations"]["description"]
                for a in rules_api
                if a["labels"]["alertname"] == "GpuJobShapeUnschedulable"
            }
            assert "no source knows the racks" in by_shape["2x8"]
            assert "scattered" not in by_shape["2x8"].split("not scattered")[0]
            assert "they are scattered across its nodes" in by_shape["8x8"]
    except BaseException:
        print(procs.logs())
        raise
    finally:
        procs.stop_all()
