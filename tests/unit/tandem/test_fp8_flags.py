"""vLLM's FP8 flags through ``tandem local``'s and ``tandem up``'s parsers to a worker's
EngineConfig (parsers only: no process is started): ``--kv-cache-dtype fp8`` and
``fp8_e4m3`` (one cache), ``fp8_e5m2`` refused by name, ``--quantization fp8``."""

from __future__ import annotations

import pytest

from tandem.engine.cli_args import engine_config_from_args
from tandem.engine.config import EngineConfig
from tandem.launcher import local, up
from tandem.launcher.argv import worker_argv
from tandem.worker.decode.cli import build_parser as decode_parser
from tandem.worker.prefill.cli import build_parser as prefill_parser


def _through_local(*flags: str) -> EngineConfig:
    args = local.build_parser().parse_args(list(flags))
    worker = decode_parser().parse_args(
        ["--port", "0", "--kv-port", "0", *local.worker_argv(args, "smollm2", 1)])
    return engine_config_from_args(worker)


def _through_up(*flags: str) -> EngineConfig:
    spec = up.spec_from_args(up.build_parser().parse_args(["--insecure", *flags]), None)
    worker = prefill_parser().parse_args(["--port", "0", *worker_argv(spec, "prefill", "m")])
    return engine_config_from_args(worker)


@pytest.mark.parametrize("through", [_through_local, _through_up], ids=["local", "up"])
@pytest.mark.parametrize("spelling", ["fp8", "fp8_e4m3"])
def test_fp8_kv_and_weights_reach_the_workers(through, spelling: str) -> None:  # type: ignore[no-untyped-def]
    config = through("--kv-cache-dtype", spelling, "--quantization", "fp8")
    assert config.resolved_kv_cache_dtype() == "fp8"
    assert config.model.quantization == "fp8"


@pytest.mark.parametrize("parser", [local.build_parser, up.build_parser, decode_parser],
                         ids=["local", "up", "worker"])
def test_e5m2_is_refused_by_name(parser, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exc:
        parser().parse_args(["--kv-cache-dtype", "fp8_e5m2"])
    assert exc.value.code == 2
    assert "fp8_e5m2 is not supported: the fp8 KV cache stores e4m3" in capsys.readouterr().err
