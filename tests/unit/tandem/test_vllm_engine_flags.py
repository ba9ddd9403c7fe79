"""vLLM's engine flags through ``tandem local``'s and ``tandem up``'s parsers to a worker's
EngineConfig (parsers only: no process is started), and the router's two ports.

    --speculative-config JSON   -> --speculative / --num-speculative-tokens / --ngram-max /
                                   --ngram-min / --draft-model (other methods refused by name)
    --enforce-eager             -> no CUDA graphs
    --trust-remote-code         -> refused, saying why
    --port 8000                 -> the HTTP API on a free port (said), never a bind collision
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from tandem.common.router_ports import router_http_port
from tandem.engine.cli_args import engine_config_from_args, speculative_fields
from tandem.engine.config import EngineConfig
from tandem.launcher import local, up
from tandem.router.cli import build_parser as router_parser
from tandem.router.cli import config_from_args
from tandem.worker.decode.cli import build_parser as decode_parser
from tandem.worker.prefill.cli import build_parser as prefill_parser

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 5,
         "prompt_lookup_min": 2}


def _through_local(*flags: str) -> EngineConfig:
    """The decode worker's EngineConfig for ``tandem local`` given ``flags``."""
    args = local.build_parser().parse_args(list(flags))
    worker = decode_parser().parse_args(
        ["--port", "0", "--kv-port", "0", *local.worker_argv(args, "smollm2", 1)])
    return engine_config_from_args(worker)


def _through_up(*flags: str) -> EngineConfig:
    """The prefill worker's EngineConfig for ``tandem up`` given ``flags``."""
    spec = up.spec_from_args(up.build_parser().parse_args(["--insecure", *flags]), None)
    from tandem.launcher.argv import worker_argv

    worker = prefill_parser().parse_args(["--port", "0", *worker_argv(spec, "prefill", "m")])
    return engine_config_from_args(worker)


@pytest.mark.parametrize("through", [_through_local, _through_up], ids=["local", "up"])
def test_speculative_config_ngram_reaches_the_workers(through) -> None:  # type: ignore[no-untyped-def]
    spec = through("--speculative-config", json.dumps(NGRAM)).speculative
    assert (spec.speculative_method, spec.num_speculative_tokens, spec.ngram_max,
            spec.ngram_min) == ("ngram", 3, 5, 2)


def test_speculative_config_draft_model_in_both_spellings() -> None:
    for text in ('{"model": "/ckpt/draft", "num_speculative_tokens": 5}',
                 '{"method": "draft_model", "model": "/ckpt/draft", "num_speculative_tokens": 5,'
                 ' "draft_tensor_parallel_size": 1}'):
        spec = _through_local("--speculative-config", text).speculative
        assert (spec.speculative_method, spec.draft_model, spec.num_speculative_tokens) == (
            "draft", "/ckpt/draft", 5)


def test_speculative_config_from_a_config_file(tmp_path: Path) -> None:
    cfg = tmp_path / "local.yaml"
    cfg.write_text(f"speculative-config: '{json.dumps(NGRAM)}'\nenforce-eager: true\n")
    engine = _through_local("--config", str(cfg))
    assert engine.speculative.speculative_method == "ngram" and not engine.use_cuda_graphs


def test_one_lookup_bound_keeps_the_other_in_order() -> None:
    assert speculative_fields('{"method": "ngram", "prompt_lookup_min": 6}') == {
        "speculative_method": "ngram", "ngram_min": 6, "ngram_max": 6}
    assert speculative_fields('{"method": "ngram", "prompt_lookup_max": 2}') == {
        "speculative_method": "ngram", "ngram_max": 2, "ngram_min": 1}


@pytest.mark.parametrize(("text", "says"), [
    ('{"method": "eagle", "model": "yuhuili/EAGLE-LLaMA3-Instruct-8B"}', "'eagle'"),
    ('{"method": "eagle3", "model": "x"}', "'eagle3'"),
    ('{"method": "medusa", "model": "x"}', "'medusa'"),
    ('{"method": "deepseek_mtp", "num_speculative_tokens": 1}', "'deepseek_mtp'"),
    ('{"method": "mtp", "num_speculative_tokens": 1}', "'mtp'"),
    ('{"num_speculative_tokens": 3}', 'needs "method"'),
    ('{"method": "ngram", "speculative_token_tree": "[(0,)]"}', "speculative_token_tree"),
    ('{"method": "ngram", "num_speculative_tokens": 0}', "num_speculative_tokens"),
    ('{"method": "ngram", "num_speculative_tokens": "4"}', "must be an integer"),
    ('{"method": "draft_model"}', '"model"'),
    ('{"method": "ngram", "model": "x"}', "takes no"),
    ('{"method": "ngram", "prompt_lookup_max": 2, "prompt_lookup_min": 3}', "ngram_min"),
    ('{"method": "draft_model", "model": "x", "draft_tensor_parallel_size": 2}',
     "draft_tensor_parallel_size"),
    ("ngram", "not JSON"),
    ("[4]", "JSON object"),
])
@pytest.mark.parametrize("parser", [local.build_parser, up.build_parser, decode_parser],
                         ids=["local", "up", "decode"])
