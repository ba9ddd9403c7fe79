"""The chart's ``helm test`` script, taken from a rendered test Pod, against real routers on
the shared tiny workers: a plain one, and one with API keys and TLS. It passes on a 200 with
a completion and fails on anything else: a wrong key, a wrong model, a router showing
another certificate (refused before the key is sent)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tandem.launcher.local_cluster import Proc
from tests.helm.chart import VALUES, container_env, hook_pod, objects, render_file
from tests.integration.served_model import MODEL_ID, TinyWorkers, shared_router
from tests.integration.tls_certs import Certs, make_certs

KEY = "sk-helm-test"


@pytest.fixture(scope="module")
def rendered_pod() -> tuple[str, dict[str, str]]:
    """The script and environment of the test Pod of a release with keys and TLS."""
    pod = hook_pod(objects(render_file(VALUES / "deployments-hpa.yaml")))
    return pod["spec"]["containers"][0]["command"][2], container_env(pod)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def key_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "api-keys"
    path.write_text(f"# the chart's Secret holds one key a line\n\n{KEY}\nsk-another\n")
    return path


@pytest.fixture(scope="module")
def secured_router(tiny_workers: TinyWorkers, certs: Certs, key_file: Path) -> Iterator[Proc]:
    with shared_router(tiny_workers, "--prefill", tiny_workers.prefill.grpc,
                       "--api-key-file", str(key_file), "--tls-cert", str(certs.server_cert),
                       "--tls-key", str(certs.server_key)) as router:
        yield router


def _run(script: str, pod_env: dict[str, str], **overrides: str) -> subprocess.CompletedProcess:
    """The script as the Pod runs it (``python -c``), with the Pod's environment but the
    ``overrides`` (the router's address here instead of the Service's, local file paths)."""
    env = {k: v for k, v in pod_env.items() if k not in ("TANDEM_API_KEY_FILE",
                                                        "TANDEM_TLS_CERT")}
    env.update(overrides, PATH=os.environ.get("PATH", ""))
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=120)


def test_passes_against_a_plain_router_and_fails_on_a_wrong_model(
        tiny_router: Proc, rendered_pod: tuple[str, dict[str, str]]) -> None:
    script, env = rendered_pod
    url = f"http://{tiny_router.info['http']}"
    ok = _run(script, env, TANDEM_URL=url, TANDEM_MODEL=MODEL_ID)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("OK: HTTP 200")
    wrong = _run(script, env, TANDEM_URL=url, TANDEM_MODEL="not-served")
    assert wrong.returncode == 1 and "HTTP 404" in wrong.stderr


def test_with_keys_and_tls_it_needs_the_key_and_the_routers_own_certificate(
        secured_router: Proc, rendered_pod: tuple[str, dict[str, str]], certs: Certs,
        key_file: Path, tmp_path: Path) -> None:
    script, env = rendered_pod
    assert env["TANDEM_URL"].startswith("https://")  # what the chart renders with tls on
    url = f"https://{secured_router.info['http']}"
    base = {"TANDEM_URL": url, "TANDEM_MODEL": MODEL_ID, "TANDEM_TLS_CERT": str(certs.server_cert)}
    ok = _run(script, env, **base, TANDEM_API_KEY_FILE=str(key_file))
    assert ok.returncode == 0, ok.stderr
    wrong_key = tmp_path / "wrong"
    wrong_key.write_text("sk-wrong\n")
    refused = _run(script, env, **base, TANDEM_API_KEY_FILE=str(wrong_key))
    assert refused.returncode == 1 and "HTTP 401" in refused.stderr
    no_key = _run(script, env, **base)
    assert no_key.returncode == 1 and "HTTP 401" in no_key.stderr
    other_cert = _run(script, env, **{**base, "TANDEM_TLS_CERT": str(certs.client_cert)},
                      TANDEM_API_KEY_FILE=str(key_file))
    assert other_cert.returncode == 1 and "certificate other than" in other_cert.stderr
    plain = _run(script, env, **{**base, "TANDEM_URL": url.replace("https", "http")},
                 TANDEM_API_KEY_FILE=str(key_file))
    assert plain.returncode == 1 and "FAIL" in plain.stderr
