"""A vLLM user's command line works on every entry point, typed or as a ``--config`` YAML file
(parsers only: no process is started).

    --model smollm2 --served-model-name my-model --api-key sk-x --max-model-len 1024
    --quantization auto

Per flag and role (what a role does not use is accepted only where a vLLM user would hand
the whole line to one process, i.e. the router, the public front of the cluster):

    flag                  router                   prefill/decode        local, up
    --model               its tokenizer + config   loads it              converts, passes on
    --served-model-name   the served id            model_name on their   to the router and
                                                   metrics (no API)      the workers
    --api-key             accepted keys            refused (their calls  to the router, in a
                                                   need the cluster      0600 file, never on
                                                   credential instead)   a command line
    --max-model-len       prompt bound             context length        to both
    --quantization        accepted, ignored        weights format        to the workers
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem.engine.cli_args import engine_config_from_args
from tandem.launcher import local, up
from tandem.launcher.api_keys import key_file_text, write_key_file
from tandem.launcher.argv import router_argv
from tandem.launcher.router_actor import router_config
from tandem.router.cli import build_parser as router_parser
from tandem.router.cli import config_from_args
from tandem.router.config import RouterConfig
from tandem.router.security import RouterSecurity
from tandem.worker.decode.cli import build_parser as decode_parser
from tandem.worker.prefill.cli import build_parser as prefill_parser

KEY = "sk-x"
VLLM = ["--model", "smollm2", "--served-model-name", "my-model", "--api-key", KEY,
        "--max-model-len", "1024", "--quantization", "auto"]
VLLM_YAML = (f"model: smollm2\nserved-model-name: my-model\napi-key: [{KEY}]\n"
             "max_model_len: 1024\nquantization: auto\n")
WORKER_FLAGS = ["--model", "smollm2", "--max-model-len", "1024", "--quantization", "auto"]
WORKER_YAML = "model: smollm2\nmax-model-len: 1024\nquantization: auto\n"
WORKER_PORTS = {"prefill": ["--port", "0"], "decode": ["--port", "0", "--kv-port", "0"]}
WORKER_PARSERS = {"prefill": prefill_parser, "decode": decode_parser}


def _line(tmp_path: Path, as_yaml: bool, flags: list[str], text: str) -> list[str]:
    """``flags`` typed, or the same as a ``--config`` file."""
    if not as_yaml:
        return list(flags)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(text)
    return ["--config", str(cfg)]


def _assert_served(config: RouterConfig, security: RouterSecurity) -> None:
    assert (config.model_name, config.max_model_len) == ("my-model", 1024)
    assert security.keys is not None and security.keys.allows(f"Bearer {KEY}")
    assert not security.keys.allows("Bearer sk-other")
    assert KEY not in repr(config)


@pytest.mark.parametrize("as_yaml", [False, True], ids=["flags", "yaml"])
def test_the_router_takes_the_whole_line(tmp_path: Path, smollm2_dir: Path,
                                         as_yaml: bool) -> None:
    argv = _line(tmp_path, as_yaml, VLLM, VLLM_YAML)
    args = router_parser().parse_args([*argv, "--insecure"])
    assert args.quantization == "auto"  # accepted; nothing in the router's config uses it
    config = config_from_args(args)
    assert config.tokenizer_dir == str(smollm2_dir)  # the conversion, found as workers find it
    _assert_served(config, RouterSecurity.from_config(config))


@pytest.mark.parametrize("as_yaml", [False, True], ids=["flags", "yaml"])
@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_a_worker_takes_its_flags(tmp_path: Path, role: str, as_yaml: bool) -> None:
    argv = _line(tmp_path, as_yaml, WORKER_FLAGS, WORKER_YAML)
    args = WORKER_PARSERS[role]().parse_args([*WORKER_PORTS[role], *argv])
    model = engine_config_from_args(args).model
    assert (model.model, model.max_model_len, model.quantization) == ("smollm2", 1024, "auto")


@pytest.mark.parametrize("flag", ["--api-key"])
@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_a_worker_refuses_the_routers_flags_without_echoing_them(
    role: str, flag: str, capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exc:
        WORKER_PARSERS[role]().parse_args([*WORKER_PORTS[role], *WORKER_FLAGS, flag, KEY])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and f"unrecognized arguments: {flag}" in err
    assert KEY not in err


@pytest.mark.parametrize("as_yaml", [False, True], ids=["flags", "yaml"])
def test_tandem_local_passes_each_process_its_part(tmp_path: Path, smollm2_dir: Path,
                                                   as_yaml: bool) -> None:
    args = local.build_parser().parse_args(_line(tmp_path, as_yaml, VLLM, VLLM_YAML))
    workers = local.worker_argv(args, "smollm2", 1)
    assert workers == ["--model", "smollm2", "--threads", "1", "--served-model-name",
                       "my-model", "--metrics-port", "0", "--max-model-len=1024",
                       "--quantization=auto"]
    router = local.router_argv(args, "smollm2")
    assert router == ["--model", "smollm2", "--model-name", "my-model", "--max-model-len=1024"]
    keys = key_file_text(args)
    assert keys == f"{KEY}\n"
    key_file = write_key_file(keys)  # what main() hands the router: a private file
    try:
        assert key_file.stat().st_mode & 0o777 == 0o600
        assert key_file.parent.stat().st_mode & 0o777 == 0o700
        config = config_from_args(router_parser().parse_args(
            ["--api-key-file", str(key_file), *router, "--insecure"]))
        _assert_served(config, RouterSecurity.from_config(config))
    finally:
        key_file.unlink()
        key_file.parent.rmdir()


@pytest.mark.parametrize("as_yaml", [False, True], ids=["flags", "yaml"])
def test_tandem_up_passes_each_actor_its_part(tmp_path: Path, smollm2_dir: Path,
                                              as_yaml: bool) -> None:
    argv = _line(tmp_path, as_yaml, VLLM, VLLM_YAML)
    spec = up.spec_from_args(up.build_parser().parse_args([*argv, "--insecure",
                                                           "--host", "0.0.0.0"]), None)
    up._check_public_bind(spec)  # keys given: a public router is allowed
    assert spec.api_keys == f"{KEY}\n" and KEY not in repr(spec)
    assert spec.worker_args == ("--max-model-len=1024", "--quantization=auto")
    argv = router_argv(spec, "smollm2")
    assert not any(KEY in a for a in argv)
    config, security = router_config(argv, spec.cluster_secret, spec.api_keys)
    _assert_served(config, security)
    assert config.host == "0.0.0.0"
    assert not Path(config.api_key_file).exists()  # removed once the router read it


def test_keys_from_a_file_and_the_line_join_and_bad_ones_stop_the_launch(
    tmp_path: Path,
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# ops\nsk-file\n")
    args = local.build_parser().parse_args(["--api-key", KEY, "--api-key-file", str(keys)])
    assert key_file_text(args) == f"{KEY}\n# ops\nsk-file\n"
    assert key_file_text(local.build_parser().parse_args([])) == ""
    with pytest.raises(ValueError, match="empty or has spaces") as exc:
        key_file_text(local.build_parser().parse_args(["--api-key", "sk has space"]))
    assert "sk has" not in str(exc.value)
    assert up.main(["--api-key-file", str(tmp_path / "missing")]) == 2  # before Ray starts
