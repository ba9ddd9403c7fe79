"""tandem/planner/search.py and tandem/planner/report.py: the plan is the cheapest configuration that the
simulator says meets the SLO, and the search's neighbours one worker smaller do not."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tandem.placement.slo import Slo
from tandem.planner.decision import decide
from tandem.planner.profile import Profile, StepCost, Transfer
from tandem.planner.report import helm_values, table, to_json, up_flags
from tandem.planner.search import PlanInputs, plan
from tandem.planner.sim import ClusterSpec, simulate
from tandem.planner.workload import MIXES, poisson

SLO = Slo(ttft_s=1.0, tpot_s=0.05)


def _profile(device: str = "H200") -> Profile:
    # An accelerator-like worker: 10 ms a step, cheap rows, 20 us a prompt token.
    return Profile("m", device, StepCost(0.010, 0.0002, 0.00002, 1e-8),
                   Transfer(5e10, 0.001), kv_bytes_per_token=100_000,
                   kv_capacity_tokens=200_000, chunk_tokens=2048, max_num_seqs=64)


def _inputs(rate: float = 8.0) -> PlanInputs:
    trace = poisson(rate, 60.0, MIXES["mixed"], seed=1)
    p = _profile()
    return PlanInputs(p, p, p, trace, SLO, attainment=0.9)


def _attains(inputs: PlanInputs, kind: str, prefill: int, decode: int) -> float:
    if kind == "colocated":
        result = simulate(ClusterSpec(0, decode, placement="local", slo=inputs.slo),
                          inputs.colocated, inputs.trace)
    else:
        result = simulate(ClusterSpec(prefill, decode, slo=inputs.slo), inputs.decode,
                          inputs.trace, prefill_profile=inputs.prefill)
    return result.summary(inputs.slo).slo_attainment


def test_plan_is_feasible_and_one_worker_less_is_not() -> None:
    inputs = _inputs()
    result = plan(inputs)
    best, colo = result.disaggregated, result.colocated
    assert best is not None and colo is not None
    assert best.feasible and colo.feasible
    assert _attains(inputs, "disaggregated", best.prefill, best.decode) >= 0.9
    if best.decode > 1:
        assert _attains(inputs, "disaggregated", best.prefill, best.decode - 1) < 0.9
    if best.prefill > 1:
        assert _attains(inputs, "disaggregated", best.prefill - 1, best.decode) < 0.9
    if colo.decode > 1:
        assert _attains(inputs, "colocated", 0, colo.decode - 1) < 0.9
    # goodput: at least the planned rate, and the curve falls off past it
    assert best.goodput_rps is not None and best.goodput_rps >= result.rate * 0.99
    assert best.curve[0][1] >= best.curve[-1][1]
    assert result.simulations >= len(result.evaluated)


def test_a_higher_rate_needs_at_least_as_many_gpus() -> None:
    low, high = plan(_inputs(4.0)), plan(_inputs(16.0))
    assert low.disaggregated is not None and high.disaggregated is not None
    assert high.disaggregated.gpus >= low.disaggregated.gpus
    assert high.colocated is not None and low.colocated is not None
    assert high.colocated.gpus >= low.colocated.gpus


def test_an_impossible_slo_is_reported_as_such() -> None:
    p = _profile()
    trace = poisson(4.0, 20.0, MIXES["rag"], seed=0)
    # A 768-token prompt alone takes > 10 ms of prefill: a 1 ms TTFT is out of reach.
    result = plan(PlanInputs(p, p, p, trace, Slo(0.001, 0.05)))
    assert result.disaggregated is None and result.colocated is None
    assert "No configuration" in decide(result).reason


def test_report_outputs_deploy_the_winner() -> None:
    inputs = _inputs()
    result = plan(inputs)
    best = result.disaggregated
    assert best is not None
    text = table(result, decide(result))
    assert "disaggregated" in text and "colocated" in text
    flags = up_flags(best, inputs.prefill, inputs.decode, SLO)
    assert f"--prefill {best.prefill} --decode {best.decode}" in flags
    assert "--slo-ttft-s=1" in flags
    values = helm_values(best, inputs.prefill, inputs.decode, SLO)
    assert f"replicas: {best.prefill}" in values and "device: cuda" in values
    data = to_json(result, decide(result), {"note": "test"})
    assert data["disaggregated"]["prefill"] == best.prefill
    assert data["verdict"] == decide(result).reason


def test_a_cpu_profile_gets_cpu_helm_values() -> None:
    p = _profile(device="cpu: AMD EPYC")
    result = plan(PlanInputs(p, p, p, poisson(1.0, 20.0, MIXES["chat"], seed=0), SLO))
    assert result.colocated is not None
    values = helm_values(result.colocated, p, p, SLO)
    assert "device: cpu" in values and "count: 0" in values
    assert "replicas: 0" in values.split("decode:")[0]  # no prefill pool


@pytest.mark.parametrize("gpus", [1, 2])
def test_gpus_count_every_worker_of_its_size(gpus: int) -> None:
    p = _profile()
    big = replace(p, gpus_per_worker=gpus)
    result = plan(PlanInputs(big, big, big, poisson(4.0, 30.0, MIXES["mixed"], seed=2), SLO))
    assert result.disaggregated is not None
    assert result.disaggregated.gpus == gpus * (result.disaggregated.prefill + result.disaggregated.decode)


def test_a_large_deployment_is_searched_on_a_cell_and_checked_whole() -> None:
    inputs = _inputs(rate=40.0)
    result = plan(inputs, max_cell_workers=4)
    trimmed = plan(inputs, max_cell_workers=4, trim_steps=3).disaggregated
    assert trimmed is not None and trimmed.feasible
    assert result.disaggregated is not None and trimmed.gpus <= result.disaggregated.gpus
    best = result.disaggregated
    assert best is not None and best.feasible
    # the winner was simulated on the whole trace, not only on the cell
    assert _attains(inputs, "disaggregated", best.prefill, best.decode) >= 0.9
    assert any(c is best for c in result.evaluated)
    assert best.goodput_rps is not None and best.goodput_rps > 0


def test_thinning_keeps_whole_conversations() -> None:
    from tandem.planner.search import thin
    from tandem.planner.workload import multiturn

    trace = multiturn(2.0, 60.0, seed=3)
    kept = thin(trace, 0.5)
    convs = {r.conversation for r in kept}
    assert 0.3 < len(convs) / len({r.conversation for r in trace}) < 0.7
    for c in convs:
        assert [r for r in kept if r.conversation == c] == \
            [r for r in trace if r.conversation == c]
