"""When disaggregation stops paying on a given link (``tandem plan --link-gbps/--link-rtt-ms``).

A remote prefill moves ``kv_bytes_per_token`` x the prompt's tokens to the decode worker; at
``gbps`` that costs ``rtt + bytes / bandwidth`` before the first token. The router's own
decision (tandem/placement/cost_model.py ``decide``, the push priced as
tandem/placement/link.py prices an unmeasured pair) is asked, for an idle prefill worker and
a decode worker running ``rows`` streams (each from its profile's step costs), two
questions:

    shortest_remote  the shortest prompt it sends to the prefill worker on this link
                     (shorter ones are prefilled where they decode: colocated wins)
    slowest_link     the slowest link on which a prompt of ``tokens`` still goes remote
                     (below it that prompt stays colocated)

Both by bisection over the decision (it is monotone in the prompt's length and in the
link's speed). Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tandem.placement import cost_model
from tandem.placement.cost_model import Decision
from tandem.placement.link import LinkPrior
from tandem.placement.slo import Slo
from tandem.placement.worker_view import Role, WorkerView
from tandem.planner.profile import Profile, Transfer

MIN_GBPS, MAX_GBPS = 0.001, 10_000.0


def with_link(profile: Profile, link: LinkPrior) -> Profile:
    """``profile`` with its KV handoff on ``link`` (the simulator's push)."""
    return replace(profile, transfer=Transfer(link.bytes_per_s, link.rtt_s))


def _views(prefill: Profile, decode: Profile, rows: int) -> tuple[WorkerView, WorkerView]:
    p = WorkerView("p", Role.PREFILL, step_base_s=prefill.step.base_s,
                   step_per_row_s=prefill.step.per_row_s,
                   step_per_prefill_token_s=prefill.step.per_prefill_token_s,
                   max_batched_tokens=prefill.chunk_tokens)
    d = WorkerView("d", Role.DECODE, num_running=rows, step_base_s=decode.step.base_s,
                   step_per_row_s=decode.step.per_row_s,
                   step_per_prefill_token_s=decode.step.per_prefill_token_s,
                   max_batched_tokens=decode.chunk_tokens)
    return p, d


def goes_remote(prefill: Profile, decode: Profile, slo: Slo, link: LinkPrior, tokens: int,
                rows: int) -> bool:
    """Whether the router's decision sends a prompt of ``tokens`` to the idle prefill
    worker, its push priced on ``link``, beside ``rows`` decoding streams."""
    p, d = _views(prefill, decode, rows)
    wire = link.seconds(tokens * prefill.kv_bytes_per_token)
    placed = cost_model.decide(tokens, d, [p], slo, link_s={"p": wire})
    return placed.decision is Decision.REMOTE


def shortest_remote(prefill: Profile, decode: Profile, slo: Slo, link: LinkPrior, rows: int,
                    max_tokens: int) -> int | None:
    """The shortest prompt (up to ``max_tokens``) the decision sends remote; None: none."""
    if not goes_remote(prefill, decode, slo, link, max_tokens, rows):
        return None
    lo, hi = 0, max_tokens  # lo stays local (or 0), hi goes remote
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if goes_remote(prefill, decode, slo, link, mid, rows):
            hi = mid
        else:
            lo = mid
    return hi


def slowest_link(prefill: Profile, decode: Profile, slo: Slo, rtt_s: float, tokens: int,
                 rows: int) -> float | None:
    """The slowest link (Gb/s, with ``rtt_s``) on which a prompt of ``tokens`` still goes
    remote; None: not even at ``MAX_GBPS``."""
    def remote(gbps: float) -> bool:
        return goes_remote(prefill, decode, slo, LinkPrior(gbps, rtt_s), tokens, rows)

    if not remote(MAX_GBPS):
        return None
    lo, hi = MIN_GBPS, MAX_GBPS
    if remote(lo):
        return lo
    for _ in range(60):  # geometric bisection to well under 1%
        mid = (lo * hi) ** 0.5
        if remote(mid):
            hi = mid
        else:
            lo = mid
        if hi / lo < 1.001:
            break
    return hi


@dataclass(frozen=True, slots=True)
class LinkVerdict:
    """One decode load's answers (None: never remote / not on any link)."""

    rows: int
    shortest_remote: int | None
    slowest_gbps: float | None


def link_report(prefill: Profile, decode: Profile, slo: Slo, link: LinkPrior,
                tokens: int, max_tokens: int) -> tuple[str, list[LinkVerdict]]:
    """The lines ``tandem plan`` prints for ``link`` and a workload whose long prompts have
    ``tokens`` tokens (its P90) and whose longest has ``max_tokens``: for a decode worker
    with one stream and one half full."""
    per_k = link.seconds(1000 * prefill.kv_bytes_per_token) - link.rtt_s
    lines = [f"link {link.gbps:g} Gb/s, RTT {link.rtt_s * 1e3:g} ms: a push costs "
             f"{per_k * 1e3:.1f} ms per 1k prompt tokens ({prefill.kv_bytes_per_token} B a "
             f"token) + {link.rtt_s * 1e3:g} ms; the prefill costs "
             f"{prefill.step.per_prefill_token_s * 1e6:.0f} ms per 1k on a prefill worker."]
    verdicts = []
    for rows in sorted({1, max(decode.max_num_seqs // 2, 1)}):
        short = shortest_remote(prefill, decode, slo, link, rows, max_tokens)
        slow = slowest_link(prefill, decode, slo, link.rtt_s, tokens, rows)
        verdicts.append(LinkVerdict(rows, short, slow))
        where = (f"every prompt up to {max_tokens} tokens stays colocated" if short is None
                 else "every prompt goes remote" if short <= 1
                 else f"prompts under {short} tokens stay colocated, longer ones go remote")
        speed = (f"below {slow:.3g} Gb/s a {tokens}-token prompt stays colocated"
                 if slow is not None else f"a {tokens}-token prompt stays colocated on any link")
        lines.append(f"  beside {rows} decoding stream(s): {where}; {speed}.")
    return "\n".join(lines), verdicts
