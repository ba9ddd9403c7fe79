"""Disaggregation on one CUDA device: a prefill and a decode worker process, both with their
KV cache on the GPU, hand a prompt over (Reserve -> Prefill -> Decode) and the tokens equal
one CUDA engine's greedy output, twice (the second time over the decode worker's cached
prefix); both workers end idle. The KV moves over the transport two CUDA caches on one host
negotiate (CUDA IPC first; tests/unit/kv_transfer/test_kv_cuda_ipc.py covers each transport).

Runs only where a GPU is present (``scripts/gpu_check.sh``); skipped otherwise, never faked.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tandem.engine.sampling_params import SamplingParams
from tandem.protos.v1 import worker_pb2
from tests.integration.test_workers_handoff import PROMPT, Cluster, Worker

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def cuda_pair(request: pytest.FixtureRequest, tiny_dir, tmp_path_factory
              ) -> Iterator[tuple[Cluster, str]]:
    """A decode and a prefill worker on the GPU, model weights and KV in ``dtype``."""
    dtype = request.param
    model = str(tiny_dir("llama", 2))
    logs: Path = tmp_path_factory.mktemp(f"gpu-worker-logs-{dtype}")
    engine = ["--model", model, "--device", "cuda", "--dtype", dtype, "--block-size", "16",
              "--num-blocks", "64"]
    decode = Worker("tandem.worker.decode", ["--port", "0", "--kv-port", "0", *engine],
                    logs / "decode.log")
    prefill = Worker("tandem.worker.prefill", ["--port", "0", *engine], logs / "prefill.log")
    c = None
    try:
        d_info, p_info = decode.wait_ready(), prefill.wait_ready()
        c = Cluster(decode, d_info, prefill, p_info, model)
        yield c, dtype
    finally:
        if c is not None:
            c.close()
        codes = (decode.stop(), prefill.stop())
    assert codes == (0, 0), f"exit codes {codes}; logs in {logs}"


def test_cuda_handoff_equals_one_cuda_engine(cuda_pair, make_engine) -> None:
    cluster, dtype = cuda_pair
    engine = make_engine(model=cluster.model, device="cuda", dtype=dtype, num_blocks=64,
                         block_size=16, kv_cache_dtype="auto")
    want: list[int] = []
    rid = engine.add_request(PROMPT, SamplingParams(temperature=0.0, max_tokens=16,
                                                    ignore_eos=True))
    while engine.has_unfinished():
        want += [t for o in engine.step() if o.request_id == rid for t in o.new_token_ids]

    for attempt in range(2):  # the second prompt reuses the decode worker's cached prefix
        rid = f"gpu-{attempt}"
        res = cluster.reserve(rid, PROMPT, 16)
        first = cluster.prefill.Prefill(cluster.prefill_request(rid, PROMPT, 16, res),
                                        timeout=120)
        msgs = list(cluster.decode.Decode(worker_pb2.DecodeRequest(request_id=rid),
                                          timeout=120))
        assert [first.first_token] + [t for m in msgs for t in m.token_ids] == want, attempt
        assert msgs[-1].finished and msgs[-1].finish_reason == "length"
    cluster.both_idle()
