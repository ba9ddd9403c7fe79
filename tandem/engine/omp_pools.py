"""OpenMP thread pools: one per thread that runs parallel work, and why a worker keeps one.

libgomp (the OpenMP runtime torch loads, which the native kernels share) gives every thread
that starts a parallel region its own pool of ``threads - 1`` helpers, kept for its next
region. Its helpers wait between regions by spinning, unless the process holds more pool
threads than it has cores: then every wait is a futex sleep and every region start a wake-up
(libgomp's "throttled" spin). A worker loads its model and warms it up on its main thread (a
pool), then steps on the engine thread (a second pool): with 2 threads on 2 cores that is one
helper too many, and a decode step's ~150 parallel regions each paid a sleep and a wake-up.
Measured (`tandem local --no-prefill`, a decode worker of 2 threads, one HTTP stream, 2
cores): TPOT 20-22 ms, a quarter of its CPU samples in the kernel's task switches; 11-13 ms
with the main thread's pool released.

:func:`release_this_threads_pool` ends the calling thread's pool and keeps its later torch
ops on one thread, so the engine thread's pool is the process's one. The decode worker calls
it on its main thread once the engine is loaded, before the engine thread starts (with one
thread of its own, as under `tandem local`, there is no such pool and the call changes
nothing). The prefill worker does not: its regions are long GEMMs, for which a wake-up is
noise, and on a host it shares with a decode worker the throttled waits hand the cores over
instead of spinning on them (releasing its pool measured no better on 32 HTTP streams).
"""

from __future__ import annotations

import ctypes
import logging
import os

import torch

log = logging.getLogger(__name__)

_OMP_PAUSE_SOFT = 1  # omp_pause_resource_t: release the threads, keep the runtime


def intra_op_threads() -> int:
    """Threads this process's parallel ops run on (torch's intra-op count; the native
    kernels' default too): what a worker has of its own before borrowing more."""
    return torch.get_num_threads()


def release_this_threads_pool() -> bool:
    """End the calling thread's OpenMP pool (``omp_pause_resource_all(omp_pause_soft)``: its
    helper threads exit) and give the thread's own later parallel regions one thread
    (``omp_set_num_threads(1)``, an ICV of this thread only: other threads keep theirs).
    False when no libgomp is loaded or it refused (a region is running on this thread)."""
    try:  # RTLD_NOLOAD: only the runtime already loaded (torch's), never a second one
        lib = ctypes.CDLL("libgomp.so.1", mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL)
    except OSError:  # no OpenMP runtime in this process (or not libgomp): nothing to release
        return False
    lib.omp_pause_resource_all.argtypes, lib.omp_pause_resource_all.restype = [ctypes.c_int], ctypes.c_int
    lib.omp_set_num_threads.argtypes, lib.omp_set_num_threads.restype = [ctypes.c_int], None
    if lib.omp_pause_resource_all(_OMP_PAUSE_SOFT) != 0:
        log.warning("OpenMP refused to release this thread's pool: parallel steps may run slower")
        return False
    lib.omp_set_num_threads(1)
    return True
