"""Products of the 32-value types through byte-pair multiply-adds (x86 ``pmaddubsw``, ``pmaddwd``) for Q4_0,
Q4_1, Q5_0, Q5_1 and Q8_0, with the same numbers as ``blocks32``: the AVX2 kernel set.

A block's integer sum ``sumi`` is exact however it is formed, so only its float steps must follow ggml
(they are ``blocks32``'s, unchanged). The weights sit in byte pairs: ``pmaddubsw`` multiplies 16 rows'
pairs ``(value j, value j + 16)`` of a block by one token's broadcast pair ``(x[j], x[j + 16])`` and adds
each pair, 32 products per instruction. The unsigned values (0..15, 0..31) times int8 activations
(|x| <= 127, ggml's Q8 quantizers) give pair sums of at most 2 * 31 * 127 = 7874, so 4 (Q5) or 8 (Q4)
pairs add up in int16 without overflow before they are widened to int32. Q4_0 / Q5_0 subtract the offset
afterwards (``sumi = sum q * x - 8 * sum x``, or 16).

Every type is stored at load in the order its kernel reads (``q4_pair_layout``, ``q5_pair_layout``,
``q8_pair_layout``: 4-bit values two to a byte, as in the file, Q5's fifth bits in bit planes), so one
kernel serves a single token as well as a prompt, and a token reads about the file's bytes. The scales stay
in fp16 (``_ir.widen_f16``). Q8_0's signed weights take ``pmaddwd`` on int8 pairs sign-extended from
memory. The K types' byte-pair kernels are ``klanes``'.

The instructions are AVX2's (with F16C): a matrix takes these kernels only under ``KernelSet.AVX2`` or
above (``llama_quant.cpu``), chosen when it is built.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import float32, int32, prange, types
from numba.extending import intrinsic

from ._ir import I32, IR, V8I32, V16I8, V16I16, V16I32, V32I8, V32I32, nibbles, widen_f16
from ._tiles import spread_tokens

__all__ = ["mm_q4", "mm_q5", "mm_q8", "q4_pair_layout", "q5_pair_layout", "q8_pair_layout"]

_Q5_WIDEN_TOKENS = 3  # from this many tokens on, Q5 blocks are unpacked to int8 once per call (``mm_q5``)


@intrinsic
def _pairs8(typingctx, acc, u, uoff, xp, xoff):  # type: ignore[no-untyped-def]
    """Q4: ``acc[0:64]`` (int32) += for the 8 pairs p of half a block, ``pmaddubsw(pairs of 64 rows,
    broadcast(xp[xoff + p]))`` summed in int16, then widened; the pairs of p are the nibbles of
    ``u[uoff + 64 p : + 64]`` (``q4_pair_layout``)."""
    return _pair_group(acc, u, uoff, xp, xoff, None)


@intrinsic
def _pairs5(typingctx, acc, u, uoff, xp, xoff, hb, hoff):  # type: ignore[no-untyped-def]
    """Q5: the same for 4 pairs (their sums stay within int16), each value's fifth bit taken from the bit
    planes ``hb[hoff : hoff + 64]`` (``q5_pair_layout``)."""
    return _pair_group(acc, u, uoff, xp, xoff, hb)


def _pair_group(acc, u, uoff, xp, xoff, hb):  # type: ignore[no-untyped-def]
    planes = hb is not None
    sig = types.void(acc, u, types.intp, xp, types.intp, *((hb, types.intp) if planes else ()))

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        f = IR(context, builder, signature, args)
        uoff, xoff = args[2], args[4]
        acc_p, u_p, x_p = f.data(0), f.data(1), f.data(3)
        bits = [f.load(f.data(5), args[6], 32 * i, V32I8, 1) for i in range(2)] if planes else None
        sums = [ir.Constant(V16I16, None)] * 4  # 4 x 16 rows
        for p in range(4 if planes else 8):
            x = f.broadcast(x_p, xoff, p, V32I8)
            for c, w in enumerate(_pair_vectors(f, u_p, uoff, bits, p)):
                sums[c] = builder.add(sums[c], f.pmaddubsw(w, x))
        for c in range(4):
            at = f.at(acc_p, ir.Constant(I32, 0), c * 16, V16I32)
            builder.store(builder.add(builder.load(at, align=4), builder.sext(sums[c], V16I32)), at, align=4)
        return context.get_dummy_value()

    return sig, codegen


def _pair_vectors(f: IR, u_p, uoff, bits, p: int):  # type: ignore[no-untyped-def]
    """The four byte vectors (16 rows x (value j, value j + 16)) of pair p: the nibbles of
    ``u[uoff + 64 p : + 64]``, with Q5's fifth bits from ``bits`` (the group's two planes) where given."""
    ws = []
    for h in range(2):
        ws.extend(nibbles(f, f.load(u_p, uoff, p * 64 + h * 32, V32I8, 1)))
    if bits is not None:  # vector 4p + c's fifth bits: bit (4p + c) % 8 of plane (4p + c) // 8, to bit 4
        ws = [f.b.or_(w, _bit_to_4(f, bits[p // 2], (4 * p + c) % 8)) for c, w in enumerate(ws)]
    return ws


@intrinsic
def _q5_as_q8(typingctx, dst, dstoff, u, uoff, hb, hoff, bias):  # type: ignore[no-untyped-def]
    """dst[dstoff : dstoff + 512] (int8) = the 4 pairs of a ``_pairs5`` group unpacked, minus ``bias`` (16
    for Q5_0): ``q8_pair_layout``'s bytes, for ``_pairs_wd``."""
    sig = types.void(dst, types.intp, u, types.intp, hb, types.intp, types.int8)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        f = IR(context, builder, signature, args)
        dst_p, u_p, hb_p = f.data(0), f.data(2), f.data(4)
        bits = [f.load(hb_p, args[5], 32 * i, V32I8, 1) for i in range(2)]
        undef = ir.Constant(V32I8, ir.Undefined)
        bias = builder.shuffle_vector(
            builder.insert_element(undef, args[6], ir.Constant(I32, 0)),
            undef,
            ir.Constant(V32I32, [0] * 32),
        )
        for p in range(4):
            for c, w in enumerate(_pair_vectors(f, u_p, args[3], bits, p)):
                builder.store(builder.sub(w, bias), f.at(dst_p, args[1], (4 * p + c) * 32, V32I8), align=1)
        return context.get_dummy_value()

    return sig, codegen


