"""Which LoRA adapters the router serves: what its routable decode workers report (hostile
reports trimmed), the identity most of them hold, and the prefix hashes salted by it."""

from __future__ import annotations

import time

from tandem.common.block_hash import adapter_salt, block_hashes
from tandem.placement.affinity import prefix_hashes
from tandem.placement.worker_view import Role
from tandem.protos.v1 import worker_pb2
from tandem.router import adapters
from tandem.router.convert.membership import load_of
from tandem.router.membership.registry import Registry


def _registry(reports: dict[str, dict[str, str]]) -> Registry:
    registry = Registry(time.monotonic, heartbeat_interval_s=1.0)
    for endpoint, loras in reports.items():
        registry.add_static(Role.DECODE, endpoint)
        registry.update_load(endpoint, load_of(worker_pb2.WorkerStats(num_blocks=8,
                                                                      loras=loras)))
    return registry


def test_served_adapters_are_the_decode_workers_reports() -> None:
    registry = _registry({"d1:1": {"sql": "sql@aa", "chat": "chat@bb"},
                          "d2:1": {"sql": "sql@aa"}, "d3:1": {"sql": "sql@cc"}})
    assert adapters.served(registry) == {"sql": "sql@aa", "chat": "chat@bb"}  # the majority
    assert adapters.resolve(registry, "sql") == "sql@aa"
    assert adapters.resolve(registry, "nope") == "" and adapters.resolve(registry, "") == ""
    holders = [w.endpoint for w in registry.routable(Role.DECODE) if w.holds_adapter("sql@aa")]
    assert holders == ["d1:1", "d2:1"]


def test_a_workers_report_is_not_trusted() -> None:
    load = load_of(worker_pb2.WorkerStats(loras={
        "ok": "ok@12", "liar": "other@34", "long": "long@" + "x" * 500}))
    assert load.loras == frozenset({"ok@12"})


def test_prefix_hashes_are_salted_by_the_adapter_as_the_engine_salts_them() -> None:
    tokens = list(range(64))
    assert prefix_hashes(tokens, 16) == block_hashes(tokens, 16)
    salted = prefix_hashes(tokens, 16, adapter="sql@aa")
    assert salted == block_hashes(tokens, 16, salt=adapter_salt("sql@aa"))
    assert not set(salted) & set(prefix_hashes(tokens, 16))
    assert not set(salted) & set(prefix_hashes(tokens, 16, adapter="sql@cc"))
