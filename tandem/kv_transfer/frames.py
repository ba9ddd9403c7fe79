"""Frame headers: kinds, encoding, and a decoder that trusts nothing.

A frame on the wire is ``u32 BE header length | msgpack map | tag_h? | payload? | tag_p?``
(docs/kv_transfer.md section 2; the tags are frame_mac.py's). This module owns the header part: ``encode_header`` makes the
prefix and map, ``HeaderCodec.decode`` parses a map under the configured limits and checks each
field's type for the frame's kind. Payload handling belongs to the channels.
"""

from __future__ import annotations

import enum
import struct
from typing import Any

import msgpack

from tandem.common.wire import MAX_SEQUENCES
from tandem.kv_transfer.config import Limits
from tandem.kv_transfer.errors import FrameTooLarge, MalformedFrame, UnknownFrameKind

# 2: KEEPALIVE, BEGIN.ttl_ms, HELLO.keepalive_ms (leases renewed); 3: the receiver reveals its
# layout and limits only in the ACK, after the sender's proof; per-frame MACs after HELLO;
# 4: GMAC payload tags, no checksum trailer under TLS, payload codecs negotiated at HELLO,
# transfers striped over several connections (BEGIN.stripes, ACK.max_stripes); optional,
# ignored by older peers' schemas: a re-sharded push's routes (HELLO.route, BEGIN.parts)
PROTOCOL_VERSION = 4
PREFIX = struct.Struct(">I")  # header length
MAX_ID_LEN = 128
MAX_REASON_LEN = 512


class Kind(enum.IntEnum):
    """Frame kinds of protocol version 4."""

    HELLO = 1
    BEGIN = 2
    KV = 3
    COMMIT = 4
    ABORT = 5
    ACK = 6
    NACK = 7
    CREDIT = 8
    KEEPALIVE = 9


Header = dict[str, Any]

# Field checks per kind: name -> (type name, required). "ids" is a list of non-negative ints,
# "int" a non-negative int. Fields not listed are ignored (forward compatibility).
_INT, _IDS, _STR, _BIN, _FLOAT, _MAP = "int", "ids", "str", "bin", "float", "map"
_FLOATS = "floats"  # a list of floats, NaN refused
_SCHEMA: dict[Kind, dict[str, tuple[str, bool]]] = {
    Kind.HELLO: {"version": (_INT, False), "layout": (_MAP, False), "fingerprint": (_STR, False),
                 "nonce": (_BIN, False), "proof": (_BIN, False), "max_payload": (_INT, False),
                 "transport": (_STR, False), "keepalive_ms": (_INT, False),
                 "codec": (_STR, False), "route": (_MAP, False)},
    # "adapter": the LoRA adapter identity the KV was computed under (absent: the base model)
    Kind.BEGIN: {"transfer": (_STR, True), "blocks": (_IDS, True), "ttl_ms": (_INT, False),
                  "stripes": (_INT, False), "parts": (_INT, False), "adapter": (_STR, False)},
    Kind.KV: {"transfer": (_STR, True), "layers": (_IDS, True), "blocks": (_IDS, True),
              "dtype": (_STR, True), "shape": (_IDS, True), "nbytes": (_INT, True),
              "slot": (_INT, False), "xxh": (_INT, False), "src_blocks": (_IDS, False),
              "enc": (_STR, False), "wire": (_INT, False)},
    # a forked request (n sequences) also sends every sequence's first token: "tokens" and
    # "logprobs" (n of each, [0] repeating token/logprob; see _check_commit)
    Kind.COMMIT: {"transfer": (_STR, True), "token": (_INT, True), "logprob": (_FLOAT, True),
                  "tokens": (_IDS, False), "logprobs": (_FLOATS, False)},
    Kind.ABORT: {"transfer": (_STR, True), "reason": (_STR, False)},
    Kind.ACK: {"ref": (_INT, True), "transfer": (_STR, False), "fingerprint": (_STR, False),
               "max_payload": (_INT, False), "keepalive_ms": (_INT, False),
               "codec": (_STR, False), "max_stripes": (_INT, False)},
    Kind.NACK: {"ref": (_INT, True), "transfer": (_STR, False), "code": (_STR, True),
                "reason": (_STR, False)},
    Kind.CREDIT: {"slot": (_INT, True)},
    Kind.KEEPALIVE: {"transfer": (_STR, True)},
}


def _ext_refused(code: int, data: bytes) -> object:
    raise MalformedFrame(f"msgpack ext type {code} refused")


def encode_header(header: Header) -> bytes:
    """Prefix plus msgpack map, ready to write."""
    body = msgpack.packb(header, use_bin_type=True)
    return PREFIX.pack(len(body)) + body


