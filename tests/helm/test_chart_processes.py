"""What the chart's values make of the router and the workers, in both modes: each setting
reaches the process it is for, parsed by that process's real CLI (in ray mode through
``tandem up``'s own code), and values no process could serve fail the render."""

from __future__ import annotations

import copy
import shlex
from typing import Any

import helm_python as helm
import pytest

from engine.cli_args import engine_config_from_args
from engine.config import EngineConfig
from tests.helm.chart import EXAMPLES, Launched, launched, load_values, objects, render

QUICKSTART = EXAMPLES / "cpu-quickstart.yaml"
ODD_PATH = "/opt/drafts/it's a draft"  # a value a shell line must quote


def _values(mode: str, device: str) -> dict[str, Any]:
    """The CPU quick start with every engine value set away from its default."""
    values = load_values(QUICKSTART)
    gpu = {"resourceName": "nvidia.com/gpu", "count": 1 if device == "cuda" else 0}
    values.update(mode=mode, model={"name": "smollm2", "servedName": "tiny", "maxModelLen": 4096},
                  engine={"quantization": "int8", "kvCacheDtype": "int8"})
    values["router"]["extraArgs"] = ["--max-inflight=17", "--placement=remote"]
    values["prefill"].update(
        device=device, dtype="bfloat16", threads=3, maxNumSeqs=7, kvCacheMemoryGb=2,
        accelerator=gpu, drainTimeoutSeconds=111, extraArgs=["--num-blocks=64"])
    values["decode"].update(
        device=device, dtype="bfloat16", threads=5, maxNumSeqs=96, kvCacheMemoryGb=0.5,
        accelerator=gpu, drainTimeoutSeconds=222,
        speculative={"method": "ngram", "numTokens": 3},
        extraArgs=["--no-prefix-caching", f"--draft-model={ODD_PATH}"])
    return values


def _by_role(values: dict[str, Any]) -> dict[str, Launched]:
    procs = launched(objects(render(values)))
    out = {p.role: p for p in procs}
    assert len(out) == len(procs) == 3
    return out


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("mode", ["deployments", "ray"])
def test_every_value_reaches_the_process_it_is_for(mode: str, device: str) -> None:
    procs = _by_role(_values(mode, device))
    router = procs["router"].args
    assert (router.model_name, router.max_model_len) == ("tiny", 4096)
    # The chart's own flags first, extraArgs last: they win.
    assert (router.max_inflight, router.placement) == (17, "remote")
    for role, threads, seqs, kv_gb, drain in (("prefill", 3, 7, 2.0, 111.0),
                                              ("decode", 5, 96, 0.5, 222.0)):
        args = procs[role].args
        assert (args.model, args.dtype, args.device) == ("smollm2", "bfloat16", device), role
        assert (args.quantization, args.kv_cache_dtype, args.max_model_len) == (
            "int8", "int8", 4096), role
        assert (args.threads, args.max_num_seqs, args.kv_cache_memory_gb) == (
            threads, seqs, kv_gb), role
        assert args.drain_timeout_s == drain, role
        assert args.no_kv_shm, role  # pods on one node share no /dev/shm
    prefill, decode = procs["prefill"].args, procs["decode"].args
    assert prefill.num_blocks == 64 and decode.num_blocks is None
    assert decode.no_prefix_caching and not prefill.no_prefix_caching
    # Speculation is the decode workers' alone; a quoted value survives the Ray head's shell.
    assert (decode.speculative, decode.num_speculative_tokens) == ("ngram", 3)
    assert decode.draft_model == ODD_PATH
    assert (prefill.speculative, prefill.draft_model) == ("none", None)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_both_modes_give_each_worker_role_the_same_engine(device: str) -> None:
    configs: dict[str, dict[str, EngineConfig]] = {}
    for mode in ("deployments", "ray"):
        configs[mode] = {role: engine_config_from_args(p.args)
                         for role, p in _by_role(_values(mode, device)).items()
                         if role != "router"}
    assert configs["deployments"] == configs["ray"]
    assert configs["ray"]["prefill"] != configs["ray"]["decode"]  # the roles' own values count


