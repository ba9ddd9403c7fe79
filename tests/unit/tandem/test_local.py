"""``tandem local``'s thread split between its prefill and decode worker."""

from __future__ import annotations

from tandem.local import build_parser, thread_split


def test_prefill_gets_every_core_decode_a_quarter() -> None:
    assert thread_split(1) == (1, 1)
    assert thread_split(2) == (2, 1)
    assert thread_split(16) == (16, 4)
    assert thread_split(0) == (1, 1)  # never zero threads


def test_flags_override_the_split() -> None:
    args = build_parser().parse_args(["--prefill-threads", "1", "--decode-threads", "3"])
    assert (args.prefill_threads, args.decode_threads) == (1, 3)