def _bit_to_4(f: IR, plane, k: int):  # type: ignore[no-untyped-def]
    """Bit k of each byte of ``plane``, moved to bit 4 (the 16-bit shift's spill across bytes is masked)."""
    b = f.b
    wide = b.bitcast(plane, V16I16)
    if k != 4:
        by = ir.Constant(V16I16, [abs(4 - k)] * 16)
        wide = b.shl(wide, by) if k < 4 else b.lshr(wide, by)
    return b.and_(b.bitcast(wide, V32I8), ir.Constant(V32I8, [16] * 32))


@numba.njit(cache=True, nogil=True)
def _activation_pairs(xp, xq, t0, t1, nb):  # pragma: no cover - numba
    """xp[t, b * 16 + j] = the bytes of x[b * 32 + j] and x[b * 32 + j + 16] (little-endian uint16)."""
    for t in range(t0, t1):
        for b in range(nb):
            for j in range(16):
                lo = np.uint16(np.uint8(xq[t, b * 32 + j]))
                hi = np.uint16(np.uint8(xq[t, b * 32 + j + 16]))
                xp[t, b * 16 + j] = lo | (hi << np.uint16(8))


@numba.njit(cache=True, nogil=True, parallel=True)
def _pair_words(xq, n, nb):  # pragma: no cover - numba
    """``_activation_pairs`` of n tokens, on all threads for a prompt."""
    xp = np.empty((n, nb * 16), np.uint16)
    spread_tokens(_activation_pairs, xp, xq, n, nb)
    return xp


def q4_pair_layout(qs: np.ndarray, nb: int) -> np.ndarray:
    """``blocks32``'s Q4 tiles [G, nb * 16 * 64] -> the same size, the nibbles regrouped: unpacked, pair j of
    block b is 64 rows x (value j, value j + 16) in 128 bytes, four vectors of 16 rows; stored, byte k of
    half h (32 bytes) holds byte k of vector 2h in its low nibble and of vector 2h + 1 in its high one."""
    g = qs.shape[0]
    u = np.stack((qs & 15, qs >> 4), axis=-1).reshape(g, nb * 16, 2, 2, 32)  # [G, pair, h, vector, 32]
    return np.ascontiguousarray(u[:, :, :, 0] | (u[:, :, :, 1] << 4)).reshape(g, -1)


