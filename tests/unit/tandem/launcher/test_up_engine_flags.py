"""``tandem up`` passes engine flags to its workers (and the router the ones it shares), takes
``--worker-arg`` in both spellings, and reads ``--config`` (parse level, no Ray started)."""

from __future__ import annotations

from pathlib import Path

from tandem.engine.config import SchedulerConfig
from tandem.launcher.argv import router_argv, worker_argv
from tandem.launcher.spec import LaunchSpec
from tandem.launcher.up import _check_public_bind, build_parser, spec_from_args
from tandem.router.cli import build_parser as router_parser
from tandem.worker.decode.cli import build_parser as decode_parser
from tandem.worker.prefill.cli import build_parser as prefill_parser

VLLM_LINE = ["--model", "smollm2", "--served-model-name", "tiny", "--max-model-len", "2048",
             "--quantization", "int4", "--kv-cache-dtype", "int8", "--max-num-seqs", "8",
             "--num-blocks", "256", "--dtype", "float32", "--device", "cpu", "--insecure"]


def _spec(*argv: str) -> LaunchSpec:
    return spec_from_args(build_parser().parse_args(list(argv)), None)


def test_engine_flags_reach_the_workers_and_the_router() -> None:
    spec = _spec(*VLLM_LINE, "--prefill-gpus", "1", "--worker-arg", "--no-kv-shm")
    argv = worker_argv(spec, "prefill", "smollm2")
    # The GPU request implies --device cuda; the --device given comes later and wins.
    assert argv[:6] == ["--model", "smollm2", "--device", "cuda", "--metrics-port", "0"]
    assert argv[6:] == ["--dtype=float32", "--device=cpu", "--max-model-len=2048",
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
    assert worker_argv(spec, "decode", "smollm2") == ["--model", "smollm2", "--metrics-port", "0"]


def test_config_file_with_the_command_line_winning(tmp_path: Path) -> None:
    cfg = tmp_path / "up.yaml"
    cfg.write_text("served_model_name: tiny\nquantization: int4\ndecode: 2\ninsecure: true\n"
                   "worker-arg: ['--no-kv-shm']\n")
    spec = _spec("--config", str(cfg), "--quantization", "int8")
    assert (spec.model_name, spec.decode, spec.insecure) == ("tiny", 2, True)
    assert spec.worker_args == ("--quantization=int8", "--no-kv-shm")


def test_an_inline_api_key_counts_as_keys_for_a_public_router() -> None:
    _check_public_bind(_spec("--insecure", "--host", "0.0.0.0", "--router-arg=--api-key=sk-1"))


def test_role_args_reach_one_role_only_and_come_last() -> None:
    spec = _spec("--insecure", "--threads", "4", "--worker-arg=--dtype=float32",
                 "--prefill-arg", "--threads=8", "--decode-arg=--max-num-seqs=32",
                 "--decode-arg", "--speculative=ngram", "--decode-arg=--dtype=bfloat16")
    prefill = worker_argv(spec, "prefill", "smollm2")
    decode = worker_argv(spec, "decode", "smollm2")
    assert prefill == ["--model", "smollm2", "--threads", "4", "--metrics-port", "0",
                       "--dtype=float32", "--threads=8"]
    assert decode[-3:] == ["--max-num-seqs=32", "--speculative=ngram", "--dtype=bfloat16"]
    parsed = {"prefill": prefill_parser().parse_args(["--port", "0", *prefill]),
              "decode": decode_parser().parse_args(["--port", "0", "--kv-port", "0", *decode])}
    default_seqs = SchedulerConfig().max_num_seqs
    assert (parsed["prefill"].threads, parsed["prefill"].max_num_seqs) == (8, default_seqs)
    assert (parsed["prefill"].speculative, parsed["prefill"].dtype) == ("none", "float32")
    assert (parsed["decode"].threads, parsed["decode"].max_num_seqs) == (4, 32)
    assert (parsed["decode"].speculative, parsed["decode"].dtype) == ("ngram", "bfloat16")


def test_workers_serve_metrics_under_the_routers_model_id(tmp_path: Path) -> None:
    """Every worker actor serves /metrics (a free port unless --worker-metrics-port says)
    with the id the router serves: given, an alias, else the model directory's name."""
    from tandem.launcher.argv import served_name

    model = tmp_path / "tiny-model"
    model.mkdir()
    assert served_name(_spec("--insecure", "--model", str(model))) == "tiny-model"
    assert served_name(_spec("--insecure")) == "smollm2"
    assert served_name(_spec("--insecure", "--model-name", "m1")) == "m1"
    spec = _spec("--insecure", "--worker-metrics-port", "9090")
    worker = decode_parser().parse_args(
        ["--port", "0", "--kv-port", "0", *worker_argv(spec, "decode", "smollm2", "m1")])
    assert (worker.metrics_port, worker.served_model_name) == (9090, "m1")
    assert worker_argv(_spec("--insecure", "--worker-metrics-port", "-1"), "decode", "m")[-1] == "-1"


def test_status_lists_each_workers_metrics_endpoint() -> None:
    from tandem.launcher.status import format_status

    status = {"router": {"grpc": "h:1", "http": "h:2", "node": "h", "pid": 1},
              "workers": [{"role": "decode", "index": 0, "state": "serving", "grpc": "h:3",
                           "node": "h", "registered": True, "restarts": 0,
                           "metrics": "h:9090"},
                          {"role": "prefill", "index": 0, "state": "starting", "restarts": 0}],
              "replicas": {"prefill": 1, "decode": 1}}
    lines = format_status(status).splitlines()
    assert lines[1].endswith("metrics h:9090") and "metrics" not in lines[2]


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


def test_metrics_compat_reaches_the_router_and_every_worker() -> None:
    """``tandem up --metrics-compat none`` (what the chart's metrics.compat renders in ray
    mode) turns vLLM's names off everywhere; the default passes nothing."""
    spec = _spec("--insecure", "--metrics-compat", "none")
    assert spec.router_args == ("--metrics-compat=none",)
    worker = decode_parser().parse_args(["--port", "0", "--kv-port", "0",
                                         *worker_argv(spec, "decode", "smollm2")])
    router = router_parser().parse_args(router_argv(spec, "/m"))
    assert worker.metrics_compat == router.metrics_compat == "none"
    default = _spec("--insecure")
    assert not any("metrics-compat" in a for a in (*default.router_args, *default.worker_args))


def test_worker_counts_take_tandem_locals_names_and_prefill_is_expected() -> None:
    spec = _spec("--insecure", "--num-prefill", "2", "--num-decode", "3")
    assert (spec.prefill, spec.decode) == (2, 3)
    router = router_parser().parse_args(router_argv(spec, "/m"))
    assert router.expect_prefill  # its /health waits for a prefill worker too
    colocated = router_parser().parse_args(router_argv(_spec("--insecure", "--prefill", "0"),
                                                       "/m"))
    assert not colocated.expect_prefill
