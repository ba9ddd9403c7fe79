"""What one side of the TCP KV path costs per GiB, staged against vectored, by run length.

    python -m bench.transfer.tcp_paths [--gib 0.5] [--runs 1 4 16 85] [--rounds 2]

One process, SmolLM2-shaped rows (6 KiB blocks, a 377 MB cache per side as in
tandem/profiler/transfer_probe.py), rows in runs of R consecutive blocks, run starts shuffled
(R = 1: every block its own piece, the fragmented cache of the transfer benchmark). Times the
CPU of one thread (``time.thread_time``) per GiB while a second thread drains or feeds a TCP
loopback socket with the transport's options:

* copies alone: the gather of a 512 KiB chunk's rows and the scatter of it, through a
  ``[rows, block_bytes]`` uint8 view and through one-item-per-row views (``blocks.row_dtype``,
  what kv_transfer uses);
* send, staged: gather into the chunk, AES-GMAC over it, ``sendall`` (kv_transfer's path);
  send, vectored: AES-GMAC over each run's view of the cache, ``sendmsg`` of the views;
* receive, staged: ``recv_into`` the chunk, AES-GMAC, scatter into the cache (kv_transfer's);
  receive, vectored: ``recvmsg_into`` the destination runs' views, AES-GMAC over each.

Rounds interleave the cases (a shared machine drifts); the table gives each case's rounds.
Results in docs/bench/kv_transfer.md ("What limits us").
"""

from __future__ import annotations

import argparse
import os
import socket
import threading
import time
from collections.abc import Callable

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from tandem.kv_transfer.blocks import chunk_bytes, row_dtype

BB = 6144  # SmolLM2-135M: 16 tokens x 3 KV heads x 64 dims x bf16
ROWS = 30 * 2 * 1024  # 30 layers, K and V, 1,024 blocks: 377 MB
PER = chunk_bytes(BB) // BB
SOCK_BUF = 4 << 20


def gmac() -> object:
    """A fresh AES-256-GMAC context (the payload tag kv_transfer computes)."""
    return Cipher(algorithms.AES(os.urandom(32)), modes.GCM(os.urandom(12))).encryptor()


def row_order(run: int, gib: float, seed: int) -> np.ndarray:
    """Row numbers, in runs of ``run`` consecutive rows with shuffled starts, ~gib GiB."""
    starts = np.arange(0, ROWS - run + 1, run)
    np.random.default_rng(seed).shuffle(starts)
    need = int(gib * (1 << 30)) // (run * BB) + 1
    return (np.resize(starts, need)[:, None] + np.arange(run)[None, :]).reshape(-1)


