"""The LLVM IR the byte-pair and VNNI kernels' intrinsics are written in (``pairs``, ``klanes``, ``quads``).

``IR`` wraps one llvmlite builder with the few operations the kernels use (loads at an offset, broadcasts,
prefetches, ``pmaddubsw`` / ``pmaddwd`` on 256- or 512-bit vectors); the vector types are named by lanes
and element width (``V32I8``: 32 x int8, one 256-bit register).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

__all__ = [
    "I8",
    "I16",
    "I32",
    "IR",
    "V8I32",
    "V16I8",
    "V16I16",
    "V16I32",
    "V32I8",
    "V32I16",
    "V32I32",
    "V64I8",
    "f16_scales",
    "nibbles",
    "splat",
    "widen_f16",
]

I8, I16, I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
V16I8, V32I8, V16I16, V8I32, V16I32, V32I32 = (
    ir.VectorType(I8, 16),
    ir.VectorType(I8, 32),
    ir.VectorType(I16, 16),
    ir.VectorType(I32, 8),
    ir.VectorType(I32, 16),
    ir.VectorType(I32, 32),
)
V32I16, V64I8 = ir.VectorType(I16, 32), ir.VectorType(I8, 64)


def splat(v: int, like):  # type: ignore[no-untyped-def]
    """The constant ``v`` in every element of a vector of ``like``'s type."""
    return ir.Constant(like.type, [v] * like.type.count)


class IR:
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
        vec = self.b.insert_element(undef, word, ir.Constant(I32, 0))
        return self.b.bitcast(
            self.b.shuffle_vector(vec, undef, ir.Constant(ir.VectorType(I32, n), [0] * n)), ty
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
        reads alternate between the tile and its scales (``klanes._AHEAD``). A prefetch never faults, so reading
        ahead past the array's end is harmless."""
        b = self.b
        hints = [ir.Constant(I32, v) for v in (0, 3, 1)]  # read, keep in all levels, data cache
        with b.if_then(b.icmp_signed("!=", ahead, ir.Constant(ahead.type, 0))):
            start = b.add(base, ahead)
            for line in range(0, nbytes, 64):
                self._call("llvm.prefetch", ir.VoidType(), self.at(ptr, start, line, I8), *hints)

    def pmaddubsw(self, a, b):  # type: ignore[no-untyped-def]
        """16 (or, from 512-bit operands, 32) x int16: a (u8) times b (s8), adjacent products added."""
        if a.type.count == 64:
            return self._call("llvm.x86.avx512.pmaddubs.w.512", V32I16, a, b)
        return self._call("llvm.x86.avx2.pmadd.ub.sw", V16I16, a, b)

    def pmaddwd(self, a, b):  # type: ignore[no-untyped-def]
        """8 (or 16) x int32: a times b (int16), adjacent products added."""
        if a.type.count == 32:
            return self._call("llvm.x86.avx512.pmaddw.d.512", V16I32, a, b)
        return self._call("llvm.x86.avx2.pmadd.wd", V8I32, a, b)

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
            lo, hi, ir.Constant(ir.VectorType(I32, 2 * ty.count), list(range(2 * ty.count)))
        )


_V8H, _V8F = ir.VectorType(ir.HalfType(), 8), ir.VectorType(ir.FloatType(), 8)


@intrinsic
def widen_f16(typingctx, dst, src, off):  # type: ignore[no-untyped-def]
    """dst[0:64] (f32) = the fp16 values src[off : off + 64] (uint16 bits), exactly (``vcvtph2ps``). The
    tiles keep their scales in fp16 as the file does: a quarter of Q4_1's bytes, not a third."""
    sig = types.void(dst, src, types.intp)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        f = IR(context, builder, signature, args)
        dst_p, src_p = f.data(0), f.data(1)
        for i in range(8):
            half = f.load(src_p, args[2], i * 8, _V8H, 2)
            builder.store(builder.fpext(half, _V8F), f.at(dst_p, ir.Constant(I32, 0), i * 8, _V8F), align=4)
        return context.get_dummy_value()

    return sig, codegen


def f16_scales(d: np.ndarray) -> np.ndarray:
    """f32 scales that came from fp16 (``blocks32.pack``'s d, m) -> their fp16 bits, as ``widen_f16`` reads."""
    return d.astype(np.float16).view(np.uint16)


def nibbles(f: IR, packed):  # type: ignore[no-untyped-def]
    """The two byte vectors held in one vector's low and high nibbles (256 or 512 bits)."""
    b = f.b
    words = ir.VectorType(I16, packed.type.count // 2)
    high = b.bitcast(b.lshr(b.bitcast(packed, words), ir.Constant(words, [4] * words.count)), packed.type)
    return b.and_(packed, splat(15, packed)), b.and_(high, splat(15, packed))
