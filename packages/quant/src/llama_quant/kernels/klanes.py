"""Products of Q4_K and Q6_K through byte-pair multiply-adds (x86 ``pmaddubsw``, ``pmaddwd``), with the same
numbers as ``kquants``: ggml's 8 integer lanes per super-block formed for 64 rows at once.

A lane's integer sum is exact however it is formed, so only the float steps must follow ggml: each is the
same f32 operation as ``kquants``', done on the lane sums as they leave the integer registers (Q4_K's min
terms are integers formed exactly in f32, ``_min_terms``). The tiles are stored at load in the order the
lane kernels read (``k_pair_layout``; each type's layout is described at its kernel), so one kernel serves
a single token as well as a prompt, whose tokens it takes eight or four at a time against each tile
vector.

Each lane kernel exists at two vector widths, chosen by the kernel set (``llama_quant.cpu``): ``mm_k256``
on 256-bit vectors (AVX2, ``KernelSet.AVX2``) and ``mm_k512`` running the same instructions on 512-bit
vectors, two row groups at a time (AVX-512BW, ``KernelSet.AVX512``; Q6_K 640x2048 on a 512-token prompt:
1.56x faster, Q4_K 640x1024: 1.17x). The numba cache is kept per CPU, so a build for one never runs on
another.
"""

from __future__ import annotations

import numba
import numpy as np
from gguf import GGMLQuantizationType as T
from llvmlite import ir
from numba import float32, int32, prange, types, uint64
from numba.extending import intrinsic

from ._ir import I16, IR, V8I32, V16I8, V16I16, V16I32, V32I8, V32I16, V64I8, nibbles, splat
from ._tiles import spread_tokens
from .kquants import _finish

__all__ = ["k_pair_layout", "mm_k256", "mm_k256_experts", "mm_k512", "mm_k512_experts"]

# Bytes of a K-type tile prefetched ahead of the first token's reads (``IR.prefetch``). Measured on cold
# weights: Q6_K 16 -> 25-33 GB/s, Q4_K 23 -> 25-31 GB/s (4096 x 4096), +20-50% on Gemma 3's 640-row
# matrices; best at 8-16 KB. Q4_0/Q4_1/Q8_0 stream as fast without (Q8_0 slower with): none there.
_AHEAD = 12288

