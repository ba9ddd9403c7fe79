"""Which LoRA adapters the router can serve: what its routable workers report.

    worker stats: loras {name: name@digest}  ->  WorkerView.loras (identities)
    a request's ``model``: the base model's name -> "" ; an adapter's name -> its identity

Adapters are the workers' (``--lora-modules``, or loaded at runtime): the router has no list
of its own, so /v1/models and the ``model`` a request may name follow what is loaded. Two
workers holding different bytes under one name are two identities; a request goes to the
identity most decode workers hold, and only to workers holding exactly it (the KV handshake
refuses a push between two identities anyway).
"""

from __future__ import annotations

from collections import Counter

from tandem.placement.worker_view import Role
from tandem.router.membership.registry import Registry


def adapter_name(identity: str) -> str:
    """The name part of an adapter identity ``name@digest``."""
    return identity.rpartition("@")[0]


def served(registry: Registry) -> dict[str, str]:
    """name -> identity of every adapter a routable decode worker serves (the identity most
    of them hold, where they differ)."""
    counts = Counter(i for w in registry.routable(Role.DECODE) for i in w.loras)
    out: dict[str, str] = {}
    for identity, _ in counts.most_common():
        out.setdefault(adapter_name(identity), identity)
    return out


def resolve(registry: Registry, model: str) -> str:
    """The identity of the adapter a request's ``model`` names, "" when it names none being
    served (the base model, or an unknown name: validation then says which)."""
    return served(registry).get(model, "") if model else ""
