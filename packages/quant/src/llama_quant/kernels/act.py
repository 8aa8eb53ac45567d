"""Activation quantizers: f32 rows to ggml's vec_dot types, bit for bit as llama.cpp's reference C code.

- Q8_0 / Q8_1 (``quantize_row_q8_0_ref`` / ``quantize_row_q8_1_ref`` in ggml-quants.c): per block of 32,
  ``d = amax / 127``, ``id = d ? 1 / d : 0``, ``q = roundf(x * id)`` (half away from zero); the block stores
  ``fp16(d)`` and, for Q8_1, ``s = fp16(float(sum q) * d)``. Both share ``q``, so one pass produces both.
- Q8_K (``quantize_row_q8_K_ref``): per block of 256, ``max`` = the signed value of the first largest
  ``|x|``, ``iscale = -127 / max``, ``q = min(127, nearest_int(iscale * x))`` (half to even), ``d = 1 / iscale``
  kept as f32, and the sums of q per 16 values (``bsums``).
- F16 / BF16 (``ggml_cpu_fp32_to_fp16`` / ``_bf16``): round to nearest even; kept here as the f32 values.

Every float operation is a separate f32 operation (no fastmath: no contraction, no reassociation).
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import float32, float64, int32, prange, uint32, uint64

__all__ = [
    "quantize_bf16",
    "quantize_f16",
    "quantize_q8",
    "quantize_q8_k",
    "quantize_q8_k_rows",
    "quantize_q8_rows",
]


@numba.njit(cache=True, nogil=True, inline="always")
def _roundf(v):  # pragma: no cover - numba
    """C's ``(int8_t)roundf(v)`` for an f32 ``v``: half away from zero, then the int8 store as x86 does it
    (cvttss2si and the low byte; inf and nan give INT_MIN, whose low byte is 0)."""
    a = float64(v)
    if not (abs(a) < 2147483648.0):
        return int32(0)
    t = np.int64(a)  # truncation toward zero, exact in f64
    f = a - float64(t)
    if f >= 0.5:
        t += 1
    elif f <= -0.5:
        t -= 1
    return int32(np.int8(t))


@numba.njit(cache=True, nogil=True, inline="always")
def _nearest_int(f, fs, us):  # pragma: no cover - numba
    """ggml's nearest_int of an f32: the bits of ``f + 12582912.f`` (half to even for |f| < 2**22; inf,
    nan and huge values give what the bit trick gives). fs / us: one f32 of scratch and its uint32 view."""
    if abs(f) <= float32(4194303.0):
        return int32(np.rint(f))
    fs[0] = f + float32(12582912.0)
    return int32(us[0] & uint32(0x007FFFFF)) - int32(0x00400000)


@numba.njit(cache=True, nogil=True)
def f16_round(v):  # pragma: no cover - numba
    """The f32 value of ``fp16(v)`` rounded to nearest even (ggml's GGML_FP32_TO_FP16), as f32."""
    a = abs(float64(v))
    if a != a:
        return float32(v)
    if a >= 65520.0:
        r = math.inf
    elif a < 6.103515625e-05:  # fp16 subnormal: multiples of 2**-24
        r = np.rint(a * 16777216.0) / 16777216.0
    else:
        m, e = math.frexp(a)  # a = m * 2**e, m in [0.5, 1): 11 significant bits keep m * 2**11 integral
        r = math.ldexp(np.rint(math.ldexp(m, 11)), e - 11)
    return float32(math.copysign(r, float64(v)))


@numba.njit(cache=True, nogil=True, inline="always")
def _roundf_lanes(v):  # pragma: no cover - numba
    """``_roundf`` without branches, so a loop of it vectorizes: for |v| < 2**31, ``floor(|v| + 0.5)`` in
    double is exact (the f32 value plus one half fits a double) and equals half-away-from-zero rounding."""
    a = abs(float64(v))
    r = np.floor(a + 0.5)
    r = r if a < 2147483648.0 else 0.0  # also nan
    t = np.int64(r)
    t = -t if v < float32(0.0) else t
    return int32(np.int8(t))


@numba.njit(cache=True, nogil=True, inline="always")
def _q8_row(qr, xd, xs, xsum16, xr, nb):  # pragma: no cover - numba
    """One row of ``quantize_q8``: xd, xs, xsum16 are the row's slices."""
    for b in range(nb):
        o = b * uint64(32)
        amax = float32(0.0)
        for j in range(uint64(32)):
            av = abs(xr[o + j])
            amax = av if av > amax else amax  # MAX(amax, fabsf(v))
        d = amax / float32(127.0)
        iv = float32(1.0) / d if d != float32(0.0) else float32(0.0)
        s0 = int32(0)
        s1 = int32(0)
        for j in range(uint64(16)):
            q = _roundf_lanes(xr[o + j] * iv)
            qr[o + j] = q
            s0 += q
        for j in range(uint64(16), uint64(32)):
            q = _roundf_lanes(xr[o + j] * iv)
            qr[o + j] = q
            s1 += q
        xd[b] = f16_round(d)
        xs[b] = f16_round(float32(s0 + s1) * d)
        xsum16[uint64(2) * b] = s0
        xsum16[uint64(2) * b + uint64(1)] = s1


@numba.njit(cache=True, nogil=True)
def quantize_q8(xq, xd, xs, xsum16, x, n, cols):  # pragma: no cover - numba
    """Q8_0 and Q8_1 of ``x[n, cols]``: xq[n, cols] int8; xd[n, cols/32] f32 = fp16(d); xs[n, cols/32]
    f32 = fp16(sum * d) (Q8_1's s); xsum16[n, cols/16] int32 = sums of q per 16 values."""
    nb = uint64(cols // 32)
    for t in range(uint64(n)):
        _q8_row(xq[t], xd[t], xs[t], xsum16[t], x[t], nb)


@numba.njit(cache=True, nogil=True, parallel=True)
def quantize_q8_rows(xq, xd, xs, xsum16, x, n, cols):  # pragma: no cover - numba
    """``quantize_q8`` with the rows spread over the threads (for many tokens)."""
    nb = uint64(cols // 32)
    for t in prange(n):
        _q8_row(xq[t], xd[t], xs[t], xsum16[t], x[t], nb)


@numba.njit(cache=True, nogil=True, inline="always")
def _q8k_row(qr, xd, xsum16, xr, nb, fs, us):  # pragma: no cover - numba
    """One row of ``quantize_q8_k``: xd, xsum16 are the row's slices; fs / us as ``_nearest_int``."""
    for b in range(nb):
        o = b * uint64(256)
        mx = float32(0.0)
        amax = float32(0.0)
        for j in range(uint64(256)):
            av = abs(xr[o + j])
            if av > amax:
                amax = av
                mx = xr[o + j]
        if amax == float32(0.0):
            xd[b] = float32(0.0)
            for j in range(uint64(256)):
                qr[o + j] = 0
            for j in range(uint64(16)):
                xsum16[b * uint64(16) + j] = 0
            continue
        iscale = float32(-127.0) / mx
        for j in range(uint64(256)):
            qr[o + j] = min(int32(127), _nearest_int(iscale * xr[o + j], fs, us))  # int8 store wraps
        for j in range(uint64(16)):
            acc = int32(0)
            for i in range(uint64(16)):
                acc += int32(qr[o + j * uint64(16) + i])
            xsum16[b * uint64(16) + j] = acc
        xd[b] = float32(1.0) / iscale


@numba.njit(cache=True, nogil=True)
def quantize_q8_k(xq, xd, xsum16, x, n, cols):  # pragma: no cover - numba
    """Q8_K of ``x[n, cols]``: xq[n, cols] int8; xd[n, cols/256] f32 d; xsum16[n, cols/16] int32 bsums."""
    nb = uint64(cols // 256)
    fs = np.empty(1, np.float32)
    us = fs.view(np.uint32)
    for t in range(uint64(n)):
        _q8k_row(xq[t], xd[t], xsum16[t], x[t], nb, fs, us)


@numba.njit(cache=True, nogil=True, parallel=True)
def quantize_q8_k_rows(xq, xd, xsum16, x, n, cols):  # pragma: no cover - numba
    """``quantize_q8_k`` with the rows spread over the threads (for many tokens)."""
    nb = uint64(cols // 256)
    for t in prange(n):
        fs = np.empty(1, np.float32)
        us = fs.view(np.uint32)
        _q8k_row(xq[t], xd[t], xsum16[t], x[t], nb, fs, us)


@numba.njit(cache=True, nogil=True)
def quantize_f16(xh, x, n, cols):  # pragma: no cover - numba
    """xh[n, cols] f32 = fp16(x) (round to nearest even), the F16 vec_dot type: ``f16_round`` on the f32
    bits, without its libm calls. A normal fp16 keeps 10 of f32's 23 fraction bits: add half of the 13
    dropped bits' unit (less one, plus the kept lowest bit: ties to even) and clear them; a carry moves into
    the exponent as it should. Below fp16's normals the step is 2**-24: a scaled ``rint``, exact in f32."""
    xb, hb = x.view(np.uint32), xh.view(np.uint32)
    for t in range(uint64(n)):
        for i in range(uint64(cols)):
            b = xb[t, i]
            a = b & uint32(0x7FFFFFFF)
            if a < uint32(0x38800000):  # below 2**-14
                v = np.rint(abs(x[t, i]) * float32(16777216.0)) * float32(5.9604645e-08)
                xh[t, i] = -v if b != a else v
            elif a >= uint32(0x477FF000):  # 65520 and up: inf; nan stays itself
                hb[t, i] = b if a > uint32(0x7F800000) else (b ^ a) | uint32(0x7F800000)
            else:
                hb[t, i] = (b ^ a) | (
                    (a + uint32(0xFFF) + ((a >> uint32(13)) & uint32(1))) & uint32(0xFFFFE000)
                )


@numba.njit(cache=True, nogil=True)
def quantize_bf16(xh, x, n, cols):  # pragma: no cover - numba
    """xh[n, cols] f32 = bf16(x) (ggml_compute_fp32_to_bf16 on the f32 bits: round to nearest even, nan
    kept quiet), the BF16 vec_dot type."""
    xb, hb = x.view(np.uint32), xh.view(np.uint32)
    for t in range(uint64(n)):
        for i in range(uint64(cols)):
            b = xb[t, i]
            if (b & uint32(0x7FFFFFFF)) > uint32(0x7F800000):
                hb[t, i] = (b | uint32(0x00400000)) & uint32(0xFFFF0000)
            else:
                hb[t, i] = ((b + (uint32(0x7FFF) + ((b >> uint32(16)) & uint32(1)))) >> uint32(16)) << uint32(
                    16
                )
