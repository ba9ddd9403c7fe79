"""Where ``tandem up``'s secrets travel (no Ray started): never in an actor's constructor
arguments (Ray keeps those in the GCS), only through the pool actor's methods; and which Ray
clusters ``tandem up --address`` joins."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect

import pytest

from tandem.launcher.connect import ray_auth_refusal
from tandem.launcher.controller_actor import ControllerActor
from tandem.launcher.pool import PoolActor
from tandem.launcher.router_actor import RouterActor
from tandem.launcher.spec import LaunchSpec
from tandem.launcher.up import build_parser, spec_from_args
from tandem.launcher.worker_actor import WorkerActor

KEYS = "k-one\nk-two\n"


def _spec(*argv: str) -> LaunchSpec:
    spec = spec_from_args(build_parser().parse_args(list(argv)), None)
    return dataclasses.replace(spec, api_keys=KEYS)


def test_the_spec_actors_are_built_with_holds_no_secret() -> None:
    spec = _spec()
    assert len(spec.cluster_secret) == 64
    bare = spec.without_secrets()
    values = [str(getattr(bare, f.name)) for f in dataclasses.fields(bare)]
    assert not any(spec.cluster_secret in v or "k-one" in v for v in values)
    assert bare.secrets_apart and not bare.insecure
    # Everything else is the same cluster.
    apart = {"cluster_secret", "api_keys", "secrets_apart"}
    assert all(getattr(bare, f.name) == getattr(spec, f.name)
               for f in dataclasses.fields(spec) if f.name not in apart)
    with pytest.raises(ValueError, match="holds none"):
        dataclasses.replace(bare, cluster_secret=spec.cluster_secret)
    insecure = _spec("--insecure").without_secrets()
    assert insecure.insecure and insecure.cluster_secret == ""


def test_no_actor_constructor_takes_a_secret() -> None:
    """The actors' constructors have no parameter a secret could go through: they ask the pool
    (its ``cluster_secret`` / ``api_keys`` methods) as they start."""
    for actor in (RouterActor, WorkerActor, ControllerActor, PoolActor):
        params = set(inspect.signature(actor.__init__).parameters)
        assert not {p for p in params if "secret" in p or "key" in p}, (actor, params)


def test_the_pool_hands_out_the_secrets_it_was_given() -> None:
    spec = _spec()

    async def run() -> tuple[str, str, str, str]:
        given = PoolActor(spec, "model")  # in-process: the spec's own secrets
        apart = PoolActor(spec.without_secrets(), "model")  # as tandem up builds it
        return (await given.cluster_secret(), await given.api_keys(),
                await apart.cluster_secret(), await apart.api_keys())

    assert asyncio.run(run()) == (spec.cluster_secret, KEYS, "", "")


def test_up_joins_only_a_ray_cluster_with_token_auth_unless_insecure() -> None:
    assert ray_auth_refusal(requires_token=True, insecure=False) is None
    assert ray_auth_refusal(requires_token=True, insecure=True) is None
    assert ray_auth_refusal(requires_token=False, insecure=True) is None
    refusal = ray_auth_refusal(requires_token=False, insecure=False)
    assert refusal is not None
    assert "RAY_AUTH_MODE=token" in refusal and "--insecure" in refusal
