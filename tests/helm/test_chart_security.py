"""The chart's trust boundaries (docs/design.md section 8), rendered offline: the cluster
credential in a Secret and in every member's flags, TLS values mapped to flags, the
NetworkPolicies and the Ray dashboard kept to the release.

Reachability is checked by evaluating the rendered NetworkPolicies the way the API defines
them (ingress: a pod selected by some policy admits only what one of their rules allows).
"""

from __future__ import annotations

import copy
import hashlib
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from tandem.common.security.credential import ClusterCredential
from tests.helm.chart import (
    CASES,
    EXAMPLES,
    NAMESPACE,
    RELEASE,
    VALUES,
    by_kind,
    generated_credential,
    golden_text,
    launched,
    load_values,
    objects,
    pod_specs,
    processes,
    render,
    render_file,
)

DEPLOYMENTS = EXAMPLES / "cpu-quickstart.yaml"
RAY = EXAMPLES / "gpu-single-node.yaml"
SECRET_FILE = "/etc/tandem/cluster/cluster-secret"
GENERATED_NAME = f"{RELEASE}-cluster-secret"


def _with(path: Path, **overrides: Any) -> dict[str, Any]:
    """The values of ``path`` with top-level keys replaced."""
    values = load_values(path)
    values.update(copy.deepcopy(overrides))
    return values


