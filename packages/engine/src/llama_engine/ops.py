"""The non-matmul operations of a transformer forward pass, as ggml computes them on the CPU.

Each numba kernel is a flat function with an out-parameter; its numpy reference with the same signature
is in `llama_engine.ref`, and tests compare the two. The numerics follow ggml-cpu where it matters for
parity with llama.cpp: RMS norm accumulates in double (ggml_float), GELU goes through ggml's fp16 lookup
table (GGML_GELU_FP16), RoPE angles are built by repeated float multiplication as in ggml_rope_cache_init.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from llvmlite import ir
from numba import prange, types, uint64
from numba.core import cgutils
from numba.extending import intrinsic

from llama_quant.cpu import cpu_has

__all__ = [
    "ROPE_NEOX",
    "ROPE_NORM",
    "attend",
    "attention",
    "geglu",
    "gelu_table",
    "rms_norm",
    "rope",
    "rope_cache",
    "swiglu",
]

ROPE_NORM = 0  # rotate adjacent pairs (x[2i], x[2i+1]): llama
ROPE_NEOX = 2  # rotate halves (x[i], x[i + n/2]): gemma3, qwen2/3, phi3 (GGML_ROPE_TYPE_NEOX)

_PARALLEL_ROWS = 8  # from this many rows on, the row-wise steps (norms, FFN activations) use all threads


def rms_norm(out: np.ndarray, x: np.ndarray, w: np.ndarray, eps: float, n: int, d: int) -> None:
    """out[n, d] = x / sqrt(mean(x^2) + eps) * w[d]   (ggml_rms_norm, then ggml_mul). Many rows spread over
    the threads."""
    (_rms_norm_rows if n >= _PARALLEL_ROWS else _rms_norm)(out, x, w, eps, n, d)


@numba.njit(cache=True, nogil=True)
def _rms_norm(out, x, w, eps, n, d):  # type: ignore[no-untyped-def]
    for t in range(n):
        _rms_norm_row(out[t], x[t], w, eps, d)


@numba.njit(cache=True, nogil=True, parallel=True)
def _rms_norm_rows(out, x, w, eps, n, d):  # type: ignore[no-untyped-def]
    for t in prange(n):
        _rms_norm_row(out[t], x[t], w, eps, d)


@numba.njit(cache=True, nogil=True, inline="always")
def _rms_norm_row(o, x, w, eps, d):  # type: ignore[no-untyped-def]
    acc = 0.0  # ggml_float: double accumulation
    for i in range(d):
        acc += np.float64(x[i] * x[i])  # the square in float, the sum in double
    scale = np.float32(1.0) / np.float32(math.sqrt(np.float32(acc / d) + np.float32(eps)))
    for i in range(d):
        o[i] = (x[i] * scale) * w[i]


def rope_cache(n_pos: int, n_dims: int, freq_base: float, freq_scale: float = 1.0) -> np.ndarray:
    """cos/sin table [n_pos, n_dims/2, 2] exactly as ggml_rope_cache_init builds it (no YaRN): theta
    starts at the position and is multiplied by theta_scale = powf(base, -2/n_dims) step by step, in
    float32; cosf/sinf are the C library's (numba calls them for float32 arguments)."""
    theta_scale = _powf(np.float32(freq_base), np.float32(-2.0) / np.float32(n_dims))
    out = np.empty((n_pos, n_dims // 2, 2), np.float32)
    _rope_cache(out, n_pos, n_dims // 2, np.float32(theta_scale), np.float32(freq_scale))
    return out


def _powf(x: np.float32, y: np.float32) -> np.float32:
    import ctypes
    import ctypes.util

    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    libm.powf.restype = ctypes.c_float
    libm.powf.argtypes = [ctypes.c_float, ctypes.c_float]
    return np.float32(libm.powf(float(x), float(y)))


@numba.njit(cache=True, nogil=True)
def _rope_cache(
    out: np.ndarray, n_pos: int, half: int, theta_scale: np.float32, freq_scale: np.float32
) -> None:
    for p in range(n_pos):
        theta = np.float32(p)
        for i in range(half):
            t = freq_scale * theta
            out[p, i, 0] = math.cos(t)
            out[p, i, 1] = math.sin(t)
            theta = theta * theta_scale


@numba.njit(cache=True, nogil=True)
def rope(
    x: np.ndarray,
    pos: np.ndarray,
    cache: np.ndarray,
    n: int,
    n_head: int,
    head_dim: int,
    n_dims: int,
    mode: int,
) -> None:
    """Rotate x[n, n_head * head_dim] in place by each token's position (the first n_dims of each head)."""
    half = n_dims // 2
    for t in range(n):
        p = pos[t]
        for h in range(n_head):
            base = h * head_dim
            for i in range(half):
                c = cache[p, i, 0]
                s = cache[p, i, 1]
                if mode == ROPE_NEOX:
                    a = base + i
                    b = base + i + half
                else:
                    a = base + 2 * i
                    b = a + 1
                x0 = x[t, a]
                x1 = x[t, b]
                x[t, a] = x0 * c - x1 * s
                x[t, b] = x0 * s + x1 * c


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
) -> None:
    """Softmax attention of each token over a range of KV cells, with ggml's CPU numerics.

    out, q: [n, n_head * head_dim]; k, v: [n_cells, n_head_kv * head_dim] (one layer of the cache);
    token t attends to cells[lo[t]:hi[t]] (position order). Grouped-query heads share a KV head.
    As ggml_mul_mat(k, q) -> ggml_soft_max_ext -> ggml_mul_mat(v, kq): KQ dots summed in double over
    the dimension in order, scaled in float; softmax through ggml_v_expf (SSE2) four at a time with the
    SSE2 horizontal sum, in double; KQV sums in double over the cells in order. An f16 cache (k, v float16) computes as ggml does with
    f16 K and V: q rounded to f16 for the KQ dots, the probabilities rounded to f16 for the KQV sums.
    """
    k16, v16 = k.dtype == np.float16, v.dtype == np.float16
    _attend_cached(
        out, q, k.view(np.uint16) if k16 else k, v.view(np.uint16) if v16 else v, cells, lo, hi,
        n, n_head, n_head_kv, head_dim, np.float32(scale), k16, v16,
    )  # fmt: skip


@numba.njit(cache=True, nogil=True)
def _attend_cached(out, q, kc, vc, cells, lo, hi, n, n_head, n_head_kv, head_dim, kq_scale, k16, v16):  # type: ignore[no-untyped-def]
    """``attention`` on the cache layer as the kernel takes it (``k16`` / ``v16``: kc / vc are an f16
    cache's uint16 view)."""
    qq = _round_rows_f16(q) if k16 else q  # ggml_mul_mat(k f16, q): q converted to k's vec_dot type, f16
    starts = _token_blocks(lo, hi, n)
    # v16: ggml_mul_mat(v f16, kq) converts the probabilities to f16
    _attention_blocked(
        out,
        qq,
        kc,
        vc,
        cells,
        lo,
        hi,
        starts,
        len(starts) - 1,
        n_head,
        n_head_kv,
        head_dim,
        kq_scale,
        k16,
        v16,
    )


@numba.njit(cache=True, nogil=True)
def _store_rows(dst, rows, src, f16):  # type: ignore[no-untyped-def]
    """dst[rows] = src: f32 as is, or (``f16``: dst an f16 cache's uint16 view) rounded to nearest even
    (ggml_cpy to f16)."""
    if f16:
        _store_f16(dst, rows, src)
    else:
        for r in range(len(rows)):
            dst[rows[r], :] = src[r]


@numba.njit(cache=True, nogil=True)
def attend(  # type: ignore[no-untyped-def]
    out, q, k, v, pos, table, kc, vc, new_cells, cells, lo, hi,
    n, n_head, n_head_kv, head_dim, rope_dims, mode, q_scale, kq_scale, k16, v16,
):  # fmt: skip
    """A layer's attention after its q/k/v products, in one call: RoPE on q and k (``rope``), q times
    ``q_scale`` unless it is 1, k and v stored in the cache at ``new_cells`` (``k16`` / ``v16``: kc / vc
    are an f16 cache's uint16 view), then ``attention`` with ``kq_scale``."""
    rope(q, pos, table, n, n_head, head_dim, rope_dims, mode)
    rope(k, pos, table, n, n_head_kv, head_dim, rope_dims, mode)
    if q_scale != np.float32(1.0):
        for t in range(n):
            for i in range(q.shape[1]):
                q[t, i] = q[t, i] * q_scale
    _store_rows(kc, new_cells, k, k16)
    _store_rows(vc, new_cells, v, v16)
    _attend_cached(out, q, kc, vc, cells, lo, hi, n, n_head, n_head_kv, head_dim, kq_scale, k16, v16)


# Tokens per block of the batched kernel: their query heads of one KV head share each K and V row read.
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
def _softmax_sse2(w, o, length, mx):  # type: ignore[no-untyped-def]
    """w[o:o+length] <- exp(w - mx) through ggml_v_expf four at a time, summed as ggml_vec_soft_max_f32
    (SSE2 horizontal sum of each group, then in double); returns 1 / sum in float32."""
    row = w[o : o + length]
    n = uint64(length)
    if _expf_in_range(row, n, mx):
        for j in range(n):  # every lane on ggml_v_expf's main path: branch-free, so it vectorizes
            row[j] = _expf_main(row[j] - mx)
    else:
        for j in range(n):
            row[j] = _expf_sse2(row[j] - mx)
    total = 0.0
    for g in range(0, length - length % 4, 4):
        total += np.float64((row[g] + row[g + 1]) + (row[g + 2] + row[g + 3]))
    rest = length % 4
    if rest:  # the tail group, padded with exp(-inf) = 0
        e = np.zeros(4, np.float32)
        for i in range(rest):
            e[i] = row[length - rest + i]
        total += np.float64((e[0] + e[1]) + (e[2] + e[3]))
    return np.float32(1.0 / total)


@numba.njit(cache=True, nogil=True, inline="always")
def _expf_in_range(row, n, mx):  # type: ignore[no-untyped-def]
    """Whether ggml_v_expf takes its main path for every row[j] - mx (|n| <= 126; counted, so the loop
    vectorizes)."""
    far = 0
    for j in range(n):
        nn = ((row[j] - mx) * _LOG2E + _R) - _R
        far += abs(nn) > np.float32(126.0)
    return far == 0


@numba.njit(cache=True, nogil=True, parallel=True)
def _attention_blocked(
    out, q, k, v, cells, lo, hi, starts, n_blocks, n_head, n_head_kv, head_dim, sc, k16, p16
):  # type: ignore[no-untyped-def]
    """Attention (see `attention`) per KV head and token block, with
    the block's query heads as lanes: every dot product and output element sums over the dimension, then
    the cells, in ggml's order. Many lanes (a prompt) are the vector lanes, so each K and V row is read once
    for all of them; few lanes (decoding) run one at a time over a transposed K block, vectorized over the
    cells for K.Q and over the dimension for V."""
    group = n_head // n_head_kv
    for job in prange(n_head_kv * n_blocks):
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
        tiled = lanes >= _MANY_LANES and head_dim % _MANY_COLS == 0
        nl = (lanes + _TILE_LANES - 1) // _TILE_LANES * _TILE_LANES
        if tiled and k16:  # f16 q and k: products exact in double
            qa, kb = np.zeros((head_dim, nl), np.float64), np.zeros((_CELL_CHUNK, head_dim), np.float64)
            _kq_many(w, qt, k, cells, jlo, span, ko, head_dim, lanes, sc, qa, kb)
        elif tiled:  # f32: each product rounded to float, then summed in double
            qa32, kb32 = np.zeros((head_dim, nl), np.float32), np.zeros((_CELL_CHUNK, head_dim), np.float32)
            _kq_many(w, qt, k, cells, jlo, span, ko, head_dim, lanes, sc, qa32, kb32)
        elif k16:  # few lanes: the cells are the register tile's lanes
            qc, kt = _few_scratch(head_dim, lanes, np.float64)
            _kq_few(w, qt, k, cells, jlo, span, ko, head_dim, lanes, sc, qc, kt)
        else:
            qc32, kt32 = _few_scratch(head_dim, lanes, np.float32)
            _kq_few(w, qt, k, cells, jlo, span, ko, head_dim, lanes, sc, qc32, kt32)
        inv = np.empty(lanes, np.float32)
        for a in range(lanes):
            t = t0 + a // group
            o = lo[t] - jlo
            length = hi[t] - lo[t]
            mx = np.float32(-np.inf)
            for j in range(o, o + length):
                if w[a, j] > mx:
                    mx = w[a, j]
            inv[a] = _softmax_sse2(w[a], o, length, mx)
        kqv = np.zeros(
            (lanes, head_dim) if tiled else (_round_up(lanes, _TILE_COLS), _round_up(head_dim, _TILE_LANES)),
            np.float64,
        )
        if tiled and p16:
            pm, vb = np.zeros((span, nl), np.float64), np.zeros((_CELL_CHUNK, head_dim), np.float64)
            _kqv_many(kqv, w, inv, v, cells, lo, hi, jlo, span, t0, group, ko, head_dim, lanes, p16, pm, vb)
        elif tiled:
            pm32, vb32 = np.zeros((span, nl), np.float32), np.zeros((_CELL_CHUNK, head_dim), np.float32)
            _kqv_many(
                kqv, w, inv, v, cells, lo, hi, jlo, span, t0, group, ko, head_dim, lanes, p16, pm32, vb32
            )
        elif p16:  # few lanes: the dimensions are the register tile's lanes
            pc, vc = _few_scratch(head_dim, lanes, np.float64, _CELL_CHUNK)
            _kqv_few(kqv, w, inv, v, cells, lo, hi, jlo, span, t0, group, ko, head_dim, lanes, p16, pc, vc)
        else:
            pc32, vc32 = _few_scratch(head_dim, lanes, np.float32, _CELL_CHUNK)
            _kqv_few(
                kqv, w, inv, v, cells, lo, hi, jlo, span, t0, group, ko, head_dim, lanes, p16, pc32, vc32
            )
        for i in range(nt):
            for g in range(group):
                qo = (kh * group + g) * head_dim
                for d in range(head_dim):
                    out[t0 + i, qo + d] = np.float32(kqv[i * group + g, d])


_MANY_LANES = 8  # from this many (token, head) lanes on, the lanes are the vector dimension
_TILE_LANES, _TILE_COLS = 8, 4  # a ``_tile_sums`` register tile: 8 lanes by 4 cells (K.Q) or dimensions
# The many-lane kernels' tiles (``_many_sums``): with 32 vector registers of 8 doubles (AVX-512), 8 columns
# keep 8 independent multiply-add chains in flight, enough to cover their latency on both FMA units; with 16
# registers of 4 doubles (AVX2) an 8-lane tile already takes two registers a column, and 4 columns fill them.
_MANY_COLS = 8 if cpu_has("avx512f") else _TILE_COLS
_CELL_CHUNK = 128  # cells whose K or V rows are widened at a time (a multiple of both tile widths)


def _tile_sums_of(cols: int):  # type: ignore[no-untyped-def]
    """The register-tile intrinsic for ``cols`` columns (``_tile_sums``'s doc, with ``cols`` for 4)."""

    def tile_sums(typingctx, res, roff, a, aoff, b, boff, nt, lda, bt, bc, ldr):  # type: ignore[no-untyped-def]
        return _tile_codegen(cols, res, a, b)

    return intrinsic(tile_sums)


def _tile_codegen(cols: int, res, a, b):  # type: ignore[no-untyped-def]
    sig = types.void(res, types.intp, a, types.intp, b, types.intp, *([types.intp] * 5))

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        res_v, roff, a_v, aoff, b_v, boff, nt, lda, bt, bc, ldr = args
        rp, ap, bp = (
            context.make_array(signature.args[i])(context, builder, v).data
            for i, v in ((0, res_v), (2, a_v), (4, b_v))
        )
        f64 = ir.DoubleType()
        elt = ap.type.pointee
        vd, ve = ir.VectorType(f64, _TILE_LANES), ir.VectorType(elt, _TILE_LANES)
        undef = ir.Constant(ve, ir.Undefined)
        splat = ir.Constant(ir.VectorType(ir.IntType(32), _TILE_LANES), [0] * _TILE_LANES)

        def vec_at(p, off, ty):  # type: ignore[no-untyped-def]
            return builder.bitcast(builder.gep(p, [off]), ty.as_pointer())

        def times(x, c: int):  # type: ignore[no-untyped-def]
            return builder.mul(x, ir.Constant(x.type, c))

        fma = None
        if elt == f64:
            name = f"llvm.fma.v{_TILE_LANES}f64"
            fma = builder.module.globals.get(name) or ir.Function(
                builder.module, ir.FunctionType(vd, [vd, vd, vd]), name
            )
        tiles = []  # (accumulator slot, its place in res); the slots become registers
        for c in range(cols):
            at = vec_at(rp, builder.add(roff, times(ldr, c)), vd)
            slot = cgutils.alloca_once(builder, vd)
            builder.store(builder.load(at, align=8), slot)
            tiles.append((slot, at))
        with cgutils.for_range(builder, nt) as loop:
            t = loop.index
            av = builder.load(vec_at(ap, builder.add(aoff, builder.mul(t, lda)), ve), align=4)
            brow = builder.add(boff, builder.mul(t, bt))
            for c, (slot, _) in enumerate(tiles):
                scalar = builder.load(builder.gep(bp, [builder.add(brow, times(bc, c))]))
                bv = builder.shuffle_vector(
                    builder.insert_element(undef, scalar, ir.Constant(ir.IntType(32), 0)), undef, splat
                )
                acc = builder.load(slot)
                if fma is not None:
                    builder.store(builder.call(fma, [av, bv, acc]), slot)
                else:
                    builder.store(builder.fadd(acc, builder.fpext(builder.fmul(av, bv), vd)), slot)
        for slot, at in tiles:
            builder.store(builder.load(slot), at, align=8)
        return context.get_dummy_value()

    return sig, codegen


# res[roff + c * ldr + l] += sum over t < nt, in order, of a[aoff + t * lda + l] * b[boff + t * bt + c * bc],
# for 8 lanes l and 4 columns c: 32 sums kept in registers (res float64). With a and b float64 holding f16
# values (an f16 cache), each product is exact, so a fused multiply-add gives the same double as ggml's float
# product widened and added; with float32, the product is rounded to float first and then widened, as ggml's
# generic vec_dot does. Each sum is its own (lane, column)'s, so the tile's width does not change a number.
_tile_sums = _tile_sums_of(_TILE_COLS)
_many_sums = _tile_sums_of(_MANY_COLS)  # the many-lane kernels' tile: 8 lanes by _MANY_COLS columns


# The inner loops index row views with unsigned counters: a signed index makes numba check for negative
# (wrap-around) indices, and that keeps LLVM from vectorizing the loop.


@numba.njit(cache=True, nogil=True, inline="always")
def _widen_rows(dst, src, cells, first, m, ko, head_dim):  # type: ignore[no-untyped-def]
    """dst[j, 0:head_dim] = the cache row of cell cells[first + j] from column ko on, widened, for j < m."""
    for j in range(m):
        row = src[cells[first + j], ko : ko + head_dim]
        for d in range(uint64(head_dim)):
            dst[j, d] = _widen(row[d])  # type: ignore[call-arg]


@numba.njit(cache=True, nogil=True, inline="always")
def _kq_many(w, qt, k, cells, jlo, span, ko, head_dim, lanes, sc, qa, kb):  # type: ignore[no-untyped-def]
    """w[a, j] = (q_a . k_j) * sc for all lanes and the span's cells, in register tiles (``_tile_sums``).
    qa, kb: zeroed scratch [head_dim, padded lanes] and [_CELL_CHUNK, head_dim] of the element type the
    products are taken in (``_tile_scratch``)."""
    nl = qa.shape[1]
    qa[:, :lanes] = qt
    res = np.empty((_CELL_CHUNK, nl), np.float64)
    for c0 in range(0, span, _CELL_CHUNK):
        m = min(_CELL_CHUNK, span - c0)
        _widen_rows(kb, k, cells, jlo + c0, m, ko, head_dim)
        res[:] = 0.0
        for j0 in range(0, m, _MANY_COLS):
            for a0 in range(0, nl, _TILE_LANES):
                _many_sums(res, j0 * nl + a0, qa, a0, kb, j0 * head_dim, head_dim, nl, 1, head_dim, nl)  # type: ignore[call-arg]
        for a in range(lanes):
            for j in range(m):
                w[a, c0 + j] = np.float32(res[j, a]) * sc


@numba.njit(cache=True, nogil=True, inline="always")
def _round_up(n, m):  # type: ignore[no-untyped-def]
    return (n + m - 1) // m * m


@numba.njit(cache=True, nogil=True, inline="always")
def _few_scratch(head_dim, lanes, dtype, cells=0):  # type: ignore[no-untyped-def]
    """Zeroed scratch of the element type the few-lane products are taken in: (query lanes [head_dim,
    lanes rounded up to 4], K block [head_dim, 8]) for ``_kq_few``; with ``cells``, (probabilities
    [cells, lanes rounded up to 4], V rows [cells, head_dim rounded up to 8]) for ``_kqv_few``."""
    if cells:
        return np.zeros((cells, _round_up(lanes, _TILE_COLS)), dtype), np.zeros(
            (cells, _round_up(head_dim, _TILE_LANES)), dtype
        )
    return np.zeros((head_dim, _round_up(lanes, _TILE_COLS)), dtype), np.zeros((head_dim, _TILE_LANES), dtype)


@numba.njit(cache=True, nogil=True, inline="always")
def _kq_few(w, qt, k, cells, jlo, span, ko, head_dim, lanes, sc, qc, kt):  # type: ignore[no-untyped-def]
    """w[a, j] = (q_a . k_j) * sc for few lanes: the cells are the register tile's lanes (``_tile_sums``, 8
    cells by 4 query lanes), each K row widened once into a [head_dim, 8] block. qc, kt: ``_few_scratch``."""
    ncol = qc.shape[1]
    qc[:, :lanes] = qt
    res = np.empty(_TILE_LANES * ncol, np.float64)
    for j0 in range(0, span, _TILE_LANES):
        m = min(_TILE_LANES, span - j0)
        for i in range(m):  # a last block's stale columns only feed sums that are not read
            krow = k[cells[jlo + j0 + i], ko : ko + head_dim]
            for d in range(uint64(head_dim)):
                kt[d, i] = _widen(krow[d])  # type: ignore[call-arg]
        res[:] = 0.0
        for c0 in range(0, ncol, _TILE_COLS):
            _tile_sums(res, c0 * _TILE_LANES, kt, 0, qc, c0, head_dim, _TILE_LANES, ncol, 1, _TILE_LANES)  # type: ignore[call-arg]
        for a in range(lanes):
            for i in range(m):
                w[a, j0 + i] = np.float32(res[a * _TILE_LANES + i]) * sc


@numba.njit(cache=True, nogil=True, inline="always")
def _kqv_many(kqv, w, inv, v, cells, lo, hi, jlo, span, t0, group, ko, head_dim, lanes, p16, pm, vb):  # type: ignore[no-untyped-def]
    """kqv[a, d] = sum over the span's cells, in order, of p_aj * v_jd (``_tile_sums``), with the
    probabilities zero outside each lane's cells (adding a zero product leaves a sum unchanged).
    pm, vb: zeroed scratch [span, padded lanes] and [_CELL_CHUNK, head_dim] (``_tile_scratch``)."""
    nl = pm.shape[1]
    for a in range(lanes):
        t = t0 + a // group
        for j in range(lo[t] - jlo, hi[t] - jlo):
            pm[j, a] = _prob(w[a, j], inv[a], p16)
    kqvt = np.zeros((head_dim, nl), np.float64)
    for c0 in range(0, span, _CELL_CHUNK):
        m = min(_CELL_CHUNK, span - c0)
        _widen_rows(vb, v, cells, jlo + c0, m, ko, head_dim)
        for d0 in range(0, head_dim, _MANY_COLS):
            for a0 in range(0, nl, _TILE_LANES):
                _many_sums(kqvt, d0 * nl + a0, pm, c0 * nl + a0, vb, d0, m, nl, head_dim, 1, nl)  # type: ignore[call-arg]
    for a in range(lanes):
        for d in range(head_dim):
            kqv[a, d] = kqvt[d, a]


@numba.njit(cache=True, nogil=True, inline="always")
def _kqv_few(kqv, w, inv, v, cells, lo, hi, jlo, span, t0, group, ko, head_dim, lanes, p16, pm, vb):  # type: ignore[no-untyped-def]
    """kqv[a, d] = sum over the span's cells, in order, of p_aj * v_jd for few lanes: the dimensions are the
    register tile's lanes (``_tile_sums``, 8 dimensions by 4 query lanes), with the probabilities zero
    outside each lane's cells. kqv: [lanes rounded up to 4, head_dim rounded up to 8] float64, zeroed;
    pm, vb: ``_few_scratch``."""
    ncol, hd8 = pm.shape[1], vb.shape[1]
    for c0 in range(0, span, _CELL_CHUNK):
        m = min(_CELL_CHUNK, span - c0)
        _widen_rows(vb, v, cells, jlo + c0, m, ko, head_dim)
        for j in range(m):
            for a in range(lanes):
                t = t0 + a // group
                jj = c0 + j
                inside = lo[t] - jlo <= jj < hi[t] - jlo
                pm[j, a] = _prob(w[a, jj], inv[a], p16) if inside else 0.0
        for d0 in range(0, hd8, _TILE_LANES):
            for a0 in range(0, ncol, _TILE_COLS):
                _tile_sums(kqv, a0 * hd8 + d0, vb, d0, pm, a0, m, hd8, ncol, 1, hd8)  # type: ignore[call-arg]


@numba.njit(cache=True, nogil=True, inline="always")
def _prob(e, inv, p16):  # type: ignore[no-untyped-def]
    """A softmax output as mul_mat(v, kq) reads it: e * (1 / sum), rounded to f16 for an f16 V cache."""
    p = e * inv
    return _round_f16(p) if p16 else p  # type: ignore[call-arg]


@intrinsic
def _widen(typingctx, x):  # type: ignore[no-untyped-def]
    """A cache element as float32: float32 as is; uint16 holds fp16 bits (an f16 KV cache), widened exactly
    (vcvtph2ps where the CPU has F16C)."""
    if x == types.float32:
        return types.float32(x), lambda context, builder, signature, args: args[0]
    if x == types.uint16:

        def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
            return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

        return types.float32(x), codegen
    return None


@intrinsic
def _f16_bits(typingctx, x):  # type: ignore[no-untyped-def]
    """float32 -> the bits of the nearest fp16 (ties to even), as ggml's fp32_to_fp16 (vcvtps2ph)."""
    sig = types.uint16(types.float32)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return sig, codegen


@numba.njit(cache=True, nogil=True)
def _round_rows_f16(x: np.ndarray) -> np.ndarray:
    out = np.empty_like(x)
    for t in range(x.shape[0]):
        for i in range(x.shape[1]):
            out[t, i] = _round_f16(x[t, i])  # type: ignore[call-arg]
    return out


@numba.njit(cache=True, nogil=True)
def _store_f16(dst: np.ndarray, rows: np.ndarray, src: np.ndarray) -> None:
    for i in range(len(rows)):
        d = dst[rows[i]]
        for j in range(src.shape[1]):
            d[j] = _f16_bits(src[i, j])  # type: ignore[call-arg]


@intrinsic
def _round_f16(typingctx, x):  # type: ignore[no-untyped-def]
    """float32 -> the nearest fp16 (ties to even) -> float32: ggml's fp32_to_fp16 and back."""
    sig = types.float32(types.float32)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.fpext(builder.fptrunc(args[0], ir.HalfType()), ir.FloatType())

    return sig, codegen


@intrinsic
def _f32_bits(typingctx, x):  # type: ignore[no-untyped-def]
    """Reinterpret a float32 as uint32 (a register bitcast, no memory)."""
    sig = types.uint32(types.float32)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(args[0], ir.IntType(32))

    return sig, codegen


@intrinsic
def _bits_f32(typingctx, u):  # type: ignore[no-untyped-def]
    """Reinterpret a uint32 as float32."""
    sig = types.float32(types.uint32)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


# The constants of ggml_v_expf, written as ggml writes them (hex floats).
_R = np.float32(float.fromhex("0x1.8p23"))
_LOG2E = np.float32(float.fromhex("0x1.715476p+0"))
_LN2_HI = np.float32(float.fromhex("0x1.62e4p-1"))
_LN2_LO = np.float32(float.fromhex("0x1.7f7d1cp-20"))
_P0 = np.float32(float.fromhex("0x1.0e4020p-7"))
_P1 = np.float32(float.fromhex("0x1.573e2ep-5"))
_P2 = np.float32(float.fromhex("0x1.555e66p-3"))
_P3 = np.float32(float.fromhex("0x1.fffdb6p-2"))
_P4 = np.float32(float.fromhex("0x1.ffffecp-1"))


@numba.njit(cache=True, nogil=True, inline="always")
def _expf_parts(x: np.float32):  # type: ignore[no-untyped-def]
    """ggml_v_expf's shared steps: nn = round(x / ln 2), the exponent bits e of 2^nn, the polynomial j and
    kk = 2^nn."""
    z = x * _LOG2E + _R
    nn = z - _R
    b = x - nn * _LN2_HI
    b = b - nn * _LN2_LO
    e = np.uint32(_f32_bits(z) << np.uint32(23))  # type: ignore[call-arg,var-annotated]
    kk = _bits_f32(np.uint32(e + np.uint32(0x3F800000)))  # type: ignore[call-arg,var-annotated]
    u = b * b
    j = ((_P0 * b + _P1) * u + (_P2 * b + _P3)) * u + _P4 * b
    return nn, e, j, kk


@numba.njit(cache=True, nogil=True)
def _expf_sse2(x: np.float32) -> np.float32:
    """One lane of ggml_v_expf for SSE2 without FMA (vec.h): multiply and add round separately."""
    nn, e, j, kk = _expf_parts(x)
    an = abs(nn)
    if not an > np.float32(126.0):
        return j * kk + kk
    g = np.uint32(0x82000000) if nn <= np.float32(0.0) else np.uint32(0)
    s1 = _bits_f32(np.uint32(g + np.uint32(0x7F000000)))  # type: ignore[call-arg,var-annotated]
    s2 = _bits_f32(np.uint32(e - g))  # type: ignore[call-arg,var-annotated]
    if an > np.float32(192.0):
        return s1 * s1
    return (s2 * j + s2) * s1


@numba.njit(cache=True, nogil=True, inline="always")
def _expf_main(x: np.float32) -> np.float32:
    """ggml_v_expf's main path (|n| <= 126): ``_expf_sse2`` without the range check."""
    _, _, j, kk = _expf_parts(x)
    return j * kk + kk


def swiglu(
    out: np.ndarray, gate: np.ndarray, up: np.ndarray, n: int, d: int, gate_col: int = 0, up_col: int = 0
) -> None:
    """out = silu(gate) * up as ggml_vec_swiglu_f32: the SSE2 ggml_v_silu on groups of four, the
    scalar x / (1 + expf(-x)) on the remainder. The gate is ``gate[:, gate_col : gate_col + d]``, the up
    values ``up[:, up_col : up_col + d]`` (one fused [gate | up] product can be both). Many tokens spread
    over the threads."""
    gate, up = np.ascontiguousarray(gate), np.ascontiguousarray(up)
    (_swiglu_rows if n >= _PARALLEL_ROWS else _swiglu)(out, gate, up, n, d, gate_col, up_col)


@numba.njit(cache=True, nogil=True)
def _swiglu(out, gate, up, n, d, gc, uc):  # type: ignore[no-untyped-def]
    for t in range(n):
        _swiglu_row(out[t], gate[t][gc : gc + d], up[t][uc : uc + d], d)


@numba.njit(cache=True, nogil=True, parallel=True)
def _swiglu_rows(out, gate, up, n, d, gc, uc):  # type: ignore[no-untyped-def]
    for t in prange(n):
        _swiglu_row(out[t], gate[t][gc : gc + d], up[t][uc : uc + d], d)


@numba.njit(cache=True, nogil=True, inline="always")
def _swiglu_row(o, g, u, d):  # type: ignore[no-untyped-def]
    simd = uint64(d - d % 4)
    one = np.float32(1.0)
    zero = np.float32(0.0)
    if _expf_in_range(g, simd, zero):  # |nn| of -g is that of g: all lanes on ggml_v_expf's main path
        for i in range(simd):
            o[i] = g[i] / (one + _expf_main(zero - g[i])) * u[i]
    else:
        for i in range(simd):
            o[i] = g[i] / (one + _expf_sse2(zero - g[i])) * u[i]
    for i in range(simd, uint64(d)):
        o[i] = g[i] / (one + np.float32(math.exp(-g[i]))) * u[i]


def _build_gelu_table() -> np.ndarray:
    # ggml_table_gelu_f16[i] = fp16(gelu_f32(fp32(fp16 bits i))), computed in float32 as ggml does.
    x = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    a = np.float32(0.044715)
    s = np.float32(0.79788456080286535587989211986876)
    with np.errstate(all="ignore"):
        inner = s * x * (np.float32(1.0) + a * x * x)
        y = np.float32(0.5) * x * (np.float32(1.0) + np.tanh(inner.astype(np.float64)).astype(np.float32))
    return y.astype(np.float16).astype(np.float32)


_GELU_TABLE = _build_gelu_table()


def gelu_table() -> np.ndarray:
    """The 65,536-entry GELU table indexed by fp16 bit patterns (read-only)."""
    return _GELU_TABLE


def geglu(
    out: np.ndarray, gate: np.ndarray, up: np.ndarray, n: int, d: int, gate_col: int = 0, up_col: int = 0
) -> None:
    """out = gelu(gate) * up with ggml's fp16-table GELU (ggml_vec_geglu_f32 under GGML_GELU_FP16); gate and
    up columns as ``swiglu``."""
    gate, up = np.ascontiguousarray(gate), np.ascontiguousarray(up)
    (_geglu_rows if n >= _PARALLEL_ROWS else _geglu)(out, gate, up, _GELU_TABLE, n, d, gate_col, up_col)


@numba.njit(cache=True, nogil=True)
def _geglu(out, gate, up, table, n, d, gc, uc):  # type: ignore[no-untyped-def]
    for t in range(n):
        _geglu_row(out[t], gate[t][gc : gc + d], up[t][uc : uc + d], table, d)


@numba.njit(cache=True, nogil=True, parallel=True)
def _geglu_rows(out, gate, up, table, n, d, gc, uc):  # type: ignore[no-untyped-def]
    for t in prange(n):
        _geglu_row(out[t], gate[t][gc : gc + d], up[t][uc : uc + d], table, d)


@numba.njit(cache=True, nogil=True, inline="always")
def _geglu_row(o, gate, up, table, d):  # type: ignore[no-untyped-def]
    for i in range(d):
        g = gate[i]
        if g <= np.float32(-10.0):
            y = np.float32(0.0)
        elif g >= np.float32(10.0):
            y = g
        else:
            y = table[_f16_bits(g)]  # type: ignore[call-arg]
        o[i] = y * up[i]
