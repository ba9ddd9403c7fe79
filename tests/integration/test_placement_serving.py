"""Adaptive placement (the default) on real processes: whatever it picks, output is the same.

Router A places each prompt per request (tandem/placement/cost_model.py, from the step costs the
workers fit and report in Stats); router B over the same decode worker has no prefill worker
(colocated: every prompt prefilled locally). Greedy output through A equals output through B
for short and long prompts, every decision is counted in ``tandem_disagg_decision_total``,
both workers report their fitted step costs, and no KV block stays held afterwards. Which
path each prompt takes depends on measured timings, so the test asserts what holds on both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from tandem.launcher.local_cluster import Cluster, Proc
from tandem.protos.v1 import tandem_pb2, tandem_pb2_grpc
from tests.integration.sdk_cluster import wait_until, worker_stats
from tests.integration.served_model import start_all, start_workers, tiny_served_model
from tests.scrape import fetch, parse

MAX_TOKENS = 6
# Token-id prompts: short chat turns and long RAG-like prompts, interleaved.
PROMPTS = [[100 + i + j for j in range(n)] for i, n in enumerate((12, 600, 20, 700, 16, 650))]


@pytest.fixture(scope="module")
def cluster(tiny_dir: Callable[..., Path], smollm2_dir: Path) -> Iterator[dict[str, Proc]]:
    model = tiny_served_model(tiny_dir, smollm2_dir)
    c = Cluster()
    try:
        decode, prefill = start_workers(c, model)
        common = ["--port", "0", "--tokenizer", str(model), "--model-name", "tiny",
                  "--decode", decode.grpc]
        adaptive, colocated = start_all(
            c, ("tandem.router", *common, "--http-port", "0", "--prefill", prefill.grpc),
            ("tandem.router", *common))
        yield {"adaptive": adaptive, "colocated": colocated, "decode": decode,
               "prefill": prefill}
    finally:
        c.stop()


def _generate(router: Proc, prompt: list[int]) -> list[int]:
    request = tandem_pb2.GenerateRequest(
        token_ids=tandem_pb2.TokenIds(ids=prompt),
        sampling=tandem_pb2.SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0,
                                           ignore_eos=True))
    with grpc.insecure_channel(router.grpc) as channel:
        stub = tandem_pb2_grpc.TandemStub(channel)
        return [t for msg in stub.Generate(request, timeout=120) for t in msg.token_ids]


def _decisions(router: Proc) -> dict[tuple[str, str], float]:
    found = {}
    for (name, labels), v in parse(fetch(router.info["http"])).items():
        if name == "tandem_disagg_decision_total":
            by = dict(labels)
            found[(by["decision"], by["reason"])] = v
    return found


def test_adaptive_output_equals_colocated(cluster: dict[str, Proc]) -> None:
    for prompt in PROMPTS:
        want = _generate(cluster["colocated"], prompt)
        assert _generate(cluster["adaptive"], prompt) == want, len(prompt)
    decisions = _decisions(cluster["adaptive"])
    assert sum(decisions.values()) == len(PROMPTS), decisions
    assert {d for d, _ in decisions} <= {"local", "remote"}
    # Both workers fitted their step costs from the steps above.
    p, d = worker_stats(cluster["prefill"], "prefill"), worker_stats(cluster["decode"], "decode")
    assert p.HasField("step_per_prefill_token_s") and p.step_per_prefill_token_s > 0
    assert d.HasField("step_base_s") and d.HasField("step_per_prefill_token_s")
    assert d.max_batched_tokens > 0

    def idle() -> bool:
        dst = worker_stats(cluster["decode"], "decode")
        pst = worker_stats(cluster["prefill"], "prefill")
        return (dst.num_free_blocks == dst.num_blocks and pst.num_free_blocks == pst.num_blocks
                and dst.pending_prefill_tokens == 0)

    wait_until(idle)  # every block back (the last stream's blocks free as it finishes)
