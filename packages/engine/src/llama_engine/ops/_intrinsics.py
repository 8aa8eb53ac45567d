"""LLVM-level helpers the kernels share: fp16 conversions (ggml's fp32_to_fp16 and back) and float bit casts.

Each is a register operation (a bitcast, fptrunc or fpext), which LLVM lowers to vcvtps2ph / vcvtph2ps where
the CPU has F16C and to exact software conversions otherwise: round to nearest even, as ggml.

``to_cache`` / ``as_cache`` follow a KV cache layer's element type (an f16 cache is passed as its uint16
view), decided when a kernel is compiled: a kernel compiled for an f16 cache holds no f32 code, and back.
"""

from __future__ import annotations

import numba
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

__all__ = ["as_cache", "bits_f32", "f16_bits", "f32_bits", "round_f16", "store_rows", "to_cache", "widen"]


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


def to_cache(x, cache):  # type: ignore[no-untyped-def]
    """float32 x as an element of the cache layer ``cache``: the bits of the nearest fp16 (ggml_cpy to f16)
    in an f16 cache's uint16 view, else x. Compiled code only (the overload below)."""
    raise NotImplementedError


def as_cache(x, cache):  # type: ignore[no-untyped-def]
    """float32 x as the cache layer ``cache`` holds it, read back as float32: rounded to fp16 for an f16
    cache (ggml converts a mul_mat operand to the cache's type), else x. Compiled code only."""
    raise NotImplementedError


def _f16_cache(cache) -> bool:  # type: ignore[no-untyped-def]
    if cache.dtype == types.uint16:
        return True
    if cache.dtype == types.float32:
        return False
    raise TypeError(f"a KV cache layer is float32 or an f16 cache's uint16 view, not {cache.dtype}")


@overload(to_cache)
def _to_cache(x, cache):  # type: ignore[no-untyped-def]
    if _f16_cache(cache):
        return lambda x, cache: f16_bits(x)  # type: ignore[call-arg]
    return lambda x, cache: x


@overload(as_cache)
def _as_cache(x, cache):  # type: ignore[no-untyped-def]
    if _f16_cache(cache):
        return lambda x, cache: round_f16(x)  # type: ignore[call-arg]
    return lambda x, cache: x


@numba.njit(cache=True, nogil=True, inline="always")
def store_rows(dst, rows, src, c0, width):  # type: ignore[no-untyped-def]
    """dst[rows[i], :] = src[i, c0 : c0 + width] as the cache layer dst holds it (``to_cache``)."""
    for i in range(len(rows)):
        d = dst[rows[i]]
        for j in range(width):
            d[j] = to_cache(src[i, c0 + j], dst)
