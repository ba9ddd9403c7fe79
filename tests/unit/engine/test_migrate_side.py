"""A live move between two engines: a running request suspended on A between two steps, its
KV blocks copied into the blocks B reserved for all but its last token, committed on B with
that token, continues on B exactly as it would have on A (greedy and seeded with penalties);
A frees every block; a resumed suspension carries on on A; what cannot move is refused."""

from __future__ import annotations

import pytest

from tandem.engine import SamplingParams
from tandem.engine.errors import InvalidRequestError, NotMovableError, UnknownRequestError
from tests.unit.engine._handoff import copy_blocks
from tests.unit.engine.test_engine_tiny import _prompts

SEEDED = SamplingParams(
    temperature=1.0, top_p=0.9, seed=77, max_tokens=24, min_tokens=20,
    frequency_penalty=0.7, presence_penalty=0.3, repetition_penalty=1.2,
)
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def _run(engine, rid: str, steps: int | None = None) -> list[int]:
    """Step ``engine`` (``steps`` times, or to the end); ``rid``'s new tokens."""
    tokens: list[int] = []
    n = 0
    while engine.has_unfinished() and (steps is None or n < steps):
        for out in engine.step():
            if out.request_id == rid:
                tokens += out.new_token_ids
        n += 1
    return tokens


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("steps", [1, 9])
def test_moved_request_continues_identically(tiny_dir, make_engine, params, steps) -> None:
    path = str(tiny_dir("llama", 2))
    a = make_engine(model=path, num_blocks=64, block_size=16)
    b = make_engine(model=path, num_blocks=64, block_size=16)
    prompt = _prompts([30], seed=5)[0]
    a.add_request(prompt, params, request_id="ref")
    full = _run(a, "ref")
    assert len(full) == params.max_tokens

    a.add_request(prompt, params, request_id="r")
    sent = _run(a, "r", steps)
    moved = a.remote.migrate.suspend("r")
    assert moved.token_ids == prompt + sent and moved.num_output_tokens == len(sent)
    assert not a.has_unfinished()  # out of the batch, blocks pinned
    kv_tokens = moved.token_ids[:-1]  # the last token's KV is computed by the next step
    got = b.remote.decode.reserve("r", kv_tokens, params,
                                  prior_output_tokens=moved.num_output_tokens - 1)
    skip = got.cached_tokens // 16
    copy_blocks(a, moved.block_ids[skip:], b, got.fill_block_ids)
    out = b.remote.decode.commit("r", moved.token_ids[-1])
    assert out is not None and out.new_token_ids == [moved.token_ids[-1]]
    assert a.abort("r") is not None
    assert a.kv.pool.num_free == a.kv.pool.num_blocks  # every block A held for it is back
    assert sent + _run(b, "r") == full
    assert b.kv.pool.num_free == b.kv.pool.num_blocks


def test_resumed_suspension_carries_on(tiny_dir, make_engine) -> None:
    a = make_engine(model=str(tiny_dir("llama", 2)), num_blocks=64, block_size=16)
    prompt = _prompts([21], seed=6)[0]
    a.add_request(prompt, SEEDED, request_id="ref")
    full = _run(a, "ref")
    a.add_request(prompt, SEEDED, request_id="r")
    sent = _run(a, "r", 4)
    a.remote.migrate.suspend("r")
    assert a.remote.migrate.num_suspended == 1
    assert a.remote.migrate.resume("r") and not a.remote.migrate.resume("r")
    assert sent + _run(a, "r") == full


def test_what_cannot_move_is_refused(tiny_dir, make_engine) -> None:
    a = make_engine(model=str(tiny_dir("llama", 2)), num_blocks=64, block_size=16)
    prompt = _prompts([21], seed=7)[0]
    with pytest.raises(UnknownRequestError):
        a.remote.migrate.suspend("nobody")
    a.add_request(prompt, GREEDY, request_id="r")
    with pytest.raises(NotMovableError, match="not decoding"):  # waiting: nothing computed
        a.remote.migrate.suspend("r")
    _run(a, "r", 2)
    a.remote.migrate.suspend("r")
    with pytest.raises(NotMovableError):  # already out of the batch
        a.remote.migrate.suspend("r")
    a.abort("r")
    assert a.remote.migrate.num_suspended == 0
    assert a.kv.pool.num_free == a.kv.pool.num_blocks


def test_a_sliding_window_request_moves_with_its_window_only(make_engine, tmp_path) -> None:
    """Every layer slides (window 12, blocks of 4): A has freed the blocks behind the window
    of the request it moves; B reserves only the window's, which are the ones A still holds,
    and the request continues on B as it would have on A."""
    from tests.unit.engine._perturbed import perturbed_checkpoint

    path = str(perturbed_checkpoint(tmp_path, "mistral", sliding_window=12))
    a = make_engine(model=path, num_blocks=64, block_size=4, use_native_kernels=False)
    b = make_engine(model=path, num_blocks=64, block_size=4, use_native_kernels=False)
    prompt = _prompts([30], seed=8)[0]
    a.add_request(prompt, GREEDY, request_id="ref")
    full = _run(a, "ref")
    a.add_request(prompt, GREEDY, request_id="r")
    sent = _run(a, "r", 6)
    moved = a.remote.migrate.suspend("r")
    kv_tokens = moved.token_ids[:-1]
    freed = moved.block_ids.count(-1)
    assert freed > 0  # the window has left the prompt's first blocks behind
    got = b.remote.decode.reserve("r", kv_tokens, GREEDY,
                                  prior_output_tokens=moved.num_output_tokens - 1)
    skip = got.skip_tokens // 4
    assert skip >= freed and -1 not in moved.block_ids[skip:]
    assert b.kv.num_held_blocks("r") == len(got.fill_block_ids) == len(moved.block_ids) - skip
    copy_blocks(a, moved.block_ids[skip:], b, got.fill_block_ids)
    assert b.remote.decode.commit("r", moved.token_ids[-1]) is not None
    assert a.abort("r") is not None
    assert sent + _run(b, "r") == full
    for engine in (a, b):
        assert engine.kv.pool.num_free == engine.kv.pool.num_blocks


