"""``ArgParser``: no abbreviations, unknown arguments refused without echoing values, and
pass-through flags taking a value that starts with ``-``."""

from __future__ import annotations

import pytest

from tandem.common.arg_parser import ArgParser, redact


def _parser() -> ArgParser:
    p = ArgParser(prog="toy")
    p.add_argument("--api-key-file", default="")
    p.add_argument("--worker-arg", action="append", default=[])
    p.passthrough("--worker-arg")
    return p


@pytest.mark.parametrize("argv", [
    ["--api-key", "sk-123"],  # once prefix-matched to --api-key-file
    ["--api-key=sk-123"],
    ["--api-key-file", "f", "sk-123"],  # a stray word
])
def test_unknown_flags_are_refused_without_their_values(
    capsys: pytest.CaptureFixture[str], argv: list[str],
) -> None:
    with pytest.raises(SystemExit) as exc:
        _parser().parse_args(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "unrecognized arguments" in err and "sk-123" not in err


def test_redact_keeps_flag_names_only() -> None:
    assert redact(["--api-key", "sk-1", "--x=sk-2", "-1", "a b"]) == [
        "--api-key", "VALUE", "--x=VALUE", "-1", "VALUE"]


def test_passthrough_takes_both_spellings() -> None:
    args = _parser().parse_args(["--worker-arg", "--quantization=int4",
                                 "--worker-arg=--num-blocks=64", "--worker-arg", "--no-kv-shm"])
    assert args.worker_arg == ["--quantization=int4", "--num-blocks=64", "--no-kv-shm"]


def test_passthrough_needs_an_existing_flag() -> None:
    with pytest.raises(ValueError, match="--nope"):
        _parser().passthrough("--nope")
