"""K.Q scores and V rows of a block-type KV cache (q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1), a run of cells at once.

K.Q is ggml's generic vec_dot of each type against the query quantized to Q8_0 / Q8_1 (``quantize_q8``): per
block of 32 an integer sum ``sumi`` (exact however it is computed), then one float step per block in ggml's
order, each operation rounded to f32 (the same steps as llama-quant's ``blocks32`` tile kernels):

- Q8_0, IQ4_NL: ``sumf += sumi * (d_k * d_q)``
- Q4_0: ``sumf += (sumi * d_k) * d_q``
- Q5_0: ``sumf += (d_k * d_q) * sumi``
- Q4_1, Q5_1: ``sumf += (d_k * d_q) * sumi + m_k * s_q``

A V row is ggml's to_float: ``q * d`` (``q * d + m`` for Q4_1 / Q5_1) with q the block's integer value.

Speed: ``block_scores`` and ``block_values`` decode the values from the row's bytes in the loops that use
them (nibbles, fifth bits, IQ4_NL's levels through an exact integer quartic, Q8_0's bytes in place), one copy
of the loops per type with the type a constant; only IQ4_NL's levels are decoded once per cell into int8
values for all the query heads sharing the KV head (the quartic costs more than a reload). Three things keep
the loops vector code: every index is unsigned and no array view is made per cell (a view is reference
counted); a loop stores to one place (the values i and i + 16 of a block, which come from byte i, are
written by two loops, not one); and the block length ``qk`` (32) comes in as an argument, not a constant:
with a constant trip count LLVM unrolls the loops into scalar code before its loop vectorizer sees them.
Only the short per-block float step is scalar. ``unpack_head`` / ``head_dot`` (one row at a time, into
scratch) are the plain form the tests compare against.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import float32, int32, uint32, uint64

from llama_quant.formats.common import F16_TO_F32

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
    "iq4nl_level",
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
    Q8_0 or Q8_1 blocks, ``quantize_q8``); ``qk`` is the block length, 32. Each block's integer sum reads
    the row's bytes and decodes them as it goes (``_sumi_row``); the values are not stored first. One
    copy of the loops per type (the type a constant in each: its branches fold away)."""
    xqt, xdt, xst = xq[t], xd[t], xs[t]
    if kind == Q8_0:
        _scores_of(Q8_0, w, kb, cells, jlo, length, ko, head_dim, group, xqt, xdt, xst, qo0, scale, qk)
    elif kind == Q4_0:
        _scores_of(Q4_0, w, kb, cells, jlo, length, ko, head_dim, group, xqt, xdt, xst, qo0, scale, qk)
    elif kind == Q4_1:
        _scores_of(Q4_1, w, kb, cells, jlo, length, ko, head_dim, group, xqt, xdt, xst, qo0, scale, qk)
    elif kind == IQ4_NL:
        _scores_of(IQ4_NL, w, kb, cells, jlo, length, ko, head_dim, group, xqt, xdt, xst, qo0, scale, qk)
    elif kind == Q5_0:
        _scores_of(Q5_0, w, kb, cells, jlo, length, ko, head_dim, group, xqt, xdt, xst, qo0, scale, qk)
    else:
        _scores_of(Q5_1, w, kb, cells, jlo, length, ko, head_dim, group, xqt, xdt, xst, qo0, scale, qk)


@numba.njit(cache=True, nogil=True, inline="always")
def _scores_of(kind, w, kb, cells, jlo, length, ko, head_dim, group, xqt, xdt, xst, qo0, scale, qk):  # type: ignore[no-untyped-def]
    bq = uint64(qk)
    nb = uint64(head_dim) // bq
    bb = uint64(_BYTES[kind])
    half = bq // uint64(2)
    kq = np.empty(nb * bq, np.int8)  # IQ4_NL's levels, decoded once for all the heads
    for j in range(uint64(length)):
        c = uint64(cells[jlo + j])
        if kind == IQ4_NL:
            for b in range(nb):
                _levels(kb, c, uint64(ko) + b * bb + uint64(2), kq, b * bq, half)
        for g in range(uint64(group)):
            qo = uint64(qo0) + g * uint64(head_dim)
            b0 = qo // bq
            sumf = float32(0.0)
            for b in range(nb):
                o = uint64(ko) + b * bb
                if kind == IQ4_NL:
                    sumi = float32(_sumi(kq, xqt, b * bq, qo + b * bq, bq))
                else:
                    sumi = float32(_sumi_row(kind, kb, c, o, xqt, qo + b * bq, bq))
                mk = _f16_at(kb, c, o + uint64(2)) if kind in (Q4_1, Q5_1) else float32(0.0)
                sumf = _step(kind, sumf, sumi, _f16_at(kb, c, o), mk, xdt[b0 + b], xst[b0 + b])
            w[g, j] = sumf * scale


