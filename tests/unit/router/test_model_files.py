"""``tandem router --model SPEC`` finds the model as the workers do and reads only its
tokenizer and config: without torch or the engine, served under the alias or the checkpoint's
name (never a cache directory's hash name); ``--tokenizer DIR`` still works."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tandem.common.model_spec import ModelSpecError
from tandem.router.api.chat import Chat, ChatMessage
from tandem.router.cli import build_parser, config_from_args
from tandem.router.config import RouterConfig
from tandem.router.model_files import router_model_dir
from tandem.router.tokenizer import RouterTokenizer
from tests.unit.router.fakes import SECRET_FILE

ROOT = Path(__file__).resolve().parents[3]

# Resolves smollm2 as `tandem router --model smollm2` does, loads the tokenizer, renders a chat
# and reports which modules the process holds.
_PROBE = """
import json, sys
from tandem.router.cli import build_parser, config_from_args
from tandem.router.tokenizer import RouterTokenizer
from tandem.router.api.chat import Chat, ChatMessage
config = config_from_args(build_parser().parse_args(["--model", "smollm2", "--insecure"]))
tok = RouterTokenizer(config.tokenizer_dir)
chat = Chat((ChatMessage(role="user", content="Hi"),))
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "engine"))
print(json.dumps({"dir": config.tokenizer_dir, "name": config.model_name,
                  "max_model_len": config.max_model_len, "vocab": tok.vocab_size,
                  "chat": tok.render_chat(chat), "heavy": heavy}))
"""


def _config(*argv: str) -> RouterConfig:
    return config_from_args(build_parser().parse_args([*argv, "--insecure"]))


def test_a_gguf_alias_resolves_without_torch_to_the_engines_tokenizer(
    tmp_path: Path, smollm2_dir: Path,
) -> None:
    """A fresh cache (no converted weights): the router builds the tokenizer from the GGUF
    itself, torch-free, and it is the one the engine's conversion wrote."""
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path), PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, env=env, text=True,
                         capture_output=True, timeout=300)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["heavy"] == []  # no torch, no engine in the router's process
    assert Path(got["dir"]).parent == tmp_path / "tandem" / "tokenizers"
    assert (got["name"], got["max_model_len"], got["vocab"]) == ("smollm2", 8192, 49152)
    built, converted = Path(got["dir"]), smollm2_dir
    assert (built / "tokenizer.json").read_bytes() == (converted / "tokenizer.json").read_bytes()
    chat = RouterTokenizer(converted).render_chat(_chat("Hi"))
    assert got["chat"] == chat


def _chat(text: str) -> Chat:
    return Chat((ChatMessage(role="user", content=text),))


def test_a_converted_alias_is_read_from_the_conversion(smollm2_dir: Path) -> None:
    assert router_model_dir("smollm2") == smollm2_dir
    config = _config("--model", "smollm2")
    assert (config.tokenizer_dir, config.model_name) == (str(smollm2_dir), "smollm2")
    assert config.max_model_len == 8192


def test_a_checkpoint_directory_is_served_under_its_name(tmp_path: Path) -> None:
    ckpt = tmp_path / "my-llama"
    ckpt.mkdir()
    (ckpt / "config.json").write_text('{"max_position_embeddings": 512}')
    config = _config("--model", str(ckpt))
    assert (config.tokenizer_dir, config.model_name, config.max_model_len) == (
        str(ckpt), "my-llama", 512)
    named = _config("--model", str(ckpt), "--served-model-name", "mine", "--max-model-len", "64")
    assert (named.model_name, named.max_model_len) == ("mine", 64)


def test_tokenizer_overrides_the_files_and_model_still_names_them(
    tmp_path: Path, smollm2_dir: Path,
) -> None:
    both = _config("--model", "smollm2", "--tokenizer", str(tmp_path), "--max-model-len", "9")
    assert (both.tokenizer_dir, both.model_name) == (str(tmp_path), "smollm2")
    alone = _config("--tokenizer", str(smollm2_dir))  # as before: the directory's own name
    assert alone.model_name == smollm2_dir.name


def test_an_unknown_model_is_refused_with_what_a_model_may_be(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(ModelSpecError):
        router_model_dir(str(tmp_path / "nope"))
    from tandem.router.cli import main

    assert main(["--model", str(tmp_path / "nope"), "--cluster-secret-file",
                 str(SECRET_FILE)]) == 2
    assert "is not an alias (smollm2), a .gguf file or a directory" in capsys.readouterr().err