def q5_pair_layout(qs: np.ndarray, qh: np.ndarray, nb: int) -> tuple[np.ndarray, np.ndarray]:
    """``blocks32``'s Q5 tiles (qs [G, nb * 16 * 64], qh [G, nb * 4 * 64]) -> the low nibbles in
    ``q4_pair_layout`` and the fifth bits as bit planes [G, nb * 256]: the 64 unpacked vectors of a block
    (pair p, vector c: 4p + c) go 8 to a 32-byte plane, vector v's bits at bit v % 8 of plane v // 8."""
    g = qs.shape[0]
    words = qh.reshape(g, nb, 4, 64).astype(np.uint32)
    word = words[:, :, 0] | words[:, :, 1] << 8 | words[:, :, 2] << 16 | words[:, :, 3] << 24  # [G, nb, r]
    j = np.arange(16, dtype=np.uint32)[None, None, :, None]
    lo, hi = (word[:, :, None, :] >> j) & 1, (word[:, :, None, :] >> (j + 16)) & 1  # [G, nb, pair, r]
    bits = np.stack((lo, hi), axis=-1).astype(np.uint8).reshape(g, nb, 8, 8, 32)  # [G, nb, plane, k, 32]
    planes = (bits << np.arange(8, dtype=np.uint8)[:, None]).sum(axis=3, dtype=np.uint8)
    return q4_pair_layout(qs, nb), np.ascontiguousarray(planes).reshape(g, -1)


@numba.njit(cache=True, nogil=True, inline="always")
def _finish_block(y, acc, d, m, do, dy, sy, offset, kind):  # pragma: no cover - numba
    """One block's float step for 64 rows (``blocks32``'s, in ggml's order); kind 0: Q4_1 / Q5_1,
    1: Q4_0, 2: Q5_0 (sumi = acc - offset)."""
    if kind == 0:  # Q4_1, Q5_1: sumf += (d_w * d_x) * sumi + m_w * s_x
        for k in range(64):
            y[k] = y[k] + ((d[do + k] * dy) * float32(acc[k]) + m[do + k] * sy)
    elif kind == 1:  # Q4_0: sumf += (sumi * d_w) * d_x
        for k in range(64):
            y[k] = y[k] + (float32(int32(acc[k] - offset)) * d[do + k]) * dy
    else:  # Q5_0: sumf += (d_w * d_x) * sumi
        for k in range(64):
            y[k] = y[k] + (d[do + k] * dy) * float32(int32(acc[k] - offset))


@numba.njit(cache=True, nogil=True, parallel=True)
def mm_q4(out, qs, d, m, xq, xd, xs, xsum, n, rows, nb, has_min):  # pragma: no cover - numba
    """out[n, rows] for Q4_0 (has_min False, Q8_0 activations) or Q4_1 (Q8_1); qs in ``q4_pair_layout``, the
    rest as ``blocks32.mv_q4``."""
    xp = _pair_words(xq, n, nb)
    for g in prange(qs.shape[0]):
        _run_tile(out, qs[g], qs[g], d[g], m[g], xp, xd, xs, xsum, n, rows, nb, g, 8, has_min)