@numba.njit(cache=True, nogil=True, inline="always")  # per cell: a call would count references
def block_values(v32, vb, c, vo, kind, head_dim, qk):  # type: ignore[no-untyped-def]
    """v32[0:head_dim] = row c of the cache layer vb from byte vo as float32 (ggml's to_float), decoded
    straight from the row's bytes (one copy of the loops per type, as ``block_scores``); ``qk`` the block
    length, 32."""
    c, vo = uint64(c), uint64(vo)
    if kind == Q8_0:
        _values_of(Q8_0, v32, vb, c, vo, head_dim, qk)
    elif kind == Q4_0:
        _values_of(Q4_0, v32, vb, c, vo, head_dim, qk)
    elif kind == Q4_1:
        _values_of(Q4_1, v32, vb, c, vo, head_dim, qk)
    elif kind == IQ4_NL:
        _values_of(IQ4_NL, v32, vb, c, vo, head_dim, qk)
    elif kind == Q5_0:
        _values_of(Q5_0, v32, vb, c, vo, head_dim, qk)
    else:
        _values_of(Q5_1, v32, vb, c, vo, head_dim, qk)


@numba.njit(cache=True, nogil=True, inline="always")
def _values_of(kind, v32, vb, c, vo, head_dim, qk):  # type: ignore[no-untyped-def]
    bq = uint64(qk)
    nb = uint64(head_dim) // bq
    bb = uint64(_BYTES[kind])
    half = bq // uint64(2)
    for b in range(nb):
        o = vo + b * bb
        db = _f16_at(vb, c, o)
        if kind == Q8_0:
            for i in range(bq):
                v32[b * bq + i] = float32(np.int8(vb[c, o + uint64(2) + i])) * db
        elif kind == Q4_0:
            for i in range(half):
                x = np.int32(vb[c, o + uint64(2) + i])
                v32[b * bq + i] = float32((x & np.int32(15)) - np.int32(8)) * db
            for i in range(half):
                x = np.int32(vb[c, o + uint64(2) + i])
                v32[b * bq + half + i] = float32((x >> np.int32(4)) - np.int32(8)) * db
        elif kind == Q4_1:
            mb = _f16_at(vb, c, o + uint64(2))
            for i in range(half):
                x = np.int32(vb[c, o + uint64(4) + i])
                v32[b * bq + i] = float32(x & np.int32(15)) * db + mb
            for i in range(half):
                x = np.int32(vb[c, o + uint64(4) + i])
                v32[b * bq + half + i] = float32(x >> np.int32(4)) * db + mb
        elif kind == IQ4_NL:
            for i in range(half):
                x = np.int32(vb[c, o + uint64(2) + i])
                v32[b * bq + i] = iq4nl_level(x & np.int32(15)) * db
            for i in range(half):
                x = np.int32(vb[c, o + uint64(2) + i])
                v32[b * bq + half + i] = iq4nl_level(x >> np.int32(4)) * db
        elif kind == Q5_0:
            h = _bits32(vb, c, o + uint64(2))
            for i in range(half):
                x = np.int32(vb[c, o + uint64(6) + i])
                v32[b * bq + i] = float32(((x & np.int32(15)) | _bit4(h, i)) - np.int32(16)) * db
            for i in range(half):
                x = np.int32(vb[c, o + uint64(6) + i])
                v32[b * bq + half + i] = (
                    float32(((x >> np.int32(4)) | _bit4(h, i + half)) - np.int32(16)) * db
                )
        else:  # Q5_1
            mb = _f16_at(vb, c, o + uint64(2))
            h = _bits32(vb, c, o + uint64(4))
            for i in range(half):
                x = np.int32(vb[c, o + uint64(8) + i])
                v32[b * bq + i] = float32((x & np.int32(15)) | _bit4(h, i)) * db + mb
            for i in range(half):
                x = np.int32(vb[c, o + uint64(8) + i])
                v32[b * bq + half + i] = float32((x >> np.int32(4)) | _bit4(h, i + half)) * db + mb


@numba.njit(cache=True, nogil=True, inline="always")
def _bit4(h, i):  # type: ignore[no-untyped-def]
    """Bit i of h as the value 16 or 0 (int32)."""
    return np.int32(((h >> uint32(i)) & uint32(1)) << uint32(4))


