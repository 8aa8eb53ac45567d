"""The gated FFN activations: SwiGLU (ggml_vec_swiglu_f32) and GeGLU with ggml's fp16 GELU table.

Both read the gate and up values as column ranges of their arrays, so one fused [gate | up] product can be
passed as both; many tokens spread over the threads.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import prange, uint64

from ._intrinsics import f16_bits
from .expf import expf_in_range, expf_main, expf_sse2
from .norm import PARALLEL_ROWS

__all__ = ["geglu", "gelu_table", "swiglu"]


def swiglu(
    out: np.ndarray, gate: np.ndarray, up: np.ndarray, n: int, d: int, gate_col: int = 0, up_col: int = 0
) -> None:
    """out = silu(gate) * up as ggml_vec_swiglu_f32: the SSE2 ggml_v_silu on groups of four, the
    scalar x / (1 + expf(-x)) on the remainder. The gate is ``gate[:, gate_col : gate_col + d]``, the up
    values ``up[:, up_col : up_col + d]`` (one fused [gate | up] product can be both)."""
    gate, up = np.ascontiguousarray(gate), np.ascontiguousarray(up)
    (_swiglu_rows if n >= PARALLEL_ROWS else _swiglu)(out, gate, up, n, d, gate_col, up_col)


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
    if expf_in_range(g, simd, zero):  # |nn| of -g is that of g: all lanes on ggml_v_expf's main path
        for i in range(simd):
            o[i] = g[i] / (one + expf_main(zero - g[i])) * u[i]
    else:
        for i in range(simd):
            o[i] = g[i] / (one + expf_sse2(zero - g[i])) * u[i]
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
    (_geglu_rows if n >= PARALLEL_ROWS else _geglu)(out, gate, up, _GELU_TABLE, n, d, gate_col, up_col)


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
            y = table[f16_bits(g)]  # type: ignore[call-arg]
        o[i] = y * up[i]
