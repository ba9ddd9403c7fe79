"""How ``tandem down`` and ``tandem status`` find the cluster a ``tandem up`` on this machine
started: a small state file, one per Ray namespace.

    tandem up    ──writes──>  <runtime dir>/up-<namespace>.json   (0600, in a 0700 folder)
                              {"pid", "pid_start", "namespace", "address", "owns_ray", "auth"}
    tandem down  ──reads───>  dials "address" (the GCS address Ray really bound; a local
                              instance's is on loopback), stops the pool; when ``up`` owns
                              that Ray instance, waits for ``up`` to end (its Ray ends with
                              it), and removes the file

The runtime dir is ``$XDG_RUNTIME_DIR/tandem`` when that variable names a folder, else
``~/.cache/tandem/run``. ``address: auto`` would not do: Ray's own record of the current
cluster names the node's routable address, where a loopback-bound GCS does not listen, and
Ray retries it for minutes. ``auth`` is Ray's ``RAY_AUTH_MODE`` in ``up``'s process (a new
local instance enables token auth by default; a driver dialling an explicit address must be
told), ``auth_token_path`` its ``RAY_AUTH_TOKEN_PATH`` if set: the token itself stays where
Ray keeps it. ``pid_start`` (the process's start time, from /proc) tells ``up`` apart from a
later process that reuses its pid.

The file is read as untrusted input: one that is not a regular file of this user's, not
0600, or not the expected JSON is refused with the reason, never acted on.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import socket
import stat
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tandem.launcher.spec import NAMESPACE

_SAFE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_AUTH_MODE_ENV = "RAY_AUTH_MODE"
_TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"


class UpStateError(ValueError):
    """A state file that cannot be trusted or read (the message says which and why)."""


@dataclass(frozen=True, slots=True)
class UpState:
    """What a ``tandem up`` left for ``tandem down``: where its cluster is and who owns it."""

    pid: int  # the ``tandem up`` process
    pid_start: int  # its start time in clock ticks since boot (0: unknown)
    namespace: str
    address: str  # the GCS address to dial (HOST:PORT)
    owns_ray: bool  # True: ``up`` started this Ray instance, which ends with it
    auth: str = ""  # RAY_AUTH_MODE in ``up``'s process ("" when unset)
    auth_token_path: str = ""  # RAY_AUTH_TOKEN_PATH in ``up``'s process ("" when unset)

    @classmethod
    def of_this_process(cls, namespace: str, address: str, owns_ray: bool) -> UpState:
        """The state of the ``tandem up`` running in this process."""
        pid = os.getpid()
        return cls(pid, process_start(pid), namespace, address, owns_ray,
                   os.environ.get(_AUTH_MODE_ENV, ""), os.environ.get(_TOKEN_PATH_ENV, ""))

    def alive(self) -> bool:
        """Whether the ``tandem up`` that wrote this still runs (the same process, not a
        later one that reuses its pid)."""
        now = process_start(self.pid)
        return now != 0 and (self.pid_start == 0 or now == self.pid_start)

    def dial_env(self) -> None:
        """Set this process's Ray authentication variables as ``up``'s were, so a driver
        dialling ``address`` presents the token the cluster expects (call it before Ray is
        imported: Ray reads them as it is)."""
        if self.auth:
            os.environ[_AUTH_MODE_ENV] = self.auth
        if self.auth_token_path:
            os.environ[_TOKEN_PATH_ENV] = self.auth_token_path


def runtime_dir() -> Path:
    """The folder of state files (not created here)."""
    xdg = os.environ.get("XDG_RUNTIME_DIR", "")
    if xdg and Path(xdg).is_dir():
        return Path(xdg) / "tandem"
    return Path.home() / ".cache" / "tandem" / "run"


def state_path(namespace: str) -> Path:
    """The state file of ``namespace`` (a name that is not plain ASCII goes by its hash)."""
    name = namespace if _SAFE_NAME.fullmatch(namespace) else \
        hashlib.sha256(namespace.encode()).hexdigest()[:24]
    return runtime_dir() / f"up-{name}.json"


def write(state: UpState) -> Path:
    """Write ``state`` atomically (0600, its folder 0700); OSError when it cannot be."""
    path = state_path(state.namespace)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    _check_private_dir(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=".up-", dir=path.parent)  # 0600
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(asdict(state), f)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def read(namespace: str) -> UpState | None:
    """The state file of ``namespace``; None when there is none. UpStateError when one is
    there but not to be trusted (see the module notes)."""
    path = state_path(namespace)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UpStateError(f"{path}: cannot open it ({exc.strerror})") from exc
    with os.fdopen(fd) as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            raise UpStateError(f"{path}: not a regular file of this user's")
        if info.st_mode & 0o077:
            raise UpStateError(f"{path}: readable or writable by others (mode "
                               f"{info.st_mode & 0o777:o}); it should be 0600")
        text = f.read(4096)
    try:
        return _parse(json.loads(text), namespace)
    except (ValueError, TypeError) as exc:
        raise UpStateError(f"{path}: not a tandem up state file ({exc})") from exc


def remove(namespace: str, pid: int | None = None) -> None:
    """Remove ``namespace``'s state file; with ``pid``, only if that process wrote it."""
    path = state_path(namespace)
    if pid is not None:
        try:
            current = read(namespace)
        except UpStateError:
            return
        if current is None or current.pid != pid:
            return
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def process_start(pid: int) -> int:
    """``pid``'s start time in clock ticks since boot; 0 when no such process runs (an
    exited one not yet reaped, a zombie, counts as ended)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0
    # After "pid (comm)": state is field 3, starttime field 22 (proc(5)).
    return 0 if fields[0] == "Z" else int(fields[19])


def _parse(raw: Any, namespace: str) -> UpState:
    if not isinstance(raw, dict):
        raise ValueError("not a JSON object")
    fields = {"pid": int, "pid_start": int, "namespace": str, "address": str,
              "owns_ray": bool, "auth": str, "auth_token_path": str}
    values = {}
    for name, kind in fields.items():
        value = raw.get(name, "" if kind is str else None)
        if type(value) is not kind:
            raise ValueError(f"{name!r} is not a {kind.__name__}")
        values[name] = value
    if values["namespace"] != namespace:
        raise ValueError(f"it names namespace {values['namespace']!r}")
    if values["pid"] <= 0 or values["pid_start"] < 0:
        raise ValueError("bad pid")
    host, _, port = values["address"].rpartition(":")
    if not host or not port.isdigit() or len(values["address"]) > 300:
        raise ValueError(f"address {values['address']!r} is not HOST:PORT")
    return UpState(**values)


def _check_private_dir(folder: Path) -> None:
    """OSError unless ``folder`` is this user's and closed to others (a shared folder would
    let another user swap the file ``tandem down`` acts on)."""
    info = folder.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise OSError(f"{folder} is not a private folder of this user's")


def add_cluster_args(p: argparse.ArgumentParser) -> None:
    """The flags that name the cluster ``tandem down`` and ``tandem status`` dial
    (dial_target): ``--address`` and ``--namespace``."""
    p.add_argument("--address", default=None,
                   help="Ray cluster address (default: the one tandem up on this machine "
                   "recorded for --namespace, else auto)")
    p.add_argument("--namespace", default=NAMESPACE)


def dial_target(address: str | None, namespace: str) -> tuple[str | None, UpState | None]:
    """(the Ray address to dial for ``namespace``, the state file behind it): ``address``
    when given; else the one ``tandem up`` recorded on this machine; else ``auto``. The
    address is None when the record is stale, nothing runs there any more (the file is
    removed): the recorded ``tandem up`` has ended together with the Ray instance it owned,
    or (a detached cluster on a Ray cluster of its own) nothing answers at its address.
    UpStateError when the file is there but not to be trusted."""
    if address is not None:
        return address, None
    state = read(namespace)
    if state is None:
        return "auto", None
    stale = not state.alive() if state.owns_ray else not answers(state.address)
    if stale:
        remove(namespace, state.pid)
        return None, state
    return state.address, state


def answers(address: str, timeout_s: float = 3.0) -> bool:
    """Whether anything accepts a TCP connection at ``address`` (HOST:PORT): a GCS that is
    gone is said so at once, where Ray would retry it for minutes."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False
