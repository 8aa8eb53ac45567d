"""Kernels for the 32-value block formats Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 against Q8_0-quantized activations.

Counterpart of ggml-cpu's ``ggml_vec_dot_q4_0_q8_0`` etc. Per block of 32 weights and row r:
``y[r] += d_w[r] * d_x * sum_j (q_j - 8) * xq_j  (+ m'_w[r] * d_x * sum_j xq_j for the formats with a min)``.
The re-centred sums (q - 8, q - 16 per half block) fit int16 (|sum| <= 32 * 8 * 127), which lets LLVM run the
row loop 16 lanes wide; they are computed as ``-8 * sum(xq) + sum(q * xq)`` with int16 wrapping modulo 2**16 in
between (exact, since the final value fits), from the activation sums per 16 values. Repacked layout per tile
of 64 rows (see ``_common``):

- qs: [G, nb * 16 * 64] uint8, byte j (0..15) of block b of row r at ``(b * 16 + j) * 64 + r``
  (low nibble = value j, high nibble = value j + 16, as in ggml); Q8_0: [G, nb * 32 * 64] int8.
- qh (Q5_*): [G, nb * 4 * 64] uint8, the block's 32 high bits as 4 bytes, byte i at ``(b * 4 + i) * 64 + r``.
- d: [G, nb * 64] f32 scale; m (Q4_1, Q5_1): [G, nb * 64] f32 min re-centred as ``m + 8 d`` / ``m + 16 d``.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import float32, int16, int32, prange, uint64

from ._common import N_CHUNKS, f16_field, row_minor, tile_rows

__all__ = ["mv_q4", "mv_q5", "mv_q8", "pack"]

_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q8_0": 34}


def pack(name: str, raw: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, ...]:
    """Raw ggml rows [rows, row_bytes] uint8 -> the tiled arrays the kernels take (see module doc)."""
    nb = cols // 32
    blocks = tile_rows(raw.reshape(rows, nb, _BLOCK_BYTES[name]), rows)  # [G, 64, nb, bytes]
    d = f16_field(blocks, 0)  # [G, 64, nb]
    if name == "Q8_0":
        return (row_minor(blocks[..., 2:34]).view(np.int8), row_minor(d))
    if name == "Q4_0":
        return (row_minor(blocks[..., 2:18]), row_minor(d))
    if name == "Q4_1":
        m = f16_field(blocks, 2) + 8.0 * d
        return (row_minor(blocks[..., 4:20]), row_minor(d), row_minor(m))
    if name == "Q5_0":
        return (row_minor(blocks[..., 6:22]), row_minor(blocks[..., 2:6]), row_minor(d))
    m = f16_field(blocks, 2) + 16.0 * d  # Q5_1
    return (row_minor(blocks[..., 8:24]), row_minor(blocks[..., 4:8]), row_minor(d), row_minor(m))


# --- per-tile inner kernels: y[0:R] = tile rows . one quantized activation row ---------------------------


@numba.njit(cache=True, nogil=True, fastmath=True)
def _tile_q4(y, qs, d, m, xq, xd, xs, nb, acc, R, has_min):  # pragma: no cover - numba
    for k in range(R):
        y[k] = 0.0
    for b in range(uint64(nb)):
        # sum (q - 8) x = sum q x - 8 sum x: start from -8 sum x and add the unsigned products. The
        # unsigned partial sums can pass 32767, but int16 wraps modulo 2**16 and the final signed sum fits,
        # so it comes out exact, one add per value cheaper than re-centring every nibble.
        bsum = int32(xs[uint64(2) * b]) + int32(xs[uint64(2) * b + uint64(1)])  # activation sums per 16
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
        s = xd[b]
        do = b * R
        if has_min:
            sm = s * float32(bsum)
            for k in range(R):
                y[k] += d[do + k] * (s * float32(acc[k])) + m[do + k] * sm
        else:
            for k in range(R):
                y[k] += d[do + k] * (s * float32(acc[k]))


@numba.njit(cache=True, nogil=True, fastmath=True, inline="always")
def _step_q5(qs, qh, xq, acc, acc2, xo, qo, ho, j, R):  # pragma: no cover - numba
    """Values j, j+8 (into acc) and j+16, j+24 (into acc2) of a Q5 block; j is a literal at each call, so
    the 5th-bit shifts are constants (a per-lane variable shift would widen the lanes to 64 bits)."""
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


@numba.njit(cache=True, nogil=True, fastmath=True)
def _tile_q5(y, qs, qh, d, m, xq, xd, xs, nb, acc, acc2, R, has_min):  # pragma: no cover - numba
    for k in range(R):
        y[k] = 0.0
    for b in range(uint64(nb)):
        # acc ends as sum (q - 16) x over values 0..15 (16 terms of |16 * 127|: fits int16), acc2 over
        # 16..31: start from -16 sum x and add unsigned products, wrapping exactly as in _tile_q4
        bs0 = int32(xs[uint64(2) * b])
        bs1 = int32(xs[uint64(2) * b + uint64(1)])
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
        s = xd[b]
        do = b * R
        if has_min:
            sm = s * float32(bs0 + bs1)
            for k in range(R):
                y[k] += d[do + k] * (s * float32(int32(acc[k]) + int32(acc2[k]))) + m[do + k] * sm
        else:
            for k in range(R):
                y[k] += d[do + k] * (s * float32(int32(acc[k]) + int32(acc2[k])))


@numba.njit(cache=True, nogil=True, fastmath=True)
def _tile_q8(y, qs, d, xq, xd, nb, acc, R):  # pragma: no cover - numba
    for k in range(R):
        y[k] = 0.0
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
        s = xd[b]
        do = b * R
        for k in range(R):
            y[k] += d[do + k] * (s * float32(acc[k]))


# --- drivers: out[n, rows] = X[n, cols] @ W.T, prange over N_CHUNKS chunks of tiles --------------------


@numba.njit(cache=True, nogil=True, fastmath=True, inline="always")
def _store(out, y, t, g, rows, R):  # pragma: no cover - numba
    r0 = g * R
    for k in range(min(R, rows - r0)):
        out[t, r0 + k] = y[k]


@numba.njit(cache=True, nogil=True, fastmath=True, parallel=True)
def mv_q4(out, qs, d, m, xq, xd, xs, n, rows, nb, has_min):  # pragma: no cover - numba
    """Q4_0 (has_min False, m ignored) and Q4_1 against Q8_0 activations."""
    G = qs.shape[0]
    R = uint64(d.shape[1] // nb)  # TILE_ROWS, read at run time so LLVM vectorizes rather than unrolls
    for c in prange(N_CHUNKS):
        acc = np.empty(R, np.int16)
        y = np.empty(R, np.float32)
        for g in range(G * c // N_CHUNKS, G * (c + 1) // N_CHUNKS):
            for t in range(n):
                # per token, the tile is re-read from L1/L2; unpacking the nibbles once per tile into int16
                # for all tokens was measured slower (the int16 reloads cost more than the unpacking)
                _tile_q4(y, qs[g], d[g], m[g], xq[t], xd[t], xs[t], nb, acc, R, has_min)
                _store(out, y, t, g, rows, R)


@numba.njit(cache=True, nogil=True, fastmath=True, parallel=True)
def mv_q5(out, qs, qh, d, m, xq, xd, xs, n, rows, nb, has_min):  # pragma: no cover - numba
    """Q5_0 (has_min False) and Q5_1 against Q8_0 activations."""
    G = qs.shape[0]
    R = uint64(d.shape[1] // nb)  # TILE_ROWS, read at run time so LLVM vectorizes rather than unrolls
    for c in prange(N_CHUNKS):
        acc = np.empty(R, np.int16)
        acc2 = np.empty(R, np.int16)
        y = np.empty(R, np.float32)
        for g in range(G * c // N_CHUNKS, G * (c + 1) // N_CHUNKS):
            for t in range(n):
                _tile_q5(y, qs[g], qh[g], d[g], m[g], xq[t], xd[t], xs[t], nb, acc, acc2, R, has_min)
                _store(out, y, t, g, rows, R)


@numba.njit(cache=True, nogil=True, fastmath=True, parallel=True)
def mv_q8(out, qs, d, xq, xd, n, rows, nb):  # pragma: no cover - numba
    """Q8_0 against Q8_0 activations."""
    G = qs.shape[0]
    R = uint64(d.shape[1] // nb)  # TILE_ROWS, read at run time so LLVM vectorizes rather than unrolls
    for c in prange(N_CHUNKS):
        acc = np.empty(R, np.int32)
        y = np.empty(R, np.float32)
        for g in range(G * c // N_CHUNKS, G * (c + 1) // N_CHUNKS):
            for t in range(n):
                _tile_q8(y, qs[g], d[g], xq[t], xd[t], nb, acc, R)
                _store(out, y, t, g, rows, R)
