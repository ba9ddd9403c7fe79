"""The handoff's worker calls: their messages <-> the router's plain types, at each call.

    out  LegRequest (+ lease)                -> ReserveRequest
         LegRequest + Reservation            -> PrefillRequest  (skip_tokens: the cached part)
         leg id (+ sequence)                 -> PrefillLocalRequest, DecodeRequest, AbortRequest,
                                                SuspendRequest, ResumeRequest
         leg id + target Reservation + token -> MoveOutRequest (a live move)
         leg id + target Reservation + tokens -> PreCopyRequest (its pre-copy)
    in   ReserveResponse                     -> Reservation
         PrefillResponse                     -> PrefillReply
         GenerateResponse (a Decode stream)  -> Chunk
"""

from __future__ import annotations

from tandem.protos.v1 import tandem_pb2, worker_pb2
from tandem.router.convert.sampling import (
    logprob_options_to_proto,
    sampling_to_proto,
    token_logprob_from_proto,
    token_logprobs_from_proto,
)
from tandem.router.handoff.leg_types import KvLayout, LegRequest, PrefillReply, Reservation
from tandem.router.request import Chunk


def reserve_request(leg: LegRequest, lease_s: float) -> worker_pb2.ReserveRequest:
    """DecodeService.Reserve's request: free the blocks unless committed within ``lease_s``."""
    return worker_pb2.ReserveRequest(
        request_id=leg.leg_id,
        token_ids=leg.token_ids,
        sampling=sampling_to_proto(leg.sampling),
        logprobs=logprob_options_to_proto(leg.logprobs),
        lease_s=lease_s,
        prior_output_tokens=leg.prior_output_tokens,
        n=leg.n,
        moved_in=leg.moved_in,
        lora=_name(leg.lora),
        precopy=leg.precopy,
    )


def suspend_request(leg_id: str, index: int = 0) -> worker_pb2.SuspendRequest:
    """DecodeService.Suspend's request (``index``: a forked leg's sequence)."""
    return worker_pb2.SuspendRequest(request_id=leg_id, index=index)


def resume_request(leg_id: str, index: int = 0) -> worker_pb2.ResumeRequest:
    """DecodeService.Resume's request (``index``: a forked leg's sequence)."""
    return worker_pb2.ResumeRequest(request_id=leg_id, index=index)


def move_out_request(leg_id: str, reservation: Reservation, last_token: int, index: int = 0
                     ) -> worker_pb2.MoveOutRequest:
    """DecodeService.MoveOut's request: push the KV of ``leg_id`` (its sequence ``index``)
    into the target's ``reservation`` (all but what it caches), commit ``last_token``
    there."""
    out = worker_pb2.MoveOutRequest(
        request_id=leg_id, transfer_id=reservation.transfer_id,
        block_ids=reservation.block_ids, kv_endpoint=reservation.kv_endpoint,
        skip_tokens=reservation.skip_tokens, last_token=last_token, index=index)
    if reservation.layout is not None:
        out.layout.CopyFrom(_layout_to_proto(reservation.layout))
    return out


def precopy_request(leg_id: str, reservation: Reservation, token_ids: list[int],
                    index: int = 0) -> worker_pb2.PreCopyRequest:
    """DecodeService.PreCopy's request: push the KV of the leading ``token_ids`` of
    ``leg_id`` (its sequence ``index``) into the target's pre-copy ``reservation`` (all but
    what it caches), while the leg decodes on."""
    out = worker_pb2.PreCopyRequest(
        request_id=leg_id, index=index, transfer_id=reservation.transfer_id,
        block_ids=reservation.block_ids, kv_endpoint=reservation.kv_endpoint,
        skip_tokens=reservation.skip_tokens, token_ids=token_ids)
    if reservation.layout is not None:
        out.layout.CopyFrom(_layout_to_proto(reservation.layout))
    return out


