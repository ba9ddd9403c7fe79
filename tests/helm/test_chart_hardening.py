"""The chart secure by default, rendered offline: every pod passes the ``restricted`` Pod
Security Standard (tests/helm/pss.py), Ray runs with token auth, the router takes API keys
unless told otherwise, pod annotations carry nothing derived from a secret but a salted
digest, and egress is limited to what each pod needs.

The pods checked are the ones the cluster will run: each Deployment's template, the `helm
test` Pod, and in ray mode the pods KubeRay builds from the RayCluster (its head and worker
templates plus what the operator adds: the autoscaler sidecar from ``autoscalerOptions``, the
workers' ``wait-gcs-ready`` init container, which copies the Ray container's securityContext,
env and mounts, and the /dev/shm and /tmp/ray emptyDirs; ray-project/kuberay
ray-operator/controllers/ray/common/pod.go).
"""

from __future__ import annotations

import base64
import copy
import hashlib
import ipaddress
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helm.chart import (
    CASES,
    EXAMPLES,
    NAMESPACE,
    RELEASE,
    VALUES,
    by_kind,
    generated_credential,
    generated_metrics_key,
    generated_value,
    golden_text,
    hook_pod,
    launched,
    load_values,
    objects,
    pod_specs,
    render,
    render_file,
)
from tests.helm.pss import containers, violations
from tests.helm.test_chart_security import _selects

DEPLOYMENTS = EXAMPLES / "cpu-quickstart.yaml"
RAY = EXAMPLES / "gpu-multinode-autoscale.yaml"  # KubeRay's autoscaler on
RAY_FIXED = EXAMPLES / "gpu-single-node.yaml"  # no autoscaler


def _with(path: Path, **overrides: Any) -> dict[str, Any]:
    values = load_values(path)
    values.update(copy.deepcopy(overrides))
    return values


