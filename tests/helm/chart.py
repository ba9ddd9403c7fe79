"""Render the Tandem chart offline and validate what comes out.

- ``render(values_file)``: helm-python-sdk (the Helm Go SDK through ctypes; no helm binary,
  no cluster) renders every template; the result is each template's text, by path.
- ``golden_text``: the stable text a golden file holds (templates sorted, NOTES included).
- ``validate(obj)``: core kinds with kubernetes-validate in strict mode; custom kinds with
  jsonschema against their CRD's openAPIV3Schema from ``tests/helm/crds`` (copies of ``../shared/k8s-crds``), made strict the
  way the API server is (an unknown field is an error, not silently pruned).
"""

from __future__ import annotations

import copy
import functools
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


def render(values: dict[str, Any]) -> dict[str, str]:
    """Every template's rendered text, by template path (raises HelmValuesError and co.)."""
    with helm.Chart.load(CHART) as chart:
        return chart.render(values=values, name=RELEASE, namespace=NAMESPACE, is_install=True)


def golden_text(rendered: dict[str, str]) -> str:
    """What a golden file holds: non-empty templates in path order, each under its source."""
    parts = []
    for path in sorted(rendered):
        body = "\n".join(line.rstrip() for line in rendered[path].strip("\n").splitlines())
        if body.strip():
            parts.append(f"# Source: {path}\n{body}\n")
    return "---\n".join(parts)


def objects(rendered: dict[str, str]) -> list[dict[str, Any]]:
    """Every Kubernetes object the manifests hold (NOTES.txt is not a manifest)."""
    out: list[dict[str, Any]] = []
    for path in sorted(rendered):
        if path.endswith("NOTES.txt"):
            continue
        out.extend(doc for doc in yaml.safe_load_all(rendered[path]) if doc)
    return out


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
