"""Kernels for the K formats (super-blocks of 256) Q2_K, Q3_K, Q4_K, Q5_K, Q6_K against Q8_K activations.

Counterpart of ggml-cpu's ``ggml_vec_dot_q4_K_q8_K`` etc. As there, integer products are summed per sub-block,
scaled by the sub-block's integer scale into an int32 per super-block and only then converted:
``y[r] += d_x * (d[r] * isum[r] - dmin[r] * imin[r])`` with ``imin = sum_sub m_sub * bsum_x,sub``.
Quants are re-centred where needed (q - 8, q - 16, q - 32) and the int16 accumulators are flushed often enough
that no sum can overflow int16 (at most 32512 in magnitude). Bit fields are always extracted with constant
shifts: a per-lane variable shift or compare makes LLVM widen the lanes to 64 bits.

Repacked layout per tile of 64 rows (``[..., element, row]``, row innermost; nsb = cols / 256):

- Q4_K: qs [G, nsb*4*32*64] (raw bytes: chunk c of 64 values, byte l = value l | value 32+l << 4),
  sc, mn [G, nsb*8*64] uint8 (6-bit scales and mins), d, dmin [G, nsb*64] f32.
- Q5_K: as Q4_K plus qh [G, nsb*32*64] uint8 (raw: bit 2c / 2c+1 of byte l = 5th bit of chunk c's values).
- Q6_K: ql [G, nsb*2*64*64], qh [G, nsb*2*32*64], sc [G, nsb*16*64] int8, d [G, nsb*64] f32. The 6-bit quants
  are regrouped (same 192 bytes per super-block): for the values v1..v4 = e, e+32, e+64, e+96 of one
  half (e = lq in 0..31) byte lq of ql holds v1 | (v4 & 3) << 6, byte 32+lq holds v2 | (v4 >> 2 & 3) << 6 and
  qh byte lq holds v3 | (v4 >> 4) << 6: three values decode with one mask each and v4 from the top bits,
  fewer operations per value than ggml's nibble + 2-bit split.
- Q2_K: qs [G, nsb*2*32*64] (raw), sc [G, nsb*16*64] uint8 (raw: scale | min << 4), d, dmin f32.
- Q3_K: qs [G, nsb*2*32*64], hm [G, nsb*32*64] (raw hmask), sc [G, nsb*16*64] int8 (decoded, -32..31), d f32.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import float32, int16, int32, prange, uint64

from ._common import N_CHUNKS, TILE_ROWS, f16_field, row_minor, tile_rows

__all__ = ["mv_q2k", "mv_q3k", "mv_q6k", "mv_q45k", "pack"]

_R = uint64(TILE_ROWS)
_BLOCK_BYTES = {"Q2_K": 84, "Q3_K": 110, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}


def _scale_min_k4(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's get_scale_min_k4 for all 8 sub-blocks: 12 packed bytes [..., 12] -> scales, mins [..., 8]."""
    s = s.astype(np.uint8)
    sc = np.empty((*s.shape[:-1], 8), np.uint8)
    mn = np.empty_like(sc)
    sc[..., :4] = s[..., 0:4] & 63
    mn[..., :4] = s[..., 4:8] & 63
    sc[..., 4:] = (s[..., 8:12] & 0xF) | ((s[..., 0:4] >> 6) << 4)
    mn[..., 4:] = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    return sc, mn


def _q3_scales(s: np.ndarray) -> np.ndarray:
    """Q3_K's 12 packed bytes -> 16 signed 6-bit scales (as in ggml's dequantize_row_q3_K)."""
    a = s.astype(np.uint32)
    aux = [
        a[..., 4 * i] | a[..., 4 * i + 1] << 8 | a[..., 4 * i + 2] << 16 | a[..., 4 * i + 3] << 24
        for i in range(3)
    ]
    km1, km2 = np.uint32(0x03030303), np.uint32(0x0F0F0F0F)
    tmp = aux[2]
    words = [
        (aux[0] & km2) | (((tmp >> 0) & km1) << 4),
        (aux[1] & km2) | (((tmp >> 2) & km1) << 4),
        ((aux[0] >> 4) & km2) | (((tmp >> 4) & km1) << 4),
        ((aux[1] >> 4) & km2) | (((tmp >> 6) & km1) << 4),
    ]
    out = np.stack(words, axis=-1).astype("<u4").view(np.uint8).reshape((*s.shape[:-1], 16))
    return (out.astype(np.int16) - 32).astype(np.int8)


