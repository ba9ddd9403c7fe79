"""What the chart's values make of the router and the workers, in both modes: each setting
reaches the process it is for, parsed by that process's real CLI (in ray mode through
``tandem up``'s own code), and values no process could serve fail the render. Engine values,
then logging / tracing / metric names (every process), then the router's model."""

from __future__ import annotations

import copy
import shlex
from typing import Any

import helm_python as helm
import pytest

from tandem.common.obs.tracing_setup import TracingConfig, tracing_config_from_args
from tandem.engine.cli_args import engine_config_from_args
from tandem.engine.config import EngineConfig
from tandem.router.cli import model_files
from tests.helm.chart import (
    EXAMPLES,
    Launched,
    launched,
    load_values,
    objects,
    pod_specs,
    render,
    validate,
)

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
    from tandem.worker.decode.cli import build_parser as decode_parser
    from tandem.worker.prefill.cli import build_parser as prefill_parser

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
        ({"decode": {"device": "cuda"}},
         r"decode.device is cuda but decode.accelerator.count is 0"),
        ({"decode": {"accelerator": GPU}},
         r"decode.device is cpu but decode.accelerator.count is 1"),
        ({"decode": {"speculative": {"method": "draft"}}},
         r"decode.speculative.method draft needs draftModel or draftLayers"),
    ],
    ids=["dtype-mismatch", "cuda-without-gpu", "gpu-unused", "draft-nothing"],
)
def test_values_no_worker_could_serve_fail_the_render(
        mode: str, roles: dict[str, dict[str, Any]], message: str) -> None:
    with pytest.raises(helm.HelmError, match=message):
        render(_bad(mode, **roles))


# ------------------------------------------------------------ tensor-parallel workers


@pytest.mark.parametrize("mode", ["deployments", "ray"])
@pytest.mark.parametrize("counts", [(8, 8), (8, 2)], ids=["both-8", "prefill-8-decode-2"])
def test_a_worker_of_several_accelerators_is_a_tensor_parallel_group(
        mode: str, counts: tuple[int, int]) -> None:
    """``accelerator.count`` N > 1: every object renders valid (the CRD schemas for the
    RayCluster), each worker's process is a group of N ranks (parsed by its real CLI; in
    ray mode through tandem up's own code, whose actor asks Ray for N GPUs and N CPUs), its
    pod holds N accelerators (a Ray node offering N GPUs and N CPUs) and a memory-backed
    /dev/shm for NCCL. ``accelerator.expertParallel`` (prefill's here) makes its group hold
    whole experts per rank (--enable-expert-parallel), the other role's stays expert-sliced."""
    values = _values(mode, "cuda")
    for role, count in zip(("prefill", "decode"), counts, strict=True):
        values[role]["accelerator"] = {**GPU, "count": count,
                                       "expertParallel": role == "prefill"}
    objs = objects(render(values))
    for obj in objs:
        validate(obj)
    procs = {p.role: p for p in launched(objs)}
    for role, count in zip(("prefill", "decode"), counts, strict=True):
        args = procs[role].args
        assert (args.tensor_parallel_size, args.device) == (count, "cuda"), role
        config = engine_config_from_args(args)
        assert config.tensor_parallel_size == count
        assert config.enable_expert_parallel == (role == "prefill"), role
    pods = {role: (group, pod) for role, group, pod in _worker_pods(objs)}
    for role, count in zip(("prefill", "decode"), counts, strict=True):
        group, pod = pods[role]
        container = pod["containers"][0]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == count
        assert container["resources"]["requests"]["nvidia.com/gpu"] == count
        shm = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}["dshm"]
        assert shm == "/dev/shm"
        (dshm,) = [v for v in pod["volumes"] if v["name"] == "dshm"]
        assert dshm["emptyDir"]["medium"] == "Memory"
        if mode == "ray":
            assert group["rayStartParams"]["num-gpus"] == str(count)
            assert group["rayStartParams"]["num-cpus"] == str(count)
    if mode == "ray":
        spec = _ray_spec(objs)
        for role, count in zip(("prefill", "decode"), counts, strict=True):
            assert spec.bundle(role) == {"CPU": float(count), "GPU": float(count)}