def _check_field(kind: Kind, name: str, value: object, typ: str) -> None:
    ok: bool
    if typ == _INT:
        ok = type(value) is int and 0 <= value < 1 << 64
    elif typ == _IDS:
        ok = type(value) is list and all(type(v) is int and 0 <= v < 1 << 31 for v in value)
    elif typ == _STR:
        ok = type(value) is str and len(value) <= MAX_REASON_LEN
        if ok and name == "transfer":
            ok = 0 < len(value) <= MAX_ID_LEN
    elif typ == _BIN:
        ok = type(value) is bytes
    elif typ == _FLOAT:
        ok = type(value) is float and value == value  # NaN refused
    elif typ == _FLOATS:
        ok = type(value) is list and all(type(v) is float and v == v for v in value)
    else:
        ok = type(value) is dict
    if not ok:
        raise MalformedFrame(f"{kind.name}.{name}: expected {typ}, got {type(value).__name__}")


class HeaderCodec:
    """Parses headers under ``Limits``; every failure is a ``ProtocolError`` subclass."""

    __slots__ = ("limits",)

    def __init__(self, limits: Limits) -> None:
        self.limits = limits

    def check_length(self, length: int) -> None:
        """Refuse a header length prefix over the limit before reading the header."""
        if length == 0 or length > self.limits.max_header_bytes:
            raise FrameTooLarge(f"header length {length} outside 1..{self.limits.max_header_bytes}")

    def decode(self, raw: bytes | bytearray | memoryview) -> Header:
        """Parse and type-check one header map (the bytes after the length prefix)."""
        lim = self.limits
        try:
            header = msgpack.unpackb(
                raw, raw=False, strict_map_key=True, use_list=True, ext_hook=_ext_refused,
                max_str_len=lim.max_str_len,
                max_bin_len=lim.max_bin_len, max_array_len=lim.max_array_len,
                max_map_len=lim.max_map_len, max_ext_len=0,
            )
        except MalformedFrame:
            raise
        except (ValueError, TypeError, OverflowError, RecursionError,
                msgpack.UnpackException) as exc:
            raise MalformedFrame(f"undecodable header: {type(exc).__name__}: {exc}") from exc
        if type(header) is not dict:
            raise MalformedFrame(f"header is a {type(header).__name__}, not a map")
        raw_kind = header.get("kind")
        if type(raw_kind) is not int:
            raise MalformedFrame("header has no integer 'kind'")
        try:
            kind = Kind(raw_kind)
        except ValueError:
            raise UnknownFrameKind(f"unknown frame kind {raw_kind}") from None
        for name, (typ, required) in _SCHEMA[kind].items():
            if name in header:
                _check_field(kind, name, header[name], typ)
            elif required:
                raise MalformedFrame(f"{kind.name} lacks field {name!r}")
        if kind == Kind.COMMIT:
            _check_commit(header)
        header["kind"] = kind
        return header


def _check_commit(header: Header) -> None:
    """A forked COMMIT's first tokens: 2..MAX_SEQUENCES of them, as many logprobs, the first
    one the frame's ``token`` (the receiver's engine checks the vocabulary)."""
    tokens, logprobs = header.get("tokens"), header.get("logprobs")
    if tokens is None and logprobs is None:
        return
    if tokens is None or logprobs is None or len(tokens) != len(logprobs):
        raise MalformedFrame("COMMIT.tokens and COMMIT.logprobs come together, as many of each")
    if not 2 <= len(tokens) <= MAX_SEQUENCES:
        raise MalformedFrame(f"COMMIT.tokens: {len(tokens)} sequences, not 2..{MAX_SEQUENCES}")
    if tokens[0] != header["token"] or logprobs[0] != header["logprob"]:
        raise MalformedFrame("COMMIT.tokens[0] and logprobs[0] must repeat token and logprob")


def ack(ref: Kind, transfer: str | None = None, **extra: Any) -> Header:
    """An ACK header."""
    header: Header = {"kind": Kind.ACK, "ref": int(ref), **extra}
    if transfer is not None:
        header["transfer"] = transfer
    return header


def nack(ref: Kind | int, code: str, reason: str, transfer: str | None = None) -> Header:
    """A NACK header (reason truncated to the protocol's limit)."""
    header: Header = {"kind": Kind.NACK, "ref": int(ref), "code": code,
                      "reason": reason[:MAX_REASON_LEN]}
    if transfer is not None:
        header["transfer"] = transfer
    return header


def abort(transfer: str, reason: str) -> Header:
    """An ABORT header."""
    return {"kind": Kind.ABORT, "transfer": transfer, "reason": reason[:MAX_REASON_LEN]}