def _q6k_regroup(ql: np.ndarray, qh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's Q6_K ql [..., 128] and qh [..., 64] -> the regrouped bytes of the module doc (same shapes)."""
    lo = ql.reshape(*ql.shape[:-1], 2, 64)
    h = qh.reshape(*qh.shape[:-1], 2, 32)
    va, vb = lo[..., :32], lo[..., 32:]
    v1 = (va & 15) | ((h & 3) << 4)
    v2 = (vb & 15) | (((h >> 2) & 3) << 4)
    v3 = (va >> 4) | (((h >> 4) & 3) << 4)
    v4 = (vb >> 4) | (((h >> 6) & 3) << 4)
    b0 = v1 | ((v4 & 3) << 6)
    b1 = v2 | (((v4 >> 2) & 3) << 6)
    b2 = v3 | ((v4 >> 4) << 6)
    new_ql = np.concatenate([b0, b1], axis=-1).astype(np.uint8).reshape(ql.shape)
    return new_ql, b2.astype(np.uint8).reshape(qh.shape)


def pack(name: str, raw: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, ...]:
    """Raw ggml rows [rows, row_bytes] uint8 -> the tiled arrays the kernels take (see module doc)."""
    nsb = cols // 256
    blocks = tile_rows(raw.reshape(rows, nsb, _BLOCK_BYTES[name]), rows)  # [G, 64, nsb, bytes]
    if name in ("Q4_K", "Q5_K"):
        d, dmin = f16_field(blocks, 0), f16_field(blocks, 2)
        sc, mn = _scale_min_k4(blocks[..., 4:16])
        q0 = 48 if name == "Q5_K" else 16
        arrays = [
            row_minor(blocks[..., q0 : q0 + 128]),
            row_minor(sc),
            row_minor(mn),
            row_minor(d),
            row_minor(dmin),
        ]
        if name == "Q5_K":
            arrays.insert(1, row_minor(blocks[..., 16:48]))
        return tuple(arrays)
    if name == "Q6_K":
        d = f16_field(blocks, 208)
        sc = blocks[..., 192:208].view(np.int8)
        ql, qh = _q6k_regroup(blocks[..., 0:128], blocks[..., 128:192])
        return (row_minor(ql), row_minor(qh), row_minor(sc), row_minor(d))
    if name == "Q2_K":
        d, dmin = f16_field(blocks, 80), f16_field(blocks, 82)
        return (row_minor(blocks[..., 16:80]), row_minor(blocks[..., 0:16]), row_minor(d), row_minor(dmin))
    d = f16_field(blocks, 108)  # Q3_K
    sc = _q3_scales(blocks[..., 96:108])
    return (row_minor(blocks[..., 32:96]), row_minor(blocks[..., 0:32]), row_minor(sc), row_minor(d))


# --- per-tile inner kernels: y[0:R] = tile rows . one Q8_K activation row -----------------------------
# Helpers marked inline="always" are called with literal bit offsets so that every shift is a constant.


@numba.njit(cache=True, nogil=True, fastmath=True, inline="always")
def _sub_terms(isum, imin, sc, mn, xs, s, j, centre, R):  # pragma: no cover - numba
    """Sub-blocks j (values 32j..32j+31 of super-block s) of Q4_K/Q5_K: add the re-centring and min terms
    ``sc * centre * bsum`` to isum and ``mn * bsum`` to imin (bsum: Q8_K sums per 16 values)."""
    i0 = s * uint64(16) + j * uint64(2)
    bs = int32(xs[i0]) + int32(xs[i0 + uint64(1)])
    so = (s * uint64(8) + j) * R
    for k in range(R):
        isum[k] += int32(sc[so + k]) * (centre * bs)
        imin[k] += int32(mn[so + k]) * bs


@numba.njit(cache=True, nogil=True, fastmath=True, inline="always")
def _flush2(isum, sc, so, a, b, R):  # pragma: no cover - numba
    """isum += sc[so] * a + sc[so + R] * b (per row), then clear the int16 sums a, b."""
    for k in range(R):
        isum[k] += int32(sc[so + k]) * int32(a[k]) + int32(sc[so + R + k]) * int32(b[k])
        a[k] = 0
        b[k] = 0


@numba.njit(cache=True, nogil=True, fastmath=True, inline="always")
def _chunk_q4k(isum, imin, qs, sc, mn, xq, xs, s, c, a, b, R):  # pragma: no cover - numba
    xo = s * uint64(256) + c * uint64(64)
    qo = (s * uint64(4) + c) * uint64(32) * R
    # a, b end as sum (q - 8) x over 32 values (|.| <= 32 * 8 * 127): start from -8 sum x and add the
    # unsigned products, int16 wrapping modulo 2**16 on the way (exact, as in q32._tile_q4)
    i0 = s * uint64(16) + c * uint64(4)
    ca = int16(-8 * (int32(xs[i0]) + int32(xs[i0 + uint64(1)])))
    cb = int16(-8 * (int32(xs[i0 + uint64(2)]) + int32(xs[i0 + uint64(3)])))
    for k in range(R):
        a[k] = ca
        b[k] = cb
    for lq in range(uint64(0), uint64(32), uint64(2)):  # two values per accumulator update
        xa = int16(xq[xo + lq])
        xa2 = int16(xq[xo + lq + uint64(1)])
        xb = int16(xq[xo + uint64(32) + lq])
        xb2 = int16(xq[xo + uint64(33) + lq])
        o = qo + lq * R
        for k in range(R):
            v = qs[o + k]
            w = qs[o + R + k]
            a[k] += int16(v & 15) * xa + int16(w & 15) * xa2
            b[k] += int16(v >> 4) * xb + int16(w >> 4) * xb2
    # one pass per chunk adds the scaled sums, the re-centring (+8 sum x) and the mins
    ba = int32(xs[i0]) + int32(xs[i0 + uint64(1)])
    bb = int32(xs[i0 + uint64(2)]) + int32(xs[i0 + uint64(3)])
    so = (s * uint64(8) + uint64(2) * c) * R
    for k in range(R):
        sa = int32(sc[so + k])
        sb = int32(sc[so + R + k])
        isum[k] += sa * (int32(a[k]) + 8 * ba) + sb * (int32(b[k]) + 8 * bb)
        imin[k] += int32(mn[so + k]) * ba + int32(mn[so + R + k]) * bb


@numba.njit(cache=True, nogil=True, fastmath=True, inline="always")
def _chunk_q5k(isum, qs, qh, sc, xq, xs, s, c, sh, a, b, R):  # pragma: no cover - numba
    xo = s * uint64(256) + c * uint64(64)
    qo = (s * uint64(4) + c) * uint64(32) * R
    ho = s * uint64(32) * R
    for half in range(uint64(2)):
        # a, b end as sum (q - 16) x over 16 values (fits int16): start from -16 sum x, add unsigned
        # products (wrapping exactly, as in _chunk_q4k)
        i0 = s * uint64(16) + c * uint64(4) + half
        ca = int16(-16 * int32(xs[i0]))
        cb = int16(-16 * int32(xs[i0 + uint64(2)]))
        for k in range(R):
            a[k] = ca
            b[k] = cb
        for ll in range(uint64(16)):
            lq = half * uint64(16) + ll
            xa = int16(xq[xo + lq])
            xb = int16(xq[xo + uint64(32) + lq])
            o = qo + lq * R
            oh = ho + lq * R
            for k in range(R):
                v = qs[o + k]
                h = qh[oh + k] >> sh  # sh is a literal at every call site
                a[k] += (int16(v & 15) + int16((h & 1) << 4)) * xa
                b[k] += (int16(v >> 4) + int16((h & 2) << 3)) * xb
        _flush2(isum, sc, (s * uint64(8) + uint64(2) * c) * R, a, b, R)


@numba.njit(cache=True, nogil=True, fastmath=True)
def _tile_q45k(y, qs, qh, sc, mn, d, dm, xq, xd, xs, nsb, a, b, isum, imin, R, five):  # pragma: no cover
    for k in range(R):
        y[k] = 0.0
    centre = int32(16)  # Q5_K's re-centring, undone by _sub_terms (Q4_K's is undone in _chunk_q4k)
    for s in range(uint64(nsb)):
        for k in range(R):
            isum[k] = 0
            imin[k] = 0
        if five:
            _chunk_q5k(isum, qs, qh, sc, xq, xs, s, uint64(0), 0, a, b, R)
            _chunk_q5k(isum, qs, qh, sc, xq, xs, s, uint64(1), 2, a, b, R)
            _chunk_q5k(isum, qs, qh, sc, xq, xs, s, uint64(2), 4, a, b, R)
            _chunk_q5k(isum, qs, qh, sc, xq, xs, s, uint64(3), 6, a, b, R)
            for j in range(uint64(8)):
                _sub_terms(isum, imin, sc, mn, xs, s, j, centre, R)
        else:
            for c in range(uint64(4)):
                _chunk_q4k(isum, imin, qs, sc, mn, xq, xs, s, c, a, b, R)
        dx = xd[s]
        o = s * R
        for k in range(R):
            y[k] += dx * (d[o + k] * float32(isum[k]) - dm[o + k] * float32(imin[k]))


@numba.njit(cache=True, nogil=True, fastmath=True, inline="always")
def _flush4(isum, sc, so, a1, a2, a3, a4, R):  # pragma: no cover - numba
    """isum += sum_i sc[so + 2 i R] * a_i for the 4 sub-blocks of stride 2 (Q6_K/Q2_K/Q3_K), clear a_i."""
    for k in range(R):
        isum[k] += (
            int32(sc[so + k]) * int32(a1[k])
            + int32(sc[so + uint64(2) * R + k]) * int32(a2[k])
            + int32(sc[so + uint64(4) * R + k]) * int32(a3[k])
            + int32(sc[so + uint64(6) * R + k]) * int32(a4[k])
        )
        a1[k] = 0
        a2[k] = 0
        a3[k] = 0
        a4[k] = 0


@numba.njit(cache=True, nogil=True, fastmath=True)
def _tile_q6k(y, ql, qh, sc, d, xq, xd, nsb, a1, a2, a3, a4, isum):  # pragma: no cover - numba
    # the tile height as a compile-time constant: every row loop has a known trip count of 64 (4 ymm
    # steps), which LLVM unrolls with no remainder loop or per-entry trip checks (about 14% faster here)
    R = _R
    for k in range(R):
        y[k] = 0.0
    for s in range(uint64(nsb)):
        for k in range(R):
            isum[k] = 0
        for n in range(uint64(2)):
            xo = s * uint64(256) + n * uint64(128)
            lo = (s * uint64(2) + n) * uint64(64) * R
            ho = (s * uint64(2) + n) * uint64(32) * R
            for part in range(uint64(4)):  # 8 values per flush: 8 terms of |32 * 127|
                for ll in range(uint64(8)):
                    lq = part * uint64(8) + ll
                    x1 = int16(xq[xo + lq])
                    x2 = int16(xq[xo + uint64(32) + lq])
                    x3 = int16(xq[xo + uint64(64) + lq])
                    x4 = int16(xq[xo + uint64(96) + lq])
                    o1 = lo + lq * R
                    o2 = o1 + uint64(32) * R
                    oh = ho + lq * R
                    for k in range(R):
                        b0 = ql[o1 + k]
                        b1 = ql[o2 + k]
                        b2 = qh[oh + k]
                        v4 = (b0 >> 6) | ((b1 >> 4) & 12) | ((b2 >> 2) & 48)
                        a1[k] += (int16(b0 & 63) - int16(32)) * x1
                        a2[k] += (int16(b1 & 63) - int16(32)) * x2
                        a3[k] += (int16(b2 & 63) - int16(32)) * x3
                        a4[k] += (int16(v4) - int16(32)) * x4
                # sub-blocks of 16: n*8 + (l >= 16) + {0, 2, 4, 6}
                _flush4(
                    isum, sc, (s * uint64(16) + n * uint64(8) + (part >> uint64(1))) * R, a1, a2, a3, a4, R
                )
        dx = xd[s]
        o = s * R
        for k in range(R):
            y[k] += dx * d[o + k] * float32(isum[k])


@numba.njit(cache=True, nogil=True, fastmath=True)
def _tile_q2k(y, qs, sc, d, dm, xq, xd, xs, nsb, a1, a2, a3, a4, isum, imin, R):  # pragma: no cover
    for k in range(R):
        y[k] = 0.0
    for s in range(uint64(nsb)):
        for k in range(R):
            isum[k] = 0
            imin[k] = 0
        for n in range(uint64(2)):
            xo = s * uint64(256) + n * uint64(128)
            qo = (s * uint64(2) + n) * uint64(32) * R
            for half in range(uint64(2)):
                for ll in range(uint64(16)):
                    lq = half * uint64(16) + ll
                    x1 = int16(xq[xo + lq])
                    x2 = int16(xq[xo + uint64(32) + lq])
                    x3 = int16(xq[xo + uint64(64) + lq])
                    x4 = int16(xq[xo + uint64(96) + lq])
                    o = qo + lq * R
                    for k in range(R):
                        v = qs[o + k]
                        a1[k] += int16(v & 3) * x1
                        a2[k] += int16((v >> 2) & 3) * x2
                        a3[k] += int16((v >> 4) & 3) * x3
                        a4[k] += int16(v >> 6) * x4
                so = (s * uint64(16) + n * uint64(8) + half) * R
                for k in range(R):  # low nibble of the scale byte: scale; high nibble: min
                    isum[k] += (
                        int32(sc[so + k] & 15) * int32(a1[k])
                        + int32(sc[so + uint64(2) * R + k] & 15) * int32(a2[k])
                        + int32(sc[so + uint64(4) * R + k] & 15) * int32(a3[k])
                        + int32(sc[so + uint64(6) * R + k] & 15) * int32(a4[k])
                    )
                    a1[k] = 0
                    a2[k] = 0
                    a3[k] = 0
                    a4[k] = 0
        for j in range(uint64(16)):
            bs = int32(xs[s * uint64(16) + j])
            so = (s * uint64(16) + j) * R
            for k in range(R):
                imin[k] += int32(sc[so + k] >> 4) * bs
        dx = xd[s]
        o = s * R
        for k in range(R):
            y[k] += dx * (d[o + k] * float32(isum[k]) - dm[o + k] * float32(imin[k]))


@numba.njit(cache=True, nogil=True, fastmath=True, inline="always")
def _half_q3k(isum, qs, hm, sc, xq, s, n, hsh, a1, a2, a3, a4, R):  # pragma: no cover - numba
    xo = s * uint64(256) + n * uint64(128)
    qo = (s * uint64(2) + n) * uint64(32) * R
    ho = s * uint64(32) * R
    for half in range(uint64(2)):
        for ll in range(uint64(16)):
            lq = half * uint64(16) + ll
            x1 = int16(xq[xo + lq])
            x2 = int16(xq[xo + uint64(32) + lq])
            x3 = int16(xq[xo + uint64(64) + lq])
            x4 = int16(xq[xo + uint64(96) + lq])
            o = qo + lq * R
            oh = ho + lq * R
            for k in range(R):
                v = qs[o + k]
                h = hm[oh + k] >> hsh  # hsh is a literal (0 or 4) at both call sites
                # value = 2 low bits - (4 unless the hmask bit is set): -4..3
                a1[k] += (int16(v & 3) + int16((h & 1) << 2) - int16(4)) * x1
                a2[k] += (int16((v >> 2) & 3) + int16((h & 2) << 1) - int16(4)) * x2
                a3[k] += (int16((v >> 4) & 3) + int16(h & 4) - int16(4)) * x3
                a4[k] += (int16(v >> 6) + int16((h & 8) >> 1) - int16(4)) * x4
        _flush4(isum, sc, (s * uint64(16) + n * uint64(8) + half) * R, a1, a2, a3, a4, R)


@numba.njit(cache=True, nogil=True, fastmath=True)
def _tile_q3k(y, qs, hm, sc, d, xq, xd, nsb, a1, a2, a3, a4, isum, R):  # pragma: no cover - numba
    for k in range(R):
        y[k] = 0.0
    for s in range(uint64(nsb)):
        for k in range(R):
            isum[k] = 0
        _half_q3k(isum, qs, hm, sc, xq, s, uint64(0), 0, a1, a2, a3, a4, R)
        _half_q3k(isum, qs, hm, sc, xq, s, uint64(1), 4, a1, a2, a3, a4, R)
        dx = xd[s]
        o = s * R
        for k in range(R):
            y[k] += dx * d[o + k] * float32(isum[k])


# --- drivers: out[n, rows] = X[n, cols] @ W.T, prange over N_CHUNKS chunks of tiles --------------------


@numba.njit(cache=True, nogil=True, fastmath=True, inline="always")
def _store(out, y, t, g, rows, R):  # pragma: no cover - numba
    r0 = g * R
    for k in range(min(R, rows - r0)):
        out[t, r0 + k] = y[k]


@numba.njit(cache=True, nogil=True, fastmath=True, parallel=True)
def mv_q45k(out, qs, qh, sc, mn, d, dm, xq, xd, xs, n, rows, nsb, five):  # pragma: no cover - numba
    """Q4_K (five False, qh ignored) and Q5_K against Q8_K activations."""
    G = qs.shape[0]
    R = uint64(d.shape[1] // nsb)  # TILE_ROWS, read at run time so LLVM vectorizes rather than unrolls
    for c in prange(N_CHUNKS):
        a = np.zeros(R, np.int16)
        b = np.zeros(R, np.int16)
        isum = np.empty(R, np.int32)
        imin = np.empty(R, np.int32)
        y = np.empty(R, np.float32)
        for g in range(G * c // N_CHUNKS, G * (c + 1) // N_CHUNKS):
            for t in range(n):
                _tile_q45k(
                    y,
                    qs[g],
                    qh[g],
                    sc[g],
                    mn[g],
                    d[g],
                    dm[g],
                    xq[t],
                    xd[t],
                    xs[t],
                    nsb,
                    a,
                    b,
                    isum,
                    imin,
                    R,
                    five,
                )
                _store(out, y, t, g, rows, R)


@numba.njit(cache=True, nogil=True, fastmath=True, parallel=True)
def mv_q6k(out, ql, qh, sc, d, xq, xd, n, rows, nsb):  # pragma: no cover - numba
    """Q6_K against Q8_K activations."""
    G = ql.shape[0]
    R = uint64(d.shape[1] // nsb)  # == TILE_ROWS (pack); a constant here would let numba hoist the buffers
    for c in prange(N_CHUNKS):
        a1 = np.zeros(R, np.int16)
        a2 = np.zeros(R, np.int16)
        a3 = np.zeros(R, np.int16)
        a4 = np.zeros(R, np.int16)
        isum = np.empty(R, np.int32)
        y = np.empty(R, np.float32)
        for g in range(G * c // N_CHUNKS, G * (c + 1) // N_CHUNKS):
            for t in range(n):
                _tile_q6k(y, ql[g], qh[g], sc[g], d[g], xq[t], xd[t], nsb, a1, a2, a3, a4, isum)
                _store(out, y, t, g, rows, R)


@numba.njit(cache=True, nogil=True, fastmath=True, parallel=True)
def mv_q2k(out, qs, sc, d, dm, xq, xd, xs, n, rows, nsb):  # pragma: no cover - numba
    """Q2_K against Q8_K activations."""
    G = qs.shape[0]
    R = uint64(d.shape[1] // nsb)
    for c in prange(N_CHUNKS):
        a1 = np.zeros(R, np.int16)
        a2 = np.zeros(R, np.int16)
        a3 = np.zeros(R, np.int16)
        a4 = np.zeros(R, np.int16)
        isum = np.empty(R, np.int32)
        imin = np.empty(R, np.int32)
        y = np.empty(R, np.float32)
        for g in range(G * c // N_CHUNKS, G * (c + 1) // N_CHUNKS):
            for t in range(n):
                _tile_q2k(
                    y, qs[g], sc[g], d[g], dm[g], xq[t], xd[t], xs[t], nsb, a1, a2, a3, a4, isum, imin, R
                )
                _store(out, y, t, g, rows, R)


@numba.njit(cache=True, nogil=True, fastmath=True, parallel=True)
def mv_q3k(out, qs, hm, sc, d, xq, xd, n, rows, nsb):  # pragma: no cover - numba
    """Q3_K against Q8_K activations."""
    G = qs.shape[0]
    R = uint64(d.shape[1] // nsb)
    for c in prange(N_CHUNKS):
        a1 = np.zeros(R, np.int16)
        a2 = np.zeros(R, np.int16)
        a3 = np.zeros(R, np.int16)
        a4 = np.zeros(R, np.int16)
        isum = np.empty(R, np.int32)
        y = np.empty(R, np.float32)
        for g in range(G * c // N_CHUNKS, G * (c + 1) // N_CHUNKS):
            for t in range(n):
                _tile_q3k(y, qs[g], hm[g], sc[g], d[g], xq[t], xd[t], nsb, a1, a2, a3, a4, isum, R)
                _store(out, y, t, g, rows, R)
