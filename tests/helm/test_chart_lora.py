"""Multi-LoRA through the chart, in both modes: the ``lora`` values reach every worker of both
roles (the KV handoff checks the adapter on each side) as flags their real CLIs parse into one
LoRA config, the adapters' volume is mounted on the worker pods, the runtime routes reach the
router with its admin Secret mounted there only, every object stays valid (the RayCluster
against its CRD), and values no cluster could serve fail the render."""

from __future__ import annotations

import copy
from typing import Any

import helm_python as helm
import pytest

from tandem.engine.cli_args import engine_config_from_args
from tests.helm.chart import EXAMPLES, launched, load_values, objects, pod_specs, render, validate

QUICKSTART = EXAMPLES / "cpu-quickstart.yaml"
ADMIN_SECRET = "tandem-lora-admin"
LORA = {
    "enabled": True,
    "modules": [{"name": "sql", "path": "sql-lora"}, {"name": "org/chat", "path": "/chat/v2"}],
    "maxLoras": 3, "maxLoraRank": 32, "maxCpuLoras": 6,
    "pvc": {"enabled": True, "claimName": "adapters", "mountPath": "/adapters",
            "readOnly": True},
    "runtimeUpdates": {"enabled": True, "existingSecret": ADMIN_SECRET},
}


def _values(mode: str, **lora: Any) -> dict[str, Any]:
    values = load_values(QUICKSTART)
    values["mode"] = mode
    values["lora"] = {**copy.deepcopy(LORA), **lora}
    return values


def _volumes(spec: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(volumes by name, the first container's mounts by name) of a pod spec."""
    mounts = spec["containers"][0].get("volumeMounts", [])
    return ({v["name"]: v for v in spec.get("volumes", [])}, {m["name"]: m for m in mounts})


@pytest.mark.parametrize("mode", ["deployments", "ray"])
def test_lora_values_reach_both_worker_roles_and_the_router(mode: str) -> None:
    procs = {p.role: p for p in launched(objects(render(_values(mode))))}
    assert set(procs) == {"router", "prefill", "decode"}
    configs = {role: engine_config_from_args(procs[role].args).lora
               for role in ("prefill", "decode")}
    assert configs["prefill"] == configs["decode"]  # one adapter set on both sides
    lora = configs["decode"]
    assert lora.enabled and lora.runtime_updates
    assert lora.modules == (("sql", "/adapters/sql-lora"), ("org/chat", "/adapters/chat/v2"))
    assert (lora.max_loras, lora.max_lora_rank, lora.max_cpu_loras) == (3, 32, 6)
    router = procs["router"].args
    assert router.allow_runtime_lora_updates
    assert router.admin_key_file == "/etc/tandem/admin-keys/admin-keys"


@pytest.mark.parametrize("mode", ["deployments", "ray"])
def test_adapters_volume_on_workers_admin_keys_on_the_router_only(mode: str) -> None:
    objs = objects(render(_values(mode)))
    for obj in objs:
        validate(obj)
    seen = set()
    for obj in objs:
        for component, _, spec in pod_specs(obj):
            volumes, mounts = _volumes(spec)
            if component == "router":  # the router Deployment, or the Ray head
                assert volumes["admin-keys"]["secret"]["secretName"] == ADMIN_SECRET
                assert mounts["admin-keys"] == {"name": "admin-keys", "readOnly": True,
                                                "mountPath": "/etc/tandem/admin-keys"}
                assert "adapters" not in volumes  # the router never reads an adapter
            else:
                assert volumes["adapters"]["persistentVolumeClaim"] == {
                    "claimName": "adapters", "readOnly": True}
                assert mounts["adapters"]["mountPath"] == "/adapters"
                assert "admin-keys" not in volumes  # a worker holds no admin key
            seen.add(component)
    assert seen == {"router", "prefill", "decode"}


@pytest.mark.parametrize("mode", ["deployments", "ray"])
def test_lora_off_by_default_passes_no_flag_and_mounts_nothing(mode: str) -> None:
    values = load_values(QUICKSTART)
    values["mode"] = mode
    objs = objects(render(values))
    for proc in launched(objs):
        if proc.role == "router":
            assert not proc.args.allow_runtime_lora_updates and not proc.args.admin_key_file
        else:
            assert not engine_config_from_args(proc.args).lora.enabled, proc.role
    for obj in objs:
        for _, _, spec in pod_specs(obj):
            assert not {"adapters", "admin-keys"} & set(_volumes(spec)[0])


def test_modules_without_the_pvc_are_paths_in_the_image() -> None:
    values = _values("deployments", pvc={"enabled": False}, runtimeUpdates={"enabled": False})
    procs = {p.role: p for p in launched(objects(render(values)))}
    lora = engine_config_from_args(procs["prefill"].args).lora
    assert lora.modules == (("sql", "sql-lora"), ("org/chat", "/chat/v2"))
    assert not lora.runtime_updates and not procs["router"].args.allow_runtime_lora_updates


@pytest.mark.parametrize(("lora", "message"), [
    ({"runtimeUpdates": {"enabled": True, "existingSecret": ""}},
     "lora.runtimeUpdates.enabled needs lora.runtimeUpdates.existingSecret"),
    ({"enabled": False}, "lora.modules and lora.runtimeUpdates need lora.enabled=true"),
    ({"modules": [{"name": "sql", "path": "a"}, {"name": "sql", "path": "b"}]},
     "the name sql is given twice"),
], ids=["runtime-without-admin-keys", "modules-without-enabled", "duplicate-name"])
def test_lora_values_no_cluster_could_serve_fail_the_render(
        lora: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmError, match=message):
        render(_values("deployments", **lora))


@pytest.mark.parametrize(("lora", "field"), [
    ({"modules": [{"name": "-bad", "path": "a"}]}, "/lora/modules/0/name"),
    ({"modules": [{"name": "sql", "path": "a=b"}]}, "/lora/modules/0/path"),
    ({"maxLoraRank": -1}, "/lora/maxLoraRank"),
    ({"pvc": {"enabled": True, "claimName": ""}}, "/lora/pvc/claimName"),
    ({"rank": 8}, "/lora"),
], ids=["name", "path", "rank", "pvc-claim", "unknown-key"])
def test_lora_values_are_checked_by_the_schema(lora: dict[str, Any], field: str) -> None:
    with pytest.raises(helm.HelmValuesError, match=field):
        render(_values("deployments", **lora))
