"""Per-pair link estimates: learnt from pushes, faded back to the prior, forgotten when stale
(a fake clock: ``now`` passed explicitly)."""

from __future__ import annotations

import math

import pytest

from tandem.placement.link import (
    LINK_HALF_LIFE_S,
    STALE_HALF_LIVES,
    LinkEstimates,
    LinkPrior,
    kv_bytes_per_token,
)

MB = 1_000_000


def test_kv_bytes_per_token_from_the_layout() -> None:
    # SmolLM2-135M: 30 layers, 3 KV heads of 64, float16 -> 23,040 bytes a token
    assert kv_bytes_per_token(30, 3, 64, "float16") == 23_040
    assert kv_bytes_per_token(30, 3, 64, "int8") == 11_520


def test_an_unknown_pair_is_priced_by_the_prior() -> None:
    links = LinkEstimates(LinkPrior(gbps=8.0, rtt_s=0.002))
    assert links.estimate("p", "d", now=0.0) is None
    assert links.seconds("p", "d", 10 * MB, now=0.0) == pytest.approx(0.002 + 0.01)
    with pytest.raises(ValueError):
        LinkPrior(gbps=0.0)


def test_pushes_of_several_sizes_give_bandwidth_and_latency() -> None:
    """Pushes on a 1 Gb/s (125 MB/s) link with a 3 ms fixed cost: the fit recovers both."""
    links = LinkEstimates(LinkPrior(gbps=100.0, rtt_s=0.0))
    for i in range(40):
        nbytes = (1 + i % 5) * 4 * MB
        links.observe("p", "d", nbytes, 0.003 + nbytes / 125e6, now=float(i))
    est = links.estimate("p", "d", now=40.0)
    assert est is not None and est.samples == 40
    assert est.bytes_per_s == pytest.approx(125e6, rel=1e-6)
    assert est.latency_s == pytest.approx(0.003, abs=1e-9)
    # a fresh estimate stands for itself, not the prior's 100 Gb/s
    assert links.seconds("p", "d", 25 * MB, now=40.0) == pytest.approx(0.203, rel=0.01)
    # the other direction and other pairs are still unknown
    assert links.estimate("d", "p", now=40.0) is None


def test_one_push_size_keeps_the_prior_latency_and_learns_the_rate() -> None:
    links = LinkEstimates(LinkPrior(gbps=10.0, rtt_s=0.001))
    for i in range(5):
        links.observe("p", "d", 10 * MB, 0.081, now=float(i))
    est = links.estimate("p", "d", now=5.0)
    assert est is not None
    assert est.latency_s == pytest.approx(0.001)
    assert est.bytes_per_s == pytest.approx(10 * MB / 0.080)


def test_a_push_the_compute_hid_prices_the_link_as_free() -> None:
    """Pushes whose exposed time does not grow with their size (the layers went out while
    later ones computed): no per-byte cost, only the fixed one."""
    links = LinkEstimates(LinkPrior(gbps=1.0, rtt_s=0.0))
    for i in range(20):
        links.observe("p", "d", (1 + i % 4) * MB, 0.002, now=float(i))
    est = links.estimate("p", "d", now=20.0)
    assert est is not None and math.isinf(est.bytes_per_s)
    assert links.seconds("p", "d", 1000 * MB, now=19.0) == pytest.approx(0.002)


def test_an_estimate_fades_to_the_prior_and_is_then_forgotten() -> None:
    prior = LinkPrior(gbps=10.0, rtt_s=0.0)
    links = LinkEstimates(prior, half_life_s=LINK_HALF_LIFE_S)
    links.observe("p", "d", 125 * MB, 1.0, now=0.0)  # 1 Gb/s measured
    nbytes = 125 * MB
    measured, assumed = 1.0, prior.seconds(nbytes)
    assert links.seconds("p", "d", nbytes, now=0.0) == pytest.approx(measured)
    one_half_life = links.seconds("p", "d", nbytes, now=LINK_HALF_LIFE_S)
    assert one_half_life == pytest.approx(0.5 * measured + 0.5 * assumed)
    est = links.estimate("p", "d", now=2 * LINK_HALF_LIFE_S)
    assert est is not None and est.trust == pytest.approx(0.25)
    stale = STALE_HALF_LIVES * LINK_HALF_LIFE_S
    assert links.estimate("p", "d", now=stale) is None
    assert links.pairs() == []
    assert links.seconds("p", "d", nbytes, now=stale) == pytest.approx(assumed)


def test_a_new_push_refreshes_a_fading_estimate() -> None:
    links = LinkEstimates(LinkPrior(gbps=10.0, rtt_s=0.0))
    links.observe("p", "d", 125 * MB, 1.0, now=0.0)
    links.observe("p", "d", 125 * MB, 1.0, now=3 * LINK_HALF_LIFE_S)
    est = links.estimate("p", "d", now=3 * LINK_HALF_LIFE_S)
    assert est is not None and est.trust == 1.0 and est.samples == 2
    # a push after the estimate went stale starts it afresh
    links.observe("p", "d", 125 * MB, 0.5, now=10 * LINK_HALF_LIFE_S)
    est = links.estimate("p", "d", now=10 * LINK_HALF_LIFE_S)
    assert est is not None and est.samples == 1
    assert est.bytes_per_s == pytest.approx(125 * MB / 0.5)


def test_forget_drops_every_pair_of_a_departed_worker() -> None:
    links = LinkEstimates()
    links.observe("p1", "d", MB, 0.01, now=0.0)
    links.observe("p2", "d", MB, 0.01, now=0.0)
    links.observe("p1", "d2", MB, 0.01, now=0.0)
    links.forget("p1")
    assert links.pairs() == [("p2", "d")]
    # nothing learnt from an empty push or a clock that went backwards
    links.observe("p2", "d", 0, 5.0, now=1.0)
    links.observe("p3", "d", MB, -0.5, now=1.0)
    est = links.estimate("p3", "d", now=1.0)
    assert est is not None and est.seconds(MB) == 0.0  # counted as 0 s
    assert links.estimate("p2", "d", now=1.0).samples == 1  # type: ignore[union-attr]
