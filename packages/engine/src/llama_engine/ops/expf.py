"""ggml_v_expf (ggml-cpu's vec.h, the SSE2 form without FMA): the exponential softmax and SiLU use.

The vector form rounds every multiply and add separately; a lane on the main path (|n| <= 126) takes the
polynomial alone, others the scaled special cases. ``expf_main`` is branch-free, so a loop of it vectorizes;
``expf_in_range`` tells whether a whole row may take it.
"""

from __future__ import annotations

import numba
import numpy as np

from ._intrinsics import bits_f32, f32_bits

__all__ = ["LOG2E", "ROUND", "expf_in_range", "expf_main", "expf_sse2"]

# The constants of ggml_v_expf, written as ggml writes them (hex floats).
ROUND = np.float32(float.fromhex("0x1.8p23"))
LOG2E = np.float32(float.fromhex("0x1.715476p+0"))
_LN2_HI = np.float32(float.fromhex("0x1.62e4p-1"))
_LN2_LO = np.float32(float.fromhex("0x1.7f7d1cp-20"))
_P0 = np.float32(float.fromhex("0x1.0e4020p-7"))
_P1 = np.float32(float.fromhex("0x1.573e2ep-5"))
_P2 = np.float32(float.fromhex("0x1.555e66p-3"))
_P3 = np.float32(float.fromhex("0x1.fffdb6p-2"))
_P4 = np.float32(float.fromhex("0x1.ffffecp-1"))


@numba.njit(cache=True, nogil=True, inline="always")
def _expf_parts(x: np.float32):  # type: ignore[no-untyped-def]
    """ggml_v_expf's shared steps: nn = round(x / ln 2), the exponent bits e of 2^nn, the polynomial j and
    kk = 2^nn."""
    z = x * LOG2E + ROUND
    nn = z - ROUND
    b = x - nn * _LN2_HI
    b = b - nn * _LN2_LO
    e = np.uint32(f32_bits(z) << np.uint32(23))  # type: ignore[call-arg,var-annotated]
    kk = bits_f32(np.uint32(e + np.uint32(0x3F800000)))  # type: ignore[call-arg,var-annotated]
    u = b * b
    j = ((_P0 * b + _P1) * u + (_P2 * b + _P3)) * u + _P4 * b
    return nn, e, j, kk


@numba.njit(cache=True, nogil=True)
def expf_sse2(x: np.float32) -> np.float32:
    """One lane of ggml_v_expf for SSE2 without FMA (vec.h): multiply and add round separately."""
    nn, e, j, kk = _expf_parts(x)
    an = abs(nn)
    if not an > np.float32(126.0):
        return j * kk + kk
    g = np.uint32(0x82000000) if nn <= np.float32(0.0) else np.uint32(0)
    s1 = bits_f32(np.uint32(g + np.uint32(0x7F000000)))  # type: ignore[call-arg,var-annotated]
    s2 = bits_f32(np.uint32(e - g))  # type: ignore[call-arg,var-annotated]
    if an > np.float32(192.0):
        return s1 * s1
    return (s2 * j + s2) * s1


@numba.njit(cache=True, nogil=True, inline="always")
def expf_main(x: np.float32) -> np.float32:
    """ggml_v_expf's main path (|n| <= 126): ``expf_sse2`` without the range check."""
    _, _, j, kk = _expf_parts(x)
    return j * kk + kk


@numba.njit(cache=True, nogil=True, inline="always")
def expf_in_range(row, n, mx):  # type: ignore[no-untyped-def]
    """Whether ggml_v_expf takes its main path for every row[j] - mx, j < n (|n| <= 126; counted, so the
    loop vectorizes)."""
    far = 0
    for j in range(n):
        nn = ((row[j] - mx) * LOG2E + ROUND) - ROUND
        far += abs(nn) > np.float32(126.0)
    return far == 0