@pytest.mark.parametrize("mode", ["deployments", "ray"])
def test_a_first_layers_draft_in_a_tensor_parallel_worker_fails_the_render(mode: str) -> None:
    """draftLayers (the target's own first layers as the draft) with decode.accelerator.count
    8 fails at template time, naming the fix, as the engine would refuse it at start: the
    same decode flags at one accelerator render, and the engine refuses them with
    --tensor-parallel-size 8. A draft checkpoint in a group of 8 renders and parses."""
    values = _values(mode, "cuda")
    values["decode"].update(extraArgs=[], speculative={"method": "draft", "draftLayers": 2})
    one = {p.role: p for p in launched(objects(render(values)))}["decode"].args
    assert engine_config_from_args(one).speculative.draft_layers == 2
    one.tensor_parallel_size = 8
    with pytest.raises(ValueError, match="does not run in a tensor-parallel group"):
        engine_config_from_args(one)
    values["decode"]["accelerator"] = {**GPU, "count": 8}
    with pytest.raises(helm.HelmError, match=(
            r"decode.speculative.draftLayers 2 \(a draft of the target's own first layers\) "
            r"does not run with decode.accelerator.count 8: .* Set "
            r"decode.speculative.draftModel")):
        render(values)
    values["decode"]["speculative"] = {"method": "draft", "draftModel": "smollm2-draft"}
    args = {p.role: p for p in launched(objects(render(values)))}["decode"].args
    config = engine_config_from_args(args)
    assert (config.tensor_parallel_size, config.speculative.draft_model) == (
        8, "smollm2-draft")


def test_one_accelerator_a_worker_stays_one_rank() -> None:
    for mode in ("deployments", "ray"):
        objs = objects(render(_values(mode, "cuda")))
        for role, p in {p.role: p for p in launched(objs)}.items():
            if role != "router":
                assert p.args.tensor_parallel_size == 1, (mode, role)
        for _, _, pod in _worker_pods(objs):
            assert all(v["name"] != "dshm" for v in pod.get("volumes", []))


