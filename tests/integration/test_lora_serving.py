"""Multi-LoRA through a real P/D cluster (router, prefill and decode processes on the tiny
served model): output equal to PEFT's under three adapters and the base model at once, the
adapter changing mid-conversation, the adapters in /v1/models, the official openai client
naming one as its model, an unknown one a 404, and a prefill worker whose adapter of that
name holds other bytes refused before it computes anything."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
import openai
import pytest

import tandem
from tandem.engine.testing.lora import make_tiny_adapter, peft_greedy
from tandem.launcher.local_cluster import Cluster, Proc
from tandem.protos.v1 import tandem_pb2, worker_pb2, worker_pb2_grpc
from tests.integration.sdk_cluster import lora_holders, wait_until, worker_idle, worker_stats
from tests.integration.served_model import MODEL_ID, start_workers, tiny_served_model

GREEDY = {"temperature": 0.0, "ignore_eos": True}
ADMIN_KEY = "admin-key-for-lora-tests"
NEW = 8


@dataclass
class LoraCluster:
    model: Path
    adapters: dict[str, Path]
    decode: Proc
    prefill: Proc
    router: Proc
    root: Path  # where the test's adapters are written


@pytest.fixture(scope="module")
def lora(tiny_dir, smollm2_dir, tmp_path_factory) -> Iterator[LoraCluster]:
    model = tiny_served_model(tiny_dir, smollm2_dir)
    root = tmp_path_factory.mktemp("served-adapters")
    adapters = {"a": make_tiny_adapter(model, root / "a", rank=4, seed=11, scale=0.5),
                "b": make_tiny_adapter(model, root / "b", rank=8, seed=12, scale=0.5,
                                       use_rslora=True),
                "c": make_tiny_adapter(model, root / "c", rank=2, seed=13, scale=0.5,
                                       targets=("q_proj", "v_proj", "down_proj"))}
    # "m": one name, other bytes on each worker
    m_decode = make_tiny_adapter(model, root / "m-decode", rank=4, seed=14)
    m_prefill = make_tiny_adapter(model, root / "m-prefill", rank=4, seed=15)
    # float32 KV: held to PEFT's float32 attention exactly (the native path's auto is float16)
    shared = ["--kv-cache-dtype", "float32", "--enable-lora", "--max-loras", "3",
              "--max-lora-rank", "8", "--allow-runtime-lora-updates",
              "--lora-modules", *(f"{n}={p}" for n, p in adapters.items())]
    c = Cluster()
    try:
        decode, prefill = start_workers(
            c, model, *shared, decode_extra=("--lora-modules", f"m={m_decode}"),
            prefill_extra=("--lora-modules", f"m={m_prefill}"))
        admin = root / "admin-keys"
        admin.write_text(ADMIN_KEY + "\n")
        admin.chmod(0o600)
        router = c.start("tandem.router", "--port", "0", "--tokenizer", str(model),
                         "--model-name", MODEL_ID, "--prefill", prefill.grpc,
                         "--decode", decode.grpc, "--placement", "remote",
                         "--allow-runtime-lora-updates", "--admin-key-file", str(admin))
        yield LoraCluster(model, adapters, decode, prefill, router, root)
    finally:
        c.stop()


@pytest.fixture(scope="module")
def client(lora: LoraCluster) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"http://{lora.router.info['http']}/v1", api_key="unused",
                       max_retries=0, timeout=120) as c:
        # the router learns the workers' adapters from their stats (the prefill worker's
        # too: a request under an adapter goes only to workers serving it)
        wait_until(lambda: {"a", "b", "c", "m"} <= {m.id for m in c.models.list().data})
        wait_until(lambda: all(lora_holders(lora.router, "prefill", n) == 1 for n in "abc"))
        yield c


def _prompt(seed: int, n: int = 40) -> list[int]:
    return [3 + (seed * 7919 + i * 104729) % 49000 for i in range(n)]


def _post(url: str, body: dict[str, str], key: str | None = None) -> tuple[int, str]:
    """POST JSON; (status, body text) whatever the status."""
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()



def _idle(lora: LoraCluster) -> bool:
    return worker_idle(lora.decode, "decode") and worker_idle(lora.prefill, "prefill")


def test_models_lists_adapters_with_their_parent(client: openai.OpenAI) -> None:
    models = {m.id: m for m in client.models.list().data}
    assert models[MODEL_ID].model_extra["parent"] is None
    for name in ("a", "b", "c"):
        assert models[name].model_extra["parent"] == MODEL_ID
        assert models[name].model_extra["root"].startswith(name + "@")


def test_mixed_adapters_through_pd_equal_peft(lora: LoraCluster, client: openai.OpenAI) -> None:
    pushed = worker_stats(lora.prefill, "prefill").kv_transfer_bytes
    jobs = [(_prompt(i), name) for i, name in enumerate(["a", "b", "", "c", "a", "b", "c", ""])]
    with tandem.Client(lora.router.grpc) as sdk, ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(
            lambda job: sdk.generate(token_ids=job[0], model=job[1] or MODEL_ID,
                                     max_tokens=NEW, **GREEDY), jobs))
    for (prompt, name), result in zip(jobs, results, strict=True):
        want = peft_greedy(lora.model, lora.adapters[name] if name else None, prompt, NEW)
        assert list(result.token_ids) == want, name
    assert worker_stats(lora.prefill, "prefill").kv_transfer_bytes > pushed  # P/D, not local
    wait_until(lambda: _idle(lora))


def test_openai_client_names_the_adapter(lora: LoraCluster, client: openai.OpenAI) -> None:
    prompt = _prompt(20)
    done = client.completions.create(model="b", prompt=prompt, max_tokens=NEW,
                                     temperature=0.0, extra_body={"ignore_eos": True})
    assert done.model == "b"
    with tandem.Client(lora.router.grpc) as sdk:
        same = sdk.generate(token_ids=prompt, model="b", max_tokens=NEW, **GREEDY)
    assert done.choices[0].text == same.text
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="hi", max_tokens=2)
    wait_until(lambda: _idle(lora))


def test_changing_adapter_never_reuses_the_other_adapters_kv(lora: LoraCluster,
                                                            client: openai.OpenAI) -> None:
    turn = _prompt(30, n=70)  # four full blocks the decode worker caches under "a"
    with tandem.Client(lora.router.grpc) as sdk:
        for name in ("a", "a", "c", ""):
            got = sdk.generate(token_ids=turn, model=name or MODEL_ID, max_tokens=NEW, **GREEDY)
            want = peft_greedy(lora.model, lora.adapters[name] if name else None, turn, NEW)
            assert list(got.token_ids) == want, name
    wait_until(lambda: _idle(lora))


def test_prefill_with_other_adapter_bytes_is_refused(lora: LoraCluster) -> None:
    """The decode worker's "m" is not the prefill worker's: the prefill is refused before
    any KV is computed or pushed; the reservation is then aborted and nothing is held."""
    prompt = _prompt(40)
    sampling = tandem_pb2.SamplingParams(max_tokens=4, temperature=0.0)
    with lora.decode.channel() as dch, lora.prefill.channel() as pch:
        decode = worker_pb2_grpc.DecodeServiceStub(dch)
        prefill = worker_pb2_grpc.PrefillServiceStub(pch)
        res = decode.Reserve(worker_pb2.ReserveRequest(
            request_id="mismatch", token_ids=prompt, sampling=sampling, lease_s=30, lora="m"),
            timeout=30)
        assert res.lora_identity.startswith("m@")
        with pytest.raises(grpc.RpcError) as info:
            prefill.Prefill(worker_pb2.PrefillRequest(
                request_id="mismatch", token_ids=prompt, sampling=sampling,
                transfer_id=res.transfer_id, block_ids=res.block_ids,
                kv_endpoint=res.kv_endpoint, layout=res.layout, skip_tokens=res.skip_tokens,
                lora="m", lora_identity=res.lora_identity), timeout=30)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "on the decode worker" in (info.value.details() or "")
        decode.Abort(worker_pb2.AbortRequest(request_id="mismatch"), timeout=30)
    wait_until(lambda: _idle(lora))


def test_runtime_load_and_unload_behind_the_admin_key(lora: LoraCluster,
                                                     client: openai.OpenAI) -> None:
    http = f"http://{lora.router.info['http']}"
    d = make_tiny_adapter(lora.model, lora.root / "d", rank=4, seed=16, scale=0.5)
    big = make_tiny_adapter(lora.model, lora.root / "big", rank=16, seed=17)
    load = {"lora_name": "d", "lora_path": str(d)}
    assert _post(f"{http}/v1/load_lora_adapter", load)[0] == 401
    assert _post(f"{http}/v1/load_lora_adapter", load, "wrong")[0] == 401
    for body, status, words in (
            ({"lora_name": "e", "lora_path": str(lora.root / "missing")}, 400, "not a directory"),
            ({"lora_name": "e", "lora_path": str(big)}, 400, "--max-lora-rank"),
            ({"lora_name": "e"}, 400, "lora_path"),
            ({"lora_name": "a", "lora_path": str(d)}, 400, "already loaded")):
        code, text = _post(f"{http}/v1/load_lora_adapter", body, ADMIN_KEY)
        assert code == status and words in text, text
    code, text = _post(f"{http}/v1/load_lora_adapter", load, ADMIN_KEY)
    assert code == 200, text
    wait_until(lambda: "d" in {m.id for m in client.models.list().data})
    prompt = _prompt(50)
    with tandem.Client(lora.router.grpc) as sdk:
        got = sdk.generate(token_ids=prompt, model="d", max_tokens=NEW, **GREEDY)
    assert list(got.token_ids) == peft_greedy(lora.model, d, prompt, NEW)
    code, text = _post(f"{http}/v1/unload_lora_adapter", {"lora_name": "d"}, ADMIN_KEY)
    assert code == 200, text
    wait_until(lambda: "d" not in {m.id for m in client.models.list().data})
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="d", prompt="hi", max_tokens=2)
    assert _post(f"{http}/v1/unload_lora_adapter", {"lora_name": "d"}, ADMIN_KEY)[0] == 404
    # the prefill worker's failed load (no adapter "e" anywhere) left nothing behind
    assert "e" not in {m.id for m in client.models.list().data}
    wait_until(lambda: _idle(lora))


def test_workers_without_the_flag_refuse_runtime_updates(tiny_workers) -> None:
    with tiny_workers.decode.channel() as channel:
        with pytest.raises(grpc.RpcError) as info:
            worker_pb2_grpc.LoraAdaptersStub(channel).Load(
                worker_pb2.LoraAdapterRequest(name="x", path="/tmp"), timeout=30)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "--allow-runtime-lora-updates" in (info.value.details() or "")
