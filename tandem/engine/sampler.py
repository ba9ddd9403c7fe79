"""Batched token sampling for one engine step, in the order vLLM applies it:

    raw logits --log_softmax--> logprobs (reported, never used to sample)
    raw logits -> min_tokens mask -> repetition, presence, frequency penalties -> logit_bias
               -> grammar masks (structured outputs: constrained rows only) -> x: [B, V]
      temperature == 0: argmax(x)
      otherwise: z = x / temperature; keep z >= max(top-k, top-p, min-p cut); draw one.

Every filter is "keep z >= a per-row threshold", so together they touch [B, V] at most once;
rows with top-k (and top-p rows whose nucleus is short) work on their top candidates only. Each
row draws one uniform (a seeded row from its own generator) and maps it through its CDF in
token-id order. Thresholds and cumulative sums are row-local and sequential, so a seeded row
does not depend on the rest of the batch (up to last-ulp rounding of exp: p ~ 1e-7 a draw).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from tandem.engine.outputs import SampleResult
from tandem.engine.sampling_params import SamplingParams
from tandem.engine.structured.constraint import Constraint
from tandem.engine.structured.masking import apply_constraints

# Rows with top-p but no top-k look for the cut among this many tokens first.
_TOP_P_CANDIDATES = 256


@dataclass(slots=True)
class SamplingState:
    """One request as the sampler sees it. ``output_token_ids`` excludes the token being
    sampled; ``generator`` is set when ``params.seed`` is. While fewer than ``min_tokens`` are
    out, ``eos_token_ids`` (unless ``ignore_eos``) and ``stop_token_ids`` cannot be drawn.
    ``constraint`` (structured outputs) has accepted the first ``constraint.num_accepted``
    output tokens; the rest (a speculative row's drafts) are applied for the mask only."""

    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    generator: torch.Generator | None
    eos_token_ids: frozenset[int]
    constraint: Constraint | None = None


class Sampler:
    """Turns a step's logits into one token per request; ``seed`` fixes the RNG that unseeded
    rows share (None: drawn from torch's default RNG)."""

    def __init__(self, seed: int | None = None) -> None:
        if seed is None:
            seed = int(torch.randint(0, 2**62, ()).item())
        self._generator = torch.Generator().manual_seed(seed)

    def __call__(self, logits: Tensor, states: Sequence[SamplingState]) -> list[SampleResult]:
        """Pick one token per row. logits: [B, V], any float dtype; len(states) == B."""
        assert logits.dim() == 2 and logits.shape[0] == len(states), "logits must be [B, V]"
        batch = logits.shape[0]
        params = [s.params for s in states]
        min_tok_rows = [
            i
            for i, s in enumerate(states)
            if len(s.output_token_ids) < s.params.min_tokens
            and (s.params.stop_token_ids or (s.eos_token_ids and not s.params.ignore_eos))
        ]
        rep_rows = [i for i, p in enumerate(params) if p.repetition_penalty != 1.0]
        pf_rows = [
            i
            for i, (p, s) in enumerate(zip(params, states, strict=True))
            if (p.presence_penalty != 0.0 or p.frequency_penalty != 0.0) and s.output_token_ids
        ]
        bias_rows = [i for i, p in enumerate(params) if p.logit_bias]
        con_rows = [i for i, s in enumerate(states) if s.constraint is not None]
        sample_rows = [i for i, p in enumerate(params) if not p.greedy]

        penalized = bool(min_tok_rows or rep_rows or pf_rows or bias_rows or con_rows)
        x = logits.to(torch.float32, copy=True) if penalized else logits  # [B, V]
        if penalized:
            _mask_stop_tokens(x, states, min_tok_rows)
            _apply_penalties(x, states, rep_rows, pf_rows)
            _apply_logit_bias(x, states, bias_rows)
            if con_rows:
                _apply_constraints(x, states, con_rows)
        if len(sample_rows) == batch:
            tokens = _sample(x, penalized, states, self._generator)  # [B]
        else:
            tokens = greedy(x)  # [B]; exact in any dtype
            if sample_rows:
                idx = torch.tensor(sample_rows)
                sub_states = [states[i] for i in sample_rows]
                tokens[idx] = _sample(x[idx], True, sub_states, self._generator)
        token_ids: list[int] = tokens.tolist()
        return _with_logprobs(logits, token_ids, params)


def greedy(x: Tensor) -> Tensor:
    """Each row's argmax (the first index of its largest value), [B] int64. An fp32 CPU tensor
    takes numpy's: torch's CPU argmax costs ~70 us over a 49k vocabulary, numpy's ~4 us, and
    a one-row decode step of a small model is ~3 ms."""
    if x.device.type == "cpu" and x.dtype == torch.float32:
        return torch.from_numpy(np.argmax(x.numpy(), axis=-1).astype(np.int64, copy=False))
    return x.argmax(dim=-1)


def _mask_stop_tokens(x: Tensor, states: Sequence[SamplingState], rows: list[int]) -> None:
    """min_tokens: EOS and stop token ids get -inf on rows that are still too short."""
    pairs = [
        (i, t)
        for i in rows
        for t in set(states[i].params.stop_token_ids)
        | (set() if states[i].params.ignore_eos else states[i].eos_token_ids)
        if 0 <= t < x.shape[1]
    ]
    if pairs:
        x[tuple(torch.tensor(pairs).T)] = -math.inf


def _flat_index(
    vocab: int, rows: list[int], lists: list[list[int]], *per_list: list[float]
) -> list[Tensor]:
    """[flat, *values]: flat indexes x.view(-1) at (rows[j], t) for each t in lists[j] (repeats
    stay); each per_list[m][j] is repeated alongside. All [N]."""
    lengths = torch.tensor([len(ts) for ts in lists])
    ids = np.fromiter(
        itertools.chain.from_iterable(lists), dtype=np.int64, count=int(lengths.sum())
    )
    flat = torch.from_numpy(ids) + (torch.tensor(rows) * vocab).repeat_interleave(lengths)
    return [flat] + [
        torch.tensor(v, dtype=torch.float32).repeat_interleave(lengths) for v in per_list
    ]


def _apply_penalties(
    x: Tensor, states: Sequence[SamplingState], rep_rows: list[int], pf_rows: list[int]
) -> None:
    """Repetition penalty (HF/vLLM: over prompt + output tokens, positive logits / r, negative
    ones * r), then OpenAI's: logit[t] -= count[t] * frequency + (count[t] > 0) * presence."""
    flat_x = x.view(-1)  # a repeated index reads one value and writes one result
    if rep_rows:
        rows = [i for i in rep_rows for _ in range(2)]
        lists = [
            ts for i in rep_rows for ts in (states[i].prompt_token_ids, states[i].output_token_ids)
        ]
        flat, r = _flat_index(
            x.shape[1], rows, lists, [states[i].params.repetition_penalty for i in rows]
        )
        vals = flat_x[flat]
        flat_x[flat] = torch.where(vals > 0, vals / r, vals * r)
    if pf_rows:
        lists = [states[i].output_token_ids for i in pf_rows]
        pres = [states[i].params.presence_penalty for i in pf_rows]
        freq = [-states[i].params.frequency_penalty for i in pf_rows]
        flat, pres_n, freq_n = _flat_index(x.shape[1], pf_rows, lists, pres, freq)
        flat_x[flat] = flat_x[flat] - pres_n  # once per distinct token
        flat_x.index_add_(0, flat, freq_n)  # once per occurrence


def _apply_logit_bias(x: Tensor, states: Sequence[SamplingState], rows: list[int]) -> None:
    """OpenAI's logit_bias: add each listed token's bias to its logit."""
    if not rows:
        return
    biases = [states[i].params.logit_bias or {} for i in rows]
    flat = _flat_index(x.shape[1], rows, [list(b) for b in biases])[0]
    values = torch.tensor([v for b in biases for v in b.values()], dtype=x.dtype)
    x.view(-1).index_add_(0, flat, values)


def _apply_constraints(x: Tensor, states: Sequence[SamplingState], rows: list[int]) -> None:
    """Structured outputs: tokens the row's grammar does not allow next get -inf."""
    constraints = [states[i].constraint for i in rows]
    pending = [
        states[i].output_token_ids[c.num_accepted :]  # type: ignore[union-attr]
        for i, c in zip(rows, constraints, strict=True)
    ]
    apply_constraints(x, rows, constraints, pending)  # type: ignore[arg-type]


@dataclass(slots=True)
class _Knobs:
    """Per-row sampling settings as [R] tensors; ``u`` is the row's uniform draw."""

    temp: Tensor
    top_k: Tensor  # V when off
    top_p: Tensor
    min_p: Tensor
    u: Tensor

    def __getitem__(self, rows: Tensor) -> _Knobs:
        return _Knobs(*(getattr(self, f)[rows] for f in ("temp", "top_k", "top_p", "min_p", "u")))


def _sample(
    xs: Tensor, owned: bool, states: Sequence[SamplingState], gen: torch.Generator
) -> Tensor:
    """Draw one token per row of xs: [S, V] (penalized logits; modified only if owned) -> [S]."""
    num_rows, vocab = xs.shape
    params = [s.params for s in states]
    # one uniform per row; a seeded row draws it from its own generator
    u = torch.tensor([_uniform(s.generator or gen) for s in states])
    knobs = torch.tensor([[p.temperature, p.top_p, p.min_p] for p in params])  # [S, 3]
    top_k = torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in params])
    kn = _Knobs(knobs[:, 0], top_k, knobs[:, 1], knobs[:, 2], u)
    tokens = torch.empty(num_rows, dtype=torch.long)
    f = (kn.top_k == vocab).nonzero().squeeze(1)  # rows that need the whole vocab
    f_thr = torch.full((len(f),), -math.inf)  # z thresholds known in advance
    k = (kn.top_k < vocab).nonzero().squeeze(1)
    if len(k):
        tokens[k], thr, complete = _sample_top_k(xs if len(k) == num_rows else xs[k], kn[k])
        # A tie at the (k+1)-th candidate may continue past the candidates: redo on the vocab.
        f, f_thr = torch.cat([f, k[~complete]]), torch.cat([f_thr, thr[~complete]])
    if len(f):
        sub, own = (xs, owned) if len(f) == num_rows else (xs[f], True)
        kf = kn[f]
        kf.top_p = torch.where(f_thr > -math.inf, 1.0, kf.top_p)  # top-k rows: already in f_thr
        tokens[f] = _sample_full(sub, own, kf, f_thr)
    return tokens


