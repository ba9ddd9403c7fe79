"""``tandem local --flippable``: its workers are the runtime that serves either role, and the
core share (lender and borrower are the two roles) is off."""

from __future__ import annotations

from tandem.launcher.local import build_parser, lends_cores, worker_commands


def test_flippable_workers_start_in_their_role_and_lend_no_cores() -> None:
    commands = worker_commands(True)
    for role in ("decode", "prefill"):
        assert commands[role][:3] == ("tandem.worker.dual", "--role", role)
    assert not lends_cores(build_parser().parse_args(["--flippable"]))
    assert lends_cores(build_parser().parse_args([]))
    assert worker_commands(False)["prefill"][0] == "tandem.worker.prefill"
