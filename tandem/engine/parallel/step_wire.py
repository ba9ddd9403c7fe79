"""What rank 0 tells the other ranks of its group, and how: msgpack frames on a pipe.

    rank 0 ──stdin pipe of each follower──> init, [memory,] runner, then per step: step | copy,
                                            ... stop
                                            (lora_load | lora_unload between steps)
    follower ──its reply pipe──> [memory,] ready | failed, then done {of, error} for each
                                 lora_load | lora_unload (rank 0 waits for every follower's)

A frame is a 4-byte big-endian length and a msgpack map with a ``kind``. The pipes are the
followers' own (inherited at spawn, nobody else holds them): an end of file means rank 0 is
gone, and the follower exits. No pickle: every field is a plain int, str, bytes (a LoRA
adapter's files) or list of them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, BinaryIO

import msgpack

MAX_FRAME = 1 << 30  # a step of 1M tokens with its block tables stays far below it
_LEN = struct.Struct(">I")


class StepWireError(RuntimeError):
    """A frame on a group's pipe is truncated, too large or not what was expected."""


@dataclass(frozen=True, slots=True)
class StepInputs:
    """One forward's flattened batch: what every rank needs to run the same step.

    ``ids``/``positions``/``slots`` are per token ``[T]``; ``tables``, ``query_lens`` and
    ``seq_lens`` per sequence (tandem/engine/attention/base.py's metadata); ``loras`` per
    token, the LoRA adapter its row runs under ("": the base; None: a step without any)."""

    ids: list[int]
    positions: list[int]
    slots: list[int]
    tables: list[list[int]]
    query_lens: list[int]
    seq_lens: list[int]
    loras: list[str] | None = None

    def to_wire(self) -> dict[str, Any]:
        """The step as a frame."""
        return {"kind": "step", "ids": self.ids, "positions": self.positions,
                "slots": self.slots, "tables": self.tables, "query_lens": self.query_lens,
                "seq_lens": self.seq_lens, "loras": self.loras}

    @classmethod
    def from_wire(cls, msg: dict[str, Any]) -> StepInputs:
        """The step a frame carries (StepWireError when a field is missing)."""
        try:
            return cls(msg["ids"], msg["positions"], msg["slots"], msg["tables"],
                       msg["query_lens"], msg["seq_lens"], msg.get("loras"))
        except KeyError as exc:
            raise StepWireError(f"a step frame without {exc}") from None


def write_frame(out: BinaryIO, msg: dict[str, Any]) -> None:
    """Send one frame (blocks while the pipe is full)."""
    body = msgpack.packb(msg)
    if len(body) > MAX_FRAME:
        raise StepWireError(f"a {len(body)}-byte frame is over the {MAX_FRAME}-byte limit")
    out.write(_LEN.pack(len(body)) + body)
    out.flush()


def read_frame(inp: BinaryIO) -> dict[str, Any] | None:
    """The next frame, or None at the end of the stream (the writer is gone)."""
    head = _read_exactly(inp, _LEN.size)
    if head is None:
        return None
    (size,) = _LEN.unpack(head)
    if size > MAX_FRAME:
        raise StepWireError(f"a {size}-byte frame is over the {MAX_FRAME}-byte limit")
    body = _read_exactly(inp, size)
    if body is None:
        raise StepWireError("the stream ended inside a frame")
    msg = msgpack.unpackb(body, strict_map_key=True)
    if not isinstance(msg, dict) or not isinstance(msg.get("kind"), str):
        raise StepWireError("a frame is not a map with a kind")
    return msg


def _read_exactly(inp: BinaryIO, n: int) -> bytes | None:
    parts: list[bytes] = []
    got = 0
    while got < n:
        chunk = inp.read(n - got)
        if not chunk:
            if got:
                raise StepWireError("the stream ended inside a frame")
            return None
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)
