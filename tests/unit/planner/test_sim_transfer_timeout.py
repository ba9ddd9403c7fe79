"""A remote prefill whose KV push ends past the transfer timeout fails and is retried.

The prefill worker's ``--transfer-timeout-s`` bounds the time from a prompt's arrival there
to its push's commit; a prompt that queued too long fails with RESOURCE_EXHAUSTED and the
router tries the next prefill worker, then the decode worker (tandem/router/handoff/ledger.py).
"""

from __future__ import annotations

import pytest

from tandem.planner.sim import ClusterError, ClusterSpec, simulate
from tests.unit.planner.test_sim_support import assert_clean, profile, req

# A burst of 40 prompts of 400 tokens: 50 ms a prompt (10 ms + 0.1 ms a token), so the
# last ones wait about two seconds on one prefill worker.
BURST = [req(0.001 * i, 400, 4) for i in range(40)]


def test_prompts_past_the_timeout_fall_back_to_their_decode_worker() -> None:
    prof = profile()
    result = simulate(ClusterSpec(1, 2, placement="remote", transfer_timeout_s=1.0), prof,
                      BURST)
    assert_clean(result)
    assert result.prefill_timeouts > 0
    assert result.local_fallbacks == result.prefill_timeouts  # no other prefill worker
    late = [o for o in result.outcomes if o.ttft_s > 1.0]
    assert len(late) >= result.prefill_timeouts
    assert all(o.completed for o in result.outcomes)
    patient = simulate(ClusterSpec(1, 2, placement="remote", transfer_timeout_s=60.0), prof,
                       BURST)
    assert patient.prefill_timeouts == 0 and patient.local_fallbacks == 0


def test_a_timed_out_prompt_tries_another_prefill_worker_first() -> None:
    prof = profile()
    result = simulate(ClusterSpec(2, 2, placement="remote", transfer_timeout_s=0.6,
                                  prefill_attempts=2), prof, BURST * 2)
    assert_clean(result)
    assert result.prefill_timeouts > 0
    # every failure was a timeout (no worker died); some found room on the other worker
    assert result.prefill_retries == result.prefill_timeouts
    assert result.local_fallbacks < result.prefill_timeouts


def test_the_timeout_must_be_positive() -> None:
    with pytest.raises(ClusterError):
        ClusterSpec(1, 1, transfer_timeout_s=0.0)
