"""Products through 4-byte dot products (AVX-512 VNNI's ``vpdpbusd``) for Q8_0, and for Q4_0, Q4_1, Q5_0
and Q5_1 from 3 tokens on, with the same numbers as ``blocks32``.

``vpdpbusd`` multiplies 16 rows' unsigned byte quads by one token's signed quad and adds the four products
of each row to its int32 sum: 64 products per instruction, against ``pmaddubsw``'s 32 products into int16
that still need widening and adding (``pairs``). A block's integer sum ``sumi`` is exact however it is
formed, so the float steps stay ``blocks32``'s (``pairs._finish_block``).

A block of a 64-row tile is 8 quads ``k`` of 4 row chunks of 16 rows, each row's quad holding its values
``(2k, 2k + 16, 2k + 1, 2k + 17)``: two of ``pairs``' byte pairs side by side, so the Q4 and Q5 tiles
(stored in ``pairs``' layouts, which serve one token) are turned into quads block by block, once for all the
tokens of a call (``_q4_as_quads``, ``_q5_as_quads``). Q8_0 is stored in quads at load, each signed value plus 128 as an
unsigned byte, and the 128 times the block's activation sum taken off afterwards, as Q4_0 and Q5_0 take
off their 8 and 16 (``sumi = sum u * x - offset * sum x``); every value fits: 255 * 127 * 32 < 2^31.

The instructions are AVX-512 VNNI's: a matrix takes these kernels only under ``KernelSet.AVX512``
(``llama_quant.cpu``), chosen when it is built.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import int32, prange, types
from numba.extending import intrinsic

from ._ir import IR, V16I16, V16I32, V32I8, V32I16, widen_f16
from ._tiles import spread_tokens
from .pairs import _finish_block, _pair_vectors, _store_tile

__all__ = ["QUAD_TOKENS", "mm_q4", "mm_q5", "mm_q8", "q8_quad_layout"]

# From this many tokens on, Q4 and Q5 blocks are turned into quads once per call (fewer: ``pairs``' kernels,
# which read the stored bytes once per token).
QUAD_TOKENS = 3

# row r of a chunk: word 2r of the quad vector from pair 2k's vector, word 2r + 1 from pair 2k + 1's
_INTERLEAVE = ir.Constant(ir.VectorType(ir.IntType(32), 32), [i // 2 + 16 * (i % 2) for i in range(32)])


def q8_quad_layout(qs: np.ndarray, nb: int) -> np.ndarray:
    """``blocks32``'s Q8_0 tiles [G, nb * 32 * 64] (int8, value-major) -> [G, nb * 2048] uint8: byte
    ((((b * 8 + k) * 4 + c) * 16 + r) * 4 + i) = value ``(2k, 2k + 16, 2k + 1, 2k + 17)[i]`` of block b of
    row 16 c + r, plus 128."""
    g = qs.shape[0]
    out = _aligned((g, nb * 2048))
    # one gather per block of 64 rows: a fixed permutation of its 2048 bytes
    np.take(qs.view(np.uint8).reshape(-1, 2048), _QUAD_ORDER, axis=1, out=out.reshape(-1, 2048))
    np.bitwise_xor(out, np.uint8(128), out=out)
    return out


# source byte of each byte of a Q8_0 quad block: [v, c, r] (value-major) -> [k, c, r, i]
_QUAD_ORDER = (
    np.arange(2048)
    .reshape(32, 4, 16)[np.array([[2 * k, 2 * k + 16, 2 * k + 1, 2 * k + 17] for k in range(8)])]
    .transpose(0, 2, 3, 1)
    .reshape(-1)
)


def _aligned(shape: tuple[int, int]) -> np.ndarray:
    """A uint8 array whose rows start on 64-byte boundaries (a 512-bit load then never spans two cache
    lines); the row length must be a multiple of 64."""
    size = shape[0] * shape[1]
    buf = np.empty(size + 64, np.uint8)
    start = -buf.ctypes.data % 64
    return buf[start : start + size].reshape(shape)


@numba.njit(cache=True, nogil=True, inline="always")
def _scratch(size):  # pragma: no cover - numba
    """``_aligned``'s counterpart inside the kernels: ``size`` bytes starting on a 64-byte boundary."""
    buf = np.empty(size + 64, np.uint8)
    start = (64 - buf.ctypes.data % 64) % 64
    return buf[start : start + size]


