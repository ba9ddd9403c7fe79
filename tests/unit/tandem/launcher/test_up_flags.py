"""``tandem up`` flags -> LaunchSpec: resources, bundles, and refusals (no Ray started)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem.autoscaler.config import load_config
from tandem.common.security.credential import generate_secret_file
from tandem.launcher.argv import worker_argv
from tandem.launcher.spec import LaunchSpec
from tandem.launcher.up import _check_public_bind, build_parser, main, spec_from_args

EXAMPLES = Path(__file__).resolve().parents[4] / "deploy" / "autoscale"


def test_flags_become_a_spec_with_bundles() -> None:
    args = build_parser().parse_args([
        "--model", "smollm2", "--prefill", "2", "--decode", "3", "--prefill-gpus", "1",
        "--cpus-per-worker", "2", "--resources", '{"accel": 1}', "--worker-arg=--num-blocks=64",
        "--router-arg=--max-inflight=9", "--detach", "--address", "auto", "--threads", "4",
    ])
    auto = load_config(EXAMPLES / "slo.yaml")
    spec = spec_from_args(args, auto)
    assert (spec.prefill, spec.decode, spec.port, spec.http_port) == (2, 3, 50051, 8000)
    assert spec.bundle("prefill") == {"CPU": 2.0, "GPU": 1.0, "accel": 1.0}
    assert spec.bundle("decode") == {"CPU": 2.0, "accel": 1.0}
    assert spec.worker_args == ("--num-blocks=64",) and spec.router_args == ("--max-inflight=9",)
    assert spec.signal_window_s == auto.window_s and spec.detach and spec.threads == 4


@pytest.mark.parametrize("bad", ['{"accel": "x"}', "[1]", "{oops"])
def test_bad_resources_are_refused(bad: str) -> None:
    args = build_parser().parse_args(["--resources", bad])
    with pytest.raises(ValueError, match="--resources"):
        spec_from_args(args, None)


def test_spec_validates_counts() -> None:
    with pytest.raises(ValueError, match="decode"):
        LaunchSpec(decode=0)
    with pytest.raises(ValueError, match="port"):
        LaunchSpec(port=70000)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--detach"], "--detach needs --address"),
        (["--autoscale", "/nonexistent.yaml"], "cannot read"),
        (["--decode", "0"], "decode"),
    ],
)
def test_up_exits_2_before_starting_anything(argv: list[str], message: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("cores,argv,want", [
    (2, [], 1),                                   # (make serve's 1+1 pair gets lend_cores)
    (16, [], 8),
    (16, ["--prefill", "3", "--decode", "1"], 4),
    (1, ["--prefill", "2", "--decode", "2"], 1),  # never below one
])
def test_local_threads_share_the_cores(cores: int, argv: list[str], want: int):
    from tandem.launcher import up

    spec = up.share_threads(spec_from_args(build_parser().parse_args(argv), None), cores)
    assert spec.threads == want


def test_local_threads_count_autoscale_maximums() -> None:
    from tandem.launcher import up

    auto = load_config(EXAMPLES / "slo.yaml")
    spec = up.share_threads(spec_from_args(build_parser().parse_args([]), auto), 16)
    assert spec.threads == max(1, 16 // (auto.prefill.max + auto.decode.max))


def test_local_threads_are_shared_by_rank_and_given_per_worker() -> None:
    """12 cores, a prefill worker of 1 rank and a decode worker of 3: 3 cores a rank, the
    decode worker's --threads its ranks' total (the engine splits it among them); the
    role's own --threads still wins (it comes last)."""
    from tandem.launcher import up

    argv = ["--decode-arg=--tensor-parallel-size=3", "--kv-cache-dtype", "float32",
            "--prefill-arg=--threads=5"]
    spec = up.share_threads(spec_from_args(build_parser().parse_args(argv), None), 12)
    assert spec.threads is None and not up._one_local_pair(spec)
    prefill = worker_argv(spec, "prefill", "m")
    decode = worker_argv(spec, "decode", "m")
    assert decode[decode.index("--threads") + 1] == "9"
    assert prefill[prefill.index("--threads") + 1] == "3" and prefill[-1] == "--threads=5"


@pytest.mark.parametrize("flag", [["--worker-arg=--threads=8"], ["--worker-arg=--threads",
                                                                 "--worker-arg=8"]])
def test_a_worker_arg_threads_is_left_to_every_worker(flag: list[str]) -> None:
    """The user's --worker-arg=--threads is every worker's, tensor-parallel groups too: no
    share of the cores is computed beside it (the role args come last and would win)."""
    from tandem.launcher import up

    argv = ["--decode-arg=--tensor-parallel-size=2", "--kv-cache-dtype", "float32", *flag]
    spec = up.share_threads(spec_from_args(build_parser().parse_args(argv), None), 12)
    for role in ("prefill", "decode"):
        args = worker_argv(spec, role, "m")
        assert [a for a in args if a.startswith("--threads")] == (
            ["--threads=8"] if len(flag) == 1 else ["--threads"])