@numba.njit(cache=True, nogil=True, inline="always")
def _sumi_row(kind, kb, c, o, xq, qo, qk):  # type: ignore[no-untyped-def]
    """sum q_i * xq[qo + i] over the block of row c of kb at byte o (its scale first), the integers q_i
    decoded from the bytes as they are read: the same int32 sum as ``_sumi`` over the unpacked values.
    Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 (IQ4_NL's levels are decoded once per cell, ``_levels``)."""
    if kind == Q8_0:
        return _sumi_q8(kb, c, o + uint64(2), xq, qo, qk)
    half = qk // uint64(2)
    s = int32(0)
    if kind == Q4_0:
        for i in range(half):
            x = np.int32(kb[c, o + uint64(2) + i])
            s += ((x & np.int32(15)) - np.int32(8)) * np.int32(xq[qo + i])
            s += ((x >> np.int32(4)) - np.int32(8)) * np.int32(xq[qo + half + i])
    elif kind == Q4_1:
        for i in range(half):
            x = np.int32(kb[c, o + uint64(4) + i])
            s += (x & np.int32(15)) * np.int32(xq[qo + i]) + (x >> np.int32(4)) * np.int32(xq[qo + half + i])
    elif kind == Q5_0:
        h = _bits32(kb, c, o + uint64(2))
        for i in range(half):
            lo, hi = _fifth(kb, c, o + uint64(6), h, i)
            s += (lo - np.int32(16)) * np.int32(xq[qo + i]) + (hi - np.int32(16)) * np.int32(
                xq[qo + half + i]
            )
    else:  # Q5_1
        h = _bits32(kb, c, o + uint64(4))
        for i in range(half):
            lo, hi = _fifth(kb, c, o + uint64(8), h, i)
            s += lo * np.int32(xq[qo + i]) + hi * np.int32(xq[qo + half + i])
    return s


@numba.njit(cache=True, nogil=True, inline="always")
def _bits32(kb, c, o):  # type: ignore[no-untyped-def]
    """The little-endian uint32 at byte o of row c (Q5's fifth bits: bit j for value j)."""
    h = uint32(0)
    for i in range(uint64(4)):
        h |= uint32(kb[c, o + i]) << uint32(8 * i)
    return h


@numba.njit(cache=True, nogil=True, inline="always")
def _fifth(kb, c, o, h, i):  # type: ignore[no-untyped-def]
    """Q5 values i and i + 16 (0..31, int32) from nibble byte i at byte o on and the fifth bits h."""
    v = uint32(kb[c, o + i])
    s = uint32(i)
    lo = (v & uint32(15)) | (((h >> s) & uint32(1)) << uint32(4))
    hi = (v >> uint32(4)) | (((h >> (s + uint32(16))) & uint32(1)) << uint32(4))
    return np.int32(lo), np.int32(hi)


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
    """IQ4_NL's nibbles (Q4's layout) at byte o -> their levels (``iq4nl_level``) as int8 into kq from k0:
    one loop per half (a loop storing both stays scalar)."""
    for j in range(half):
        kq[k0 + j] = np.int8(np.int32(iq4nl_level(np.int32(kb[c, o + j]) & np.int32(15))))
    for j in range(half):
        kq[k0 + half + j] = np.int8(np.int32(iq4nl_level(np.int32(kb[c, o + j]) >> np.int32(4))))


@numba.njit(cache=True, nogil=True, inline="always")
def iq4nl_level(q):  # type: ignore[no-untyped-def]
    """KVALUES_IQ4NL[q] for a nibble q (int32, 0..15), exactly, as float32: the integer quartic
    floor((11 q^4 + 336 q^3 - 12293 q^2 + 202694 q - 1036648) / 2^13), which meets the table at all 16
    points. It is taken in float32: every intermediate is an integer under 2^24 in magnitude, so each
    operation is exact, and float arithmetic stays 32 bits wide in vector code (numba widens int32
    products to int64)."""
    x = float32(q)
    r = ((float32(11.0) * x + float32(336.0)) * x - float32(12293.0)) * x
    r = (r + float32(202694.0)) * x - float32(1036648.0)
    return np.floor(r * float32(1.0 / 8192.0))


@numba.njit(cache=True, nogil=True, inline="always")
def _fifths(kb, c, o, kq, k0, half, off):  # type: ignore[no-untyped-def]
    """Q5 at byte o: the fifth bits (``_bits32``), then the nibbles (``_fifth``), minus ``off``."""
    h = _bits32(kb, c, o)
    z = np.int32(off)
    for j in range(half):
        lo, hi = _fifth(kb, c, o + uint64(4), h, j)
        kq[k0 + j] = np.int8(lo - z)
        kq[k0 + j + half] = np.int8(hi - z)


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
        sumf = _step(kind, sumf, sumi, d[b], m[b], xd[b0 + b], xs[b0 + b])
    return sumf


@numba.njit(cache=True, nogil=True, inline="always")
def _step(kind, sumf, sumi, dk, mk, dq, sq):  # type: ignore[no-untyped-def]
    """One block's float step of K's vec_dot (the module's table), each operation rounded to f32."""
    if kind in (Q8_0, IQ4_NL):
        return sumf + sumi * (dk * dq)
    if kind == Q4_0:
        return sumf + (sumi * dk) * dq
    if kind == Q5_0:
        return sumf + (dk * dq) * sumi
    return sumf + ((dk * dq) * sumi + mk * sq)  # Q4_1, Q5_1
