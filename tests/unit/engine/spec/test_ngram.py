"""N-gram prompt lookup: the proposer itself, the torch-free rollback, and greedy / seeded
outputs identical to plain decoding on tiny checkpoints (alone, batched with requests that
opt out, under preemption, with stops and logprobs)."""

from __future__ import annotations

from tandem.engine import SamplingParams
from tandem.engine.config import SchedulerConfig
from tandem.engine.core.kv_cache_manager import KVCacheManager
from tandem.engine.core.request import Request
from tandem.engine.core.scheduler import Scheduler
from tandem.engine.spec.ngram import ngram_lookup, proposal_length
from tests.unit.engine._reference import hf_greedy
from tests.unit.engine.spec.helpers import prompts, run

GREEDY = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
NGRAM = {"speculative_method": "ngram", "num_speculative_tokens": 4}


def test_lookup_prefers_longest_suffix_then_latest_match() -> None:
    #        0  1  2  3  4  5  6  7  8  9 10 11 12
    toks = [1, 2, 3, 9, 9, 7, 2, 3, 4, 5, 6, 2, 3]
    # suffix (2, 3) occurred at 1 and 6: the latest (6) wins -> follows 3: [4, 5, 6]
    assert ngram_lookup(toks, n_max=2, n_min=1, k=3) == [4, 5, 6]
    assert ngram_lookup(toks, n_max=2, n_min=1, k=3, limit=1) == [4]  # the granted slots
    # a 3-gram (6, 2, 3) never occurred before; n_max=3 falls back to the 2-gram, and a match
    # one token shorter than n_max proposes half of k
    assert ngram_lookup(toks, n_max=3, n_min=2, k=4) == [4, 5]
    toks2 = [5, 1, 2, 3, 8, 0, 1, 2, 3, 6, 1, 2, 3]
    # the 4-gram (6, 1, 2, 3) is new; the 3-gram (1, 2, 3) occurs at 1 and 6: latest wins
    assert ngram_lookup(toks2, n_max=4, n_min=1, k=4) == [6, 1]
    assert ngram_lookup(toks2, n_max=3, n_min=1, k=4) == [6, 1, 2, 3]
    assert ngram_lookup([1, 2, 3, 4], n_max=3, n_min=1, k=4) == []  # no earlier occurrence
    assert ngram_lookup([7, 7, 7], n_max=2, n_min=1, k=5) == [7]  # only one token follows
    assert ngram_lookup([4, 5, 4], n_max=1, n_min=1, k=0) == []
    assert ngram_lookup([4, 5, 4], n_max=1, n_min=1, k=3, limit=0) == []


def test_proposal_length_halves_per_missing_match_token() -> None:
    assert [proposal_length(8, n, 4) for n in (4, 3, 2, 1)] == [8, 4, 2, 1]
    assert [proposal_length(6, n, 4) for n in (4, 3, 2, 1)] == [6, 3, 1, 1]
    assert [proposal_length(1, n, 3) for n in (3, 2, 1)] == [1, 1, 1]


def test_rollback_frees_blocks_past_the_accepted_tokens() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=4)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64), kv, num_spec_tokens=5,
                      max_model_len=100)
    req = Request("r", [1, 2, 3, 4, 5, 6], SamplingParams(max_tokens=20))
    sched.add(req)
    out = sched.schedule()
    assert out.scheduled[0].num_new_tokens == 6 and out.scheduled[0].num_lookahead == 0
    req.num_computed_tokens = 6
    req.append_token(7)  # 7 tokens, 6 computed: decode state
    s = sched.schedule().scheduled[0]
    assert (s.num_new_tokens, s.num_lookahead, s.start) == (1, 5, 6)
    assert len(kv.block_ids("r")) == 3  # positions 0..11
    # verify 1 + 5 rows; the target accepted one draft: positions 0..7 keep their KV
    s.spec_token_ids = [8, 9, 10, 11, 12]
    sched.accept_speculation(s, 1)
    assert req.num_computed_tokens == 8
    assert len(kv.block_ids("r")) == 2  # the third block held only rejected drafts
    assert kv.pool.num_free == 6
    # max_tokens bounds the lookahead: 20 - 1 output - 1 = at most 18, k = 5 here
    req.append_token(8)
    req.append_token(13)
    s = sched.schedule().scheduled[0]
    assert s.num_lookahead == 5 and s.start == 8
    sched.accept_speculation(s, 0)  # nothing accepted: 9 computed, the 3rd block stays
    assert req.num_computed_tokens == 9 and len(kv.block_ids("r")) == 3
    req.append_token(14)
    req.params.max_tokens = 5  # 4 out: one token left, so no room for drafts
    s = sched.schedule().scheduled[0]
    assert s.num_lookahead == 0 and len(kv.block_ids("r")) == 3
    kv.free("r")
    assert kv.pool.num_referenced() == 0


