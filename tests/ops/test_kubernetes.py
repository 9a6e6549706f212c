"""Kubernetes manifests as `kubectl apply -k` installs them: each installable overlay rendered by
the real `kubectl kustomize`, built-in kinds validated against the Kubernetes 1.33 OpenAPI schema
(kubernetes-validate, strict), the Prometheus Operator resources checked structurally, the pods
held to the Pod Security level of their namespace, and the pieces checked to fit together
(selectors, ports, job names, the command lines after $(VAR) expansion, one image reference,
the runbook URLs, the exporter's web config and the Secrets that feed it)."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import bcrypt
import pytest
import yaml

from advisor.cli import build_parser
from alerts.config import load_config
from gpu_defrag_common.webconfig import load_web_config
from tests.ci import skip_or_fail
from tests.ops import kustomize as K
from tests.ops.pod_security import violations

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES_VERSION = "1.33"
CRDS = {"ServiceMonitor", "PrometheusRule", "AlertmanagerConfig"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
NAMESPACES = {"gpu-defrag": "restricted", "gpu-defrag-exporter": "privileged"}
OVERLAYS = sorted(K.INSTALLABLE)


def kubernetes_validate():
    try:
        import kubernetes_validate as module
    except ImportError:
        skip_or_fail(
            "kubernetes-validate is not installed (pip install kubernetes-validate): "
            "schema validation not run"
        )
    return module


def rendered(overlay: str = "kube-prometheus-stack") -> list[dict]:
    return K.render(K.INSTALLABLE[overlay])


def pod_of(workload: dict) -> dict:
    return workload["spec"]["template"]["spec"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_is_named_and_namespaced_in_one_of_ours(overlay):
    docs = rendered(overlay)
    kinds = {d["kind"] for d in docs}
    assert {"Namespace", "DaemonSet", "Deployment", "Service", "NetworkPolicy"} <= kinds
    for doc in docs:
        assert doc["apiVersion"] and doc["metadata"]["name"], doc
        if doc["kind"] not in CLUSTER_SCOPED:
            assert doc["metadata"]["namespace"] in NAMESPACES, (doc["kind"], doc["metadata"])
    assert {d["metadata"]["name"] for d in K.of_kind(docs, "Namespace")} == set(NAMESPACES)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_builtin_kinds_validate_against_the_kubernetes_openapi_schema(overlay):
    validator = kubernetes_validate()
    for doc in rendered(overlay):
        if doc["kind"] not in CRDS:
            validator.validate(doc, KUBERNETES_VERSION, strict=True)


def test_strict_validation_rejects_a_misspelt_field():
    validator = kubernetes_validate()
    (daemonset,) = K.of_kind(rendered(), "DaemonSet")
    pod_of(daemonset)["hostPIDs"] = True
    with pytest.raises(validator.ValidationError):
        validator.validate(daemonset, KUBERNETES_VERSION, strict=True)


def test_the_base_lists_every_manifest_of_its_directory():
    kustomization = yaml.safe_load((K.BASE / "kustomization.yaml").read_text())
    files = {p.name for p in K.BASE.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files


# --------------------------------------------------------------------------- least privilege


def test_namespaces_carry_the_pod_security_level_their_pods_meet():
    docs = rendered()
    for namespace in K.of_kind(docs, "Namespace"):
        labels = namespace["metadata"]["labels"]
        level = NAMESPACES[namespace["metadata"]["name"]]
        assert labels["pod-security.kubernetes.io/enforce"] == level
        assert labels["pod-security.kubernetes.io/enforce-version"] == f"v{KUBERNETES_VERSION}"
    for workload in K.workloads(docs):
        level = NAMESPACES[workload["metadata"]["namespace"]]
        pod = pod_of(workload)
        assert violations(pod, level) == [], workload["metadata"]["name"]
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in pod["containers"]:
            security = container["securityContext"]
            assert security["allowPrivilegeEscalation"] is False
            assert security["capabilities"]["drop"] == ["ALL"]
            assert security["readOnlyRootFilesystem"] is True


def test_the_exporter_needs_privileged_for_host_pid_and_host_paths_only():
    """What keeps the exporter out of `baseline` is what namespace.yaml says, nothing else."""
    (daemonset,) = K.of_kind(rendered(), "DaemonSet")
    found = violations(pod_of(daemonset), "baseline")
    assert found == [
        "Host Namespaces: hostPID must not be true",
        "HostPath Volumes: pod-resources is a hostPath",
        "HostPath Volumes: pod-logs is a hostPath",
    ]


@pytest.mark.parametrize(
    ("change", "control"),
    [
        (lambda p: p["securityContext"].pop("seccompProfile"), "Seccomp"),
        (lambda p: p["securityContext"].update(runAsNonRoot=False), "Running as Non-root"),
        (lambda p: p["containers"][0]["securityContext"].pop("allowPrivilegeEscalation"), "Priv"),
        (lambda p: p["containers"][0]["securityContext"].pop("capabilities"), "Capabilities"),
        (lambda p: p.update(hostNetwork=True), "Host Namespaces"),
        (lambda p: p["volumes"].append({"name": "h", "hostPath": {"path": "/"}}), "HostPath"),
    ],
)
def test_the_restricted_check_catches_each_control(change, control):
    advisor = K.named(rendered(), "Deployment", "gpu-advisor")
    pod = pod_of(advisor)
    pod.setdefault("volumes", [])
    change(pod)
    assert any(v.startswith(control) for v in violations(pod, "restricted"))


def test_network_policies_cover_every_pod_and_name_its_ports():
    docs = rendered()
    policies = K.of_kind(docs, "NetworkPolicy")
    for workload in K.workloads(docs):
        labels = workload["spec"]["template"]["metadata"]["labels"]
        namespace = workload["metadata"]["namespace"]
        (policy,) = [
            p
            for p in policies
            if p["metadata"]["namespace"] == namespace
            and p["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
        ]
        ports = {p["name"] for c in pod_of(workload)["containers"] for p in c["ports"]}
        assert "Ingress" in policy["spec"]["policyTypes"]
        for rule in policy["spec"]["ingress"]:
            assert {p["port"] for p in rule["ports"]} <= ports
    # the advisor and the app reach only DNS, Prometheus, the API server and each other
    for name in ("gpu-advisor", "gpu-defrag-app"):
        policy = K.named(docs, "NetworkPolicy", name)
        assert "Egress" in policy["spec"]["policyTypes"]
        allowed = {p["port"] for rule in policy["spec"]["egress"] for p in rule["ports"]}
        assert allowed <= {53, 9090, 443, 6443, 9836}, name


# --------------------------------------------------------------------------- the exporter


def test_exporter_daemonset_runs_on_gpu_nodes_with_host_pid_and_pod_resources_read_only():
    docs = rendered("prometheus")  # without the web-config component: its probes are HTTP
    (daemonset,) = K.of_kind(docs, "DaemonSet")
    pod = pod_of(daemonset)
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
    args = build_parser().parse_args(K.command_line(docs, daemonset, container))
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
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"


def test_gpu_node_selection_and_tolerations_are_set_in_the_cluster_overlay(tmp_path):
    deploy = K.copy_deploy(tmp_path)
    patch = deploy / "overlays" / "cluster" / "gpu-nodes.yaml"
    text = patch.read_text().replace('nvidia.com/gpu.present: "true"', "gpu: h100")
    patch.write_text(text.replace("effect: NoSchedule", "effect: NoExecute"))
    docs = yaml.safe_load_all(K.render_text(deploy / "overlays" / "prometheus"))
    (daemonset,) = [d for d in docs if d and d["kind"] == "DaemonSet"]
    assert pod_of(daemonset)["nodeSelector"] == {"gpu": "h100"}  # replaced, not merged
    assert [t["effect"] for t in pod_of(daemonset)["tolerations"]] == ["NoExecute"]


def make_secrets(tmp_path: Path) -> dict[str, dict[str, str]]:
    """The Secrets make-secrets.sh prints, by name, their data decoded."""
    script = ROOT / "deploy" / "components" / "exporter-web-config" / "make-secrets.sh"
    result = subprocess.run(
        ["sh", str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHON": sys.executable},
    )
    assert result.returncode == 0, result.stderr
    return {
        doc["metadata"]["name"]: {k: base64.b64decode(v).decode() for k, v in doc["data"].items()}
        for doc in yaml.safe_load_all(result.stdout)
        if doc
    }


def test_the_exporter_web_config_is_mounted_passed_and_scraped_as_it_serves(tmp_path):
    docs = rendered()
    daemonset = K.named(docs, "DaemonSet", "gpu-exporter")
    (container,) = pod_of(daemonset)["containers"]
    args = build_parser().parse_args(K.command_line(docs, daemonset, container))
    secrets = make_secrets(tmp_path)
    assert set(secrets) == {"gpu-exporter-tls", "gpu-exporter-web-config", "gpu-exporter-scrape"}
    volumes = {v["name"]: v["secret"] for v in pod_of(daemonset)["volumes"] if "secret" in v}
    mounted = {}  # path in the container -> the Secret's text there
    for mount in container["volumeMounts"]:
        secret = volumes.get(mount["name"])
        if secret is None:
            continue
        items = secret.get("items") or [
            {"key": k, "path": k} for k in secrets[secret["secretName"]]
        ]
        for item in items:
            mounted[f"{mount['mountPath']}/{item['path']}"] = secrets[secret["secretName"]][
                item["key"]
            ]
    web = yaml.safe_load(mounted[args.web_config_file])
    # the exporter's own loader accepts the file, with the files where the pod mounts them
    root = tmp_path / "root"
    for path, text in mounted.items():
        (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (root / path.lstrip("/")).write_text(text)
    local = {
        "tls_server_config": {
            key: str(root / value.lstrip("/")) for key, value in web["tls_server_config"].items()
        },
        "basic_auth_users": web["basic_auth_users"],
    }
    (tmp_path / "web.yml").write_text(yaml.safe_dump(local))
    loaded = load_web_config(tmp_path / "web.yml")
    assert loaded.tls is not None and set(loaded.users) == set(web["basic_auth_users"])
    tls = web["tls_server_config"]
    assert mounted[tls["cert_file"]].startswith("-----BEGIN CERTIFICATE-----")
    assert "PRIVATE KEY" in mounted[tls["key_file"]]
    scrape = secrets["gpu-exporter-scrape"]
    (user, hashed), *_ = web["basic_auth_users"].items()
    assert user == scrape["username"]
    assert bcrypt.checkpw(scrape["password"].encode(), hashed.encode())
    # the ServiceMonitor sends what the exporter checks, to the name its certificate carries
    (endpoint,) = K.named(docs, "ServiceMonitor", "gpu-exporter")["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"]["ca"]["secret"] == {"name": "gpu-exporter-tls", "key": "ca.crt"}
    assert endpoint["basicAuth"]["username"] == {"name": "gpu-exporter-scrape", "key": "username"}
    assert endpoint["basicAuth"]["password"] == {"name": "gpu-exporter-scrape", "key": "password"}
    service = K.named(docs, "Service", "gpu-exporter")
    name = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert endpoint["tlsConfig"]["serverName"] == name
    certificate = subprocess.run(
        ["openssl", "x509", "-noout", "-ext", "subjectAltName"],
        input=secrets["gpu-exporter-tls"]["tls.crt"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert f"DNS:{name}" in certificate.stdout
    assert container["livenessProbe"]["tcpSocket"] == {"port": "metrics"}


# --------------------------------------------------------------------------- wiring


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_command_parses_with_the_real_cli(overlay):
    docs = rendered(overlay)
    for workload in K.workloads(docs):
        for container in pod_of(workload)["containers"]:
            line = K.command_line(docs, workload, container)
            assert not [a for a in line if "$(" in a], line  # every variable is defined
            build_parser().parse_args(line)


def test_images_are_set_in_one_place(tmp_path):
    deploy = K.copy_deploy(tmp_path)
    cluster = deploy / "overlays" / "cluster" / "kustomization.yaml"
    text = cluster.read_text().replace(
        "newName: ghcr.io/gpu-defrag/gpu-defrag", "newName: registry.example/gpu-defrag"
    )
    cluster.write_text(text.replace("newTag: 0.1.0", "newTag: 9.9.9"))
    for overlay in OVERLAYS:
        docs = [d for d in yaml.safe_load_all(K.render_text(deploy / "overlays" / overlay)) if d]
        images = {
            (w["kind"], c["image"]) for w in K.workloads(docs) for c in pod_of(w)["containers"]
        }
        assert {image for _, image in images} == {
            "registry.example/gpu-defrag:9.9.9",
            "registry.example/gpu-defrag-exporter:9.9.9",  # the small image (Dockerfile)
        }, overlay
        assert {image for kind, image in images if kind == "DaemonSet"} == {
            "registry.example/gpu-defrag-exporter:9.9.9"
        }, overlay


def test_services_select_their_pods_and_name_the_scrape_jobs_of_the_rules():
    docs = rendered()
    workloads = K.workloads(docs)
    services = {s["metadata"]["name"]: s for s in K.of_kind(docs, "Service")}
    for service in services.values():
        selector = service["spec"]["selector"]
        matching = [
            w
            for w in workloads
            if w["metadata"]["namespace"] == service["metadata"]["namespace"]
            and selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(matching) == 1, service["metadata"]["name"]
        ports = {p["name"] for c in pod_of(matching[0])["containers"] for p in c["ports"]}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports
    for selector in load_config()["selectors"].values():
        job = re.fullmatch(r'job="([\w-]+)"', selector).group(1)
        assert job in services, f"no Service named {job}: the operator's job label would differ"


def test_service_monitors_select_services_and_carry_the_stacks_release_label():
    docs = rendered()
    services = K.of_kind(docs, "Service")
    monitors = K.of_kind(docs, "ServiceMonitor")
    assert {m["metadata"]["name"] for m in monitors} == {"gpu-exporter", "gpu-advisor"}
    for monitor in monitors:
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        labels = monitor["spec"]["selector"]["matchLabels"]
        (namespace,) = monitor["spec"]["namespaceSelector"]["matchNames"]
        (service,) = [
            s
            for s in services
            if labels.items() <= s["metadata"]["labels"].items()
            and s["metadata"]["namespace"] == namespace
        ]
        ports = {p["name"] for p in service["spec"]["ports"]}
        for endpoint in monitor["spec"]["endpoints"]:
            assert endpoint["port"] in ports
            assert re.fullmatch(r"\d+s", endpoint["interval"])
    (endpoint,) = K.named(docs, "ServiceMonitor", "gpu-exporter")["spec"]["endpoints"]
    assert endpoint["relabelings"][0]["targetLabel"] == "instance"
    # the exporter's pod/namespace/container labels name each GPU's holder, and the Operator adds
    # the exporter pod's own under the same names: without honorLabels ours become exported_*
    assert endpoint["honorLabels"] is True
    # ... and the exporter pod's own are dropped, so a GPU series without a holder gets no
    # `pod` that changes at each exporter restart (GpuMissing, GpuAllocatedIdle compare in time)
    dropped = [r for r in endpoint["relabelings"] if r.get("action") == "labeldrop"]
    assert [r["regex"] for r in dropped] == ["pod|namespace|container"]


def test_prometheus_rule_carries_the_generated_groups_and_the_clusters_runbook_urls(tmp_path):
    (rule,) = K.of_kind(rendered(), "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    names = [g["name"] for g in rule["spec"]["groups"]]
    assert len(names) == len(set(names))
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    shipped = yaml.safe_load((ROOT / "alerts" / "prometheus_alerts.yaml").read_text())
    assert alerts == {r["alert"] for g in shipped["groups"] for r in g["rules"]}
    # one setting moves the advisor's --web.external-url and every runbook_url together
    deploy = K.copy_deploy(tmp_path)
    cluster = deploy / "overlays" / "cluster" / "kustomization.yaml"
    url = "https://gpu-advisor.example.org"
    cluster.write_text(
        cluster.read_text().replace("external-url=http://localhost:9836", f"external-url={url}")
    )
    docs = [
        d
        for d in yaml.safe_load_all(K.render_text(deploy / "overlays" / "kube-prometheus-stack"))
        if d
    ]
    (rule,) = K.of_kind(docs, "PrometheusRule")
    urls = {
        r["alert"]: r["annotations"]["runbook_url"]
        for g in rule["spec"]["groups"]
        for r in g["rules"]
        if "alert" in r
    }
    assert urls == {name: f"{url}/runbooks/{name}" for name in alerts}
    advisor = K.named(docs, "Deployment", "gpu-advisor")
    line = K.command_line(docs, advisor, pod_of(advisor)["containers"][0])
    assert build_parser().parse_args(line).external_url == url


def test_the_dashboard_configmaps_hold_the_dashboards_of_dashboards_json():
    docs = rendered()
    maps = [
        d for d in K.of_kind(docs, "ConfigMap") if "grafana_dashboard" in d["metadata"]["labels"]
    ]
    files = {p.name: p.read_text() for p in (ROOT / "dashboards" / "json").glob("*.json")}
    held = {}
    for configmap in maps:
        assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert configmap["metadata"]["annotations"]["grafana_folder"] == "GPU"
        held.update(configmap["data"])
    assert held == files  # byte for byte
    assert all(json.loads(text)["uid"] for text in held.values())


def test_plain_prometheus_jobs_are_the_rules_jobs_and_keep_our_services_ports():
    """Debian's promtool is built without Kubernetes discovery, so the jobs are checked here:
    named as the rules select, each keeping the endpoints of one Service's named port."""
    jobs = yaml.safe_load((K.PLAIN_PROMETHEUS / "scrape-configs.yaml").read_text())
    selectors = {
        re.fullmatch(r'job="([\w-]+)"', s).group(1) for s in load_config()["selectors"].values()
    }
    assert {j["job_name"] for j in jobs} == selectors
    docs = rendered("prometheus")
    for job in jobs:
        (discovery,) = job["kubernetes_sd_configs"]
        assert discovery["role"] == "endpoints"
        (namespace,) = discovery["namespaces"]["names"]
        keep = next(r for r in job["relabel_configs"] if r.get("action") == "keep")
        assert keep["source_labels"] == [
            "__meta_kubernetes_service_name",
            "__meta_kubernetes_endpoint_port_name",
        ]
        service_name, port = keep["regex"].split(";")
        service = K.named(docs, "Service", service_name)
        assert service["metadata"]["namespace"] == namespace
        assert port in {p["name"] for p in service["spec"]["ports"]}
    assert not K.of_kind(docs, "ServiceMonitor") and not K.of_kind(docs, "PrometheusRule")
    for name in ("gpu-advisor", "gpu-defrag-app"):  # both read the chart's Prometheus
        workload = K.named(docs, "Deployment", name)
        line = K.command_line(docs, workload, pod_of(workload)["containers"][0])
        sources = [a for a in line if a.startswith("--source=prometheus+")]
        assert sources == ["--source=prometheus+http://prometheus-server.monitoring.svc:80"]


def test_advisor_cluster_role_grants_exactly_what_the_k8s_source_reads():
    """get/list/watch on every resource `advisor.ingest.kubernetes.resources` reads, and
    nothing more: no write verb, no secrets; bound to the advisor's service account."""
    from advisor.ingest.kubernetes.resources import ALL, VERBS

    docs = rendered()
    (role,) = K.of_kind(docs, "ClusterRole")
    granted = {
        (group, resource)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        if sorted(rule["verbs"]) == sorted(VERBS)
    }
    assert all(sorted(rule["verbs"]) == sorted(VERBS) for rule in role["rules"])
    assert granted == {(r.api_group, r.plural) for r in ALL}
    (binding,) = K.of_kind(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    (subject,) = binding["subjects"]
    assert subject["kind"] == "ServiceAccount" and subject["namespace"] == "gpu-defrag"
    assert subject["name"] in {a["metadata"]["name"] for a in K.of_kind(docs, "ServiceAccount")}
    advisor = K.named(docs, "Deployment", "gpu-advisor")
    pod = pod_of(advisor)
    assert pod["serviceAccountName"] == subject["name"]
    assert "--source=k8s:" in pod["containers"][0]["args"]
