"""``--config FILE.yaml``: keys are long flag names, the command line wins per flag, unknown
keys and bad values are errors that name the key and never echo a value."""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem.common.arg_parser import ArgParser
from tandem.common.config_file import ConfigFileError, config_argv, load_config_file


def _parser() -> ArgParser:
    p = ArgParser(prog="toy", config_file=True)
    p.add_argument("--port", type=int, default=1)
    p.add_argument("--model-name", "--served-model-name", dest="model_name", default="")
    p.add_argument("--api-key", dest="api_keys", action="append", default=[])
    p.add_argument("--insecure", action="store_true")
    p.add_argument("--mode", choices=["a", "b"], default="a")
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--sizes", nargs="+", type=int, default=[])
    return p


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return str(path)


def test_file_sets_flags_with_dash_or_underscore_keys(tmp_path: Path) -> None:
    cfg = _write(tmp_path, "port: 7\nserved_model_name: m\napi-key: [k1, k2]\ninsecure: true\n"
                           "mode: b\ntokenizer: /t\nsizes: [1, 2]\n")
    args = _parser().parse_args(["--config", cfg])
    assert (args.port, args.model_name, args.api_keys) == (7, "m", ["k1", "k2"])
    assert (args.insecure, args.mode, args.tokenizer, args.sizes) == (True, "b", "/t", [1, 2])


def test_command_line_wins_per_flag_and_replaces_lists(tmp_path: Path) -> None:
    cfg = _write(tmp_path, "port: 7\nmodel-name: file\napi-key: [k1, k2]\ntokenizer: /t\n")
    args = _parser().parse_args(["--port", "9", f"--config={cfg}", "--model-name=cli",
                                 "--api-key", "k3"])
    assert (args.port, args.model_name, args.api_keys, args.tokenizer) == (9, "cli", ["k3"], "/t")
    # An alias counts as the same flag: the file's --model-name loses to --served-model-name.
    assert _parser().parse_args(["--config", cfg, "--served-model-name", "x"]).model_name == "x"


def test_false_leaves_a_switch_off_and_values_may_start_with_a_dash(tmp_path: Path) -> None:
    args = _parser().parse_args(["--config", _write(tmp_path, "insecure: false\nport: -1\n"
                                                               "tokenizer: t\n")])
    assert (args.insecure, args.port) == (False, -1)


@pytest.mark.parametrize(("text", "message"), [
    ("bogus: 1\ntokenizer: t\n", "unknown key 'bogus'"),
    ("config: other.yaml\n", "unknown key 'config'"),
    ("help: true\n", "unknown key 'help'"),
    ("--port: 3\n", "unknown key '--port'"),
    ("port: [1, 2]\n", "port takes one value"),
    ("insecure: yes-please\n", "insecure takes true or false"),
    ("port: {a: 1}\n", "port takes a scalar"),
    ("- port\n", "must be a mapping"),
    ("port: 'sk-secret\n", "not valid YAML (line"),
])
def test_bad_files_name_the_key_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str,
) -> None:
    with pytest.raises(SystemExit) as exc:
        _parser().parse_args(["--config", _write(tmp_path, text), "--tokenizer", "t"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and message in err and "sk-secret" not in err


def test_file_values_are_checked_like_typed_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args(["--config", _write(tmp_path, "mode: c\ntokenizer: t\n")])
    assert "invalid choice" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a required flag is still required
        _parser().parse_args(["--config", _write(tmp_path, "port: 3\n")])
    assert "--tokenizer" in capsys.readouterr().err


def test_missing_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigFileError, match="cannot read"):
        load_config_file(tmp_path / "none.yaml")
    assert load_config_file(_write(tmp_path, "# nothing\n")) == {}
    assert _parser().parse_args(["--config", str(tmp_path / "c.yaml"), "--tokenizer", "t"]).port == 1


def test_config_argv_skips_what_the_command_line_sets() -> None:
    p = _parser()
    cli = {p._option_string_actions["--port"]}
    argv = config_argv(p, {"port": 3, "mode": "b", "api_key": ["x"]}, source="f", skip=cli)
    assert argv == ["--mode=b", "--api-key=x"]


def test_a_parser_without_config_file_has_no_config_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    p = ArgParser(prog="plain")
    with pytest.raises(SystemExit):
        p.parse_args(["--config", "x.yaml"])
    assert "unrecognized arguments: --config VALUE" in capsys.readouterr().err
