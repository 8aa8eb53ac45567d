"""Exact kernels for the 32-value block formats Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.

Counterparts of ggml-cpu's ``ggml_vec_dot_q4_0_q8_0_generic`` etc. (ggml/src/ggml-cpu/quants.c). Per block,
the integer sum ``sumi`` is exact however it is computed; the float step is ggml's, operation for operation,
each rounded to f32 (no fastmath anywhere here):

- Q4_0: ``sumf += (sumi * d_w) * d_x``           (``sumi*FP16_TO_FP32(x.d)*FP16_TO_FP32(y.d)``)
- Q4_1, Q5_1: ``sumf += (d_w * d_x) * sumi + m_w * s_x``   (activations: Q8_1)
- Q5_0: ``sumf += (d_w * d_x) * sumi``
- Q8_0: ``sumf += sumi * (d_w * d_x)``

Integer sums of re-centred values (q - 8, q - 16) fit int16 and are computed as ``-8 * sum(xq) + sum(q * xq)``
with int16 wrapping in between (exact: the final value fits), from the activation sums per 16 values.
Repacked layout per tile of 64 rows (see ``_tiles``):

- qs: [G, nb * 16 * 64] uint8, byte j (0..15) of block b of row r at ``(b * 16 + j) * 64 + r``
  (low nibble = value j, high nibble = value j + 16, as in ggml); Q8_0: [G, nb * 32 * 64] int8.
- qh (Q5_*): [G, nb * 4 * 64] uint8, the block's 32 high bits as 4 bytes, byte i at ``(b * 4 + i) * 64 + r``.
- d, m: [G, nb * 64] f32, the block's fp16 scale (and min) widened exactly.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import float32, int16, int32, prange, uint64

from ._tiles import N_CHUNKS, f16_field, row_minor, tile_rows

__all__ = ["BLOCK_BYTES", "mv_q4", "mv_q5", "mv_q8", "pack"]

BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q8_0": 34}


def q5_0_as_q8_0(raw: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Q5_0 rows -> Q8_0 rows holding the same values (q - 16, -16..15) and scales.

    ggml's Q5_0 vec_dot ends each block with ``(d_w * d_x) * sumi``, its Q8_0 one with ``sumi * (d_w * d_x)``:
    the same product, so the Q8_0 kernels (one byte per value, no bit juggling) compute Q5_0 exactly."""
    blocks = raw.reshape(rows * (cols // 32), 22)
    qh = blocks[:, 2:6].copy().view("<u4")  # [blocks, 1]: bit j = the fifth bit of value j
    qs = blocks[:, 6:22]
    j = np.arange(16, dtype=np.uint32)
    lo = (qs & 15) | (((qh >> j) & 1) << 4).astype(np.uint8)
    hi = (qs >> 4) | (((qh >> (j + 16)) & 1) << 4).astype(np.uint8)
    out = np.empty((len(blocks), 34), np.uint8)
    out[:, :2] = blocks[:, :2]
    out[:, 2:18] = (lo.astype(np.int16) - 16).astype(np.int8).view(np.uint8)
    out[:, 18:34] = (hi.astype(np.int16) - 16).astype(np.int8).view(np.uint8)
    return out.reshape(rows, -1)


def pack(name: str, raw: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, ...]:
    """Raw ggml rows [rows, row_bytes] uint8 -> the tiled arrays the kernels take (see module doc)."""
    nb = cols // 32
    blocks = tile_rows(raw.reshape(rows, nb, BLOCK_BYTES[name]), rows)  # [G, 64, nb, bytes]
    d = row_minor(f16_field(blocks, 0))  # [G, nb * 64]
    if name == "Q8_0":
        return (row_minor(blocks[..., 2:34]).view(np.int8), d)
    if name == "Q4_0":
        return (row_minor(blocks[..., 2:18]), d)
    if name == "Q4_1":
        return (row_minor(blocks[..., 4:20]), d, row_minor(f16_field(blocks, 2)))
    if name == "Q5_0":
        return (row_minor(blocks[..., 6:22]), row_minor(blocks[..., 2:6]), d)
    return (row_minor(blocks[..., 8:24]), row_minor(blocks[..., 4:8]), d, row_minor(f16_field(blocks, 2)))


# --- per-tile kernels: y[0:R] = the tile's rows . one quantized activation row ---------------------------


@numba.njit(cache=True, nogil=True)
def _tile_q4(y, qs, d, m, xq, xd, xs, xsum, nb, acc, R, has_min):  # pragma: no cover - numba
    for k in range(R):
        y[k] = float32(0.0)
    for b in range(uint64(nb)):
        bsum = xsum[uint64(2) * b] + xsum[uint64(2) * b + uint64(1)]  # sum of the block's 32 quants
        c = int16(-8 * bsum)
        for k in range(R):
            acc[k] = c
        xo = b * uint64(32)
        qo = b * uint64(16) * R
        for j in range(uint64(16)):
            xl = int16(xq[xo + j])
            xh = int16(xq[xo + j + uint64(16)])
            o = qo + j * R
            for k in range(R):
                v = qs[o + k]
                acc[k] += int16(int16(v & 15) * xl + int16(v >> 4) * xh)
        dy = xd[b]
        do = b * R
        if has_min:  # Q4_1: sumi = sum q * x = acc + 8 * bsum
            sy = xs[b]
            b8 = int32(8 * bsum)
            for k in range(R):
                sumi = float32(int32(int32(acc[k]) + b8))  # int32: numba would widen to int64
                y[k] = y[k] + ((d[do + k] * dy) * sumi + m[do + k] * sy)
        else:  # Q4_0: sumi = sum (q - 8) * x = acc
            for k in range(R):
                y[k] = y[k] + (float32(acc[k]) * d[do + k]) * dy


@numba.njit(cache=True, nogil=True, inline="always")
def _step_q5(qs, qh, xq, acc, acc2, xo, qo, ho, j, R):  # pragma: no cover - numba
    """Values j, j+8 (into acc) and j+16, j+24 (into acc2) of a Q5 block; j is a literal at each call, so
    the 5th-bit shifts are constants (a variable shift would widen the lanes to 64 bits)."""
    x0 = int16(xq[xo + uint64(j)])
    x1 = int16(xq[xo + uint64(j + 8)])
    x2 = int16(xq[xo + uint64(j + 16)])
    x3 = int16(xq[xo + uint64(j + 24)])
    o0 = qo + uint64(j) * R
    o1 = o0 + uint64(8) * R
    for k in range(R):
        v0 = qs[o0 + k]
        v1 = qs[o1 + k]
        # 5th bits: value i is bit i % 8 of qh byte i // 8
        h0 = int16(((qh[ho + k] >> j) & 1) << 4)
        h1 = int16(((qh[ho + R + k] >> j) & 1) << 4)
        h2 = int16(((qh[ho + uint64(2) * R + k] >> j) & 1) << 4)
        h3 = int16(((qh[ho + uint64(3) * R + k] >> j) & 1) << 4)
        acc[k] += (int16(v0 & 15) + h0) * x0 + (int16(v1 & 15) + h1) * x1
        acc2[k] += (int16(v0 >> 4) + h2) * x2 + (int16(v1 >> 4) + h3) * x3


@numba.njit(cache=True, nogil=True)
def _tile_q5(y, qs, qh, d, m, xq, xd, xs, xsum, nb, acc, acc2, R, has_min):  # pragma: no cover - numba
    for k in range(R):
        y[k] = float32(0.0)
    for b in range(uint64(nb)):
        # acc ends as sum (q - 16) x over values 0..15 (fits int16), acc2 over 16..31
        bs0 = int32(xsum[uint64(2) * b])
        bs1 = int32(xsum[uint64(2) * b + uint64(1)])
        c0 = int16(-16 * bs0)
        c1 = int16(-16 * bs1)
        for k in range(R):
            acc[k] = c0
            acc2[k] = c1
        xo = b * uint64(32)
        qo = b * uint64(16) * R
        ho = b * uint64(4) * R
        _step_q5(qs, qh, xq, acc, acc2, xo, qo, ho, 0, R)
        _step_q5(qs, qh, xq, acc, acc2, xo, qo, ho, 1, R)
        _step_q5(qs, qh, xq, acc, acc2, xo, qo, ho, 2, R)
        _step_q5(qs, qh, xq, acc, acc2, xo, qo, ho, 3, R)
        _step_q5(qs, qh, xq, acc, acc2, xo, qo, ho, 4, R)
        _step_q5(qs, qh, xq, acc, acc2, xo, qo, ho, 5, R)
        _step_q5(qs, qh, xq, acc, acc2, xo, qo, ho, 6, R)
        _step_q5(qs, qh, xq, acc, acc2, xo, qo, ho, 7, R)
        dy = xd[b]
        do = b * R
        if has_min:  # Q5_1: sumi = sum q * x
            sy = xs[b]
            b16 = int32(16 * (bs0 + bs1))
            for k in range(R):
                sumi = float32(int32(int32(acc[k]) + int32(acc2[k]) + b16))
                y[k] = y[k] + ((d[do + k] * dy) * sumi + m[do + k] * sy)
        else:  # Q5_0: sumi = sum (q - 16) * x
            for k in range(R):
                sumi = float32(int32(int32(acc[k]) + int32(acc2[k])))
                y[k] = y[k] + (d[do + k] * dy) * sumi


@numba.njit(cache=True, nogil=True)
def _tile_q8(y, qs, d, xq, xd, nb, acc, R):  # pragma: no cover - numba
    for k in range(R):
        y[k] = float32(0.0)
    for b in range(uint64(nb)):
        for k in range(R):
            acc[k] = 0
        xo = b * uint64(32)
        qo = b * uint64(32) * R
        for j in range(uint64(0), uint64(32), uint64(2)):
            x0 = int16(xq[xo + j])
            x1 = int16(xq[xo + j + uint64(1)])
            o = qo + j * R
            for k in range(R):
                # two products of |128 * 127| still fit int16; widen once per pair
                acc[k] += int32(int16(qs[o + k]) * x0 + int16(qs[o + R + k]) * x1)
        dy = xd[b]
        do = b * R
        for k in range(R):
            y[k] = y[k] + float32(acc[k]) * (d[do + k] * dy)


# --- drivers: out[n, rows] = X[n, cols] @ W.T, prange over N_CHUNKS chunks of tiles --------------------


@numba.njit(cache=True, nogil=True, inline="always")
def _store(out, y, t, g, rows, R):  # pragma: no cover - numba
    r0 = g * R
    for k in range(min(R, rows - r0)):
        out[t, r0 + k] = y[k]


@numba.njit(cache=True, nogil=True, parallel=True)
def mv_q4(out, qs, d, m, xq, xd, xs, xsum, n, rows, nb, has_min):  # pragma: no cover - numba
    """Q4_0 (has_min False, m ignored; activations Q8_0) and Q4_1 (activations Q8_1)."""
    G = qs.shape[0]
    R = uint64(d.shape[1] // nb)
    for c in prange(N_CHUNKS):
        acc = np.empty(R, np.int16)
        y = np.empty(R, np.float32)
        for g in range(G * c // N_CHUNKS, G * (c + 1) // N_CHUNKS):
            for t in range(n):
                _tile_q4(y, qs[g], d[g], m[g], xq[t], xd[t], xs[t], xsum[t], nb, acc, R, has_min)
                _store(out, y, t, g, rows, R)


@numba.njit(cache=True, nogil=True, parallel=True)
def mv_q5(out, qs, qh, d, m, xq, xd, xs, xsum, n, rows, nb, has_min):  # pragma: no cover - numba
    """Q5_0 (has_min False; activations Q8_0) and Q5_1 (activations Q8_1)."""
    G = qs.shape[0]
    R = uint64(d.shape[1] // nb)
    for c in prange(N_CHUNKS):
        acc = np.empty(R, np.int16)
        acc2 = np.empty(R, np.int16)
        y = np.empty(R, np.float32)
        for g in range(G * c // N_CHUNKS, G * (c + 1) // N_CHUNKS):
            for t in range(n):
                _tile_q5(y, qs[g], qh[g], d[g], m[g], xq[t], xd[t], xs[t], xsum[t], nb, acc, acc2, R, has_min)
                _store(out, y, t, g, rows, R)


@numba.njit(cache=True, nogil=True, parallel=True)
def mv_q8(out, qs, d, xq, xd, n, rows, nb):  # pragma: no cover - numba
    """Q8_0 against Q8_0 activations."""
    G = qs.shape[0]
    R = uint64(d.shape[1] // nb)
    for c in prange(N_CHUNKS):
        acc = np.empty(R, np.int32)
        y = np.empty(R, np.float32)
        for g in range(G * c // N_CHUNKS, G * (c + 1) // N_CHUNKS):
            for t in range(n):
                _tile_q8(y, qs[g], d[g], xq[t], xd[t], nb, acc, R)
                _store(out, y, t, g, rows, R)
