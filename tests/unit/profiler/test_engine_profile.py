"""tandem/profiler (engine_profile, engine_steps) and ``tandem profile``: a measured profile of
a real (tiny) engine."""

from __future__ import annotations

import json
from pathlib import Path

from tandem.cli.profile import main as profile_main
from tandem.planner.profile import Profile
from tandem.profiler.engine_profile import ProfileOptions, profile_engine
from tandem.profiler.engine_steps import measure_decode


def test_profile_of_a_tiny_engine_is_fitted_from_its_own_steps(make_engine, tiny_dir) -> None:
    engine = make_engine(model=str(tiny_dir()), max_num_seqs=8, max_num_batched_tokens=256,
                         num_blocks=64)
    profile = profile_engine(engine, ProfileOptions(repeats=1, quick=True, transfer=False),
                             label="tiny")
    assert profile.source == "measured" and profile.model == "tiny"
    assert profile.chunk_tokens == 256 and profile.max_num_seqs == 8
    assert profile.kv_capacity_tokens == 64 * 16 and profile.block_size == 16
    # 2 layers x (K + V) x 2 kv heads x 16 dims x 4 bytes (fp32)
    assert profile.kv_bytes_per_token == 2 * 2 * 2 * 16 * 4
    c = profile.step
    assert min(c.base_s, c.per_row_s, c.per_prefill_token_s, c.per_context_token_s) >= 0
    assert c.base_s + c.per_prefill_token_s > 0
    steps = profile.samples["steps"]
    assert len(steps) >= 10  # prefill, decode and mixed shapes, each timed
    assert any(rows == 0 and tokens > 0 for rows, tokens, *_ in steps)
    assert any(rows > 0 and tokens == 0 for rows, tokens, *_ in steps)
    assert any(rows > 0 and tokens > 0 for rows, tokens, *_ in steps)
    assert not engine.has_unfinished()


def test_decode_samples_have_the_rows_that_ran(make_engine, tiny_dir) -> None:
    """Eight 16-token prompts take eight 16-token steps to prefill, and the first ones decode
    meanwhile: each timed step must still run all eight rows (none finished early) and say
    so, with their context growing by a token a row."""
    from tandem.engine import SamplingParams

    engine = make_engine(model=str(tiny_dir()), max_num_seqs=8, max_num_batched_tokens=16,
                         num_blocks=64)

    def params(n: int) -> SamplingParams:
        return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)

    samples = measure_decode(engine, params, [8], [16], 3)
    assert [s.rows for s in samples] == [8, 8, 8]
    contexts = [s.context_tokens for s in samples]
    assert [b - a for a, b in zip(contexts, contexts[1:], strict=False)] == [8, 8]
    assert not engine.has_unfinished()


def test_rounds_are_fitted_by_their_median_step(make_engine, tiny_dir) -> None:
    """Two rounds over the same shapes: one sample per timed step (the median of its two
    timings), the spread between the rounds stored beside them."""
    engine = make_engine(model=str(tiny_dir()), max_num_seqs=8, max_num_batched_tokens=256,
                         num_blocks=64)
    one = profile_engine(engine, ProfileOptions(repeats=1, quick=True, transfer=False))
    two = profile_engine(engine, ProfileOptions(repeats=2, quick=True, transfer=False))
    shape = [step[:4] for step in one.samples["steps"]]
    assert [step[:4] for step in two.samples["steps"]] == shape
    assert two.samples["rounds"] == 2 and len(two.samples["round_spread"]) == len(shape)
    assert all(x >= 1.0 for x in two.samples["round_spread"])
    assert one.samples["round_spread"] == [1.0] * len(shape)
    assert "median of 2 rounds" in two.notes
    assert not engine.has_unfinished()


def test_tandem_profile_writes_a_loadable_profile(tiny_dir, tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    rc = profile_main(["--model", str(tiny_dir()), "--quick", "--no-transfer", "--out", str(out),
                       "--max-num-seqs", "4",
                       "--max-num-batched-tokens", "128", "--num-blocks", "32"])
    assert rc == 0
    loaded = Profile.load(out)
    assert loaded.chunk_tokens == 128 and loaded.kv_capacity_tokens == 32 * 16
    assert json.loads(out.read_text())["schema"] == "tandem.profile/1"


def test_tandem_profile_refuses_a_missing_model(tmp_path: Path, capsys) -> None:
    rc = profile_main(["--model", str(tmp_path / "nope"), "--out", str(tmp_path / "p.json")])
    assert rc == 2
    assert "nope" in capsys.readouterr().err
    assert not (tmp_path / "p.json").exists()


def test_tandem_profile_of_a_tensor_parallel_group(tiny_dir, tmp_path: Path) -> None:
    """``--tensor-parallel-size 2``: the profile is a worker of two devices, its KV bytes a
    rank's (the tiny model's 2 KV heads, one a rank), and the group's other rank is stopped
    once the profile is written."""
    import psutil

    out = tmp_path / "p.json"
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    rc = profile_main(["--model", str(tiny_dir()), "--quick", "--no-transfer", "--out", str(out),
                       "--max-num-seqs", "4", "--max-num-batched-tokens", "128",
                       "--num-blocks", "32", "--tensor-parallel-size", "2", "--dtype",
                       "float32", "--threads", "2"])
    assert rc == 0
    loaded = Profile.load(out)
    assert loaded.gpus_per_worker == 2 and "tensor-parallel-size=2" in loaded.notes
    # 2 layers x (K + V) x 1 kv head x 16 dims x 4 bytes (fp32): half the one-rank cache's
    assert loaded.kv_bytes_per_token == 2 * 2 * 1 * 16 * 4
    assert loaded.kv_capacity_tokens == 32 * 16
    left = {p.pid for p in psutil.Process().children(recursive=True)} - before
    assert left == set(), f"ranks left running: {left}"
