"""``tandem local`` with a vLLM user's flags, for real: its processes serve a completion under
``--served-model-name`` to a client holding the ``--api-key``, the key is on none of their
command lines, and stopping ``tandem local`` stops every one of them.

Colocated (``--no-prefill``: a decode worker and the router) to keep the start short: the
command line is the subject here, and each flag's way to the prefill worker, the same as to
the decode worker, is checked at parse level (tests/unit/tandem/test_vllm_command_line.py).

LoRA is the exception: the adapter must be known on both sides of the KV handoff, so its test
runs a prefill and a decode worker (every prompt prefilled remotely), an adapter given on the
command line and one loaded at runtime through the router's admin route, each request's
greedy output equal to the in-process engine's under the same adapter."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import psutil
import pytest

import tandem
from tandem.engine import SamplingParams
from tandem.engine.lora import LoraConfig
from tandem.engine.testing.lora import make_tiny_adapter
from tandem.launcher.local_cluster import ROOT, Cluster
from tandem.protos.v1 import worker_pb2, worker_pb2_grpc
from tests.integration.sdk_cluster import lora_holders, wait_until
from tests.integration.served_model import tiny_served_model

KEY = "sk-local-0123456789"


def test_tandem_local_serves_a_vllm_command_line(
    tiny_dir: Callable[..., Path], smollm2_dir: Path,
) -> None:
    model = tiny_served_model(tiny_dir, smollm2_dir)
    c = Cluster()
    try:
        local = c.start(
            "tandem.launcher.local", "--model", str(model), "--served-model-name", "my-model",
            "--api-key", KEY, "--max-model-len", "512", "--quantization", "auto",
            "--port", "0", "--prefill-threads", "1", "--decode-threads", "1",
            "--dtype", "float32", "--num-blocks", "128", "--no-prefill")
        children = psutil.Process(local.popen.pid).children(recursive=True)
        assert len(children) == 2  # decode (colocated: the line is the subject), router
        router = next(p for p in children if "tandem.router" in p.cmdline())
        key_file = Path(router.cmdline()[router.cmdline().index("--api-key-file") + 1])
        assert not any(KEY in arg for p in children for arg in p.cmdline())
        assert key_file.stat().st_mode & 0o777 == 0o600

        base = f"http://{local.info['http']}/v1"
        client = openai.OpenAI(base_url=base, api_key=KEY, max_retries=0)
        assert [m.id for m in client.models.list().data] == ["my-model"]
        out = client.completions.create(model="my-model", prompt="Hello there",
                                        max_tokens=4, temperature=0)
        assert out.model == "my-model" and out.usage is not None
        assert out.usage.completion_tokens == 4
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=base, api_key="sk-wrong", max_retries=0).models.list()
        # What it printed to try works when pasted (the key comes from the private file).
        try_it = next(line for line in local.log if line.startswith("Try it:"))
        assert KEY not in try_it and f"--api-key-file {key_file}" in try_it
        pasted = subprocess.run(try_it.removeprefix("Try it:").strip() + " --max-tokens 4",
                                shell=True, cwd=ROOT, capture_output=True, text=True,
                                timeout=120)
        assert pasted.returncode == 0, pasted.stderr
    finally:
        c.stop()
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in children)
    assert not key_file.parent.exists()  # the private key file went with the cluster


ADMIN_KEY = "admin-key-for-local-lora"
NEW = 8


def _engine_greedy(engine: Any, prompt: list[int], lora: str) -> list[int]:
    """The in-process engine's greedy continuation of ``prompt`` under ``lora``."""
    rid = engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=NEW,
                                                    ignore_eos=True, lora=lora))
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished and out.request_id == rid:
                return list(out.token_ids)
    raise AssertionError("the engine finished without the request")


def _stats(c: Cluster, target: str, role: str) -> worker_pb2.WorkerStats:
    with c.channel(target) as channel:
        stub = (worker_pb2_grpc.DecodeServiceStub if role == "decode"
                else worker_pb2_grpc.PrefillServiceStub)(channel)
        return stub.Stats(worker_pb2.StatsRequest(), timeout=30)


