"""The handoff's worker messages at each call: a leg becomes its Reserve and Prefill requests
(the reservation's cached part skipped, its layout passed on only when the decode worker
reported one), and the replies become plain types."""

from __future__ import annotations

from tandem.protos.v1 import tandem_pb2, worker_pb2
from tandem.router.api.response import TokenLogprob
from tandem.router.api.sampling import LogprobOptions, SamplingSpec
from tandem.router.convert.legs import (
    abort_request,
    chunk_from_proto,
    move_out_request,
    prefill_reply_from_proto,
    prefill_request,
    reservation_from_proto,
    reserve_request,
)
from tandem.router.handoff.leg_types import KvLayout, LegRequest, Reservation

LEG = LegRequest("rid.1", [1, 2, 3, 9], SamplingSpec(max_tokens=4, seed=7),
                 LogprobOptions(True, 1), prior_output_tokens=1, n=2)
LAYOUT = worker_pb2.KVLayout(model="m", dtype="bf16", block_size=16, num_layers=2,
                             num_kv_heads=4, head_dim=8, fingerprint="f")


def test_reserve_request() -> None:
    assert reserve_request(LEG, 5.0) == worker_pb2.ReserveRequest(
        request_id="rid.1", token_ids=[1, 2, 3, 9],
        sampling=tandem_pb2.SamplingParams(max_tokens=4, seed=7),
        logprobs=tandem_pb2.LogprobOptions(enabled=True, top_logprobs=1),
        lease_s=5.0, prior_output_tokens=1, n=2)


def test_a_reservation_and_the_prefill_it_leads_to() -> None:
    reply = worker_pb2.ReserveResponse(transfer_id="t", block_ids=[4, 5], kv_endpoint="kv:1",
                                       layout=LAYOUT, cached_tokens=16)
    reservation = reservation_from_proto(reply)
    assert reservation == Reservation("t", (4, 5), "kv:1",
                                      KvLayout("m", "bf16", 16, 2, 4, 8, "f"), 16)
    assert prefill_request(LEG, reservation) == worker_pb2.PrefillRequest(
        request_id="rid.1", token_ids=[1, 2, 3, 9],
        sampling=tandem_pb2.SamplingParams(max_tokens=4, seed=7),
        logprobs=tandem_pb2.LogprobOptions(enabled=True, top_logprobs=1),
        transfer_id="t", block_ids=[4, 5], kv_endpoint="kv:1", layout=LAYOUT,
        prior_output_tokens=1, skip_tokens=16, n=2)


def test_a_reservation_skipping_more_than_its_cached_prefix() -> None:
    """A sliding-window model's reservation: the push skips the blocks before the first
    decoded token's window, more than the worker caches."""
    reply = worker_pb2.ReserveResponse(transfer_id="t", block_ids=[4], kv_endpoint="kv:1",
                                       layout=LAYOUT, cached_tokens=16, skip_tokens=48)
    reservation = reservation_from_proto(reply)
    assert (reservation.cached_tokens, reservation.skip_tokens) == (16, 48)
    assert prefill_request(LEG, reservation).skip_tokens == 48
    assert move_out_request("rid.1", reservation, 9).skip_tokens == 48
    bare = reservation_from_proto(worker_pb2.ReserveResponse(transfer_id="t"))
    assert bare.layout is None
    assert not prefill_request(LEG, bare).HasField("layout")


def test_prefill_replies() -> None:
    full = prefill_reply_from_proto(worker_pb2.PrefillResponse(
        first_token=5, logprob=-0.5, cached_tokens=16, prefill_s=0.2, transfer_s=0.1,
        first_logprob=tandem_pb2.TokenLogprob(token_id=5, logprob=-0.5),
        prompt_logprobs=[tandem_pb2.TokenLogprob(token_id=1, logprob=-1.0)],
        first_tokens=[tandem_pb2.TokenLogprob(token_id=5), tandem_pb2.TokenLogprob(token_id=6)]))
    assert (full.first_token, full.cached_tokens, full.prefill_s, full.transfer_s) == (
        5, 16, 0.2, 0.1)
    assert full.first_logprob == TokenLogprob(5, -0.5)
    assert full.prompt_logprobs == (TokenLogprob(1, -1.0),)
    assert [t.token_id for t in full.first_tokens] == [5, 6]
    assert prefill_reply_from_proto(worker_pb2.PrefillResponse(first_token=5)).first_logprob is None


def test_a_decode_message_is_a_chunk_of_its_sequence() -> None:
    chunk = chunk_from_proto(tandem_pb2.GenerateResponse(
        token_ids=[7, 8], text="ab", finished=True, finish_reason="stop", stop_reason="b",
        logprobs=[tandem_pb2.TokenLogprob(token_id=7, logprob=-0.25)]), index=3)
    assert (chunk.token_ids, chunk.text, chunk.finished, chunk.finish_reason,
            chunk.stop_reason, chunk.index) == ([7, 8], "ab", True, "stop", "b", 3)
    assert chunk.logprobs == [TokenLogprob(7, -0.25)] and not chunk.leg_start


def test_an_abort_names_its_sequence_only_when_given() -> None:
    assert not abort_request("rid", None).HasField("index")
    assert abort_request("rid", 0).HasField("index")
