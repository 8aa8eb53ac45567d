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

from llama_quant.kernels.act import quantize_q8

from ._intrinsics import bits_f32, f32_bits, round_f16, widen
from .attention import (
    FEW_JOBS,
    NO_SINKS,
    PHASED_TOKENS,
    phase_sizes,
    prepare_qkv,
    sink_correction,
    softmax_row,
    softmax_row_sink,
)
from .expf import expf_sse2
from .kv_dots import block_scores, block_values, head_dot, unpack_head
from .products import kqv_few, round_up
from .tiles import TILE_COLS, TILE_LANES, tile_sums

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
_Q_TILE, _KV_TILE = 64, 64  # GGML_FA_TILE_Q, GGML_FA_TILE_KV
_F32_AS_F16 = 9  # flash attention casts an f32 K or V to f16 first (build_attn_mha's ggml_cast)
_NO_VT = np.zeros((1, 1), np.uint16)  # ``_run_phased``'s typed V when its V sums do not read it
_QK = 32  # the block types' block length, passed as a value (``kv_dots``: a constant would unvectorize)
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
    sinks,
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
    encoder); ``attention_typed`` (with the per-head ``sinks``, empty: none); and the output rotated back
    when v was rotated."""
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
        out, q, kc, vc, cells, lo, hi, n, n_head, n_head_kv, head_dim, kq_scale, kind_k, kind_v, flash,
        sinks=sinks,
    )  # fmt: skip
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
    out,
    q,
    kc,
    vc,
    cells,
    lo,
    hi,
    n,
    n_head,
    n_head_kv,
    head_dim,
    kq_scale,
    kind_k,
    kind_v,
    flash,
    phased=None,
    split=0,
    threads=None,
    sinks=None,
) -> None:
    """Attention of q [n, n_head * head_dim] (f32, not yet converted for K) over the cache layers kc, vc
    (any storage: read as raw bytes) into out [n, n_head * head_dim]; ``flash``: flash attention.
    ``phased``: run ``_run_phased`` (``threads``, default numba's count, and ``split``:
    ``attention.phase_sizes``' arguments) or ``_run``; None:
    phased when the (token, KV head) jobs are fewer than ``attention.FEW_JOBS``, the tokens at most
    ``attention.PHASED_TOKENS`` and there is more than one thread (the tiled kernel never is). The numbers
    are the same. ``sinks`` [n_head]: each head's attention sink logit (ggml's sinks: softmax_add_sinks
    without flash attention, flash_attn_ext_add_sinks with it); None: none."""
    nq = n_head * head_dim
    sinks = NO_SINKS if sinks is None else np.ascontiguousarray(sinks, np.float32)
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
    args = (
        out, qr, xq, xd, xs, xsum, kb, vb, cells, lo, hi, n, n_head, n_head_kv, head_dim,
        np.float32(kq_scale), kind_k, kind_v, flash, sinks,
    )  # fmt: skip
    threads = numba.get_num_threads() if threads is None else threads
    if phased is None:
        phased = threads > 1 and 0 < n <= PHASED_TOKENS and n * n_head_kv < FEW_JOBS
    # mul_mat(v, kq) on an f16 or f32 V: the register-tile product of the default kernel (``products``)
    vt = vc.view(np.uint16) if vc.dtype == np.float16 else vc
    if flash or kind_v not in (KIND_F16, KIND_F32):
        vt = _NO_VT
    if phased and not tiled and n > 0:
        _run_phased(*args, _QK, threads, split, vt)
    else:
        _run(*args, tiled, _QK, vt)


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
def _float_at(b, c, o, kind):  # type: ignore[no-untyped-def]
    """Element of row c of a float-type layer b (raw bytes) at byte offset o, as float32 (exact); row and
    offset are indexed directly (unsigned), as a row view per element would be reference counted."""
    c, o = uint64(c), uint64(o)
    if kind == KIND_F16:  # a register conversion (vcvtph2ps with F16C), not a table lookup: vector code
        return widen(np.uint16(np.uint32(b[c, o]) | (np.uint32(b[c, o + uint64(1)]) << np.uint32(8))))  # type: ignore[call-arg]
    if kind == _F32_AS_F16:
        return _f16r(_f32_at(b, c, o))
    if kind == KIND_BF16:
        return bits_f32(
            (np.uint32(b[c, o]) | (np.uint32(b[c, o + uint64(1)]) << np.uint32(8))) << np.uint32(16)
        )  # type: ignore[call-arg]
    return _f32_at(b, c, o)


@numba.njit(cache=True, nogil=True, inline="always")
def _f32_at(b, c, o):  # type: ignore[no-untyped-def]
    u = np.uint32(b[c, o]) | (np.uint32(b[c, o + uint64(1)]) << np.uint32(8))
    u |= (np.uint32(b[c, o + uint64(2)]) << np.uint32(16)) | (np.uint32(b[c, o + uint64(3)]) << np.uint32(24))
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
    int8 values q8 and block scales d, m (``kv_dots.unpack_head``)."""
    d, m, q8, kf = sc
    if _is_float(kind):
        _float_row(kf, row.reshape(1, -1), 0, ko, kind, head_dim)
        return
    unpack_head(row, ko, kind, head_dim // 32, q8, d, m)


@numba.njit(cache=True, nogil=True)
def _k_dot(kind, head_dim, sc, qr, xq, xd, xs, xsum, t, qo):  # type: ignore[no-untyped-def]
    """The decoded row (``_k_decode``) . token t's head at value qo, as K's vec_dot computes it."""
    d, m, q8, kf = sc
    if _is_float(kind):
        s = 0.0
        for i in range(head_dim):
            s += float64(kf[i] * qr[t, qo + i])  # f16/bf16 products exact in float; f32 ones rounded
        return float32(s)
    return head_dot(kind, head_dim // 32, q8, d, m, xq[t], xd[t], xs[t], qo)


@numba.njit(cache=True, nogil=True, inline="always")
def _float_row(dst, b, c, o, kind, head_dim):  # type: ignore[no-untyped-def]
    """dst[0:head_dim] = row c of a float-type layer b from byte o, as float32 (exact)."""
    w = uint64(_BLOCK_BYTES[kind])
    for i in range(uint64(head_dim)):
        dst[i] = _float_at(b, c, uint64(o) + i * w, kind)


@numba.njit(cache=True, nogil=True, inline="always")  # per cell: a call would count references
def _v_row(dst, vb, c, vo, kind, head_dim, qk):  # type: ignore[no-untyped-def]
    """dst[0:head_dim] = row c of the cache layer vb from byte vo as float32: ggml's to_float of the V
    type (``qk``: the block length, 32)."""
    if _is_float(kind):
        _float_row(dst, vb, c, vo, kind, head_dim)
    else:
        block_values(dst, vb, c, vo, kind, head_dim, qk)


@numba.njit(cache=True, nogil=True, inline="always")
def _make_scratch(head_dim):  # type: ignore[no-untyped-def]
    """(d, m, q8, kf): a block type's scales, mins and int8 values, or a float row (``_k_decode``)."""
    nb = max(head_dim // 32, 1)
    return (
        np.zeros(nb, np.float32),
        np.zeros(nb, np.float32),
        np.zeros(nb * 32, np.int8),
        np.zeros(head_dim, np.float32),
    )


@numba.njit(cache=True, nogil=True)
def _scores(w, qr, xq, xd, xs, xsum, kb, cells, jlo, length, ko, t, kh, group, head_dim, scale, kind, qk):  # type: ignore[no-untyped-def]
    """w[g, j] = K.Q * scale of cells[jlo + j] (j < length) for token t's query heads over KV head kh (K's
    vec_dot, each dot on its own); block types through ``kv_dots.block_scores``, float types through
    ``_float_scores``."""
    qo = kh * group * head_dim
    if _is_float(kind):
        _float_scores(w, qr, kb, cells, jlo, length, ko, t, qo, group, head_dim, scale, kind)
    else:
        block_scores(w, kb, cells, jlo, length, ko, kind, head_dim, group, xq, xd, xs, t, qo, scale, qk)


@numba.njit(cache=True, nogil=True)
def _float_scores(w, qr, kb, cells, jlo, length, ko, t, qo, group, head_dim, scale, kind):  # type: ignore[no-untyped-def]
    """``_scores`` for a float K: ggml's vec_dot_f16 / bf16 / f32, each product in float (exact for f16
    and bf16 values), the sum in double over the dimension in order. The cells are the register tile's
    lanes (``products.kq_few``'s layout: 8 cells by 4 query heads), so 8 dots run side by side, each in
    its own order."""
    ncol = round_up(group, TILE_COLS)
    qc = np.zeros((head_dim, ncol), np.float32)
    for g in range(group):
        for d in range(head_dim):
            qc[d, g] = qr[t, qo + g * head_dim + d]
    kt = np.zeros((head_dim, TILE_LANES), np.float32)
    res = np.empty(TILE_LANES * ncol, np.float64)
    step = uint64(_BLOCK_BYTES[kind])
    for j0 in range(0, length, TILE_LANES):
        m = min(TILE_LANES, length - j0)
        for i in range(m):  # a last block's stale lanes only feed sums that are not read
            c = cells[jlo + j0 + i]
            for d in range(uint64(head_dim)):
                kt[d, i] = _float_at(kb, c, uint64(ko) + d * step, kind)
        res[:] = 0.0
        for c0 in range(0, ncol, TILE_COLS):
            tile_sums(res, c0 * TILE_LANES, kt, 0, qc, c0, head_dim, TILE_LANES, ncol, 1, TILE_LANES)  # type: ignore[call-arg]
        for g in range(group):
            for i in range(m):
                w[g, j0 + i] = float32(res[g * TILE_LANES + i]) * scale


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
    sinks,
    tiled,
    qk,
    vt,
):  # type: ignore[no-untyped-def]
    """One job per token and KV head (its query heads read each K and V row once), or per token and query
    head for the tiled kernel, in parallel: every row of q is computed on its own, as in ggml."""
    if tiled:
        for job in prange(n * n_head):
            t = job // n_head
            h = job % n_head
            _tiled_row(
                out, qr, kb, vb, cells, lo[t], hi[t], t, h, n_head, n_head_kv, head_dim, scale, kind_k, kind_v,
                sinks,
            )  # fmt: skip
        return
    for job in prange(n * n_head_kv):
        t = job // n_head_kv
        kh = job % n_head_kv
        if flash:
            _flash_rows(
                out, qr, xq, xd, xs, xsum, kb, vb, cells, lo[t], hi[t], t, kh, n_head // n_head_kv, head_dim,
                scale, kind_k, kind_v, qk, sinks,
            )  # fmt: skip
        else:
            _mha_rows(
                out, qr, xq, xd, xs, xsum, kb, vb, cells, lo[t], hi[t], t, kh, n_head // n_head_kv, head_dim,
                scale, kind_k, kind_v, qk, vt, sinks,
            )  # fmt: skip


@numba.njit(cache=True, nogil=True, parallel=True)
def _run_phased(
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
    sinks,
    qk,
    threads,
    split,
    vt,
):  # type: ignore[no-untyped-def]
    """``_run``'s jobs (flash or not) when they are few, in three parallel phases of finer jobs that keep
    every thread busy: the K.Q values by token, KV head and run of cells; the softmax by token and query
    head; the V sums by token, KV head and part of the head's dimensions (``phase_sizes``). Each value is
    computed as in ``_flash_rows`` / ``_mha_rows``, by the same operations in the same order: only the jobs
    are cut otherwise. Without flash attention an f16 or f32 V (``vt``: the layer as the default kernel takes
    it, an f16 one as its uint16 bits) is summed by the default kernel's register tiles
    (``products.kqv_few``), the very products and sums of ``_mha_values``."""
    group = n_head // n_head_kv
    span = 1
    for t in range(n):
        span = max(span, hi[t] - lo[t])
    split, n_blk = phase_sizes(n * n_head_kv, span, head_dim, threads, split)
    n_split = (span + split - 1) // split
    w = np.empty((n, n_head, span), np.float32)  # K.Q, then the softmax's exponentials (flash: vs)
    ms = np.empty((n, n_head, span if flash else 1), np.float32)  # flash: the online softmax's ms
    norm = np.empty((n, n_head), np.float32)  # flash: S; otherwise 1 / sum
    # flash attention with sinks: each head's sink factor on its values (no columns without sinks)
    sink_ms = np.ones((n, n_head if len(sinks) else 0), np.float32)
    for job in prange(n * n_head_kv * n_split):
        tk = job // n_split
        t, kh = tk // n_head_kv, tk % n_head_kv
        c0 = job % n_split * split
        m = min(split, max(hi[t] - lo[t], 0) - c0)
        if m > 0:
            part = np.empty((group, m), np.float32)
            ko = kh * _head_bytes(kind_k, head_dim)
            _scores(
                part,
                qr,
                xq,
                xd,
                xs,
                xsum,
                kb,
                cells,
                lo[t] + c0,
                m,
                ko,
                t,
                kh,
                group,
                head_dim,
                scale,
                kind_k,
                qk,
            )
            for g in range(group):
                for j in range(m):
                    w[t, kh * group + g, c0 + j] = part[g, j]
    for job in prange(n * n_head):
        t, h = job // n_head, job % n_head
        length = max(hi[t] - lo[t], 0)
        if flash:
            big_m = _row_max(w[t, h], length)
            norm[t, h] = _online_softmax_row(w[t, h], ms[t, h], length)
            if len(sinks):
                sink_ms[t, h], norm[t, h] = sink_correction(sinks[h], big_m, norm[t, h])
        elif len(sinks):
            norm[t, h] = softmax_row_sink(w[t, h], 0, length, sinks[h])
        else:
            norm[t, h] = softmax_row(w[t, h], 0, length)
    blk = head_dim // n_blk
    for job in prange(n * n_head_kv * n_blk):
        tk = job // n_blk
        t, kh = tk // n_head_kv, tk % n_head_kv
        d0 = job % n_blk * blk
        vo = kh * _head_bytes(kind_v, head_dim) + _head_bytes(kind_v, d0)
        if not flash and kind_v in (KIND_F16, KIND_F32):
            _tile_values(out, w[t], norm[t], vt, cells, lo, hi, t, kh, group, head_dim, d0, blk)
        elif flash:
            _flash_values(
                out,
                w[t],
                ms[t],
                norm[t],
                sink_ms[t],
                vb,
                cells,
                lo[t],
                hi[t],
                t,
                kh,
                group,
                head_dim,
                d0,
                blk,
                vo,
                kind_v,
                qk,
            )
        else:
            _mha_values(
                out, w[t], norm[t], vb, cells, lo[t], hi[t], t, kh, group, head_dim, d0, blk, vo, kind_v, qk
            )


@numba.njit(cache=True, nogil=True)
def _tile_values(out, w, inv, vt, cells, lo, hi, t, kh, group, head_dim, d0, blk):  # type: ignore[no-untyped-def]
    """``_mha_values`` for an f16 or f32 V layer ``vt`` (w, inv: [n_head, .]): ``_tile_sums_out`` on the
    rows of KV head kh's query heads."""
    length = max(hi[t] - lo[t], 0)
    wg = np.empty((group, max(length, 1)), np.float32)
    ig = np.empty(group, np.float32)
    for g in range(group):
        ig[g] = inv[kh * group + g]
        for j in range(length):
            wg[g, j] = w[kh * group + g, j]
    _tile_sums_out(out, wg, ig, vt, cells, lo[t], length, t, kh, group, head_dim, d0, blk)


@numba.njit(cache=True, nogil=True)
def _tile_sums_out(out, w, inv, vt, cells, jlo, length, t, kh, group, head_dim, d0, blk):  # type: ignore[no-untyped-def]
    """mul_mat(v, kq) for an f16 or f32 V layer ``vt`` through the default kernel's register tiles
    (``products.kqv_few``): the probabilities w [group, length] * inv [group] rounded to V's type, each
    product exact (f16) or rounded to float (f32), summed in double over the cells from jlo in order; into
    token t's query heads of KV head kh, dimensions d0 .. d0 + blk."""
    rng = np.array([jlo, jlo + length], np.int64)  # every cell is the lanes' own (kqv_few's range check)
    kqv = kqv_few(w, inv, vt, cells, rng[:1], rng[1:], jlo, length, 0, group, kh * head_dim + d0, blk, group)
    for g in range(group):
        for d in range(blk):
            out[t, (kh * group + g) * head_dim + d0 + d] = float32(kqv[g, d])


@numba.njit(cache=True, nogil=True)
def _flash_values(
    out, w, ms, big_s, sink_ms, vb, cells, jlo, jhi, t, kh, group, head_dim, d0, blk, vo, kind_v, qk
):  # type: ignore[no-untyped-def]
    """``_flash_rows``' V sums and output for dimensions d0 .. d0 + blk of token t's query heads over KV
    head kh (w: vs, ms, big_s: the online softmax's, [n_head, .]; sink_ms [n_head]: the sinks' factors on
    the sums, empty without sinks); vo: byte offset of dimension d0."""
    acc = np.zeros((group, blk), np.float32)
    v32 = np.empty(blk, np.float32)
    f16v = kind_v in (KIND_F16, _F32_AS_F16)
    hd = uint64(blk)
    for j in range(max(jhi - jlo, 0)):
        _v_row(v32, vb, cells[jlo + j], vo, kind_v, blk, qk)
        for g in range(uint64(group)):
            h = uint64(kh * group) + g
            m, vs = ms[h, j], w[h, j]
            if f16v:
                for d in range(hd):
                    acc[g, d] = _f16r(_f16r(acc[g, d] * m) + v32[d] * vs)
            else:
                for d in range(hd):
                    acc[g, d] = acc[g, d] * m + v32[d] * vs
    for g in range(group):
        h = kh * group + g
        if len(sink_ms):
            for d in range(blk):
                acc[g, d] = acc[g, d] * sink_ms[h]
        inv = float32(0.0) if big_s[h] == float32(0.0) else float32(1.0) / big_s[h]
        for d in range(blk):
            out[t, h * head_dim + d0 + d] = acc[g, d] * inv


@numba.njit(cache=True, nogil=True)
def _mha_values(out, w, inv, vb, cells, jlo, jhi, t, kh, group, head_dim, d0, blk, vo, kind_v, qk):  # type: ignore[no-untyped-def]
    """``_mha_rows``' KQV sums for a bf16 V (f16 and f32: ``_tile_values``), dimensions d0 .. d0 + blk of
    token t's query heads over KV head kh (w: the softmax's exponentials, inv: 1 / their sum, [n_head, .]);
    vo: byte offset of dimension d0."""
    acc = np.zeros((group, blk), np.float64)
    v32 = np.empty(blk, np.float32)
    for j in range(max(jhi - jlo, 0)):
        _v_row(v32, vb, cells[jlo + j], vo, kind_v, blk, qk)
        for g in range(uint64(group)):
            h = uint64(kh * group) + g
            p = _bf16r(w[h, j] * inv[h])
            for d in range(uint64(blk)):
                acc[g, d] += float64(p * v32[d])  # bf16 products are exact in float
    for g in range(group):
        h = kh * group + g
        for d in range(blk):
            out[t, h * head_dim + d0 + d] = float32(acc[g, d])


@numba.njit(cache=True, nogil=True)
def _offsets(h, n_head, n_head_kv, head_dim, kind_k, kind_v):  # type: ignore[no-untyped-def]
    kh = h // (n_head // n_head_kv)
    return kh * _head_bytes(kind_k, head_dim), kh * _head_bytes(kind_v, head_dim)


@numba.njit(cache=True, nogil=True, inline="always")
def _head_bytes(kind, head_dim):  # type: ignore[no-untyped-def]
    return head_dim * _BLOCK_BYTES[kind] if _is_float(kind) else head_dim // 32 * _BLOCK_BYTES[kind]


@numba.njit(cache=True, nogil=True)
def _flash_rows(
    out,
    qr,
    xq,
    xd,
    xs,
    xsum,
    kb,
    vb,
    cells,
    jlo,
    jhi,
    t,
    kh,
    group,
    head_dim,
    scale,
    kind_k,
    kind_v,
    qk,
    sinks,
):  # type: ignore[no-untyped-def]
    """ggml_compute_forward_flash_attn_ext_f16_one_chunk for the rows of q of token t's query heads over
    KV head kh (no mask values or softcap: the cells outside [jlo, jhi) are the masked ones ggml skips);
    each head keeps its own running max, sum and accumulator; the sinks (when not empty) close each head's
    softmax after its last cell, the accumulator by then widened to f32."""
    ko, vo = kh * _head_bytes(kind_k, head_dim), kh * _head_bytes(kind_v, head_dim)
    length = max(jhi - jlo, 0)
    w = np.empty((group, max(length, 1)), np.float32)
    # the K.Q values do not depend on the running softmax: all of them first, each as ggml computes it
    _scores(w, qr, xq, xd, xs, xsum, kb, cells, jlo, length, ko, t, kh, group, head_dim, scale, kind_k, qk)
    acc = np.zeros((group, head_dim), np.float32)  # VKQ32, or VKQ16's values (each an f16) for an f16 V
    v32 = np.empty(head_dim, np.float32)
    big_s = np.zeros(group, np.float32)
    ms = np.empty((group, max(length, 1)), np.float32)
    big_m = np.empty(group, np.float32)
    for g in range(group):  # the online softmax's final maximum M, for the sinks
        big_m[g] = _row_max(w[g], length)
    _online_softmax(w, ms, big_s, group, length)  # w becomes vs
    f16v = kind_v in (KIND_F16, _F32_AS_F16)
    hd = uint64(head_dim)
    for j in range(length):
        _v_row(v32, vb, cells[jlo + j], vo, kind_v, head_dim, qk)
        for g in range(uint64(group)):
            m, vs = ms[g, j], w[g, j]
            # V = V * ms (skipped by ggml when ms is 1: x * 1 is x), then V += v * vs
            if f16v:
                for d in range(hd):
                    acc[g, d] = _f16r(_f16r(acc[g, d] * m) + v32[d] * vs)
            else:
                for d in range(hd):
                    acc[g, d] = acc[g, d] * m + v32[d] * vs
    for g in range(group):
        if len(sinks):
            sm, big_s[g] = sink_correction(sinks[kh * group + g], big_m[g], big_s[g])
            for d in range(head_dim):
                acc[g, d] = acc[g, d] * sm
        inv = float32(0.0) if big_s[g] == float32(0.0) else float32(1.0) / big_s[g]
        qo = (kh * group + g) * head_dim
        for d in range(head_dim):
            out[t, qo + d] = acc[g, d] * inv


@numba.njit(cache=True, nogil=True, inline="always")
def _row_max(w, length):  # type: ignore[no-untyped-def]
    """The largest of w[:length] (-inf when empty): the online softmax's maximum after its last cell."""
    big_m = float32(-np.inf)
    for j in range(length):
        if w[j] > big_m:
            big_m = w[j]
    return big_m


@numba.njit(cache=True, nogil=True)
def _online_softmax(w, ms, big_s, group, length):  # type: ignore[no-untyped-def]
    """The online softmax's factors for the K.Q values w [group, length], in the cells' order: a new
    maximum M gives ms = expf(M_old - M) and vs = 1, any other value ms = 1 and vs = expf(s - M); w is
    overwritten with vs, ms written, and big_s [group] = the sum S = S * ms + vs. They depend on K.Q alone,
    so they are taken apart from the V sums, whose vector code then runs without calls to expf."""
    for g in range(group):
        big_s[g] = _online_softmax_row(w[g], ms[g], length)


@numba.njit(cache=True, nogil=True)
def _online_softmax_row(w, ms, length):  # type: ignore[no-untyped-def]
    """``_online_softmax`` of one head's K.Q values w [length]: w becomes vs, ms written; returns S."""
    big_m = float32(-np.inf)
    total = float32(0.0)
    for j in range(length):
        s = w[j]
        m = float32(1.0)
        vs = float32(1.0)
        if s > big_m:
            m = float32(math.exp(big_m - s))
            big_m = s
        else:
            vs = float32(math.exp(s - big_m))
        ms[j] = m
        w[j] = vs
        total = total * m + vs
    return total


@numba.njit(cache=True, nogil=True)
def _mha_rows(
    out,
    qr,
    xq,
    xd,
    xs,
    xsum,
    kb,
    vb,
    cells,
    jlo,
    jhi,
    t,
    kh,
    group,
    head_dim,
    scale,
    kind_k,
    kind_v,
    qk,
    vt,
    sinks,
):  # type: ignore[no-untyped-def]
    """mul_mat(k, q) -> soft_max_ext -> mul_mat(v, kq) for the rows of q of token t's query heads over KV
    head kh, as ``attention``: KQ scaled in float, ggml_v_expf softmax, the probabilities converted to V's
    type, the products summed in double (an f16 or f32 V through ``_tile_sums_out`` on ``vt``; a block-type
    V needs flash attention, so the per-element loop sees a bf16 V only)."""
    ko, vo = kh * _head_bytes(kind_k, head_dim), kh * _head_bytes(kind_v, head_dim)
    length = max(jhi - jlo, 0)
    w = np.empty((group, max(length, 1)), np.float32)
    _scores(w, qr, xq, xd, xs, xsum, kb, cells, jlo, length, ko, t, kh, group, head_dim, scale, kind_k, qk)
    inv = np.empty(group, np.float32)
    for g in range(group):
        if len(sinks):
            inv[g] = softmax_row_sink(w[g], 0, length, sinks[kh * group + g])
        else:
            inv[g] = softmax_row(w[g], 0, length)
    if kind_v in (KIND_F16, KIND_F32):  # the register tiles: the same products and sums
        _tile_sums_out(out, w, inv, vt, cells, jlo, length, t, kh, group, head_dim, 0, head_dim)
        return
    acc = np.zeros((group, head_dim), np.float64)
    v32 = np.empty(head_dim, np.float32)
    for j in range(length):
        _v_row(v32, vb, cells[jlo + j], vo, kind_v, head_dim, qk)
        for g in range(uint64(group)):
            p = _bf16r(w[g, j] * inv[g])  # a bf16 V: f16 and f32 took the register tiles above
            for d in range(uint64(head_dim)):
                acc[g, d] += float64(p * v32[d])  # bf16 products are exact in float
    for g in range(group):
        qo = (kh * group + g) * head_dim
        for d in range(head_dim):
            out[t, qo + d] = float32(acc[g, d])


@numba.njit(cache=True, nogil=True)
def _tiled_row(
    out, q, kb, vb, cells, jlo, jhi, t, h, n_head, n_head_kv, head_dim, scale, kind_k, kind_v, sinks
):  # type: ignore[no-untyped-def]
    """ggml_compute_forward_flash_attn_ext_tiled for one row of q, without SIMD: the cells in tiles of
    _KV_TILE by cell index; per tile K.Q as f32 sums in order (q kept in f32, K widened), scaled; the
    running max and libm expf rescaling; the tile's exponentials through ggml_v_expf, summed as
    ggml_vec_soft_max_f32 (SSE2 groups of four, in double) into S; the weighted V rows added in f32 in
    order (simd_gemm's scalar form); the head's sink (when ``sinks`` is not empty) after the last tile.
    Masked cells are -inf in KQ: zero weights, which leave every sum as it is."""
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
                c = cells[slot_j[i]]
                sacc = float32(0.0)
                for d in range(head_dim):
                    sacc = sacc + q[t, qo + d] * _float_at(kb, c, ko + d * wk, kind_k)
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
                    a = a + kq[i] * _float_at(vb, cells[slot_j[i]], vo + d * wv, kind_v)
            acc[d] = a
    if len(sinks):
        sm, big_s = sink_correction(sinks[h], big_m, big_s)
        for d in range(head_dim):
            acc[d] = acc[d] * sm
    inv = float32(0.0) if big_s == float32(0.0) else float32(1.0) / big_s
    for d in range(head_dim):
        out[t, qo + d] = acc[d] * inv
