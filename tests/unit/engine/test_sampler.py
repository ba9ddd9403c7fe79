"""Sampler: greedy, seeded reproducibility, top-k/top-p/min-p support, penalties, min_tokens,
logprobs. CPU only, deterministic (every RNG is seeded)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator

import pytest
import torch

from tandem.engine.sampler import Sampler, SamplingState, _apply_penalties, _top_p_cut, greedy
from tandem.engine.sampling_params import SamplingParams

EOS = 2


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    # These tensors are tiny: on a busy machine, waking intra-op threads costs 10x the work.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _state(
    params: SamplingParams | None = None,
    prompt: list[int] | None = None,
    output: list[int] | None = None,
) -> SamplingState:
    params = params or SamplingParams()
    gen = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
    return SamplingState(params, prompt or [0], output or [], gen, frozenset({EOS}))


def _draw(logits: torch.Tensor, params: SamplingParams, n: int) -> Counter[int]:
    """n draws from one [V] distribution: one call with n identical rows."""
    states = [_state(params) for _ in range(n)]
    results = Sampler(seed=0)(logits.expand(n, -1).contiguous(), states)
    return Counter(r.token_id for r in results)


# probabilities sorted high to low; the cuts below are far from ties and rounding
PROBS = torch.tensor([0.30, 0.20, 0.15, 0.10, 0.08, 0.07, 0.05, 0.03, 0.02])
LOGITS = PROBS.log()


# -- greedy ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_greedy_is_argmax(dtype: torch.dtype) -> None:
    logits = torch.randn(16, 500, generator=torch.Generator().manual_seed(1)).to(dtype)
    results = Sampler(seed=0)(logits, [_state(SamplingParams(temperature=0.0))] * 16)
    assert [r.token_id for r in results] == logits.argmax(-1).tolist()
    assert all(r.logprob is None and r.top_logprobs is None for r in results)


def test_greedy_takes_the_first_of_tied_maxima_in_every_layout() -> None:
    """greedy() (numpy's argmax on fp32 CPU rows) agrees with torch's: ties go to the first
    index, a NaN wins as in torch, strided views and other dtypes take torch's own path."""
    x = torch.zeros(3, 9)
    x[0, [2, 7]] = 5.0  # a tie: the first
    x[1, 4] = float("nan")
    x[2] = -1.0  # all equal: index 0
    assert greedy(x).tolist() == x.argmax(-1).tolist() == [2, 4, 0]
    wide = torch.randn(8, 49152, generator=torch.Generator().manual_seed(3))
    for view in (wide, wide[:, ::3], wide.t().contiguous().t(), wide.bfloat16()):
        assert greedy(view).dtype == torch.int64
        assert torch.equal(greedy(view), view.argmax(-1))


def test_greedy_rows_in_a_mixed_batch_stay_argmax() -> None:
    logits = torch.randn(6, 300, generator=torch.Generator().manual_seed(2))
    params = [SamplingParams(temperature=0.0 if i % 2 else 1.0, top_k=i * 10) for i in range(6)]
    results = Sampler(seed=0)(logits, [_state(p) for p in params])
    for i in (1, 3, 5):
        assert results[i].token_id == int(logits[i].argmax())


# -- seeded reproducibility -----------------------------------------------------------------
TARGETS = [
    SamplingParams(seed=7),
    SamplingParams(seed=7, temperature=0.7, top_k=50),
    SamplingParams(seed=7, temperature=2.0, top_p=0.9),  # nucleus ~500 tokens: full sort
    SamplingParams(seed=7, temperature=0.5, top_p=0.6),
    SamplingParams(seed=7, top_k=20, top_p=0.8, min_p=0.05),
    SamplingParams(seed=7, min_p=0.1, repetition_penalty=1.3, frequency_penalty=0.5),
]
NEIGHBOURS = [
    SamplingParams(),
    SamplingParams(temperature=0.0),
    SamplingParams(top_k=5),
    SamplingParams(top_k=700, top_p=0.5),  # raises the candidate count of the top-k path
    SamplingParams(seed=123, top_p=0.3),
    SamplingParams(min_p=0.2, presence_penalty=1.0),
]


def _run(
    target: SamplingParams, position: int | None, steps: int = 25, grid: float = 0.0
) -> list[int]:
    """Tokens the target row draws over ``steps`` steps, alone or at ``position`` in a batch;
    its logits are rounded to multiples of ``grid`` when set (ties, as bf16 logits have)."""
    data = torch.Generator().manual_seed(42)
    noise = torch.Generator().manual_seed(position or 0)
    sampler = Sampler(seed=position or 0)
    me = _state(target, prompt=[1, 2, 3])
    others = [_state(p, prompt=[4, 5]) for p in NEIGHBOURS]
    for st in others:  # neighbours must not share the target's generator state
        if st.generator is not None:
            st.generator.manual_seed(999)
    drawn: list[int] = []
    for _ in range(steps):
        row = torch.randn(1, 1000, generator=data) * 2.5
        if grid:
            row = (row / grid).round() * grid
        if position is None:
            logits, states = row, [me]
        else:
            logits = torch.randn(len(others) + 1, 1000, generator=noise) * 2.5
            logits[position] = row[0]
            states = others[:position] + [me] + others[position:]
        results = sampler(logits, states)
        tok = results[states.index(me)].token_id
        drawn.append(tok)
        me.output_token_ids.append(tok)
        for st, r in zip(states, results, strict=True):
            if st is not me:
                st.output_token_ids.append(r.token_id)
    return drawn


@pytest.mark.parametrize("target", TARGETS, ids=lambda p: f"k{p.top_k}-p{p.top_p}-m{p.min_p}")
def test_seeded_rows_ignore_the_rest_of_the_batch(target: SamplingParams) -> None:
    alone = _run(target, None)
    assert alone == _run(target, None)  # reproducible
    assert len(set(alone)) > 3  # and actually random
    for position in (0, 3, 6):
        assert _run(target, position) == alone, position


def test_seeded_top_k_with_ties_ignores_the_batch() -> None:
    # Ties at the k-th logit send the row to the full-vocab path when alone, while a neighbour
    # with top_k=700 widens the candidates enough to keep it on the top-k path.
    target = SamplingParams(seed=7, top_k=50)
    alone = _run(target, None, grid=0.25)
    for position in (0, 3, 6):
        assert _run(target, position, grid=0.25) == alone, position


def test_different_seeds_differ() -> None:
    a = _run(SamplingParams(seed=1), None)
    b = _run(SamplingParams(seed=2), None)
    assert a != b


# -- filters: exact support, loose proportions ----------------------------------------------
def _check(counts: Counter[int], expected: torch.Tensor, n: int) -> None:
    """expected: [V] target probabilities (zeros outside the support)."""
    support = {i for i, p in enumerate(expected.tolist()) if p > 0}
    assert set(counts) == support
    for tok in support:  # 6 sigma at n draws is well inside 0.035
        assert abs(counts[tok] / n - float(expected[tok])) < 0.035, (tok, counts)


def _renorm(probs: torch.Tensor, keep: list[int]) -> torch.Tensor:
    out = torch.zeros_like(probs)
    out[keep] = probs[keep] / probs[keep].sum()
    return out


N = 4000


def test_plain_sampling_matches_the_distribution() -> None:
    _check(_draw(LOGITS, SamplingParams(), N), PROBS / PROBS.sum(), N)


def test_temperature_sharpens() -> None:
    sharp = PROBS**2 / (PROBS**2).sum()
    _check(_draw(LOGITS, SamplingParams(temperature=0.5), N), sharp, N)


def test_top_k_keeps_exactly_k() -> None:
    _check(_draw(LOGITS, SamplingParams(top_k=3), N), _renorm(PROBS, [0, 1, 2]), N)


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    # cumulative mass ahead of each token: 0, .30, .50, .65 -> with p = .6 three tokens stay
    _check(_draw(LOGITS, SamplingParams(top_p=0.6), N), _renorm(PROBS, [0, 1, 2]), N)


def test_top_p_always_keeps_the_top_token() -> None:
    assert set(_draw(LOGITS, SamplingParams(top_p=0.01), 200)) == {0}


def test_top_p_applies_after_top_k_renormalization() -> None:
    # top-5 renormalized: .361 .241 .181 .120 .096; mass ahead of the 5th is .904 > .8 but the
    # 4th's is .783 < .8, so four stay (without renormalization only three would).
    params = SamplingParams(top_k=5, top_p=0.8)
    _check(_draw(LOGITS, params, N), _renorm(PROBS, [0, 1, 2, 3]), N)


def test_min_p_drops_tokens_below_a_fraction_of_the_top() -> None:
    # 0.3 * 0.30 = 0.09: 0.10 stays, 0.08 goes
    _check(_draw(LOGITS, SamplingParams(min_p=0.3), N), _renorm(PROBS, [0, 1, 2, 3]), N)


def test_top_k_ties_at_the_cut_are_all_kept() -> None:
    # the 3rd, 4th and 5th logits tie: the candidates end inside the tie, so the row is redone
    # on the whole vocabulary.
    logits = torch.tensor([3.0, 2.0, 1.0, 1.0, 1.0, 0.0, -1.0])
    assert set(_draw(logits, SamplingParams(top_k=3), 2000)) == {0, 1, 2, 3, 4}
    assert set(_draw(logits, SamplingParams(top_k=2), 2000)) == {0, 1}


def test_top_p_cut_past_the_candidates() -> None:
    # A nearly flat 2000-token distribution: the nucleus lies far past the first candidates.
    vocab, p = 2000, 0.5
    z = torch.linspace(1.0, 0.0, vocab)[None, :]  # sorted, so token i is the i-th largest
    w = torch.softmax(z, -1)
    keep = int(((torch.cumsum(w[0], 0) - w[0]) < p).sum())
    assert 256 < keep < vocab
    cut, _ = _top_p_cut(z, w, torch.tensor([p]))
    assert float(cut) == float(z[0, keep - 1])
    counts = _draw(z[0], SamplingParams(top_p=p), 4000)
    assert max(counts) < keep and len(counts) > 0.8 * keep


# -- penalties and min_tokens ---------------------------------------------------------------
def test_penalties_follow_their_formulas() -> None:
    x = torch.tensor([[2.0, -1.0, 0.5, 3.0, -2.0, 1.0], [2.0, -1.0, 0.5, 3.0, -2.0, 1.0]])
    params = SamplingParams(repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25)
    states = [_state(params, prompt=[0, 1, 0], output=[3, 3, 4]), _state()]
    _apply_penalties(x, states, rep_rows=[0], pf_rows=[0])
    # repetition over {0, 1, 3, 4}: 2 -> 1, -1 -> -2, 3 -> 1.5, -2 -> -4; then output counts
    # {3: 2, 4: 1}: 3 -> 1.5 - 2 * .25 - .5 = .5 and 4 -> -4 - .25 - .5 = -4.75
    expected = torch.tensor([1.0, -2.0, 0.5, 0.5, -4.75, 1.0])
    torch.testing.assert_close(x[0], expected)
    torch.testing.assert_close(x[1], torch.tensor([2.0, -1.0, 0.5, 3.0, -2.0, 1.0]))


def test_penalties_steer_greedy() -> None:
    logits = torch.tensor([[1.0, 0.9, 0.0]])
    for params, pick in [
        (SamplingParams(temperature=0.0), 0),
        (SamplingParams(temperature=0.0, repetition_penalty=1.2), 1),
        (SamplingParams(temperature=0.0, presence_penalty=0.2), 1),
        (SamplingParams(temperature=0.0, frequency_penalty=-0.5), 0),
    ]:
        out = Sampler(seed=0)(logits, [_state(params, prompt=[2], output=[0])])
        assert out[0].token_id == pick, params


def test_min_tokens_blocks_eos_and_stop_token_ids() -> None:
    logits = torch.tensor([[0.0, 0.0, 9.0, 8.0, 1.0]])  # EOS (2) then stop id 3 dominate
    params = SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=[3])
    for produced, pick in [(0, 4), (2, 4), (3, 2)]:
        state = _state(params, output=[0] * produced)
        assert Sampler(seed=0)(logits, [state])[0].token_id == pick, produced
    sampled = _draw(logits[0], SamplingParams(min_tokens=1, stop_token_ids=[3]), 500)
    assert not {2, 3} & set(sampled)
    # with ignore_eos the EOS is no stop, so min_tokens need not block it (as vLLM)
    ignore = SamplingParams(temperature=0.0, min_tokens=3, ignore_eos=True)
    assert Sampler(seed=0)(logits, [_state(ignore)])[0].token_id == 2


