"""A process that binds a Unix socket in its temporary folder, announces it and waits for a
signal: run by test_local_cluster.py, which kills it (SIGKILL leaves the socket file behind)."""

from __future__ import annotations

import os
import signal
import socket
import tempfile

from tandem.common.wire import ready_line


def main() -> None:
    """Bind, announce the socket's path in the READY line, and wait for a signal."""
    path = os.path.join(tempfile.gettempdir(), f"left-{os.getpid()}.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    print(ready_line({"path": path}), end="", flush=True)
    signal.pause()


if __name__ == "__main__":
    main()
