"""Products through byte-pair multiply-adds (x86 ``pmaddubsw``, ``pmaddwd``) for Q4_0, Q4_1, Q5_0, Q5_1,
Q8_0, Q4_K and Q6_K, with the same numbers as ``blocks32`` and ``kquants``.

A block's integer sum ``sumi`` is exact however it is formed, so only its float steps must follow ggml
(they are ``blocks32``'s and ``kquants``', unchanged). The weights sit in byte pairs: ``pmaddubsw``
multiplies 16 rows' pairs ``(value j, value j + 16)`` of a block by one token's broadcast pair
``(x[j], x[j + 16])`` and adds each pair, 32 products per instruction. The unsigned values (0..15, 0..31)
times int8 activations (|x| <= 127, ggml's Q8 quantizers) give pair sums of at most 2 * 31 * 127 = 7874, so
4 (Q5) or 8 (Q4) pairs add up in int16 without overflow before they are widened to int32. Q4_0 / Q5_0
subtract the offset afterwards (``sumi = sum q * x - 8 * sum x``, or 16).

Every type is stored at load in the order its kernel reads (``q4_pair_layout``, ``q5_pair_layout``,
``q8_pair_layout``, ``k_pair_layout``: 4-bit values two to a byte, as in the file, Q5's fifth bits in bit
planes), so one kernel serves a single token as well as a prompt, and a token reads about the file's bytes.
The 32-value types keep their scales in fp16 (``_widen_f16``). Q8_0's signed weights take ``pmaddwd`` on int8
pairs sign-extended from memory; the K types' layouts are described at their kernels.

The instructions are AVX2's (with F16C); ``AVAILABLE`` says whether this CPU (and numba's target) has them.
Without them the callers use ``blocks32``'s and ``kquants``' kernels for every token count. Where AVX-512BW
exists (``WIDE``), the K types' lane kernels run the same instructions on 512-bit vectors, two row groups at
a time (Q6_K 640x2048 on a 512-token prompt: 1.56x faster, Q4_K 640x1024: 1.17x); the numba cache is kept
per CPU, so a build for one never runs on the other.
"""

from __future__ import annotations

import numba
import numpy as np
from gguf import GGMLQuantizationType as T
from llvmlite import ir
from numba import float32, int32, prange, types, uint64
from numba.extending import intrinsic

from ..cpu import cpu_has
from ._tiles import TILE_ROWS
from .kquants import _finish, _float_step, _min_sums

__all__ = [
    "AVAILABLE",
    "k_pair_layout",
    "mm_q4",
    "mm_q4k",
    "mm_q5",
    "mm_q6k",
    "mm_q8",
    "q4_pair_layout",
    "q5_pair_layout",
    "q8_pair_layout",
]


# AVX2 and F16C (every AVX2 CPU has both; the kernels need both)
AVAILABLE = TILE_ROWS == 64 and cpu_has("avx2", "f16c")
# The K types' lane kernels take 16 rows per vector instead of 8 where 512-bit byte operations exist.
WIDE = AVAILABLE and cpu_has("avx512f", "avx512bw")

# Bytes of a K-type tile prefetched ahead of the first token's reads (``_IR.prefetch``). Measured on cold
# weights: Q6_K 16 -> 25-33 GB/s, Q4_K 23 -> 25-31 GB/s (4096 x 4096), +20-50% on Gemma 3's 640-row
# matrices; best at 8-16 KB. Q4_0/Q4_1/Q8_0 stream as fast without (Q8_0 slower with): none there.
_AHEAD = 12288
_SPREAD_TOKENS = 16  # from this many tokens on, the activations are rearranged on all threads (in 16 parts)
_Q5_WIDEN_TOKENS = 3  # from this many tokens on, Q5 blocks are unpacked to int8 once per call (``mm_q5``)


# --- LLVM IR shared by the intrinsics below -------------------------------------------------------------

_I8, _I16, _I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
_V16I8, _V32I8, _V16I16, _V8I32, _V16I32, _V32I32 = (
    ir.VectorType(_I8, 16),
    ir.VectorType(_I8, 32),
    ir.VectorType(_I16, 16),
    ir.VectorType(_I32, 8),
    ir.VectorType(_I32, 16),
    ir.VectorType(_I32, 32),
)
_V32I16, _V64I8 = ir.VectorType(_I16, 32), ir.VectorType(_I8, 64)


def _splat(v: int, like):  # type: ignore[no-untyped-def]
    """The constant ``v`` in every element of a vector of ``like``'s type."""
    return ir.Constant(like.type, [v] * like.type.count)