# -- logprobs -------------------------------------------------------------------------------
def test_logprobs_come_from_the_raw_logits() -> None:
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    params = [
        SamplingParams(logprobs=3, temperature=0.7, repetition_penalty=1.5),
        SamplingParams(logprobs=0, temperature=0.0, presence_penalty=1.0),
        SamplingParams(logprobs=None),
        SamplingParams(logprobs=5, top_k=2, seed=1),
    ]
    states = [_state(p, prompt=[1, 2], output=[3, 4]) for p in params]
    results = Sampler(seed=0)(logits, states)
    ref = torch.log_softmax(logits.float(), -1)
    for i, (p, r) in enumerate(zip(params, results, strict=True)):
        if p.logprobs is None:
            assert r.logprob is None and r.top_logprobs is None
            continue
        assert math.isclose(r.logprob, float(ref[i, r.token_id]), rel_tol=1e-6, abs_tol=1e-6)
        if p.logprobs == 0:
            assert r.top_logprobs is None
            continue
        assert r.top_logprobs is not None and len(r.top_logprobs) == p.logprobs
        values = [v for _, v in r.top_logprobs]
        assert values == sorted(values, reverse=True)
        top = torch.topk(ref[i], p.logprobs)
        assert [t for t, _ in r.top_logprobs] == top.indices.tolist()
        torch.testing.assert_close(torch.tensor(values), top.values)
