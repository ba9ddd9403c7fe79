"""``--tensor-parallel-size`` on the launchers: per role, any size on ``tandem local`` and
``tandem up`` (a prefill group pushes to a decode group of another size), and what ``tandem
up`` asks Ray for: one actor per worker holding all its ranks' devices
(tandem/launcher/tensor_parallel.py, tandem/launcher/placement.py). No process is started."""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem.launcher import local, up
from tandem.launcher.argv import worker_argv
from tandem.launcher.placement import worker_resources
from tandem.launcher.spec import LaunchSpec
from tandem.launcher.tensor_parallel import group_size
from tandem.placement.slo import Slo
from tandem.planner.devices import get_device


def test_the_last_flag_given_wins_in_either_spelling() -> None:
    assert group_size([], []) == 1
    assert group_size(["--tensor-parallel-size=2"], ["--tensor-parallel-size", "3"]) == 3
    assert group_size(["--tensor-parallel-size", "4", "--num-blocks=9"]) == 4
    with pytest.raises(ValueError, match="'two'"):
        group_size(["--tensor-parallel-size=two"])


def _check_local(argv: list[str]) -> None:
    local._check_counts(local.build_parser().parse_args(argv))


def test_local_serves_a_group_colocated_and_per_role() -> None:
    _check_local(["--no-prefill", "--tensor-parallel-size", "3"])
    _check_local(["--no-prefill", "--decode-arg=--tensor-parallel-size=2"])
    _check_local(["--prefill-arg=--tensor-parallel-size=1", "--decode-arg=--num-blocks=64"])
    args = local.build_parser().parse_args(["--no-prefill", "--tensor-parallel-size", "2"])
    assert "--tensor-parallel-size=2" in local.worker_argv(args, "smollm2", 2)


@pytest.mark.parametrize("argv", [
    ["--tensor-parallel-size", "2"],
    ["--prefill-arg=--tensor-parallel-size=2", "--kv-cache-dtype", "float32"],
    ["--prefill-arg=--tensor-parallel-size=3", "--decode-arg=--tensor-parallel-size=1",
     "--worker-arg=--kv-cache-dtype=float16"],
    ["--worker-arg=--tensor-parallel-size=2", "--prefill-arg=--tensor-parallel-size=1",
     "--prefill-arg=--kv-cache-dtype=float32", "--decode-arg=--kv-cache-dtype=float32"],
])
def test_local_takes_groups_of_different_sizes_per_role(argv) -> None:
    _check_local(argv)


def test_roles_of_different_sizes_need_the_kv_cache_dtype_given() -> None:
    with pytest.raises(ValueError, match="need --kv-cache-dtype given"):
        _check_local(["--prefill-arg=--tensor-parallel-size=3"])
    with pytest.raises(ValueError, match="need --kv-cache-dtype given"):  # one role only
        _check_local(["--prefill-arg=--tensor-parallel-size=3",
                      "--prefill-arg=--kv-cache-dtype=float32"])


@pytest.mark.parametrize("argv", [["--decode-arg=--tensor-parallel-size=0"],
                                  ["--prefill-arg=--tensor-parallel-size=-2"],
                                  ["--prefill-arg=--tensor-parallel-size=two"]])
def test_local_refuses_a_size_that_is_no_group(argv) -> None:
    with pytest.raises(ValueError, match="tensor-parallel-size"):
        _check_local(argv)


def test_local_config_file_sets_the_group_size(tmp_path: Path) -> None:
    cfg = tmp_path / "local.yaml"
    cfg.write_text("tensor_parallel_size: 2\nnum_prefill: 0\n")
    args = local.build_parser().parse_args(["--config", str(cfg)])
    local._check_counts(args)
    assert "--tensor-parallel-size=2" in local.worker_argv(args, "smollm2", 1)


def _up_spec(argv: list[str]) -> LaunchSpec:
    return up.spec_from_args(up.build_parser().parse_args(argv), None)


def test_up_places_a_group_as_one_actor_of_all_its_devices() -> None:
    """Per role: a prefill worker of 4 ranks on 4 GPUs and a decode worker of 2 on 2; each
    one actor (one bundle) holding its group's GPUs and a CPU per rank, the flag in its
    argv; workers of groups do not flip roles."""
    spec = _up_spec(["--prefill-arg=--tensor-parallel-size=4",
                     "--decode-arg=--tensor-parallel-size=2", "--prefill-gpus", "4",
                     "--decode-gpus", "2"])
    assert (spec.prefill_ranks, spec.decode_ranks) == (4, 2)
    assert spec.bundle("prefill") == {"CPU": 4.0, "GPU": 4.0}
    assert spec.bundle("decode") == {"CPU": 2.0, "GPU": 2.0}
    assert worker_resources(spec, "prefill") == {"num_cpus": 4.0, "num_gpus": 4.0,
                                                 "resources": {}}
    argv = worker_argv(spec, "decode", "m")
    assert "--device" in argv and argv[-1] == "--tensor-parallel-size=2"
    assert not spec.flips and _up_spec([]).flips


def test_up_places_cpu_groups_by_rank() -> None:
    """On the CPU a rank is a process of its own: a worker asks Ray for --cpus-per-worker
    per rank, and a new local instance holds every rank's (tandem up's _local_cpus)."""
    argv = ["--tensor-parallel-size", "3", "--cpus-per-worker", "2", "--decode", "2",
            "--router-cpus", "1"]
    spec = _up_spec(argv)
    assert spec.bundle("decode") == {"CPU": 6.0} and worker_resources(spec, "decode")[
        "num_gpus"] == 0
    args = up.build_parser().parse_args(argv)
    assert up._local_cpus(args, spec) >= (1 + 2) * 3 * 2 + 1


