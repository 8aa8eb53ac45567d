"""Softmax attention over the KV cache with ggml's CPU numerics, and a layer's whole attention step.

``attention``: token t attends to cells[lo[t]:hi[t]] of one cache layer; grouped-query heads share a KV head.
As ggml_mul_mat(k, q) -> ggml_soft_max_ext -> ggml_mul_mat(v, kq): KQ dots summed in double over the
dimension in order, scaled in float; softmax through ggml_v_expf (SSE2) four at a time with the SSE2
horizontal sum, in double; KQV sums in double over the cells in order. An f16 cache computes as ggml does
with f16 K and V: q rounded to f16 for the KQ dots, the probabilities rounded to f16 for the KQV sums.

``attend`` is the step a layer runs after its q/k/v product, in one call (biases, per-head norms, RoPE, the
cache stores, attention). The many-lane (prompt) products use register tiles ``tiles_for(kernels)`` columns
wide; every width gives the same numbers.

Compile cost: the cache type is part of a kernel's signature (an f16 cache is passed as its uint16 view), and
every f16-or-f32 choice is made from it when the kernel is compiled (``_intrinsics.to_cache``,
``products.product_zeros``), so a model compiles only its own cache type's code. The parallel loop's body is
one call (``_attention_job``), and each product is its own compiled function (``products``).
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import prange, uint64

from llama_quant.cpu import KernelSet, resolve_kernel_set

from ._intrinsics import as_cache, store_rows
from .expf import expf_in_range, expf_main, expf_sse2
from .norm import rms_norm_row
from .products import kq_few, kq_many, kqv_few, kqv_many
from .rope import rope_cols
from .tiles import TILE_COLS

__all__ = [
    "FEW_JOBS",
    "NO_SINKS",
    "PHASED_TOKENS",
    "TILE_WIDTHS",
    "attend",
    "attention",
    "phase_sizes",
    "prepare_qkv",
    "sink_correction",
    "softmax_row",
    "softmax_row_sink",
    "tiles_for",
]

TILE_WIDTHS = (TILE_COLS, 8)  # the many-lane tiles' column counts the kernels are built for
NO_SINKS = np.zeros(0, np.float32)  # the attention sinks of a model without them


def tiles_for(kernels: KernelSet) -> int:
    """The many-lane tile width for a kernel set: 8 columns where AVX-512's 32 registers hold them, else 4."""
    return 8 if kernels >= KernelSet.AVX512 else TILE_COLS


def attention(
    out: np.ndarray,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    cells: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    n: int,
    n_head: int,
    n_head_kv: int,
    head_dim: int,
    scale: float,
    tile_cols: int | None = None,
    sinks: np.ndarray | None = None,
) -> None:
    """Attention (the module doc) of q [n, n_head * head_dim] over k, v [n_cells, n_head_kv * head_dim]
    (float16 or float32) into out [n, n_head * head_dim]; ``tile_cols`` (4 or 8) defaults to the host's
    kernel set's; ``sinks`` [n_head] (float32): each head's learned sink logit, a term of the softmax's
    denominator only (ggml_soft_max_add_sinks)."""
    cols = tiles_for(resolve_kernel_set(None)) if tile_cols is None else tile_cols
    if cols not in TILE_WIDTHS:
        raise ValueError(f"tile_cols must be one of {TILE_WIDTHS}, got {cols}")
    kc, vc = (x.view(np.uint16) if x.dtype == np.float16 else x for x in (k, v))
    qq = np.empty_like(q)
    _ready_q(qq, q, 0, n, q.shape[1], np.float32(1.0), kc)
    sk = NO_SINKS if sinks is None else np.ascontiguousarray(sinks, np.float32)
    _attend_ready(out, qq, kc, vc, cells, lo, hi, n, n_head, n_head_kv, head_dim, np.float32(scale), cols, sk)


