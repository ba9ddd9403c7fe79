"""Rejection sampling keeps the target distribution exact: the algorithm on fixed p and q,
and the engine's sampled output with a (deliberately poor) draft against plain sampling on a
tiny model, both with fixed seeds so the statistics are deterministic."""

from __future__ import annotations

import math
from collections import Counter

import torch

from tandem.engine import SamplingParams
from tandem.engine.sampler import _uniform
from tandem.engine.spec.probs import draw
from tandem.engine.spec.rejection import rejection_sample


def _tv(counts: Counter, n: int, p: torch.Tensor) -> float:
    return 0.5 * sum(abs(counts.get(t, 0) / n - float(p[t])) for t in range(len(p)))


def test_rejection_sampling_emits_the_target_law() -> None:
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.50, 0.20, 0.15, 0.10, 0.05], [0.05, 0.05, 0.10, 0.30, 0.50],
                      [0.2, 0.2, 0.2, 0.2, 0.2]])
    q = torch.tensor([[0.10, 0.10, 0.20, 0.20, 0.40], [0.30, 0.30, 0.20, 0.10, 0.10]])
    assert 0.5 * float((p[0] - q[0]).abs().sum()) > 0.3  # a poor draft: q is far from p
    n = 8_000
    first: Counter = Counter()
    second: Counter = Counter()
    lengths: Counter = Counter()
    for _ in range(n):
        drafts = [draw(q[0], _uniform(g)), draw(q[1], _uniform(g))]
        out = rejection_sample(p, q, drafts, lambda: _uniform(g))
        lengths[len(out)] += 1
        first[out[0]] += 1
        if len(out) > 1:
            second[out[1]] += 1
    assert _tv(first, n, p[0]) < 0.03
    assert _tv(second, sum(second.values()), p[1]) < 0.03
    # P(accept d1) = sum_x min(p, q): the drafts are accepted at the rate theory says
    accept = float(torch.minimum(p[0], q[0]).sum())
    assert abs((n - lengths[1]) / n - accept) < 0.03
    assert lengths[3] > 0  # the bonus token path ran too


def _chi2_critical(df: int, z: float = 3.09) -> float:
    """Wilson-Hilferty upper quantile of chi-square (z = 3.09: alpha = 0.001)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def test_engine_sampling_with_a_draft_matches_plain_sampling(tiny_dir, make_engine) -> None:
    """Joint law of the first three tokens, speculative vs plain, chi-square homogeneity."""
    path = tiny_dir("llama", 2)
    engine = make_engine(num_threads=1, model=str(path), num_blocks=1024, block_size=4, max_num_seqs=512,
                         max_num_batched_tokens=4096, speculative_method="draft",
                         draft_layers=1, num_speculative_tokens=2)
    prompt = [7, 21, 3, 90, 14, 60]
    n = 1500

    def params(seed: int, spec: bool) -> SamplingParams:
        return SamplingParams(temperature=1.0, top_k=4, seed=seed, max_tokens=3,
                              ignore_eos=True, speculative=spec)

    ids = {}
    for i in range(n):
        ids[engine.add_request(prompt, params(i, True))] = True
        ids[engine.add_request(prompt, params(100_000 + i, False))] = False
    got: dict[bool, Counter] = {True: Counter(), False: Counter()}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                got[ids[out.request_id]][tuple(out.token_ids)] += 1
    st = engine.stats()
    assert 0.1 < st.spec_acceptance_rate < 0.9, st  # both accept and residual paths ran
    cells = set(got[True]) | set(got[False])
    big = [c for c in cells if got[True][c] + got[False][c] >= 20]
    rest = [c for c in cells if c not in big]
    table = [(got[True][c], got[False][c]) for c in big]
    table.append((sum(got[True][c] for c in rest), sum(got[False][c] for c in rest)))
    chi2 = 0.0
    for a, b in table:
        if a + b:
            e = (a + b) / 2  # equal sample sizes: each side expects half of the cell
            chi2 += (a - e) ** 2 / e + (b - e) ** 2 / e
    df = len(table) - 1
    assert df >= 10, table
    assert chi2 < _chi2_critical(df), (chi2, df)


def test_seeded_draft_sampling_is_reproducible(tiny_dir, make_engine) -> None:
    path = tiny_dir("llama", 2)
    engine = make_engine(num_threads=1, model=str(path), num_blocks=128, block_size=4,
                         speculative_method="draft", draft_layers=1, num_speculative_tokens=3)
    p = SamplingParams(temperature=0.8, seed=42, max_tokens=20, ignore_eos=True)
    runs = []
    for others in (0, 3):  # alone, then beside unseeded sampled requests
        rid = engine.add_request([5, 9, 13, 5, 9], p)
        for _ in range(others):
            engine.add_request([8, 8, 2], SamplingParams(temperature=1.0, max_tokens=20))
        while engine.has_unfinished():
            for out in engine.step():
                if out.finished and out.request_id == rid:
                    runs.append(out.token_ids)
    assert runs[0] == runs[1] and len(runs[0]) == 20
