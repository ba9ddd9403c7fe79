"""Pure pieces: frames, layout fingerprint, endpoints, reservation bookkeeping, block views."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tandem.kv_transfer import ConfigError, Endpoint, KvLayout, Limits, ReceiverConfig, SenderConfig
from tandem.kv_transfer.blocks import KvBlocks, RecvSpan, SendSpan, chunk_bytes
from tandem.kv_transfer.errors import (
    FrameTooLarge,
    LayoutMismatchError,
    MalformedFrame,
    OutsideReservation,
    ReservationError,
    TransferRejected,
    TransferSpecError,
    UnknownFrameKind,
)
from tandem.kv_transfer.frames import PREFIX, HeaderCodec, Kind, encode_header, nack
from tandem.kv_transfer.reservations import ReservationTable
from tandem.kv_transfer.testing import random_cache, tiny_layout, zero_cache
from tandem.kv_transfer.transport.byte_channel import IoVec

SMOLLM2 = KvLayout("SmolLM2-135M", "bfloat16", "bfloat16", 16, 30, 3, 64)


# -- frames -----------------------------------------------------------------------------------


def test_header_round_trip_and_types() -> None:
    codec = HeaderCodec(Limits())
    header = {"kind": Kind.COMMIT, "transfer": "t", "token": 7, "logprob": -0.5, "extra": [1]}
    raw = encode_header(header)
    (n,) = PREFIX.unpack(raw[:4])
    assert n == len(raw) - 4
    decoded = codec.decode(raw[4:])
    assert decoded["kind"] is Kind.COMMIT and decoded["token"] == 7 and decoded["extra"] == [1]
    assert codec.decode(encode_header(nack(Kind.KV, "checksum", "x" * 5000, "t"))[4:])[
        "reason"] == "x" * 512


def _commit(tokens: list[int] | None, logprobs: list[float] | None) -> dict[str, object]:
    header: dict[str, object] = {"kind": Kind.COMMIT, "transfer": "t", "token": 1,
                                 "logprob": 0.0}
    if tokens is not None:
        header["tokens"] = tokens
    if logprobs is not None:
        header["logprobs"] = logprobs
    return header


def test_forked_commit_header() -> None:
    decoded = HeaderCodec(Limits()).decode(encode_header(_commit([1, 9, 4], [0.0, -1.0, -2.5]))[4:])
    assert decoded["tokens"] == [1, 9, 4] and decoded["logprobs"] == [0.0, -1.0, -2.5]
    big = HeaderCodec(Limits()).decode(encode_header(_commit([1] * 128, [0.0] * 128))[4:])
    assert len(big["tokens"]) == 128


@pytest.mark.parametrize("bad, error", [
    ({"kind": Kind.COMMIT, "transfer": "t", "token": 7}, MalformedFrame),  # missing logprob
    ({"kind": Kind.COMMIT, "transfer": "t", "token": True, "logprob": 0.0}, MalformedFrame),
    ({"kind": Kind.COMMIT, "transfer": "t", "token": 1, "logprob": 1}, MalformedFrame),
    # a forked COMMIT: n first tokens and logprobs, together, [0] repeating token/logprob
    (_commit([1, 2], [0.0]), MalformedFrame),
    (_commit([1, 2], None), MalformedFrame),
    (_commit(None, [0.0, -1.0]), MalformedFrame),
    (_commit([1], [0.0]), MalformedFrame),  # one sequence: token/logprob alone say it
    (_commit([1] * 129, [0.0] * 129), MalformedFrame),  # over MAX_SEQUENCES
    (_commit([5, 2], [0.0, -1.0]), MalformedFrame),  # tokens[0] != token
    (_commit([1, 2], [-3.0, -1.0]), MalformedFrame),  # logprobs[0] != logprob
    (_commit([1, -2], [0.0, -1.0]), MalformedFrame),
    (_commit([1, 2], [0.0, float("nan")]), MalformedFrame),
    (_commit([1, 2], [0.0, 1]), MalformedFrame),
    ({"kind": Kind.BEGIN, "transfer": "", "blocks": []}, MalformedFrame),
    ({"kind": Kind.BEGIN, "transfer": "t", "blocks": [-1]}, MalformedFrame),
    ({"kind": Kind.BEGIN, "transfer": "t", "blocks": [1 << 31]}, MalformedFrame),
    ({"kind": Kind.BEGIN, "transfer": "t", "blocks": [1.0]}, MalformedFrame),
    ({"kind": Kind.BEGIN, "transfer": "t", "blocks": [1], "ttl_ms": -1}, MalformedFrame),
    ({"kind": Kind.BEGIN, "transfer": "t", "blocks": [1], "ttl_ms": 1.5}, MalformedFrame),
    ({"kind": Kind.KEEPALIVE}, MalformedFrame),
    ({"kind": Kind.KEEPALIVE, "transfer": ""}, MalformedFrame),
    ({"kind": Kind.HELLO, "keepalive_ms": "soon"}, MalformedFrame),
    ({"kind": 0}, UnknownFrameKind),
    ({"kind": 10}, UnknownFrameKind),
    ({"kind": "KV"}, MalformedFrame),
    ({}, MalformedFrame),
])
def test_header_type_checks(bad: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error):
        HeaderCodec(Limits()).decode(encode_header(bad)[4:])


def test_header_limits() -> None:
    codec = HeaderCodec(Limits(max_array_len=4, max_str_len=8))
    with pytest.raises(MalformedFrame):
        codec.decode(encode_header({"kind": Kind.BEGIN, "transfer": "t", "blocks": [1] * 5})[4:])
    with pytest.raises(MalformedFrame):
        codec.decode(encode_header({"kind": Kind.ABORT, "transfer": "t", "reason": "y" * 9})[4:])
    for length in (0, (64 << 10) + 1, 1 << 31):
        with pytest.raises(FrameTooLarge):
            codec.check_length(length)
    codec.check_length(64 << 10)


def test_config_validation() -> None:
    with pytest.raises(ConfigError):
        ReceiverConfig(b"short")
    with pytest.raises(ConfigError):
        SenderConfig(b"k" * 16, frame_bytes=0)
    with pytest.raises(ConfigError):
        ReceiverConfig(b"k" * 16, port=70_000)
    with pytest.raises(ConfigError):
        Limits(max_header_bytes=1 << 31)


# -- layout and endpoint ----------------------------------------------------------------------


def test_fingerprint_is_stable_and_sensitive() -> None:
    # A fixed value: a change here breaks every mixed-version deployment; bump the protocol.
    assert SMOLLM2.fingerprint == KvLayout("SmolLM2-135M", "bfloat16", "bfloat16", 16, 30, 3,
                                           64).fingerprint
    assert SMOLLM2.fingerprint == "83831f4a9d29dc29"
    variants = [KvLayout("other", "bfloat16", "bfloat16", 16, 30, 3, 64),
                KvLayout("SmolLM2-135M", "float16", "bfloat16", 16, 30, 3, 64),
                KvLayout("SmolLM2-135M", "bfloat16", "float16", 16, 30, 3, 64),
                KvLayout("SmolLM2-135M", "bfloat16", "bfloat16", 32, 30, 3, 64),
                KvLayout("SmolLM2-135M", "bfloat16", "bfloat16", 16, 31, 3, 64),
                KvLayout("SmolLM2-135M", "bfloat16", "bfloat16", 16, 30, 4, 64),
                KvLayout("SmolLM2-135M", "bfloat16", "bfloat16", 16, 30, 3, 128)]
    assert len({v.fingerprint for v in variants} | {SMOLLM2.fingerprint}) == 8
    with pytest.raises(LayoutMismatchError, match="num_kv_heads: 3 != 4"):
        SMOLLM2.check_compatible(variants[5])
    assert KvLayout.from_wire(SMOLLM2.to_wire()) == SMOLLM2
    for broken in ({**SMOLLM2.to_wire(), "head_dim": "64"}, {**SMOLLM2.to_wire(), "num_layers": 0},
                   {**SMOLLM2.to_wire(), "kv_dtype": "complex64"}, [1, 2]):
        with pytest.raises(MalformedFrame):
            KvLayout.from_wire(broken)
    assert SMOLLM2.block_bytes == 16 * 3 * 64 * 2
    assert SMOLLM2.payload_bytes(30, 128) == 30 * 2 * 128 * 16 * 3 * 64 * 2


def test_endpoint_encoding() -> None:
    ep = Endpoint("boot-1", (("tcp", "10.0.0.7:7100"), ("shm", "/tmp/kv.sock")))
    assert Endpoint.decode(ep.encode()) == ep
    assert ep.address("shm") == "/tmp/kv.sock" and ep.address("cuda_ipc") is None
    for text in ("no-separator", "h|tcp", "|tcp=1:2", "h|TCP=1:2"):
        with pytest.raises(ConfigError):
            Endpoint.decode(text)


# -- reservations -----------------------------------------------------------------------------


def test_reservation_table_lifecycle() -> None:
    table = ReservationTable(num_blocks=10, num_layers=2)
    res = table.reserve("a", [3, 1, 7])
    with pytest.raises(ReservationError):
        table.reserve("a", [0])
    with pytest.raises(ReservationError):
        table.reserve("b", [7, 8])
    with pytest.raises(ReservationError):
        table.reserve("b", [10])
    with pytest.raises(ReservationError):
        table.reserve("b", [2, 2])
    with pytest.raises(ReservationError):
        table.reserve("b", [])
    assert table.held_blocks == 3
    with pytest.raises(TransferRejected) as info:
        table.bind("a", 1, [3, 1])
    assert info.value.code == "block_mismatch"
    assert table.bind("a", 1, [1, 3, 7]) is res
    with pytest.raises(TransferRejected) as info:
        table.bind("a", 2, [1, 3, 7])
    assert info.value.code == "busy"
    with pytest.raises(OutsideReservation):
        table.check_frame(res, 0, 1, [3, 4])
    with pytest.raises(OutsideReservation):
        table.check_frame(res, 0, 3, [3])
    with pytest.raises(OutsideReservation):
        table.check_frame(res, 0, 1, [3, 3])
    table.mark(res, 0, 1, [3, 1, 7])
    table.mark(res, 0, 1, [3])  # a rewrite counts once
    assert res.missing == 3 and not res.complete
    table.mark(res, 1, 2, [7, 1, 3])
    assert res.complete
    assert table.bound_to(1) == [res]
    assert table.end("a", "committed") is res and not res.alive()
    assert table.end("a", "committed") is None
    assert len(table) == 0 and table.held_blocks == 0
    table.reserve("b", [7])  # the blocks are free again
    table.end("b", "expired")
    with pytest.raises(TransferRejected) as info:
        table.bind("b", 1, [7])
    assert info.value.code == "expired"


# -- block views ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("staged", [False, True])
def test_send_chunks_follow_the_payload_order(dtype: str, staged: bool) -> None:
    layout = tiny_layout(dtype, layers=4)
    kv = random_cache(layout, 12, seed=2)
    ids = [5, 6, 7, 1, 10]  # fragmented and contiguous runs
    expect = kv[1:3, :, ids].contiguous().view(torch.uint8).reshape(-1).numpy().tobytes()
    span = SendSpan(KvBlocks(kv, layout, staged=staged), 1, 3, ids)
    bounce = np.empty(3 * layout.block_bytes, dtype=np.uint8)  # 3 rows a chunk: 20 rows
    pieces = [bytes(c) for c in span.chunks(bounce)]
    assert b"".join(pieces) == expect and span.nbytes == len(expect)
    assert all(len(p) <= bounce.nbytes for p in pieces) and len(pieces) == 7
    assert span.gather_all().tobytes() == expect


@pytest.mark.parametrize("staged", [False, True])
def test_received_chunks_land_in_their_blocks(staged: bool) -> None:
    layout = tiny_layout("bfloat16")
    src, dst = random_cache(layout, 8, seed=4), zero_cache(layout, 8)
    span = RecvSpan(KvBlocks(dst, layout, staged=staged), 0, 2, [6, 2, 3])
    payload = src[0:2, :, [1, 3, 4]].contiguous().view(torch.uint8).reshape(-1).numpy()
    bounce = np.empty(2 * layout.block_bytes, dtype=np.uint8)
    for at in range(0, payload.nbytes, bounce.nbytes):
        n = min(bounce.nbytes, payload.nbytes - at)
        buf = span.target(at, n, bounce)
        buf[:] = payload[at:at + n]
        span.land(at, buf)
    assert span.buffered_bytes == (payload.nbytes if staged else 0)
    span.finish()
    span.release()
    assert span.buffered_bytes == 0
    assert torch.equal(dst[0:2, :, [6, 2, 3]].view(torch.int16),
                       src[0:2, :, [1, 3, 4]].view(torch.int16))
    assert not dst[:, :, [0, 1, 4, 5, 7]].view(torch.int16).any()  # nothing else written


@pytest.mark.parametrize("ids", [[4, 0, 5, 2], [1, 2, 3, 4]], ids=["fragmented", "contiguous"])
def test_rows_of_any_size_gather_and_land_as_whole_items(ids: list[int]) -> None:
    """Rows are indexed as one numpy item each (blocks.row_dtype): a 30-byte block (no power
    of two, no multiple of 8) goes out and lands byte for byte, and nothing else is written."""
    layout = tiny_layout("float16", layers=2, heads=1, head_dim=5, block_size=3)
    assert layout.block_bytes == 30
    src, dst = random_cache(layout, 6, seed=7), zero_cache(layout, 6)
    into = [5, 3, 1, 0]
    bounce = np.empty(3 * layout.block_bytes, dtype=np.uint8)
    out = SendSpan(KvBlocks(src, layout), 0, 2, ids)
    got = RecvSpan(KvBlocks(dst, layout), 0, 2, into)
    at = 0
    for piece in out.chunks(bounce):
        got.land(at, piece.copy())
        at += piece.nbytes
    assert at == out.nbytes == got.nbytes
    assert torch.equal(dst[:, :, into].view(torch.int16), src[:, :, ids].view(torch.int16))
    assert not dst[:, :, [2, 4]].view(torch.int16).any()


def test_chunks_hold_whole_rows() -> None:
    assert chunk_bytes(6144) % 6144 == 0 and chunk_bytes(6144) <= 512 << 10
    assert chunk_bytes(1 << 20) == 1 << 20  # one row when a block is larger than a chunk


def test_cache_checks() -> None:
    layout = tiny_layout("float16")
    with pytest.raises(TransferSpecError):
        KvBlocks(zero_cache(layout, 4).float(), layout)
    with pytest.raises(TransferSpecError):
        KvBlocks(zero_cache(layout, 4)[:, :, :, :2], layout)
    with pytest.raises(TransferSpecError):
        KvBlocks(zero_cache(layout, 4).transpose(0, 1), layout)
    blocks = KvBlocks(zero_cache(layout, 4), layout)
    for lo, hi, ids in ((0, 0, [1]), (0, 4, [1]), (0, 1, []), (0, 1, [4]), (0, 1, [1, 1])):
        with pytest.raises(TransferSpecError):
            blocks.check_span(lo, hi, ids)


def test_iovec_cursor() -> None:
    data = [memoryview(bytearray(b"abc")), memoryview(bytearray(b"defgh"))]
    iov = IoVec(list(data))
    assert iov.remaining == 8
    iov.consume(4)
    assert [bytes(b) for b in iov.head()] == [b"efgh"]
    assert iov.fill_from(b"XY") == 2 and bytes(data[1]) == b"dXYgh"


@pytest.mark.parametrize("seed", range(4))
def test_mark_counts_each_layer_block_once_for_runs_and_scattered_ids(seed: int) -> None:
    """Frames over runs of the reservation's blocks (in or out of order) and over scattered
    ones, rewrites included: ``missing`` always equals what a plain set says is unwritten."""
    rng = np.random.default_rng(seed)
    layers, ids = 3, [int(b) for b in rng.permutation(40)[:12]]
    table = ReservationTable(num_blocks=40, num_layers=layers)
    table.reserve("t", ids)
    res = table.bind("t", 1, ids)
    seen: set[tuple[int, int]] = set()
    while len(seen) < layers * len(ids):
        lo = int(rng.integers(0, layers))
        hi = int(rng.integers(lo + 1, layers + 1))
        if rng.random() < 0.5:  # a run of positions, shuffled
            i = int(rng.integers(0, len(ids)))
            j = int(rng.integers(i + 1, len(ids) + 1))
            frame = [ids[k] for k in rng.permutation(range(i, j))]
        else:  # any ids of the reservation
            frame = [ids[k] for k in rng.choice(len(ids), int(rng.integers(1, len(ids))),
                                                replace=False)]
        table.mark(res, lo, hi, frame)
        seen |= {(layer, b) for layer in range(lo, hi) for b in frame}
        assert res.missing == table.num_heads * (layers * len(ids) - len(seen))
    assert res.complete