@pytest.mark.parametrize("argv", [
    ["--tensor-parallel-size", "2", "--decode-gpus", "1"],
    ["--prefill-arg=--tensor-parallel-size=4", "--prefill-gpus", "0.5",
     "--kv-cache-dtype", "float32"],
])
def test_up_refuses_a_group_on_fewer_gpus_than_ranks(argv) -> None:
    with pytest.raises(ValueError, match="one whole GPU per rank"):
        _up_spec(argv)


def test_up_roles_of_different_sizes_need_the_kv_cache_dtype_on_the_cpu_only() -> None:
    with pytest.raises(ValueError, match="need --kv-cache-dtype given"):
        _up_spec(["--decode-arg=--tensor-parallel-size=2"])
    _up_spec(["--decode-arg=--tensor-parallel-size=2", "--kv-cache-dtype", "float32"])
    # on CUDA "auto" is the model's dtype whatever the group size
    _up_spec(["--decode-arg=--tensor-parallel-size=2", "--decode-gpus", "2",
              "--prefill-gpus", "1"])
    # no prefill workers: the decode group's size alone
    assert _up_spec(["--prefill", "0", "--decode-arg=--tensor-parallel-size=2"]).decode_ranks == 2


def test_up_refuses_a_bad_size_before_starting(capsys: pytest.CaptureFixture[str]) -> None:
    assert up.main(["--tensor-parallel-size", "0"]) == 2
    assert "tensor-parallel-size must be >= 1" in capsys.readouterr().err


def test_plan_flags_for_a_multi_gpu_worker_deploy_a_group() -> None:
    """``tandem plan``'s command line for a 4-GPU decode worker and a 1-GPU prefill one
    starts exactly those groups (the planner's GPU counts and tandem up's agree)."""
    from dataclasses import replace

    from tandem.planner.models import get_model
    from tandem.planner.report import up_flags
    from tandem.planner.roofline import roofline_profile
    from tandem.planner.search import Candidate

    small = roofline_profile(get_model("llama-3.1-8b"), get_device("H100-SXM"))
    big = replace(small, gpus_per_worker=4)
    cand = Candidate("disaggregated", 2, 3, 2 * 1 + 3 * 4, None, True)  # type: ignore[arg-type]
    flags = up_flags(cand, small, big, Slo(1.0, 0.05)).split()[2:]
    spec = _up_spec(flags)
    assert (spec.prefill, spec.decode) == (2, 3)
    assert spec.bundle("decode")["GPU"] == 4 and spec.decode_ranks == 4
    assert spec.bundle("prefill")["GPU"] == 1 and spec.prefill_ranks == 1


def test_workers_take_the_flag(tmp_path: Path) -> None:
    from tandem.engine.cli_args import engine_config_from_args
    from tandem.worker.decode.cli import build_parser as decode_parser
    from tandem.worker.prefill.cli import build_parser as prefill_parser

    assert decode_parser().parse_args(
        ["--port", "0", "--kv-port", "0", "--tensor-parallel-size", "2"]).tensor_parallel_size == 2
    cfg = tmp_path / "decode.yaml"
    cfg.write_text("tensor_parallel_size: 3\n")
    args = decode_parser().parse_args(["--config", str(cfg), "--port", "0", "--kv-port", "0"])
    assert engine_config_from_args(args).tensor_parallel_size == 3
    assert prefill_parser().parse_args(
        ["--port", "0", "--tensor-parallel-size", "2"]).tensor_parallel_size == 2


def test_pairs_of_groups_are_packed_only_where_one_node_holds_both() -> None:
    """Two 4-GPU groups pack on an 8-GPU node; two 8-GPU groups fit none of 8 (their pair
    group would never be placed), and a node's CPUs count too."""
    from tandem.launcher.placement import fits_one_node

    four = _up_spec(["--tensor-parallel-size", "4", "--prefill-gpus", "4", "--decode-gpus", "4"])
    eight = _up_spec(["--tensor-parallel-size", "8", "--prefill-gpus", "8",
                      "--decode-gpus", "8"])
    nodes = [{"CPU": 64.0, "GPU": 8.0}, {"CPU": 8.0, "GPU": 0.0}]
    assert fits_one_node([four.bundle("prefill"), four.bundle("decode")], nodes)
    assert not fits_one_node([eight.bundle("prefill"), eight.bundle("decode")], nodes)
    assert not fits_one_node([four.bundle("prefill"), four.bundle("decode")],
                             [{"CPU": 4.0, "GPU": 8.0}])


def test_expert_parallel_reaches_every_worker_from_flag_and_config_file(tmp_path: Path) -> None:
    """``--enable-expert-parallel`` (vLLM's flag) is an engine flag: ``tandem local`` and
    ``tandem up`` hand it to each worker beside the group size, from the command line or
    the config file; a launcher without it passes nothing (the worker's default: off)."""
    args = local.build_parser().parse_args(["--no-prefill", "--tensor-parallel-size", "2",
                                            "--enable-expert-parallel"])
    assert "--enable-expert-parallel" in local.worker_argv(args, "m", 2)
    cfg = tmp_path / "local.yaml"
    cfg.write_text("tensor_parallel_size: 3\nenable_expert_parallel: true\nnum_prefill: 0\n")
    from_file = local.build_parser().parse_args(["--config", str(cfg)])
    local._check_counts(from_file)
    assert {"--tensor-parallel-size=3", "--enable-expert-parallel"} <= set(
        local.worker_argv(from_file, "m", 1))
    spec = _up_spec(["--tensor-parallel-size", "2", "--enable-expert-parallel"])
    assert "--enable-expert-parallel" in worker_argv(spec, "decode", "m")
    assert "--enable-expert-parallel" not in worker_argv(_up_spec([]), "decode", "m")
