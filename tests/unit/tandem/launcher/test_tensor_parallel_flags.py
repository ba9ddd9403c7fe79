"""``--tensor-parallel-size`` on the launchers: per role, any size on ``tandem local`` (a
prefill group pushes to a decode group of another size), refused on ``tandem up`` until its
placement is built (tandem/launcher/tensor_parallel.py). No process is started."""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem.launcher import local, up
from tandem.launcher.tensor_parallel import group_size


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


def test_up_refuses_a_group_by_name() -> None:
    args = up.build_parser().parse_args(["--tensor-parallel-size", "2"])
    with pytest.raises(ValueError, match="placement group"):
        up.spec_from_args(args, None)
    ok = up.build_parser().parse_args(["--tensor-parallel-size", "1"])
    assert "--tensor-parallel-size=1" in up.spec_from_args(ok, None).worker_args


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
