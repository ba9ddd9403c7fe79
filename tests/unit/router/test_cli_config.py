"""The router's vLLM-style flags: ``--config FILE.yaml``, ``--served-model-name``, inline
``--api-key`` (never echoed, never in a repr), and no abbreviations."""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem.router.auth import ApiKeyFileError, ApiKeys
from tandem.router.cli import build_parser, config_from_args, main
from tandem.router.config import RouterConfig
from tandem.router.security import RouterSecurity

KEY = "sk-inline-0123456789"


def _config(tmp_path: Path, *flags: str) -> RouterConfig:
    return config_from_args(build_parser().parse_args(
        ["--tokenizer", str(tmp_path), "--max-model-len", "128", *flags]))


def test_config_file_sets_flags_and_the_command_line_wins(tmp_path: Path) -> None:
    cfg = tmp_path / "router.yaml"
    cfg.write_text(f"port: 6000\nserved-model-name: from-file\napi_key: [{KEY}]\n"
                   "max_inflight: 7\nplacement: remote\n")
    config = _config(tmp_path, "--config", str(cfg), "--port", "6001")
    assert (config.port, config.model_name, config.api_keys) == (6001, "from-file", (KEY,))
    assert (config.max_inflight, config.placement) == (7, "remote")


def test_served_model_name_is_model_name(tmp_path: Path) -> None:
    assert _config(tmp_path, "--served-model-name", "m1").model_name == "m1"
    assert _config(tmp_path, "--model-name", "m2").model_name == "m2"


def test_inline_keys_join_the_key_file_and_stay_out_of_reprs(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys"
    keys_file.write_text("sk-from-file\n")
    config = _config(tmp_path, "--insecure", "--api-key", KEY, "--api-key", "sk-second",
                     "--api-key-file", str(keys_file), "--host", "0.0.0.0")
    assert KEY not in repr(config)
    keys = RouterSecurity.from_config(config).keys  # keys: a public bind is allowed
    assert keys is not None and len(keys) == 3
    assert keys.allows(f"Bearer {KEY}") and keys.allows("Bearer sk-from-file")


def test_a_bad_inline_key_is_refused_without_quoting_it() -> None:
    with pytest.raises(ApiKeyFileError) as exc:
        ApiKeys.load("", ["sk has spaces"])
    assert "sk has" not in str(exc.value)
    assert ApiKeys.load("", ()) is None


@pytest.mark.parametrize("argv", [
    ["--api-key-fil", "sk-123"],  # no abbreviations: once --api-key-file, echoed
    ["--cluster-secret", "sk-123"],
    ["--api-key", "a", "sk-123"],
])
def test_secret_looking_unknown_flags_are_refused_without_echo(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--tokenizer", str(tmp_path), *argv])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "unrecognized arguments" in err and "sk-123" not in err
