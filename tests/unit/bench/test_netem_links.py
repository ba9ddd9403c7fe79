"""The slow-link benchmark's harness: the shaped namespaces it builds carry TCP between
them, and removing them leaves nothing behind (skipped where namespaces cannot be made)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench.serving.netem_links import (
    _CLEANUPS,
    SUBNET,
    LinkedNamespaces,
    _cleanup,
    leftovers,
    table,
    unavailable,
)

WHY = unavailable() if sys.platform == "linux" else "network namespaces are Linux's"

# A one-connection TCP echo across the link: the prefill side listens, the decode side sends.
SERVER = (
    "import socket, sys\n"
    "s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(1)\n"
    "print(s.getsockname()[1], flush=True)\n"
    "c, _ = s.accept(); c.sendall(c.recv(64)); c.close()\n"
)
CLIENT = (
    "import socket, sys\n"
    "c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=20)\n"
    "c.sendall(b'over the veth'); print(c.recv(64).decode())\n"
)


@pytest.mark.skipif(WHY is not None, reason=f"cannot build shaped namespaces here: {WHY}")
def test_built_namespaces_carry_tcp_and_are_removed_without_a_trace() -> None:
    ns = LinkedNamespaces(1.0, rtt_ms=1.0, tag="tlktest")
    assert leftovers(ns.tag) == []
    ns.build()
    server = None
    try:
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                               check=True).stdout
        assert ns.decode_ns in names and ns.prefill_ns in names
        shown = ns.qdiscs()
        assert "rate 1Gbit" in shown  # tbf, or netem with its rate where sch_netem exists
        server = subprocess.Popen([*ns.wrap("p"), sys.executable, "-c", SERVER, SUBNET[1]],
                                  stdout=subprocess.PIPE, text=True)
        assert server.stdout is not None
        port = server.stdout.readline().strip()
        echo = subprocess.run([*ns.wrap("d"), sys.executable, "-c", CLIENT, SUBNET[1], port],
                              capture_output=True, text=True, timeout=60, check=True)
        assert echo.stdout.strip() == "over the veth"
        assert server.wait(timeout=30) == 0
    finally:
        if server is not None and server.poll() is None:
            server.kill()
            server.wait(timeout=30)
        ns.remove()
    assert leftovers(ns.tag) == []
    ns.remove()  # idempotent


@pytest.mark.skipif(WHY is not None, reason=f"cannot build shaped namespaces here: {WHY}")
def test_the_exit_cleanups_remove_a_build_left_standing() -> None:
    """What an interrupted run leaves (namespaces built, no ``remove`` reached) goes with the
    cleanups that the signal handlers and atexit run."""
    ns = LinkedNamespaces(10.0, tag="tlktest2").build()
    assert ns.remove in _CLEANUPS
    assert leftovers(ns.tag) != []
    _cleanup()
    assert leftovers(ns.tag) == [] and not _CLEANUPS


def test_the_table_puts_the_planner_beside_the_measurement() -> None:
    row = {"setup": "adaptive", "gbps": 1.0, "goodput_rps": 0.2, "ttft_p90_s": 1.5,
           "attainment": 0.75, "predicted_goodput_rps": 0.22, "predicted_ttft_p90_s": 1.2}
    assert "| 1 | adaptive | 0.200 | 0.220 | 1.10 | 1.50 | 1.20 | 75% | nan |" in table([row])