ONE = SamplingParams(temperature=0.0, max_tokens=1)  # a pre-copy's reservation samples nothing


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_precopy_then_tail_continues_identically(tiny_dir, make_engine, params) -> None:
    """A pre-copy: A pins the leading full blocks of a running request and they are copied
    into B's pre-copy reservation, committed there (held, nothing runs) while A steps on;
    then the move: B's reservation finds those blocks cached, only the tail is copied, and
    the request continues on B as it would have on A. Every block on both sides is free at
    the end."""
    path = str(tiny_dir("llama", 2))
    a = make_engine(model=path, num_blocks=64, block_size=16)
    b = make_engine(model=path, num_blocks=64, block_size=16)
    prompt = _prompts([30], seed=9)[0]
    a.add_request(prompt, params, request_id="ref")
    full = _run(a, "ref")

    a.add_request(prompt, params, request_id="r")
    sent = _run(a, "r", 4)  # 34 tokens, 33 computed: two full blocks
    tokens = (prompt + sent)[:32]
    pinned = a.remote.migrate.pin("r", tokens)
    assert len(pinned.block_ids) == 2 and a.remote.migrate.pin_ids() == [pinned.pin_id]
    pre = b.remote.decode.reserve("pre", tokens, ONE, transfer_id="pre-t", precopy=True)
    assert pre.cached_tokens == 0 and len(pre.fill_block_ids) == 2
    copy_blocks(a, pinned.block_ids, b, pre.fill_block_ids)
    sent += _run(a, "r", 5)  # the request decodes on during the pre-copy
    assert b.remote.decode.commit_forked("pre-t", [0]) == []  # held: nothing runs
    assert not b.has_unfinished() and b.stats().num_held == 1
    a.remote.migrate.unpin(pinned.pin_id)
    assert a.remote.migrate.pin_ids() == []

    moved = a.remote.migrate.suspend("r")
    assert moved.token_ids == prompt + sent
    got = b.remote.decode.reserve("r", moved.token_ids[:-1], params,
                                  prior_output_tokens=moved.num_output_tokens - 1)
    assert got.cached_tokens == 32  # the pre-copied blocks: only the tail is filled
    assert len(got.fill_block_ids) == len(moved.block_ids) - 2
    copy_blocks(a, moved.block_ids[2:], b, got.fill_block_ids)
    assert b.abort("pre") is None  # the pre-copy released: its blocks stay the move's
    assert b.remote.decode.commit("r", moved.token_ids[-1]) is not None
    assert a.abort("r") is not None
    assert sent + _run(b, "r") == full
    for engine in (a, b):
        assert engine.kv.pool.num_free == engine.kv.pool.num_blocks
        assert engine.stats().num_stranded_blocks == 0


def test_a_pin_outlives_its_request_and_refusals_pin_nothing(tiny_dir, make_engine) -> None:
    """The request ends while pinned (aborted, say): its pinned blocks stay referenced (the
    push reading them is not overwritten) until the unpin; what cannot be pinned is refused
    and pins nothing; a pre-copy reservation ended before its commit frees its blocks."""
    path = str(tiny_dir("llama", 2))
    a = make_engine(model=path, num_blocks=64, block_size=16)
    prompt = _prompts([40], seed=10)[0]
    with pytest.raises(UnknownRequestError):
        a.remote.migrate.pin("nobody", prompt[:16])
    a.add_request(prompt, GREEDY, request_id="r")
    with pytest.raises(NotMovableError):  # waiting: nothing computed
        a.remote.migrate.pin("r", prompt[:16])
    _run(a, "r", 2)
    with pytest.raises(InvalidRequestError):  # not whole blocks
        a.remote.migrate.pin("r", prompt[:20])
    with pytest.raises(InvalidRequestError):  # not the request's tokens
        a.remote.migrate.pin("r", [t + 1 for t in prompt[:16]])
    with pytest.raises(NotMovableError):  # not computed yet
        a.remote.migrate.pin("r", (prompt * 2)[:48])
    assert a.remote.migrate.pin_ids() == []
    pinned = a.remote.migrate.pin("r", prompt[:32])
    assert a.abort("r") is not None
    assert a.kv.pool.num_free == a.kv.pool.num_blocks - 2  # the pin still holds them
    assert a.stats().num_stranded_blocks == 0  # held by a pin, not leaked
    a.remote.migrate.unpin(pinned.pin_id)
    a.remote.migrate.unpin(pinned.pin_id)  # no-op the second time
    assert a.kv.pool.num_free == a.kv.pool.num_blocks

    other = list(reversed(prompt[:32]))  # none of it cached here
    pre = a.remote.decode.reserve("pre", other, ONE, transfer_id="t", precopy=True)
    assert len(pre.fill_block_ids) == 2
    assert a.remote.decode.end("t") is not None  # the push failed: freed, nothing held
    assert a.kv.pool.num_free == a.kv.pool.num_blocks and a.stats().num_held == 0
