"""Exact kernels for the K formats (super-blocks of 256) against Q8_K activations.

Counterparts of ggml-cpu's ``ggml_vec_dot_q*_K_q8_K_generic``. Those keep 8 integer lanes per super-block,
``aux32[l] = sum over positions p = l (mod 8) of scale(p) * q8[p] * a[p]`` (exact, so computed here in any
order), and then run, per super-block and row, the float steps (each an f32 operation, no fastmath)::

    Q3_K, Q6_K:  d = fp16(x.d) * y.d;  sums[l] += d * aux32[l]
    Q4_K, Q5_K:  the same, then dmin = fp16(x.dmin) * y.d;  sumf -= dmin * sumi   (sumi = sum bsums * mins)
    Q2_K:        sumf += (y.d * fp16(x.d)) * isum - (y.d * fp16(x.dmin)) * summs   (isum = sum of the lanes)

and at the end ``for l in 0..7: sumf += sums[l]`` (Q2_K has no lanes). Repacked layouts per tile of 64 rows,
row-minor (see ``_tiles``; nsb = cols / 256):

- Q4_K: qs [G, nsb*128*64] raw bytes (chunk c of 64 values: byte l = value l | value 32 + l << 4),
  sc, mn [G, nsb*8*64] int8 (6-bit scale and min per 32 values).
- Q2_K, Q3_K, Q5_K, Q6_K: q [G, nsb*256*64] int8 (the decoded integer each product uses), sc, mn
  [G, nsb*16*64] int8 (integer scale and min per 16 values; Q3_K / Q6_K: mn and dmin are empty).
- d, dmin [G, nsb*64] f32: the fp16 super-block scales widened exactly.
"""

from __future__ import annotations

import numba
import numpy as np
from gguf import GGMLQuantizationType as T
from numba import float32, int16, int32, prange, uint64

from . import ref
from ._tiles import N_CHUNKS, TILE_ROWS, f16_field, row_minor, tile_rows

__all__ = ["KIND", "mv_k8", "mv_q4k", "pack"]

# float step of each type: 0 lanes only, 1 lanes and mins, 2 Q2_K's single sum
KIND = {T.Q2_K: 2, T.Q3_K: 0, T.Q4_K: 1, T.Q5_K: 1, T.Q6_K: 0}
_PACK_ROWS = 16 * TILE_ROWS  # rows decoded at once while packing (bounds the int64 scratch)
_DTYPES = {"q": np.int8, "sc": np.int8, "mn": np.int8, "d": np.float32, "dmin": np.float32}


def pack(qtype: T, raw: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, ...]:
    """Raw ggml rows [rows, row_bytes] uint8 -> the tiled arrays the kernels take (see module doc)."""
    nsb = cols // 256
    if qtype == T.Q4_K:
        blocks = tile_rows(raw.reshape(rows, nsb, 144), rows)  # [G, 64, nsb, 144]
        sc, mn = ref._scale_min_k4(blocks[..., 4:16])
        return (
            row_minor(blocks[..., 16:144]),
            row_minor(sc.astype(np.int8)),
            row_minor(mn.astype(np.int8)),
            row_minor(f16_field(blocks, 0)),
            row_minor(f16_field(blocks, 2)),
        )
    parts: dict[str, list[np.ndarray]] = {"q": [], "sc": [], "mn": [], "d": [], "dmin": []}
    for r0 in range(0, rows, _PACK_ROWS):
        m = min(_PACK_ROWS, rows - r0)
        dec = ref.decode(raw[r0 : r0 + m], qtype, m, cols)
        for key in ("q", "sc", "mn", "d", "dmin"):  # every integer here fits int8
            if key in dec:
                parts[key].append(row_minor(tile_rows(dec[key].astype(_DTYPES[key]), m)))
    q, sc, d = (np.concatenate(parts[k]) for k in ("q", "sc", "d"))
    if KIND[qtype] == 0:  # Q3_K / Q6_K have no mins: empty placeholders, never read
        return (q, sc, np.zeros((q.shape[0], 0), np.int8), d, np.zeros((q.shape[0], 0), np.float32))
    return (q, sc, np.concatenate(parts["mn"]), d, np.concatenate(parts["dmin"]))