def _volume(spec: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((v for v in spec.get("volumes", []) if v["name"] == name), None)


def _mounts(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The first container's mounts by volume name."""
    return {m["name"]: m for m in spec["containers"][0].get("volumeMounts", [])}


# -- the cluster credential ---------------------------------------------------------------


@pytest.mark.parametrize("case", [DEPLOYMENTS, RAY], ids=["deployments", "ray"])
def test_a_generated_credential_is_rendered_by_default_once_per_render(
        case: Path, tmp_path: Path) -> None:
    rendered = render_file(case)
    objs = objects(rendered)
    secrets = {s["metadata"]["name"]: s for s in by_kind(objs, "Secret")}
    assert GENERATED_NAME in secrets
    secret = generated_credential(rendered)
    assert secret is not None and len(bytes.fromhex(secret)) >= 32
    # Random, not a built-in value: another (offline) render generates another one.
    assert generated_credential(render(load_values(case))) != secret
    # No pod carries it, nor a hash of it (tests/helm/test_chart_hardening.py: annotations).
    checksum = hashlib.sha256(secret.encode()).hexdigest()
    pods = [meta for obj in objs for _, meta, _ in pod_specs(obj)]
    assert pods and not any(checksum in str(m) or secret in str(m) for m in pods)
    # The goldens hold a placeholder, never a value.
    assert secret not in golden_text(rendered)
    # The file a pod sees (the volume's mode) is one the processes accept.
    (_, _, spec), *_ = pod_specs(next(o for o in objs if pod_specs(o)))
    mode = _volume(spec, "cluster-secret")["secret"]["defaultMode"]
    path = tmp_path / "cluster-secret"
    path.write_text(secret)
    os.chmod(path, mode)
    assert not mode & (stat.S_IRWXO | stat.S_IWGRP | stat.S_IXUSR)
    assert ClusterCredential.from_file(path).insecure is False


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_every_member_mounts_the_credential_and_passes_its_file(case: Path) -> None:
    values = load_values(case)
    name = values.get("clusterSecret", {}).get("existingSecret") or GENERATED_NAME
    objs = objects(render_file(case))
    pods = [(c, spec) for obj in objs for c, _, spec in pod_specs(obj)]
    assert {c for c, _ in pods} == {"router", "prefill", "decode"}
    for component, spec in pods:
        volume = _volume(spec, "cluster-secret")
        assert volume is not None, component
        assert volume["secret"]["secretName"] == name
        assert volume["secret"]["defaultMode"] & 0o777 == 0o440
        mount = _mounts(spec)["cluster-secret"]
        assert mount["readOnly"] is True
        assert SECRET_FILE == f"{mount['mountPath']}/{volume['secret']['items'][0]['path']}"
    procs = processes(objs)
    assert {p.command for p in procs} in ({"router", "prefill", "decode"}, {"up"})
    for proc in procs:
        assert f"--cluster-secret-file={SECRET_FILE}" in proc.argv, proc.command
        assert "--insecure" not in " ".join(proc.argv)


def test_an_existing_secret_is_used_and_none_is_generated() -> None:
    case = EXAMPLES / "gpu-multinode-autoscale.yaml"
    assert load_values(case)["clusterSecret"]["existingSecret"] == "tandem-credential"
    rendered = render_file(case)
    objs = objects(rendered)
    assert generated_credential(rendered) is None
    assert GENERATED_NAME not in {s["metadata"]["name"] for s in by_kind(objs, "Secret")}
    for obj in objs:
        for _, _, spec in pod_specs(obj):
            assert _volume(spec, "cluster-secret")["secret"]["secretName"] == "tandem-credential"
    assert 'Secret tandem-credential (key "cluster-secret")' in rendered[
        "tandem/templates/NOTES.txt"]


@pytest.mark.parametrize("case", [DEPLOYMENTS, RAY], ids=["deployments", "ray"])
def test_insecure_is_an_explicit_opt_in_that_the_notes_warn_about(case: Path) -> None:
    assert "WARNING: clusterSecret.insecure" not in render_file(case)["tandem/templates/NOTES.txt"]
    rendered = render(_with(case, clusterSecret={"insecure": True}))
    objs = objects(rendered)
    assert generated_credential(rendered) is None
    for obj in objs:
        for _, _, spec in pod_specs(obj):
            assert _volume(spec, "cluster-secret") is None
    procs = processes(objs)
    assert procs
    for proc in procs:
        assert "--insecure" in proc.argv and not any("cluster-secret" in a for a in proc.argv)
    assert len(launched(objs)) == 3
    notes = rendered["tandem/templates/NOTES.txt"]
    assert "WARNING: clusterSecret.insecure is set" in notes
    assert "--cluster-secret-file" not in notes


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_no_kv_secret_and_no_built_in_secret_anywhere(case: Path) -> None:
    text = golden_text(render_file(case))
    assert "kv-secret" not in text and "kvSecret" not in text
    assert "development secret" not in text and "built-in" not in text


# -- TLS values -----------------------------------------------------------------------------

WORKER_TLS = ["--tls-cert=/etc/tandem/worker-tls/tls.crt",
              "--tls-key=/etc/tandem/worker-tls/tls.key",
              "--tls-client-ca=/etc/tandem/worker-tls/ca.crt"]
ROUTER_TO_WORKER_TLS = ["--worker-ca=/etc/tandem/worker-tls/ca.crt",
                        "--worker-cert=/etc/tandem/worker-tls/tls.crt",
                        "--worker-key=/etc/tandem/worker-tls/tls.key"]
KV_TLS = ["--kv-tls-cert=/etc/tandem/kv-tls/tls.crt", "--kv-tls-key=/etc/tandem/kv-tls/tls.key",
          "--kv-tls-ca=/etc/tandem/kv-tls/ca.crt"]


def test_tls_is_off_by_default() -> None:
    for case in (DEPLOYMENTS, RAY):
        for proc in processes(objects(render_file(case))):
            assert not any("tls" in a for a in proc.argv), proc.argv


def test_tls_values_map_to_the_worker_and_router_flags_in_deployments_mode() -> None:
    objs = objects(render_file(VALUES / "deployments-hpa.yaml"))
    argv = {p.command: p.argv for p in processes(objs)}
    for role in ("prefill", "decode"):
        assert set(WORKER_TLS + KV_TLS) <= set(argv[role]), role
    assert set(ROUTER_TO_WORKER_TLS) <= set(argv["router"])
    assert not any(a.startswith("--kv-tls") for a in argv["router"])
    for obj in objs:
        for component, _, spec in pod_specs(obj):
            assert _volume(spec, "worker-tls")["secret"]["secretName"] == "tandem-worker-tls"
            kv = _volume(spec, "kv-tls")
            if component == "router":
                assert kv is None  # the router never touches KV
            else:
                assert kv["secret"]["secretName"] == "tandem-kv-tls"


def test_tls_values_reach_the_actors_through_tandem_up_in_ray_mode() -> None:
    from tandem.launcher.up import build_parser

    objs = objects(render_file(VALUES / "ray-tls.yaml"))
    (up,) = processes(objs)
    args = build_parser().parse_args(up.argv)
    assert set(args.worker_arg) >= set(WORKER_TLS + KV_TLS)
    assert set(args.router_arg) >= set(ROUTER_TO_WORKER_TLS)
    # tandem up hands the credential to each actor itself: not passed through to them.
    assert not any("cluster-secret" in a or "insecure" in a
                   for a in args.worker_arg + args.router_arg)
    assert args.cluster_secret_file == SECRET_FILE


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_every_file_a_flag_names_is_mounted_where_it_is_read(case: Path) -> None:
    """A flag's file exists in the pod of the process that opens it: a Deployment's own pod;
    tandem up's and its router's on the head; the workers' (--worker-arg, --prefill-arg,
    --decode-arg) on the Ray worker pods, where the actors run."""
    from tandem.launcher.up import build_parser

    objs = objects(render_file(case))
    worker_pods = [spec for obj in by_kind(objs, "RayCluster")
                   for c, _, spec in pod_specs(obj) if c != "router"]
    checked = 0
    for proc in processes(objs):
        where = [(proc.argv, [proc.spec])]
        if proc.command == "up":
            args = build_parser().parse_args(proc.argv)
            to_workers = ("--worker-arg", "--prefill-arg", "--decode-arg")
            own = [a for a in proc.argv if not a.startswith(("--router-arg", *to_workers))]
            where = [(own + args.router_arg, [proc.spec]),
                     (args.worker_arg + args.prefill_arg + args.decode_arg, worker_pods)]
        for argv, specs in where:
            values = [a.split("=", 1)[1] if a.startswith("--") and "=" in a else a for a in argv]
            files = [v for v in values if v.startswith("/etc/tandem/")]
            for spec in specs:
                mounts = [m["mountPath"] for m in _mounts(spec).values()]
                for path in files:
                    assert any(path.startswith(f"{m}/") for m in mounts), (proc.command, path)
                    checked += 1
    assert checked


# -- NetworkPolicies ------------------------------------------------------------------------

RELEASE_NS = {"kubernetes.io/metadata.name": NAMESPACE}
MONITORING_NS = {"kubernetes.io/metadata.name": "monitoring"}
OUTSIDER = (RELEASE_NS, {"app": "something-else"})  # any other pod of the namespace
ELSEWHERE = ({"kubernetes.io/metadata.name": "other"}, {"app": "client"})
PROMETHEUS = (MONITORING_NS, {"app.kubernetes.io/name": "prometheus"})
RAY_PORTS = [6379, 8265, 10001, 52365, 8076, 10002]  # GCS, dashboard, client, agent, ...


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A LabelSelector on ``labels`` (an empty selector selects everything)."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        key, values = e["key"], e.get("values", [])
        ok = {"In": labels.get(key) in values, "NotIn": labels.get(key) not in values,
              "Exists": key in labels, "DoesNotExist": key not in labels}[e["operator"]]
        if not ok:
            return False
    return True


def _peer_admits(peer: dict[str, Any], ns: dict[str, str], pod: dict[str, str]) -> bool:
    if "namespaceSelector" in peer:
        return _selects(peer["namespaceSelector"], ns) and _selects(peer.get("podSelector", {}),
                                                                    pod)
    if "podSelector" in peer:  # this namespace only
        return ns == RELEASE_NS and _selects(peer["podSelector"], pod)
    return False  # ipBlock: not used by the chart


def _reaches(policies: list[dict[str, Any]], src: tuple[dict[str, str], dict[str, str]],
             dst: dict[str, str], port: int) -> bool:
    """Whether a pod ``src`` = (namespace labels, pod labels) may open ``dst``:``port``."""
    selecting = [p["spec"] for p in policies if _selects(p["spec"]["podSelector"], dst)
                 and "Ingress" in p["spec"]["policyTypes"]]
    if not selecting:
        return True
    for spec in selecting:
        for rule in spec.get("ingress", []):
            ports = rule.get("ports")
            if ports and port not in {p["port"] for p in ports}:
                continue
            if not rule.get("from") or any(_peer_admits(p, *src) for p in rule["from"]):
                return True
    return False


def _network(case: Path | dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The rendered policies, and each component's pod labels as a source and a destination."""
    objs = objects(render_file(case) if isinstance(case, Path) else render(case))
    pods = {c: meta["labels"] for obj in objs for c, meta, _ in pod_specs(obj)}
    return by_kind(objs, "NetworkPolicy"), pods


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_every_pod_is_isolated_by_a_network_policy_by_default(case: Path) -> None:
    policies, pods = _network(case)
    assert policies
    for component, labels in pods.items():
        assert any(_selects(p["spec"]["podSelector"], labels) for p in policies), component


def test_network_policies_are_off_only_when_asked() -> None:
    for case in (DEPLOYMENTS, RAY):
        values = _with(case, networkPolicy={"enabled": False})
        assert by_kind(objects(render(values)), "NetworkPolicy") == []


def test_deployments_only_the_router_reaches_workers_and_only_workers_kv() -> None:
    policies, pods = _network(DEPLOYMENTS)
    router, prefill, decode = pods["router"], pods["prefill"], pods["decode"]
    ns = RELEASE_NS

    def reaches(src: Any, dst: dict[str, str], port: int) -> bool:
        return _reaches(policies, src, dst, port)

    # Workers' gRPC: the router only.
    assert reaches((ns, router), prefill, 50061) and reaches((ns, router), decode, 50062)
    for src in ((ns, decode), (ns, prefill), OUTSIDER, ELSEWHERE, PROMETHEUS):
        assert not reaches(src, prefill, 50061) and not reaches(src, decode, 50062), src
    # The decode workers' KV port: workers only.
    assert reaches((ns, prefill), decode, 50071) and reaches((ns, decode), decode, 50071)
    for src in ((ns, router), OUTSIDER, ELSEWHERE, PROMETHEUS):
        assert not reaches(src, decode, 50071), src
    # Metrics: Prometheus's namespace, nobody else.
    for dst in (prefill, decode):
        assert reaches(PROMETHEUS, dst, 9090) and not reaches(OUTSIDER, dst, 9090)
    # The router's public ports: any source, as the Service intends; nothing else.
    for src in (OUTSIDER, ELSEWHERE, PROMETHEUS):
        assert reaches(src, router, 50051) and reaches(src, router, 8000)
        assert not reaches(src, router, 9999)


def test_ray_ports_stay_inside_the_release() -> None:
    policies, pods = _network(RAY)
    head, prefill, decode = pods["router"], pods["prefill"], pods["decode"]
    members = [(RELEASE_NS, labels) for labels in (head, prefill, decode)]
    for dst in (head, prefill, decode):
        for port in RAY_PORTS:
            for src in members:
                assert _reaches(policies, src, dst, port), (src, dst, port)
            for src in (OUTSIDER, ELSEWHERE, PROMETHEUS):
                assert not _reaches(policies, src, dst, port), (src, dst, port)
        assert _reaches(policies, PROMETHEUS, dst, 8080)  # Ray's metrics export port
        assert not _reaches(policies, OUTSIDER, dst, 8080)
    for src in (OUTSIDER, ELSEWHERE):
        assert _reaches(policies, src, head, 50051) and _reaches(policies, src, head, 8000)


def test_router_and_metrics_sources_come_from_values() -> None:
    ingress_ns = {"kubernetes.io/metadata.name": "ingress-nginx"}
    values = _with(DEPLOYMENTS, networkPolicy={
        "router": {"from": [{"namespaceSelector": {"matchLabels": ingress_ns}}]}})
    policies, pods = _network(values)
    assert _reaches(policies, (ingress_ns, {"app": "nginx"}), pods["router"], 50051)
    assert not _reaches(policies, OUTSIDER, pods["router"], 50051)
    assert _reaches(policies, PROMETHEUS, pods["router"], 8000)  # the router's /metrics
    policies, pods = _network(VALUES / "ray-tls.yaml")  # metrics.from: one namespace's pod
    observability = ({"kubernetes.io/metadata.name": "observability"},
                     {"app.kubernetes.io/name": "prometheus"})
    assert _reaches(policies, observability, pods["decode"], 8080)
    assert not _reaches(policies, PROMETHEUS, pods["decode"], 8080)
    assert not _reaches(policies, (observability[0], {"app": "x"}), pods["decode"], 8080)


@pytest.mark.parametrize("case", [DEPLOYMENTS, RAY], ids=["deployments", "ray"])
def test_helm_test_pod_reaches_the_router_however_narrow_router_from_is(case: Path) -> None:
    ingress_ns = {"kubernetes.io/metadata.name": "ingress-nginx"}
    values = _with(case, networkPolicy={
        "router": {"from": [{"namespaceSelector": {"matchLabels": ingress_ns}}]}})
    objs = objects(render(values))
    policies = by_kind(objs, "NetworkPolicy")
    (hook,) = [o for o in by_kind(objs, "Pod")
               if o["metadata"]["annotations"]["helm.sh/hook"] == "test"]
    router = next(meta["labels"] for obj in objs for c, meta, _ in pod_specs(obj)
                  if c == "router")
    assert _reaches(policies, (RELEASE_NS, hook["metadata"]["labels"]), router, 8000)
    assert not _reaches(policies, OUTSIDER, router, 8000)
    values["helmTest"] = {"enabled": False}  # no test Pod: no door left open for one
    policies = by_kind(objects(render(values)), "NetworkPolicy")
    if case == DEPLOYMENTS:  # (ray: release pods reach the head anyway)
        assert not _reaches(policies, (RELEASE_NS, hook["metadata"]["labels"]), router, 8000)


# -- the Ray dashboard --------------------------------------------------------------------


def test_ray_dashboard_binds_to_localhost_and_no_service_publishes_ray_ports() -> None:
    objs = objects(render_file(RAY))
    (cluster,) = by_kind(objs, "RayCluster")
    head = cluster["spec"]["headGroupSpec"]
    assert head["rayStartParams"]["dashboard-host"] == "127.0.0.1"
    assert head["rayStartParams"]["num-cpus"] == "0"
    # KubeRay's head Service publishes the head container's ports: not the dashboard's or the
    # Ray client's.
    ports = {p["containerPort"] for p in head["template"]["spec"]["containers"][0]["ports"]}
    assert ports.isdisjoint({8265, 10001})
    for service in by_kind(objs, "Service"):
        assert {p["port"] for p in service["spec"]["ports"]}.isdisjoint({8265, 10001, 6379})
    # Other rayStartParams keep the default; an explicit dashboard-host wins (no duplicate key).
    (cluster,) = by_kind(objects(render_file(VALUES / "ray-tls.yaml")), "RayCluster")
    params = cluster["spec"]["headGroupSpec"]["rayStartParams"]
    assert params["dashboard-host"] == "0.0.0.0" and params["object-store-memory"] == "1000000000"
    values = _with(RAY, ray={"head": {"rayStartParams": {"temp-dir": "/tmp/ray"}}})
    (cluster,) = by_kind(objects(render(values)), "RayCluster")
    assert cluster["spec"]["headGroupSpec"]["rayStartParams"]["dashboard-host"] == "127.0.0.1"


@pytest.mark.parametrize("case", [DEPLOYMENTS, RAY], ids=["deployments", "ray"])
def test_a_keyless_router_is_asked_for_and_said_so(case: Path) -> None:
    """The default router takes keys (the chart generates one): the chart never passes
    --allow-unauthenticated by itself. Keys off need apiKey.allowUnauthenticated as well; then
    the flag goes to the router and NOTES warns."""
    default = render_file(case)
    assert "--allow-unauthenticated" not in "".join(default.values())
    assert "WARNING: apiKey.enabled" not in default["tandem/templates/NOTES.txt"]
    with pytest.raises(Exception, match="allowUnauthenticated"):
        render(_with(case, apiKey={"enabled": False}))
    keyless = render(_with(case, apiKey={"enabled": False, "allowUnauthenticated": True}))
    assert "--allow-unauthenticated" in "".join(keyless.values())
    assert "WARNING: apiKey.enabled is false" in keyless["tandem/templates/NOTES.txt"]
    keyed = render(_with(case, apiKey={"enabled": True, "keys": ["k1"]}))
    assert "--allow-unauthenticated" not in "".join(keyed.values())
