"""Hypothesis-driven hostile input: the decoder only ever raises ProtocolError, and a receiver
fed random bytes or random frames closes the connection and keeps serving."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tandem.kv_transfer import (
    ChannelClosed,
    Committed,
    Limits,
    ReceiverConfig,
    Sender,
    SenderConfig,
)
from tandem.kv_transfer.endpoint import split_host_port
from tandem.kv_transfer.errors import ProtocolError
from tandem.kv_transfer.frames import _SCHEMA, PREFIX, HeaderCodec, Kind
from tandem.kv_transfer.testing import (
    TEST_SECRET,
    RawPeer,
    ReceiverThread,
    blocks_equal,
    deadline,
    random_cache,
    run,
    tiny_layout,
    zero_cache,
)
from tandem.kv_transfer.transport import TcpTransport

LAYOUT = tiny_layout("float16", layers=2)
FUZZ = settings(max_examples=40, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])

scalars = (st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 64) - 1) | st.floats()
           | st.text(max_size=16) | st.binary(max_size=16))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
ids = st.lists(st.integers(-2, 40), max_size=6)
headers = st.fixed_dictionaries(
    {"kind": st.integers(-1, 12)},
    optional={"transfer": st.sampled_from(["fuzz", "", "x" * 200]) | st.text(max_size=8),
              "blocks": ids | values, "layers": ids | values, "shape": ids | values,
              "dtype": st.sampled_from(["float16", "bfloat16", "int8"]) | values,
              "nbytes": st.integers(-1, 1 << 40) | values, "token": values,
              "logprob": st.floats() | values, "ref": values, "code": values, "slot": values,
              "reason": values, "junk": values})


@given(st.binary(max_size=2048))
@settings(max_examples=200, deadline=None)
def test_decoder_raises_only_protocol_errors_on_random_bytes(data: bytes) -> None:
    codec = HeaderCodec(Limits())
    with contextlib.suppress(ProtocolError):
        header = codec.decode(data)
        assert isinstance(header["kind"], Kind)


@given(headers)
@settings(max_examples=200, deadline=None)
def test_decoder_accepts_only_well_typed_headers(header: dict[str, object]) -> None:
    codec = HeaderCodec(Limits())
    try:
        decoded = codec.decode(msgpack.packb(header, use_bin_type=True))
    except ProtocolError:
        return
    checked = _SCHEMA[decoded["kind"]]  # fields outside a kind's schema are ignored, unused
    for name in ("blocks", "layers", "shape"):
        if name in decoded and name in checked:
            assert all(type(v) is int and v >= 0 for v in decoded[name])
    if "transfer" in decoded and "transfer" in checked:
        assert isinstance(decoded["transfer"], str) and 0 < len(decoded["transfer"]) <= 128


@pytest.fixture
def receiver() -> Iterator[ReceiverThread]:
    """One receiver (on its own thread) for all examples of a test; the test ends with a legit
    transfer through it and a check that it holds nothing."""
    # The handshake timeout only backstops a receiver that ignored EOF: _blast's bound is longer.
    cfg = ReceiverConfig(TEST_SECRET, enable_shm=False, handshake_timeout_s=10.0)
    thread = ReceiverThread(zero_cache(LAYOUT, 32), LAYOUT, cfg)
    try:
        yield thread
        _still_serves(thread)
    finally:
        thread.stop()


def _blast(thread: ReceiverThread, data: bytes) -> None:
    """Send ``data``, half-close, and require the receiver to close (within 30 s: a hang bound;
    it closes at the EOF)."""
    address = thread.endpoint.address("tcp")
    assert address is not None
    with socket.create_connection(split_host_port(address), timeout=30) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(65536):
                pass
        except TimeoutError:
            raise AssertionError("receiver kept a hostile connection open") from None
        except OSError:  # reset, broken pipe, not connected: closed by the receiver
            pass


def _still_serves(thread: ReceiverThread) -> None:
    """A legit transfer after the attack commits bit-exact, and nothing is left held."""
    async def body() -> None:
        cfg = SenderConfig(TEST_SECRET)
        src = random_cache(LAYOUT, 8, seed=3)
        tx = Sender(src, LAYOUT, cfg, [TcpTransport(cfg.limits)])
        thread.call(thread.rx.reserve, "after", [20, 21], 30.0)
        await tx.send("after", thread.endpoint, [1, 2], [20, 21], first_token=1, logprob=0.0,
                      deadline=deadline())
        await tx.close()
        assert blocks_equal(src, [1, 2], thread.rx.blocks.kv, [20, 21])

    run(body())
    while (event := thread.run(thread.rx.events.get())).transfer_id == "fuzz":
        pass  # the fuzzers' victim reservation ended in its own ways
    assert isinstance(event, Committed) and event.transfer_id == "after"
    thread.call(thread.rx.release, "fuzz")
    stats = thread.run(thread.rx.wait_until(lambda s: s.connections == 0))
    assert (stats.reservations, stats.bound_transfers, stats.buffered_bytes) == (0, 0, 0)


@given(data=st.binary(max_size=4096))
@FUZZ
def test_random_bytes_close_the_connection(receiver: ReceiverThread, data: bytes) -> None:
    _blast(receiver, data)


@given(body=st.binary(max_size=512), length=st.integers(0, 1 << 32 - 1))
@FUZZ
def test_random_length_prefixes_close_the_connection(receiver: ReceiverThread, body: bytes,
                                                     length: int) -> None:
    _blast(receiver, PREFIX.pack(length % (1 << 32)) + body)


@given(frames=st.lists(headers, min_size=1, max_size=4), tail=st.binary(max_size=256))
@FUZZ
def test_random_frames_after_the_handshake(receiver: ReceiverThread,
                                           frames: list[dict[str, object]], tail: bytes) -> None:
    receiver.call(receiver.rx.release, "fuzz")
    receiver.call(receiver.rx.reserve, "fuzz", [1, 2, 3], 30.0)

    async def body() -> None:
        peer = await RawPeer.connect(receiver.endpoint)
        await peer.handshake(LAYOUT)
        for header in frames:
            try:  # sealed as a member's: the header decoder is what is fuzzed
                data, _ = peer.seal(header)
            except (OverflowError, ValueError, TypeError):
                continue  # msgpack cannot even encode it
            await peer.send_raw(data)
        await peer.send_raw(tail)
        peer.half_close()
        with contextlib.suppress(ChannelClosed):
            while True:
                await peer.recv_frame()
        peer.close()

    run(body())


def test_handwritten_cases_through_the_fuzz_paths(receiver: ReceiverThread) -> None:
    for length in (1 << 31, 0, 65_537):
        _blast(receiver, PREFIX.pack(length) + b"abc")
    inner = test_random_frames_after_the_handshake.hypothesis.inner_test
    inner(receiver, [{"kind": Kind.BEGIN, "transfer": "fuzz", "blocks": [1, 2, 3]},
                     {"kind": Kind.KV, "transfer": "fuzz", "layers": [0, 1], "blocks": [1],
                      "dtype": "float16", "shape": [1, 2, 1, 4, 2, 8], "nbytes": 256}],
          b"\x00" * 100)