class _IR:
    """The few operations the kernels' intrinsics are written in, over one llvmlite builder."""

    def __init__(self, context, builder, signature, args):  # type: ignore[no-untyped-def]
        self.b = builder
        self.context, self.signature, self.args = context, signature, args

    def data(self, i: int):  # type: ignore[no-untyped-def]
        """The data pointer of array argument i."""
        return self.context.make_array(self.signature.args[i])(self.context, self.b, self.args[i]).data

    def at(self, ptr, base, off: int, ty):  # type: ignore[no-untyped-def]
        """``&ptr[base + off]`` as a pointer to ``ty``."""
        return self.b.bitcast(
            self.b.gep(ptr, [self.b.add(base, ir.Constant(base.type, off))]), ty.as_pointer()
        )

    def load(self, ptr, base, off: int, ty, align: int):  # type: ignore[no-untyped-def]
        return self.b.load(self.at(ptr, base, off, ty), align=align)

    def broadcast(self, ptr, base, k: int, ty):  # type: ignore[no-untyped-def]
        """The scalar ``ptr[base + k]`` repeated across ``ty``'s width (256 or 512 bits), viewed as ``ty``."""
        word = self.b.load(self.b.gep(ptr, [self.b.add(base, ir.Constant(base.type, k))]))
        n = ty.count * ty.element.width // word.type.width
        undef = ir.Constant(ir.VectorType(word.type, n), ir.Undefined)
        vec = self.b.insert_element(undef, word, ir.Constant(_I32, 0))
        return self.b.bitcast(
            self.b.shuffle_vector(vec, undef, ir.Constant(ir.VectorType(_I32, n), [0] * n)), ty
        )

    def _call(self, name: str, ret, *args):  # type: ignore[no-untyped-def]
        module = self.b.module
        fn = module.globals.get(name) or ir.Function(
            module, ir.FunctionType(ret, [a.type for a in args]), name
        )
        return self.b.call(fn, list(args))

    def prefetch(self, ptr, base, ahead, nbytes: int):  # type: ignore[no-untyped-def]
        """Ask for the ``nbytes`` at ``&ptr[base + ahead]`` (a byte array) to be brought into cache; nothing
        when ``ahead`` is 0. The hardware prefetchers alone fall behind the K types' lane kernels, whose
        reads alternate between the tile and its scales (``_AHEAD``). A prefetch never faults, so reading
        ahead past the array's end is harmless."""
        b = self.b
        hints = [ir.Constant(_I32, v) for v in (0, 3, 1)]  # read, keep in all levels, data cache
        with b.if_then(b.icmp_signed("!=", ahead, ir.Constant(ahead.type, 0))):
            start = b.add(base, ahead)
            for line in range(0, nbytes, 64):
                self._call("llvm.prefetch", ir.VoidType(), self.at(ptr, start, line, _I8), *hints)

    def pmaddubsw(self, a, b):  # type: ignore[no-untyped-def]
        """16 (or, from 512-bit operands, 32) x int16: a (u8) times b (s8), adjacent products added."""
        if a.type.count == 64:
            return self._call("llvm.x86.avx512.pmaddubs.w.512", _V32I16, a, b)
        return self._call("llvm.x86.avx2.pmadd.ub.sw", _V16I16, a, b)

    def pmaddwd(self, a, b):  # type: ignore[no-untyped-def]
        """8 (or 16) x int32: a times b (int16), adjacent products added."""
        if a.type.count == 32:
            return self._call("llvm.x86.avx512.pmaddw.d.512", _V16I32, a, b)
        return self._call("llvm.x86.avx2.pmadd.wd", _V8I32, a, b)

    def load_rows(self, ptr, base, off: int, step: int, ty, wide: bool):  # type: ignore[no-untyped-def]
        """``ty`` (a 256-bit vector) at ``&ptr[base + off]``, or with ``wide`` that and the next one at
        ``+ step`` bytes side by side in a 512-bit vector (two row groups' vectors, one register)."""
        lo = self.load(ptr, base, off, ty, 1)
        if not wide:
            return lo
        if step == ty.count * ty.element.width // 8:  # contiguous: one load
            return self.load(ptr, base, off, ir.VectorType(ty.element, 2 * ty.count), 1)
        hi = self.load(ptr, base, off + step, ty, 1)
        return self.b.shuffle_vector(
            lo, hi, ir.Constant(ir.VectorType(_I32, 2 * ty.count), list(range(2 * ty.count)))
        )


_V8H, _V8F = ir.VectorType(ir.HalfType(), 8), ir.VectorType(ir.FloatType(), 8)


