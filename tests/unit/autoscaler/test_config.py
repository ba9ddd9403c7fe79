"""Autoscale YAML: the shipped examples parse, and every kind of bad file is refused with
the offending key named."""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem.autoscaler.config import AutoscaleConfigError, load_config, parse_config

EXAMPLES = Path(__file__).resolve().parents[3] / "deploy" / "autoscale"


@pytest.mark.parametrize("name", ["slo", "queue", "fixed", "coupled"])
def test_shipped_examples_parse(name: str) -> None:
    cfg = load_config(EXAMPLES / f"{name}.yaml")
    assert cfg.policy == name
    assert cfg.prefill.min <= cfg.prefill.max


def test_values_and_defaults(tmp_path: Path) -> None:
    path = tmp_path / "a.yaml"
    path.write_text("policy: slo\ninterval_s: 2\nslo: {ttft_p90_s: 1}\nprefill: {max: 9}\n")
    cfg = load_config(path)
    assert cfg.interval_s == 2.0 and isinstance(cfg.interval_s, float)
    assert cfg.slo.ttft_p90_s == 1.0 and cfg.slo.itl_mean_s == 0.05  # others keep defaults
    assert (cfg.prefill.min, cfg.prefill.max) == (1, 9)
    with pytest.raises(AttributeError):
        cfg.interval_s = 3  # type: ignore[misc]  # frozen


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"interval_s": 1}, "policy"),
        ({"policy": "magic"}, "policy"),
        ({"policy": "slo", "intervall_s": 1}, "intervall_s"),
        ({"policy": "slo", "slo": {"ttft": 1}}, "slo: unknown"),
        ({"policy": "slo", "interval_s": "fast"}, "interval_s"),
        ({"policy": "slo", "interval_s": 0}, "interval_s"),
        ({"policy": "slo", "prefill": {"min": 3, "max": 2}}, "min <= max"),
        ({"policy": "slo", "decode": {"max": 1.5}}, "decode.max"),
        ({"policy": "slo", "slo": {"kv_usage": 1.5}}, "kv_usage"),
        ({"policy": "slo", "cooldown": 5}, "cooldown"),
        ({"policy": "slo", "request_resources": "yes"}, "request_resources"),
        ({"policy": "fixed", "fixed": {"prefill": 9}}, "fixed.prefill"),
        ({"policy": "coupled", "coupled": {"ttft_p90_s": 0}}, "coupled.ttft_p90_s"),
        ({"policy": "coupled", "coupled": {"kv_usage": 1.2}}, "coupled.kv_usage"),
        ({"policy": "coupled", "coupled": {"max_gain": 0.5}}, "coupled.max_gain"),
        ({"policy": "coupled", "coupled": {"lead_s": -1}}, "coupled.lead_s"),
        ({"policy": "coupled", "coupled": {"max_rows": 2.5}}, "coupled.max_rows"),
        ({"policy": "coupled", "coupled": {"tpot": 1}}, "coupled: unknown"),
        ({"policy": "coupled", "flip": {"enable": True}}, "flip: unknown"),
        ({"policy": "coupled", "flip": {"enabled": "yes"}}, "flip.enabled"),
        ({"policy": "coupled", "flip": {"flip_s": 0}}, "flip.flip_s"),
        ({"policy": "coupled", "flip": {"window_s": -1}}, "flip.window_s"),
        ({"policy": "slo", "flip": {"enabled": True}}, "only the coupled policy"),
        ([1, 2], "mapping"),
    ],
)
def test_bad_configs_are_refused(data: object, key: str) -> None:
    with pytest.raises(AutoscaleConfigError, match=key):
        parse_config(data)


def test_flip_settings_parse_with_defaults() -> None:
    cfg = parse_config({"policy": "coupled", "flip": {"enabled": True, "flip_s": 4}})
    assert cfg.flip.enabled and cfg.flip.flip_s == 4.0 and cfg.flip.window_s == 15.0
    assert not parse_config({"policy": "coupled"}).flip.enabled  # off unless asked


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(AutoscaleConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("policy: slo\nslo: {ttft_p90_s: [1,\n")
    with pytest.raises(AutoscaleConfigError, match="not valid YAML"):
        load_config(bad)
