"""K.Q scores and V rows of a block-type KV cache (q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1), a run of cells at once.

K.Q is ggml's generic vec_dot of each type against the query quantized to Q8_0 / Q8_1 (``quantize_q8``): per
block of 32 an integer sum ``sumi`` (exact however it is computed), then one float step per block in ggml's
order, each operation rounded to f32 (the same steps as llama-quant's ``blocks32`` tile kernels):

- Q8_0, IQ4_NL: ``sumf += sumi * (d_k * d_q)``
- Q4_0: ``sumf += (sumi * d_k) * d_q``
- Q5_0: ``sumf += (d_k * d_q) * sumi``
- Q4_1, Q5_1: ``sumf += (d_k * d_q) * sumi + m_k * s_q``

A V row is ggml's to_float: ``q * d`` (``q * d + m`` for Q4_1 / Q5_1) with q the block's integer value.

Speed: a cell's head is unpacked into int8 values (q - 8, q - 16, the IQ4_NL levels; Q8_0's bytes are read
in place) and its block scales once for all the query heads sharing the KV head; the integer sums are then
contiguous int8 x int8 -> int32 reductions. Two things keep them vector code: every index is unsigned and no
array view is made per cell (a view is reference counted), and the block length ``qk`` (32) comes in as an
argument, not a constant: with a constant trip count LLVM unrolls the 32-value loops into scalar code before
its loop vectorizer sees them. Only the short per-block float step is scalar.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import float32, int32, uint32, uint64

from llama_quant.formats.common import F16_TO_F32
from llama_quant.formats.iq4 import KVALUES_IQ4NL

__all__ = [
    "IQ4_NL",
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "Q8_0",
    "block_scores",
    "block_values",
    "head_dot",
    "unpack_head",
]

# the KVType codes (llama_engine.kv_types) of the block types
Q8_0, Q4_0, Q4_1, IQ4_NL, Q5_0, Q5_1 = 3, 4, 5, 6, 7, 8
_BYTES = np.array([0, 0, 0, 34, 18, 20, 18, 22, 24], np.int64)  # block bytes by code


@numba.njit(cache=True, nogil=True)
def unpack_head(row, ko, kind, nb, kq, d, m):  # type: ignore[no-untyped-def]
    """A cache row's head of ``nb`` blocks from byte ``ko`` -> int8 values kq [nb * 32] (the integers ggml's
    vec_dot multiplies), the block scales d [nb] and, for Q4_1 / Q5_1, the mins m [nb] (exact f32)."""
    _unpack(row.reshape(1, -1), uint64(0), uint64(ko), kind, uint64(nb), uint64(32), kq, d, m)


@numba.njit(cache=True, nogil=True)
def head_dot(kind, nb, kq, d, m, xq, xd, xs, qo):  # type: ignore[no-untyped-def]
    """The unpacked head (``unpack_head``) . the query head at value qo of one token's quantized query
    (xq [n_q], xd / xs [n_q / 32]), with K's per-block float step."""
    return _head_dot(kind, uint64(nb), uint64(32), kq, d, m, xq, xd, xs, uint64(qo))