@numba.njit(cache=True, nogil=True)
def attend(  # type: ignore[no-untyped-def]
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
):
    """A layer's attention from its fused product qkv [n, (n_head + 2 * n_head_kv) * head_dim] (q | k | v),
    in the graph's order: the biases bq, bk, bv, the per-head norms q_norm, k_norm (each skipped when
    empty), RoPE on q and k, q times ``q_scale`` into the scratch q [n, n_head * head_dim] (rounded to f16
    for an f16 K cache), k and v stored in the cache layer at ``new_cells`` (kc / vc: float32, or an f16
    cache's uint16 view), then ``attention`` with ``kq_scale`` and the per-head ``sinks`` (empty: none)
    into out. qkv is overwritten."""
    nq, nk = n_head * head_dim, n_head_kv * head_dim
    prepare_qkv(
        qkv, bq, bk, bv, q_norm, k_norm, eps, pos, table, n, n_head, n_head_kv, head_dim, rope_dims, mode
    )
    _ready_q(q, qkv, 0, n, nq, q_scale, kc)
    store_rows(kc, new_cells, qkv, nq, nk)
    store_rows(vc, new_cells, qkv, nq + nk, nk)
    _attend_ready(out, q, kc, vc, cells, lo, hi, n, n_head, n_head_kv, head_dim, kq_scale, cols, sinks)


@numba.njit(cache=True, nogil=True, inline="always")
def prepare_qkv(
    qkv, bq, bk, bv, q_norm, k_norm, eps, pos, table, n, n_head, n_head_kv, head_dim, rope_dims, mode
):  # type: ignore[no-untyped-def]
    """The graph's steps on the fused product before attention, in place: the biases, the per-head norms
    (each skipped when empty), RoPE on q and k."""
    nq, nk = n_head * head_dim, n_head_kv * head_dim
    _add_bias(qkv, bq, 0, n)
    _add_bias(qkv, bk, nq, n)
    _add_bias(qkv, bv, nq + nk, n)
    _head_norms(qkv, q_norm, 0, n, n_head, head_dim, eps)
    _head_norms(qkv, k_norm, nq, n, n_head_kv, head_dim, eps)
    rope_cols(qkv, 0, pos, table, n, n_head, head_dim, rope_dims, mode)
    rope_cols(qkv, nq, pos, table, n, n_head_kv, head_dim, rope_dims, mode)


@numba.njit(cache=True, nogil=True, inline="always")
def _add_bias(x, b, c0, n):  # type: ignore[no-untyped-def]
    for t in range(n):
        for i in range(len(b)):
            x[t, c0 + i] = x[t, c0 + i] + b[i]


@numba.njit(cache=True, nogil=True, inline="always")
def _head_norms(x, w, c0, n, n_head, head_dim, eps):  # type: ignore[no-untyped-def]
    """RMS norm of each head of x[:, c0 : c0 + n_head * head_dim] times w [head_dim], in place (if w)."""
    if len(w):
        for t in range(n):
            for h in range(n_head):
                a = c0 + h * head_dim
                row = x[t, a : a + head_dim]
                rms_norm_row(row, row, w, eps, head_dim)


@numba.njit(cache=True, nogil=True)
def _ready_q(q, src, c0, n, nq, q_scale, kc):  # type: ignore[no-untyped-def]
    """q[t, i] = src[t, c0 + i] * q_scale (unless it is 1), rounded to f16 when the K cache kc is f16 (ggml
    converts mul_mat(k, q)'s q to k's vec_dot type)."""
    for t in range(n):
        for i in range(nq):
            x = src[t, c0 + i]
            if q_scale != np.float32(1.0):
                x = x * q_scale
            q[t, i] = as_cache(x, kc)


@numba.njit(cache=True, nogil=True, parallel=True)
def _attend_ready(out, q, kc, vc, cells, lo, hi, n, n_head, n_head_kv, head_dim, kq_scale, cols, sinks):  # type: ignore[no-untyped-def]
    """``attention`` on a q already rounded for the cache type (with an f16 V cache, ggml_mul_mat(v f16, kq)
    converts the probabilities to f16), per KV head and token block (``_attention_job``), the jobs in
    parallel. The loop body is one call, so the parallel lowering works on a small body; and every level
    of calls re-optimizes the code below it when numba links it, so there are few levels."""
    starts = _token_blocks(lo, hi, n)
    n_blocks = len(starts) - 1
    for job in prange(n_head_kv * n_blocks):
        # the job as int64: the parallel lowering counts in uint64, which would compile the job twice
        _attention_job(
            np.int64(job),
            out,
            q,
            kc,
            vc,
            cells,
            lo,
            hi,
            starts,
            n_blocks,
            n_head,
            n_head_kv,
            head_dim,
            kq_scale,
            cols,
            sinks,
        )


