"""Render the Tandem chart offline and validate what comes out.

- ``render(values_file)``: helm-python-sdk (the Helm Go SDK through ctypes; no helm binary,
  no cluster) renders every template; the result is each template's text, by path.
- ``golden_text``: the stable text a golden file holds (templates sorted, NOTES included; the
  cluster credential the chart generates, random on every offline render, and the `helm test`
  script, a file of the chart, as placeholders).
- ``pod_specs`` / ``processes``: every pod template, and every Tandem command line, of a render.
- ``launched``: every router and worker a render starts, with the flags it really gets (in
  ray mode through ``tandem up``'s own code), parsed by its real parser.
- ``validate(obj)``: core kinds with kubernetes-validate in strict mode; custom kinds with
  jsonschema against their CRD's openAPIV3Schema from ``tests/helm/crds`` (copies of ``../shared/k8s-crds``), made strict the
  way the API server is (an unknown field is an error, not silently pruned).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import copy
import functools
import hashlib
import importlib
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "tandem"
EXAMPLES = CHART / "examples"
VALUES = Path(__file__).parent / "values"
GOLDEN = Path(__file__).parent / "golden"
# Unmodified copies of ../shared/k8s-crds (provenance in crds/README.md), so CI needs no
# checkout outside this repository.
CRDS = Path(__file__).parent / "crds"
# The values files whose renders are checked (each has a golden file): examples, test cases.
CASES = sorted(EXAMPLES.glob("*.yaml")) + [VALUES / f"{name}.yaml"
                                           for name in ("deployments-hpa", "ray-tls")]
KUBE_VERSION = "1.37.0"  # the newest schemas kubernetes-validate ships
RELEASE, NAMESPACE = "tandem", "serving"

CRD_FILES = {
    ("ray.io/v1", "RayCluster"): "ray.io_rayclusters.yaml",
    ("keda.sh/v1alpha1", "ScaledObject"): "keda.sh_scaledobjects.yaml",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "monitoring.coreos.com_servicemonitors.yaml",
}


def load_values(path: Path) -> dict[str, Any]:
    """A values file as Helm reads it (``-f``)."""
    return helm.values_from_yaml(path.read_text())


# The values that turn the router's API keys off: both keys must say so.
KEYLESS = {"enabled": False, "allowUnauthenticated": True}


def keyless(path: Path) -> dict[str, Any]:
    """The values of ``path`` with the router's API keys explicitly off."""
    return {**load_values(path), "apiKey": dict(KEYLESS)}


def render(values: dict[str, Any]) -> dict[str, str]:
    """Every template's rendered text, by template path (raises HelmValuesError and co.)."""
    with helm.Chart.load(CHART) as chart:
        return chart.render(values=values, name=RELEASE, namespace=NAMESPACE, is_install=True)


# What a golden file holds instead of the generated credential (base64 in the Secret) and of its
# sha256 (the pods' checksum/cluster-secret annotation).
GENERATED_SECRET = "<generated cluster credential>"
GENERATED_CHECKSUM = "<sha256 of the generated cluster credential>"
GENERATED_METRICS_KEY = "<generated scrape key>"


@functools.cache
def render_file(path: Path) -> dict[str, str]:
    """``render`` of a values file, once per session (each render is a call into Helm)."""
    return render(load_values(path))


def golden_text(rendered: dict[str, str]) -> str:
    """What a golden file holds: non-empty templates in path order, each under its source."""
    parts = []
    for path in sorted(rendered):
        body = "\n".join(line.rstrip() for line in rendered[path].strip("\n").splitlines())
        if body.strip():
            parts.append(f"# Source: {path}\n{body}\n")
    text = "---\n".join(parts).replace(_hook_script_block(), f"{HOOK_INDENT}{HOOK_SCRIPT_TEXT}")
    secret = generated_credential(rendered)
    if secret is not None:  # offline, lookup finds no Secret: a new random one every render
        text = text.replace(base64.b64encode(secret.encode()).decode(), GENERATED_SECRET)
        text = text.replace(hashlib.sha256(secret.encode()).hexdigest(), GENERATED_CHECKSUM)
    key = generated_metrics_key(rendered)
    if key is not None:  # the router's scrape key: random offline too
        text = text.replace(base64.b64encode(key.encode()).decode(), GENERATED_METRICS_KEY)
    # The other values the chart generates (random offline), and the pods' keyed digest.
    for template, field, placeholder in GENERATED_ELSE:
        value = generated_value(rendered, template, field)
        if value is not None:
            text = text.replace(base64.b64encode(value.encode()).decode(), placeholder)
    return re.sub(r"(checksum/secrets: )[0-9a-f]{64}", rf"\g<1>{SECRETS_DIGEST}", text)


