"""A decode worker SIGKILLed after its reservation and before the COMMIT (real processes, the
tiny served model): the leg migrates to the other decode worker, the output is transformers'
greedy output, the survivor ends idle with every KV block free, and the prefill worker, whose
push failed only because its receiver died, stays in the pool and serves the next request.

    router --Reserve--> D (one of two)   router --Prefill--> P: computes, pushes to D, then
    holds before its COMMIT (tandem/worker/commit_hold.py: a test-only pause the
    worker honours only when started with TANDEM_TEST_COMMIT_HOLD_DIR)
    test: sees the hold, SIGKILLs D, releases P -> P's COMMIT fails at its receiver, P says so
    router: the leg is lost, not P: Reserve on the other D, prefill again on P, stream

The same with decode workers of two tensor-parallel ranks fed by a single-rank prefill
worker (each decode rank takes its KV head over its own connection): killing D's rank 0
takes its other rank down with it, and the re-sharded push fails at its receiver alike.
"""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import pytest

from tandem.launcher.local_cluster import Cluster
from tandem.protos.v1 import tandem_pb2_grpc
from tandem.worker.commit_hold import ENV as HOLD_ENV
from tests import scrape
from tests.chaos.greedy import generate_ids, prompt_ids
from tests.integration.sdk_cluster import MODEL_ID, wait_until, worker_idle, worker_stats
from tests.integration.served_model import engine_flags, start_all, tiny_served_model
from tests.unit.engine._reference import hf_greedy

pytestmark = pytest.mark.slow

MAX_TOKENS = 12



@pytest.mark.parametrize("decode_tp", [1, 2], ids=["single", "decode-tp2"])
def test_decode_killed_before_commit_migrates(tiny_dir, smollm2_dir, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch,
                                              decode_tp: int) -> None:
    model = tiny_served_model(tiny_dir, smollm2_dir)
    hold = tmp_path / "hold"
    hold.mkdir()
    monkeypatch.setenv(HOLD_ENV, str(hold))  # only the prefill worker reads it
    flags = engine_flags(model)
    if decode_tp > 1:  # one KV cache dtype on both sides (auto differs between them)
        flags = [*flags, "--kv-cache-dtype", "float32"]
    dflags = [*flags, f"--tensor-parallel-size={decode_tp}"]
    c = Cluster()
    try:
        d1, d2, prefill = start_all(
            c, ("tandem.worker.decode", "--port", "0", "--kv-port", "0", *dflags),
            ("tandem.worker.decode", "--port", "0", "--kv-port", "0", *dflags),
            ("tandem.worker.prefill", "--port", "0", *flags))
        router = c.start(
            "tandem.router", "--port", "0", "--tokenizer", str(model), "--model-name", MODEL_ID,
            "--prefill", prefill.grpc, "--decode", f"{d1.grpc},{d2.grpc}",
            "--placement", "remote",  # every prompt on the prefill worker: the fault is there
        )
        stub = tandem_pb2_grpc.TandemStub(grpc.insecure_channel(router.grpc))
        text = "The lighthouse keeper counted the ships"
        result: dict[str, object] = {}

        def run() -> None:
            try:
                result["tokens"] = generate_ids(stub, text, MAX_TOKENS)
            except grpc.RpcError as exc:
                result["error"] = exc

        (hold / "hold").touch()  # the next COMMIT waits
        th = threading.Thread(target=run)
        th.start()
        try:
            wait_until(lambda: (hold / "held").exists(), timeout=120)
            # D holds the reservation (and what of the KV was pushed); which D the policy
            # chose is found out, not assumed.
            (reserved,) = [d for d in (d1, d2) if worker_stats(d, "decode").num_reserved]
            reserved.kill()
        finally:
            (hold / "release").touch()
            th.join(timeout=300)
        assert "error" not in result, result.get("error")
        assert result["tokens"] == hf_greedy(model, prompt_ids(model, text), MAX_TOKENS)
        survivor = d2 if reserved is d1 else d1
        wait_until(lambda: worker_idle(survivor, "decode"))
        samples = scrape.parse(scrape.fetch(router.info["http"]))
        # The leg moved at once: no retry on "another" prefill worker, no local fallback.
        assert scrape.value(samples, "tandem_migrations_total") == 1
        for kind in ("prefill_retry", "local_prefill_fallback"):
            assert scrape.value(samples, "tandem_handoff_fallbacks_total", kind=kind) == 0

        # The prefill worker is still in the pool: the next request is prefilled there.
        pushed = worker_stats(prefill, "prefill").kv_transfer_bytes
        other = "A second prompt about harbours"
        assert generate_ids(stub, other, MAX_TOKENS) == hf_greedy(model, prompt_ids(model, other), MAX_TOKENS)
        assert worker_stats(prefill, "prefill").kv_transfer_bytes > pushed
        wait_until(lambda: worker_idle(survivor, "decode") and worker_idle(prefill, "prefill"))
    finally:
        c.stop()
