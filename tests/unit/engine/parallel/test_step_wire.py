"""The frames rank 0 sends its followers (tandem/engine/parallel/step_wire.py)."""

from __future__ import annotations

import io
import struct

import msgpack
import pytest

from tandem.engine.parallel.step_wire import (
    MAX_FRAME,
    StepInputs,
    StepWireError,
    read_frame,
    write_frame,
)


def test_a_step_round_trips_and_the_end_of_the_stream_is_none() -> None:
    step = StepInputs([1, 2, 3], [0, 1, 2], [16, 17, 18], [[1, 4]], [3], [3])
    buf = io.BytesIO()
    write_frame(buf, step.to_wire())
    write_frame(buf, {"kind": "stop"})
    buf.seek(0)
    assert StepInputs.from_wire(read_frame(buf)) == step
    assert read_frame(buf) == {"kind": "stop"}
    assert read_frame(buf) is None


def test_a_lora_step_and_an_adapters_bytes_round_trip() -> None:
    """Each row's adapter rides its step; an adapter's files travel as bytes, not text."""
    step = StepInputs([1, 2], [0, 1], [16, 17], [[1]], [2], [2], ["a", ""])
    files = {"kind": "lora_load", "name": "a", "path": "/x", "config": b"{}",
             "weights": bytes(range(256))}
    buf = io.BytesIO()
    write_frame(buf, step.to_wire())
    write_frame(buf, files)
    buf.seek(0)
    assert StepInputs.from_wire(read_frame(buf)) == step
    assert read_frame(buf) == files


@pytest.mark.parametrize(("raw", "match"), [
    (struct.pack(">I", 10) + b"abc", "inside a frame"),
    (b"\x00\x00", "inside a frame"),
    (struct.pack(">I", MAX_FRAME + 1), "over the"),
    (struct.pack(">I", 3) + msgpack.packb([1, 2]), "not a map"),
])
def test_broken_frames_are_refused(raw: bytes, match: str) -> None:
    with pytest.raises(StepWireError, match=match):
        read_frame(io.BytesIO(raw))


def test_a_step_frame_missing_a_field_is_refused() -> None:
    with pytest.raises(StepWireError, match="tables"):
        StepInputs.from_wire({"kind": "step", "ids": [], "positions": [], "slots": [],
                              "query_lens": [], "seq_lens": []})