_MANY_LANES = 8  # from this many (token, head) lanes on, the lanes are the vector dimension

# Fewer (token, KV head) jobs than this (decoding: SmolLM2 has 3 KV heads, Gemma 3 one) leave threads idle: the
# typed kernels then run in phases cut finer (``flash_attn._run_phased``), for batches of at most
# PHASED_TOKENS tokens (a prompt chunk keeps the whole jobs, so the warm-up's prompt pass compiles them).
FEW_JOBS = 16
PHASED_TOKENS = 8
_MIN_SPLIT = 16  # the fewest cells of a phased K.Q job


@numba.njit(cache=True, nogil=True)
def phase_sizes(jobs, span, head_dim, threads, split):  # type: ignore[no-untyped-def]
    """(cells per K.Q job, V jobs per job) for ``jobs`` (token, KV head) jobs over at most ``span`` cells: K.Q
    jobs at least 4 per thread (of at least ``_MIN_SPLIT`` cells; ``split`` > 0: that many), their count a
    multiple of the thread count; the V sums by whole heads unless those are fewer than the threads, then by
    parts of 32k values (a narrower job repeats the per-cell work: decoding a row's scales, setting up the
    loops)."""
    if split <= 0:
        n_split = (4 * threads + jobs - 1) // jobs
        while jobs * n_split % threads:
            n_split += 1
        split = max((span + n_split - 1) // n_split, _MIN_SPLIT)
    n32 = head_dim // 32 if head_dim % 32 == 0 else 1
    n_blk = 1
    while jobs * n_blk < threads and n_blk < n32:
        n_blk += 1
        while n32 % n_blk:
            n_blk += 1
    return split, n_blk


_TOKEN_BLOCK = 8


@numba.njit(cache=True, nogil=True)
def _token_blocks(lo: np.ndarray, hi: np.ndarray, n: int) -> np.ndarray:
    """Block starts (plus n at the end): runs of at most _TOKEN_BLOCK consecutive tokens whose cell ranges
    overlap (one sequence's tokens; another sequence's range starts a new block)."""
    starts = np.empty(n + 1, np.int64)
    m = 0
    for t in range(n):
        if t == 0 or lo[t] < lo[t - 1] or lo[t] >= hi[t - 1] or t - starts[m - 1] >= _TOKEN_BLOCK:
            starts[m] = t
            m += 1
    starts[m] = n
    return starts[: m + 1]


@numba.njit(cache=True, nogil=True)
def softmax_row(w, o, length):  # type: ignore[no-untyped-def]
    """``_softmax_sse2`` of w[o:o+length] from its maximum: the row becomes its exponentials; returns 1 / their
    sum in float32 (ggml_soft_max_ext's row)."""
    mx = np.float32(-np.inf)
    for j in range(o, o + length):
        if w[j] > mx:
            mx = w[j]
    return np.float32(1.0 / _softmax_sse2(w, o, length, mx))


@numba.njit(cache=True, nogil=True)
def softmax_row_sink(w, o, length, sink):  # type: ignore[no-untyped-def]
    """``softmax_row`` with an attention sink (ggml_soft_max_ext's sinks): the maximum taken over the row
    and ``sink``, and expf(sink - max) (libm's) added to the double sum; returns 1 / sum in float32."""
    mx = np.float32(-np.inf)
    for j in range(o, o + length):
        if w[j] > mx:
            mx = w[j]
    mx = mx if mx > sink else sink  # MAX(max, sk)
    total = _softmax_sse2(w, o, length, mx)
    total += np.float64(np.float32(math.exp(sink - mx)))
    return np.float32(1.0 / total)


@numba.njit(cache=True, nogil=True)
def sink_correction(sink, big_m, big_s):  # type: ignore[no-untyped-def]
    """Flash attention's sink step after the online softmax's last cell (running maximum ``big_m``, sum
    ``big_s``): (ms, S), the factor on the accumulated values (1: none) and the new sum S * ms + vs, with
    ms = expf(M - sink) where the sink exceeds M, else vs = expf(sink - M)."""
    ms = np.float32(1.0)
    vs = np.float32(1.0)
    if sink > big_m:
        ms = np.float32(math.exp(big_m - sink))
    else:
        vs = np.float32(math.exp(sink - big_m))
    return ms, big_s * ms + vs


@numba.njit(cache=True, nogil=True)
def _softmax_sse2(w, o, length, mx):  # type: ignore[no-untyped-def]
    """w[o:o+length] <- exp(w - mx) through ggml_v_expf four at a time, summed as ggml_vec_soft_max_f32
    (SSE2 horizontal sum of each group, then in double); returns the sum (double)."""
    row = w[o : o + length]
    n = uint64(length)
    if expf_in_range(row, n, mx):
        for j in range(n):  # every lane on ggml_v_expf's main path: branch-free, so it vectorizes
            row[j] = expf_main(row[j] - mx)
    else:
        for j in range(n):
            row[j] = expf_sse2(row[j] - mx)
    total = 0.0
    for g in range(0, length - length % 4, 4):
        total += np.float64((row[g] + row[g + 1]) + (row[g + 2] + row[g + 3]))
    rest = length % 4
    if rest:  # the tail group, padded with exp(-inf) = 0
        e = np.zeros(4, np.float32)
        for i in range(rest):
            e[i] = row[length - rest + i]
        total += np.float64((e[0] + e[1]) + (e[2] + e[3]))
    return total


@numba.njit(cache=True, nogil=True)
def _attention_job(
    job, out, q, k, v, cells, lo, hi, starts, n_blocks, n_head, n_head_kv, head_dim, sc, cols, sinks
):  # type: ignore[no-untyped-def]
    """One KV head and token block, with the block's query heads as lanes: every dot product and output
    element sums over the dimension, then the cells, in ggml's order. Many lanes (a prompt) are the vector
    lanes, so each K and V row is read once for all of them; few lanes (decoding) run one at a time over a
    transposed K block, vectorized over the cells for K.Q and over the dimension for V."""
    group = n_head // n_head_kv
    kh = job % n_head_kv
    # blocks alternate from both ends: a prompt's later blocks attend to more cells, and prange hands
    # each thread a contiguous run of jobs, so in order the last thread would get the most work
    half = job // n_head_kv
    blk = half // 2 if half % 2 == 0 else n_blocks - 1 - half // 2
    t0 = starts[blk]
    nt = starts[blk + 1] - t0
    lanes = nt * group
    jlo = lo[t0]
    jhi = hi[t0]
    for i in range(nt):
        jlo = min(jlo, lo[t0 + i])
        jhi = max(jhi, hi[t0 + i])
    span = max(jhi - jlo, 0)
    ko = kh * head_dim
    # lane = i * group + g: token t0 + i, query head kh * group + g
    qt = np.empty((head_dim, lanes), np.float32)
    for i in range(nt):
        for g in range(group):
            qo = (kh * group + g) * head_dim
            for d in range(head_dim):
                qt[d, i * group + g] = q[t0 + i, qo + d]
    w = np.empty((lanes, span), np.float32)
    tiled = lanes >= _MANY_LANES and head_dim % cols == 0
    if tiled:
        kq_many(w, qt, k, cells, jlo, span, ko, head_dim, lanes, sc, cols)
    else:  # few lanes: the cells are the register tile's lanes
        kq_few(w, qt, k, cells, jlo, span, ko, head_dim, lanes, sc)
    inv = np.empty(lanes, np.float32)
    for a in range(lanes):
        t = t0 + a // group
        if len(sinks):  # lane a's query head is kh * group + a % group
            inv[a] = softmax_row_sink(w[a], lo[t] - jlo, hi[t] - lo[t], sinks[kh * group + a % group])
        else:
            inv[a] = softmax_row(w[a], lo[t] - jlo, hi[t] - lo[t])
    if tiled:
        kqv = kqv_many(w, inv, v, cells, lo, hi, jlo, span, t0, group, ko, head_dim, lanes, cols)
    else:  # few lanes: the dimensions are the register tile's lanes
        kqv = kqv_few(w, inv, v, cells, lo, hi, jlo, span, t0, group, ko, head_dim, lanes)
    for i in range(nt):
        for g in range(group):
            qo = (kh * group + g) * head_dim
            for d in range(head_dim):
                out[t0 + i, qo + d] = np.float32(kqv[i * group + g, d])
