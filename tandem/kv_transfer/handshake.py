"""HELLO: mutual HMAC authentication, then the version and layout check and the frame keys
(docs/kv_transfer.md section 3).

    S -> R  HELLO {version, nonce_s, transport}
    R -> S  HELLO {version, nonce_r, proof_r}                               or NACK, close
            S checks proof_r: the receiver holds the secret
    S -> R  HELLO {proof_s, layout, fingerprint, codec?, transport extras}
            both sides: frames are sealed from here on (frame_mac.py, keys from both nonces)
            R checks proof_s, then the layout, then takes a member slot (``admit``)
    R -> S  ACK   {ref: HELLO, fingerprint, max_payload, keepalive_ms, codec, max_stripes,
                   transport extras}
                                                                            or NACK, close

``codec`` (codecs.py): the sender asks for one, the receiver answers with the one the
connection uses: the asked one if it allows it and it applies here, else ``raw``. The sender
refuses an answer it did not ask for (the ACK is sealed; its HELLO's ask is not, so a
rewritten ask can only make the receiver answer something the sender then refuses).

Each side proves it holds the secret over both nonces; the labels differ per role so a proof
cannot be reflected back. Nothing about the receiver's cache (layout, fingerprint, limits)
goes out before the sender's proof has verified, and a stranger's layout is never parsed.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import secrets
from collections.abc import Callable, Collection
from dataclasses import dataclass

from tandem.kv_transfer.codecs import RAW, Codec
from tandem.kv_transfer.codecs import codec as codec_named
from tandem.kv_transfer.errors import (
    NACK_ERRORS,
    AuthenticationError,
    ChannelClosed,
    HandshakeError,
    LayoutMismatchError,
    MalformedFrame,
    VersionMismatch,
)
from tandem.kv_transfer.frame_mac import session_keys
from tandem.kv_transfer.frames import PROTOCOL_VERSION, Header, Kind, ack, nack
from tandem.kv_transfer.layout import KvLayout
from tandem.kv_transfer.reshard import GroupKv, RouteHello, accept_route
from tandem.kv_transfer.transport.base import Channel

NONCE_BYTES = 16
# What a sender accepts as the receiver's KEEPALIVE interval (a bad value cannot make it spin).
MIN_KEEPALIVE_S, MAX_KEEPALIVE_S = 0.01, 3600.0
SENDER_LABEL = b"tandem-kv/4/sender"
RECEIVER_LABEL = b"tandem-kv/4/receiver"


def proof(secret: bytes, label: bytes, nonce_a: bytes, nonce_b: bytes,
          fingerprint: str = "") -> bytes:
    """HMAC-SHA256 over a role label, both nonces and (the sender's) layout fingerprint."""
    msg = label + nonce_a + nonce_b + fingerprint.encode()
    return hmac.new(secret, msg, hashlib.sha256).digest()


@dataclass(frozen=True, slots=True)
class PeerInfo:
    """What the sender learns from the receiver's ACK."""

    max_payload: int
    keepalive_s: float  # send a KEEPALIVE for a bound transfer quiet for this long
    codec: Codec = RAW  # how this connection's KV payloads travel
    max_stripes: int = 1  # connections one transfer may span at this receiver


def _expect(header: Header, kind: Kind, step: str) -> Header:
    if header["kind"] == Kind.NACK:
        error = NACK_ERRORS.get(header["code"], HandshakeError)
        raise error(f"refused by peer at {step}: {header['code']}: {header.get('reason', '')}")
    if header["kind"] != kind:
        raise MalformedFrame(f"expected {kind.name} at {step}, got {Kind(header['kind']).name}")
    return header


def _bytes(header: Header, name: str) -> bytes:
    value = header.get(name)
    if type(value) is not bytes:
        raise MalformedFrame(f"HELLO lacks {name!r}")
    return value


def _int(header: Header, name: str) -> int:
    value = header.get(name)
    if type(value) is not int:
        raise MalformedFrame(f"{Kind(header['kind']).name} lacks {name!r}")
    return value


def _str(header: Header, name: str) -> str:
    value = header.get(name)
    if type(value) is not str:
        raise MalformedFrame(f"HELLO lacks {name!r}")
    return value


async def client_handshake(ch: Channel, layout: KvLayout, secret: bytes,
                           codec: Codec = RAW, route: RouteHello | None = None) -> PeerInfo:
    """Sender side; asks for ``codec``. ``route``: this connection carries one route of a
    re-sharded push (``layout`` is then the route's: its heads alone). Raises a
    ``HandshakeError`` subclass (or ``ChannelClosed``) on refusal."""
    nonce_s = secrets.token_bytes(NONCE_BYTES)
    fp = layout.fingerprint
    await ch.send({"kind": Kind.HELLO, "version": PROTOCOL_VERSION, "nonce": nonce_s,
                   "transport": ch.transport})
    hello = _expect(await ch.recv(), Kind.HELLO, "HELLO")
    if hello.get("version") != PROTOCOL_VERSION:
        raise VersionMismatch(f"receiver speaks version {hello.get('version')}")
    nonce_r = _bytes(hello, "nonce")
    if not hmac.compare_digest(_bytes(hello, "proof"),
                               proof(secret, RECEIVER_LABEL, nonce_s, nonce_r)):
        raise AuthenticationError("receiver's proof does not verify: wrong secret")
    ask = {"codec": codec.name} if codec is not RAW else {}
    await ch.send({"kind": Kind.HELLO, "proof": proof(secret, SENDER_LABEL, nonce_r, nonce_s, fp),
                   "layout": layout.to_wire(), "fingerprint": fp, **ask,
                   **({"route": route.to_wire()} if route is not None else {}),
                   **ch.client_hello_extras()})
    ch.start_macs(session_keys(secret, nonce_s, nonce_r, fp, sender=True))
    done = _expect(await ch.recv(), Kind.ACK, "ACK")
    if done.get("fingerprint") != fp:
        raise LayoutMismatchError(f"receiver layout {done.get('fingerprint')} != {fp}")
    max_payload = _int(done, "max_payload")
    keepalive_s = min(max(_int(done, "keepalive_ms") / 1000, MIN_KEEPALIVE_S), MAX_KEEPALIVE_S)
    answer = done.get("codec", RAW.name)
    if answer not in (RAW.name, codec.name):
        raise MalformedFrame(f"receiver chose KV codec {answer!r}; {codec.name!r} was asked")
    used = codec if answer == codec.name else RAW
    ch.set_codec(used, layout)
    ch.client_setup(done)
    stripes = done.get("max_stripes", 1)
    return PeerInfo(max_payload=max_payload, keepalive_s=keepalive_s, codec=used,
                    max_stripes=stripes if type(stripes) is int and stripes >= 1 else 1)


def _admit_all() -> None:
    return None


def choose_codec(asked: object, allowed: Collection[str], ch: Channel,
                 layout: KvLayout) -> Codec:
    """The codec a connection uses: the one asked for if the receiver allows it, the channel
    carries codecs and the codec applies to the layout; ``raw`` otherwise."""
    if type(asked) is not str or asked == RAW.name or asked not in allowed \
            or not ch.takes_codecs:
        return RAW
    chosen = codec_named(asked)  # allowed names were checked at configuration
    return chosen if chosen.applies(layout) else RAW


async def server_handshake(ch: Channel, layout: KvLayout, secret: bytes, keepalive_s: float,
                           admit: Callable[[], None] = _admit_all,
                           codecs: Collection[str] = (), max_stripes: int = 1,
                           group: GroupKv | None = None, rank: int = 0
                           ) -> tuple[int, int] | None:
    """Receiver side; ``keepalive_s`` is the KEEPALIVE interval asked of the sender; ``admit``
    is called once the sender has proven itself and its layout matches, and raises
    ``PeerBusy`` when there is no room for it; ``codecs`` are the payload codecs this
    receiver accepts besides raw; ``max_stripes`` how many connections one transfer may span;
    ``group``, ``rank``: this cache as rank ``rank`` of its group (None: route HELLOs are
    refused).
    Returns the window of this cache's heads a route connection fills (None: a whole-cache
    connection). On refusal sends a NACK, then raises the matching ``HandshakeError``."""
    fp = layout.fingerprint
    window: tuple[int, int] | None = None
    try:
        hello = _expect(await ch.recv(), Kind.HELLO, "HELLO")
        if hello.get("version") != PROTOCOL_VERSION:
            raise VersionMismatch(f"sender speaks version {hello.get('version')}, "
                                  f"we speak {PROTOCOL_VERSION}")
        nonce_s = _bytes(hello, "nonce")
        if len(nonce_s) != NONCE_BYTES:
            raise MalformedFrame("HELLO nonce has the wrong length")
        nonce_r = secrets.token_bytes(NONCE_BYTES)
        await ch.send({"kind": Kind.HELLO, "version": PROTOCOL_VERSION, "nonce": nonce_r,
                       "proof": proof(secret, RECEIVER_LABEL, nonce_s, nonce_r)})
        final = _expect(await ch.recv(), Kind.HELLO, "proof")
        claimed = _str(final, "fingerprint")
        # Sealed from here: the sender seals from its last HELLO on, so every reply is too.
        ch.start_macs(session_keys(secret, nonce_s, nonce_r, claimed, sender=False))
        if not hmac.compare_digest(_bytes(final, "proof"),
                                   proof(secret, SENDER_LABEL, nonce_r, nonce_s, claimed)):
            raise AuthenticationError("sender's proof does not verify: wrong secret")
        theirs = KvLayout.from_wire(final.get("layout"))  # a member's: parsed after its proof
        if theirs.fingerprint != claimed:
            raise MalformedFrame("HELLO layout does not match its fingerprint")
        if "route" in final:
            window, layout = accept_route(RouteHello.from_wire(final["route"]), group, rank)
            fp = layout.fingerprint
        layout.check_compatible(theirs)
        admit()
        chosen = choose_codec(final.get("codec"), codecs, ch, layout)
        ch.set_codec(chosen, layout)
        extras = ch.server_setup(final)
    except HandshakeError as exc:
        await _refuse(ch, exc.code, str(exc))
        raise
    except MalformedFrame as exc:
        await _refuse(ch, exc.code, str(exc))
        raise
    await ch.send(ack(Kind.HELLO, fingerprint=fp, max_payload=ch.max_payload,
                      keepalive_ms=max(1, int(keepalive_s * 1000)), codec=chosen.name,
                      max_stripes=max_stripes, **extras))
    return window


async def _refuse(ch: Channel, code: str, reason: str) -> None:
    with contextlib.suppress(ChannelClosed):  # the peer may be gone; the caller closes anyway
        await ch.send(nack(Kind.HELLO, code, reason))