# Tokens a lane kernel takes at once in a prompt (then _HALF, then one, for the rest): each tile vector is
# loaded, split and its scales widened once for all of them, and ggml's float step runs on the lane sums
# while they are in registers. 2048 x 1024 on 512 tokens, 2 threads, AVX-512: Q4_K 91 -> 118 G
# multiply-adds a second, Q6_K 72 -> 96 (one token at a time, lane sums through memory, before).
_BLOCK = 8
_HALF = 4
_AUX = 8 * 64  # a token's int32 lane sums: 8 lanes of 64 rows


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
def _q4k_lanes(typingctx, sums, lane, dd, u, uoff, scl, scloff, xp, offs, ahead, bits, nt):  # type: ignore[no-untyped-def]
    """One lane of one super-block for 64 rows and ``nt`` tokens (a literal, ``_tokens``), token j's
    activation words at xp[offs[j]] (layouts above): the tile's vectors are loaded and split once for all the
    tokens. Then ggml's float step, ``sums[l] += d * aux32[l]``, on token j's sums[j * 512 + 64 l + 0:64]
    with d = dd[64 j + 0:64] (f32). The bytes ``ahead`` of the tile's 1024 are prefetched. ``bits`` (a
    literal 256 or 512): the vector width; at 512, two row groups (16 rows) per vector."""
    wide, n_tok = _wide(bits), _tokens(nt)
    if wide is None or n_tok is None:
        return None
    ip = types.intp
    sig = types.void(sums, ip, dd, u, ip, scl, ip, xp, offs, ip, bits, nt)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        f = IR(context, builder, signature, args)
        uoff, scloff = args[4], args[6]
        u_p, s_p, x_p = (f.data(i) for i in (3, 5, 7))
        f.prefetch(u_p, uoff, args[9], 1024)
        per = 2 if wide else 1  # row groups of 8 rows per vector
        acc_t = V16I32 if wide else V8I32
        xs = [
            [f.broadcast(x_p, x, k, V64I8 if wide else V32I8) for k in range(8)]
            for x in _offsets(f, 8, n_tok)
        ]
        for rg in range(0, 8, per):
            accs = [ir.Constant(acc_t, None)] * n_tok
            for c in range(4):
                w0, w1 = nibbles(f, f.load_rows(u_p, uoff, (c * 8 + rg) * 32, 32, V32I8, wide))
                sc = f.load_rows(s_p, scloff, (c * 8 + rg) * 16, 16, V16I8, wide)
                sc = builder.sext(sc, ir.VectorType(I16, sc.type.count))
                for j in range(n_tok):
                    pair = builder.add(f.pmaddubsw(w0, xs[j][2 * c]), f.pmaddubsw(w1, xs[j][2 * c + 1]))
                    accs[j] = builder.add(accs[j], f.pmaddwd(pair, sc))
            _lane_floats(f, accs, rg, wide)
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
def _q6k_lanes(typingctx, sums, lane, dd, u, uoff, scl, scloff, xw, bx, offs, ahead, bits, nt):  # type: ignore[no-untyped-def]
    """``_q4k_lanes`` for Q6_K: token j's activation words at xw[offs[j]], its offset terms at bx[offs[j]]; the
    bytes ``ahead`` of the tile's 1536 are prefetched."""
    wide, n_tok = _wide(bits), _tokens(nt)
    if wide is None or n_tok is None:
        return None
    ip = types.intp
    sig = types.void(sums, ip, dd, u, ip, scl, ip, xw, bx, offs, ip, bits, nt)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        f = IR(context, builder, signature, args)
        uoff, scloff = args[4], args[6]
        u_p, s_p, x_p, b_p = (f.data(i) for i in (3, 5, 7, 8))
        f.prefetch(u_p, uoff, args[10], 1536)
        per = 2 if wide else 1  # row groups of 8 rows per vector
        acc_t = V16I32 if wide else V8I32
        offs = _offsets(f, 9, n_tok)
        xs = [[f.broadcast(x_p, x, jp, V64I8 if wide else V32I8) for jp in range(8)] for x in offs]
        bs = [[f.broadcast(b_p, x, jp, V32I16 if wide else V16I16) for jp in range(8)] for x in offs]
        for rg in range(0, 8, per):
            accs = [ir.Constant(acc_t, None)] * n_tok
            for a in range(2):
                unit = (a * 8 + rg) * 96
                vs = (f.load_rows(u_p, uoff, unit + 32 * v, 96, V32I8, wide) for v in range(3))
                for k, w in enumerate(_six_bits(f, *vs)):
                    jp = 4 * a + k
                    sc = f.load_rows(s_p, scloff, (jp * 8 + rg) * 16, 16, V16I8, wide)
                    sc = builder.sext(sc, ir.VectorType(I16, sc.type.count))
                    for j in range(n_tok):
                        # pair sums (<= 2 * 63 * 127) plus offset terms (|.| <= 32 * 254) still fit int16
                        pair = builder.add(f.pmaddubsw(w, xs[j][jp]), bs[j][jp])
                        accs[j] = builder.add(accs[j], f.pmaddwd(pair, sc))
            _lane_floats(f, accs, rg, wide)
        return context.get_dummy_value()

    return sig, codegen


def _offsets(f: IR, i: int, n_tok: int) -> list:  # type: ignore[type-arg]
    """The first ``n_tok`` entries of the int64 array argument i: where each token's activation words start."""
    p = f.data(i)
    return [f.b.load(f.b.gep(p, [ir.Constant(ir.IntType(64), j)])) for j in range(n_tok)]


def _lane_floats(f: IR, accs, rg: int, wide: bool) -> None:  # type: ignore[no-untyped-def]
    """ggml's float step for one lane's int32 sums ``accs[j]`` of row group ``rg`` (two with ``wide``),
    token j: sums[512 j + 64 lane + row] += dd[64 j + row] * float(aux32) (arguments 0, 1, 2 of the
    lane kernels), each an f32 multiply then add as ggml's loop."""
    b = f.b
    ft = ir.VectorType(ir.FloatType(), 16 if wide else 8)
    sums_p, dd_p = f.data(0), f.data(2)
    base = b.mul(f.args[1], ir.Constant(f.args[1].type, 64))
    zero = ir.Constant(f.args[1].type, 0)
    for j, acc in enumerate(accs):
        d = f.load(dd_p, zero, 64 * j + rg * 8, ft, 4)
        at = f.at(sums_p, base, _AUX * j + rg * 8, ft)
        b.store(b.fadd(b.load(at, align=4), b.fmul(d, b.sitofp(acc, ft))), at, align=4)