# --- the float step shared by every K type ---------------------------------------------------------------


@numba.njit(cache=True, nogil=True, inline="always")
def _min_sums(isc, mn, xsum, s, R, nsub):  # pragma: no cover - numba
    """isc[k] = sum over the super-block's 16 bsums of bsum * min (``nsub`` mins per super-block: 8 for
    Q4_K, 16 otherwise), ggml's ``sumi`` (Q4_K / Q5_K) or ``summs`` (Q2_K)."""
    for k in range(R):
        isc[k] = 0
    per = uint64(16 // nsub)  # bsums per min
    for j in range(uint64(16)):
        bs = int32(xsum[s * uint64(16) + j])
        mo = (s * uint64(nsub) + j // per) * R
        for k in range(R):
            isc[k] += int32(mn[mo + k]) * bs


@numba.njit(cache=True, nogil=True, inline="always")
def _float_step(y, sums, aux, isc, d, dmin, dy, s, R, kind):  # pragma: no cover - numba
    """One super-block's float operations for the tile's rows (module doc): ``aux`` the int32 lanes
    [8 * R], ``isc`` the min sums [R] (kinds 1 and 2)."""
    do = s * R
    if kind == 2:
        for k in range(R):
            isum = aux[k]
            for lane in range(1, 8):
                isum += aux[uint64(lane) * R + k]
            dall = dy * d[do + k]
            dm = dy * dmin[do + k]
            y[k] = y[k] + (dall * float32(int32(isum)) - dm * float32(isc[k]))  # int32: not int64
        return
    for lane in range(uint64(8)):
        lo = lane * R
        for k in range(R):
            sums[lo + k] = sums[lo + k] + (d[do + k] * dy) * float32(aux[lo + k])
    if kind == 1:
        for k in range(R):
            y[k] = y[k] - (dmin[do + k] * dy) * float32(isc[k])


@numba.njit(cache=True, nogil=True, inline="always")
def _finish(y, sums, R, kind):  # pragma: no cover - numba
    if kind != 2:
        for lane in range(uint64(8)):
            lo = lane * R
            for k in range(R):
                y[k] = y[k] + sums[lo + k]


# --- Q4_K: nibbles read straight from the raw bytes ------------------------------------------------------


@numba.njit(cache=True, nogil=True)
def _tile_q4k(y, sums, aux, isc, qs, sc, mn, d, dmin, xq, xd, xsum, nsb, R):  # pragma: no cover - numba
    for k in range(R):
        y[k] = float32(0.0)
    for i in range(uint64(8) * R):
        sums[i] = float32(0.0)
    for s in range(uint64(nsb)):
        for i in range(uint64(8) * R):
            aux[i] = 0
        for c in range(uint64(4)):
            xo = s * uint64(256) + c * uint64(64)
            so = (s * uint64(8) + uint64(2) * c) * R
            for lane in range(uint64(8)):
                # lane l of chunk c: bytes l, l+8, l+16, l+24 (values l.. low, 32+l.. high): 4 products each
                xl0 = int16(xq[xo + lane])
                xl1 = int16(xq[xo + lane + uint64(8)])
                xl2 = int16(xq[xo + lane + uint64(16)])
                xl3 = int16(xq[xo + lane + uint64(24)])
                xh0 = int16(xq[xo + lane + uint64(32)])
                xh1 = int16(xq[xo + lane + uint64(40)])
                xh2 = int16(xq[xo + lane + uint64(48)])
                xh3 = int16(xq[xo + lane + uint64(56)])
                o0 = (s * uint64(128) + c * uint64(32) + lane) * R
                o1 = o0 + uint64(8) * R
                o2 = o0 + uint64(16) * R
                o3 = o0 + uint64(24) * R
                ao = lane * R
                for k in range(R):
                    v0 = qs[o0 + k]
                    v1 = qs[o1 + k]
                    v2 = qs[o2 + k]
                    v3 = qs[o3 + k]
                    lo = int16(
                        int16(v0 & 15) * xl0
                        + int16(v1 & 15) * xl1
                        + int16(v2 & 15) * xl2
                        + int16(v3 & 15) * xl3
                    )
                    hi = int16(
                        int16(v0 >> 4) * xh0
                        + int16(v1 >> 4) * xh1
                        + int16(v2 >> 4) * xh2
                        + int16(v3 >> 4) * xh3
                    )
                    aux[ao + k] += int32(sc[so + k]) * int32(lo) + int32(sc[so + R + k]) * int32(hi)
        _min_sums(isc, mn, xsum, s, R, 8)
        _float_step(y, sums, aux, isc, d, dmin, xd[s], s, R, 1)
    _finish(y, sums, R, 1)


@numba.njit(cache=True, nogil=True, parallel=True)
def mv_q4k(out, qs, sc, mn, d, dmin, xq, xd, xsum, n, rows, nsb):  # pragma: no cover - numba
    """Q4_K: out[n, rows] = X @ W.T with X given as Q8_K (xq [n, cols], xd [n, nsb], xsum [n, cols / 16])."""
    G = qs.shape[0]
    R = uint64(d.shape[1] // nsb)
    for c in prange(N_CHUNKS):
        y = np.empty(R, np.float32)
        sums = np.empty(8 * R, np.float32)
        aux = np.empty(8 * R, np.int32)
        isc = np.empty(R, np.int32)
        for g in range(G * c // N_CHUNKS, G * (c + 1) // N_CHUNKS):
            for t in range(n):
                _tile_q4k(
                    y, sums, aux, isc, qs[g], sc[g], mn[g], d[g], dmin[g], xq[t], xd[t], xsum[t], nsb, R
                )
                r0 = g * R
                for k in range(min(R, rows - r0)):
                    out[t, r0 + k] = y[k]


# --- Q2_K, Q3_K, Q5_K, Q6_K: decoded int8 values --------------------------------------------------------


@numba.njit(cache=True, nogil=True)
def _tile_k8(y, sums, aux, isc, q, sc, mn, d, dmin, xq, xd, xsum, nsb, R, kind):  # pragma: no cover - numba
    for k in range(R):
        y[k] = float32(0.0)
    for i in range(uint64(8) * R):
        sums[i] = float32(0.0)
    for s in range(uint64(nsb)):
        for i in range(uint64(8) * R):
            aux[i] = 0
        for j in range(uint64(16)):
            xo = s * uint64(256) + j * uint64(16)
            so = (s * uint64(16) + j) * R
            for lane in range(uint64(8)):
                x0 = int16(xq[xo + lane])
                x1 = int16(xq[xo + lane + uint64(8)])
                o0 = (xo + lane) * R
                o1 = o0 + uint64(8) * R
                ao = lane * R
                for k in range(R):
                    p = int16(int16(q[o0 + k]) * x0 + int16(q[o1 + k]) * x1)
                    aux[ao + k] += int32(sc[so + k]) * int32(p)
        if kind != 0:
            _min_sums(isc, mn, xsum, s, R, 16)
        _float_step(y, sums, aux, isc, d, dmin, xd[s], s, R, kind)
    _finish(y, sums, R, kind)


@numba.njit(cache=True, nogil=True, parallel=True)
def mv_k8(out, q, sc, mn, d, dmin, xq, xd, xsum, n, rows, nsb, kind):  # pragma: no cover - numba
    """Q2_K (kind 2), Q3_K / Q6_K (kind 0), Q5_K (kind 1) from the decoded int8 layout."""
    G = q.shape[0]
    R = uint64(d.shape[1] // nsb)
    for c in prange(N_CHUNKS):
        y = np.empty(R, np.float32)
        sums = np.empty(8 * R, np.float32)
        aux = np.empty(8 * R, np.int32)
        isc = np.empty(R, np.int32)
        for g in range(G * c // N_CHUNKS, G * (c + 1) // N_CHUNKS):
            for t in range(n):
                _tile_k8(
                    y, sums, aux, isc, q[g], sc[g], mn[g], d[g], dmin[g], xq[t], xd[t], xsum[t], nsb, R, kind
                )
                r0 = g * R
                for k in range(min(R, rows - r0)):
                    out[t, r0 + k] = y[k]
