"""What the placement model saw, real beside simulated (bench/planner/placement_inputs.py): medians
over the model's own decisions, and the simulated router's records are the real router's
(tandem/placement/log.py) so the two line up."""

from __future__ import annotations

from bench.planner.placement_inputs import placement_inputs, placement_table
from tandem.placement.slo import Slo
from tandem.planner.sim import ClusterSpec, simulate
from tandem.planner.workload import LengthMix, RequestKind, poisson
from tests.unit.planner.test_sim_support import profile


def _record(tokens: int, decision: str, reason: str, local_s: float, remote_s: float) -> dict:
    return {"t": 0.0, "tokens": tokens, "decision": decision, "reason": reason, "endpoint": "",
            "local": {"ttft_s": local_s, "gap_s": 0.01},
            "decode": {"endpoint": "d", "running": 0, "active": 0, "base_s": 0.01,
                       "per_row_s": 0.001, "per_token_s": 0.002, "queued": 0, "cached": 0},
            "prefill": [{"endpoint": "p", "base_s": 0.01, "per_token_s": 0.001, "queued": 5,
                         "cached": 0, "overhead_s": 0.05, "ttft_s": remote_s, "gap_s": 0.01}]}


def test_medians_count_the_model_s_decisions_only() -> None:
    records = [_record(40, "local", "slo", 0.1, 0.2), _record(60, "remote", "slo", 0.3, 0.2),
               _record(900, "remote", "cheapest", 2.0, 1.0),
               _record(50, "remote", "no_signal", 9.0, 9.0)]  # no model: not counted
    seen = placement_inputs(records)
    assert seen is not None
    assert seen["all"]["decisions"] == 3 and seen["chat"]["decisions"] == 2
    assert seen["chat"]["local_share"] == 0.5
    assert seen["chat"]["local_ttft_s"] == 0.2 and seen["all"]["remote_ttft_s"] == 0.2
    assert seen["chat"]["overhead_s"] == 0.05 and seen["chat"]["prefill_queued"] == 5
    assert placement_inputs(records[3:]) is None


def test_the_simulated_router_logs_what_the_real_one_logs() -> None:
    kind = RequestKind("k", prompt_tokens=(40, 900), output_tokens=(20, 60))
    trace = poisson(4, 30, LengthMix("m", ((kind, 1.0),)), seed=3)
    log: list[dict] = []
    result = simulate(ClusterSpec(1, 1, slo=Slo(2.0, 0.1)), profile(), trace,
                      placement_log=log)
    model = {k: n for k, n in result.decisions.items() if k[1] in ("slo", "cheapest")}
    assert len(log) == sum(result.decisions.values()) and sum(model.values()) > 0
    assert {(r["decision"], r["reason"]) for r in log} == set(result.decisions)
    assert all(r["prefill"][0]["ttft_s"] is not None for r in log if r["reason"] == "slo")
    assert [r["t"] for r in log] == sorted(r["t"] for r in log)  # simulated seconds
    seen = placement_inputs(log)
    row = {"setup": "disagg", "mix": "m", "rate": 4.0,
           "placement_inputs": {"real": seen, "sim": seen}}
    table = placement_table([row])
    assert "local_share" in table.splitlines()[0] and "disagg" in table.splitlines()[1]
    assert placement_table([{"setup": "x", "mix": "m", "rate": 1.0}]) == ""
