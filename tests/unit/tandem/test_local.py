"""``tandem local``'s flags: the thread split between its workers, the engine flags and
``--worker-arg``s it passes on, ``--config`` (no process started)."""

from __future__ import annotations

import os
from pathlib import Path

from tandem.launcher.local import (
    build_parser,
    lends_cores,
    role_threads,
    router_argv,
    thread_split,
    worker_argv,
    worker_names,
)


def test_prefill_gets_every_core_decode_a_quarter() -> None:
    assert thread_split(1) == (1, 1)
    assert thread_split(2) == (2, 1)
    assert thread_split(16) == (16, 4)
    assert thread_split(0) == (1, 1)  # never zero threads


def _threads(*argv: str, cores: int) -> tuple[int, int]:
    args = build_parser().parse_args(list(argv))
    return role_threads(args, "prefill", cores), role_threads(args, "decode", cores)


def test_flags_override_the_split() -> None:
    assert _threads("--prefill-threads", "1", "--decode-threads", "3", cores=8) == (1, 3)
    assert _threads("--no-prefill", "--decode-threads", "1", cores=8)[1] == 1
    assert _threads("--num-prefill", "2", "--num-decode", "2", "--decode-threads", "3",
                    cores=2) == (1, 3)


def test_a_lone_decode_worker_gets_every_core() -> None:
    cores = len(os.sched_getaffinity(0))
    assert _threads(cores=cores) == thread_split(cores)
    assert _threads("--no-prefill", cores=cores)[1] == cores
    assert _threads("--num-prefill", "0", cores=6)[1] == 6


def test_more_workers_divide_the_cores_at_least_one_thread_each() -> None:
    # 1 prefill + 2 decode on a 2-core box: more workers than cores, 1 thread each.
    assert _threads("--num-prefill", "1", "--num-decode", "2", cores=2) == (1, 1)
    assert _threads("--num-prefill", "2", "--num-decode", "2", cores=8) == (2, 2)
    assert _threads("--num-prefill", "0", "--num-decode", "3", cores=6) == (2, 2)


def test_cores_are_lent_only_within_one_pair() -> None:
    parse = build_parser().parse_args
    assert lends_cores(parse([]))
    assert not lends_cores(parse(["--no-core-share"]))
    assert not lends_cores(parse(["--no-prefill"]))
    assert not lends_cores(parse(["--num-decode", "2"]))
    assert not lends_cores(parse(["--num-prefill", "2"]))


def test_worker_names_keep_one_workers_name_and_number_several() -> None:
    assert worker_names("decode", 1) == ["decode"]
    assert worker_names("decode", 2) == ["decode-0", "decode-1"]
    assert worker_names("prefill", 0) == []


def test_role_flags_pass_through_in_both_spellings() -> None:
    args = build_parser().parse_args(["--prefill-arg", "--max-num-seqs=4",
                                      "--decode-arg=--speculative=ngram", "--decode-arg",
                                      "--num-blocks=64"])
    assert args.prefill_arg == ["--max-num-seqs=4"]
    assert args.decode_arg == ["--speculative=ngram", "--num-blocks=64"]


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
        "--model", "smollm2", "--threads", "3", "--served-model-name", "tiny",
        "--metrics-port", "0", *engine, "--no-kv-shm"]
    assert router_argv(args, "smollm2") == [
        "--model", "smollm2", "--model-name", "tiny", "--max-model-len=2048", "--max-inflight=9"]


def test_unset_engine_flags_are_not_forwarded() -> None:
    args = build_parser().parse_args(["--model", "m"])
    assert worker_argv(args, "m", 1) == ["--model", "m", "--threads", "1",
                                         "--served-model-name", "m", "--metrics-port", "0"]
    assert router_argv(args, "/abs/m") == ["--model", "/abs/m", "--model-name", "m"]


def test_forwarded_flags_parse_as_the_workers_do() -> None:
    from tandem.worker.decode.cli import build_parser as decode_parser

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
    assert worker_argv(args, "smollm2", 1)[8:] == [
        "--max-model-len=512", "--quantization=int4", "--no-kv-shm"]


def test_workers_serve_metrics_under_the_served_name() -> None:
    """Every worker serves /metrics (a free loopback port, announced) with the router's
    model id; ``--worker-metrics-port -1`` turns it off, a --worker-arg still wins."""
    from tandem.launcher.local import metrics_endpoints
    from tandem.worker.decode.cli import build_parser as decode_parser
    from tandem.worker.decode.cli import config_from_args

    args = build_parser().parse_args(["--model", "/models/tiny", "--model-name", "t1"])
    worker = config_from_args(decode_parser().parse_args(
        ["--port", "0", "--kv-port", "0", "--insecure", *worker_argv(args, "/models/tiny", 1)]))
    assert worker.worker.model_name == "t1" and worker.worker.serve.metrics_port == 0
    off = build_parser().parse_args(["--worker-metrics-port", "-1",
                                     "--worker-arg=--metrics-port=9100"])
    argv = worker_argv(off, "m", 1)
    assert decode_parser().parse_args(["--port", "0", "--kv-port", "0", *argv]).metrics_port == 9100
    assert "-1" in argv

    class _Proc:
        def __init__(self, info: dict[str, str]) -> None:
            self.info = info

    assert metrics_endpoints("127.0.0.1:8000", {"decode": _Proc({"metrics": "127.0.0.1:5"}),
                                                "prefill": _Proc({})}) == {
        "router": "127.0.0.1:8000", "decode": "127.0.0.1:5"}


