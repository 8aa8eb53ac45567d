"""LLVM-level helpers the kernels share: fp16 conversions (ggml's fp32_to_fp16 and back) and float bit casts.

Each is a register operation (a bitcast, fptrunc or fpext), which LLVM lowers to vcvtps2ph / vcvtph2ps where
the CPU has F16C and to exact software conversions otherwise: round to nearest even, as ggml.
"""

from __future__ import annotations

import numba
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

__all__ = ["bits_f32", "f16_bits", "f32_bits", "round_f16", "store_rows", "widen"]


@intrinsic
def widen(typingctx, x):  # type: ignore[no-untyped-def]
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
def f16_bits(typingctx, x):  # type: ignore[no-untyped-def]
    """float32 -> the bits of the nearest fp16 (ties to even), as ggml's fp32_to_fp16 (vcvtps2ph)."""
    sig = types.uint16(types.float32)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return sig, codegen


@intrinsic
def round_f16(typingctx, x):  # type: ignore[no-untyped-def]
    """float32 -> the nearest fp16 (ties to even) -> float32: ggml's fp32_to_fp16 and back."""
    sig = types.float32(types.float32)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.fpext(builder.fptrunc(args[0], ir.HalfType()), ir.FloatType())

    return sig, codegen


@intrinsic
def f32_bits(typingctx, x):  # type: ignore[no-untyped-def]
    """Reinterpret a float32 as uint32 (a register bitcast, no memory)."""
    sig = types.uint32(types.float32)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(args[0], ir.IntType(32))

    return sig, codegen


@intrinsic
def bits_f32(typingctx, u):  # type: ignore[no-untyped-def]
    """Reinterpret a uint32 as float32."""
    sig = types.float32(types.uint32)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


@numba.njit(cache=True, nogil=True, inline="always")
def store_rows(dst, rows, src, c0, width, f16):  # type: ignore[no-untyped-def]
    """dst[rows[i], :] = src[i, c0 : c0 + width]: f32 as is, or (``f16``: dst an f16 cache's uint16 view)
    rounded to nearest even (ggml_cpy to f16)."""
    for i in range(len(rows)):
        d = dst[rows[i]]
        if f16:
            for j in range(width):
                d[j] = f16_bits(src[i, c0 + j])  # type: ignore[call-arg]
        else:
            for j in range(width):
                d[j] = src[i, c0 + j]