def test_every_cluster_gets_a_credential(tmp_path: Path) -> None:
    """A new secret per cluster by default, the user's file when named, none only when asked;
    the secret never shows in the spec's repr."""
    fresh = spec_from_args(build_parser().parse_args([]), None)
    again = spec_from_args(build_parser().parse_args([]), None)
    assert len(fresh.cluster_secret) == 64 and fresh.cluster_secret != again.cluster_secret
    assert fresh.cluster_secret not in repr(fresh) and not fresh.insecure
    mine = generate_secret_file(tmp_path / "secret")
    named = spec_from_args(build_parser().parse_args(["--cluster-secret-file", str(mine)]), None)
    assert named.cluster_secret == mine.read_text().strip()
    insecure = spec_from_args(build_parser().parse_args(["--insecure"]), None)
    assert insecure.insecure and insecure.cluster_secret == ""
    with pytest.raises(ValueError, match="exclude each other"):
        spec_from_args(build_parser().parse_args(
            ["--insecure", "--cluster-secret-file", str(mine)]), None)
    mine.chmod(0o644)
    with pytest.raises(ValueError, match="other users"):
        spec_from_args(build_parser().parse_args(["--cluster-secret-file", str(mine)]), None)
    with pytest.raises(ValueError, match="cluster secret"):
        LaunchSpec()  # neither a secret nor insecure


def test_an_actors_credential_file_lives_only_while_its_flags_are_read() -> None:
    """The router and worker actors hand the secret to their parsers through a private file
    (never an argv); it and its folder are gone once the block that reads them ends, so
    clusters started and stopped leave no secrets behind in the temp folder."""
    from tandem.common.security.credential import ClusterCredential, new_secret
    from tandem.launcher.argv import credential_argv
    from tandem.launcher.router_actor import router_config

    secret = new_secret()
    with credential_argv(secret) as flags:
        assert flags[0] == "--cluster-secret-file" and secret not in flags
        path = Path(flags[1])
        assert ClusterCredential.from_file(path).kv_secret == ClusterCredential.from_hex(secret).kv_secret
        assert oct(path.parent.stat().st_mode & 0o777) == "0o700"
    assert not path.parent.exists()
    with credential_argv("") as flags:
        assert flags == ["--insecure"]
    before = set(Path(path.parent.parent).glob("tandem-credential-*"))
    config, security = router_config(["--model", "smollm2"], secret)
    assert security.credential.kv_secret == ClusterCredential.from_hex(secret).kv_secret
    assert set(Path(path.parent.parent).glob("tandem-credential-*")) == before
    assert not Path(config.cluster_secret_file).exists()


def test_a_public_router_needs_keys_or_an_explicit_allow(capsys) -> None:
    assert main(["--host", "0.0.0.0"]) == 2
    assert "without API keys" in capsys.readouterr().err
    for extra in (["--router-arg=--allow-unauthenticated"],
                  ["--router-arg=--api-key-file=/keys"]):
        spec = spec_from_args(build_parser().parse_args(["--host", "0.0.0.0", *extra]), None)
        _check_public_bind(spec)  # no error
    _check_public_bind(spec_from_args(build_parser().parse_args([]), None))  # loopback default
    for host in ("::1", "[::1]", "localhost", "127.0.0.2"):  # loopback as the router reads it
        _check_public_bind(spec_from_args(build_parser().parse_args(["--host", host]), None))


def test_make_serves_pair_is_laid_out_as_tandem_local(tmp_path: Path) -> None:
    """One prefill + one decode worker on a local instance: prefill every core, decode a
    quarter and the core share (tandem/worker/core_lending.py); a role's own flags still win."""
    from tandem.launcher import up
    from tandem.launcher.argv import worker_argv

    spec = spec_from_args(build_parser().parse_args(["--decode-arg=--threads=2"]), None)
    assert up._one_local_pair(spec)
    laid = up.lend_cores(spec, tmp_path / "core-share", cores=16)
    prefill, decode = (worker_argv(laid, role, "m") for role in ("prefill", "decode"))
    for argv in (prefill, decode):
        assert argv[argv.index("--core-share") + 1] == str(tmp_path / "core-share")
    assert [a for a in prefill if a.startswith("--threads")] == ["--threads"]
    assert prefill[prefill.index("--threads") + 1] == "16"
    # the quarter first, the user's --decode-arg last (the parser keeps the last)
    assert decode[decode.index("--threads") + 1] == "4" and decode[-1] == "--threads=2"


@pytest.mark.parametrize("argv", [["--prefill", "2"], ["--decode", "2"], ["--prefill", "0"],
                                  ["--decode-gpus", "1"]])
def test_other_layouts_share_no_cores(argv: list[str]) -> None:
    from tandem.launcher import up

    assert not up._one_local_pair(spec_from_args(build_parser().parse_args(argv), None))
