"""The Pod Security Standards' Baseline and Restricted controls (kubernetes.io/docs/concepts/
security/pod-security-standards, policy version v1.33), checked on a pod template as Pod Security
Admission checks a pod: `violations(pod_spec, level)` lists each control the spec breaks, in
the policy's words. No cluster here runs the admission plugin, so the manifests' namespaces
and pods are held to these checks instead; tests/ops/test_kubernetes.py shows they catch each
control.
"""

from __future__ import annotations

from collections.abc import Iterator

LEVELS = ("privileged", "baseline", "restricted")
# Baseline: capabilities that may be added beyond the runtime's default set.
BASELINE_CAPABILITIES = {
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
}
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
# Restricted: the volume types allowed.
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
_VOLUME_FIELDS_IGNORED = {"name"}


def _containers(pod: dict) -> Iterator[dict]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from pod.get(key, [])


def _security(container: dict) -> dict:
    return container.get("securityContext") or {}


def baseline(pod: dict) -> list[str]:
    pod_security = pod.get("securityContext") or {}
    found = []
    windows = [pod_security.get("windowsOptions") or {}] + [
        _security(c).get("windowsOptions") or {} for c in _containers(pod)
    ]
    if any(w.get("hostProcess") for w in windows):
        found.append("HostProcess: windowsOptions.hostProcess must not be true")
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            found.append(f"Host Namespaces: {field} must not be true")
    for c in _containers(pod):
        name, security = c["name"], _security(c)
        if security.get("privileged"):
            found.append(f"Privileged Containers: {name} is privileged")
        added = set((security.get("capabilities") or {}).get("add") or [])
        if added - BASELINE_CAPABILITIES:
            found.append(f"Capabilities: {name} adds {sorted(added - BASELINE_CAPABILITIES)}")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            found.append(f"Host Ports: {name} sets hostPort")
        if security.get("procMount", "Default") != "Default":
            found.append(f"/proc Mount Type: {name} is not Default")
    for volume in pod.get("volumes", []):
        if "hostPath" in volume:
            found.append(f"HostPath Volumes: {volume['name']} is a hostPath")
    for owner, security in [("pod", pod_security)] + [
        (c["name"], _security(c)) for c in _containers(pod)
    ]:
        apparmor = (security.get("appArmorProfile") or {}).get("type")
        if apparmor not in (None, "RuntimeDefault", "Localhost"):
            found.append(f"AppArmor: {owner} sets {apparmor}")
        selinux = security.get("seLinuxOptions") or {}
        if (
            selinux.get("type", "") not in SELINUX_TYPES
            or selinux.get("user")
            or selinux.get("role")
        ):
            found.append(f"SELinux: {owner} sets {selinux}")
        seccomp = (security.get("seccompProfile") or {}).get("type")
        if seccomp == "Unconfined":
            found.append(f"Seccomp: {owner} is Unconfined")
    for sysctl in pod_security.get("sysctls", []):
        if sysctl["name"] not in SAFE_SYSCTLS:
            found.append(f"Sysctls: {sysctl['name']} is not safe")
    return found


def restricted(pod: dict) -> list[str]:
    pod_security = pod.get("securityContext") or {}
    found = baseline(pod)
    for volume in pod.get("volumes", []):
        kinds = set(volume) - _VOLUME_FIELDS_IGNORED
        if kinds - RESTRICTED_VOLUMES:
            found.append(f"Volume Types: {volume['name']} is {sorted(kinds)}")
    pod_seccomp = (pod_security.get("seccompProfile") or {}).get("type")
    for c in _containers(pod):
        name, security = c["name"], _security(c)
        if security.get("allowPrivilegeEscalation") is not False:
            found.append(f"Privilege Escalation: {name} must set allowPrivilegeEscalation false")
        non_root = security.get("runAsNonRoot", pod_security.get("runAsNonRoot"))
        if non_root is not True:
            found.append(f"Running as Non-root: {name} must run with runAsNonRoot true")
        if security.get("runAsUser", pod_security.get("runAsUser")) == 0:
            found.append(f"Running as Non-root user: {name} runs as user 0")
        seccomp = (security.get("seccompProfile") or {}).get("type", pod_seccomp)
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"Seccomp: {name} must use RuntimeDefault or Localhost, not {seccomp}")
        capabilities = security.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            found.append(f"Capabilities: {name} must drop ALL")
        if set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}:
            found.append(f"Capabilities: {name} may add only NET_BIND_SERVICE")
    if pod_security.get("runAsUser") == 0:
        found.append("Running as Non-root user: the pod runs as user 0")
    return found


def violations(pod: dict, level: str) -> list[str]:
    """What in `pod` (a PodSpec) the `level` of the Pod Security Standards forbids."""
    if level == "privileged":
        return []
    if level == "baseline":
        return baseline(pod)
    if level == "restricted":
        return restricted(pod)
    raise ValueError(f"unknown Pod Security level {level!r}")