# (template, data key, placeholder) of the other generated values a golden file hides.
GENERATED_ELSE = (
    ("secrets.yaml", "api-keys", "<generated API key>"),
    ("ray-token-secret.yaml", "auth_token", "<generated Ray token>"),
    ("checksum-salt-secret.yaml", "salt", "<generated checksum salt>"),
)
SECRETS_DIGEST = "<salted sha256 of the chart's secrets>"


def generated_value(rendered: dict[str, str], template: str, key: str) -> str | None:
    """``key`` of the (first) Secret ``template`` renders with a ``data`` entry for it."""
    for path, text in rendered.items():
        if path.endswith(f"/{template}"):
            for doc in yaml.safe_load_all(text):
                if doc and doc["kind"] == "Secret" and key in doc.get("data", {}):
                    return base64.b64decode(doc["data"][key]).decode()
    return None


# The `helm test` Pod runs this file, rendered into its command (checked there by a test); a
# golden file holds a placeholder instead of a copy.
HOOK_SCRIPT = CHART / "files" / "completion_check.py"
HOOK_SCRIPT_TEXT = "<the text of files/completion_check.py>"
HOOK_INDENT = " " * 10


def _hook_script_block() -> str:
    """The script as the test Pod's command holds it, lines stripped as golden files are."""
    return "\n".join((HOOK_INDENT + line).rstrip()
                     for line in HOOK_SCRIPT.read_text().splitlines())


def generated_metrics_key(rendered: dict[str, str]) -> str | None:
    """The router's scrape key in the Secret the chart generated, or None if it made none."""
    for path, text in rendered.items():
        if path.endswith("/metrics-key-secret.yaml"):
            for doc in yaml.safe_load_all(text):
                if doc:
                    return base64.b64decode(doc["data"]["metrics-key"]).decode()
    return None


def generated_credential(rendered: dict[str, str]) -> str | None:
    """The cluster credential (hex) in the Secret the chart generated, or None if it made none."""
    for path, text in rendered.items():
        if path.endswith("/cluster-secret.yaml"):
            for doc in yaml.safe_load_all(text):
                if doc:
                    return base64.b64decode(doc["data"]["cluster-secret"]).decode()
    return None


def objects(rendered: dict[str, str]) -> list[dict[str, Any]]:
    """Every Kubernetes object the manifests hold (NOTES.txt is not a manifest)."""
    out: list[dict[str, Any]] = []
    for path in sorted(rendered):
        if path.endswith("NOTES.txt"):
            continue
        out.extend(doc for doc in yaml.safe_load_all(rendered[path]) if doc)
    return out


