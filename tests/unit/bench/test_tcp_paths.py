"""The one-side TCP path benchmark's helpers: its row orders have the run length asked for,
and its vectored send and receive move the runs' bytes exactly (so staged and vectored cases
move the same bytes)."""

from __future__ import annotations

import socket
import threading

import numpy as np

from bench.transfer.tcp_paths import BB, ROWS, recvmsg_all, row_order, runs_of, sendmsg_all


def test_row_orders_come_in_runs_of_the_length_asked() -> None:
    for run in (1, 4, 85):
        rows = row_order(run, gib=0.01, seed=run).reshape(-1, run)
        assert (np.diff(rows, axis=1) == 1).all()  # each group: consecutive rows
        assert rows.min() >= 0 and rows.max() < ROWS
        assert rows.size * BB >= 0.01 * (1 << 30)


def test_vectored_send_and_receive_move_the_runs_exactly() -> None:
    src = np.random.default_rng(0).integers(0, 256, size=64 * BB, dtype=np.uint8)
    dst = np.zeros_like(src)
    rows = np.array([3, 4, 5, 9, 0, 1, 40, 63], dtype=np.int64)
    send_views, recv_views = runs_of(src, rows), runs_of(dst, rows)
    assert [v.nbytes // BB for v in send_views] == [3, 1, 2, 1, 1]
    a, b = socket.socketpair()
    try:
        writer = threading.Thread(target=sendmsg_all, args=(a, send_views))
        writer.start()
        recvmsg_all(b, recv_views)
        writer.join()
    finally:
        a.close()
        b.close()
    table_src, table_dst = src.reshape(-1, BB), dst.reshape(-1, BB)
    assert np.array_equal(table_dst[rows], table_src[rows])
    others = np.setdiff1d(np.arange(64), rows)
    assert not table_dst[others].any()