def runs_of(flat: np.ndarray, rows: np.ndarray) -> list[np.ndarray]:
    """Views of ``flat`` for each run of consecutive row numbers in ``rows``."""
    edges = [0, *(np.flatnonzero(np.diff(rows) != 1) + 1).tolist(), len(rows)]
    return [flat[int(rows[a]) * BB:(int(rows[a]) + b - a) * BB]
            for a, b in zip(edges[:-1], edges[1:], strict=True)]


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    """A loopback TCP connection with kv_transfer's socket options."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    a = socket.create_connection(lsock.getsockname())
    b, _ = lsock.accept()
    lsock.close()
    for s in (a, b):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCK_BUF)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCK_BUF)
    return a, b


def drain(sock: socket.socket, n: int) -> None:
    """Read and drop ``n`` bytes."""
    view = memoryview(bytearray(1 << 20))
    while n:
        n -= sock.recv_into(view[:min(n, len(view))])


def feed(sock: socket.socket, n: int) -> None:
    """Write ``n`` bytes."""
    view = memoryview(bytearray(1 << 20))
    while n:
        n -= sock.send(view[:min(n, len(view))])


def sendmsg_all(sock: socket.socket, bufs: list[np.ndarray]) -> None:
    """Write every buffer with ``sendmsg`` (partial writes resumed)."""
    while bufs:
        n = sock.sendmsg(bufs[:1024])
        while n:
            if n >= bufs[0].nbytes:
                n -= bufs[0].nbytes
                bufs = bufs[1:]
            else:
                bufs = [bufs[0][n:], *bufs[1:]]
                n = 0


def recvmsg_all(sock: socket.socket, bufs: list[np.ndarray]) -> None:
    """Fill every buffer with ``recvmsg_into``."""
    bufs = list(bufs)
    while bufs:
        n = sock.recvmsg_into(bufs[:1024])[0]
        while n:
            if n >= bufs[0].nbytes:
                n -= bufs[0].nbytes
                bufs = bufs[1:]
            else:
                bufs[0] = bufs[0][n:]
                n = 0


class Case:
    """The caches, the row order and the staging chunk for one run length."""

    def __init__(self, run: int, gib: float) -> None:
        rng = np.random.default_rng(1)
        self.src = rng.integers(0, 256, size=ROWS * BB, dtype=np.uint8)
        self.dst = np.empty(ROWS * BB, dtype=np.uint8)
        self.dst.fill(0)  # every page touched before timing (np.zeros would map them lazily)
        self.rows = row_order(run, gib, seed=run)
        self.nbytes = len(self.rows) * BB
        self.chunk = np.empty(PER * BB, dtype=np.uint8)
        self.subs = [self.rows[i:i + PER] for i in range(0, len(self.rows), PER)]

    def gather_2d(self) -> None:
        table = self.src.reshape(-1, BB)
        for sub in self.subs:
            table.take(sub, axis=0, out=self.chunk[:len(sub) * BB].reshape(-1, BB), mode="wrap")

    def gather_rows(self) -> None:
        table, rd = self.src.view(row_dtype(BB)), row_dtype(BB)
        for sub in self.subs:
            table.take(sub, out=self.chunk[:len(sub) * BB].view(rd), mode="wrap")

    def scatter_2d(self) -> None:
        table = self.dst.reshape(-1, BB)
        for sub in self.subs:
            table[sub] = self.chunk[:len(sub) * BB].reshape(-1, BB)

    def scatter_rows(self) -> None:
        table, rd = self.dst.view(row_dtype(BB)), row_dtype(BB)
        for sub in self.subs:
            table[sub] = self.chunk[:len(sub) * BB].view(rd)

    def _with_peer(self, peer: Callable[[socket.socket, int], None],
                   body: Callable[[socket.socket], None]) -> Callable[[], None]:
        def run() -> None:
            a, b = tcp_pair()
            th = threading.Thread(target=peer, args=(b, self.nbytes))
            th.start()
            try:
                body(a)
            finally:
                th.join()
                a.close()
                b.close()
        return run

    def send(self, vectored: bool) -> Callable[[], None]:
        table, rd = self.src.view(row_dtype(BB)), row_dtype(BB)

        def body(sock: socket.socket) -> None:
            mac = gmac()
            for sub in self.subs:
                if vectored:
                    views = runs_of(self.src, sub)
                    for v in views:
                        mac.authenticate_additional_data(v)
                    sendmsg_all(sock, views)
                else:
                    out = self.chunk[:len(sub) * BB]
                    table.take(sub, out=out.view(rd), mode="wrap")
                    mac.authenticate_additional_data(out)
                    sock.sendall(out)
        return self._with_peer(drain, body)

    def recv(self, vectored: bool) -> Callable[[], None]:
        table, rd = self.dst.view(row_dtype(BB)), row_dtype(BB)

        def body(sock: socket.socket) -> None:
            mac = gmac()
            for sub in self.subs:
                if vectored:
                    views = runs_of(self.dst, sub)
                    recvmsg_all(sock, views)
                    for v in views:
                        mac.authenticate_additional_data(v)
                else:
                    out = self.chunk[:len(sub) * BB]
                    recvmsg_all(sock, [out])
                    mac.authenticate_additional_data(out)
                    table[sub] = out.view(rd)
        # the feeding thread is started inside; the timed thread is this one
        return self._with_peer(feed, body)


def cpu_per_gib(fn: Callable[[], None], nbytes: int) -> float:
    """This thread's CPU seconds per GiB while ``fn`` runs."""
    t0 = time.thread_time()
    fn()
    return (time.thread_time() - t0) / (nbytes / (1 << 30))


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=0.5, help="bytes moved per case and round")
    ap.add_argument("--runs", type=int, nargs="+", default=[1, 4, 16, PER],
                    help="run lengths (blocks) to measure")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}; CPU-s per GiB, one thread; rounds "
          f"interleaved", flush=True)
    for run in args.runs:
        case = Case(run, args.gib)
        cases: dict[str, Callable[[], None]] = {
            "gather [rows, bytes]": case.gather_2d, "gather row items": case.gather_rows,
            "scatter [rows, bytes]": case.scatter_2d, "scatter row items": case.scatter_rows,
            "send staged": case.send(False), "send vectored": case.send(True),
            "recv staged": case.recv(False), "recv vectored": case.recv(True)}
        got: dict[str, list[float]] = {k: [] for k in cases}
        for _ in range(args.rounds):
            for name, fn in cases.items():
                got[name].append(cpu_per_gib(fn, case.nbytes))
        for name, vals in got.items():
            print(f"runs of {run:3d} blocks  {name:22s} " + " ".join(f"{v:.3f}" for v in vals),
                  flush=True)
        print(f"  (load average {os.getloadavg()[0]:.1f})", flush=True)


if __name__ == "__main__":
    main()
