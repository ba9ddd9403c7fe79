"""``tandem up`` passes engine flags to its workers (and the router the ones it shares), takes
``--worker-arg`` in both spellings, and reads ``--config`` (parse level, no Ray started)."""

from __future__ import annotations

from pathlib import Path

from decode_worker.cli import build_parser as decode_parser
from router.cli import build_parser as router_parser
from tandem.launcher.argv import router_argv, worker_argv
from tandem.launcher.spec import LaunchSpec
from tandem.launcher.up import _check_public_bind, build_parser, spec_from_args

VLLM_LINE = ["--model", "smollm2", "--served-model-name", "tiny", "--max-model-len", "2048",
             "--quantization", "int4", "--kv-cache-dtype", "int8", "--max-num-seqs", "8",
             "--num-blocks", "256", "--dtype", "float32", "--device", "cpu", "--insecure"]


def _spec(*argv: str) -> LaunchSpec:
    return spec_from_args(build_parser().parse_args(list(argv)), None)


def test_engine_flags_reach_the_workers_and_the_router() -> None:
    spec = _spec(*VLLM_LINE, "--prefill-gpus", "1", "--worker-arg", "--no-kv-shm")
    argv = worker_argv(spec, "prefill", "smollm2")
    # The GPU request implies --device cuda; the --device given comes later and wins.
    assert argv[:4] == ["--model", "smollm2", "--device", "cuda"]
    assert argv[4:] == ["--dtype=float32", "--device=cpu", "--max-model-len=2048",
                        "--num-blocks=256", "--quantization=int4", "--kv-cache-dtype=int8",
                        "--max-num-seqs=8", "--no-kv-shm"]
    worker = decode_parser().parse_args(["--port", "0", "--kv-port", "0", *argv])
    assert (worker.device, worker.quantization, worker.kv_cache_dtype) == ("cpu", "int4", "int8")
    router = router_parser().parse_args(router_argv(spec, "/m"))
    assert (router.model_name, router.max_model_len) == ("tiny", 2048)


def test_worker_arg_takes_both_spellings() -> None:
    spec = _spec("--insecure", "--worker-arg", "--quantization=int4",
                 "--worker-arg=--num-blocks=64", "--router-arg", "--max-inflight=9")
    assert spec.worker_args == ("--quantization=int4", "--num-blocks=64")
    assert spec.router_args == ("--max-inflight=9",)


def test_nothing_is_forwarded_unless_given() -> None:
    spec = _spec("--insecure")
    assert spec.worker_args == () and spec.router_args == ()
    assert worker_argv(spec, "decode", "smollm2") == ["--model", "smollm2"]


def test_config_file_with_the_command_line_winning(tmp_path: Path) -> None:
    cfg = tmp_path / "up.yaml"
    cfg.write_text("served_model_name: tiny\nquantization: int4\ndecode: 2\ninsecure: true\n"
                   "worker-arg: ['--no-kv-shm']\n")
    spec = _spec("--config", str(cfg), "--quantization", "int8")
    assert (spec.model_name, spec.decode, spec.insecure) == ("tiny", 2, True)
    assert spec.worker_args == ("--quantization=int8", "--no-kv-shm")


def test_an_inline_api_key_counts_as_keys_for_a_public_router() -> None:
    _check_public_bind(_spec("--insecure", "--host", "0.0.0.0", "--router-arg=--api-key=sk-1"))


def test_logging_and_tracing_flags_reach_the_router_and_every_worker() -> None:
    spec = _spec("--insecure", "--log-format", "json", "--trace-file", "/tmp/t.jsonl",
                 "--trace-sample-ratio", "0.25", "--worker-arg", "--no-kv-shm")
    flags = ("--log-format=json", "--trace-file=/tmp/t.jsonl", "--trace-sample-ratio=0.25")
    assert spec.worker_args == (*flags, "--no-kv-shm")  # the escape hatch still comes last
    assert spec.router_args == flags
    worker = decode_parser().parse_args(["--port", "0", "--kv-port", "0",
                                         *worker_argv(spec, "decode", "smollm2")])
    router = router_parser().parse_args(router_argv(spec, "/m"))
    for parsed in (worker, router):
        assert (parsed.log_format, parsed.trace_file, parsed.trace_sample_ratio) == (
            "json", "/tmp/t.jsonl", 0.25)