@numba.njit(cache=True, nogil=True, parallel=True)
def mm_q5(out, qs, hb, d, m, xq, xd, xs, xsum, n, rows, nb, has_min):  # pragma: no cover - numba
    """out[n, rows] for Q5_0 (has_min False, Q8_0 activations) or Q5_1 (Q8_1); qs and hb in
    ``q5_pair_layout``, the rest as ``mm_q4``. From ``_Q5_WIDEN_TOKENS`` tokens on, each block is unpacked
    to int8 once for all tokens (``_q5_as_q8``) and runs ``mm_q8``'s loop, instead of re-assembling the
    fifth bits for every token (measured: 5-bit reads make one token 1.3-1.5x faster than Q5_0 widened to
    Q8_0; unpacking once keeps 3 to 512 tokens at the widened speed)."""
    if n >= _Q5_WIDEN_TOKENS:
        xw = _q8_words(xq, n, nb)
        for g in prange(qs.shape[0]):
            u = np.empty(2048, np.int8)
            ys = np.zeros((n, 64), np.float32)
            acc = np.empty(64, np.int32)
            dw = np.empty(64, np.float32)
            mw = np.zeros(64, np.float32)
            bias = 0 if has_min else 16
            for b in range(nb):
                for q in range(4):
                    _q5_as_q8(u, q * 512, qs[g], b * 1024 + q * 256, hb[g], b * 256 + q * 64, bias)  # type: ignore[call-arg]
                _block_tokens(ys, acc, dw, mw, u, 0, d[g], m[g], xw, xd, xs, n, b, has_min)
            _store_tile(out, ys, n, rows, g)
        return
    xp = _pair_words(xq, n, nb)
    for g in prange(qs.shape[0]):
        _run_tile(out, qs[g], hb[g], d[g], m[g], xp, xd, xs, xsum, n, rows, nb, g, 4, has_min)


@numba.njit(cache=True, nogil=True, inline="always")
def _run_tile(out, u, hb, d, m, xp, xd, xs, xsum, n, rows, nb, g, group, has_min):  # pragma: no cover - numba
    """Every token against one tile: group = pairs summed in int16 (8 for Q4, 4 for Q5, whose fifth bits
    are ``hb``)."""
    acc = np.empty(64, np.int32)
    y = np.empty(64, np.float32)
    dw = np.empty(64, np.float32)
    mw = np.zeros(64, np.float32)
    scale = 8 if group == 8 else 16  # the value offset of the types without a min
    kind = 0 if has_min else (1 if group == 8 else 2)
    for t in range(n):
        xt = xp[t]
        for k in range(64):
            y[k] = float32(0.0)
        for b in range(nb):
            for k in range(64):
                acc[k] = 0
            if group == 8:
                _pairs8(acc, u, b * 1024, xt, b * 16)  # type: ignore[call-arg]
                _pairs8(acc, u, b * 1024 + 512, xt, b * 16 + 8)  # type: ignore[call-arg]
            else:
                for q in range(4):
                    _pairs5(acc, u, b * 1024 + q * 256, xt, b * 16 + q * 4, hb, b * 256 + q * 64)  # type: ignore[call-arg]
            offset = 0 if has_min else int32(scale * int32(xsum[t, 2 * b] + xsum[t, 2 * b + 1]))
            widen_f16(dw, d, b * 64)  # type: ignore[call-arg]
            if has_min:
                widen_f16(mw, m, b * 64)  # type: ignore[call-arg]
            _finish_block(y, acc, dw, mw, 0, xd[t, b], xs[t, b], offset, kind)
        r0 = g * 64
        for k in range(min(64, rows - r0)):
            out[t, r0 + k] = y[k]


# --- Q8_0 -----------------------------------------------------------------------------------------------
#
# Signed weights take ``pmaddwd``: the tile is stored (at load, ``q8_pair_layout``: the same bytes in another
# order) as int8 pairs (value j, value j + 16) per row, and 8 rows' pairs are sign-extended to int16 straight
# from memory (``vpmovsxbw``), each row's two products added in int32 (no intermediate can overflow). No
# unpacking, so one kernel serves one token as well as a prompt.


def q8_pair_layout(qs: np.ndarray, nb: int) -> np.ndarray:
    """``blocks32``'s Q8_0 tiles [G, nb * 32 * 64] -> [G, nb * 16 * 64 * 2]: byte ((b * 16 + j) * 64 + r) * 2
    + h = value j + 16 h of block b of row r."""
    g = qs.shape[0]
    return np.ascontiguousarray(qs.reshape(g, nb, 2, 16, 64).transpose(0, 1, 3, 4, 2)).reshape(g, -1)


