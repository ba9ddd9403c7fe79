"""Prefix-delta handoff on real processes: later turns of a conversation push only new KV.

Router R sends every prompt to the prefill worker (``--placement remote``) and decodes on D;
router C serves the same model colocated on its own decode worker (the reference). A
three-turn conversation (each turn's prompt = the last prompt + the reply + a new user turn)
gets the same greedy tokens through both, and turn 3 pushes only the blocks D does not
already hold from turn 2 (its Reserve reused the rest: ReserveResponse.cached_tokens).
Then D's cache is flooded until the conversation is evicted, while the router still
believes D holds it: the next turn's Reserve reuses nothing, the whole prompt is pushed,
and the output is still the reference's. No KV block stays held afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from tandem.launcher.local_cluster import Cluster, Proc
from tandem.protos.v1 import tandem_pb2, tandem_pb2_grpc
from tests.integration.sdk_cluster import wait_until, worker_stats
from tests.integration.served_model import engine_flags, start_all, tiny_served_model

BS = 16  # the workers' block size (the engine default)
OUT = 6  # tokens per reply


@pytest.fixture(scope="module")
def cluster(tiny_dir: Callable[..., Path], smollm2_dir: Path) -> Iterator[dict[str, Proc]]:
    model = tiny_served_model(tiny_dir, smollm2_dir)
    c = Cluster()
    try:
        worker = ("--port", "0", "--kv-port", "0", *engine_flags(model))
        decode, prefill, reference = start_all(
            c, ("tandem.worker.decode", *worker), ("tandem.worker.prefill", "--port", "0", *engine_flags(model)),
            ("tandem.worker.decode", *worker))
        common = ["--port", "0", "--tokenizer", str(model), "--model-name", "tiny"]
        remote, colocated = start_all(
            c, ("tandem.router", *common, "--decode", decode.grpc, "--prefill", prefill.grpc,
                "--placement", "remote"),
            ("tandem.router", *common, "--decode", reference.grpc))
        yield {"remote": remote, "colocated": colocated, "decode": decode,
               "prefill": prefill, "reference": reference}
    finally:
        c.stop()


def _generate(router: Proc, prompt: list[int]) -> list[int]:
    request = tandem_pb2.GenerateRequest(
        token_ids=tandem_pb2.TokenIds(ids=prompt),
        sampling=tandem_pb2.SamplingParams(max_tokens=OUT, temperature=0.0, ignore_eos=True))
    with grpc.insecure_channel(router.grpc) as channel:
        stub = tandem_pb2_grpc.TandemStub(channel)
        return [t for msg in stub.Generate(request, timeout=120) for t in msg.token_ids]


def _pushed(cluster: dict[str, Proc]) -> int:
    """KV bytes the prefill worker has pushed so far (counted before each Prefill reply)."""
    return worker_stats(cluster["prefill"], "prefill").kv_transfer_bytes


def _turn(cluster: dict[str, Proc], prompt: list[int]) -> tuple[list[int], int]:
    """One turn through R (checked against C); its reply and the KV bytes it pushed."""
    before = _pushed(cluster)
    got = _generate(cluster["remote"], prompt)
    assert got == _generate(cluster["colocated"], prompt), len(prompt)
    return got, _pushed(cluster) - before


def _blocks(n_tokens: int) -> int:
    return -(-n_tokens // BS)


def _idle(cluster: dict[str, Proc]) -> bool:
    d = worker_stats(cluster["decode"], "decode")
    p = worker_stats(cluster["prefill"], "prefill")
    return (d.num_free_blocks == d.num_blocks and p.num_free_blocks == p.num_blocks
            and d.num_leased_blocks == 0 and p.num_leased_blocks == 0)


def test_later_turns_push_only_their_new_blocks(cluster: dict[str, Proc]) -> None:
    prompt = [200 + i for i in range(70)]  # a system prompt and a first user turn
    reply, pushed = _turn(cluster, prompt)
    per_block = pushed // _blocks(len(prompt))  # turn 1: D held nothing, every block went
    assert per_block > 0 and pushed == per_block * _blocks(len(prompt))
    for turn, user in ((2, [900 + i for i in range(23)]), (3, [1500 + i for i in range(19)])):
        history = prompt + reply  # what D cached while decoding: all but the last token's KV
        prompt = history + user
        reply, pushed = _turn(cluster, prompt)
        held = min((len(history) - 1) // BS, (len(prompt) - 1) // BS)
        want = _blocks(len(prompt)) - held
        assert pushed == want * per_block, (turn, pushed // per_block, want)
    assert want <= 3 < _blocks(len(prompt))  # turn 3: 2 of 8 blocks, not the whole prompt
    wait_until(lambda: _idle(cluster))


def test_a_prefix_evicted_after_routing_is_pushed_whole(cluster: dict[str, Proc]) -> None:
    """D reported holding the conversation; other prompts then evicted it. The next turn's
    Reserve finds nothing to reuse, so every block is pushed, and the output is unchanged."""
    prompt = [3000 + i for i in range(60)]
    reply, _ = _turn(cluster, prompt)
    nxt = prompt + reply + [4000 + i for i in range(10)]
    # D has 128 blocks; 4 prompts of 40 blocks each cycle through all of them, least
    # recently used first: the conversation's freed blocks go first.
    for k in range(4):
        _generate(cluster["remote"], [10_000 + 1000 * k + i for i in range(640)])
    _, pushed = _turn(cluster, nxt)
    per_block = _per_block(cluster)
    assert pushed == _blocks(len(nxt)) * per_block
    wait_until(lambda: _idle(cluster))


def _per_block(cluster: dict[str, Proc]) -> int:
    """Bytes of one block's KV: a fresh single-block prompt pushes exactly one."""
    _, pushed = _turn(cluster, [7000 + i for i in range(BS - 3)])
    return pushed
