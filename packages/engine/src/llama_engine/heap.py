"""Handing freed heap memory back to the system.

glibc keeps what a program frees in its heap (and in each thread's arena) for later allocations: after
model loading (the repacking's temporaries) and after a burst of requests (prompt chunks' buffers,
checkpoints dropped), that memory stays resident though nothing uses it. ``trim_heap`` returns it
(``malloc_trim``); the engine calls it after loading and whenever its loop runs out of work.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable

__all__ = ["trim_heap"]


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # another C library: nothing to do
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim  # type: ignore[no-any-return]


def trim_heap() -> bool:
    """Release the free memory of every malloc arena to the system; False where the C library has no
    ``malloc_trim`` (or there was nothing to release)."""
    trim = _malloc_trim()
    return bool(trim is not None and trim(0))