@intrinsic
def _pairs_wd(typingctx, acc, u, uoff, xw, xoff):  # type: ignore[no-untyped-def]
    """acc[0:64] (int32) = for the 16 pairs p of a block, ``pmaddwd(sext(u[uoff + 128 p : + 128]),
    broadcast(xw[xoff + p]))`` (u int8: 64 rows x 2 values per pair)."""
    sig = types.void(acc, u, types.intp, xw, types.intp)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        f = IR(context, builder, signature, args)
        uoff, xoff = args[2], args[4]
        acc_p, u_p, x_p = f.data(0), f.data(1), f.data(3)
        sums = [ir.Constant(V8I32, None)] * 8  # 8 x 8 rows
        for p in range(16):
            x = f.broadcast(x_p, xoff, p, V16I16)
            for c in range(8):
                w = builder.sext(f.load(u_p, uoff, p * 128 + c * 16, V16I8, 1), V16I16)
                sums[c] = builder.add(sums[c], f.pmaddwd(w, x))
        for c in range(8):
            builder.store(sums[c], f.at(acc_p, ir.Constant(I32, 0), c * 8, V8I32), align=4)
        return context.get_dummy_value()

    return sig, codegen


@numba.njit(cache=True, nogil=True)
def _activation_words_q8(xw, xq, t0, t1, nb):  # pragma: no cover - numba
    """xw[t, b * 16 + j] = the int16 pair (x[b * 32 + j], x[b * 32 + j + 16]) as one uint32."""
    for t in range(t0, t1):
        for b in range(nb):
            for j in range(16):
                lo = np.uint32(np.uint16(np.int16(xq[t, b * 32 + j])))
                hi = np.uint32(np.uint16(np.int16(xq[t, b * 32 + j + 16])))
                xw[t, b * 16 + j] = lo | (hi << np.uint32(16))


@numba.njit(cache=True, nogil=True, parallel=True)
def _q8_words(xq, n, nb):  # pragma: no cover - numba
    """``_activation_words_q8`` of n tokens, on all threads for a prompt."""
    xw = np.empty((n, nb * 16), np.uint32)
    spread_tokens(_activation_words_q8, xw, xq, n, nb)
    return xw


@numba.njit(cache=True, nogil=True, parallel=True)
def mm_q8(out, qs, d, xq, xd, n, rows, nb):  # pragma: no cover - numba
    """out[n, rows] for Q8_0 against Q8_0 activations; qs in ``q8_pair_layout``, the rest as
    ``blocks32.mv_q8``. Each block of a tile goes through every token while it is in L1."""
    xw = _q8_words(xq, n, nb)
    for g in prange(qs.shape[0]):
        ys = np.zeros((n, 64), np.float32)
        acc = np.empty(64, np.int32)
        dw = np.empty(64, np.float32)
        mw = np.zeros(64, np.float32)
        for b in range(nb):
            _block_tokens(ys, acc, dw, mw, qs[g], b * 2048, d[g], d[g], xw, xd, xd, n, b, False)
        _store_tile(out, ys, n, rows, g)


@numba.njit(cache=True, nogil=True, inline="always")
def _block_tokens(ys, acc, dw, mw, u, uoff, d, m, xw, xd, xs, n, b, has_min):  # pragma: no cover - numba
    """ys[t, 0:64] += block b of a tile of int8 pairs (``u[uoff:]``, ``q8_pair_layout``) for every token t:
    Q8_0 or Q5_0 unpacked (``(d_w * d_x) * sumi``: the same product as Q8_0's ``sumi * (d_w * d_x)``), or
    Q5_1 unpacked (has_min, ``(d_w * d_x) * sumi + m_w * s_x``). Each row's blocks are still added in
    order, as ggml does. acc, dw, mw: scratch of 64, allocated once per tile by the caller."""
    widen_f16(dw, d, b * 64)  # type: ignore[call-arg]
    if has_min:
        widen_f16(mw, m, b * 64)  # type: ignore[call-arg]
    for t in range(n):
        _pairs_wd(acc, u, uoff, xw[t], b * 16)  # type: ignore[call-arg]
        if has_min:
            _finish_block(ys[t], acc, dw, mw, 0, xd[t, b], xs[t, b], 0, 0)
        else:
            _finish_block(ys[t], acc, dw, dw, 0, xd[t, b], float32(0.0), 0, 2)


@numba.njit(cache=True, nogil=True, inline="always")
def _store_tile(out, ys, n, rows, g):  # pragma: no cover - numba
    r0 = g * 64
    for t in range(n):
        for k in range(min(64, rows - r0)):
            out[t, r0 + k] = ys[t, k]
