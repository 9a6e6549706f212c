"""Kubernetes manifests: parse, validate built-in kinds against the Kubernetes OpenAPI schema
(kubernetes-validate, strict), check the Prometheus Operator resources structurally, and check
that the pieces fit together (selectors, ports, job names, the exporter's flags)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from advisor.cli import build_parser
from alerts.config import load_config
from tests.ci import skip_or_fail

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
KUBERNETES_VERSION = "1.33"
CRDS = {"ServiceMonitor", "PrometheusRule"}
CLUSTER_SCOPED = ("ClusterRole", "ClusterRoleBinding")


def kubernetes_validate():
    try:
        import kubernetes_validate as module
    except ImportError:
        skip_or_fail(
            "kubernetes-validate is not installed (pip install kubernetes-validate): "
            "schema validation not run"
        )
    return module


def documents() -> list[tuple[str, dict]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            assert isinstance(doc, dict), f"{path.name}: empty or non-mapping document"
            docs.append((path.name, doc))
    return docs


def by_kind(kind: str) -> list[dict]:
    return [doc for _, doc in documents() if doc["kind"] == kind]


def test_every_manifest_parses_and_is_named_in_the_namespace():
    docs = documents()
    kinds = {doc["kind"] for _, doc in docs}
    assert {"DaemonSet", "Service", "ServiceMonitor", "PrometheusRule", "Deployment"} <= kinds
    for name, doc in docs:
        assert doc["apiVersion"] and doc["metadata"]["name"], name
        if doc["kind"] not in ("Namespace", *CLUSTER_SCOPED):
            assert doc["metadata"]["namespace"] == "gpu-defrag", (name, doc["kind"])


def builtin_documents() -> list[tuple[str, int]]:
    """(file, index) of every document whose kind the Kubernetes OpenAPI schema defines."""
    return [
        (name, i)
        for name, docs in (
            (p.name, list(yaml.safe_load_all(p.read_text()))) for p in sorted(K8S.glob("*.yaml"))
        )
        if name != "kustomization.yaml"
        for i, doc in enumerate(docs)
        if doc["kind"] not in CRDS
    ]


@pytest.mark.parametrize(("file", "index"), builtin_documents())
def test_builtin_kinds_validate_against_the_kubernetes_openapi_schema(file, index):
    doc = list(yaml.safe_load_all((K8S / file).read_text()))[index]
    validator = kubernetes_validate()
    validator.validate(doc, KUBERNETES_VERSION, strict=True)


def test_crds_are_not_in_the_kubernetes_schema():
    """ServiceMonitor and PrometheusRule are checked structurally below."""
    validator = kubernetes_validate()
    for kind in CRDS:
        (doc, *_) = by_kind(kind)
        with pytest.raises(validator.SchemaNotFoundError):
            validator.validate(doc, KUBERNETES_VERSION, strict=True)


def test_strict_validation_rejects_a_misspelt_field():
    validator = kubernetes_validate()
    daemonset = by_kind("DaemonSet")[0]
    daemonset["spec"]["template"]["spec"]["hostPIDs"] = True
    with pytest.raises(validator.ValidationError):
        validator.validate(daemonset, KUBERNETES_VERSION, strict=True)


def test_kustomization_lists_every_manifest():
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files


def test_exporter_daemonset_runs_on_gpu_nodes_with_host_pid_and_pod_resources_read_only():
    (daemonset,) = by_kind("DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
    (container,) = pod["containers"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    socket_dir = "/var/lib/kubelet/pod-resources"
    assert volumes["pod-resources"]["hostPath"]["path"] == socket_dir
    assert mounts["pod-resources"]["readOnly"] is True
    assert mounts["pod-resources"]["mountPath"] == socket_dir
    args = build_parser().parse_args(container["args"])
    assert args.backend == "nvml"
    assert args.pod_resources_socket.startswith(socket_dir + "/")
    # the pod logs that name the pod UIDs of process cgroups, read-only from the host's path
    logs = next(
        m for m in container["volumeMounts"] if args.pod_logs_dir.startswith(m["mountPath"])
    )
    assert logs["readOnly"] is True
    assert volumes[logs["name"]]["hostPath"]["path"] == logs["mountPath"]
    assert "nvidia.com/gpu" not in container["resources"].get("limits", {}), (
        "the exporter must not consume a GPU"
    )
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_services_select_their_pods_and_name_the_scrape_jobs_of_the_rules():
    workloads = by_kind("DaemonSet") + by_kind("Deployment")
    services = {s["metadata"]["name"]: s for s in by_kind("Service")}
    for service in services.values():
        selector = service["spec"]["selector"]
        matching = [
            w
            for w in workloads
            if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(matching) == 1, service["metadata"]["name"]
        ports = {
            p["name"]
            for c in matching[0]["spec"]["template"]["spec"]["containers"]
            for p in c["ports"]
        }
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports
    for selector in load_config()["selectors"].values():
        job = re.fullmatch(r'job="([\w-]+)"', selector).group(1)
        assert job in services, f"no Service named {job}: the operator's job label would differ"


def test_service_monitors_select_services_and_their_ports():
    services = by_kind("Service")
    monitors = by_kind("ServiceMonitor")
    assert {m["metadata"]["name"] for m in monitors} == {"gpu-exporter", "gpu-advisor"}
    for monitor in monitors:
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        labels = monitor["spec"]["selector"]["matchLabels"]
        (service,) = [s for s in services if labels.items() <= s["metadata"]["labels"].items()]
        ports = {p["name"] for p in service["spec"]["ports"]}
        for endpoint in monitor["spec"]["endpoints"]:
            assert endpoint["port"] in ports
            assert re.fullmatch(r"\d+s", endpoint["interval"])
    exporter = next(m for m in monitors if m["metadata"]["name"] == "gpu-exporter")
    relabel = exporter["spec"]["endpoints"][0]["relabelings"][0]
    assert relabel["targetLabel"] == "instance"
    # the exporter's pod/namespace/container labels name each GPU's holder, and the Operator adds
    # the exporter pod's own under the same names: without honorLabels ours become exported_*
    assert exporter["spec"]["endpoints"][0]["honorLabels"] is True
    # ... and the exporter pod's own are dropped, so a GPU series without a holder gets no
    # `pod` that changes at each exporter restart (GpuMissing, GpuAllocatedIdle compare in time)
    dropped = [
        r for r in exporter["spec"]["endpoints"][0]["relabelings"] if r.get("action") == "labeldrop"
    ]
    assert [r["regex"] for r in dropped] == ["pod|namespace|container"]


def test_prometheus_rule_carries_the_generated_groups():
    (rule,) = by_kind("PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    groups = rule["spec"]["groups"]
    names = [g["name"] for g in groups]
    assert len(names) == len(set(names))
    alerts = {r["alert"] for g in groups for r in g["rules"] if "alert" in r}
    shipped = yaml.safe_load((ROOT / "alerts" / "prometheus_alerts.yaml").read_text())
    assert alerts == {r["alert"] for g in shipped["groups"] for r in g["rules"]}


def test_every_container_command_parses_with_the_real_cli():
    for workload in by_kind("DaemonSet") + by_kind("Deployment"):
        for container in workload["spec"]["template"]["spec"]["containers"]:
            build_parser().parse_args(container["args"])


def test_advisor_cluster_role_grants_exactly_what_the_k8s_source_reads():
    """get/list/watch on every resource `advisor.ingest.kubernetes.resources` reads, and
    nothing more: no write verb, no secrets; bound to the advisor's service account."""
    from advisor.ingest.kubernetes.resources import ALL, VERBS

    (role,) = by_kind("ClusterRole")
    granted = {
        (group, resource)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        if sorted(rule["verbs"]) == sorted(VERBS)
    }
    assert all(sorted(rule["verbs"]) == sorted(VERBS) for rule in role["rules"])
    assert granted == {(r.api_group, r.plural) for r in ALL}
    (binding,) = by_kind("ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    (subject,) = binding["subjects"]
    assert subject["kind"] == "ServiceAccount" and subject["namespace"] == "gpu-defrag"
    assert subject["name"] in {a["metadata"]["name"] for a in by_kind("ServiceAccount")}
    (advisor,) = [d for d in by_kind("Deployment") if d["metadata"]["name"] == "gpu-advisor"]
    pod = advisor["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == subject["name"]
    assert "--source=k8s:" in pod["containers"][0]["args"]
