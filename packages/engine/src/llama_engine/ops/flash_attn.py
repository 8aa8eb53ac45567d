"""Attention over caches of any KV type, with flash attention or with ggml's mul_mat / softmax path.

``attend_typed`` runs for flash attention (``-fa on``) and for bf16 or block-type (q8_0, q4_0, ...) caches;
f16 and f32 caches without flash attention take ``attention.attend``. Both numerics are ggml's CPU ones:

- K.Q (both paths): q converted to K's vec_dot type (f16 or bf16 rounded; Q8_0 or Q8_1 blocks for the block
  types, llama-quant's activation quantizer), then K's vec_dot: f32 / f16 / bf16 products summed in double;
  the block types through llama-quant's block kernels (ggml's generic vec_dot, float step by float step).
- Flash attention (ggml_compute_forward_flash_attn_ext_f16_one_chunk): per token and head, the cells in
  order with an online softmax through libm's expf; an f16 V accumulates in f16 (ggml_vec_mad_f16 /
  ggml_vec_scale_f16 without SIMD: widen, one f32 operation, round), other V types are converted to f32
  (to_float) and accumulate in f32; the result is scaled by 1 / S.
- Without flash attention: KQ scaled, softmax as ``attention`` (ggml_v_expf), then mul_mat(v, kq) with the
  probabilities converted to V's type (a block-type V needs flash attention, as in llama.cpp).

Not reproduced: ggml's tiled flash attention (f16/f32 K and V of one type, 64 or more tokens in a batch) and
its split-KV decode (the same types, 512 or more cells, reduced over the thread count).
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import float32, float64, prange, uint64

from llama_quant.formats.common import get_f16
from llama_quant.formats.iq4 import KVALUES_IQ4NL, _dq_iq4_nl
from llama_quant.formats.legacy import _dq_q4_0, _dq_q4_1, _dq_q5_0, _dq_q5_1, _dq_q8_0
from llama_quant.kernels.act import quantize_q8
from llama_quant.kernels.blocks32 import _tile_q4, _tile_q5, _tile_q8

from ._intrinsics import bits_f32, f32_bits, round_f16
from .attention import _softmax_sse2, prepare_qkv
from .expf import expf_sse2

__all__ = [
    "KIND_BF16",
    "KIND_F16",
    "KIND_F32",
    "attend_typed",
    "attention_typed",
    "fwht_rows",
]

# the KVType codes (llama_engine.kv_types)
KIND_F32, KIND_F16, KIND_BF16 = 0, 1, 2
_Q8_0, _Q4_0, _Q4_1, _IQ4_NL, _Q5_0, _Q5_1 = 3, 4, 5, 6, 7, 8
_Q_TILE, _KV_TILE = 64, 64  # GGML_FA_TILE_Q, GGML_FA_TILE_KV
_F32_AS_F16 = 9  # flash attention casts an f32 K or V to f16 first (build_attn_mha's ggml_cast)
_BLOCK_BYTES = np.array([4, 2, 2, 34, 18, 20, 18, 22, 24, 4], np.int64)  # per value (floats) or per 32


def attend_typed(  # type: ignore[no-untyped-def]
    out,
    qkv,
    q,
    bq,
    bk,
    bv,
    q_norm,
    k_norm,
    eps,
    pos,
    table,
    kc,
    vc,
    new_cells,
    cells,
    lo,
    hi,
    n,
    n_head,
    n_head_kv,
    head_dim,
    rope_dims,
    mode,
    q_scale,
    kq_scale,
    cols,
    kind_k,
    kind_v,
    flash,
    rot_k,
    rot_v,
    store,
) -> None:
    """``attention.attend`` for any cache type: the same preparation of q and k; with a rotated cache
    (``rot_k`` / ``rot_v`` > 0, llama.cpp's attention rotation) q and k, and v, through the Walsh-Hadamard
    transform; the new keys and values stored through ``store(cells, k_rows, v_rows)`` (the cache's
    encoder); ``attention_typed``; and the output rotated back when v was rotated."""
    nq, nk = n_head * head_dim, n_head_kv * head_dim
    prepare_qkv(
        qkv, bq, bk, bv, q_norm, k_norm, eps, pos, table, n, n_head, n_head_kv, head_dim, rope_dims, mode
    )
    _scaled(q, qkv, n, nq, np.float32(q_scale))
    if rot_k:
        fwht_rows(q, n, 0, nq, rot_k)
        fwht_rows(qkv, n, nq, nk, rot_k)
    if rot_v:
        fwht_rows(qkv, n, nq + nk, nk, rot_v)
    store(new_cells, qkv[:n, nq : nq + nk], qkv[:n, nq + nk : nq + 2 * nk])
    attention_typed(
        out, q, kc, vc, cells, lo, hi, n, n_head, n_head_kv, head_dim, kq_scale, kind_k, kind_v, flash
    )
    if rot_v:
        fwht_rows(out, n, 0, nq, rot_v)


@numba.njit(cache=True, nogil=True)
def fwht_rows(x, n, c0, width, size):  # type: ignore[no-untyped-def]
    """x[t, c0 : c0 + width] for t < n, in place, through the orthonormal Walsh-Hadamard transform of each
    run of ``size`` values (a power of two): ggml's fwht (the mul_mat hinted SRC0_IS_HADAMARD) without
    SIMD: the values times 1 / sqrtf(size), then the butterfly passes u + v, u - v from length 1 up."""
    scale = float32(1.0) / np.sqrt(float32(size))
    for t in range(n):
        for a in range(c0, c0 + width, size):
            for j in range(size):
                x[t, a + j] = x[t, a + j] * scale
            half = 1
            while half < size:
                for i in range(0, size, 2 * half):
                    for j in range(half):
                        u = x[t, a + i + j]
                        v = x[t, a + i + half + j]
                        x[t, a + i + j] = u + v
                        x[t, a + i + half + j] = u - v
                half *= 2


def attention_typed(  # type: ignore[no-untyped-def]
    out, q, kc, vc, cells, lo, hi, n, n_head, n_head_kv, head_dim, kq_scale, kind_k, kind_v, flash
) -> None:
    """Attention of q [n, n_head * head_dim] (f32, not yet converted for K) over the cache layers kc, vc
    (any storage: read as raw bytes) into out [n, n_head * head_dim]; ``flash``: flash attention."""
    nq = n_head * head_dim
    if flash:
        kind_k = _F32_AS_F16 if kind_k == KIND_F32 else kind_k
        kind_v = _F32_AS_F16 if kind_v == KIND_F32 else kind_v
    qr, xq, xd, xs, xsum = _ready(q, n, nq, kind_k)
    kb = kc.reshape(kc.shape[0], -1).view(np.uint8)
    vb = vc.reshape(vc.shape[0], -1).view(np.uint8)
    # ggml's tiled kernel: f16 K and V (f32 ones are cast to f16) and a batch of _Q_TILE tokens or more
    tiled = flash and n >= _Q_TILE and kind_k in (KIND_F16, _F32_AS_F16) and kind_v in (KIND_F16, _F32_AS_F16)
    if tiled:
        qr = np.ascontiguousarray(q[:n, :nq], np.float32)  # the tiled kernel keeps q in f32
    _run(
        out, qr, xq, xd, xs, xsum, kb, vb, cells, lo, hi, n, n_head, n_head_kv, head_dim,
        np.float32(kq_scale), kind_k, kind_v, flash, tiled,
    )  # fmt: skip


def _ready(q: np.ndarray, n: int, nq: int, kind_k: int):  # type: ignore[no-untyped-def]
    """q in K's vec_dot type: rounded floats for f16/bf16 (qr), Q8_0/Q8_1 blocks for the block types."""
    qr = np.array(q[:n, :nq], np.float32)  # a copy: rounding it in place must leave q as it is
    nb = 0 if _is_float(kind_k) else nq // 32
    xq = np.zeros((n, nb * 32), np.int8)
    xd = np.zeros((n, nb), np.float32)
    xs = np.zeros((n, nb), np.float32)
    xsum = np.zeros((n, 2 * nb), np.int32)
    if not _is_float(kind_k):
        quantize_q8(xq, xd, xs, xsum, qr, n, nq)
    else:
        _round_q(qr, n, nq, kind_k)
    return qr, xq, xd, xs, xsum


@numba.njit(cache=True, nogil=True)
def _scaled(q, qkv, n, nq, s):  # type: ignore[no-untyped-def]
    for t in range(n):
        for i in range(nq):
            x = qkv[t, i]
            if s != np.float32(1.0):
                x = x * s
            q[t, i] = x


@numba.njit(cache=True, nogil=True, inline="always")
def _f16r(x):  # type: ignore[no-untyped-def]
    """fp32 -> fp16 (nearest even) -> fp32, one register conversion each way (exact)."""
    return round_f16(x)  # type: ignore[call-arg]


@numba.njit(cache=True, nogil=True, inline="always")
def _bf16r(x):  # type: ignore[no-untyped-def]
    """ggml_compute_fp32_to_bf16 and back: round to nearest even, a NaN kept quiet."""
    u = f32_bits(x)  # type: ignore[call-arg,var-annotated]
    if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
        return bits_f32((u | np.uint32(0x00400000)) & np.uint32(0xFFFF0000))  # type: ignore[call-arg]
    r = ((u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)) << np.uint32(16)
    return bits_f32(r)  # type: ignore[call-arg]


@numba.njit(cache=True, nogil=True)
def _round_q(qr, n, nq, kind):  # type: ignore[no-untyped-def]
    if kind == KIND_F32:
        return
    for t in range(n):
        for i in range(nq):
            qr[t, i] = _bf16r(qr[t, i]) if kind == KIND_BF16 else _f16r(qr[t, i])


@numba.njit(cache=True, nogil=True, inline="always")
def _float_at(b, o, kind):  # type: ignore[no-untyped-def]
    """Element of a float-type row at byte offset o, as float32 (exact)."""
    if kind == KIND_F16:
        return get_f16(b, o)
    if kind == _F32_AS_F16:
        return _f16r(_f32_at(b, o))
    if kind == KIND_BF16:
        return bits_f32((np.uint32(b[o]) | (np.uint32(b[o + 1]) << np.uint32(8))) << np.uint32(16))  # type: ignore[call-arg]
    return _f32_at(b, o)


@numba.njit(cache=True, nogil=True, inline="always")
def _f32_at(b, o):  # type: ignore[no-untyped-def]
    u = np.uint32(b[o]) | (np.uint32(b[o + 1]) << np.uint32(8))
    u |= (np.uint32(b[o + 2]) << np.uint32(16)) | (np.uint32(b[o + 3]) << np.uint32(24))
    return bits_f32(u)  # type: ignore[call-arg]


@numba.njit(cache=True, nogil=True, inline="always")
def _is_float(kind):  # type: ignore[no-untyped-def]
    return kind <= KIND_BF16 or kind == _F32_AS_F16


@numba.njit(cache=True, nogil=True)
def _kq(row, ko, kind, head_dim, qr, xq, xd, xs, xsum, t, qo, sc):  # type: ignore[no-untyped-def]
    """K.Q of one cache row's head (from byte ko) with token t's head at value qo: ggml's vec_dot of the
    K type, as float32. ``sc`` is a scratch tuple (``_make_scratch``)."""
    _k_decode(row, ko, kind, head_dim, sc)
    return _k_dot(kind, head_dim, sc, qr, xq, xd, xs, xsum, t, qo)


@numba.njit(cache=True, nogil=True)
def _k_decode(row, ko, kind, head_dim, sc):  # type: ignore[no-untyped-def]
    """One cache row's head (from byte ko) into the scratch: float values exactly (kf), or a block type's
    fields as llama-quant's block kernels take one row (qs, qh, d, m, or int8 values q8)."""
    qs, qh, d, m, q8, _y, _acc, _acc2, _acc32, kf = sc
    if _is_float(kind):
        w = _BLOCK_BYTES[kind]
        for i in range(head_dim):
            kf[i] = _float_at(row, ko + i * w, kind)
        return
    bb = _BLOCK_BYTES[kind]
    for b in range(head_dim // 32):
        o = ko + b * bb
        d[b] = get_f16(row, o)
        if kind in (_Q4_1, _Q5_1):
            m[b] = get_f16(row, o + 2)
        if kind == _Q8_0:
            for j in range(32):
                q8[b * 32 + j] = np.int8(row[o + 2 + j])
        elif kind == _IQ4_NL:  # the Q8_0 product on the decoded values: ggml's d_y*d_x*sumi, same product
            for j in range(16):
                v = row[o + 2 + j]
                q8[b * 32 + j] = np.int8(KVALUES_IQ4NL[v & 15])
                q8[b * 32 + j + 16] = np.int8(KVALUES_IQ4NL[v >> 4])
        elif kind in (_Q4_0, _Q4_1):
            h = 2 if kind == _Q4_0 else 4
            for j in range(16):
                qs[b * 16 + j] = row[o + h + j]
        else:  # Q5_0 / Q5_1: 4 bytes of fifth bits, then the nibbles
            h = 2 if kind == _Q5_0 else 4
            for j in range(4):
                qh[b * 4 + j] = row[o + h + j]
            for j in range(16):
                qs[b * 16 + j] = row[o + h + 4 + j]


@numba.njit(cache=True, nogil=True)
def _k_dot(kind, head_dim, sc, qr, xq, xd, xs, xsum, t, qo):  # type: ignore[no-untyped-def]
    """The decoded row (``_k_decode``) . token t's head at value qo, as K's vec_dot computes it."""
    qs, qh, d, m, q8, y, acc, acc2, acc32, kf = sc
    if _is_float(kind):
        s = 0.0
        for i in range(head_dim):
            s += float64(kf[i] * qr[t, qo + i])  # f16/bf16 products exact in float; f32 ones rounded
        return float32(s)
    nb = head_dim // 32
    b0 = qo // 32
    xqt, xdt, xst, xsumt = (
        xq[t, qo : qo + head_dim],
        xd[t, b0 : b0 + nb],
        xs[t, b0 : b0 + nb],
        xsum[t, 2 * b0 :],
    )
    one = uint64(1)
    if kind in (_Q8_0, _IQ4_NL):
        _tile_q8(y, q8, d, xqt, xdt, nb, acc32, one)
    elif kind in (_Q4_0, _Q4_1):
        _tile_q4(y, qs, d, m, xqt, xdt, xst, xsumt, nb, acc, one, kind == _Q4_1)
    else:
        _tile_q5(y, qs, qh, d, m, xqt, xdt, xst, xsumt, nb, acc, acc2, one, kind == _Q5_1)
    return y[0]


@numba.njit(cache=True, nogil=True)
def _v_row(dst, row, vo, kind, head_dim):  # type: ignore[no-untyped-def]
    """dst[0:head_dim] = one cache row's head (from byte vo) as float32: ggml's to_float of the V type."""
    if _is_float(kind):
        w = _BLOCK_BYTES[kind]
        for i in range(head_dim):
            dst[i] = _float_at(row, vo + i * w, kind)
        return
    bb = _BLOCK_BYTES[kind]
    for b in range(head_dim // 32):
        blk = row[vo + b * bb : vo + (b + 1) * bb]
        y = dst[b * 32 : b * 32 + 32]
        if kind == _Q8_0:
            _dq_q8_0(blk, y)
        elif kind == _Q4_0:
            _dq_q4_0(blk, y)
        elif kind == _Q4_1:
            _dq_q4_1(blk, y)
        elif kind == _IQ4_NL:
            _dq_iq4_nl(blk, y)
        elif kind == _Q5_0:
            _dq_q5_0(blk, y)
        else:
            _dq_q5_1(blk, y)


@numba.njit(cache=True, nogil=True, inline="always")
def _make_scratch(head_dim):  # type: ignore[no-untyped-def]
    nb = max(head_dim // 32, 1)
    return (
        np.zeros(nb * 16, np.uint8),
        np.zeros(nb * 4, np.uint8),
        np.zeros(nb, np.float32),
        np.zeros(nb, np.float32),
        np.zeros(nb * 32, np.int8),
        np.zeros(1, np.float32),
        np.zeros(1, np.int16),
        np.zeros(1, np.int16),
        np.zeros(1, np.int32),
        np.zeros(head_dim, np.float32),
    )


@numba.njit(cache=True, nogil=True, parallel=True)
def _run(
    out,
    qr,
    xq,
    xd,
    xs,
    xsum,
    kb,
    vb,
    cells,
    lo,
    hi,
    n,
    n_head,
    n_head_kv,
    head_dim,
    scale,
    kind_k,
    kind_v,
    flash,
    tiled,
):  # type: ignore[no-untyped-def]
    """One job per token and KV head (its query heads read each K and V row once), or per token and query
    head for the tiled kernel, in parallel: every row of q is computed on its own, as in ggml."""
    if tiled:
        for job in prange(n * n_head):
            t = job // n_head
            h = job % n_head
            _tiled_row(
                out, qr, kb, vb, cells, lo[t], hi[t], t, h, n_head, n_head_kv, head_dim, scale, kind_k, kind_v
            )
        return
    for job in prange(n * n_head_kv):
        t = job // n_head_kv
        kh = job % n_head_kv
        if flash:
            _flash_rows(
                out, qr, xq, xd, xs, xsum, kb, vb, cells, lo[t], hi[t], t, kh, n_head // n_head_kv, head_dim,
                scale, kind_k, kind_v,
            )  # fmt: skip
        else:
            _mha_rows(
                out, qr, xq, xd, xs, xsum, kb, vb, cells, lo[t], hi[t], t, kh, n_head // n_head_kv, head_dim,
                scale, kind_k, kind_v,
            )  # fmt: skip


@numba.njit(cache=True, nogil=True)
def _offsets(h, n_head, n_head_kv, head_dim, kind_k, kind_v):  # type: ignore[no-untyped-def]
    kh = h // (n_head // n_head_kv)
    return kh * _head_bytes(kind_k, head_dim), kh * _head_bytes(kind_v, head_dim)


@numba.njit(cache=True, nogil=True, inline="always")
def _head_bytes(kind, head_dim):  # type: ignore[no-untyped-def]
    return head_dim * _BLOCK_BYTES[kind] if _is_float(kind) else head_dim // 32 * _BLOCK_BYTES[kind]


@numba.njit(cache=True, nogil=True)
def _flash_rows(
    out, qr, xq, xd, xs, xsum, kb, vb, cells, jlo, jhi, t, kh, group, head_dim, scale, kind_k, kind_v
):  # type: ignore[no-untyped-def]
    """ggml_compute_forward_flash_attn_ext_f16_one_chunk for the rows of q of token t's query heads over
    KV head kh (no mask values, sinks or softcap: the cells outside [jlo, jhi) are the masked ones ggml
    skips); each head keeps its own running max, sum and accumulator."""
    ko, vo = kh * _head_bytes(kind_k, head_dim), kh * _head_bytes(kind_v, head_dim)
    sc = _make_scratch(head_dim)
    acc = np.zeros((group, head_dim), np.float32)  # VKQ32, or VKQ16's values (each an f16) for an f16 V
    v32 = np.empty(head_dim, np.float32)
    big_s = np.zeros(group, np.float32)
    big_m = np.full(group, -np.inf, np.float32)
    f16v = kind_v in (KIND_F16, _F32_AS_F16)
    for j in range(jlo, jhi):
        c = cells[j]
        _k_decode(kb[c], ko, kind_k, head_dim, sc)
        _v_row(v32, vb[c], vo, kind_v, head_dim)
        for g in range(group):
            s = _k_dot(kind_k, head_dim, sc, qr, xq, xd, xs, xsum, t, (kh * group + g) * head_dim)
            s = s * scale
            ms = float32(1.0)
            vs = float32(1.0)
            a = acc[g]
            if s > big_m[g]:
                m_old = big_m[g]
                big_m[g] = s
                ms = float32(math.exp(m_old - s))
                for d in range(head_dim):
                    a[d] = _f16r(a[d] * ms) if f16v else a[d] * ms
            else:
                vs = float32(math.exp(s - big_m[g]))
            for d in range(head_dim):
                a[d] = _f16r(a[d] + v32[d] * vs) if f16v else a[d] + v32[d] * vs
            big_s[g] = big_s[g] * ms + vs
    for g in range(group):
        inv = float32(0.0) if big_s[g] == float32(0.0) else float32(1.0) / big_s[g]
        qo = (kh * group + g) * head_dim
        for d in range(head_dim):
            out[t, qo + d] = acc[g, d] * inv


@numba.njit(cache=True, nogil=True)
def _mha_rows(
    out, qr, xq, xd, xs, xsum, kb, vb, cells, jlo, jhi, t, kh, group, head_dim, scale, kind_k, kind_v
):  # type: ignore[no-untyped-def]
    """mul_mat(k, q) -> soft_max_ext -> mul_mat(v, kq) for the rows of q of token t's query heads over KV
    head kh, as ``attention``: KQ scaled in float, ggml_v_expf softmax, the probabilities converted to V's
    type, the products summed in double."""
    ko, vo = kh * _head_bytes(kind_k, head_dim), kh * _head_bytes(kind_v, head_dim)
    sc = _make_scratch(head_dim)
    length = jhi - jlo
    w = np.empty((group, max(length, 1)), np.float32)
    mx = np.full(group, -np.inf, np.float32)
    for j in range(length):
        _k_decode(kb[cells[jlo + j]], ko, kind_k, head_dim, sc)
        for g in range(group):
            w[g, j] = (
                _k_dot(kind_k, head_dim, sc, qr, xq, xd, xs, xsum, t, (kh * group + g) * head_dim) * scale
            )
            if w[g, j] > mx[g]:
                mx[g] = w[g, j]
    inv = np.empty(group, np.float32)
    for g in range(group):
        inv[g] = _softmax_sse2(w[g], 0, length, mx[g])
    acc = np.zeros((group, head_dim), np.float64)
    v32 = np.empty(head_dim, np.float32)
    for j in range(length):
        _v_row(v32, vb[cells[jlo + j]], vo, kind_v, head_dim)
        for g in range(group):
            p = w[g, j] * inv[g]
            if kind_v == KIND_F16:
                p = _f16r(p)
            elif kind_v == KIND_BF16:
                p = _bf16r(p)
            a = acc[g]
            for d in range(head_dim):
                a[d] += float64(p * v32[d])  # f16/bf16 products are exact in float; f32 ones rounded
    for g in range(group):
        qo = (kh * group + g) * head_dim
        for d in range(head_dim):
            out[t, qo + d] = float32(acc[g, d])


@numba.njit(cache=True, nogil=True)
def _tiled_row(out, q, kb, vb, cells, jlo, jhi, t, h, n_head, n_head_kv, head_dim, scale, kind_k, kind_v):  # type: ignore[no-untyped-def]
    """ggml_compute_forward_flash_attn_ext_tiled for one row of q, without SIMD: the cells in tiles of
    _KV_TILE by cell index; per tile K.Q as f32 sums in order (q kept in f32, K widened), scaled; the
    running max and libm expf rescaling; the tile's exponentials through ggml_v_expf, summed as
    ggml_vec_soft_max_f32 (SSE2 groups of four, in double) into S; the weighted V rows added in f32 in
    order (simd_gemm's scalar form). Masked cells are -inf in KQ: zero weights, which leave every sum
    as it is."""
    ko, vo = _offsets(h, n_head, n_head_kv, head_dim, kind_k, kind_v)
    qo = h * head_dim
    wk, wv = _BLOCK_BYTES[kind_k], _BLOCK_BYTES[kind_v]
    kq = np.empty(_KV_TILE, np.float32)
    slot_j = np.empty(_KV_TILE, np.int64)  # the range index j of each visible slot, -1 when masked
    acc = np.zeros(head_dim, np.float32)
    big_s = float32(0.0)
    big_m = float32(-np.inf)
    j = jlo
    while j < jhi:
        tile = cells[j] // _KV_TILE
        for i in range(_KV_TILE):
            slot_j[i] = -1
        while j < jhi and cells[j] // _KV_TILE == tile:
            slot_j[cells[j] % _KV_TILE] = j
            j += 1
        tile_max = float32(-np.inf)
        for i in range(_KV_TILE):
            kq[i] = float32(-np.inf)
            if slot_j[i] >= 0:
                row = kb[cells[slot_j[i]]]
                sacc = float32(0.0)
                for d in range(head_dim):
                    sacc = sacc + q[t, qo + d] * _float_at(row, ko + d * wk, kind_k)
                kq[i] = sacc * scale
            tile_max = tile_max if tile_max > kq[i] else kq[i]
        if tile_max == float32(-np.inf):
            continue
        m_new = max(big_m, tile_max)
        if m_new > big_m:
            ms = float32(math.exp(big_m - m_new))
            for d in range(head_dim):
                acc[d] = acc[d] * ms
            big_s = big_s * ms
        big_m = m_new
        total = 0.0
        for g in range(0, _KV_TILE, 4):
            e = np.zeros(4, np.float32)
            for i in range(4):
                if slot_j[g + i] >= 0:
                    e[i] = expf_sse2(kq[g + i] - m_new)
                kq[g + i] = e[i]
            total += float64((e[0] + e[1]) + (e[2] + e[3]))
        big_s = float32(float64(big_s) + total)
        for d in range(head_dim):
            a = acc[d]
            for i in range(_KV_TILE):
                if slot_j[i] >= 0:
                    a = a + kq[i] * _float_at(vb[cells[slot_j[i]]], vo + d * wv, kind_v)
            acc[d] = a
    inv = float32(0.0) if big_s == float32(0.0) else float32(1.0) / big_s
    for d in range(head_dim):
        out[t, qo + d] = acc[d] * inv