def _worker_pods(objs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(role, its Ray worker group or Deployment, its pod spec) of each worker role."""
    out = []
    for obj in objs:
        if obj["kind"] == "RayCluster":
            out += [(g["groupName"], g, g["template"]["spec"])
                    for g in obj["spec"]["workerGroupSpecs"]]
        elif obj["kind"] == "Deployment":
            role = obj["metadata"]["labels"]["app.kubernetes.io/component"]
            if role in ("prefill", "decode"):
                out.append((role, obj, obj["spec"]["template"]["spec"]))
    return out


def _ray_spec(objs: list[dict[str, Any]]) -> Any:
    """The LaunchSpec tandem up builds from the Ray head's command line."""
    from tandem.launcher.up import build_parser, spec_from_args

    (cluster,) = [o for o in objs if o["kind"] == "RayCluster"]
    script = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["args"][0]
    line = next(ln for ln in script.replace("\\\n", " ").splitlines()
                if ln.strip().startswith("tandem up"))
    args = build_parser().parse_args(shlex.split(line.rstrip("& "))[2:])
    args.cluster_secret_file, args.insecure = None, True
    return spec_from_args(args, None)


def test_engine_values_are_checked_by_the_schema() -> None:
    for key, value, field in (("engine", {"quantization": "nvfp4"}, "/engine/quantization"),
                              ("engine", {"kvCacheDtype": "fp8_e5m2"}, "/engine/kvCacheDtype"),
                              ("decode", {"maxNumSeqs": -1}, "/decode/maxNumSeqs"),
                              ("decode", {"speculative": {"method": "eagle"}},
                               "/decode/speculative/method")):
        values = load_values(QUICKSTART)
        values[key] = {**values.get(key, {}), **value}
        with pytest.raises(helm.HelmValuesError, match=field):
            render(values)


# ------------------------------------------------------------ logs, traces, metric names

OBSERVABILITY = {"logFormat": "json", "logLevel": "debug",
                 "tracing": {"otlpEndpoint": "http://otel-collector.monitoring:4317",
                             "otlpProtocol": "http", "sampleRatio": 0.25}}


@pytest.mark.parametrize("mode", ["deployments", "ray"])
def test_logging_tracing_and_metric_names_reach_every_process(mode: str) -> None:
    values = _values(mode, "cpu")
    values["observability"] = copy.deepcopy(OBSERVABILITY)
    values["metrics"] = {"compat": "none"}
    procs = _by_role(values)
    expected = TracingConfig(otlp_endpoint="http://otel-collector.monitoring:4317",
                             otlp_protocol="http", sample_ratio=0.25)
    for role, proc in procs.items():
        args = proc.args
        assert (args.log_format, args.log_level, args.metrics_compat) == (
            "json", "DEBUG", "none"), role
        # What the process builds its tracer from (no OTEL_* variables in the pod).
        assert tracing_config_from_args(args, env={}) == expected, role
    # The engine values still reach the workers next to them.
    assert procs["decode"].args.max_num_seqs == 96


@pytest.mark.parametrize("mode", ["deployments", "ray"])
def test_observability_defaults_pass_no_flag(mode: str) -> None:
    """Left at their defaults (text, INFO, no endpoint, vllm names), the values pass nothing:
    every process parses as it would with no flag, tracing off."""
    values = load_values(QUICKSTART)
    values["mode"] = mode
    for role, proc in _by_role(values).items():
        args = proc.args
        assert (args.log_format, args.log_level, args.metrics_compat) == (
            "text", "INFO", "vllm"), role
        assert (args.otlp_endpoint, args.otlp_protocol, args.trace_sample_ratio) == (
            "", None, 1.0), role
        assert not tracing_config_from_args(args, env={}).enabled, role


def test_ray_mode_json_logs_reach_the_head_log_one_per_line() -> None:
    """In ray mode the router and the workers are actors whose lines Ray prints in the head
    pod's log: with json logs the head asks Ray for no colour codes and no folding of alike
    lines (the names are Ray's own, read where it prints the actors' lines)."""
    import inspect

    from ray._private import ray_constants, worker

    def head_env(log_format: str) -> dict[str, str]:
        values = load_values(QUICKSTART)
        values.update(mode="ray", observability={"logFormat": log_format})
        (cluster,) = [o for o in objects(render(values)) if o["kind"] == "RayCluster"]
        env = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]
        return {e["name"]: e["value"] for e in env if "value" in e}

    ray_env = {"RAY_COLOR_PREFIX": "0", "RAY_DEDUP_LOGS": "0"}
    assert ray_env.items() <= head_env("json").items()
    assert not ray_env.keys() & head_env("text").keys()
    assert '"RAY_COLOR_PREFIX"' in inspect.getsource(worker.print_worker_logs)
    assert '"RAY_DEDUP_LOGS"' in inspect.getsource(ray_constants)


def test_tracing_values_without_an_endpoint_turn_nothing_on() -> None:
    values = load_values(QUICKSTART)
    values["observability"] = {"tracing": {"otlpEndpoint": "", "otlpProtocol": "http",
                                           "sampleRatio": 0.5}}
    for role, proc in _by_role(values).items():
        assert not tracing_config_from_args(proc.args, env={}).enabled, role
        assert proc.args.trace_sample_ratio == 1.0, role


