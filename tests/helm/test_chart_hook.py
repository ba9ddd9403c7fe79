"""``helm test``: the chart's test Pod, rendered offline. It runs files/completion_check.py
against the router's Service, with the key and certificate of the chart's own Secrets when
keys and TLS are on (tests/integration/test_auth_tls.py runs the rendered script against a
real router)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helm.chart import (
    CASES,
    EXAMPLES,
    HOOK_SCRIPT,
    NAMESPACE,
    RELEASE,
    VALUES,
    by_kind,
    container_env,
    hook_pod,
    keyless,
    load_values,
    objects,
    pod_specs,
    render,
    render_file,
    validate,
)


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_every_release_has_a_test_pod_that_runs_the_chart_script(case: Path) -> None:
    pod = hook_pod(objects(render_file(case)))
    validate(pod)
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never" and spec["automountServiceAccountToken"] is False
    assert spec["activeDeadlineSeconds"] > int(container_env(pod)["TANDEM_TIMEOUT_S"])
    (container,) = spec["containers"]
    python, flag, script = container["command"]
    assert (python, flag) == ("python", "-c")
    assert script == HOOK_SCRIPT.read_text()
    compile(script, str(HOOK_SCRIPT), "exec")
    assert container["resources"]["limits"]["memory"]


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_it_calls_the_service_that_fronts_the_router_with_the_served_model(case: Path) -> None:
    objs = objects(render_file(case))
    env = container_env(hook_pod(objs))
    (service,) = [s for s in by_kind(objs, "Service")
                  if s["spec"]["selector"].get("app.kubernetes.io/component") == "router"]
    http = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "http")
    scheme = "https" if env.get("TANDEM_TLS_CERT") else "http"
    assert env["TANDEM_URL"] == (
        f"{scheme}://{service['metadata']['name']}.{NAMESPACE}.svc:{http}")
    # The router pod (the Ray head in ray mode) is behind that Service, serving this model id.
    router_pods = [(meta, spec) for obj in objs for c, meta, spec in pod_specs(obj)
                   if c == "router"]
    assert router_pods
    for meta, spec in router_pods:
        assert all(meta["labels"][k] == v for k, v in service["spec"]["selector"].items())
        command = " ".join(spec["containers"][0].get("args", []))
        assert f"--model-name={env['TANDEM_MODEL']}" in command or (
            f"--model-name {env['TANDEM_MODEL']}" in command)


def test_a_keyless_release_sends_no_key_and_mounts_nothing() -> None:
    pod = hook_pod(objects(render(keyless(EXAMPLES / "cpu-quickstart.yaml"))))
    env = container_env(pod)
    assert env["TANDEM_URL"] == f"http://{RELEASE}.{NAMESPACE}.svc:8000"
    assert env["TANDEM_MODEL"] == "smollm2"
    assert "TANDEM_API_KEY_FILE" not in env and "TANDEM_TLS_CERT" not in env
    assert "volumes" not in pod["spec"]


def test_a_default_release_sends_the_generated_key() -> None:
    objs = objects(render_file(EXAMPLES / "cpu-quickstart.yaml"))
    pod = hook_pod(objs)
    env = container_env(pod)
    (volume,) = pod["spec"]["volumes"]
    assert volume["secret"] == {"secretName": f"{RELEASE}-api-keys",
                                "items": [{"key": "api-keys", "path": "api-keys"}]}
    (mount,) = pod["spec"]["containers"][0]["volumeMounts"]
    assert env["TANDEM_API_KEY_FILE"] == f"{mount['mountPath']}/api-keys"
    assert f"{RELEASE}-api-keys" in {s["metadata"]["name"] for s in by_kind(objs, "Secret")}


def test_with_keys_and_tls_it_reads_the_chart_secrets_but_never_the_tls_key() -> None:
    objs = objects(render_file(VALUES / "deployments-hpa.yaml"))
    pod = hook_pod(objs)
    env = container_env(pod)
    assert env["TANDEM_URL"].startswith("https://")
    volumes = {v["name"]: v["secret"] for v in pod["spec"]["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert volumes["api-keys"]["items"] == [{"key": "api-keys", "path": "api-keys"}]
    assert volumes["tls"]["items"] == [{"key": "tls.crt", "path": "tls.crt"}]  # no tls.key
    assert env["TANDEM_API_KEY_FILE"] == f"{mounts['api-keys']}/api-keys"
    assert env["TANDEM_TLS_CERT"] == f"{mounts['tls']}/tls.crt"
    # The very Secrets the router reads.
    (router,) = [d for d in by_kind(objs, "Deployment")
                 if d["metadata"]["labels"]["app.kubernetes.io/component"] == "router"]
    router_secrets = {v["name"]: v["secret"]["secretName"]
                      for v in router["spec"]["template"]["spec"]["volumes"] if "secret" in v}
    assert volumes["api-keys"]["secretName"] == router_secrets["api-keys"]
    assert volumes["tls"]["secretName"] == router_secrets["tls"]


def test_it_can_be_turned_off() -> None:
    values = load_values(EXAMPLES / "cpu-quickstart.yaml")
    values["helmTest"] = {"enabled": False}
    assert by_kind(objects(render(values)), "Pod") == []
