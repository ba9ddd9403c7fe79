"""The Kubernetes Pod Security Standards' ``restricted`` profile as a checker of pod specs.

The controls and their allowed values are those the standard publishes
(https://kubernetes.io/docs/concepts/security/pod-security-standards/, the profile the Pod
Security admission controller enforces with ``pod-security.kubernetes.io/enforce:
restricted``): every Baseline control, then the Restricted ones. ``violations(meta, spec)``
names each control a pod breaks; an empty list means the pod is admitted under the profile.
"""

from __future__ import annotations

from typing import Any

# Baseline: capabilities a container may add (the container runtime's default set).
BASELINE_CAPABILITIES = frozenset({
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
    "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
})
# Baseline: namespaced sysctls isolated from other pods.
SAFE_SYSCTLS = frozenset({
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
})
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t",
                           "container_engine_t"})
# Restricted: the only volume types (the core ones and those defined through PVs).
RESTRICTED_VOLUMES = frozenset({"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                                "persistentVolumeClaim", "projected", "secret"})
VOLUME_META = frozenset({"name"})


def containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Every container of a pod spec: init, regular and ephemeral."""
    return [*spec.get("initContainers", []), *spec.get("containers", []),
            *spec.get("ephemeralContainers", [])]


def violations(meta: dict[str, Any], spec: dict[str, Any]) -> list[str]:
    """Each Baseline or Restricted control the pod (metadata, spec) breaks, with where."""
    out: list[str] = []
    pod_sc = spec.get("securityContext") or {}
    every = containers(spec)

    def sc(c: dict[str, Any]) -> dict[str, Any]:
        return c.get("securityContext") or {}

    # -- Baseline ------------------------------------------------------------------------------
    if (pod_sc.get("windowsOptions") or {}).get("hostProcess") or any(
            (sc(c).get("windowsOptions") or {}).get("hostProcess") for c in every):
        out.append("HostProcess: windowsOptions.hostProcess must be unset or false")
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            out.append(f"Host Namespaces: spec.{field} must be unset or false")
    for c in every:
        name = c.get("name", "?")
        if sc(c).get("privileged"):
            out.append(f"Privileged Containers: {name} is privileged")
        added = set((sc(c).get("capabilities") or {}).get("add") or [])
        if added - BASELINE_CAPABILITIES:
            out.append(f"Capabilities: {name} adds {sorted(added - BASELINE_CAPABILITIES)}")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            out.append(f"Host Ports: {name} sets a hostPort")
        if sc(c).get("procMount", "Default") != "Default":
            out.append(f"/proc Mount Type: {name} sets procMount {sc(c)['procMount']}")
    for v in spec.get("volumes", []):
        if "hostPath" in v:
            out.append(f"HostPath Volumes: volume {v['name']} is a hostPath")
    for owner, ctx in [("pod", pod_sc), *((c.get("name", "?"), sc(c)) for c in every)]:
        apparmor = (ctx.get("appArmorProfile") or {}).get("type", "RuntimeDefault")
        if apparmor not in ("RuntimeDefault", "Localhost"):
            out.append(f"AppArmor: {owner} sets appArmorProfile {apparmor}")
        se = ctx.get("seLinuxOptions") or {}
        if se.get("type", "") not in SELINUX_TYPES or se.get("user") or se.get("role"):
            out.append(f"SELinux: {owner} sets seLinuxOptions {se}")
        if (ctx.get("seccompProfile") or {}).get("type") == "Unconfined":
            out.append(f"Seccomp: {owner} sets seccompProfile Unconfined")
    for key, value in (meta.get("annotations") or {}).items():
        if key.startswith("container.apparmor.security.beta.kubernetes.io/") and not (
                value == "runtime/default" or value.startswith("localhost/")):
            out.append(f"AppArmor: annotation {key}={value}")
    for sysctl in pod_sc.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            out.append(f"Sysctls: {sysctl.get('name')} is not a safe sysctl")

    # -- Restricted ----------------------------------------------------------------------------
    for v in spec.get("volumes", []):
        kinds = set(v) - VOLUME_META
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f"Volume Types: volume {v['name']} is {sorted(kinds)}")
    pod_non_root = pod_sc.get("runAsNonRoot") is True
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type") in ("RuntimeDefault",
                                                                        "Localhost")
    if pod_sc.get("runAsUser") == 0:
        out.append("Running as Non-root user: the pod sets runAsUser 0")
    for c in every:
        name, ctx = c.get("name", "?"), sc(c)
        if ctx.get("allowPrivilegeEscalation") is not False:
            out.append(f"Privilege Escalation: {name} must set allowPrivilegeEscalation false")
        non_root = ctx.get("runAsNonRoot")
        if non_root is False or (non_root is None and not pod_non_root):
            out.append(f"Running as Non-root: {name} (nor the pod) sets runAsNonRoot true")
        if ctx.get("runAsUser") == 0:
            out.append(f"Running as Non-root user: {name} sets runAsUser 0")
        seccomp = (ctx.get("seccompProfile") or {}).get("type")
        if seccomp is None and not pod_seccomp:
            out.append(f"Seccomp: {name} (nor the pod) sets RuntimeDefault or Localhost")
        elif seccomp is not None and seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"Seccomp: {name} sets seccompProfile {seccomp}")
        caps = ctx.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"Capabilities: {name} must drop ALL")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            out.append(f"Capabilities: {name} may add NET_BIND_SERVICE only")
    return out