@pytest.mark.parametrize(
    ("observability", "field"),
    [({"logFormat": "logfmt"}, "/observability/logFormat"),
     ({"logLevel": "TRACE"}, "/observability/logLevel"),
     ({"tracing": {"otlpEndpoint": "otel-collector:4317"}}, "/observability/tracing/otlpEndpoint"),
     ({"tracing": {"otlpEndpoint": "http://otel:4317 --insecure"}},
      "/observability/tracing/otlpEndpoint"),
     ({"tracing": {"otlpProtocol": "http/protobuf"}}, "/observability/tracing/otlpProtocol"),
     ({"tracing": {"sampleRatio": 1.5}}, "/observability/tracing/sampleRatio"),
     ({"tracing": {"headers": {}}}, "/observability/tracing")],
    ids=["format", "level", "no-scheme", "space", "protocol", "ratio", "unknown-key"],
)
def test_observability_values_are_checked_by_the_schema(
        observability: dict[str, Any], field: str) -> None:
    values = load_values(QUICKSTART)
    values["observability"] = observability
    with pytest.raises(helm.HelmValuesError, match=field):
        render(values)
    values = load_values(QUICKSTART)
    values["metrics"] = {"compat": "prometheus"}
    with pytest.raises(helm.HelmValuesError, match="/metrics/compat"):
        render(values)


# ------------------------------------------------------------ the router's model


@pytest.mark.parametrize("pvc", [False, True], ids=["alias", "pvc"])
@pytest.mark.parametrize("mode", ["deployments", "ray"])
def test_the_router_reads_the_model_the_workers_serve(mode: str, pvc: bool) -> None:
    """The router gets --model as the workers do and reads only its tokenizer itself
    (tandem/router/model_files.py): no init container converts the model for it, no volume carries
    tokenizer files to it."""
    values = load_values(QUICKSTART)
    values["mode"] = mode
    if pvc:
        values["model"]["pvc"] = {"enabled": True, "claimName": "models"}
    procs = _by_role(values)
    router = procs["router"].args
    assert router.model == procs["prefill"].args.model == procs["decode"].args.model
    assert router.model == ("/models/smollm2" if pvc else "smollm2")
    assert router.tokenizer == ""
    for obj in objects(render(values)):
        for component, _, spec in pod_specs(obj):
            assert "initContainers" not in spec
            # emptyDirs: only the scratch space of a read-only root filesystem (/tmp, home).
            assert {v["name"] for v in spec.get("volumes", []) if "emptyDir" in v} == {
                "tmp", "home"}
            if component == "router":  # the router's pod (ray: the head) sees the model there
                mounts = spec["containers"][0].get("volumeMounts", [])
                assert any(m["mountPath"] == "/models" for m in mounts) == pvc


@pytest.mark.parametrize("mode", ["deployments", "ray"])
def test_a_tokenizer_directory_reaches_the_router_only(mode: str) -> None:
    values = load_values(QUICKSTART)
    values["mode"] = mode
    values["model"]["tokenizer"] = "/opt/tokenizers/it's smol"
    procs = _by_role(values)
    assert procs["router"].args.tokenizer == "/opt/tokenizers/it's smol"
    assert procs["router"].args.model == "smollm2"
    for role in ("prefill", "decode"):
        assert not hasattr(procs[role].args, "tokenizer") or not procs[role].args.tokenizer
    # The router's own resolution: --tokenizer names the files, --model the default id.
    directory, name = model_files(procs["router"].args.model, procs["router"].args.tokenizer)
    assert (str(directory), name) == ("/opt/tokenizers/it's smol", "smollm2")


def test_a_gguf_models_served_name_is_its_stem_as_the_processes_pick_it() -> None:
    from tandem.common.model_spec import served_name

    values = load_values(QUICKSTART)
    values["model"] = {"name": "ggufs/qwen2.5-0.5b-instruct-q4_0.gguf",
                       "pvc": {"enabled": True, "claimName": "models"}}
    procs = _by_role(values)
    assert procs["router"].args.model_name == served_name(procs["router"].args.model) == (
        "qwen2.5-0.5b-instruct-q4_0")
    assert procs["decode"].args.served_model_name == procs["router"].args.model_name