def _idle(c: Cluster, workers: dict[str, str]) -> bool:
    stats = [_stats(c, target, role) for role, target in workers.items()]
    return all(st.num_running == st.num_waiting == st.num_reserved == 0
               and st.num_free_blocks == st.num_blocks for st in stats)


def test_tandem_local_serves_lora_adapters_through_the_handoff(
    tiny_dir: Callable[..., Path], smollm2_dir: Path, tmp_path: Path,
    make_engine: Callable[..., Any],
) -> None:
    model = tiny_served_model(tiny_dir, smollm2_dir)
    sql = make_tiny_adapter(model, tmp_path / "sql", rank=4, seed=31, scale=0.5)
    late = make_tiny_adapter(model, tmp_path / "late", rank=8, seed=32, scale=0.5)
    admin = tmp_path / "admin-keys"
    admin.write_text(ADMIN_KEY + "\n")
    admin.chmod(0o600)
    engine = make_engine(model=str(model), dtype="float32", num_blocks=128,
                         lora=LoraConfig(enabled=True, max_loras=2, max_lora_rank=8,
                                         modules=(("sql", str(sql)), ("late", str(late)))))
    c = Cluster()
    try:
        local = c.start(
            "tandem.launcher.local", "--model", str(model), "--served-model-name", "tiny",
            "--port", "0", "--prefill-threads", "1", "--decode-threads", "1",
            "--no-core-share", "--dtype", "float32", "--kv-cache-dtype", "float32",
            "--num-blocks", "128", "--enable-lora", "--lora-modules", f"sql={sql}",
            "--max-loras", "2", "--max-lora-rank", "8", "--allow-runtime-lora-updates",
            "--admin-key-file", str(admin), "--router-arg=--placement=remote",
            *(c.credential_flags or ()))  # the test calls the workers as a member
        workers = {"decode": local.info["workers"]["decode"],
                   "prefill": local.info["workers"]["prefill"]}
        http = f"http://{local.info['http']}"
        client = openai.OpenAI(base_url=f"{http}/v1", api_key="unused", max_retries=0)
        wait_until(lambda: "sql" in {m.id for m in client.models.list().data})
        # both roles hold the adapter (the router routes an adapter only to its holders)
        wait_until(lambda: all(lora_holders(local, role, "sql") == 1 for role in workers))

        prompt = [3 + (i * 7919) % 49000 for i in range(40)]
        pushed = _stats(c, workers["prefill"], "prefill").kv_transfer_bytes
        with tandem.Client(local.grpc) as sdk:
            got = sdk.generate(token_ids=prompt, model="sql", max_tokens=NEW,
                               temperature=0.0, ignore_eos=True)
            base = sdk.generate(token_ids=prompt, model="tiny", max_tokens=NEW,
                                temperature=0.0, ignore_eos=True)
        assert list(got.token_ids) == _engine_greedy(engine, prompt, "sql")
        assert list(base.token_ids) == _engine_greedy(engine, prompt, "")
        assert list(got.token_ids) != list(base.token_ids)  # the adapter moved the output
        assert _stats(c, workers["prefill"], "prefill").kv_transfer_bytes > pushed  # P/D

        # a runtime load reaches both roles through the router's admin route
        body = json.dumps({"lora_name": "late", "lora_path": str(late)}).encode()
        request = urllib.request.Request(
            f"{http}/v1/load_lora_adapter", data=body,
            headers={"Content-Type": "application/json",
                     "Authorization": f"Bearer {ADMIN_KEY}"})
        with urllib.request.urlopen(request, timeout=120) as resp:
            assert resp.status == 200
        wait_until(lambda: all(lora_holders(local, role, "late") == 1 for role in workers))
        assert "late" in {m.id for m in client.models.list().data}
        done = client.completions.create(model="late", prompt=prompt, max_tokens=NEW,
                                         temperature=0.0, extra_body={"ignore_eos": True})
        assert done.model == "late"
        with tandem.Client(local.grpc) as sdk:
            late_out = sdk.generate(token_ids=prompt, model="late", max_tokens=NEW,
                                    temperature=0.0, ignore_eos=True)
        assert list(late_out.token_ids) == _engine_greedy(engine, prompt, "late")
        assert done.choices[0].text == late_out.text
        wait_until(lambda: _idle(c, workers))
    finally:
        c.stop()
