"""Migration carries the LoRA adapter: a decode worker SIGKILLed after its reservation and
before the COMMIT of a request under an adapter (real processes, the tiny served model, the
adapter on every worker); the leg moves to the other decode worker under the same adapter
and the output is PEFT's greedy output, the survivor idle after with every block free.
The fault is tests/chaos/test_decode_death_before_commit.py's (the prefill worker's
test-only hold before its COMMIT)."""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import pytest

from tandem.engine.testing.lora import make_tiny_adapter, peft_greedy
from tandem.launcher.local_cluster import Cluster
from tandem.protos.v1 import tandem_pb2_grpc
from tandem.worker.commit_hold import ENV as HOLD_ENV
from tests.chaos.greedy import generate_ids, prompt_ids
from tests.integration.sdk_cluster import (
    MODEL_ID,
    lora_holders,
    wait_until,
    worker_idle,
    worker_stats,
)
from tests.integration.served_model import engine_flags, start_all, tiny_served_model

pytestmark = pytest.mark.slow

MAX_TOKENS = 10


def test_decode_killed_mid_lora_request_migrates_under_the_adapter(
        tiny_dir, smollm2_dir, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_served_model(tiny_dir, smollm2_dir)
    adapter = make_tiny_adapter(model, tmp_path / "a", rank=4, seed=31, scale=0.5)
    hold = tmp_path / "hold"
    hold.mkdir()
    monkeypatch.setenv(HOLD_ENV, str(hold))  # only the prefill worker reads it
    flags = [*engine_flags(model), "--kv-cache-dtype", "float32", "--enable-lora",
             "--lora-modules", f"a={adapter}"]
    c = Cluster()
    try:
        d1, d2, prefill = start_all(
            c, ("tandem.worker.decode", "--port", "0", "--kv-port", "0", *flags),
            ("tandem.worker.decode", "--port", "0", "--kv-port", "0", *flags),
            ("tandem.worker.prefill", "--port", "0", *flags))
        router = c.start(
            "tandem.router", "--port", "0", "--tokenizer", str(model), "--model-name", MODEL_ID,
            "--prefill", prefill.grpc, "--decode", f"{d1.grpc},{d2.grpc}",
            "--placement", "remote")
        stub = tandem_pb2_grpc.TandemStub(grpc.insecure_channel(router.grpc))
        text = "The lighthouse keeper counted the ships"
        want = peft_greedy(model, adapter, prompt_ids(model, text), MAX_TOKENS)
        # the router has read the adapter in both decode workers' stats (and the prefill's)
        wait_until(lambda: lora_holders(router, "decode", "a") == 2
                   and lora_holders(router, "prefill", "a") == 1)
        result: dict[str, object] = {}

        def run() -> None:
            try:
                result["tokens"] = generate_ids(stub, text, MAX_TOKENS, model="a")
            except grpc.RpcError as exc:
                result["error"] = exc

        (hold / "hold").touch()  # the next COMMIT waits
        th = threading.Thread(target=run)
        th.start()
        try:
            wait_until(lambda: (hold / "held").exists(), timeout=120)
            (reserved,) = [d for d in (d1, d2) if worker_stats(d, "decode").num_reserved]
            reserved.kill()
        finally:
            (hold / "release").touch()
            th.join(timeout=300)
        assert "error" not in result, result.get("error")
        assert result["tokens"] == want
        survivor = d2 if reserved is d1 else d1
        wait_until(lambda: worker_idle(survivor, "decode") and worker_idle(prefill, "prefill"))
    finally:
        c.stop()

