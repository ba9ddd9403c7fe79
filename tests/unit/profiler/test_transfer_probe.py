"""tandem/profiler/transfer_probe.py's secret handling, without a child: a fresh random
secret per run, read back from one hex line, and no built-in secret to fall back on."""

from __future__ import annotations

import io

import pytest

from tandem.profiler import transfer_probe


def test_each_run_draws_its_own_secret() -> None:
    drawn = {transfer_probe.new_secret() for _ in range(8)}
    assert len(drawn) == 8 and all(len(s) == transfer_probe.SECRET_BYTES >= 16 for s in drawn)


def test_the_child_reads_the_secret_from_one_hex_line() -> None:
    secret = transfer_probe.new_secret()
    assert transfer_probe.read_secret(io.BytesIO(secret.hex().encode() + b"\n")) == secret
    for bad in (b"", b"\n", b"zz" * 16 + b"\n", b"ab" * 15 + b"\n"):
        with pytest.raises(SystemExit, match="secret"):
            transfer_probe.read_secret(io.BytesIO(bad))


def test_no_secret_is_built_in() -> None:
    constants = {name: value for name, value in vars(transfer_probe).items()
                 if isinstance(value, bytes | str) and not name.startswith("__")}
    assert not [name for name in constants if "SECRET" in name.upper()]
    assert not [name for name, value in constants.items()
                if isinstance(value, bytes) and len(value) >= 16]