def by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def pod_specs(obj: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(component, pod metadata, pod spec) of every pod template in ``obj``."""
    if obj["kind"] == "Deployment":
        templates = [obj["spec"]["template"]]
    elif obj["kind"] == "RayCluster":
        spec = obj["spec"]
        templates = [spec["headGroupSpec"]["template"]]
        templates += [g["template"] for g in spec["workerGroupSpecs"]]
    else:
        return []
    return [
        (t["metadata"]["labels"]["app.kubernetes.io/component"], t["metadata"], t["spec"])
        for t in templates
    ]


@dataclass(frozen=True, slots=True)
class Process:
    """A Tandem command line of a pod: ``command`` is router|prefill|decode (a Deployment's
    container) or up (the Ray head's ``tandem up``); ``argv`` follows it."""

    kind: str
    component: str
    command: str
    argv: list[str]
    spec: dict[str, Any]


def processes(objs: list[dict[str, Any]]) -> list[Process]:
    """Every Tandem process the objects start (Ray worker pods start none: actors run there)."""
    out = []
    for obj in objs:
        for component, _, spec in pod_specs(obj):
            container = spec["containers"][0]
            if obj["kind"] == "Deployment":
                command, *argv = container["args"]
                argv = [a.replace("$(POD_IP)", "10.0.0.1").replace("$(POD_NAMESPACE)", "ns")
                        for a in argv]
                out.append(Process(obj["kind"], component, command, argv, spec))
            elif component == "router":  # the Ray head's script
                script = container["args"][0].replace("\\\n", " ")
                line = next(ln for ln in script.splitlines() if ln.strip().startswith("tandem up"))
                argv = shlex.split(line.strip().removesuffix("&"))[2:]
                out.append(Process(obj["kind"], component, "up", argv, spec))
    return out


def hook_pod(objs: list[dict[str, Any]]) -> dict[str, Any]:
    """The one `helm test` Pod of a render."""
    (pod,) = [o for o in objs if o["kind"] == "Pod"
              and o["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"]
    return pod


def container_env(pod: dict[str, Any]) -> dict[str, str]:
    """The plain ``value`` environment of a Pod's first container."""
    return {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"] if "value" in e}


ROLE_PARSERS = {
    "router": ("tandem.router.cli", []),
    "prefill": ("tandem.worker.prefill.cli", ["--port", "0"]),
    "decode": ("tandem.worker.decode.cli", ["--port", "0", "--kv-port", "0"]),
}


@dataclass(frozen=True, slots=True)
class Launched:
    """A process a render starts, as its own parser reads the flags it really gets:
    ``role`` router|prefill|decode, ``kind`` the object that starts it (Deployment or
    RayCluster), ``args`` the parsed flags."""

    role: str
    kind: str
    args: argparse.Namespace


def launched(objs: list[dict[str, Any]]) -> list[Launched]:
    """Every router and worker the objects start, parsed by the real CLI of each. A Deployment's
    container runs ``tandem <role>`` with its args; the Ray head runs ``tandem up``, parsed by
    its own parser and turned into each process's flags by its own code (``spec_from_args``,
    ``router_argv``, ``worker_argv``: what the actors receive). An unknown flag, or a ``tandem
    up`` that would refuse to start, raises AssertionError."""
    out = []
    for proc in processes(objs):
        if proc.command == "up":
            out += _launched_by_up(proc.argv)
        else:
            assert proc.command == proc.component, proc
            out.append(Launched(proc.component, proc.kind, _parse_role(proc.component, proc.argv)))
    return out


def _launched_by_up(argv: list[str]) -> list[Launched]:
    from tandem.launcher.argv import router_argv, served_name, worker_argv
    from tandem.launcher.up import _check_public_bind, build_parser, spec_from_args

    args = _parse(build_parser(), argv)
    # tandem up reads the credential file and hands each actor a copy of its own; what the
    # processes are told apart from it is what is checked here.
    args.cluster_secret_file, args.insecure = None, True
    with contextlib.redirect_stderr(io.StringIO()):  # its --insecure warning
        spec = spec_from_args(args, None)
    try:
        _check_public_bind(spec)
    except ValueError as exc:
        raise AssertionError(f"tandem up refuses to start: {exc}") from exc
    # The model as tandem up's main hands it to its pool (a path in the pod is absolute
    # already), and each actor's flags as the pool builds them (tandem/launcher/pool.py).
    model = spec.model
    out = [Launched("router", "RayCluster", _parse_role("router", router_argv(spec, model)))]
    for role in ("prefill", "decode"):
        out.append(Launched(role, "RayCluster", _parse_role(
            role, worker_argv(spec, role, model, served_name(spec)))))
    return out


def _parse_role(role: str, argv: list[str]) -> argparse.Namespace:
    module, required = ROLE_PARSERS[role]
    return _parse(importlib.import_module(module).build_parser(), [*required, *argv])


def _parse(parser: Any, argv: list[str]) -> Any:
    """Parse as the process would; a flag it does not know fails the test."""
    try:
        return parser.parse_args(argv)
    except SystemExit as exc:
        raise AssertionError(f"{parser.prog} refuses {argv}") from exc


def validate(obj: dict[str, Any]) -> None:
    """Raise when ``obj`` is not a valid object of its kind."""
    key = (obj.get("apiVersion", ""), obj.get("kind", ""))
    if key in CRD_FILES:
        _validator(*key).validate(obj)
    else:
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


@functools.cache
def _validator(api_version: str, kind: str) -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(crd_schema(api_version, kind))


@functools.cache
def crd_schema(api_version: str, kind: str) -> dict[str, Any]:
    """The openAPIV3Schema of ``kind`` at ``api_version``, strict about unknown fields."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the RayCluster CRD is ~1 MB
    crd = yaml.load((CRDS / CRD_FILES[(api_version, kind)]).read_text(), Loader=loader)
    version = api_version.split("/")[1]
    served = {v["name"]: v for v in crd["spec"]["versions"]}
    schema = copy.deepcopy(served[version]["schema"]["openAPIV3Schema"])
    _strict(schema)
    # The API server fills these in; a manifest's metadata is checked as ObjectMeta elsewhere.
    schema["properties"]["metadata"] = {"type": "object"}
    schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "spec"})
    return schema


def _strict(node: Any) -> None:
    """additionalProperties: false wherever a structural schema lists its properties."""
    if isinstance(node, dict):
        if (
            node.get("type") == "object"
            and "properties" in node
            and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            node["additionalProperties"] = False
        for value in node.values():
            _strict(value)
    elif isinstance(node, list):
        for value in node:
            _strict(value)
