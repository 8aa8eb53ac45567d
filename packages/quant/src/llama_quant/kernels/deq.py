"""Dequantization of row tiles to f32, for the batched (prefill) path that hands the product to BLAS.

Every kernel here writes ``wt[cols, n * 64]``: the transposed f32 weights of tiles ``g0 .. g0 + n - 1``
(column ``i * 64 + r`` = row r of tile g0 + i), so the tiled, row-innermost layout is read and written
contiguously and ``X @ wt`` is a plain sgemm with no copy. Same formulas as the matvec kernels, same
layouts (see ``q32`` and ``kq``).

These run on the calling thread on purpose: the slab is small next to the sgemm that follows (one slab
dequantizes at several G values/s), and waking numba's thread pool between OpenBLAS calls makes the two
pools' spinning workers compete for the same 2 cores.
"""

from __future__ import annotations

import numba
from numba import float32, int16, uint64

__all__ = ["deq_q2k", "deq_q3k", "deq_q4", "deq_q5", "deq_q6k", "deq_q8", "deq_q45k"]


@numba.njit(cache=True, nogil=True, fastmath=True)
def deq_q4(wt, qs, d, m, g0, n, nb, has_min):  # pragma: no cover - numba
    R = uint64(d.shape[1] // nb)
    for i in range(n):
        g = g0 + i
        c0 = uint64(i) * R
        q = qs[g]
        for b in range(uint64(nb)):
            for j in range(uint64(16)):
                o = (b * uint64(16) + j) * R
                lo = wt[b * uint64(32) + j]
                hi = wt[b * uint64(32) + uint64(16) + j]
                for k in range(R):
                    v = q[o + k]
                    s = d[g, b * R + k]
                    mm = m[g, b * R + k] if has_min else float32(0.0)
                    lo[c0 + k] = s * float32(int16(v & 15) - int16(8)) + mm
                    hi[c0 + k] = s * float32(int16(v >> 4) - int16(8)) + mm


@numba.njit(cache=True, nogil=True, fastmath=True)
def deq_q5(wt, qs, qh, d, m, g0, n, nb, has_min):  # pragma: no cover - numba
    R = uint64(d.shape[1] // nb)
    for i in range(n):
        g = g0 + i
        c0 = uint64(i) * R
        for b in range(uint64(nb)):
            for j in range(uint64(16)):
                o = (b * uint64(16) + j) * R
                hlo = (b * uint64(4) + (j >> uint64(3))) * R
                hhi = hlo + uint64(2) * R
                sh = j & uint64(7)
                lo = wt[b * uint64(32) + j]
                hi = wt[b * uint64(32) + uint64(16) + j]
                for k in range(R):
                    v = qs[g, o + k]
                    s = d[g, b * R + k]
                    mm = m[g, b * R + k] if has_min else float32(0.0)
                    ql = int16(v & 15) | int16(((qh[g, hlo + k] >> sh) & 1) << 4)
                    qu = int16(v >> 4) | int16(((qh[g, hhi + k] >> sh) & 1) << 4)
                    lo[c0 + k] = s * float32(ql - int16(16)) + mm
                    hi[c0 + k] = s * float32(qu - int16(16)) + mm


@numba.njit(cache=True, nogil=True, fastmath=True)
def deq_q8(wt, qs, d, g0, n, nb):  # pragma: no cover - numba
    R = uint64(d.shape[1] // nb)
    for i in range(n):
        g = g0 + i
        c0 = uint64(i) * R
        for b in range(uint64(nb)):
            for j in range(uint64(32)):
                o = (b * uint64(32) + j) * R
                row = wt[b * uint64(32) + j]
                for k in range(R):
                    row[c0 + k] = d[g, b * R + k] * float32(qs[g, o + k])


@numba.njit(cache=True, nogil=True, fastmath=True)
def deq_q45k(wt, qs, qh, sc, mn, d, dm, g0, n, nsb, five):  # pragma: no cover - numba
    R = uint64(d.shape[1] // nsb)
    for i in range(n):
        g = g0 + i
        c0 = uint64(i) * R
        for s in range(uint64(nsb)):
            for c in range(uint64(4)):
                sa = (s * uint64(8) + uint64(2) * c) * R
                for lq in range(uint64(32)):
                    o = ((s * uint64(4) + c) * uint64(32) + lq) * R
                    oh = (s * uint64(32) + lq) * R
                    lo = wt[s * uint64(256) + c * uint64(64) + lq]
                    hi = wt[s * uint64(256) + c * uint64(64) + uint64(32) + lq]
                    for k in range(R):
                        v = qs[g, o + k]
                        ql = int16(v & 15)
                        qu = int16(v >> 4)
                        if five:
                            h = qh[g, oh + k] >> (uint64(2) * c)
                            ql += int16((h & 1) << 4)
                            qu += int16((h & 2) << 3)
                        dd = d[g, s * R + k]
                        mm = dm[g, s * R + k]
                        lo[c0 + k] = dd * float32(sc[g, sa + k]) * float32(ql) - mm * float32(mn[g, sa + k])
                        hi[c0 + k] = dd * float32(sc[g, sa + R + k]) * float32(qu) - mm * float32(
                            mn[g, sa + R + k]
                        )


@numba.njit(cache=True, nogil=True, fastmath=True)
def deq_q6k(wt, ql, qh, sc, d, g0, n, nsb):  # pragma: no cover - numba
    R = uint64(d.shape[1] // nsb)
    for i in range(n):
        g = g0 + i
        c0 = uint64(i) * R
        for s in range(uint64(nsb)):
            for h2 in range(uint64(2)):
                for lq in range(uint64(32)):
                    o1 = ((s * uint64(2) + h2) * uint64(64) + lq) * R
                    o2 = o1 + uint64(32) * R
                    oh = ((s * uint64(2) + h2) * uint64(32) + lq) * R
                    so = (s * uint64(16) + h2 * uint64(8) + (lq >> uint64(4))) * R
                    e = s * uint64(256) + h2 * uint64(128) + lq
                    r1 = wt[e]
                    r2 = wt[e + uint64(32)]
                    r3 = wt[e + uint64(64)]
                    r4 = wt[e + uint64(96)]
                    for k in range(R):  # the regrouped bytes of kq.pack
                        b0 = ql[g, o1 + k]
                        b1 = ql[g, o2 + k]
                        b2 = qh[g, oh + k]
                        v4 = (b0 >> 6) | ((b1 >> 4) & 12) | ((b2 >> 2) & 48)
                        dd = d[g, s * R + k]
                        r1[c0 + k] = dd * float32(sc[g, so + k]) * float32(int16(b0 & 63) - 32)
                        r2[c0 + k] = (
                            dd * float32(sc[g, so + uint64(2) * R + k]) * float32(int16(b1 & 63) - 32)
                        )
                        r3[c0 + k] = (
                            dd * float32(sc[g, so + uint64(4) * R + k]) * float32(int16(b2 & 63) - 32)
                        )
                        r4[c0 + k] = dd * float32(sc[g, so + uint64(6) * R + k]) * float32(int16(v4) - 32)


@numba.njit(cache=True, nogil=True, fastmath=True)
def deq_q2k(wt, qs, sc, d, dm, g0, n, nsb):  # pragma: no cover - numba
    R = uint64(d.shape[1] // nsb)
    for i in range(n):
        g = g0 + i
        c0 = uint64(i) * R
        for s in range(uint64(nsb)):
            for h2 in range(uint64(2)):
                for j in range(uint64(4)):
                    for lq in range(uint64(32)):
                        o = ((s * uint64(2) + h2) * uint64(32) + lq) * R
                        so = (s * uint64(16) + h2 * uint64(8) + j * uint64(2) + (lq >> uint64(4))) * R
                        row = wt[s * uint64(256) + h2 * uint64(128) + j * uint64(32) + lq]
                        for k in range(R):
                            q = (qs[g, o + k] >> (uint64(2) * j)) & 3
                            b = sc[g, so + k]
                            row[c0 + k] = d[g, s * R + k] * float32(b & 15) * float32(q) - dm[
                                g, s * R + k
                            ] * float32(b >> 4)


@numba.njit(cache=True, nogil=True, fastmath=True)
def deq_q3k(wt, qs, hm, sc, d, g0, n, nsb):  # pragma: no cover - numba
    R = uint64(d.shape[1] // nsb)
    for i in range(n):
        g = g0 + i
        c0 = uint64(i) * R
        for s in range(uint64(nsb)):
            for h2 in range(uint64(2)):
                for j in range(uint64(4)):
                    for lq in range(uint64(32)):
                        o = ((s * uint64(2) + h2) * uint64(32) + lq) * R
                        oh = (s * uint64(32) + lq) * R
                        so = (s * uint64(16) + h2 * uint64(8) + j * uint64(2) + (lq >> uint64(4))) * R
                        row = wt[s * uint64(256) + h2 * uint64(128) + j * uint64(32) + lq]
                        for k in range(R):
                            q = int16((qs[g, o + k] >> (uint64(2) * j)) & 3)
                            hb = int16((hm[g, oh + k] >> (uint64(4) * h2 + j)) & 1)
                            row[c0 + k] = d[g, s * R + k] * float32(sc[g, so + k]) * float32(q + hb * 4 - 4)
