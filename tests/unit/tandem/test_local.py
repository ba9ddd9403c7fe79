"""``tandem local``'s flags: the thread split between its workers, the engine flags and
``--worker-arg``s it passes on, ``--config`` (no process started)."""

from __future__ import annotations

from pathlib import Path

from tandem.local import build_parser, router_argv, thread_split, worker_argv


def test_prefill_gets_every_core_decode_a_quarter() -> None:
    assert thread_split(1) == (1, 1)
    assert thread_split(2) == (2, 1)
    assert thread_split(16) == (16, 4)
    assert thread_split(0) == (1, 1)  # never zero threads


def test_flags_override_the_split() -> None:
    args = build_parser().parse_args(["--prefill-threads", "1", "--decode-threads", "3"])
    assert (args.prefill_threads, args.decode_threads) == (1, 3)


def test_engine_flags_reach_both_workers_and_the_router_its_own() -> None:
    args = build_parser().parse_args([
        "--quantization", "int4", "--kv-cache-dtype", "int8", "--device", "cpu",
        "--dtype", "float32", "--max-model-len", "2048", "--max-num-seqs", "8",
        "--num-blocks", "256", "--no-prefix-caching", "--served-model-name", "tiny",
        "--worker-arg", "--no-kv-shm", "--router-arg=--max-inflight=9",
    ])
    engine = ["--dtype=float32", "--device=cpu", "--max-model-len=2048", "--num-blocks=256",
              "--no-prefix-caching", "--quantization=int4", "--kv-cache-dtype=int8",
              "--max-num-seqs=8"]
    assert worker_argv(args, "smollm2", 3) == [
        "--model", "smollm2", "--threads", "3", *engine, "--no-kv-shm"]
    assert router_argv(args, Path("/m")) == [
        "--tokenizer", "/m", "--model-name", "tiny", "--max-model-len=2048", "--max-inflight=9"]


def test_unset_engine_flags_are_not_forwarded() -> None:
    args = build_parser().parse_args(["--model", "m"])
    assert worker_argv(args, "m", 1) == ["--model", "m", "--threads", "1"]
    assert router_argv(args, Path("/m")) == ["--tokenizer", "/m", "--model-name", "m"]


def test_forwarded_flags_parse_as_the_workers_do() -> None:
    from decode_worker.cli import build_parser as decode_parser

    args = build_parser().parse_args(["--quantization", "int8", "--max-num-seqs", "5"])
    worker = decode_parser().parse_args(
        ["--port", "0", "--kv-port", "0", *worker_argv(args, "smollm2", 1)])
    assert (worker.quantization, worker.max_num_seqs, worker.threads) == ("int8", 5, 1)


def test_config_file_and_command_line(tmp_path: Path) -> None:
    cfg = tmp_path / "local.yaml"
    cfg.write_text("model: smollm2\nquantization: int4\nmax_model_len: 1024\nport: 0\n"
                   "worker-arg: ['--no-kv-shm']\n")
    args = build_parser().parse_args(["--config", str(cfg), "--max-model-len", "512"])
    assert args.port == 0
    assert worker_argv(args, "smollm2", 1)[4:] == [
        "--max-model-len=512", "--quantization=int4", "--no-kv-shm"]


def test_logging_and_tracing_flags_reach_every_process(tmp_path: Path) -> None:
    from prefill_worker.cli import build_parser as prefill_parser
    from router.cli import build_parser as router_parser

    trace = tmp_path / "spans.jsonl"
    args = build_parser().parse_args(["--log-format", "json", "--log-level", "debug",
                                      "--trace-file", str(trace),
                                      "--otlp-endpoint", "http://collector:4317"])
    flags = ["--log-format=json", "--log-level=DEBUG", "--otlp-endpoint=http://collector:4317",
             f"--trace-file={trace}"]
    assert worker_argv(args, "m", 1)[4:] == flags
    assert router_argv(args, Path("/m"))[4:] == flags
    for parsed in (prefill_parser().parse_args(["--port", "0", *worker_argv(args, "m", 1)]),
                   router_parser().parse_args(router_argv(args, Path("/m")))):
        assert (parsed.log_format, parsed.log_level, parsed.trace_file,
                parsed.otlp_endpoint) == ("json", "DEBUG", str(trace), "http://collector:4317")