def _sample_top_k(x: Tensor, kn: _Knobs) -> tuple[Tensor, Tensor, Tensor]:
    """Sample rows with top-k on among their top-(k_max+1) logits. x: [R, V].

    Returns (tokens [R], z threshold [R], complete [R]); a row is incomplete when the token
    just past the candidates could still pass the threshold (a tie), and its token is void.
    """
    vocab, k = x.shape[1], kn.top_k
    n_cand = min(vocab, int(k.max()) + 1)
    vals, idx = torch.topk(x, n_cand, dim=-1)  # [R, C], descending
    z = vals.to(torch.float32) / kn.temp[:, None]  # [R, C]
    beyond_k = torch.arange(n_cand)[None, :] >= k[:, None]  # [R, C]
    w = torch.softmax(z.masked_fill(beyond_k, -math.inf), dim=-1)  # top-k renormalized
    n_keep = torch.where(kn.top_p < 1.0, torch.minimum(_nucleus_size(w, kn.top_p), k), k)
    thr = z.gather(1, (n_keep - 1)[:, None]).squeeze(1)  # [R]
    thr = torch.maximum(thr, z[:, 0] + torch.log(kn.min_p))  # min-p: p >= min_p * p_max
    complete = (z[:, -1] < thr) | (n_cand == vocab)
    return _draw_candidates(z, idx, thr, kn.u), thr, complete