def kuberay_pods(cluster: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(name, pod metadata, pod spec) of the pods KubeRay creates from ``cluster``."""
    spec = cluster["spec"]
    out = []
    head = copy.deepcopy(spec["headGroupSpec"]["template"])
    head["spec"]["volumes"] = [*head["spec"].get("volumes", []),
                               {"name": "shared-mem", "emptyDir": {"medium": "Memory"}}]
    if spec.get("enableInTreeAutoscaling"):
        options = spec.get("autoscalerOptions", {})
        head["spec"]["volumes"].append({"name": "ray-logs", "emptyDir": {}})
        head["spec"]["containers"].append({
            "name": "autoscaler", "env": options.get("env", []),
            "volumeMounts": options.get("volumeMounts", []),
            **({"securityContext": options["securityContext"]}
               if "securityContext" in options else {})})
    out.append(("head", head["metadata"], head["spec"]))
    for group in spec["workerGroupSpecs"]:
        pod = copy.deepcopy(group["template"])
        ray_container = pod["spec"]["containers"][0]
        pod["spec"]["initContainers"] = [{
            "name": "wait-gcs-ready", "env": ray_container.get("env", []),
            "volumeMounts": ray_container.get("volumeMounts", []),
            **({"securityContext": ray_container["securityContext"]}
               if "securityContext" in ray_container else {})}]
        pod["spec"]["volumes"] = [*pod["spec"].get("volumes", []),
                                  {"name": "shared-mem", "emptyDir": {"medium": "Memory"}}]
        out.append((group["groupName"], pod["metadata"], pod["spec"]))
    return out


def every_pod(objs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(name, metadata, spec) of every pod the objects make the cluster run."""
    out = []
    for obj in objs:
        if obj["kind"] == "Deployment":
            out += [(obj["metadata"]["name"], meta, spec) for _, meta, spec in pod_specs(obj)]
        elif obj["kind"] == "RayCluster":
            out += kuberay_pods(obj)
    hook = hook_pod(objs)
    return [*out, ("helm-test", hook["metadata"], hook["spec"])]


VARIANTS = {
    "keyless": {"apiKey": {"enabled": False, "allowUnauthenticated": True}},
    "insecure": {"clusterSecret": {"insecure": True}},
    "pvc": {"model": {"name": "m", "pvc": {"enabled": True, "claimName": "models"}}},
}


# -- the restricted Pod Security Standard ---------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_every_pod_passes_the_restricted_pod_security_standard(case: Path) -> None:
    pods = every_pod(objects(render_file(case)))
    assert len(pods) >= 4
    for name, meta, spec in pods:
        assert violations(meta, spec) == [], name


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("case", [DEPLOYMENTS, RAY], ids=["deployments", "ray"])
def test_other_values_keep_every_pod_restricted(case: Path, variant: str) -> None:
    for name, meta, spec in every_pod(objects(render(_with(case, **VARIANTS[variant])))):
        assert violations(meta, spec) == [], name


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_root_filesystems_are_read_only_with_scratch_space_where_processes_write(
        case: Path) -> None:
    """Every container of ours runs read-only; Tandem's and Ray's get emptyDirs at /tmp
    (Ray's session directory, temp files) and at the home directory (compiler caches)."""
    for name, _, spec in every_pod(objects(render_file(case))):
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for c in containers(spec):
            assert c["securityContext"]["readOnlyRootFilesystem"] is True, (name, c["name"])
            mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
            if name == "helm-test":
                continue  # python -c over HTTP: writes nothing
            assert "emptyDir" in volumes[mounts["/tmp"]], (name, c["name"])
            assert "emptyDir" in volumes[mounts["/home/tandem"]], (name, c["name"])


def _a_pod() -> tuple[dict[str, Any], dict[str, Any]]:
    (_, meta, spec), *_ = every_pod(objects(render_file(DEPLOYMENTS)))
    return copy.deepcopy(meta), copy.deepcopy(spec)


BREAKS = {
    "privileged": ("Privileged", lambda m, s: s["containers"][0]["securityContext"].update(
        privileged=True)),
    "host-network": ("Host Namespaces", lambda m, s: s.update(hostNetwork=True)),
    "host-path": ("HostPath", lambda m, s: s["volumes"].append(
        {"name": "h", "hostPath": {"path": "/"}})),
    "nfs": ("Volume Types", lambda m, s: s["volumes"].append(
        {"name": "n", "nfs": {"server": "x", "path": "/"}})),
    "host-port": ("Host Ports", lambda m, s: s["containers"][0]["ports"][0].update(
        hostPort=8080)),
    "escalation": ("Privilege Escalation", lambda m, s: s["containers"][0][
        "securityContext"].update(allowPrivilegeEscalation=True)),
    "root": ("Non-root", lambda m, s: (s["securityContext"].pop("runAsNonRoot"),
                                      s["containers"][0]["securityContext"].pop("runAsNonRoot"))),
    "uid-0": ("Non-root user", lambda m, s: s["securityContext"].update(runAsUser=0)),
    "sys-admin": ("Capabilities", lambda m, s: s["containers"][0]["securityContext"][
        "capabilities"].update(add=["SYS_ADMIN"])),
    "keeps-caps": ("must drop ALL", lambda m, s: s["containers"][0]["securityContext"][
        "capabilities"].update(drop=[])),
    "unconfined": ("Seccomp", lambda m, s: s["containers"][0]["securityContext"].update(
        seccompProfile={"type": "Unconfined"})),
    "no-seccomp": ("Seccomp", lambda m, s: (s["securityContext"].pop("seccompProfile"),
                                            s["containers"][0]["securityContext"].pop(
                                                "seccompProfile"))),
    "sysctl": ("Sysctls", lambda m, s: s["securityContext"].update(
        sysctls=[{"name": "kernel.msgmax", "value": "1"}])),
    "apparmor": ("AppArmor", lambda m, s: m.setdefault("annotations", {}).update({
        "container.apparmor.security.beta.kubernetes.io/router": "unconfined"})),
}


@pytest.mark.parametrize("what", sorted(BREAKS))
def test_the_checker_names_each_broken_control(what: str) -> None:
    control, breaks = BREAKS[what]
    meta, spec = _a_pod()
    assert violations(meta, spec) == []
    breaks(meta, spec)
    found = violations(meta, spec)
    assert found and any(control in v for v in found), found


# -- Ray's token auth -------------------------------------------------------------------------


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


@pytest.mark.parametrize("case", [RAY, RAY_FIXED, VALUES / "ray-tls.yaml"],
                         ids=["autoscaled", "fixed", "tls"])
def test_every_ray_process_runs_with_token_auth_from_one_secret(case: Path) -> None:
    rendered = render_file(case)
    objs = objects(rendered)
    (cluster,) = by_kind(objs, "RayCluster")
    name = f"{RELEASE}-ray-token"
    (secret,) = [s for s in by_kind(objs, "Secret") if s["metadata"]["name"] == name]
    token = base64.b64decode(secret["data"]["auth_token"]).decode()
    assert len(bytes.fromhex(token)) == 32
    assert generated_value(render(load_values(case)), "ray-token-secret.yaml",
                           "auth_token") != token  # random: no built-in token
    assert token not in golden_text(rendered)
    ray_containers = [c for _, _, spec in kuberay_pods(cluster) for c in containers(spec)]
    assert {c["name"] for c in ray_containers} >= {"ray-head", "ray-worker", "wait-gcs-ready"}
    if cluster["spec"]["enableInTreeAutoscaling"]:
        assert "autoscaler" in {c["name"] for c in ray_containers}
    for c in ray_containers:
        env = _env(c)
        assert env["RAY_AUTH_MODE"]["value"] == "token", c["name"]
        assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {
            "name": name, "key": "auth_token"}, c["name"]
    assert "RAY_AUTH_MODE=token" in rendered["tandem/templates/NOTES.txt"]
    # tandem up (on the head) joins it as a member: no --insecure, so it checks the token.
    assert all("--insecure" not in str(vars(p.args)) for p in launched(objs))


def test_a_ray_token_secret_of_ones_own_is_used_and_none_generated() -> None:
    values = load_values(RAY)
    values["ray"]["auth"] = {"existingSecret": "my-ray-token"}
    objs = objects(render(values))
    assert not [s for s in by_kind(objs, "Secret") if s["metadata"]["name"].endswith("-ray-token")]
    (cluster,) = by_kind(objs, "RayCluster")
    for _, _, spec in kuberay_pods(cluster):
        for c in containers(spec):
            assert _env(c)["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "my-ray-token"


def test_a_ray_without_token_auth_is_refused() -> None:
    values = load_values(RAY)
    values["ray"]["rayVersion"] = "2.51.0"
    with pytest.raises(Exception, match="2.52.0"):
        render(values)


# -- API keys -------------------------------------------------------------------------------


@pytest.mark.parametrize("case", [DEPLOYMENTS, RAY_FIXED], ids=["deployments", "ray"])
def test_the_default_install_generates_an_api_key_and_says_how_to_read_it(case: Path) -> None:
    assert "apiKey" not in load_values(case)  # the chart's defaults
    rendered = render_file(case)
    objs = objects(rendered)
    key = generated_value(rendered, "secrets.yaml", "api-keys")
    assert key is not None and len(bytes.fromhex(key)) == 32
    assert generated_value(render(load_values(case)), "secrets.yaml", "api-keys") != key
    assert key not in golden_text(rendered)
    (router,) = [p for p in launched(objs) if p.role == "router"]
    assert router.args.api_key_file == "/etc/tandem/api-keys/api-keys"
    assert not router.args.allow_unauthenticated
    notes = rendered["tandem/templates/NOTES.txt"]
    assert (f"kubectl -n {NAMESPACE} get secret {RELEASE}-api-keys -o jsonpath='{{.data.api-keys}}'"
            " | base64 -d | head -n 1") in notes
    # Keys of one's own: none generated.
    keyed = render(_with(case, apiKey={"enabled": True, "keys": ["mine"]}))
    assert "api-keys: |\n    mine" in keyed["tandem/templates/secrets.yaml"]
    assert "was generated by the chart" not in keyed["tandem/templates/NOTES.txt"]
    given = objects(render(_with(case, apiKey={"enabled": True, "existingSecret": "k"})))
    assert not [s for s in by_kind(given, "Secret") if s["metadata"]["name"].endswith("-api-keys")]


# -- pod annotations ----------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_pod_annotations_carry_no_secret_nor_a_hash_of_one(case: Path) -> None:
    rendered = render_file(case)
    secrets = [s for s in (
        generated_credential(rendered), generated_metrics_key(rendered),
        generated_value(rendered, "secrets.yaml", "api-keys"),
        generated_value(rendered, "ray-token-secret.yaml", "auth_token"),
        generated_value(rendered, "checksum-salt-secret.yaml", "salt"),
        *load_values(case).get("apiKey", {}).get("keys", []),
        rendered["tandem/templates/secrets.yaml"],
    ) if s and s.strip()]
    leaks = {s for s in secrets} | {hashlib.sha256(s.encode()).hexdigest() for s in secrets}
    leaks |= {hashlib.sha256(f"{s}\n".encode()).hexdigest() for s in secrets}
    annotations = [m.get("annotations", {}) for obj in objects(rendered)
                   for _, m, _ in pod_specs(obj)]
    assert annotations
    for a in annotations:
        text = yaml.safe_dump(a)
        assert not [x for x in leaks if x in text]


def test_the_rollout_digest_is_keyed_and_follows_the_secrets() -> None:
    """checksum/secrets = sha256(salt, what the chart's Secrets hold): it changes when a key
    changes, and without the salt (a Secret) it cannot be checked against a guess."""
    values = _with(DEPLOYMENTS, apiKey={"enabled": True, "keys": ["key-one"]})
    rendered = render(values)
    salt = generated_value(rendered, "checksum-salt-secret.yaml", "salt")
    assert salt is not None and len(bytes.fromhex(salt)) == 32
    material = [rendered["tandem/templates/secrets.yaml"], generated_credential(rendered)]
    digest = hashlib.sha256(f"{salt}\n{chr(10).join(material)}".encode()).hexdigest()
    pods = [m for obj in objects(rendered) for _, m, _ in pod_specs(obj)]
    assert {m["annotations"]["checksum/secrets"] for m in pods} == {digest}
    other = rendered["tandem/templates/secrets.yaml"].replace("key-one", "key-two")
    assert hashlib.sha256(
        f"{salt}\n{other}\n{material[1]}".encode()).hexdigest() != digest


# -- egress -------------------------------------------------------------------------------------

RELEASE_NS = {"kubernetes.io/metadata.name": NAMESPACE}
DNS = ({"kubernetes.io/metadata.name": "kube-system"}, {"k8s-app": "kube-dns"})
OUTSIDER = (RELEASE_NS, {"app": "something-else"})
API_SERVER = "10.96.0.1"
INTERNET = "93.184.216.34"


def _egress_allows(policies: list[dict[str, Any]], src: dict[str, str],
                   dst: tuple[dict[str, str], dict[str, str]] | str, port: int,
                   protocol: str = "TCP") -> bool:
    """Whether a pod of this namespace labelled ``src`` may open ``dst`` (namespace labels,
    pod labels; or an IP outside the cluster's pods) on ``port``, as the API defines egress:
    a pod selected by some Egress policy reaches only what one of their rules allows."""
    selecting = [p["spec"] for p in policies if _selects(p["spec"]["podSelector"], src)
                 and "Egress" in p["spec"]["policyTypes"]]
    if not selecting:
        return True

    def peer_admits(peer: dict[str, Any]) -> bool:
        if isinstance(dst, str):
            block = peer.get("ipBlock")
            return bool(block) and ipaddress.ip_address(dst) in ipaddress.ip_network(
                block["cidr"]) and not any(ipaddress.ip_address(dst) in ipaddress.ip_network(e)
                                           for e in block.get("except", []))
        ns, pod = dst
        if "namespaceSelector" in peer:
            return _selects(peer["namespaceSelector"], ns) and _selects(
                peer.get("podSelector", {}), pod)
        if "podSelector" in peer:
            return ns == RELEASE_NS and _selects(peer["podSelector"], pod)
        return False

    for spec in selecting:
        for rule in spec.get("egress", []):
            ports = rule.get("ports")
            if ports and not any(p["port"] == port and p.get("protocol", "TCP") == protocol
                                 for p in ports):
                continue
            if not rule.get("to") or any(peer_admits(p) for p in rule["to"]):
                return True
    return False


def _policies_and_pods(values: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    objs = objects(render(values))
    pods = {c: meta["labels"] for obj in objs for c, meta, _ in pod_specs(obj)}
    return by_kind(objs, "NetworkPolicy"), pods


def test_deployments_egress_is_each_pods_peers_dns_and_the_api_for_discovery() -> None:
    policies, pods = _policies_and_pods(load_values(DEPLOYMENTS))
    router, prefill, decode = pods["router"], pods["prefill"], pods["decode"]

    def ok(src: dict[str, str], dst: Any, port: int, protocol: str = "TCP") -> bool:
        return _egress_allows(policies, src, dst, port, protocol)

    for src in (router, prefill, decode):
        assert ok(src, DNS, 53, "UDP") and ok(src, DNS, 53, "TCP")
        assert not ok(src, OUTSIDER, 80) and not ok(src, INTERNET, 80)
    # The router: the workers' gRPC and the Kubernetes API (its pod discovery); nothing else.
    assert ok(router, (RELEASE_NS, prefill), 50061) and ok(router, (RELEASE_NS, decode), 50062)
    assert not ok(router, (RELEASE_NS, decode), 50071)
    assert ok(router, API_SERVER, 443)
    # Workers: KV transfers to the decode workers; not the router, not the API.
    for src in (prefill, decode):
        assert ok(src, (RELEASE_NS, decode), 50071)
        assert not ok(src, (RELEASE_NS, decode), 50062)
        assert not ok(src, (RELEASE_NS, router), 50051)
        assert not ok(src, API_SERVER, 443) and not ok(src, INTERNET, 443)


def test_ray_egress_stays_in_the_release_and_the_api_only_for_the_autoscaler() -> None:
    for case, autoscaler in ((RAY, True), (RAY_FIXED, False)):
        policies, pods = _policies_and_pods(load_values(case))
        members = [pods["router"], pods["prefill"], pods["decode"]]
        for src in members:
            assert _egress_allows(policies, src, DNS, 53, "UDP")
            assert not _egress_allows(policies, src, OUTSIDER, 6379)
            assert not _egress_allows(policies, src, INTERNET, 80)
            for dst in members:
                for port in (6379, 8265, 10001, 50051, 52365):
                    assert _egress_allows(policies, src, (RELEASE_NS, dst), port)
        # kubeApi.to is [] by default: the API's ports at any address, for the head only.
        assert _egress_allows(policies, pods["router"], API_SERVER, 443) == autoscaler
        for worker in (pods["prefill"], pods["decode"]):
            assert not _egress_allows(policies, worker, API_SERVER, 443)
            assert not _egress_allows(policies, worker, INTERNET, 443)


def test_egress_extra_rules_and_a_narrowed_api_come_from_values() -> None:
    collector = {"to": [{"ipBlock": {"cidr": "10.1.2.0/24"}}],
                 "ports": [{"port": 4317, "protocol": "TCP"}]}
    values = _with(DEPLOYMENTS, networkPolicy={"egress": {
        "enabled": True, "dns": [{"namespaceSelector": {}, "podSelector": {
            "matchLabels": {"k8s-app": "kube-dns"}}}],
        "kubeApi": {"to": [{"ipBlock": {"cidr": f"{API_SERVER}/32"}}], "ports": [443]},
        "extra": [collector]}})
    policies, pods = _policies_and_pods(values)
    for src in pods.values():
        assert _egress_allows(policies, src, "10.1.2.3", 4317)
        assert not _egress_allows(policies, src, "10.1.3.3", 4317)
    assert _egress_allows(policies, pods["router"], API_SERVER, 443)
    assert not _egress_allows(policies, pods["router"], INTERNET, 443)
    off = _with(DEPLOYMENTS, networkPolicy={"egress": {"enabled": False}})
    for policy in by_kind(objects(render(off)), "NetworkPolicy"):
        assert policy["spec"]["policyTypes"] == ["Ingress"] and "egress" not in policy["spec"]
