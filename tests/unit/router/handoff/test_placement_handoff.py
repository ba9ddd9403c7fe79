"""Placement inside the handoff, against fake workers whose Stats report step costs."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import generate_latest

from tandem.placement.log import read_placement_log
from tandem.protos.v1 import tandem_pb2, worker_pb2
from tandem.router.tokenizer import RouterTokenizer
from tests.scrape import parse
from tests.unit.router.fakes import expected_output
from tests.unit.router.harness import MODEL, Cluster, cluster

SHORT = list(range(1000, 1040))  # 40 tokens: a chat turn
LONG = list(range(2000, 3500))  # 1,500 tokens: a RAG prompt
# A decode worker running 8 streams at 30 ms + 2 ms a row, 0.4 ms a prompt token; a prefill
# worker as fast per token with 3,000 tokens queued (1.2 s of work ahead of a new prompt).
DECODE_COSTS = {"step_base_s": 0.03, "step_per_row_s": 0.002, "num_running": 8,
                "step_per_prefill_token_s": 0.0004, "max_batched_tokens": 512}
PREFILL_COSTS = {"step_base_s": 0.01, "step_per_prefill_token_s": 0.0004,
                 "pending_prefill_tokens": 3000, "max_batched_tokens": 2048}


def _request(prompt: list[int], n: int = 4) -> tandem_pb2.GenerateRequest:
    return tandem_pb2.GenerateRequest(
        token_ids=tandem_pb2.TokenIds(ids=prompt),
        sampling=tandem_pb2.SamplingParams(max_tokens=n, temperature=0.0),
    )


async def _with_costs(c: Cluster) -> None:
    c.decode[0].stats = dict(DECODE_COSTS)
    c.prefill[0].stats = dict(PREFILL_COSTS)
    await c.router.monitor.probe_all()  # the router reads them from Stats


def _decisions(c: Cluster) -> dict[tuple[str, str], float]:
    samples = parse(generate_latest(c.router.metrics.registry).decode())
    found = {}
    for (name, labels), value in samples.items():
        if name == "tandem_disagg_decision_total":
            by = dict(labels)
            found[(by["decision"], by["reason"])] = value
    return found


def _tokens(responses: list[tandem_pb2.GenerateResponse]) -> list[int]:
    return [t for r in responses for t in r.token_ids]


def test_chat_turn_goes_local_and_rag_prompt_goes_remote(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer) as c:
            await _with_costs(c)
            assert _tokens(await c.generate(_request(SHORT))) == expected_output(SHORT, 4)
            assert len(c.decode[0].local_prefills) == 1 and not c.prefill[0].calls
            assert _tokens(await c.generate(_request(LONG))) == expected_output(LONG, 4)
            assert len(c.prefill[0].calls) == 1 and len(c.decode[0].local_prefills) == 1
            assert c.counters.local_prefill_placed == 1
            assert _decisions(c) == {("local", "slo"): 1, ("remote", "slo"): 1}

    asyncio.run(scenario())


def test_without_costs_every_prompt_goes_remote(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer) as c:
            await c.generate(_request(SHORT))
            assert len(c.prefill[0].calls) == 1 and not c.decode[0].local_prefills
            assert _decisions(c) == {("remote", "no_signal"): 1}

    asyncio.run(scenario())


def test_placement_remote_and_threshold_override_the_model(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, placement="remote") as c:
            await _with_costs(c)
            await c.generate(_request(SHORT))
            assert len(c.prefill[0].calls) == 1 and not c.decode[0].local_prefills
            assert _decisions(c) == {("remote", "configured"): 1}
        async with cluster(tokenizer, local_prefill_threshold=2000) as c:
            await _with_costs(c)
            await c.generate(_request(LONG))  # 1,500 < 2,000: local, whatever the model says
            assert len(c.decode[0].local_prefills) == 1 and not c.prefill[0].calls
            assert _decisions(c) == {("local", "threshold"): 1}
            assert c.counters.local_prefill_short == 1

    asyncio.run(scenario())


def test_remote_overhead_is_learned(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer) as c:
            await _with_costs(c)
            await c.generate(_request(LONG))
            overheads = c.router.deps.overheads.current()
            assert list(overheads) == [c.prefill_endpoints[0]] and overheads[c.prefill_endpoints[0]] >= 0.0

    asyncio.run(scenario())


def test_local_overhead_is_learned_against_the_decisions_prediction(
        tokenizer: RouterTokenizer) -> None:
    """A placed local prefill teaches the decode worker's overhead: what PrefillLocal took
    beyond the local option's compute as predicted at the decision; the next chat turn of
    the same size then weighs local with it, and goes remote."""
    async def scenario() -> None:
        async with cluster(tokenizer) as c:
            c.decode[0].stats = dict(DECODE_COSTS)
            # 500 tokens queued: remote 0.01 + 540 * 0.0004 = 0.226 s for a chat turn, local
            # 0.03 + 8 * 0.002 + 40 * 0.0004 = 0.062 s.
            c.prefill[0].stats = dict(PREFILL_COSTS, pending_prefill_tokens=500)
            await c.router.monitor.probe_all()
            d = c.decode_endpoints[0]
            c.decode[0].local_prefill_s = 0.5  # the local prefill takes at least 0.5 s
            await c.generate(_request(SHORT))
            assert len(c.decode[0].local_prefills) == 1 and not c.prefill[0].calls
            learnt = c.router.deps.overheads.current()[d]
            assert 0.5 - 0.062 <= learnt < 0.5 - 0.062 + 5.0
            await c.generate(_request(list(range(5000, 5040))))
            assert len(c.decode[0].local_prefills) == 1 and len(c.prefill[0].calls) == 1
            assert _decisions(c) == {("local", "slo"): 1, ("remote", "slo"): 1}

    asyncio.run(scenario())


def test_the_placement_log_keeps_each_decision_with_its_inputs(
        tokenizer: RouterTokenizer, tmp_path) -> None:
    """--placement-log: one record per decision, with both options' predictions (the ones
    cost_model.decide compared) and the fits, queues and overheads behind them."""
    path = tmp_path / "placements.jsonl"

    async def scenario() -> None:
        async with cluster(tokenizer, placement_log=str(path)) as c:
            await _with_costs(c)
            await c.generate(_request(SHORT))
            await c.generate(_request(LONG))
        records = read_placement_log(path)
        assert [(r["tokens"], r["decision"], r["reason"]) for r in records] == [
            (len(SHORT), "local", "slo"), (len(LONG), "remote", "slo")]
        short, long = records
        # the chat turn: local is predicted faster than a prefill worker 3,000 tokens behind
        remote = short["prefill"][0]
        assert short["local"]["ttft_s"] < remote["ttft_s"]
        assert remote["queued"] == 3000 and remote["per_token_s"] == 0.0004
        assert short["decode"]["base_s"] == 0.03 and short["decode"]["running"] == 8
        assert long["endpoint"] == remote["endpoint"] == c.prefill_endpoints[0]
        # the RAG prompt: local would be sooner, but its chunks would stall D's 8 streams
        # past the TPOT target (0.1 s); remote keeps their gap at a plain step's
        assert long["local"]["gap_s"] > 0.1 >= long["prefill"][0]["gap_s"]
        assert path.stat().st_mode & 0o777 == 0o600

    asyncio.run(scenario())


# SmolLM2-135M's cache: 30 layers, 3 KV heads of 64, float16 (23,040 bytes a token): LONG's
# push moves 1,500 x 23,040 = 34.6 MB.
SMOLLM2_LAYOUT = worker_pb2.KVLayout(model=MODEL, dtype="float16", block_size=16,
                                     num_layers=30, num_kv_heads=3, head_dim=64,
                                     fingerprint="f")
# A decode worker with 2 streams and a 128-token chunk budget (local LONG: 12 chunks of
# 34 ms + 0.6 s = 1.0 s, a gap of 86 ms) and an idle prefill worker (remote LONG: 0.61 s
# before its push).
LINK_DECODE = dict(DECODE_COSTS, num_running=2, max_batched_tokens=128)
LINK_PREFILL = dict(PREFILL_COSTS, pending_prefill_tokens=0)


async def _with_link_costs(c: Cluster) -> None:
    c.decode[0].layout = SMOLLM2_LAYOUT
    c.decode[0].stats = dict(LINK_DECODE)
    c.prefill[0].stats = dict(LINK_PREFILL)
    await c.router.monitor.probe_all()


def test_a_slow_link_prior_keeps_a_long_prompt_local(tokenizer: RouterTokenizer,
                                                      tmp_path) -> None:
    """--link-prior-gbps 0.1: before any push has measured the pair, LONG's 34.6 MB cost
    2.8 s on the wire, more than the decode worker's chunked prefill: it goes local. With
    the default prior (10 Gb/s: 28 ms) it goes remote."""
    path = tmp_path / "placements.jsonl"

    async def scenario(gbps: float, log: str) -> tuple[int, int]:
        async with cluster(tokenizer, link_prior_gbps=gbps, placement_log=log) as c:
            await _with_link_costs(c)
            assert _tokens(await c.generate(_request(LONG))) == expected_output(LONG, 4)
            return len(c.prefill[0].calls), len(c.decode[0].local_prefills)

    assert asyncio.run(scenario(0.1, str(path))) == (0, 1)
    assert asyncio.run(scenario(10.0, str(tmp_path / "fast.jsonl"))) == (1, 0)
    (record,) = read_placement_log(path)
    assert record["prefill"][0]["link_s"] == pytest.approx(0.0005 + 34_560_000 / 12.5e6)


def test_the_link_is_learnt_from_pushes_and_then_prices_them(
        tokenizer: RouterTokenizer) -> None:
    """The default prior sends LONG remote; its push takes 1.5 s beyond the prefill
    worker's first token, which the router learns for the pair; the next LONG goes local."""
    async def scenario() -> None:
        async with cluster(tokenizer) as c:
            await _with_link_costs(c)
            c.prefill[0].push_s = 1.5
            await c.generate(_request(LONG))
            assert len(c.prefill[0].calls) == 1 and not c.decode[0].local_prefills
            est = c.router.deps.links.estimate(c.prefill_endpoints[0], c.decode_endpoints[0])
            assert est is not None and est.samples == 1
            assert est.seconds(34_560_000) >= 1.5 - 0.002
            await c.generate(_request(list(range(4000, 5500))))
            assert len(c.prefill[0].calls) == 1 and len(c.decode[0].local_prefills) == 1
            assert _decisions(c) == {("remote", "slo"): 1, ("local", "slo"): 1}

    asyncio.run(scenario())


def test_a_push_is_priced_at_the_bytes_per_token_the_decode_worker_states() -> None:
    """A latent (MLA) or int8 cache states its own bytes per token; a layout stating none
    (an older worker) is counted as K and V planes of its shape."""
    from tandem.router.handoff.leg_types import KvLayout, Reservation
    from tandem.router.handoff.prefill_placement import push_bytes

    stated = KvLayout("m", "bfloat16", 16, 4, 1, 72, "f", bytes_per_token=576)
    shape = KvLayout("m", "bfloat16", 16, 4, 1, 72, "f")
    assert push_bytes(Reservation("t", (1, 2), "h:1", stated, cached_tokens=16), 40) == 24 * 576
    # a sliding window's reservation skips more than it caches: only the window is pushed
    assert push_bytes(Reservation("t", (1,), "h:1", stated, cached_tokens=16,
                                  skip_tokens=32), 40) == 8 * 576
    assert push_bytes(Reservation("t", (1, 2), "h:1", shape), 40) == 40 * 2 * 4 * 72 * 2
    assert push_bytes(Reservation("t", (1,), "h:1", None), 40) == 0
