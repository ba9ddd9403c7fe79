"""Speculative decoding through the disaggregated path: a plain prefill worker pushes the
prompt's KV to decode workers started with ``--speculative ngram`` and ``--speculative draft``
(the draft builds its own KV for the prompt there), and to a tensor-parallel decode group of 2
ranks speculating with a draft checkpoint (run whole on its rank 0, each rank receiving its
own KV heads); greedy output equals one plain engine's."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tandem.engine.sampling_params import SamplingParams
from tandem.launcher.local_cluster import Cluster, Proc
from tandem.protos.v1 import tandem_pb2, worker_pb2, worker_pb2_grpc
from tests.integration.served_model import start_all

CHUNK = [3 + (i * 29) % 250 for i in range(13)]
PROMPT = CHUNK * 3 + CHUNK[:5]  # repeats: prompt lookup has something to find
MAX_NEW = 24


def _greedy(n: int) -> tandem_pb2.SamplingParams:
    return tandem_pb2.SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def workers(tiny_dir) -> Iterator[tuple[Proc, dict[str, Proc]]]:
    model = str(tiny_dir("llama", 2))
    # float32 KV everywhere: a group's cache is in the model dtype ("auto" is float16 only for
    # one process on the fused native forward), and a handoff needs one dtype on both sides
    common = ["--model", model, "--block-size", "4", "--threads", "1", "--num-blocks", "128",
              "--kv-cache-dtype", "float32"]
    cluster = Cluster()
    try:
        speculative = {
            "ngram": ["--speculative", "ngram", "--num-speculative-tokens", "4"],
            "draft": ["--speculative", "draft", "--draft-layers", "2",
                      "--num-speculative-tokens", "3"],
            # the target's own checkpoint as the draft: every guess is accepted
            "draft-tp2": ["--tensor-parallel-size", "2", "--speculative", "draft",
                          "--draft-model", model, "--num-speculative-tokens", "3"],
        }
        prefill, *started = start_all(
            cluster, ("tandem.worker.prefill", "--port", "0", *common),
            *(("tandem.worker.decode", "--port", "0", "--kv-port", "0", *common, *flags)
              for flags in speculative.values()),
            timeout=180)
        decodes = dict(zip(speculative, started, strict=True))
        yield prefill, decodes
    finally:
        cluster.stop()


@pytest.mark.parametrize("method", ["ngram", "draft", "draft-tp2"])
def test_speculative_decode_worker_equals_plain(workers, make_engine, tiny_dir, method) -> None:
    engine = make_engine(model=str(tiny_dir("llama", 2)), num_blocks=64, block_size=4,
                         num_threads=1, kv_cache_dtype="float32")
    rid = engine.add_request(PROMPT, SamplingParams(temperature=0.0, max_tokens=MAX_NEW,
                                                    ignore_eos=True))
    want: list[int] = []
    while engine.has_unfinished():
        want += [t for o in engine.step() if o.request_id == rid for t in o.new_token_ids]

    prefill_proc, decodes = workers
    with decodes[method].channel() as dch, prefill_proc.channel() as pch:
        decode = worker_pb2_grpc.DecodeServiceStub(dch)
        prefill = worker_pb2_grpc.PrefillServiceStub(pch)
        res = decode.Reserve(worker_pb2.ReserveRequest(
            request_id=method, token_ids=PROMPT, sampling=_greedy(MAX_NEW), lease_s=60.0))
        first = prefill.Prefill(worker_pb2.PrefillRequest(
            request_id=method, token_ids=PROMPT, sampling=_greedy(MAX_NEW),
            transfer_id=res.transfer_id, block_ids=res.block_ids, skip_tokens=res.skip_tokens, kv_endpoint=res.kv_endpoint,
            layout=res.layout))
        msgs = list(decode.Decode(worker_pb2.DecodeRequest(request_id=method)))
        got = [first.first_token] + [t for m in msgs for t in m.token_ids]
        assert got == want
        assert msgs[-1].finished and msgs[-1].finish_reason == "length"
        assert msgs[-1].usage.completion_tokens == MAX_NEW
        # several tokens arrived in one message: the decode worker really speculated
        assert max(len(m.token_ids) for m in msgs) > 1
        stats = decode.Stats(worker_pb2.StatsRequest())
        assert stats.num_running == 0 and stats.num_free_blocks == stats.num_blocks