def _draw_candidates(z: Tensor, idx: Tensor, thr: Tensor, u: Tensor) -> Tensor:
    """Draw among candidates idx: [R, C] (z: their scaled logits) those with z >= thr: [R]."""
    order = idx.argsort(dim=-1)  # token-id order, so ties cannot reorder the CDF
    z_by_id = z.gather(1, order)
    w = torch.softmax(z_by_id.masked_fill(z_by_id < thr[:, None], -math.inf), dim=-1)
    pos = _inverse_cdf(w, u)  # [R]
    return idx.gather(1, order.gather(1, pos[:, None])).squeeze(1)


def _sample_full(x: Tensor, owned: bool, kn: _Knobs, thr: Tensor) -> Tensor:
    """Sample rows over the whole vocab, keeping z >= thr and the top-p/min-p cuts. x: [R, V]."""
    in_place = owned and x.dtype == torch.float32
    z = x.div_(kn.temp[:, None]) if in_place else torch.div(x, kn.temp[:, None])  # [R, V] f32
    w = torch.softmax(z, dim=-1)  # [R, V]
    if bool((kn.min_p > 0).any()):
        thr = torch.maximum(thr, z.amax(dim=-1) + torch.log(kn.min_p))
    tokens = torch.empty(len(z), dtype=torch.long)
    rest = torch.arange(len(z))  # rows still to draw
    p_rows = (kn.top_p < 1.0).nonzero().squeeze(1)
    if len(p_rows):
        zp, wp = (z, w) if len(p_rows) == len(z) else (z[p_rows], w[p_rows])
        cut, idx = _top_p_cut(zp, wp, kn.top_p[p_rows])  # idx: [r, C] top candidates
        thr[p_rows] = torch.maximum(thr[p_rows], cut)
        # A row whose kept set ends inside its candidates draws there, skipping a vocab pass.
        z_c = zp.gather(1, idx)
        inside = z_c[:, -1] < thr[p_rows]
        done = p_rows[inside]
        tokens[done] = _draw_candidates(z_c[inside], idx[inside], thr[done], kn.u[done])
        rest = rest[~torch.isin(rest, done)]
    if len(rest):
        z, w = (z, w) if len(rest) == len(z) else (z[rest], w[rest])
        if bool((thr[rest] > -math.inf).any()):
            w.masked_fill_(z < thr[rest][:, None], 0.0)
        tokens[rest] = _inverse_cdf(w, kn.u[rest])
    return tokens