def _six_bits(f: IR, n0, n1, high):  # type: ignore[no-untyped-def]
    """The four 6-bit byte vectors of one ``k_pair_layout`` unit (or two units side by side): low nibbles
    of values 0, 1 in ``n0``, of 2, 3 in ``n1``; the top two bits of value k at bits 2k, 2k + 1 of
    ``high``."""
    b = f.b
    words = ir.VectorType(I16, high.type.count // 2)

    def shift(v, n: int, left: bool):  # type: ignore[no-untyped-def]  # 16-bit lanes: masked after
        moved = (b.shl if left else b.lshr)(b.bitcast(v, words), ir.Constant(words, [n] * words.count))
        return b.bitcast(moved, v.type)

    lo0, lo1 = nibbles(f, n0)
    lo2, lo3 = nibbles(f, n1)
    top = splat(0x30, high)
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


def _wide(bits):  # type: ignore[no-untyped-def]
    """Whether a lane kernel's ``bits`` argument asks for 512-bit vectors; None unless it is a literal 256
    or 512 (numba then types the call with the literal, which each driver passes as a constant)."""
    if isinstance(bits, types.IntegerLiteral) and bits.literal_value in (256, 512):
        return bits.literal_value == 512
    return None


def _tokens(nt):  # type: ignore[no-untyped-def]
    """A lane kernel's token count: a literal 1, ``_HALF`` or ``_BLOCK``; None otherwise."""
    if isinstance(nt, types.IntegerLiteral) and nt.literal_value in (1, _HALF, _BLOCK):
        return int(nt.literal_value)
    return None


@numba.njit(cache=True, nogil=True, parallel=True)
def mm_k256(out, q, sc, mn, d, dmin, xq, xd, xsum, n, rows, nsb, q6):  # pragma: no cover - numba
    """out[n, rows] for Q6_K (q6) or Q4_K against Q8_K activations, on 256-bit vectors (AVX2); the tiles in
    ``k_pair_layout``, the activations as ``kquants.mv_k8`` / ``kquants.mv_q4k``."""
    xw, bx = _k_words(xq, n, nsb, q6)
    every = np.empty(0, np.int64)
    for g in prange(q.shape[0]):
        _whole_tile(out, q, sc, mn, d, dmin, xw, bx, xd, xsum, every, n, rows, nsb, q6, g, 256)


@numba.njit(cache=True, nogil=True, parallel=True)
def mm_k512(out, q, sc, mn, d, dmin, xq, xd, xsum, n, rows, nsb, q6):  # pragma: no cover - numba
    """``mm_k256``'s product on 512-bit vectors (AVX-512BW), two row groups at a time. A separate function,
    not a flag: numba's cache keys a function by its name and argument types, so each width is its own
    compiled (and cached) kernel, and the 256-bit one never holds a 512-bit instruction."""
    xw, bx = _k_words(xq, n, nsb, q6)
    every = np.empty(0, np.int64)
    for g in prange(q.shape[0]):
        _whole_tile(out, q, sc, mn, d, dmin, xw, bx, xd, xsum, every, n, rows, nsb, q6, g, 512)


@numba.njit(cache=True, nogil=True, parallel=True)
def mm_k256_experts(
    out, q, sc, mn, d, dmin, xq, xd, xsum, n, rows, nsb, q6, pairs, offsets, active, m, div
):  # pragma: no cover - numba
    """Experts stacked in one matrix, each ``rows`` rows padded to whole tiles: for every active expert
    e = active[s] (s < m) and each of its pairs p = pairs[offsets[e]:offsets[e + 1]], out[p, :rows] =
    expert e's rows times activation row p // div (ggml_mul_mat_id). One launch for all experts' tiles;
    each product is the number ``mm_k256`` gives."""
    xw, bx = _k_words(xq, n, nsb, q6)
    te = (rows + 63) // 64
    for w in prange(m * te):
        _expert_tile(
            out, q, sc, mn, d, dmin, xw, bx, xd, xsum, rows, nsb, q6, pairs, offsets, active, div, te, w, 256
        )


@numba.njit(cache=True, nogil=True, parallel=True)
def mm_k512_experts(
    out, q, sc, mn, d, dmin, xq, xd, xsum, n, rows, nsb, q6, pairs, offsets, active, m, div
):  # pragma: no cover - numba
    """``mm_k256_experts`` on 512-bit vectors."""
    xw, bx = _k_words(xq, n, nsb, q6)
    te = (rows + 63) // 64
    for w in prange(m * te):
        _expert_tile(
            out, q, sc, mn, d, dmin, xw, bx, xd, xsum, rows, nsb, q6, pairs, offsets, active, div, te, w, 512
        )


@numba.njit(cache=True, nogil=True, inline="always")
def _whole_tile(
    out, q, sc, mn, d, dmin, xw, bx, xd, xsum, every, n, rows, nsb, q6, g, bits
):  # pragma: no cover
    """Work item g of a plain product: tile g for all n tokens."""
    _k_tile(
        out, q[g], sc[g], mn[g], d[g], dmin[g], xw, bx, xd, xsum, every, 0, n, 0, g * 64, rows, nsb, q6, bits
    )


@numba.njit(cache=True, nogil=True, inline="always")
def _expert_tile(
    out, q, sc, mn, d, dmin, xw, bx, xd, xsum, rows, nsb, q6, pairs, offsets, active, div, te, w, bits
):  # pragma: no cover
    """Work item w of a grouped product: tile w % te of the active expert w // te, for its pairs."""
    e, j = active[w // te], w % te
    g = e * te + j
    lo, hi = offsets[e], offsets[e + 1]
    _k_tile(
        out,
        q[g],
        sc[g],
        mn[g],
        d[g],
        dmin[g],
        xw,
        bx,
        xd,
        xsum,
        pairs,
        lo,
        hi,
        div,
        j * 64,
        rows,
        nsb,
        q6,
        bits,
    )


@numba.njit(cache=True, nogil=True, parallel=True)
def _k_words(xq, n, nsb, q6):  # pragma: no cover - numba
    """The activation words (and Q6_K's offset terms) of n tokens, on all threads for a prompt."""
    words = (np.empty((n, nsb * 64), np.uint32), np.empty((n, nsb * 64 if q6 else 0), np.uint32))
    spread_tokens(_k_activation_words, words, xq, n, nsb)
    return words


@numba.njit(cache=True, nogil=True, inline="always")
def _k_activation_words(words, xq, t0, t1, nsb):  # pragma: no cover - numba
    """Q4_K's or Q5_K's words into words[0]; Q6_K's, and its offset terms into words[1] (empty otherwise)."""
    xw, bx = words
    if bx.shape[1]:
        _activation_words_q6k(xw, bx, xq, t0, t1, nsb)
    else:
        _activation_words_q4k(xw, xq, t0, t1, nsb)


@numba.njit(cache=True, nogil=True, inline="always")
def _k_tile(
    out, u, scl, mn, d, dmin, xw, bx, xd, xsum, pairs, lo, hi, div, r0, rows, nsb, q6, bits
):  # pragma: no cover
    """Tokens against one tile (its rows r0.. of ``rows``): the lane kernels of width ``bits`` with their
    float steps, ``_BLOCK`` tokens at a time while that many remain, and Q4_K's min terms. div 0: tokens
    lo..hi-1 into the same output rows; else pairs[lo:hi] name the output rows, each reading activation
    row pair // div."""
    y = np.empty(_BLOCK * 64, np.float32)
    sums = np.empty(_BLOCK * _AUX, np.float32)
    dd = np.empty(_BLOCK * 64, np.float32)
    mnf = np.empty(8 * 64, np.float32)
    isc = np.empty(_BLOCK * 64, np.float32)
    dst = np.empty(_BLOCK, np.int64)
    tok = np.empty(_BLOCK, np.int64)
    offs = np.empty(_BLOCK, np.int64)
    words = xw.shape[1]
    i = lo
    while i < hi:
        nb = _BLOCK if hi - i >= _BLOCK else _HALF if hi - i >= _HALF else 1
        for j in range(nb):
            dst[j] = i + j if div == 0 else pairs[i + j]
            tok[j] = dst[j] if div == 0 else dst[j] // div
        ahead = _AHEAD if i == lo else 0  # later tokens find the tile in cache
        for k in range(nb * 64):
            y[k] = float32(0.0)
        for k in range(nb * _AUX):
            sums[k] = float32(0.0)
        for s in range(nsb):
            for j in range(nb):  # ggml's d = fp16(x.d) * y.d per row
                dy = xd[tok[j], s]
                for k in range(uint64(64)):
                    dd[uint64(j) * uint64(64) + k] = d[uint64(s) * uint64(64) + k] * dy
            for lane in range(8):
                o = (s * 8 + lane) * 8
                for j in range(nb):
                    offs[j] = tok[j] * words + o
                if nb == _BLOCK:
                    if q6:
                        _q6k_lanes(
                            sums, lane, dd, u, o * 192, scl, s * 1024, xw, bx, offs, ahead, bits, _BLOCK
                        )  # type: ignore[call-arg]
                    else:
                        _q4k_lanes(sums, lane, dd, u, o * 128, scl, s * 512, xw, offs, ahead, bits, _BLOCK)  # type: ignore[call-arg]
                elif nb == _HALF:
                    if q6:
                        _q6k_lanes(
                            sums, lane, dd, u, o * 192, scl, s * 1024, xw, bx, offs, ahead, bits, _HALF
                        )  # type: ignore[call-arg]
                    else:
                        _q4k_lanes(sums, lane, dd, u, o * 128, scl, s * 512, xw, offs, ahead, bits, _HALF)  # type: ignore[call-arg]
                elif q6:
                    _q6k_lanes(sums, lane, dd, u, o * 192, scl, s * 1024, xw, bx, offs, ahead, bits, 1)  # type: ignore[call-arg]
                else:
                    _q4k_lanes(sums, lane, dd, u, o * 128, scl, s * 512, xw, offs, ahead, bits, 1)  # type: ignore[call-arg]
            if not q6:
                _min_terms(y, mnf, isc, mn, dmin, xsum, xd, tok, nb, s)
        for j in range(nb):
            yj = y[j * 64 : j * 64 + 64]
            _finish(yj, sums[j * _AUX : (j + 1) * _AUX], uint64(64), 1)
            for k in range(min(64, rows - r0)):
                out[dst[j], r0 + k] = yj[k]
        i += nb


@numba.njit(cache=True, nogil=True, inline="always")
def _min_terms(y, mnf, isc, mn, dmin, xsum, xd, tok, nb, s):  # pragma: no cover - numba
    """Q4_K's ``sumf -= dmin * sumi`` of super-block s for the block's tokens (y[64 j + row]), with
    dmin = fp16(x.dmin) * y.d and sumi = sum over the 8 mins of min * (the two bsums under it). The integer
    sumi is formed in f32 multiply-adds: every product and partial sum is an integer below 2^24
    (8 * 63 * 4096), so each is exact and sumi's float is the one ggml converts."""
    so = uint64(s) * uint64(512)
    for k in range(uint64(512)):
        mnf[k] = float32(mn[so + k])
    for k in range(uint64(nb) * uint64(64)):
        isc[k] = float32(0.0)
    for j in range(uint64(nb)):
        xo = uint64(s) * uint64(16)
        t = tok[j]
        for m in range(uint64(8)):
            b = float32(int32(xsum[t, xo + uint64(2) * m]) + int32(xsum[t, xo + uint64(2) * m + uint64(1)]))
            for k in range(uint64(64)):
                isc[j * uint64(64) + k] += mnf[m * uint64(64) + k] * b
    for j in range(uint64(nb)):
        dy = xd[tok[j], s]
        for k in range(uint64(64)):
            yo = j * uint64(64) + k
            y[yo] = y[yo] - (dmin[uint64(s) * uint64(64) + k] * dy) * isc[yo]