@numba.njit(cache=True, nogil=True)
def block_scores(w, kb, cells, jlo, length, ko, kind, head_dim, group, xq, xd, xs, t, qo0, scale, qk):  # type: ignore[no-untyped-def]
    """w[g, j] = K.Q * scale for the cells[jlo + j] (j < length) of the cache layer kb (raw rows, the KV
    head from byte ko) and token t's query heads g < group from value qo0 on (xq / xd / xs: the query's
    Q8_0 or Q8_1 blocks, ``quantize_q8``); ``qk`` is the block length, 32."""
    bq = uint64(qk)
    nb = uint64(head_dim) // bq
    kq = np.empty(nb * bq, np.int8)
    d = np.empty(nb, np.float32)
    m = np.zeros(nb, np.float32)
    xqt, xdt, xst = xq[t], xd[t], xs[t]
    bb = uint64(_BYTES[kind])
    for j in range(uint64(length)):
        c = uint64(cells[jlo + j])
        if kind == Q8_0:  # the values are the row's bytes: no unpacking
            for g in range(uint64(group)):
                qo = uint64(qo0) + g * uint64(head_dim)
                sumf = float32(0.0)
                for b in range(nb):
                    o = uint64(ko) + b * bb
                    sumi = float32(_sumi_q8(kb, c, o + uint64(2), xqt, qo + b * bq, bq))
                    sumf = sumf + sumi * (_f16_at(kb, c, o) * xdt[qo // bq + b])
                w[g, j] = sumf * scale
            continue
        _unpack(kb, c, uint64(ko), kind, nb, bq, kq, d, m)
        for g in range(uint64(group)):
            qo = uint64(qo0) + g * uint64(head_dim)
            w[g, j] = _head_dot(kind, nb, bq, kq, d, m, xqt, xdt, xst, qo) * scale


@numba.njit(cache=True, nogil=True, inline="always")  # per cell: a call would count references
def block_values(v32, vb, c, vo, kind, head_dim, kq, d, m, qk):  # type: ignore[no-untyped-def]
    """v32[0:head_dim] = row c of the cache layer vb from byte vo as float32 (ggml's to_float); kq, d, m:
    scratch as ``block_scores`` makes it; ``qk`` the block length, 32."""
    bq = uint64(qk)
    nb = uint64(head_dim) // bq
    if kind == Q8_0:  # straight from the row's bytes
        bb = uint64(_BYTES[kind])
        for b in range(nb):
            o = uint64(vo) + b * bb
            db = _f16_at(vb, uint64(c), o)
            for i in range(bq):
                v32[b * bq + i] = float32(np.int8(vb[uint64(c), o + uint64(2) + i])) * db
        return
    _unpack(vb, uint64(c), uint64(vo), kind, nb, bq, kq, d, m)
    with_min = kind in (Q4_1, Q5_1)
    for b in range(nb):
        db, mb = d[b], m[b]
        for i in range(b * bq, (b + uint64(1)) * bq):
            if with_min:
                v32[i] = float32(kq[i]) * db + mb
            else:
                v32[i] = float32(kq[i]) * db


@numba.njit(cache=True, nogil=True, inline="always")
def _unpack(kb, c, ko, kind, nb, qk, kq, d, m):  # type: ignore[no-untyped-def]
    """``unpack_head`` of row c of kb (all arguments unsigned)."""
    bb = uint64(_BYTES[kind])
    half = qk // uint64(2)
    for b in range(nb):
        o = ko + b * bb
        d[b] = _f16_at(kb, c, o)
        k0 = b * qk
        if kind == Q8_0:
            for j in range(qk):
                kq[k0 + j] = np.int8(kb[c, o + uint64(2) + j])
        elif kind == Q4_0:
            _nibbles(kb, c, o + uint64(2), kq, k0, half, 8)
        elif kind == Q4_1:
            m[b] = _f16_at(kb, c, o + uint64(2))
            _nibbles(kb, c, o + uint64(4), kq, k0, half, 0)
        elif kind == IQ4_NL:
            _levels(kb, c, o + uint64(2), kq, k0, half)
        elif kind == Q5_0:
            _fifths(kb, c, o + uint64(2), kq, k0, half, 16)
        else:  # Q5_1
            m[b] = _f16_at(kb, c, o + uint64(2))
            _fifths(kb, c, o + uint64(4), kq, k0, half, 0)


@numba.njit(cache=True, nogil=True, inline="always")
def _f16_at(kb, c, o):  # type: ignore[no-untyped-def]
    return F16_TO_F32[uint64(kb[c, o]) | (uint64(kb[c, o + uint64(1)]) << uint64(8))]


@numba.njit(cache=True, nogil=True, inline="always")
def _nibbles(kb, c, o, kq, k0, half, off):  # type: ignore[no-untyped-def]
    """Low nibbles are values 0..15, high nibbles 16..31 (ggml's Q4 layout), minus ``off``."""
    z = np.int16(off)
    for j in range(half):
        v = np.int16(kb[c, o + j])
        kq[k0 + j] = np.int8((v & np.int16(15)) - z)
        kq[k0 + j + half] = np.int8((v >> np.int16(4)) - z)


@numba.njit(cache=True, nogil=True, inline="always")
def _levels(kb, c, o, kq, k0, half):  # type: ignore[no-untyped-def]
    for j in range(half):
        v = kb[c, o + j]
        kq[k0 + j] = np.int8(KVALUES_IQ4NL[v & np.uint8(15)])
        kq[k0 + j + half] = np.int8(KVALUES_IQ4NL[v >> np.uint8(4)])


@numba.njit(cache=True, nogil=True, inline="always")
def _fifths(kb, c, o, kq, k0, half, off):  # type: ignore[no-untyped-def]
    """Q5 at byte o: the fifth bits (a little-endian uint32: bit j for value j), then the nibbles."""
    h = uint32(0)
    for i in range(uint64(4)):
        h |= uint32(kb[c, o + i]) << uint32(8 * i)
    z = np.int32(off)
    for j in range(half):
        v = uint32(kb[c, o + uint64(4) + j])
        s = uint32(j)
        lo = (v & uint32(15)) | (((h >> s) & uint32(1)) << uint32(4))
        hi = (v >> uint32(4)) | (((h >> (s + uint32(16))) & uint32(1)) << uint32(4))
        kq[k0 + j] = np.int8(np.int32(lo) - z)
        kq[k0 + j + half] = np.int8(np.int32(hi) - z)


@numba.njit(cache=True, nogil=True, inline="always")
def _sumi(kq, xq, ko, qo, qk):  # type: ignore[no-untyped-def]
    """sum kq[ko + i] * xq[qo + i] over a block's qk values, in int32 (exact in any order)."""
    s = int32(0)
    for i in range(qk):
        s += int32(kq[ko + i]) * int32(xq[qo + i])
    return s


@numba.njit(cache=True, nogil=True, inline="always")
def _sumi_q8(kb, c, o, xq, qo, qk):  # type: ignore[no-untyped-def]
    """``_sumi`` over the int8 bytes of row c of kb from byte o."""
    s = int32(0)
    for i in range(qk):
        s += int32(np.int8(kb[c, o + i])) * int32(xq[qo + i])
    return s


@numba.njit(cache=True, nogil=True, inline="always")
def _head_dot(kind, nb, qk, kq, d, m, xq, xd, xs, qo):  # type: ignore[no-untyped-def]
    sumf = float32(0.0)
    b0 = qo // qk
    for b in range(nb):
        sumi = float32(_sumi(kq, xq, b * qk, qo + b * qk, qk))
        dq = xd[b0 + b]
        if kind in (Q8_0, IQ4_NL):
            sumf = sumf + sumi * (d[b] * dq)
        elif kind == Q4_0:
            sumf = sumf + (sumi * d[b]) * dq
        elif kind == Q5_0:
            sumf = sumf + (d[b] * dq) * sumi
        else:  # Q4_1, Q5_1
            sumf = sumf + ((d[b] * dq) * sumi + m[b] * xs[b0 + b])
    return sumf