@intrinsic
def _widen_f16(typingctx, dst, src, off):  # type: ignore[no-untyped-def]
    """dst[0:64] (f32) = the fp16 values src[off : off + 64] (uint16 bits), exactly (``vcvtph2ps``). The
    tiles keep their scales in fp16 as the file does: a quarter of Q4_1's bytes, not a third."""
    sig = types.void(dst, src, types.intp)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        f = _IR(context, builder, signature, args)
        dst_p, src_p = f.data(0), f.data(1)
        for i in range(8):
            half = f.load(src_p, args[2], i * 8, _V8H, 2)
            builder.store(builder.fpext(half, _V8F), f.at(dst_p, ir.Constant(_I32, 0), i * 8, _V8F), align=4)
        return context.get_dummy_value()

    return sig, codegen


def f16_scales(d: np.ndarray) -> np.ndarray:
    """f32 scales that came from fp16 (``blocks32.pack``'s d, m) -> their fp16 bits, as ``_widen_f16`` reads."""
    return d.astype(np.float16).view(np.uint16)


def _nibbles(f: _IR, packed):  # type: ignore[no-untyped-def]
    """The two byte vectors held in one vector's low and high nibbles (256 or 512 bits)."""
    b = f.b
    words = ir.VectorType(_I16, packed.type.count // 2)
    high = b.bitcast(b.lshr(b.bitcast(packed, words), ir.Constant(words, [4] * words.count)), packed.type)
    return b.and_(packed, _splat(15, packed)), b.and_(high, _splat(15, packed))


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
        f = _IR(context, builder, signature, args)
        uoff, xoff = args[2], args[4]
        acc_p, u_p, x_p = f.data(0), f.data(1), f.data(3)
        bits = [f.load(f.data(5), args[6], 32 * i, _V32I8, 1) for i in range(2)] if planes else None
        sums = [ir.Constant(_V16I16, None)] * 4  # 4 x 16 rows
        for p in range(4 if planes else 8):
            x = f.broadcast(x_p, xoff, p, _V32I8)
            for c, w in enumerate(_pair_vectors(f, u_p, uoff, bits, p)):
                sums[c] = builder.add(sums[c], f.pmaddubsw(w, x))
        for c in range(4):
            at = f.at(acc_p, ir.Constant(_I32, 0), c * 16, _V16I32)
            builder.store(builder.add(builder.load(at, align=4), builder.sext(sums[c], _V16I32)), at, align=4)
        return context.get_dummy_value()

    return sig, codegen


def _pair_vectors(f: _IR, u_p, uoff, bits, p: int):  # type: ignore[no-untyped-def]
    """The four byte vectors (16 rows x (value j, value j + 16)) of pair p: the nibbles of
    ``u[uoff + 64 p : + 64]``, with Q5's fifth bits from ``bits`` (the group's two planes) where given."""
    ws = []
    for h in range(2):
        ws.extend(_nibbles(f, f.load(u_p, uoff, p * 64 + h * 32, _V32I8, 1)))
    if bits is not None:  # vector 4p + c's fifth bits: bit (4p + c) % 8 of plane (4p + c) // 8, to bit 4
        ws = [f.b.or_(w, _bit_to_4(f, bits[p // 2], (4 * p + c) % 8)) for c, w in enumerate(ws)]
    return ws


@intrinsic
def _q5_as_q8(typingctx, dst, dstoff, u, uoff, hb, hoff, bias):  # type: ignore[no-untyped-def]
    """dst[dstoff : dstoff + 512] (int8) = the 4 pairs of a ``_pairs5`` group unpacked, minus ``bias`` (16
    for Q5_0): ``q8_pair_layout``'s bytes, for ``_pairs_wd``."""
    sig = types.void(dst, types.intp, u, types.intp, hb, types.intp, types.int8)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        f = _IR(context, builder, signature, args)
        dst_p, u_p, hb_p = f.data(0), f.data(2), f.data(4)
        bits = [f.load(hb_p, args[5], 32 * i, _V32I8, 1) for i in range(2)]
        undef = ir.Constant(_V32I8, ir.Undefined)
        bias = builder.shuffle_vector(
            builder.insert_element(undef, args[6], ir.Constant(_I32, 0)),
            undef,
            ir.Constant(_V32I32, [0] * 32),
        )
        for p in range(4):
            for c, w in enumerate(_pair_vectors(f, u_p, args[3], bits, p)):
                builder.store(builder.sub(w, bias), f.at(dst_p, args[1], (4 * p + c) * 32, _V32I8), align=1)
        return context.get_dummy_value()

    return sig, codegen


def _bit_to_4(f: _IR, plane, k: int):  # type: ignore[no-untyped-def]
    """Bit k of each byte of ``plane``, moved to bit 4 (the 16-bit shift's spill across bytes is masked)."""
    b = f.b
    wide = b.bitcast(plane, _V16I16)
    if k != 4:
        by = ir.Constant(_V16I16, [abs(4 - k)] * 16)
        wide = b.shl(wide, by) if k < 4 else b.lshr(wide, by)
    return b.and_(b.bitcast(wide, _V32I8), ir.Constant(_V32I8, [16] * 32))


@numba.njit(cache=True, nogil=True)
def _activation_pairs(xp, xq, t0, t1, nb):  # pragma: no cover - numba
    """xp[t, b * 16 + j] = the bytes of x[b * 32 + j] and x[b * 32 + j + 16] (little-endian uint16)."""
    for t in range(t0, t1):
        for b in range(nb):
            for j in range(16):
                lo = np.uint16(np.uint8(xq[t, b * 32 + j]))
                hi = np.uint16(np.uint8(xq[t, b * 32 + j + 16]))
                xp[t, b * 16 + j] = lo | (hi << np.uint16(8))


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
    xp = np.empty((n, nb * 16), np.uint16)
    if n >= _SPREAD_TOKENS:  # a prompt: the tokens' words on all threads
        for c in prange(_SPREAD_TOKENS):
            _activation_pairs(xp, xq, c * n // _SPREAD_TOKENS, (c + 1) * n // _SPREAD_TOKENS, nb)
    else:
        _activation_pairs(xp, xq, 0, n, nb)
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
    xp = np.empty((n, nb * 16), np.uint16)
    if n >= _SPREAD_TOKENS:  # a prompt: the tokens' words on all threads
        for c in prange(_SPREAD_TOKENS):
            _activation_pairs(xp, xq, c * n // _SPREAD_TOKENS, (c + 1) * n // _SPREAD_TOKENS, nb)
    else:
        _activation_pairs(xp, xq, 0, n, nb)
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
            _widen_f16(dw, d, b * 64)  # type: ignore[call-arg]
            if has_min:
                _widen_f16(mw, m, b * 64)  # type: ignore[call-arg]
            _finish_block(y, acc, dw, mw, 0, xd[t, b], xs[t, b], offset, kind)
        r0 = g * 64
        for k in range(min(64, rows - r0)):
            out[t, r0 + k] = y[k]


# --- Q4_K -----------------------------------------------------------------------------------------------
#
# ggml's generic Q4_K vec_dot keeps 8 integer lanes per super-block: lane l of sub-block j (32 values,
# scale sc_j) sums the products at positions 32 j + l + {0, 8, 16, 24}. Chunk c of the raw bytes holds
# sub-blocks 2c (low nibbles) and 2c + 1 (high nibbles). For 8 rows at a time the unpacked tile holds,
# per row, the four bytes (lo(b), lo(b + 8), hi(b), hi(b + 8)) of chunk bytes b = l and b = l + 16 in two
# vectors, stored as the low and high nibbles of one (``k_pair_layout``); one token's matching activation
# bytes are broadcast as a 32-bit pattern. ``pmaddubsw`` then
# gives per row the lane's partial sums of both sub-blocks side by side (int16, |s| <= 4 * 15 * 127), and
# ``pmaddwd`` with the rows' (sc_2c, sc_2c+1) adds ``sc_2c * s_lo + sc_2c+1 * s_hi`` in int32: exactly the
# chunk's share of ggml's aux32[l].


@intrinsic
def _q4k_lane(typingctx, aux, auxoff, u, uoff, scl, scloff, xp, xoff, ahead):  # type: ignore[no-untyped-def]
    """aux[auxoff + 0:64] (int32) = lane sums of 64 rows for one lane of one super-block (layouts above);
    the bytes ``ahead`` of its 1024 are prefetched. With ``WIDE``, two row groups (16 rows) per vector."""
    sig = types.void(aux, types.intp, u, types.intp, scl, types.intp, xp, types.intp, types.intp)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        f = _IR(context, builder, signature, args)
        auxoff, uoff, scloff, xoff = args[1::2]
        aux_p, u_p, s_p, x_p = (f.data(i) for i in (0, 2, 4, 6))
        f.prefetch(u_p, uoff, args[8], 1024)
        per = 2 if WIDE else 1  # row groups of 8 rows per vector
        acc_t = _V16I32 if WIDE else _V8I32
        xs = [f.broadcast(x_p, xoff, k, _V64I8 if WIDE else _V32I8) for k in range(8)]  # (chunk, half)
        for rg in range(0, 8, per):
            acc = ir.Constant(acc_t, None)
            for c in range(4):
                w0, w1 = _nibbles(f, f.load_rows(u_p, uoff, (c * 8 + rg) * 32, 32, _V32I8, WIDE))
                sums = builder.add(f.pmaddubsw(w0, xs[2 * c]), f.pmaddubsw(w1, xs[2 * c + 1]))
                sc = f.load_rows(s_p, scloff, (c * 8 + rg) * 16, 16, _V16I8, WIDE)
                acc = builder.add(acc, f.pmaddwd(sums, builder.sext(sc, sums.type)))
            builder.store(acc, f.at(aux_p, auxoff, rg * 8, acc_t), align=4)
        return context.get_dummy_value()

    return sig, codegen


@numba.njit(cache=True, nogil=True)
def _activation_words_q4k(xw, xq, t0, t1, nsb):  # pragma: no cover - numba
    """xw[t, ((s * 8 + l) * 4 + c) * 2 + h] = the bytes x[p], x[p + 8], x[p + 32], x[p + 40] of
    p = 256 s + 64 c + l + 16 h (little-endian uint32)."""
    for t in range(t0, t1):
        for s in range(nsb):
            for lane in range(8):
                for c in range(4):
                    for h in range(2):
                        p = s * 256 + c * 64 + lane + 16 * h
                        b0 = np.uint32(np.uint8(xq[t, p]))
                        b1 = np.uint32(np.uint8(xq[t, p + 8]))
                        b2 = np.uint32(np.uint8(xq[t, p + 32]))
                        b3 = np.uint32(np.uint8(xq[t, p + 40]))
                        w = b0 | (b1 << np.uint32(8)) | (b2 << np.uint32(16)) | (b3 << np.uint32(24))
                        xw[t, ((s * 8 + lane) * 4 + c) * 2 + h] = w


@numba.njit(cache=True, nogil=True)
def _unpack_q4k(u, scl, qs, sc, nsb):  # pragma: no cover - numba
    """One tile: u[((((s * 8 + l) * 4 + c) * 8 + rg) * 2 + h) * 32 + 4 i + {0..3}] = lo(b), lo(b + 8),
    hi(b), hi(b + 8) of chunk byte b = l + 16 h, row 8 rg + i; scl[((s * 4 + c) * 8 + rg) * 16 + 2 i + {0, 1}]
    = the scales of sub-blocks 2c, 2c + 1 of that row."""
    for s in range(nsb):
        for c in range(4):
            for rg in range(8):
                for i in range(8):
                    r = rg * 8 + i
                    o = ((s * 4 + c) * 8 + rg) * 16 + 2 * i
                    scl[o] = sc[(s * 8 + 2 * c) * 64 + r]
                    scl[o + 1] = sc[(s * 8 + 2 * c + 1) * 64 + r]
        for lane in range(8):
            for c in range(4):
                for rg in range(8):
                    for h in range(2):
                        b = lane + 16 * h
                        q0 = (s * 128 + c * 32 + b) * 64 + rg * 8
                        q1 = q0 + 8 * 64
                        o = ((((s * 8 + lane) * 4 + c) * 8 + rg) * 2 + h) * 32
                        for i in range(8):
                            v0 = qs[q0 + i]
                            v1 = qs[q1 + i]
                            u[o + 4 * i] = v0 & 15
                            u[o + 4 * i + 1] = v1 & 15
                            u[o + 4 * i + 2] = v0 >> 4
                            u[o + 4 * i + 3] = v1 >> 4


# --- Q6_K -----------------------------------------------------------------------------------------------
#
# Lane l of sub-block j (16 values, signed scale sc_j) sums a * x at positions 16 j + l and 16 j + 8 + l,
# with a = q - 32 (q the unsigned 6-bit value). ``pmaddubsw`` multiplies the unsigned q (pair sums <= 2 *
# 63 * 127, no saturation) and the offset is added back through the activations: per row,
# aux32[l] = sum_j sc_j * (S_j - 32 * (x_p + x_p+8)). Sub-blocks go two at a time: a row's four bytes (q
# at 16 j + l, 16 j + 8 + l, 16 j + 16 + l, 16 j + 24 + l) against the broadcast activation bytes, plus the
# broadcast offset terms (in int16), then ``pmaddwd`` with the rows' (sc_j, sc_j+1).
# The 6-bit values are stored as they are in ggml, 6 bits each: four 32-byte vectors of one row group take
# 96 bytes (two nibble vectors and one vector of the top two bits) and are split in registers.


@intrinsic
def _q6k_lane(typingctx, aux, auxoff, u, uoff, scl, scloff, xw, xoff, bx, bxoff, ahead):  # type: ignore[no-untyped-def]
    """aux[auxoff + 0:64] (int32) = lane sums of 64 rows for one lane of one super-block (layouts above);
    the bytes ``ahead`` of its 1536 are prefetched. With ``WIDE``, two row groups (16 rows) per vector."""
    sig = types.void(
        aux, types.intp, u, types.intp, scl, types.intp, xw, types.intp, bx, types.intp, types.intp
    )

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        f = _IR(context, builder, signature, args)
        auxoff, uoff, scloff, xoff, bxoff = args[1::2]
        aux_p, u_p, s_p, x_p, b_p = (f.data(i) for i in (0, 2, 4, 6, 8))
        f.prefetch(u_p, uoff, args[10], 1536)
        per = 2 if WIDE else 1  # row groups of 8 rows per vector
        acc_t = _V16I32 if WIDE else _V8I32
        xs = [f.broadcast(x_p, xoff, jp, _V64I8 if WIDE else _V32I8) for jp in range(8)]
        bs = [f.broadcast(b_p, bxoff, jp, _V32I16 if WIDE else _V16I16) for jp in range(8)]
        for rg in range(0, 8, per):
            acc = ir.Constant(acc_t, None)
            for a in range(2):
                unit = (a * 8 + rg) * 96
                vs = (f.load_rows(u_p, uoff, unit + 32 * v, 96, _V32I8, WIDE) for v in range(3))
                for k, w in enumerate(_six_bits(f, *vs)):
                    jp = 4 * a + k
                    sc = f.load_rows(s_p, scloff, (jp * 8 + rg) * 16, 16, _V16I8, WIDE)
                    # pair sums (<= 2 * 63 * 127) plus offset terms (|.| <= 32 * 254) still fit int16
                    sums = builder.add(f.pmaddubsw(w, xs[jp]), bs[jp])
                    acc = builder.add(acc, f.pmaddwd(sums, builder.sext(sc, sums.type)))
            builder.store(acc, f.at(aux_p, auxoff, rg * 8, acc_t), align=4)
        return context.get_dummy_value()

    return sig, codegen


def _six_bits(f: _IR, n0, n1, high):  # type: ignore[no-untyped-def]
    """The four 6-bit byte vectors of one ``k_pair_layout`` unit (or two units side by side): low nibbles
    of values 0, 1 in ``n0``, of 2, 3 in ``n1``; the top two bits of value k at bits 2k, 2k + 1 of
    ``high``."""
    b = f.b
    words = ir.VectorType(_I16, high.type.count // 2)

    def shift(v, n: int, left: bool):  # type: ignore[no-untyped-def]  # 16-bit lanes: masked after
        moved = (b.shl if left else b.lshr)(b.bitcast(v, words), ir.Constant(words, [n] * words.count))
        return b.bitcast(moved, v.type)

    lo0, lo1 = _nibbles(f, n0)
    lo2, lo3 = _nibbles(f, n1)
    top = _splat(0x30, high)
    h0 = b.and_(shift(high, 4, True), top)
    h1 = b.and_(shift(high, 2, True), top)
    h2 = b.and_(high, top)
    h3 = b.and_(shift(high, 2, False), top)
    return b.or_(lo0, h0), b.or_(lo1, h1), b.or_(lo2, h2), b.or_(lo3, h3)


@numba.njit(cache=True, nogil=True)
def _activation_words_q6k(xw, bx, xq, t0, t1, nsb):  # pragma: no cover - numba
    """xw[t, (s * 8 + l) * 8 + jp] = the bytes x[p], x[p + 8], x[p + 16], x[p + 24] of p = 256 s + 32 jp + l;
    bx[t, same] = the int16 pair -32 (x[p] + x[p + 8]), -32 (x[p + 16] + x[p + 24])."""
    for t in range(t0, t1):
        for s in range(nsb):
            for lane in range(8):
                for jp in range(8):
                    p = s * 256 + jp * 32 + lane
                    w = np.uint32(0)
                    for i in range(4):
                        w |= np.uint32(np.uint8(xq[t, p + 8 * i])) << np.uint32(8 * i)
                    o = (s * 8 + lane) * 8 + jp
                    xw[t, o] = w
                    lo = np.uint32(np.uint16(np.int16(-32 * (int32(xq[t, p]) + int32(xq[t, p + 8])))))
                    hi = np.uint32(np.uint16(np.int16(-32 * (int32(xq[t, p + 16]) + int32(xq[t, p + 24])))))
                    bx[t, o] = lo | (hi << np.uint32(16))


@numba.njit(cache=True, nogil=True)
def _unpack_q6k(u, scl, q, sc, nsb):  # pragma: no cover - numba
    """One tile: u[(((s * 8 + l) * 8 + jp) * 8 + rg) * 32 + 4 i + k] = the unsigned value (a + 32) at
    position 32 jp + l + 8 k of row 8 rg + i; scl[((s * 8 + jp) * 8 + rg) * 16 + 2 i + {0, 1}] = the scales
    of sub-blocks 2 jp, 2 jp + 1 of that row."""
    for s in range(nsb):
        for jp in range(8):
            for rg in range(8):
                for i in range(8):
                    o = ((s * 8 + jp) * 8 + rg) * 16 + 2 * i
                    scl[o] = sc[(s * 16 + 2 * jp) * 64 + rg * 8 + i]
                    scl[o + 1] = sc[(s * 16 + 2 * jp + 1) * 64 + rg * 8 + i]
        for lane in range(8):
            for jp in range(8):
                for rg in range(8):
                    o = (((s * 8 + lane) * 8 + jp) * 8 + rg) * 32
                    for k in range(4):
                        src = (s * 256 + jp * 32 + lane + 8 * k) * 64 + rg * 8
                        for i in range(8):
                            u[o + 4 * i + k] = np.uint8(q[src + i] + 32)


def k_pair_layout(qtype: T, arrays: tuple[np.ndarray, ...], nsb: int) -> tuple[np.ndarray, ...]:
    """``kquants.pack``'s Q4_K or Q6_K tiles -> the layouts ``mm_q4k`` / ``mm_q6k`` take: the values as the
    lane kernels read them (Q4_K: two vectors in the nibbles of one, as raw Q4_K's size; Q6_K: four
    vectors in 96 bytes, ``_six_bits``), the scales as int8 pairs; mins and super-block scales unchanged."""
    q, sc, mn, d, dmin = arrays
    g = q.shape[0]
    q6 = qtype == T.Q6_K
    u = np.empty((g, nsb * 256 * 64 * 3 // 4 if q6 else nsb * 256 * 32), np.uint8)
    scl = np.empty((g, nsb * (8 if q6 else 4) * 8 * 16), np.int8)
    _k_layout(u, scl, q, sc, nsb, q6)
    return u, scl, mn, d, dmin


@numba.njit(cache=True, nogil=True, parallel=True)
def _k_layout(u, scl, q, sc, nsb, q6):  # pragma: no cover - numba
    for g in prange(q.shape[0]):
        full = np.empty(nsb * 256 * 64, np.uint8)
        wide = np.empty(scl.shape[1], np.int16)
        if q6:
            _unpack_q6k(full, wide, q[g], sc[g], nsb)
            for i in range(full.size // 128):  # vectors 4i .. 4i + 3 (jp = 4a + k of one rg) into 96 bytes
                a, rg = divmod(i % 16, 8)
                src = (i // 16) * 2048 + (a * 32 + rg) * 32
                o = i * 96
                for k in range(32):
                    v0 = full[src + k]
                    v1 = full[src + 256 + k]
                    v2 = full[src + 512 + k]
                    v3 = full[src + 768 + k]
                    u[g, o + k] = (v0 & 15) | ((v1 & 15) << np.uint8(4))
                    u[g, o + 32 + k] = (v2 & 15) | ((v3 & 15) << np.uint8(4))
                    u[g, o + 64 + k] = (
                        (v0 >> np.uint8(4))
                        | ((v1 >> np.uint8(4)) << np.uint8(2))
                        | ((v2 >> np.uint8(4)) << np.uint8(4))
                        | ((v3 >> np.uint8(4)) << np.uint8(6))
                    )
        else:
            _unpack_q4k(full, wide, q[g], sc[g], nsb)
            for i in range(full.size // 64):  # vectors 2i, 2i + 1 into the nibbles of one
                for k in range(32):
                    u[g, i * 32 + k] = full[i * 64 + k] | (full[i * 64 + 32 + k] << np.uint8(4))
        for i in range(wide.size):
            scl[g, i] = np.int8(wide[i])  # 6-bit scales (signed for Q6_K): int8 holds them


def mm_q4k(out, qs, sc, mn, d, dmin, xq, xd, xsum, n, rows, nsb):  # type: ignore[no-untyped-def]
    """out[n, rows] for Q4_K against Q8_K activations; the tiles in ``k_pair_layout``, the activations as
    ``kquants.mv_q4k``."""
    _mm_k(out, qs, sc, mn, d, dmin, xq, xd, xsum, n, rows, nsb, False)


def mm_q6k(out, q, sc, mn, d, dmin, xq, xd, xsum, n, rows, nsb):  # type: ignore[no-untyped-def]
    """out[n, rows] for Q6_K against Q8_K activations; the tiles in ``k_pair_layout``, the activations as
    ``kquants.mv_k8``."""
    _mm_k(out, q, sc, mn, d, dmin, xq, xd, xsum, n, rows, nsb, True)


@numba.njit(cache=True, nogil=True, parallel=True)
def _mm_k(out, q, sc, mn, d, dmin, xq, xd, xsum, n, rows, nsb, q6):  # pragma: no cover - numba
    """The K types' driver: q6 selects Q6_K's layouts and lane kernel (else Q4_K's, with its mins)."""
    xw = np.empty((n, nsb * 64), np.uint32)
    bx = np.empty((n, nsb * 64 if q6 else 0), np.uint32)
    if q6:
        if n >= _SPREAD_TOKENS:  # a prompt: the tokens' words on all threads
            for c in prange(_SPREAD_TOKENS):
                _activation_words_q6k(xw, bx, xq, c * n // _SPREAD_TOKENS, (c + 1) * n // _SPREAD_TOKENS, nsb)
        else:
            _activation_words_q6k(xw, bx, xq, 0, n, nsb)
    else:
        if n >= _SPREAD_TOKENS:  # a prompt: the tokens' words on all threads
            for c in prange(_SPREAD_TOKENS):
                _activation_words_q4k(xw, xq, c * n // _SPREAD_TOKENS, (c + 1) * n // _SPREAD_TOKENS, nsb)
        else:
            _activation_words_q4k(xw, xq, 0, n, nsb)
    kind = 0 if q6 else 1
    for g in prange(q.shape[0]):
        u = q[g]
        scl = sc[g]
        y = np.empty(64, np.float32)
        sums = np.empty(8 * 64, np.float32)
        aux = np.empty(8 * 64, np.int32)
        isc = np.empty(64, np.int32)
        for t in range(n):
            xt = xw[t]
            bt = bx[t]
            ahead = _AHEAD if t == 0 else 0  # later tokens find the tile in cache
            for k in range(64):
                y[k] = float32(0.0)
            for i in range(8 * 64):
                sums[i] = float32(0.0)
            for s in range(nsb):
                for lane in range(8):
                    o = (s * 8 + lane) * 8
                    if q6:
                        _q6k_lane(aux, lane * 64, u, o * 192, scl, s * 1024, xt, o, bt, o, ahead)  # type: ignore[call-arg]
                    else:
                        _q4k_lane(aux, lane * 64, u, o * 128, scl, s * 512, xt, o, ahead)  # type: ignore[call-arg]
                # unsigned indices: signed index arithmetic keeps LLVM from vectorizing the float steps
                if not q6:
                    _min_sums(isc, mn[g], xsum[t], uint64(s), uint64(64), 8)
                _float_step(y, sums, aux, isc, d[g], dmin[g], xd[t, s], uint64(s), uint64(64), kind)
            _finish(y, sums, uint64(64), kind)
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
        f = _IR(context, builder, signature, args)
        uoff, xoff = args[2], args[4]
        acc_p, u_p, x_p = f.data(0), f.data(1), f.data(3)
        sums = [ir.Constant(_V8I32, None)] * 8  # 8 x 8 rows
        for p in range(16):
            x = f.broadcast(x_p, xoff, p, _V16I16)
            for c in range(8):
                w = builder.sext(f.load(u_p, uoff, p * 128 + c * 16, _V16I8, 1), _V16I16)
                sums[c] = builder.add(sums[c], f.pmaddwd(w, x))
        for c in range(8):
            builder.store(sums[c], f.at(acc_p, ir.Constant(_I32, 0), c * 8, _V8I32), align=4)
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
    if n >= _SPREAD_TOKENS:  # a prompt: the tokens' words on all threads
        for c in prange(_SPREAD_TOKENS):
            _activation_words_q8(xw, xq, c * n // _SPREAD_TOKENS, (c + 1) * n // _SPREAD_TOKENS, nb)
    else:
        _activation_words_q8(xw, xq, 0, n, nb)
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
    _widen_f16(dw, d, b * 64)  # type: ignore[call-arg]
    if has_min:
        _widen_f16(mw, m, b * 64)  # type: ignore[call-arg]
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
