"""A prefill worker's plan for one push (tandem/worker/prefill/routing.py): one plain transfer
between two single processes, routes between groups of different sizes (the decode group's
endpoint names its ranks), and refusals before anything is computed."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tandem.kv_transfer import Endpoint, KvLayout
from tandem.kv_transfer.group_endpoint import GroupEndpoint
from tandem.kv_transfer.reshard import GroupKv
from tandem.worker.errors import BadRequest, LayoutMismatch
from tandem.worker.layout import LayoutSummary
from tandem.worker.prefill.routing import plan_push

WHOLE = KvLayout("m", "float32", "float32", 16, 2, 3, 8)
ONE = GroupKv.single(WHOLE)
THREE = GroupKv(replace(WHOLE, num_kv_heads=1, tensor_parallel_size=3),
                ((0, 1), (1, 2), (2, 3)))
EPS = tuple(Endpoint("h", (("tcp", f"127.0.0.1:{7000 + r}"),)) for r in range(3))


def test_two_single_processes_push_one_plain_transfer() -> None:
    plan = plan_push(ONE, EPS[0].encode(), LayoutSummary.of(WHOLE))
    assert plan.plain and plan.endpoints == (EPS[0],)


def test_a_single_process_routes_each_head_to_the_decode_rank_holding_it() -> None:
    target = GroupEndpoint(THREE, EPS).encode()
    plan = plan_push(ONE, target, LayoutSummary.of(THREE.layout))
    assert [(r.src, r.dst, r.start) for r in plan.routes] == [(0, 0, 0), (0, 1, 1), (0, 2, 2)]
    assert plan.parts == (1, 1, 1) and plan.committers == (0, 0, 0)
    frame = plan.frame(0)
    assert frame["commit"] == [0, 1, 2] and frame["endpoints"] == [e.encode() for e in EPS]


def test_a_group_routes_into_a_single_decode_process() -> None:
    plan = plan_push(THREE, EPS[0].encode(), LayoutSummary.of(WHOLE))
    assert [(r.src, r.dst, r.dst_offset) for r in plan.routes] == [(0, 0, 0), (1, 0, 1),
                                                                      (2, 0, 2)]
    assert plan.parts == (3,) and plan.committers == (0,)
    assert plan.frame(2)["commit"] == [] and plan.of_rank(2)[0].start == 2


def test_pairs_nobody_can_re_shard_are_refused_by_name() -> None:
    other = replace(WHOLE, block_size=32)
    with pytest.raises(LayoutMismatch, match="block_size"):
        plan_push(THREE, EPS[0].encode(), LayoutSummary.of(other))
    with pytest.raises(LayoutMismatch, match="block_size"):
        plan_push(ONE, EPS[0].encode(), LayoutSummary.of(other))
    float16 = GroupKv(replace(THREE.layout, kv_dtype="float16"), THREE.head_ranges)
    with pytest.raises(LayoutMismatch, match="kv_dtype"):
        plan_push(ONE, GroupEndpoint(float16, EPS).encode(), LayoutSummary.of(float16.layout))
    # the router's stated layout must be the group's own
    with pytest.raises(LayoutMismatch, match="not its group's"):
        plan_push(ONE, GroupEndpoint(THREE, EPS).encode(), LayoutSummary.of(WHOLE))


@pytest.mark.parametrize("endpoint", ["", "tpgroup:!!!", "tpgroup:" + "A" * 70000])
def test_an_endpoint_that_does_not_parse_is_a_bad_request(endpoint: str) -> None:
    with pytest.raises(BadRequest):
        plan_push(ONE, endpoint, LayoutSummary.of(WHOLE))