def test_defaults_leave_the_engine_its_own() -> None:
    """Values left at 0 / auto / none pass no flag: each process keeps its own default."""
    for mode in ("deployments", "ray"):
        values = load_values(QUICKSTART)
        values["mode"] = mode
        for role in ("prefill", "decode"):
            values[role]["threads"] = 0
            args = _by_role(values)[role].args
            config = engine_config_from_args(args)
            fresh = engine_config_from_args(_fresh_worker_args(role, args.model))
            assert config == fresh, (mode, role)


def _fresh_worker_args(role: str, model: str) -> Any:
    from decode_worker.cli import build_parser as decode_parser
    from prefill_worker.cli import build_parser as prefill_parser

    if role == "decode":
        return decode_parser().parse_args(["--port", "0", "--kv-port", "0", "--model", model])
    return prefill_parser().parse_args(["--port", "0", "--model", model])


def test_ray_mode_quotes_every_value_for_the_head_shell() -> None:
    values = _values("ray", "cpu")
    values["model"]["servedName"] = "my model"
    values["router"]["extraArgs"] = ["--k8s-selector=a in (b,c)"]
    (cluster,) = [o for o in objects(render(values)) if o["kind"] == "RayCluster"]
    script = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["args"][0]
    line = next(ln for ln in script.replace("\\\n", " ").splitlines()
                if ln.strip().startswith("tandem up"))
    argv = shlex.split(line)
    assert argv[argv.index("--model-name") + 1] == "my model"
    assert "--router-arg=--k8s-selector=a in (b,c)" in argv
    assert f"--decode-arg=--draft-model={ODD_PATH}" in argv


def test_draft_model_on_the_model_pvc_is_a_path_under_its_mount() -> None:
    values = _values("deployments", "cpu")
    values["model"]["pvc"] = {"enabled": True, "claimName": "models", "mountPath": "/models"}
    values["decode"]["speculative"] = {"method": "draft", "draftModel": "smollm2-draft"}
    values["decode"]["extraArgs"] = []
    decode = _by_role(values)["decode"].args
    assert (decode.speculative, decode.draft_model) == ("draft", "/models/smollm2-draft")
    assert decode.model == "/models/smollm2"


def _bad(mode: str, **roles: dict[str, Any]) -> dict[str, Any]:
    values = _values(mode, "cpu")
    for role, changes in roles.items():
        values[role].update(copy.deepcopy(changes))
    return values


GPU = {"resourceName": "nvidia.com/gpu", "count": 1}


@pytest.mark.parametrize("mode", ["deployments", "ray"])
@pytest.mark.parametrize(
    ("roles", "message"),
    [
        ({"decode": {"dtype": "float16"}},
         r"prefill.dtype \(bfloat16\) and decode.dtype \(float16\) must be equal"),
        ({"prefill": {"device": "cuda", "accelerator": {**GPU, "count": 4}}},
         r"prefill.accelerator.count: 4, but a worker runs on one device"),
        ({"decode": {"device": "cuda"}},
         r"decode.device is cuda but decode.accelerator.count is 0"),
        ({"decode": {"accelerator": GPU}},
         r"decode.device is cpu but decode.accelerator.count is 1"),
        ({"decode": {"speculative": {"method": "draft"}}},
         r"decode.speculative.method draft needs draftModel or draftLayers"),
    ],
    ids=["dtype-mismatch", "tensor-parallel", "cuda-without-gpu", "gpu-unused", "draft-nothing"],
)
def test_values_no_worker_could_serve_fail_the_render(
        mode: str, roles: dict[str, dict[str, Any]], message: str) -> None:
    with pytest.raises(helm.HelmError, match=message):
        render(_bad(mode, **roles))


def test_engine_values_are_checked_by_the_schema() -> None:
    for key, value, field in (("engine", {"quantization": "fp8"}, "/engine/quantization"),
                              ("engine", {"kvCacheDtype": "fp8"}, "/engine/kvCacheDtype"),
                              ("decode", {"maxNumSeqs": -1}, "/decode/maxNumSeqs"),
                              ("decode", {"speculative": {"method": "eagle"}},
                               "/decode/speculative/method")):
        values = load_values(QUICKSTART)
        values[key] = {**values.get(key, {}), **value}
        with pytest.raises(helm.HelmValuesError, match=field):
            render(values)
