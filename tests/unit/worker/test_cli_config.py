"""Both worker roles take ``--config FILE.yaml`` (the command line winning) and no
abbreviated flags."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import pytest

from tandem.engine.cli_args import engine_config_from_args
from tandem.worker.decode import cli as decode_cli
from tandem.worker.prefill import cli as prefill_cli

YAML = """\
port: 7001
kv_port: 7002
insecure: true
quantization: int4
kv-cache-dtype: int8
max_num_seqs: 8
num-blocks: 64
no_prefix_caching: true
"""


@pytest.mark.parametrize("build", [decode_cli.build_parser, prefill_cli.build_parser])
def test_config_file_sets_role_and_engine_flags(
    tmp_path: Path, build: Callable[[], argparse.ArgumentParser],
) -> None:
    cfg = tmp_path / "worker.yaml"
    is_decode = build is decode_cli.build_parser
    cfg.write_text(YAML if is_decode else YAML.replace("kv_port: 7002\n", ""))
    args = build().parse_args(["--config", str(cfg), "--max-num-seqs", "4"])
    assert (args.port, args.insecure) == (7001, True)
    assert not is_decode or args.kv_port == 7002
    engine = engine_config_from_args(args)
    assert (engine.model.quantization, engine.cache.kv_cache_dtype) == ("int4", "int8")
    assert (engine.cache.num_blocks, engine.cache.enable_prefix_caching) == (64, False)
    assert engine.scheduler.max_num_seqs == 4  # the command line wins


@pytest.mark.parametrize(("build", "argv"), [
    (decode_cli.build_parser, ["--port", "0", "--kv-port", "0"]),
    (prefill_cli.build_parser, ["--port", "0"]),
])
def test_no_abbreviations(
    build: Callable[[], argparse.ArgumentParser], argv: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        build().parse_args([*argv, "--cluster-secret", "s3cr3t"])
    err = capsys.readouterr().err
    assert "unrecognized arguments: --cluster-secret VALUE" in err and "s3cr3t" not in err