def test_logging_and_tracing_flags_reach_every_process(tmp_path: Path) -> None:
    from tandem.router.cli import build_parser as router_parser
    from tandem.worker.prefill.cli import build_parser as prefill_parser

    trace = tmp_path / "spans.jsonl"
    args = build_parser().parse_args(["--log-format", "json", "--log-level", "debug",
                                      "--trace-file", str(trace),
                                      "--otlp-endpoint", "http://collector:4317"])
    flags = ["--log-format=json", "--log-level=DEBUG", "--otlp-endpoint=http://collector:4317",
             f"--trace-file={trace}"]
    assert worker_argv(args, "m", 1)[8:] == flags
    assert router_argv(args, "/m")[4:] == flags
    for parsed in (prefill_parser().parse_args(["--port", "0", *worker_argv(args, "m", 1)]),
                   router_parser().parse_args(router_argv(args, "/m"))):
        assert (parsed.log_format, parsed.log_level, parsed.trace_file,
                parsed.otlp_endpoint) == ("json", "DEBUG", str(trace), "http://collector:4317")


def test_metrics_compat_reaches_every_process() -> None:
    from tandem.router.cli import build_parser as router_parser
    from tandem.worker.decode.cli import build_parser as decode_parser

    args = build_parser().parse_args(["--metrics-compat", "none"])
    assert "--metrics-compat=none" in worker_argv(args, "m", 1)
    worker = decode_parser().parse_args(["--port", "0", "--kv-port", "0",
                                         *worker_argv(args, "m", 1)])
    router = router_parser().parse_args(router_argv(args, "/m"))
    assert worker.metrics_compat == router.metrics_compat == "none"
    default = build_parser().parse_args([])
    assert not any("metrics-compat" in a for a in (*worker_argv(default, "m", 1),
                                                   *router_argv(default, "/m")))


class _Recorder:
    """A Cluster that records what it was asked to start."""

    def __init__(self) -> None:
        self.started: list[tuple[str, ...]] = []

    def spawn(self, *command: str) -> tuple[str, ...]:
        self.started.append(command)
        return command

    def wait_ready(self, proc: tuple[str, ...]) -> tuple[str, ...]:
        return proc


def test_both_workers_get_the_core_share_file_and_only_they() -> None:
    from tandem.launcher.local import _start_workers

    share = ["--core-share", "/run/x/core-share"]
    cluster = _Recorder()
    started = _start_workers(cluster, build_parser().parse_args([]), "smollm2", share)  # type: ignore[arg-type]
    assert set(started) == {"decode", "prefill"}
    for command in cluster.started:
        at = command.index("--core-share")
        assert command[at + 1] == "/run/x/core-share"
    cluster = _Recorder()
    _start_workers(cluster, build_parser().parse_args(["--no-prefill"]), "smollm2", [])  # type: ignore[arg-type]
    assert [c[0] for c in cluster.started] == ["tandem.worker.decode"]
    assert "--core-share" not in cluster.started[0]


def test_several_workers_of_each_role_with_their_role_flags_last() -> None:
    from tandem.launcher.local import _start_workers

    cluster = _Recorder()
    args = build_parser().parse_args(["--num-prefill", "1", "--num-decode", "2",
                                      "--worker-arg=--num-blocks=64",
                                      "--decode-arg=--num-blocks=32",
                                      "--prefill-arg", "--max-num-seqs=2"])
    started = _start_workers(cluster, args, "smollm2", [])  # type: ignore[arg-type]
    assert list(started) == ["decode-0", "decode-1", "prefill"]
    modules = [c[0] for c in cluster.started]
    assert modules == ["tandem.worker.decode", "tandem.worker.decode", "tandem.worker.prefill"]
    for command in cluster.started:  # free ports each: distinct once bound
        assert command[command.index("--port") + 1] == "0"
        assert command[command.index("--threads") + 1] == str(role_threads(
            args, "decode" if "decode" in command[0] else "prefill"))
    assert cluster.started[0][-2:] == ("--num-blocks=64", "--num-blocks=32")  # the role's wins
    assert cluster.started[2][-2:] == ("--num-blocks=64", "--max-num-seqs=2")
