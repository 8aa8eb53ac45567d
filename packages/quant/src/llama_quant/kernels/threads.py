"""The worker threads behind numba's parallel kernels.

With numba's OpenMP threading layer (GNU libgomp), each thread that launches a parallel kernel gets its own
team of worker threads, kept until that thread exits. Once libgomp manages more threads than there are CPUs
it stops spinning between parallel regions and puts its workers to sleep at once, so every later kernel
launch pays a futex wake-up: on 2 CPUs, a second thread's small matrix products took 2-4 times as long.
A program that prepares weights on one thread and computes on another (the engine's loop) hands the
first thread's workers back with ``release_worker_threads``.
"""

from __future__ import annotations

import ctypes
import functools

import numba

__all__ = ["release_worker_threads"]

_OMP_PAUSE_SOFT = 1


@functools.cache
def _libgomp() -> ctypes.CDLL | None:
    try:
        with open("/proc/self/maps") as maps:
            loaded = any("libgomp" in line for line in maps)
    except OSError:
        return None
    if not loaded:
        return None
    try:
        lib = ctypes.CDLL("libgomp.so.1")  # the copy already loaded by numba's OpenMP layer
        lib.omp_pause_resource_all.argtypes = [ctypes.c_int]
        return lib
    except (OSError, AttributeError):  # another OpenMP runtime, or one older than OpenMP 5
        return None


def release_worker_threads() -> bool:
    """End the calling thread's OpenMP worker threads (``omp_pause_resource_all``); it gets new ones if it
    launches a parallel kernel again. Returns whether there was such a team to end (False with numba's other
    threading layers, before any parallel kernel ran, or with another OpenMP runtime)."""
    try:
        if numba.threading_layer() != "omp":
            return False
    except ValueError:  # no parallel kernel has run in this process yet
        return False
    lib = _libgomp()
    return lib is not None and lib.omp_pause_resource_all(_OMP_PAUSE_SOFT) == 0