def _vpdpbusd(f: IR, acc, u, x):  # type: ignore[no-untyped-def]
    return f._call("llvm.x86.avx512.vpdpbusd.512", V16I32, acc, u, x)


@intrinsic
def _quads_dot(typingctx, acc, u, uoff, xw, xoff):  # type: ignore[no-untyped-def]
    """acc[0:64] (int32) = for the 8 quads k of a block, ``vpdpbusd(u[uoff + 256 k : + 256] (64 rows),
    broadcast(xw[xoff + k]))`` (two sums per chunk, even and odd k, added at the end)."""
    sig = types.void(acc, u, types.intp, xw, types.intp)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        f = IR(context, builder, signature, args)
        uoff, xoff = args[2], args[4]
        acc_p, u_p, x_p = f.data(0), f.data(1), f.data(3)
        zero = ir.Constant(V16I32, None)
        sums = [[zero, zero] for _ in range(4)]
        for k in range(8):
            x = f.broadcast(x_p, xoff, k, V16I32)
            for c in range(4):
                w = f.load(u_p, uoff, k * 256 + c * 64, V16I32, 1)
                sums[c][k % 2] = _vpdpbusd(f, sums[c][k % 2], w, x)
        for c in range(4):
            at = f.at(acc_p, ir.Constant(ir.IntType(32), 0), c * 16, V16I32)
            builder.store(builder.add(sums[c][0], sums[c][1]), at, align=4)
        return context.get_dummy_value()

    return sig, codegen


