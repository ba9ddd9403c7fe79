"""/metrics' export view: model_name on every sample, vLLM aliases that move with their source,
valid Prometheus text (colons in names) the official parser reads back."""

from __future__ import annotations

import argparse

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tandem.common.obs.metrics_export import (
    COMPAT_VLLM,
    ExportView,
    add_metrics_compat_arg,
    export_registry,
)


def _source() -> tuple[CollectorRegistry, Histogram, Counter, Gauge]:
    reg = CollectorRegistry()
    h = Histogram("tandem_ttft_seconds", "ttft", ["role"], buckets=(0.1, 1.0), registry=reg)
    c = Counter("tandem_tokens", "tokens", ["role", "model_name"], registry=reg)
    g = Gauge("tandem_usage_ratio", "usage", ["role"], registry=reg)
    return reg, h, c, g


ALIASES = {"tandem_ttft_seconds": ("vllm:ttft_seconds",),
           "tandem_tokens": ("vllm:tokens", "vllm:old_tokens"),
           "tandem_usage_ratio": ("vllm:usage_perc",)}


def _families(registry: CollectorRegistry) -> dict[str, dict[str, list[tuple[dict, float]]]]:
    """family name -> sample name -> [(labels, value)], read back from the text format."""
    out: dict[str, dict[str, list[tuple[dict, float]]]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out.setdefault(family.name, {}).setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_view_labels_every_sample_and_aliases_each_type() -> None:
    reg, h, c, g = _source()
    h.labels("router").observe(0.5)
    c.labels("router", "given").inc(3)  # a sample's own model_name wins
    g.labels("decode").set(0.25)
    fams = _families(export_registry(reg, "tiny", COMPAT_VLLM, ALIASES))
    assert set(fams) >= {"tandem_ttft_seconds", "vllm:ttft_seconds", "tandem_tokens",
                         "vllm:tokens", "vllm:old_tokens", "tandem_usage_ratio",
                         "vllm:usage_perc"}
    buckets = fams["vllm:ttft_seconds"]["vllm:ttft_seconds_bucket"]
    assert [(lb["le"], v) for lb, v in buckets] == [("0.1", 0), ("1.0", 1), ("+Inf", 1)]
    assert all(lb["model_name"] == "tiny" and lb["role"] == "router" for lb, _ in buckets)
    assert fams["vllm:ttft_seconds"]["vllm:ttft_seconds_sum"][0][1] == 0.5
    assert fams["vllm:tokens"]["vllm:tokens_total"] == [({"role": "router",
                                                          "model_name": "given"}, 3.0)]
    assert fams["vllm:old_tokens"]["vllm:old_tokens_total"][0][1] == 3.0
    assert fams["vllm:usage_perc"]["vllm:usage_perc"] == [({"role": "decode",
                                                           "model_name": "tiny"}, 0.25)]
    c.labels("router", "given").inc()  # the alias is a view: it moves with its source
    again = _families(export_registry(reg, "tiny", COMPAT_VLLM, ALIASES))
    assert again["vllm:tokens"]["vllm:tokens_total"][0][1] == 4.0


def test_compat_none_and_no_model_name() -> None:
    reg, h, _, _ = _source()
    h.labels("router").observe(0.5)
    fams = _families(export_registry(reg, "", "none", ALIASES))
    assert not any(name.startswith("vllm:") for name in fams)
    assert all("model_name" not in lb for lb, _ in fams["tandem_ttft_seconds"]
               ["tandem_ttft_seconds_count"])
    with pytest.raises(ValueError, match="compat"):
        export_registry(reg, "m", "sglang", ALIASES)
    assert list(ExportView(reg, "m", {}).collect())  # a plain Collector too


def test_compat_flag_defaults_to_vllm() -> None:
    p = argparse.ArgumentParser()
    add_metrics_compat_arg(p)
    assert p.parse_args([]).metrics_compat == "vllm"
    assert p.parse_args(["--metrics-compat", "none"]).metrics_compat == "none"
    with pytest.raises(SystemExit):
        p.parse_args(["--metrics-compat", "other"])