def _layout_to_proto(lo: KvLayout) -> worker_pb2.KVLayout:
    return worker_pb2.KVLayout(
        model=lo.model, dtype=lo.dtype, block_size=lo.block_size, num_layers=lo.num_layers,
        num_kv_heads=lo.num_kv_heads, head_dim=lo.head_dim, fingerprint=lo.fingerprint,
        bytes_per_token=lo.bytes_per_token)


def _name(identity: str) -> str:
    """The adapter name of an identity (``name@digest``; "" stays "")."""
    return identity.rpartition("@")[0]


def reservation_from_proto(reply: worker_pb2.ReserveResponse) -> Reservation:
    """DecodeService.Reserve's reply."""
    layout = None
    if reply.HasField("layout"):
        lo = reply.layout
        layout = KvLayout(lo.model, lo.dtype, lo.block_size, lo.num_layers, lo.num_kv_heads,
                          lo.head_dim, lo.fingerprint, lo.bytes_per_token)
    return Reservation(reply.transfer_id, tuple(reply.block_ids), reply.kv_endpoint, layout,
                       reply.cached_tokens, reply.lora_identity, reply.skip_tokens)


def prefill_request(leg: LegRequest, reservation: Reservation) -> worker_pb2.PrefillRequest:
    """PrefillService.Prefill's request: push into ``reservation`` all but the KV it holds."""
    out = worker_pb2.PrefillRequest(
        request_id=leg.leg_id,
        token_ids=leg.token_ids,
        sampling=sampling_to_proto(leg.sampling),
        logprobs=logprob_options_to_proto(leg.logprobs),
        transfer_id=reservation.transfer_id,
        block_ids=reservation.block_ids,
        kv_endpoint=reservation.kv_endpoint,
        prior_output_tokens=leg.prior_output_tokens,
        skip_tokens=reservation.skip_tokens,  # D needs only the KV after these: it is pushed
        n=leg.n,
        lora=_name(leg.lora),
        lora_identity=reservation.lora_identity,  # P checks it is its own, BEGIN carries it
    )
    if reservation.layout is not None:
        out.layout.CopyFrom(_layout_to_proto(reservation.layout))
    return out


def prefill_local_request(leg_id: str) -> worker_pb2.PrefillLocalRequest:
    """DecodeService.PrefillLocal's request."""
    return worker_pb2.PrefillLocalRequest(request_id=leg_id)


def prefill_reply_from_proto(reply: worker_pb2.PrefillResponse) -> PrefillReply:
    """A Prefill's (or PrefillLocal's) reply."""
    return PrefillReply(
        first_token=reply.first_token,
        logprob=reply.logprob,
        cached_tokens=reply.cached_tokens,
        prefill_s=reply.prefill_s,
        transfer_s=reply.transfer_s,
        first_logprob=(token_logprob_from_proto(reply.first_logprob)
                       if reply.HasField("first_logprob") else None),
        prompt_logprobs=token_logprobs_from_proto(reply.prompt_logprobs),
        first_tokens=token_logprobs_from_proto(reply.first_tokens),
    )


def decode_request(leg_id: str, index: int) -> worker_pb2.DecodeRequest:
    """DecodeService.Decode's request (``index``: the sequence of a forked leg)."""
    return worker_pb2.DecodeRequest(request_id=leg_id, index=index)


def chunk_from_proto(message: tandem_pb2.GenerateResponse, index: int = 0) -> Chunk:
    """A decode worker's stream message as a Chunk of sequence ``index``."""
    return Chunk(
        list(message.token_ids),
        list(token_logprobs_from_proto(message.logprobs)),
        message.text,
        message.finished,
        message.finish_reason,
        message.stop_reason,
        index=index,
    )


def abort_request(leg_id: str, index: int | None) -> worker_pb2.AbortRequest:
    """An Abort's request (``index``: only that sequence of a forked decode leg)."""
    return worker_pb2.AbortRequest(request_id=leg_id, index=index)