def test_what_we_do_not_have_is_refused_by_name(
    parser, text: str, says: str, capsys: pytest.CaptureFixture[str],  # type: ignore[no-untyped-def]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parser().parse_args(["--port", "0", "--speculative-config", text])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--speculative-config" in err and says in err


def test_speculative_config_and_speculative_name_one_proposer() -> None:
    args = decode_parser().parse_args(["--port", "0", "--kv-port", "0", "--speculative", "draft",
                                       "--draft-layers", "2", "--speculative-config",
                                       json.dumps(NGRAM)])
    with pytest.raises(ValueError, match="give one"):
        engine_config_from_args(args)


def test_enforce_eager_turns_cuda_graphs_off() -> None:
    assert _through_local().use_cuda_graphs
    assert not _through_local("--enforce-eager").use_cuda_graphs
    assert not _through_up("--enforce-eager").use_cuda_graphs


@pytest.mark.parametrize("parser", [local.build_parser, up.build_parser, decode_parser,
                                    prefill_parser], ids=["local", "up", "decode", "prefill"])
def test_trust_remote_code_is_refused_saying_why(
    parser, tmp_path: Path, capsys: pytest.CaptureFixture[str],  # type: ignore[no-untyped-def]
) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("trust-remote-code: true\n")
    for argv in (["--trust-remote-code"], ["--config", str(cfg)]):
        with pytest.raises(SystemExit) as exc:
            parser().parse_args(["--port", "0", *argv])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert "--trust-remote-code: refused" in err and "never runs code" in err
    # false in a file is the flag left out
    cfg.write_text("trust-remote-code: false\n")
    ports = ["--kv-port", "0"] if parser is decode_parser else []
    parser().parse_args(["--port", "0", *ports, "--config", str(cfg)])


@pytest.mark.parametrize(("grpc", "http", "port", "notice"), [
    (50051, None, 8000, False),
    (0, None, 0, False),
    (8000, None, 0, True),
    (8000, 8001, 8001, False),
    (0, 0, 0, False),
    (50051, 9000, 9000, False),
])
def test_the_http_port_never_collides_with_grpc(grpc: int, http: int | None, port: int,
                                                notice: bool) -> None:
    got, said = router_http_port(grpc, http)
    assert got == port and bool(said) == notice
    assert not said or "--port 8000 is the router's gRPC port" in said


def test_one_fixed_port_for_both_is_refused() -> None:
    with pytest.raises(ValueError, match="--http-port 8000 is also the router's gRPC --port"):
        router_http_port(8000, 8000)


def test_tandem_local_refuses_one_port_for_both_before_starting_anything(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert local.main(["--port", "8000", "--http-port", "8000"]) == 2
    assert "also the router's gRPC --port" in capsys.readouterr().err


def test_tandem_up_takes_a_free_http_port_beside_grpc_8000(
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec = up.spec_from_args(up.build_parser().parse_args(["--insecure", "--port", "8000"]),
                             None)
    assert (spec.port, spec.http_port) == (8000, 0)
    assert "HTTP API takes a free port" in capsys.readouterr().err
    spec = up.spec_from_args(up.build_parser().parse_args(["--insecure"]), None)
    assert (spec.port, spec.http_port) == (50051, 8000)
    with pytest.raises(ValueError, match="different ports"):
        up.spec_from_args(up.build_parser().parse_args(
            ["--insecure", "--port", "9000", "--http-port", "9000"]), None)


def test_the_router_takes_a_free_http_port_beside_grpc_8000(smollm2_dir: Path) -> None:
    def config(*flags: str) -> tuple[int, int]:
        c = config_from_args(router_parser().parse_args(["--model", "smollm2", "--insecure",
                                                         *flags]))
        return c.port, c.http_port

    assert config("--port", "8000") == (8000, 0)
    assert config() == (50051, 8000)
    assert config("--port", "8000", "--http-port", "8000", "--http-host", "127.0.0.2") == (
        8000, 8000)  # another address: the same number is free there
    with pytest.raises(ValueError, match="different ports"):
        config("--port", "8000", "--http-port", "8000")


def test_the_flags_are_documented_in_help() -> None:
    text = local.build_parser().format_help()
    for flag in ("--speculative-config", "--enforce-eager", "--trust-remote-code"):
        assert flag in text
    assert isinstance(up.build_parser(), argparse.ArgumentParser)


def test_reasoning_and_tool_parsers_reach_the_router(smollm2_dir: Path) -> None:
    from tandem.launcher.argv import router_argv as up_router_argv

    flags = ["--reasoning-parser", "deepseek_r1", "--tool-call-parser", "hermes"]
    local_args = local.build_parser().parse_args(flags)
    spec = up.spec_from_args(up.build_parser().parse_args(["--insecure", *flags]), None)
    for argv in (local.router_argv(local_args, "smollm2"), up_router_argv(spec, "smollm2")):
        assert "--reasoning-parser=deepseek_r1" in argv and "--tool-call-parser=hermes" in argv
        config = config_from_args(router_parser().parse_args([*argv, "--insecure"]))
        assert (config.reasoning_parser, config.tool_call_parser) == ("deepseek_r1", "hermes")
    assert "--reasoning-parser" not in " ".join(
        local.router_argv(local.build_parser().parse_args([]), "smollm2"))
    with pytest.raises(SystemExit):
        local.build_parser().parse_args(["--reasoning-parser", "granite"])


@pytest.mark.parametrize("through", [_through_local, _through_up], ids=["local", "up"])
def test_lora_flags_reach_the_workers(through) -> None:  # type: ignore[no-untyped-def]
    lora = through("--enable-lora", "--lora-modules", "sql=/ad/sql",
                   '{"name": "chat", "path": "/ad/chat"}', "--max-loras", "4",
                   "--max-lora-rank", "32", "--max-cpu-loras", "8").lora
    assert lora.enabled and lora.modules == (("sql", "/ad/sql"), ("chat", "/ad/chat"))
    assert (lora.max_loras, lora.max_lora_rank, lora.max_cpu_loras) == (4, 32, 8)
    assert not _through_local().lora.enabled


def test_lora_flags_refuse_what_cannot_work() -> None:
    with pytest.raises(SystemExit):  # not name=path
        _through_local("--enable-lora", "--lora-modules", "sql")
    with pytest.raises(ValueError, match="need --enable-lora"):
        _through_local("--lora-modules", "sql=/ad/sql")
    with pytest.raises(ValueError, match="max_cpu_loras"):
        _through_local("--enable-lora", "--max-loras", "4", "--max-cpu-loras", "2")


def test_runtime_lora_updates_reach_every_worker_and_the_router(tmp_path: Path) -> None:
    admin = tmp_path / "admin-keys"
    admin.write_text("admin-0123\n")
    args = local.build_parser().parse_args([
        "--enable-lora", "--allow-runtime-lora-updates", "--admin-key-file", str(admin)])
    for role, parser, ports in (("decode", decode_parser, ["--port", "0", "--kv-port", "0"]),
                                ("prefill", prefill_parser, ["--port", "0"])):
        worker = parser().parse_args([*ports, *local.worker_argv(args, "smollm2", 1)])
        assert engine_config_from_args(worker).lora.runtime_updates, role
    router = [*local.admin_key_argv(args, True), *local.router_argv(args, "smollm2")]
    config = config_from_args(router_parser().parse_args([*router, "--insecure"]))
    assert config.allow_runtime_lora_updates
    assert config.admin_key_file == str(admin.resolve())
    assert local.admin_key_argv(local.build_parser().parse_args([]), False) == []


def test_runtime_lora_updates_without_an_admin_key_stop_the_launch(tmp_path: Path) -> None:
    args = local.build_parser().parse_args(["--enable-lora", "--allow-runtime-lora-updates"])
    with pytest.raises(ValueError, match="needs --admin-key-file"):
        local.admin_key_argv(args, True)
    empty = tmp_path / "admin-keys"
    empty.write_text("# no key\n")
    with pytest.raises(ValueError):
        local.admin_key_argv(local.build_parser().parse_args(
            ["--admin-key-file", str(empty)]), True)
    assert local.main(["--enable-lora", "--allow-runtime-lora-updates"]) == 2  # nothing started


def test_local_hands_the_workers_absolute_adapter_directories(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    args = local.build_parser().parse_args(
        ["--enable-lora", "--lora-modules", "sql=adapters/sql", "chat=/ad/chat"])
    local.absolute_adapters(args)
    worker = decode_parser().parse_args(
        ["--port", "0", "--kv-port", "0", *local.worker_argv(args, "smollm2", 1)])
    assert engine_config_from_args(worker).lora.modules == (
        ("sql", str(tmp_path / "adapters" / "sql")), ("chat", "/ad/chat"))


def test_tandem_up_refuses_runtime_lora_updates_without_the_routers_admin_keys(
    tmp_path: Path,
) -> None:
    from tandem.launcher.argv import router_argv as up_router_argv

    flags = ["--insecure", "--enable-lora", "--allow-runtime-lora-updates"]
    assert up.main(flags) == 2  # before Ray starts
    admin = tmp_path / "admin-keys"
    admin.write_text("admin-0123\n")
    spec = up.spec_from_args(up.build_parser().parse_args(
        [*flags, f"--router-arg=--admin-key-file={admin}"]), None)
    config = config_from_args(router_parser().parse_args(
        [*up_router_argv(spec, "smollm2"), "--insecure"]))
    assert config.allow_runtime_lora_updates and config.admin_key_file == str(admin)