def _top_p_cut(z: Tensor, w: Tensor, top_p: Tensor) -> tuple[Tensor, Tensor]:
    """z threshold [R] of the smallest top set with mass >= top_p, and the top candidates
    [R, C] it was looked for in. z, w (its softmax): [R, V]."""
    n_cand = min(z.shape[1], _TOP_P_CANDIDATES)
    idx = torch.topk(z, n_cand, dim=-1).indices  # [R, C]
    n_keep = _nucleus_size(w.gather(1, idx), top_p)
    cut = idx.gather(1, (n_keep - 1)[:, None]).squeeze(1)  # [R] token id of the last kept
    short = (n_keep == n_cand).nonzero().squeeze(1)  # the cut may lie past the candidates
    if n_cand < z.shape[1] and len(short):
        idx_all = torch.sort(z[short], dim=-1, descending=True).indices  # [r, V]
        n_all = _nucleus_size(w[short].gather(1, idx_all), top_p[short])
        cut[short] = idx_all.gather(1, (n_all - 1)[:, None]).squeeze(1)
    return z.gather(1, cut[:, None]).squeeze(1), idx


def _nucleus_size(w_sorted: Tensor, top_p: Tensor) -> Tensor:
    """How many leading weights to keep so their mass reaches top_p: [R]; at least 1."""
    cum = w_sorted.cumsum(dim=-1)  # [R, C]; sequential, so prefixes do not depend on C
    before = torch.nn.functional.pad(cum[:, :-1], (1, 0))  # mass strictly ahead
    return (before < top_p[:, None]).sum(dim=-1)


def _inverse_cdf(w: Tensor, u: Tensor) -> Tensor:
    """Index [R] drawn from each row of unnormalized weights w: [R, L] (w is consumed)."""
    cum = w.cumsum_(dim=-1)
    total = cum[:, -1:]
    target = torch.minimum(u[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))
    # First index whose cum exceeds target: its weight is > 0, since cum rose there.
    return torch.searchsorted(cum, target, right=True).squeeze(1)


def _with_logprobs(
    logits: Tensor, token_ids: list[int], params: list[SamplingParams]
) -> list[SampleResult]:
    """Attach logprobs of the raw logits (before penalties and temperature) where asked."""
    results = [SampleResult(token_id=t, logprob=None, top_logprobs=None) for t in token_ids]
    rows = [i for i, p in enumerate(params) if p.logprobs is not None]
    if not rows:
        return results
    idx = torch.tensor(rows)
    lp = torch.log_softmax(logits[idx].to(torch.float32), dim=-1)  # [L, V]
    chosen = lp.gather(1, torch.tensor([token_ids[i] for i in rows])[:, None]).squeeze(1)
    n_max = max(n or 0 for n in (params[i].logprobs for i in rows))
    top = torch.topk(lp, max(n_max, 1), dim=-1)  # sorted, highest first
    top_vals, top_ids = top.values.tolist(), top.indices.tolist()
    for j, (i, value) in enumerate(zip(rows, chosen.tolist(), strict=True)):
        n = params[i].logprobs or 0
        results[i].logprob = value
        results[i].top_logprobs = list(zip(top_ids[j][:n], top_vals[j][:n], strict=True)) or None
    return results


def _uniform(gen: torch.Generator) -> float:
    """The one random number a sampled row consumes per token."""
    return float(torch.rand((), generator=gen))


def skip_draw(state: SamplingState) -> None:
    """Advance a seeded row's generator past one token sampled elsewhere (a prefill worker
    sampled the first token), so the rest of the sequence matches a colocated run."""
    if state.generator is not None and not state.params.greedy:
        _uniform(state.generator)
