"""scripts/bench_serve.py's sweep loop: a setup's processes start once for all its points, or
again for every point with --fresh-workers (the processes themselves are replaced by
recorders here: what is checked is when the loop starts and stops them); and --cores' split
of the cores between the prefill and the decode worker (bench/serving/setups.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench.serving.logs import PointLogs
from bench.serving.setups import core_split
from scripts import bench_serve
from tandem.loadgen.stats import RequestResult


class _Cluster:
    """Counts stops (the real Cluster starts the processes through start_warm)."""

    stops = 0

    def stop(self) -> None:
        _Cluster.stops += 1


@pytest.mark.parametrize(("fresh", "starts"), [(False, 2), (True, 6)])
def test_workers_start_once_per_setup_or_once_per_point(
        monkeypatch, tmp_path: Path, fresh: bool, starts: int) -> None:
    started: list[str] = []

    def start_warm(cluster, name, *args, **kwargs):
        started.append(name)
        return {"router": argparse.Namespace(grpc="router"), "decode": None}

    async def run_point(target, point, num_requests, **kwargs):
        return [RequestResult(0, "chat", True, output_tokens=4, ttft=0.1, e2e=0.4,
                              token_times=[0.1, 0.2, 0.3, 0.4])], 1.0

    _Cluster.stops = 0
    monkeypatch.setattr(bench_serve, "Cluster", _Cluster)
    monkeypatch.setattr(bench_serve, "start_warm", start_warm)
    monkeypatch.setattr(bench_serve, "run_point", run_point)
    monkeypatch.setattr(bench_serve, "wait_idle", lambda router: None)
    monkeypatch.setattr(bench_serve, "placement_decisions", lambda router: {})
    monkeypatch.setattr(bench_serve, "worker_reads", lambda procs: {})
    monkeypatch.setattr(bench_serve, "read_point_logs",
                        lambda folder, since, until: PointLogs(None, None, None))
    args = argparse.Namespace(mixes="chat", mix="chat", sweep="0.3,0.8,1.4", seed=0,
                              vocab="1000,30000", num_requests=1, scale=1.0, timeout=60.0,
                              out=tmp_path, slo_ttft=4.0, slo_tpot=0.25, fresh_workers=fresh)
    sweep = bench_serve.run_sweep(args, tmp_path, ["disagg", "disagg-remote"], [])
    assert len(started) == starts
    assert started == sorted(started)  # a setup's starts all come before the next setup's
    # every start is stopped: before each fresh start (a no-op the first time) and at the end
    assert _Cluster.stops == starts + 2
    assert set(sweep["summaries"]["disagg"]) == {"chat 0.3/s", "chat 0.8/s", "chat 1.4/s"}


def test_fresh_workers_needs_a_sweep() -> None:
    with pytest.raises(SystemExit):
        bench_serve.main(["--fresh-workers"])


@pytest.mark.parametrize(("cores", "split"), [(2, ("0-0", "1-1", "0-1")),
                                              (16, ("0-7", "8-15", "0-15"))])
def test_cores_split_prefill_first_half_decode_second(cores: int, split: tuple) -> None:
    assert core_split(cores) == split


@pytest.mark.parametrize("cores", [0, 1, 3, 15])
def test_cores_must_be_even_and_at_least_two(cores: int) -> None:
    with pytest.raises(ValueError, match="even number"):
        core_split(cores)
