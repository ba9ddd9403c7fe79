"""tandem/profiler/transfer_probe.py with its real receiver child: the transfer lands byte for
byte, and the run's secret is fresh, reaches the child on its stdin and never on its command
line; a child started without one refuses to run."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import pytest

from tandem.profiler import transfer_probe


def test_a_transfer_lands_with_a_fresh_secret_off_the_command_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    secrets: list[bytes] = []
    argvs: list[tuple[Any, ...]] = []
    new_secret, spawn = transfer_probe.new_secret, asyncio.create_subprocess_exec

    def recorded_secret() -> bytes:
        secrets.append(new_secret())
        return secrets[-1]

    async def recorded_spawn(*argv: Any, **kwargs: Any) -> asyncio.subprocess.Process:
        argvs.append(argv)
        return await spawn(*argv, **kwargs)

    monkeypatch.setattr(transfer_probe, "new_secret", recorded_secret)
    monkeypatch.setattr(asyncio, "create_subprocess_exec", recorded_spawn)
    src = transfer_probe.make_cache(fill=True)
    # run_ours raises unless the child's digest of the landed blocks equals the source's.
    samples = [asyncio.run(transfer_probe.run_ours("tcp", 1, src)) for _ in range(2)]
    assert all(s.gbps > 0 and s.rx_cpu_per_gib > 0 for s in samples)
    assert len(secrets) == 2 and secrets[0] != secrets[1]  # one per run
    assert all(len(s) >= 16 for s in secrets)
    assert [argv[1:3] for argv in argvs] == [("-m", "tandem.profiler.transfer_probe")] * 2
    for argv, secret in zip(argvs, secrets, strict=True):
        assert not [a for a in argv if secret.hex() in str(a) or secret.hex().upper() in str(a)]


def test_the_child_refuses_to_run_without_a_secret() -> None:
    for stdin in (b"", b"not hex\n", b"00" * 8 + b"\n"):  # none, garbage, too short
        out = subprocess.run(
            [sys.executable, "-m", "tandem.profiler.transfer_probe", "tcp", "1", "shuffled"],
            input=stdin, capture_output=True, timeout=120,
            cwd=transfer_probe.Path(transfer_probe.__file__).resolve().parents[2])
        assert out.returncode != 0
        assert b"secret" in out.stderr and b"endpoint" not in out.stdout