def _as_quads(dst, u, uoff, hb):  # type: ignore[no-untyped-def]
    planes = hb is not None
    sig = types.void(dst, u, types.intp, *((hb, types.intp) if planes else ()))

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        f = IR(context, builder, signature, args)
        dst_p, u_p, uoff = f.data(0), f.data(1), args[2]
        zero = ir.Constant(ir.IntType(32), 0)
        for k in range(8):
            pair = []
            for j in (2 * k, 2 * k + 1):  # pair j: group j // 4 of ``pairs._pair_group``, its pair j % 4
                bits = None
                if planes:
                    hoff = builder.add(args[4], ir.Constant(args[4].type, (j // 4) * 64))
                    bits = [f.load(f.data(3), hoff, 32 * i, V32I8, 1) for i in range(2)]
                goff = builder.add(uoff, ir.Constant(uoff.type, (j // 4) * 256))
                pair.append(_pair_vectors(f, u_p, goff, bits, j % 4))
            for c in range(4):
                a, b = (builder.bitcast(v[c], V16I16) for v in pair)
                quad = builder.shuffle_vector(a, b, _INTERLEAVE)
                builder.store(quad, f.at(dst_p, zero, k * 256 + c * 64, V32I16), align=1)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _q4_as_quads(typingctx, dst, u, uoff):  # type: ignore[no-untyped-def]
    """dst[0:2048] (uint8) = block ``u[uoff : uoff + 1024]`` of a ``pairs.q4_pair_layout`` tile in quads."""
    return _as_quads(dst, u, uoff, None)


@intrinsic
def _q5_as_quads(typingctx, dst, u, uoff, hb, hoff):  # type: ignore[no-untyped-def]
    """The same for a ``pairs.q5_pair_layout`` block, its fifth bits from the planes ``hb[hoff : + 256]``."""
    return _as_quads(dst, u, uoff, hb)


@numba.njit(cache=True, nogil=True)
def _activation_quads(xw, xq, t0, t1, nb):  # pragma: no cover - numba
    """xw[t, b * 8 + k] = the bytes of x[b * 32 + 2k], x[.. + 16], x[.. + 1], x[.. + 17] (little-endian)."""
    for t in range(t0, t1):
        for b in range(nb):
            for k in range(8):
                o = b * 32 + 2 * k
                w = np.uint32(np.uint8(xq[t, o])) | (np.uint32(np.uint8(xq[t, o + 16])) << np.uint32(8))
                w |= np.uint32(np.uint8(xq[t, o + 1])) << np.uint32(16)
                xw[t, b * 8 + k] = w | (np.uint32(np.uint8(xq[t, o + 17])) << np.uint32(24))


@numba.njit(cache=True, nogil=True, parallel=True)
def _quad_words(xq, n, nb):  # pragma: no cover - numba
    """``_activation_quads`` of n tokens, on all threads for a prompt."""
    xw = np.empty((n, nb * 8), np.uint32)
    spread_tokens(_activation_quads, xw, xq, n, nb)
    return xw


@numba.njit(cache=True, nogil=True, inline="always")
def _quad_tokens(ys, acc, dw, mw, u, uoff, d, m, xw, xd, xs, xsum, n, b, kind, bias):  # pragma: no cover
    """ys[t, 0:64] += block b of a tile in quads (``u[uoff:]``) for every token t, with ``pairs._finish_block``'s
    float step ``kind`` (0: with a min, Q4_1 / Q5_1; 1: Q4_0; 2: Q5_0 / Q8_0) and ``bias`` times the block's
    activation sum taken off the integer sum. acc, dw, mw: scratch of 64."""
    widen_f16(dw, d, b * 64)  # type: ignore[call-arg]
    if kind == 0:
        widen_f16(mw, m, b * 64)  # type: ignore[call-arg]
    for t in range(n):
        _quads_dot(acc, u, uoff, xw[t], b * 8)  # type: ignore[call-arg]
        offset = int32(bias * int32(xsum[t, 2 * b] + xsum[t, 2 * b + 1]))
        _finish_block(ys[t], acc, dw, mw, 0, xd[t, b], xs[t, b], offset, kind)


@numba.njit(cache=True, nogil=True, parallel=True)
def mm_q8(out, qs, d, xq, xd, xsum, n, rows, nb):  # pragma: no cover - numba
    """out[n, rows] for Q8_0 against Q8_0 activations; qs in ``q8_quad_layout``, d as ``pairs.mm_q8``.
    Each block of a tile goes through every token while it is in L1."""
    xw = _quad_words(xq, n, nb)
    for g in prange(qs.shape[0]):
        ys = np.zeros((n, 64), np.float32)
        acc = np.empty(64, np.int32)
        dw = np.empty(64, np.float32)
        for b in range(nb):
            _quad_tokens(ys, acc, dw, dw, qs[g], b * 2048, d[g], d[g], xw, xd, xd, xsum, n, b, 2, 128)
        _store_tile(out, ys, n, rows, g)


def mm_q4(out, qs, d, m, xq, xd, xs, xsum, n, rows, nb, has_min):  # type: ignore[no-untyped-def]
    """``pairs.mm_q4``'s product (same arguments) for ``QUAD_TOKENS`` tokens or more: each block turned into
    quads once for all tokens."""
    _mm_q45(out, qs, qs, d, m, xq, xd, xs, xsum, n, rows, nb, has_min, False)


def mm_q5(out, qs, hb, d, m, xq, xd, xs, xsum, n, rows, nb, has_min):  # type: ignore[no-untyped-def]
    """``pairs.mm_q5``'s product (same arguments) for ``QUAD_TOKENS`` tokens or more."""
    _mm_q45(out, qs, hb, d, m, xq, xd, xs, xsum, n, rows, nb, has_min, True)


@numba.njit(cache=True, nogil=True, parallel=True)
def _mm_q45(out, qs, hb, d, m, xq, xd, xs, xsum, n, rows, nb, has_min, five):  # pragma: no cover - numba
    """The Q4 and Q5 driver: ``five`` selects Q5's fifth bits from ``hb`` (else unread)."""
    xw = _quad_words(xq, n, nb)
    kind, bias = (0, 0) if has_min else ((2, 16) if five else (1, 8))
    for g in prange(qs.shape[0]):
        u = _scratch(2048)
        ys = np.zeros((n, 64), np.float32)
        acc = np.empty(64, np.int32)
        dw = np.empty(64, np.float32)
        mw = np.zeros(64, np.float32)
        for b in range(nb):
            if five:
                _q5_as_quads(u, qs[g], b * 1024, hb[g], b * 256)  # type: ignore[call-arg]
            else:
                _q4_as_quads(u, qs[g], b * 1024)  # type: ignore[call-arg]
            _quad_tokens(ys, acc, dw, mw, u, 0, d[g], m[g], xw, xd, xs, xsum, n, b, kind, bias)
        _store_tile(out, ys, n, rows, g)