def test_greedy_equals_plain_and_transformers_in_a_mixed_batch(tiny_dir, make_engine) -> None:
    path = tiny_dir("llama", 2)
    plain = make_engine(num_threads=1, model=str(path), num_blocks=256, block_size=4)
    spec = make_engine(num_threads=1, model=str(path), num_blocks=256, block_size=4, **NGRAM)
    ps = prompts([9, 24, 40, 61, 7], seed=1)
    opt_out = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, speculative=False)
    params = [GREEDY, opt_out, GREEDY, GREEDY, opt_out]
    want, _ = run(plain, ps, GREEDY)
    got, chunks = run(spec, ps, params)
    assert got == want
    assert got[2] == hf_greedy(path, ps[2], GREEDY.max_tokens)
    st = spec.stats()
    assert st.spec_accepted_tokens > 0 and st.spec_tokens_per_step > 1.0
    assert st.spec_acceptance_rate == st.spec_accepted_tokens / st.spec_proposed_tokens
    assert sum(len(chunks[i]) for i in (0, 2, 3)) < 3 * 40  # fewer steps than tokens
    assert any(len(c) > 1 for ch, sp in zip(chunks, params, strict=True) if sp.speculative
               for c in ch)
    assert all(len(c) == 1 for c in chunks[1] + chunks[4])  # opted out: one token a step


def test_stop_token_and_max_tokens_cut_an_accepted_run(tiny_dir, make_engine) -> None:
    path = tiny_dir("llama", 2)
    plain = make_engine(num_threads=1, model=str(path), num_blocks=128, block_size=4)
    # the whole target as its own draft: every draft is accepted, k+1 tokens a step
    spec = make_engine(num_threads=1, model=str(path), num_blocks=128, block_size=4,
                       speculative_method="draft", draft_layers=2, num_speculative_tokens=4)
    p = prompts([20], seed=3)[0]
    full, _ = run(plain, [p], SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True))
    full = full[0]
    stop_at = next(i for i in range(3, 30) if full[i] not in full[:i])  # first occurrence
    stop = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True,
                          stop_token_ids=[full[stop_at]])
    got, chunks = run(spec, [p], stop)
    assert got[0] == full[: stop_at + 1]
    _, chunks = run(spec, [p], SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True))
    assert [len(c) for c in chunks[0]] == [1] + [5] * 5 + [4]  # k+1 a step, max_tokens last
    for n in (1, 2, 6, 7):
        got, _ = run(spec, [p], SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
        assert got[0] == full[:n]


def test_preemption_and_seeded_sampling_equal_plain(tiny_dir, make_engine) -> None:
    path = tiny_dir("llama", 2)
    ps = prompts([30, 34, 38], seed=4)
    # 24 blocks of 4 cannot hold three requests of ~80 tokens: someone is preempted
    plain = make_engine(num_threads=1, model=str(path), num_blocks=24, block_size=4)
    spec = make_engine(num_threads=1, model=str(path), num_blocks=24, block_size=4, **NGRAM)
    g = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    assert run(spec, ps, g)[0] == run(plain, ps, g)[0]
    assert spec.stats().num_preemptions > 0
    # a seeded request draws one uniform per emitted token: the same stream as without drafts
    seeded = [
        SamplingParams(temperature=0.7, top_k=8, seed=s, max_tokens=40, ignore_eos=True)
        for s in (1, 2, 3)
    ]
    big_plain = make_engine(num_threads=1, model=str(path), num_blocks=256, block_size=4)
    big_spec = make_engine(num_threads=1, model=str(path), num_blocks=256, block_size=4, **NGRAM)
    before = big_spec.stats().spec_accepted_tokens
    assert run(big_spec, ps, seeded)[0] == run(big_plain, ps, seeded)[0]
    assert big_spec.stats().spec_accepted_tokens > before


def test_logprobs_follow_each_accepted_token(tiny_dir, make_engine) -> None:
    path = tiny_dir("llama", 2)
    plain = make_engine(num_threads=1, model=str(path), num_blocks=128, block_size=4)
    spec = make_engine(num_threads=1, model=str(path), num_blocks=128, block_size=4, **NGRAM)
    p = prompts([33], seed=5)[0]
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, logprobs=2)

    def collect(engine):
        engine.add_request(p, params)
        lps = []
        while engine.has_unfinished():
            for out in engine.step():
                assert out.logprobs is not None and len(out.logprobs) == len(out.new_token_ids)
                lps += out.logprobs
        return lps

    want, got = collect(plain), collect(spec)
    assert [x.token_id for x in got] == [x.token_id for x in want]
    for a, b in zip(got, want, strict=True):
        assert abs(a.logprob - b.logprob) < 1e-4 and len(a.top) == 2
